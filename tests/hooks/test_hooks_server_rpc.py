"""The runtime-hooks server's RPC layer on runtimeproxy.wire.grpc_server: what a request that does not
decode, a bug of ours and the trace get, through the proxy's own client (H2Channel)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import test_hooks_server
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks import server as server_mod
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.server import SERVICE, RuntimeHooksServer, ServerSettings
from structlog.testing import capture_logs
from test_hooks_server import container_request, pod_request, tuner

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.common import logs, trace
from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint
from runtimeproxy.wire.grpc_client import H2Channel, RpcError
from runtimeproxy.wire.grpc_framing import StatusCode

RUN = f"/{SERVICE}/{HookPoint.PRE_RUN_POD_SANDBOX.rpc}"
CREATE = f"/{SERVICE}/{HookPoint.PRE_CREATE_CONTAINER.rpc}"
served = test_hooks_server.served  # the fixtures, shared
short_dir = test_hooks_server.short_dir


async def call(endpoint: str, method: str, request: bytes) -> bytes:
    channel = H2Channel(endpoint, max_message_size=1 << 20)
    try:
        return await channel.unary(method, request, 5)
    finally:
        await channel.close()


async def status(endpoint: str, method: str, request: bytes) -> tuple[StatusCode, str]:
    with pytest.raises(RpcError) as failed:
        await call(endpoint, method, request)
    return failed.value.code(), failed.value.details()


async def test_every_hook_point_answers_through_the_proxys_client(served: Any) -> None:
    """A point a plugin handles answers its changes; every other one the empty response (no
    change), never UNIMPLEMENTED."""
    s = await served(tuner())
    for point in HookPoint:
        request = pod_request() if point.kind is HookKind.POD else container_request()
        answer = await call(s.server.endpoint, f"/{SERVICE}/{point.rpc}", request.SerializeToString())
        assert bool(answer) is (point in s.server.hook_points), point
    reply = await call(s.server.endpoint, RUN, pod_request().SerializeToString())
    assert dict(hook.PodSandboxHookResponse.FromString(reply).labels) == {"tuned": "yes"}


async def test_a_request_that_does_not_decode_is_internal_and_logged(served: Any) -> None:
    s = await served(tuner())
    with capture_logs() as logs:
        code, details = await status(s.server.endpoint, CREATE, b"\xff\xff\xff")
    assert code == StatusCode.INTERNAL and "PreCreateContainerHook request does not decode" in details
    assert any(e["event"] == "hook request does not decode" and e["hook"] == "PreCreateContainer" for e in logs)


async def test_a_bug_answers_internal_with_its_type_and_is_logged(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(request: Any) -> Any:
        raise ValueError("boom")

    monkeypatch.setattr(server_mod, "pod_from_request", broken)
    s = await served(tuner())
    with capture_logs() as logs:
        code, details = await status(s.server.endpoint, RUN, pod_request().SerializeToString())
    assert (code, details) == (StatusCode.INTERNAL, "runtime-hooks: ValueError: boom")
    assert any(e["event"] == "hook call failed" and e["hook"] == "PreRunPodSandbox" for e in logs)


async def test_trace_events_name_the_hook_and_the_pod(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[dict[str, Any]] = []
    monkeypatch.setattr(trace, "ON", True)
    monkeypatch.setattr(trace, "event", lambda ev, **fields: events.append({"ev": ev, **fields}))
    settings = ServerSettings(endpoint=str(short_dir / "hooks.sock"), hook_config_dir=None, stop_grace=0)
    server = RuntimeHooksServer(PluginRunner([tuner()], registry=CollectorRegistry()), settings)
    await server.start()
    try:
        await call(server.endpoint, RUN, pod_request().SerializeToString())
    finally:
        await server.stop(0, 0)
    [event] = [e for e in events if e["ev"] == "hooks.rpc"]
    assert (event["hook"], event["uid"]) == ("PreRunPodSandbox", "u1") and isinstance(event["began"], int)


async def test_after_an_answer_the_cpu_is_given_way_before_the_calls_lines_go_out(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    holds_then: list[int] = []  # the answer's hold of the log lines, when the CPU is given way
    monkeypatch.setattr(server_mod, "give_way", lambda: holds_then.append(sum(logs._holding.values())))
    s = await served(tuner())
    reply = await call(s.server.endpoint, RUN, pod_request().SerializeToString())
    await asyncio.sleep(0.01)
    assert dict(hook.PodSandboxHookResponse.FromString(reply).labels) == {"tuned": "yes"}
    assert holds_then == [1]  # once, after the answer, with its lines still held
    assert sum(logs._holding.values()) == 0
