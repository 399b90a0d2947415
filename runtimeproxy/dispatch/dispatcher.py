"""Calls the hook servers subscribed to a hook point, in order, each within its time.

Every subscribed server is called, ordered by (index, file name). A pre-hook server
sees the request as the servers before it left it. Each call is bounded by the server's
timeout, cut to the time left on kubelet's deadline. A server registered for a hook point
answers it with a valid response; anything else fails that hook. Outcomes (the ``outcome``
label of runtimeproxy_hook_calls):

* ok: the response was valid and merged;
* unregistered: the server answered gRPC UNIMPLEMENTED and its registration, read again while
  the call was in flight, no longer lists the hook point. This is the one "no such hook": the
  server takes no part, as it would in any call that started a moment later;
* unimplemented: gRPC UNIMPLEMENTED for a hook point its registration still lists;
* not_grpc: an HTTP answer that is no gRPC answer (say HTTP 404 text/plain, from something
  else listening on the socket), whatever its HTTP status;
* failed / timeout / invalid: any other gRPC status or no answer; no answer in time; an
  answer that does not decode or breaks the output rules.

Each of the last five, under failure policy Fail, ends the CRI call of a pre-hook with an
error naming server, hook and what it answered, with the status the outcome carries (never
UNIMPLEMENTED, which kubelet would read as the runtime lacking the CRI method), counted in
runtimeproxy_cri_calls_refused; under Ignore the call goes on unchanged, and the failure is
logged and counted. Post-hooks never fail a
call (containerd has already carried it out).

Hook servers are called over the proxy's own HTTP/2 client (runtimeproxy.wire.grpc_client), one
connection per endpoint, on the event loop: the daemon never loads grpc (about 9 MiB and six
threads), and a call wakes no other thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.common.message_size import DEFAULT_MAX_MESSAGE_SIZE
from runtimeproxy.common.metrics_export import CallCollector, CallFamilies
from runtimeproxy.dispatch.registry import FailurePolicy, HookRegistry, HookServer
from runtimeproxy.hookapi.cri_mapping import InvalidHookOutput
from runtimeproxy.hookapi.hookpoints import HOOKS_BY_METHOD, HookKind, HookPoint
from runtimeproxy.hookapi.value_bounds import cut
from runtimeproxy.wire.grpc_client import H2Channel, NotGrpcAnswer, RpcError
from runtimeproxy.wire.grpc_framing import StatusCode

log = structlog.get_logger("runtimeproxy.hooks")

SERVICE = "/runtime.v1alpha1.RuntimeHookService/"
RESPONSE_TYPES: dict[HookKind, Any] = {
    HookKind.POD: hook.PodSandboxHookResponse,
    HookKind.CONTAINER: hook.ContainerResourceHookResponse,
}
# Per hook point, its RPC's path and response type (looked up once, not per call).
_RPCS: dict[HookPoint, tuple[str, Any]] = {
    point: (SERVICE + point.rpc, RESPONSE_TYPES[point.kind]) for point in HookPoint
}
# The CRI method each pre-hook point runs before: the ``method`` label of refused calls.
_METHOD_BEFORE: dict[HookPoint, str] = {
    hooks.pre: method for method, hooks in HOOKS_BY_METHOD.items() if hooks.pre is not None
}
# Below this much time left there is no point in calling a hook server.
MIN_CALL_SECONDS = 0.001


class HookCallOutcome(StrEnum):
    """How one hook server call ended (the module doc says when each applies). The values are
    the ``outcome`` label of runtimeproxy_hook_calls and the words of the log lines."""

    OK = "ok"
    UNREGISTERED = "unregistered"
    UNIMPLEMENTED = "unimplemented"
    NOT_GRPC = "not_grpc"
    FAILED = "failed"
    TIMEOUT = "timeout"
    INVALID = "invalid"


class LayerErrorAction(StrEnum):
    """What became of a CRI call whose hook layer failed (the ``action`` label of
    runtimeproxy_hook_layer_errors)."""

    REFUSED = "refused"  # a Fail server was subscribed
    RELAYED_UNCHANGED = "relayed_unchanged"  # Ignore servers only
    AFTER_CALL = "after_call"  # the call had been carried out


# Hook outcomes that are no problem: the next server runs, the call's line is logged at info.
FINE_OUTCOMES = frozenset({HookCallOutcome.OK, HookCallOutcome.UNREGISTERED})


class HookViews(Protocol):
    """One CRI call's views at one hook point: what its hook servers are asked and what their
    answers change, one server after the other."""

    def hook_request(self) -> bytes:
        """The serialized hook request for the next server, as the servers before it left the views."""
        ...

    def apply_response(self, response: Any) -> list[str]:
        """Merge a server's non-empty, decoded answer into the views; returns the changes made.
        Raises InvalidHookOutput for an answer that breaks the output rules."""
        ...


@dataclass(frozen=True)
class HookOutcome:
    server: str
    point: HookPoint
    outcome: HookCallOutcome
    seconds: float
    error: str = ""
    changes: tuple[str, ...] = ()
    # The status the CRI call is refused with when this outcome fails it (OK for a fine one).
    code: StatusCode = StatusCode.OK

    def summary(self) -> str:
        text = f"{self.server}:{self.outcome}"
        return f"{text} ({self.error})" if self.error else text


class HookFailed(Exception):
    """A pre-hook failed under failure policy Fail: the CRI call must not go on."""

    def __init__(self, result: HookOutcome, server: HookServer) -> None:
        self.result = result
        self.code = result.code
        super().__init__(
            f"runtime hook {result.point.value} of hook server {server.name} "
            f"(unix://{server.endpoint}) {result.outcome}: {result.error}"
        )


# Exported as they were by a prometheus_client Histogram registered before a Counter.
_HOOK_FAMILIES = CallFamilies(
    "runtimeproxy_hook_calls",
    "Hook server calls by outcome: ok, unregistered, unimplemented, not_grpc, failed, timeout, invalid.",
    "runtimeproxy_hook_duration_seconds",
    "Round trip of hook server calls, by server and hook point.",
    ("server", "hook"),
    "outcome",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
    histogram_first=True,
)


def _server_hook(key: tuple[str, HookPoint]) -> tuple[str, str]:
    return key[0], key[1].value


def _outcome(outcome: HookCallOutcome) -> str:
    return outcome.value


class HookMetrics:
    """Hook calls by server, hook point and outcome, and their round trips: recorded for every
    hook call on the event loop, so a lock-free collector (runtimeproxy.common.metrics_export.CallCollector)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = REGISTRY if registry is None else registry
        self.calls: CallCollector[tuple[str, HookPoint], HookCallOutcome] = CallCollector(
            reg, _HOOK_FAMILIES, _server_hook, _outcome
        )
        self.layer_errors = Counter(
            "runtimeproxy_hook_layer_errors",
            "Errors inside the proxy's hook layer, by CRI method and what became of the call: "
            "refused (a Fail server was subscribed), relayed_unchanged (Ignore only), after_call.",
            ["method", "action"],
            registry=reg,
        )
        self.refused = Counter(
            "runtimeproxy_cri_calls_refused",
            "CRI calls refused because a pre-hook of a server with failure policy Fail failed, by CRI "
            "method, server and hook point.",
            ["method", "server", "hook"],
            registry=reg,
        )

    def record(self, result: HookOutcome) -> None:
        self.calls.record((result.server, result.point), result.outcome, result.seconds)

    def refusal(self, server: str, point: HookPoint) -> Counter:
        """The refused-calls counter of ``server``'s pre-hook ``point`` (created at 0 if new)."""
        return self.refused.labels(_METHOD_BEFORE[point], server, point.value)

    def expect_calls(self, servers: list[HookServer]) -> None:
        """Export the servers' hook-call counters at 0 for every outcome (and the Fail servers'
        refusal counters), so that an alert sees the first failure or refusal."""
        for server in servers:
            for point in server.hooks:
                self.calls.declare((server.name, point), HookCallOutcome)
                if server.failure_policy == FailurePolicy.FAIL and point.stage == "pre":
                    self.refusal(server.name, point)


