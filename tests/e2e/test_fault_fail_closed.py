"""Fault injection: under a Fail policy nothing passes unhooked.

Against the real containerd, through the in-process proxy of hook_bed.py: a hook server
whose answer does not decode, one that answers HTTP that is no gRPC (HTTP 404 text/plain,
500, 503, 200 without gRPC's content-type), one that answers UNIMPLEMENTED for a hook point
it registered, a request that is not one valid message (two messages, strings that are not
UTF-8), and an error inside the hook layer itself. Under Fail each call is refused and
containerd never sees it; with only Ignore servers the call goes on unchanged, and the
failure is logged and counted.
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from typing import Any

import grpc
import grpc.aio
import pytest
from fake_runtime import RawH2Client, RawServer
from hook_bed import CALL_TIMEOUT, HookBed, rpc_error
from hook_servers import NOT_GRPC_ANSWERS, Custom, HttpHookServer, Respond, not_grpc_text, write_registration
from structlog.testing import capture_logs

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.wire import grpc_framing
from runtimeproxy.wire.grpc_framing import StatusCode

pytestmark = pytest.mark.e2e

P = HookPoint
HOOK_SERVICE = "runtime.v1alpha1.RuntimeHookService"
RUN_POD_PATH = "/runtime.v1.RuntimeService/RunPodSandbox"
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]


class GarbageHookServer(RawServer):
    """A hook server that answers every hook RPC with bytes that are no hook response."""

    def __init__(self, socket: str, answer: bytes) -> None:
        super().__init__(socket)
        self.answer = answer
        self.calls = 0

    def handlers(self) -> dict[str, dict[str, Any]]:
        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.calls += 1
            return self.answer

        return {HOOK_SERVICE: {point.rpc: handle for point in HookPoint}}


def layer_errors(bed: HookBed, method: str, action: str) -> float:
    labels = {"method": method, "action": action}
    return bed.metrics.get_sample_value("runtimeproxy_hook_layer_errors_total", labels) or 0.0


async def register(bed: HookBed, name: str, socket: str, points: list[HookPoint], policy: str) -> None:
    write_registration(bed.config_dir, f"{name}.json", socket, points, policy=policy)
    await bed.wait_registered(*bed.registered_names())


# -- an answer that does not decode ------------------------------------------------------------


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
@pytest.mark.parametrize("answer", [b"\xff\xff\xff", b"\x0a\x05abc"], ids=["garbage", "truncated"])
async def test_undecodable_hook_answer(bed: HookBed, policy: str, answer: bytes) -> None:
    garbage = await GarbageHookServer(os.path.join(bed.workdir, "garbage.sock"), answer).start()
    try:
        await register(bed, "garbage", garbage.socket, [P.PRE_RUN_POD_SANDBOX], policy)
        pod = bed.pod_config("garbled")
        with capture_logs() as logs:
            if policy == "Fail":
                error = await rpc_error(bed.run_pod(pod))
                assert "garbage.json" in (error.details() or "")
                assert await bed.sandboxes_of(pod.metadata.uid) == []  # containerd never saw it
            else:
                sandbox_id = await bed.run_pod(pod)
                assert await bed.sandboxes_of(pod.metadata.uid) == [sandbox_id]
        assert garbage.calls == 1
        assert bed.hook_calls("garbage.json", "PreRunPodSandbox", "invalid") == 1
        (line,) = [entry for entry in logs if entry["event"] == "lifecycle call"]
        assert line["method"] == "RunPodSandbox" and line["log_level"] == "warning"
        assert any("garbage.json:invalid" in summary for summary in line["hooks"])
    finally:
        await garbage.stop()


# -- a registered server's answer that is no valid response ------------------------------------

async def _hooked_run_pod(bed: HookBed, name: str, policy: str, server: str) -> tuple[Any, list[dict[str, Any]]]:
    """RunPodSandbox through the proxy: under Fail the refusal (checked: containerd never saw the
    pod), under Ignore the pod (checked: created as sent); and the logs of the call."""
    pod = bed.pod_config(name)
    with capture_logs() as logs:
        if policy == "Fail":
            error = await rpc_error(bed.run_pod(pod))
            assert await bed.sandboxes_of(pod.metadata.uid) == []
            (line,) = [entry for entry in logs if entry["event"] == "lifecycle call"]
            assert line["error"] == error.details()
            return error, logs
        sandbox_id = await bed.run_pod(pod)
    assert await bed.sandboxes_of(pod.metadata.uid) == [sandbox_id]
    status = await bed.direct.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id))
    assert dict(status.status.labels) == dict(pod.labels)  # relayed unchanged
    (ignored,) = [entry for entry in logs if entry["event"] == "hook failed, ignored"]
    assert ignored["server"] == server and ignored["log_level"] == "warning"
    return None, logs


def _call_line(logs: list[dict[str, Any]], summary: str) -> None:
    (line,) = [entry for entry in logs if entry["event"] == "lifecycle call"]
    assert line["method"] == "RunPodSandbox" and line["log_level"] == "warning"
    assert any(item.startswith(summary) for item in line["hooks"]), line["hooks"]


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
@pytest.mark.parametrize(("answer", "refusal"), NOT_GRPC_ANSWERS.values(), ids=NOT_GRPC_ANSWERS.keys())
async def test_a_non_grpc_http_answer_fails_the_hook(
    bed: HookBed, policy: str, answer: tuple[str, str | None, bytes], refusal: StatusCode
) -> None:
    """A 404 is never "no such hook": gRPC maps HTTP 404 to UNIMPLEMENTED, but this is no gRPC answer."""
    http = await HttpHookServer(*answer).start(os.path.join(bed.workdir, "http.sock"))
    try:
        await register(bed, "http", os.path.join(bed.workdir, "http.sock"), [P.PRE_RUN_POD_SANDBOX], policy)
        error, logs = await _hooked_run_pod(bed, f"http{answer[0]}", policy, "http.json")
        if error is not None:
            assert error.code().value[0] == refusal
            details = error.details() or ""
            assert "http.json" in details and "PreRunPodSandbox" in details
            assert not_grpc_text(*answer[:2]) in details
        assert http.rpcs() == [P.PRE_RUN_POD_SANDBOX.rpc]
        assert bed.hook_calls("http.json", "PreRunPodSandbox", "not_grpc") == 1
        _call_line(logs, "http.json:not_grpc")
    finally:
        await http.stop()


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_unimplemented_for_a_registered_hook_point_fails_the_hook(bed: HookBed, policy: str) -> None:
    server = await bed.server("koordlike")  # no behaviour: answers UNIMPLEMENTED
    await bed.register(server, policy=policy, hooks=[P.PRE_RUN_POD_SANDBOX])
    error, logs = await _hooked_run_pod(bed, "unimpl", policy, "koordlike.json")
    if error is not None:
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = error.details() or ""
        assert "koordlike.json" in details and "UNIMPLEMENTED for a hook point it registered" in details
    assert len(server.calls(P.PRE_RUN_POD_SANDBOX)) == 1
    assert bed.hook_calls("koordlike.json", "PreRunPodSandbox", "unimplemented") == 1
    _call_line(logs, "koordlike.json:unimplemented")


async def test_unimplemented_once_the_registration_dropped_the_point_lets_the_call_through(bed: HookBed) -> None:
    """A server that drops a hook point while called: once the proxy has read its new file, its
    UNIMPLEMENTED is "no such hook", as for any call started after the change."""
    server = await bed.server("leaving")
    assert bed.layer is not None
    registry = bed.layer.registry

    async def leave(point: HookPoint, request: Any, context: grpc.aio.ServicerContext) -> Any:
        server.register(bed.config_dir, policy="Fail", hooks=[P.POST_STOP_POD_SANDBOX])
        while registry.servers_for(P.PRE_RUN_POD_SANDBOX):
            await asyncio.sleep(0.02)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "leaving does not serve PreRunPodSandboxHook")

    server.set(P.PRE_RUN_POD_SANDBOX, Custom(leave))
    await bed.register(server, policy="Fail", hooks=[P.PRE_RUN_POD_SANDBOX])
    pod = bed.pod_config("leaving")
    sandbox_id = await bed.run_pod(pod)
    assert await bed.sandboxes_of(pod.metadata.uid) == [sandbox_id]
    assert bed.hook_calls("leaving.json", "PreRunPodSandbox", "unregistered") == 1


# -- requests the hook layer cannot interpret ------------------------------------------------------


def _with_invalid_utf8(request: cri.RunPodSandboxRequest, marker: str) -> bytes:
    """The request's bytes with ``marker`` (a label value) turned into invalid UTF-8, same length."""
    data = request.SerializeToString()
    assert data.count(marker.encode()) == 1
    return data.replace(marker.encode(), b"\xff" * len(marker))


