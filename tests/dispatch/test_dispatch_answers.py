"""dispatch/dispatcher.py: a server registered for a hook point answers it with a valid response,
or the hook fails. Real sockets: the proxy's own HTTP/2 client against a grpc.aio hook server
(tests/hook_servers.TestHookServer) or an HTTP server that is no gRPC server (HttpHookServer),
registered through a real HookRegistry."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
from hook_servers import (
    NOT_GRPC_ANSWERS,
    Custom,
    Fail,
    HttpHookServer,
    StaticViews,
    TestHookServer,
    not_grpc_text,
    write_registration,
)
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.dispatch.dispatcher import Dispatcher, HookFailed, HookMetrics, HookOutcome
from runtimeproxy.dispatch.registry import HookRegistry
from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.wire.grpc_framing import StatusCode

PRE, POST = HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.POST_STOP_POD_SANDBOX
REQUEST = hook.PodSandboxHookRequest(pod_meta=hook.PodSandboxMetadata(name="web", uid="u1")).SerializeToString()


@dataclass
class Bed:
    """A hook config directory read by a HookRegistry (rescanned by hand), and a Dispatcher."""

    directory: str
    registry: HookRegistry
    dispatcher: Dispatcher
    metrics: CollectorRegistry

    def socket(self, name: str) -> str:
        return f"{self.directory}/{name}.sock"

    def register(self, name: str, socket: str, points: list[HookPoint], policy: str, **options: Any) -> None:
        write_registration(self.directory, f"{name}.json", socket, points, policy=policy, **options)
        self.registry.scan()

    async def run(self, point: HookPoint) -> list[HookOutcome]:
        return await self.dispatcher.run(point, StaticViews(REQUEST), None)

    async def refusal(self, point: HookPoint) -> HookFailed:
        with pytest.raises(HookFailed) as failed:
            await self.run(point)
        return failed.value

    def count(self, server: str, point: HookPoint, outcome: str) -> float:
        labels = {"server": server, "hook": point.value, "outcome": outcome}
        return self.metrics.get_sample_value("runtimeproxy_hook_calls_total", labels) or 0.0


@pytest.fixture
async def bed() -> AsyncIterator[Bed]:
    directory = tempfile.mkdtemp(prefix="rpa-", dir="/tmp")  # unix socket paths are short
    registry, metrics = HookRegistry(directory), CollectorRegistry()
    dispatcher = Dispatcher(registry, HookMetrics(metrics))
    try:
        yield Bed(directory, registry, dispatcher, metrics)
    finally:
        await dispatcher.close()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def http_server(bed: Bed) -> AsyncIterator[Callable[..., Awaitable[HttpHookServer]]]:
    started: list[HttpHookServer] = []

    async def start(status: str, content_type: str | None, body: bytes) -> HttpHookServer:
        server = await HttpHookServer(status, content_type, body).start(bed.socket("http"))
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


@pytest.fixture
async def grpc_server(bed: Bed) -> AsyncIterator[TestHookServer]:
    server = await TestHookServer("grpc", bed.socket("grpc")).start()
    yield server
    await server.stop()


# -- an HTTP answer that is no gRPC answer -----------------------------------------------------


@pytest.mark.parametrize(("answer", "refusal"), NOT_GRPC_ANSWERS.values(), ids=NOT_GRPC_ANSWERS.keys())
async def test_a_non_grpc_answer_refuses_under_fail_naming_server_and_answer(
    bed: Bed, http_server: Any, answer: tuple[str, str | None, bytes], refusal: StatusCode
) -> None:
    server = await http_server(*answer)
    bed.register("http", bed.socket("http"), [PRE], "Fail")
    failed = await bed.refusal(PRE)
    assert failed.code == refusal  # never UNIMPLEMENTED: kubelet would read that as no such CRI method
    assert failed.result.outcome == "not_grpc"
    message = str(failed)
    assert "http.json" in message and bed.socket("http") in message and "PreRunPodSandbox" in message
    assert not_grpc_text(*answer[:2]) in message
    assert server.rpcs() == [PRE.rpc]
    assert bed.count("http.json", PRE, "not_grpc") == 1


@pytest.mark.parametrize(("answer", "refusal"), NOT_GRPC_ANSWERS.values(), ids=NOT_GRPC_ANSWERS.keys())
async def test_a_non_grpc_answer_under_ignore_is_logged_and_counted(
    bed: Bed, http_server: Any, answer: tuple[str, str | None, bytes], refusal: StatusCode
) -> None:
    await http_server(*answer)
    bed.register("http", bed.socket("http"), [PRE], "Ignore")
    with capture_logs() as logs:
        (result,) = await bed.run(PRE)
    assert (result.outcome, result.error, result.code) == ("not_grpc", not_grpc_text(*answer[:2]), refusal)
    (line,) = [entry for entry in logs if entry["event"] == "hook failed, ignored"]
    assert (line["server"], line["outcome"], line["log_level"]) == ("http.json", "not_grpc", "warning")
    assert bed.count("http.json", PRE, "not_grpc") == 1
    assert bed.count("http.json", PRE, "unimplemented") == bed.count("http.json", PRE, "unregistered") == 0


async def test_a_404_is_never_no_such_hook_even_once_unregistered(bed: Bed, http_server: Any) -> None:
    """UNIMPLEMENTED from a server whose registration dropped the point is "unregistered"; an
    HTTP 404 (gRPC's mapping of it is UNIMPLEMENTED) is no gRPC answer, so never that."""
    await http_server("404", "text/plain", b"")
    bed.register("http", bed.socket("http"), [PRE], "Fail")
    servers = bed.registry.servers_for(PRE)
    bed.register("http", bed.socket("http"), [POST], "Fail")  # the point dropped before the answer
    with pytest.raises(HookFailed) as failed:
        await bed.dispatcher.run(PRE, StaticViews(REQUEST), None, servers)
    assert failed.value.result.outcome == "not_grpc"


async def test_a_non_grpc_answer_to_a_post_hook_never_fails_the_call(bed: Bed, http_server: Any) -> None:
    await http_server("404", "text/plain", b"")
    bed.register("http", bed.socket("http"), [POST], "Fail")
    (result,) = await bed.run(POST)
    assert result.outcome == "not_grpc"
    assert bed.count("http.json", POST, "not_grpc") == 1


# -- gRPC UNIMPLEMENTED --------------------------------------------------------------------------


async def test_unimplemented_for_a_registered_point_refuses_under_fail(bed: Bed, grpc_server: TestHookServer) -> None:
    bed.register("grpc", grpc_server.socket, [PRE], "Fail")  # the server has no behaviour: UNIMPLEMENTED
    failed = await bed.refusal(PRE)
    assert failed.code == StatusCode.FAILED_PRECONDITION
    assert failed.result.outcome == "unimplemented"
    assert "grpc.json" in str(failed) and "UNIMPLEMENTED for a hook point it registered" in str(failed)
    assert len(grpc_server.calls(PRE)) == 1
    assert bed.count("grpc.json", PRE, "unimplemented") == 1


async def test_unimplemented_for_a_registered_point_under_ignore_is_logged_and_counted(
    bed: Bed, grpc_server: TestHookServer
) -> None:
    bed.register("grpc", grpc_server.socket, [PRE], "Ignore")
    with capture_logs() as logs:
        (result,) = await bed.run(PRE)
    assert result.outcome == "unimplemented" and "UNIMPLEMENTED for a hook point it registered" in result.error
    assert any(e["event"] == "hook failed, ignored" and e["outcome"] == "unimplemented" for e in logs)
    assert bed.count("grpc.json", PRE, "unimplemented") == 1


def _unregisters_then_answers_unimplemented(bed: Bed, name: str, socket: str, still: list[HookPoint]) -> Custom:
    """Rewrite the server's registration to list ``still`` (and a shorter timeout), have the
    registry read it, then answer UNIMPLEMENTED: a server dropping a point while called."""

    async def answer(point: HookPoint, request: Any, context: grpc.aio.ServicerContext) -> Any:
        bed.register(name, socket, still, "Fail", timeout=1.5)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no longer served")

    return Custom(answer)


async def test_unimplemented_once_the_registration_dropped_the_point_is_no_such_hook(
    bed: Bed, grpc_server: TestHookServer
) -> None:
    grpc_server.set(PRE, _unregisters_then_answers_unimplemented(bed, "grpc", grpc_server.socket, [POST]))
    bed.register("grpc", grpc_server.socket, [PRE], "Fail")
    with capture_logs() as logs:
        (result,) = await bed.run(PRE)  # no HookFailed: the call goes on
    assert (result.outcome, result.error, result.code) == ("unregistered", "", StatusCode.OK)
    assert not any(e["event"] == "hook failed, ignored" for e in logs)
    assert bed.count("grpc.json", PRE, "unregistered") == 1
    assert bed.registry.servers_for(PRE) == []


async def test_unimplemented_after_a_change_that_kept_the_point_still_fails(
    bed: Bed, grpc_server: TestHookServer
) -> None:
    """Only the point leaving the registration makes UNIMPLEMENTED harmless, not any change of the file."""
    grpc_server.set(PRE, _unregisters_then_answers_unimplemented(bed, "grpc", grpc_server.socket, [PRE, POST]))
    bed.register("grpc", grpc_server.socket, [PRE], "Fail")
    failed = await bed.refusal(PRE)
    assert failed.result.outcome == "unimplemented"


async def test_unimplemented_once_another_endpoint_took_the_file_is_no_such_hook(
    bed: Bed, grpc_server: TestHookServer
) -> None:
    """The file now registers another socket for the point: the server that answered is not it."""
    other = bed.socket("other")
    grpc_server.set(PRE, _unregisters_then_answers_unimplemented(bed, "grpc", other, [PRE]))
    bed.register("grpc", grpc_server.socket, [PRE], "Fail")
    servers = bed.registry.servers_for(PRE)
    (result,) = await bed.dispatcher.run(PRE, StaticViews(REQUEST), None, servers)
    assert result.outcome == "unregistered"


# -- the refusal status is the outcome's, never read from the server's text ------------------------


@pytest.mark.parametrize(
    ("code", "details", "refusal"),
    [
        (grpc.StatusCode.UNAVAILABLE, "warming up", StatusCode.UNAVAILABLE),
        (grpc.StatusCode.INTERNAL, "backend UNAVAILABLE", StatusCode.FAILED_PRECONDITION),
        (grpc.StatusCode.PERMISSION_DENIED, "no", StatusCode.FAILED_PRECONDITION),
    ],
)
async def test_a_failed_hook_refuses_with_the_status_its_outcome_carries(
    bed: Bed, grpc_server: TestHookServer, code: grpc.StatusCode, details: str, refusal: StatusCode
) -> None:
    grpc_server.set(PRE, Fail(code, details))
    bed.register("grpc", grpc_server.socket, [PRE], "Fail")
    failed = await bed.refusal(PRE)
    assert (failed.result.outcome, failed.code, failed.result.code) == ("failed", refusal, refusal)
    assert details in str(failed)


async def test_an_unreachable_server_refuses_with_unavailable(bed: Bed) -> None:
    bed.register("gone", bed.socket("gone"), [PRE], "Fail")  # nothing listens there
    failed = await bed.refusal(PRE)
    assert (failed.result.outcome, failed.code) == ("failed", StatusCode.UNAVAILABLE)


# -- refused calls are counted apart from the hook calls ----------------------------------------------


def refused(bed: Bed) -> dict[tuple[str, str, str], float]:
    """runtimeproxy_cri_calls_refused_total by (method, server, hook)."""
    return {
        (s.labels["method"], s.labels["server"], s.labels["hook"]): s.value
        for family in bed.metrics.collect()
        for s in family.samples
        if s.name == "runtimeproxy_cri_calls_refused_total"
    }


async def test_a_refusal_is_counted_by_method_server_and_hook_from_zero(bed: Bed) -> None:
    create, stop = HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_STOP_CONTAINER
    bed.register("gone", bed.socket("gone"), [PRE, create, stop], "Fail")  # nothing listens there
    bed.register("quiet", bed.socket("quiet"), [PRE], "Ignore")
    # Exported at 0 once registered: the Fail server's pre-hooks only (a post-hook refuses nothing).
    zero = {
        ("RunPodSandbox", "gone.json", "PreRunPodSandbox"): 0.0,
        ("CreateContainer", "gone.json", "PreCreateContainer"): 0.0,
    }
    assert refused(bed) == zero
    await bed.refusal(PRE)
    assert refused(bed) == zero | {("RunPodSandbox", "gone.json", "PreRunPodSandbox"): 1.0}
    assert bed.count("gone.json", PRE, "failed") == 1
    await bed.run(stop)  # a failed post-hook: counted as a hook call, not as a refusal
    assert bed.count("gone.json", stop, "failed") == 1
    assert refused(bed) == zero | {("RunPodSandbox", "gone.json", "PreRunPodSandbox"): 1.0}


async def test_a_failure_under_ignore_is_no_refusal(bed: Bed) -> None:
    bed.register("gone", bed.socket("gone"), [PRE], "Ignore")
    (result,) = await bed.run(PRE)
    assert result.outcome == "failed"
    assert refused(bed) == {}