class Dispatcher:
    def __init__(
        self,
        registry: HookRegistry,
        metrics: HookMetrics | None = None,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.max_message_size = max_message_size
        self._channels: dict[str, H2Channel] = {}
        # Per endpoint, the longest timeout of the servers using it: how long calls still in
        # flight may take once its server unregistered.
        self._call_grace: dict[str, float] = {}
        registry.add_listener(self._servers_changed)

    def fails_closed(self, point: HookPoint) -> bool:
        """Whether a server subscribed to ``point`` has failure policy Fail."""
        return any(server.failure_policy == FailurePolicy.FAIL for server in self.registry.servers_for(point))

    def count_layer_error(self, method: str, action: LayerErrorAction) -> None:
        if self.metrics is not None:
            self.metrics.layer_errors.labels(method, action.value).inc()

    def expect_layer_errors(self, methods: Iterable[str]) -> None:
        """Export the layer-error counters of ``methods`` at 0, so that an alert sees the first error."""
        if self.metrics is not None:
            for method in methods:
                for action in LayerErrorAction:
                    self.metrics.layer_errors.labels(method, action.value)

    async def run(
        self,
        point: HookPoint,
        views: HookViews,
        deadline: float | None,
        servers: list[HookServer] | None = None,
    ) -> list[HookOutcome]:
        """Call every server of ``point`` in order; raises HookFailed for a Fail pre-hook.
        ``servers``: ``registry.servers_for(point)`` when the caller asked already (to know
        whether to run at all).

        Each server is asked ``views.hook_request()``; a non-empty answer goes to
        ``views.apply_response``. Each call is awaited here, in no coroutine of its own: this
        runs for every hook call, cold.
        """
        results: list[HookOutcome] = []
        path, response_type = _RPCS[point]
        for server in self.registry.servers_for(point) if servers is None else servers:
            request = views.hook_request()
            timeout = server.timeout
            if deadline is not None:
                timeout = min(timeout, deadline - asyncio.get_running_loop().time())
            started = time.perf_counter()
            if timeout < MIN_CALL_SECONDS:
                found = _NO_TIME_LEFT
            else:
                try:
                    answer = await self._channel(server).unary(path, request, timeout)
                except RpcError as exc:
                    found = self._rpc_failure(exc, server, point, timeout)
                except Exception as exc:  # not expected; fails closed like any invalid answer
                    found = _invalid(f"{type(exc).__name__}: {exc}")
                else:  # the empty answer (no field set): nothing to check, nothing to merge
                    found = _merged(answer, response_type, views) if answer else _OK
            outcome, error, changes, code = found
            result = HookOutcome(server.name, point, outcome, time.perf_counter() - started, error, changes, code)
            results.append(result)
            if self.metrics is not None:
                self.metrics.record(result)
            if outcome in FINE_OUTCOMES:
                continue
            if point.stage == "pre" and server.failure_policy == FailurePolicy.FAIL:
                if self.metrics is not None:
                    self.metrics.refusal(server.name, point).inc()
                raise HookFailed(result, server)
            log.warning("hook failed, ignored", hook=point.value, server=server.name, outcome=outcome, error=error)
        return results

    def _rpc_failure(self, exc: RpcError, server: HookServer, point: HookPoint, timeout: float) -> _Found:
        """What a call that ended in ``exc`` comes to (the outcomes of the module doc)."""
        if isinstance(exc, NotGrpcAnswer):  # never "no such hook", whatever its HTTP status
            code = StatusCode.UNAVAILABLE if exc.code() == StatusCode.UNAVAILABLE else StatusCode.INTERNAL
            return HookCallOutcome.NOT_GRPC, cut(exc.details(), quote=False), (), code
        if exc.code() != StatusCode.UNIMPLEMENTED:
            return _rpc_status(exc, timeout)
        if not self.registry.registers(server, point):
            return _UNREGISTERED
        details = cut(exc.details(), quote=False)
        return HookCallOutcome.UNIMPLEMENTED, f"UNIMPLEMENTED for a hook point it registered: {details}", (), _REFUSED

    def _channel(self, server: HookServer) -> H2Channel:
        grace = self._call_grace.get(server.endpoint, 0.0)
        self._call_grace[server.endpoint] = max(grace, server.timeout)
        channel = self._channels.get(server.endpoint)
        if channel is None:
            # The relay's limit both ways: a request it accepted must reach the hook server.
            # No retries, no backoff: a call fails at once while the server is down, and the
            # next call connects again, so a server that comes back is used at once.
            channel = H2Channel(server.endpoint, max_message_size=self.max_message_size)
            self._channels[server.endpoint] = channel
        return channel

    def _servers_changed(self, servers: list[HookServer]) -> None:
        """Close channels of endpoints no registered server uses any more; export the new
        servers' call counters and the new Fail servers' refusal counters."""
        if self.metrics is not None:
            self.metrics.expect_calls(servers)
        wanted = {server.endpoint for server in servers}
        for endpoint in [e for e in self._channels if e not in wanted]:
            channel = self._channels.pop(endpoint)
            # Calls in flight finish (a Fail server that unregistered mid-call must not
            # refuse that call); new ones can no longer start on it.
            grace = self._call_grace.pop(endpoint, None)
            asyncio.get_running_loop().create_task(channel.close(grace))

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


# A hook call's outcome, error, changes made and refusal status (HookOutcome's fields that
# depend on the answer).
_Found = tuple[HookCallOutcome, str, tuple[str, ...], StatusCode]
# The refusal for a hook that failed while the runtime is fine (never the hook server's own
# status, which may be UNIMPLEMENTED).
_REFUSED = StatusCode.FAILED_PRECONDITION
_OK: _Found = (HookCallOutcome.OK, "", (), StatusCode.OK)
_UNREGISTERED: _Found = (HookCallOutcome.UNREGISTERED, "", (), StatusCode.OK)
_NO_TIME_LEFT: _Found = (
    HookCallOutcome.TIMEOUT,
    "no time left before the caller's deadline",
    (),
    StatusCode.DEADLINE_EXCEEDED,
)


def _rpc_status(exc: RpcError, timeout: float) -> _Found:
    """A gRPC status other than OK and UNIMPLEMENTED, or no answer."""
    code = exc.code()
    if code == StatusCode.DEADLINE_EXCEEDED:
        return HookCallOutcome.TIMEOUT, f"no answer within {timeout:.3f} s", (), StatusCode.DEADLINE_EXCEEDED
    # UNAVAILABLE (the server's, or no connection) is passed on: kubelet retries such a call.
    refusal = StatusCode.UNAVAILABLE if code == StatusCode.UNAVAILABLE else _REFUSED
    details = cut(exc.details(), quote=False)  # the server's text, bounded
    return HookCallOutcome.FAILED, f"{code.name}: {details}", (), refusal


def _merged(answer: bytes, response_type: Any, views: HookViews) -> _Found:
    """A non-empty answer, decoded and merged."""
    try:
        response = response_type.FromString(answer)
    except Exception:  # DecodeError: not protobuf, or e.g. a string field that is not UTF-8
        return _invalid(f"response does not decode as {response_type.DESCRIPTOR.name}")
    try:
        return HookCallOutcome.OK, "", tuple(views.apply_response(response)), StatusCode.OK
    except InvalidHookOutput as exc:
        return _invalid(str(exc))


def _invalid(error: str) -> _Found:
    return HookCallOutcome.INVALID, error, (), StatusCode.INTERNAL