async def test_request_with_invalid_utf8_is_refused(bed: HookBed) -> None:
    server = await bed.server("guard")
    server.set(P.PRE_RUN_POD_SANDBOX, Respond())
    await bed.register(server, policy="Fail")
    pod = bed.pod_config("notutf8", labels={"app": "notutf8", "broken": "MARKER"})
    raw = _with_invalid_utf8(cri.RunPodSandboxRequest(config=pod), "MARKER")
    channel = grpc.aio.insecure_channel("unix://" + bed.endpoint)
    bed.channels.append(channel)
    call: Any = channel.unary_unary(RUN_POD_PATH)  # bytes in, bytes out
    error = await rpc_error(call(raw, timeout=CALL_TIMEOUT))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "runtime.v1.RunPodSandboxRequest" in (error.details() or "")
    assert await bed.sandboxes_of(pod.metadata.uid) == []
    assert server.calls(P.PRE_RUN_POD_SANDBOX) == []


async def test_two_messages_on_one_unary_call_are_refused(bed: HookBed) -> None:
    server = await bed.server("guard")
    server.set(P.PRE_RUN_POD_SANDBOX, Respond())
    await bed.register(server, policy="Fail")
    pod = bed.pod_config("twice")
    message = cri.RunPodSandboxRequest(config=pod).SerializeToString()
    client = await RawH2Client().connect(bed.endpoint)
    try:
        body = grpc_framing.encode_message(message) * 2
        answer = await client.call(RUN_POD_PATH, body, framed=True, timeout=CALL_TIMEOUT)
        assert answer.status == INVALID_ARGUMENT
        assert "exactly one message, got 2" in urllib.parse.unquote(answer.header("grpc-message") or "")
    finally:
        await client.close()
    assert await bed.sandboxes_of(pod.metadata.uid) == []
    assert server.calls(P.PRE_RUN_POD_SANDBOX) == []


# -- any error inside the hook layer ------------------------------------------------------------


def _break_store(bed: HookBed) -> None:
    """Our own bug, simulated: the store fails whenever a container is looked up (in the store
    itself, which the interceptor reads first, and through the loader, for what it lacks)."""
    assert bed.layer is not None

    def crash(container_id: str) -> Any:
        raise RuntimeError(f"store lookup of {container_id} crashed")

    async def broken(container_id: str) -> Any:
        crash(container_id)

    bed.layer.interceptor.store.container = crash  # type: ignore[method-assign]
    bed.layer.interceptor.loader.ensure_container = broken  # type: ignore[method-assign]


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_error_inside_the_hook_layer(bed: HookBed, policy: str) -> None:
    server = await bed.server("starter")
    server.set(P.PRE_START_CONTAINER, Respond())
    await bed.register(server, policy=policy)
    pod = bed.pod_config("layerbug")
    sandbox_id = await bed.run_pod(pod)
    container_id = await bed.create(sandbox_id, pod, bed.container_config())
    _break_store(bed)
    with capture_logs() as logs:
        if policy == "Fail":
            error = await rpc_error(bed.start(container_id))
            assert error.code() == grpc.StatusCode.INTERNAL
            details = error.details() or ""
            assert "RuntimeError: store lookup" in details and "PreStartContainer" in details
            action, state = "refused", cri.CONTAINER_CREATED  # containerd never started it
        else:
            await bed.start(container_id)
            action, state = "relayed_unchanged", cri.CONTAINER_RUNNING
    status = await bed.direct.ContainerStatus(cri.ContainerStatusRequest(container_id=container_id))
    assert status.status.state == state
    assert layer_errors(bed, "StartContainer", action) == 1
    assert server.calls(P.PRE_START_CONTAINER) == []
    errors = [entry for entry in logs if entry["log_level"] == "error"]
    assert errors and "RuntimeError: store lookup" in errors[0]["error"]
    (line,) = [entry for entry in logs if entry["event"] == "lifecycle call"]
    assert line["method"] == "StartContainer" and line["log_level"] == "warning"


async def test_error_inside_the_hook_layer_with_no_server_relays(bed: HookBed) -> None:
    """No hook server at all: the proxy's own bug must not stop the node's pods."""
    pod = bed.pod_config("nohooks")
    sandbox_id = await bed.run_pod(pod)
    container_id = await bed.create(sandbox_id, pod, bed.container_config())
    _break_store(bed)
    await bed.start(container_id)
    status = await bed.direct.ContainerStatus(cri.ContainerStatusRequest(container_id=container_id))
    assert status.status.state == cri.CONTAINER_RUNNING
    assert layer_errors(bed, "StartContainer", "relayed_unchanged") == 1
