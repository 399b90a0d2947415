"""NRI's Plugin service, answered by the same PluginRunner that serves the proxy's hook calls.

Each NRI event runs the hook points hooks/nri/modes.py maps it to, with the pod and container
converted by hooks/nri/mapping.py, through :meth:`PluginRunner.run` -- the one path both modes
share, so plugins, their order, timeouts, failure policies and metrics are the same.

**Deadlines.** NRI gives a plugin 2 s per request by default and drops a plugin that misses
it (nri adaptation/plugin.go: DeadlineExceeded is fatal, the connection is closed). The
runtime sends its deadline with each request (ttrpc ``timeout_nano``); the plugins get 90 % of
it less 50 ms. When they take longer the event is answered without changes, logged as an
error and counted (outcome ``deadline``): the pod goes on and the plugin stays connected.

**Failures.** A plugin with failure policy "fail" that fails makes the answer an error
(INTERNAL, naming the plugin), which fails the CRI call in the runtime, as a "Fail"
registration does through the proxy. Everything else a plugin does wrong is the runner's to
log and count, as in proxy mode.

**What NRI cannot apply** of an answer is logged (warning, with the field and why) and counted
in ``runtimehooks_nri_not_applied_total``; see hooks/nri/mapping.py.

Synchronize (the runtime's pods and containers when the plugin connects) is handed to
``on_synchronize``: the reconciler's starting state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import structlog
from google.protobuf.message import DecodeError

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb
from runtimeproxy.dispatch.hookpoints import HookKind, HookPoint

from ..changes import HookResponse
from ..runner import HookCallFailed, PluginRunner
from ..views import ContainerInfo, PodInfo
from .mapping import (
    NotApplied,
    container_adjustment,
    container_from_nri,
    pod_from_nri,
    pod_response_not_applied,
    resources_update,
)
from .metrics import NriMetrics
from .modes import EVENT_NAMES, EVENT_POINTS, event_mask
from .rpc import Method, RpcError, StatusCode

__all__ = ["DEFAULT_REQUEST_TIMEOUT", "PLUGIN_SERVICE", "RUNTIME_SERVICE", "NriHooks", "SyncCallback"]

log = structlog.get_logger("runtimeproxy.hooks.nri")

PLUGIN_SERVICE: Final = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE: Final = "nri.pkg.api.v1alpha1.Runtime"
#: NRI's DefaultPluginRequestTimeout, used when a request carries no deadline.
DEFAULT_REQUEST_TIMEOUT: Final = 2.0
_DEADLINE_SHARE: Final = 0.9
_DEADLINE_MARGIN: Final = 0.05

#: Called with the runtime's pods and their containers (by sandbox id) at each Synchronize.
SyncCallback = Callable[[Sequence[PodInfo], Mapping[str, Sequence[ContainerInfo]]], None]
# Pre hook points whose answer NRI carries back; every other point's answer is not applied,
# as the proxy applies no Post hook's answer.
_ANSWERED: Final = frozenset({HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES})
_POD_ANSWERS: Final = frozenset({HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_REMOVE_POD_SANDBOX})


class NriHooks:
    """The Plugin service's methods (:meth:`methods`) for ``runner``; see the module doc."""

    def __init__(
        self,
        runner: PluginRunner,
        metrics: NriMetrics | None = None,
        *,
        on_synchronize: SyncCallback | None = None,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        self.runner = runner
        self.metrics = metrics if metrics is not None else NriMetrics()
        self.on_synchronize = on_synchronize
        self.on_shutdown = on_shutdown

    def methods(self) -> dict[tuple[str, str], Method]:
        handlers: dict[str, Method] = {
            "Configure": self.configure,
            "Synchronize": self.synchronize,
            "Shutdown": self.shutdown,
            "CreateContainer": self.create_container,
            "UpdateContainer": self.update_container,
            "StopContainer": self.stop_container,
            "StateChange": self.state_change,
        }
        return {(PLUGIN_SERVICE, name): method for name, method in handlers.items()}

    # -- plugin lifecycle --

    async def configure(self, payload: bytes, timeout: float | None) -> bytes:
        request = _decode(nri_pb.ConfigureRequest, payload)
        mask = event_mask(self.runner.hook_points)
        subscribed = [name for event, name in EVENT_NAMES.items() if mask & (1 << (event - 1))]
        log.info(
            "NRI configured",
            runtime=request.runtime_name,
            runtime_version=request.runtime_version,
            events=subscribed,
        )
        if request.config:
            log.info("NRI plugin configuration ignored: runtime-hooks takes its settings from its flags and policy")
        return bytes(nri_pb.ConfigureResponse(events=mask).SerializeToString())

    async def synchronize(self, payload: bytes, timeout: float | None) -> bytes:
        request = _decode(nri_pb.SynchronizeRequest, payload)
        pods = [pod_from_nri(pod) for pod in request.pods]
        containers: dict[str, list[ContainerInfo]] = {}
        for container in request.containers:
            containers.setdefault(container.pod_sandbox_id, []).append(container_from_nri(container))
        log.info("NRI synchronized", pods=len(pods), containers=len(request.containers))
        if self.on_synchronize is not None:
            self.on_synchronize(pods, containers)
        return bytes(nri_pb.SynchronizeResponse().SerializeToString())

    async def shutdown(self, payload: bytes, timeout: float | None) -> bytes:
        log.info("the runtime is shutting NRI down")
        if self.on_shutdown is not None:
            self.on_shutdown()
        return bytes(nri_pb.Empty().SerializeToString())

    # -- events --

    async def create_container(self, payload: bytes, timeout: float | None) -> bytes:
        request = _decode(nri_pb.CreateContainerRequest, payload)
        answer = nri_pb.CreateContainerResponse()
        response = await self._handle(nri_pb.CREATE_CONTAINER, request.pod, request.container, timeout)
        if response is not None:
            adjust, not_applied = container_adjustment(response)
            self._report(nri_pb.CREATE_CONTAINER, request.container, not_applied)
            answer.adjust.CopyFrom(adjust)
        return bytes(answer.SerializeToString())

    async def update_container(self, payload: bytes, timeout: float | None) -> bytes:
        request = _decode(nri_pb.UpdateContainerRequest, payload)
        answer = nri_pb.UpdateContainerResponse()
        resources = request.linux_resources if request.HasField("linux_resources") else None
        response = await self._handle(nri_pb.UPDATE_CONTAINER, request.pod, request.container, timeout, resources)
        if response is not None:
            updates, not_applied = resources_update(request.container.id, response)
            self._report(nri_pb.UPDATE_CONTAINER, request.container, not_applied)
            answer.update.extend(updates)
        return bytes(answer.SerializeToString())

    async def stop_container(self, payload: bytes, timeout: float | None) -> bytes:
        request = _decode(nri_pb.StopContainerRequest, payload)
        await self._handle(nri_pb.STOP_CONTAINER, request.pod, request.container, timeout)
        return bytes(nri_pb.StopContainerResponse().SerializeToString())

    async def state_change(self, payload: bytes, timeout: float | None) -> bytes:
        event = _decode(nri_pb.StateChangeEvent, payload)
        if event.event not in EVENT_POINTS:
            log.debug("NRI event with no hook point ignored", nri_event=EVENT_NAMES.get(event.event, event.event))
            return bytes(nri_pb.Empty().SerializeToString())
        container = event.container if event.HasField("container") else None
        await self._handle(event.event, event.pod, container, timeout)
        return bytes(nri_pb.Empty().SerializeToString())

    async def _handle(
        self, event: int, pod_message: Any, container_message: Any | None, timeout: float | None, resources: Any = None
    ) -> HookResponse | None:
        """Run the event's hook points; the answer of the one that has an answer (None: nothing to apply)."""
        name = EVENT_NAMES[event]
        points = [point for point in EVENT_POINTS[event] if point in self.runner.hook_points]
        if not points:
            return None
        began = time.perf_counter()
        pod = pod_from_nri(pod_message)
        container = container_from_nri(container_message, resources) if container_message is not None else None
        bound = {"nri_event": name, "pod": f"{pod.namespace}/{pod.name}"}
        if container is not None:
            bound["container"] = container.name
        budget = _budget(timeout)
        answer: HookResponse | None = None
        outcome = "error"
        try:
            async with asyncio.timeout(budget):
                for point in points:
                    result = await self.runner.run(
                        point, pod=pod, container=container if point.kind is HookKind.CONTAINER else None
                    )
                    if point in _ANSWERED:
                        answer = result.response
                    elif point in _POD_ANSWERS:
                        self._report(event, None, pod_response_not_applied(result.response), bound)
            outcome = "ok"
        except HookCallFailed as exc:
            outcome = "failed"
            raise RpcError(StatusCode.INTERNAL, f"runtime-hooks: {exc}") from None
        except TimeoutError:
            outcome, answer = "deadline", None
            log.error("plugins missed NRI's deadline; answered without changes", budget_s=round(budget, 3), **bound)
        finally:
            seconds = time.perf_counter() - began
            self.metrics.record(name, outcome, seconds)
            log.info(
                "NRI event handled",
                hooks=[p.value for p in points],
                outcome=outcome,
                seconds=round(seconds, 6),
                **bound,
            )
        return answer

    def _report(
        self, event: int, container: Any | None, not_applied: NotApplied, bound: Mapping[str, str] | None = None
    ) -> None:
        if not not_applied:
            return
        for field_name in not_applied.names():
            self.metrics.not_applied.labels(field=field_name.partition("[")[0]).inc()
        where = dict(bound) if bound is not None else {"nri_event": EVENT_NAMES[event]}
        if container is not None:
            where.setdefault("container", container.name)
        log.warning(
            "answer fields NRI cannot apply were not applied",
            fields=[f"{name}: {why}" for name, why in not_applied.fields],
            **where,
        )


def _budget(timeout: float | None) -> float:
    """Seconds the plugins get of a request's ``timeout`` (see the module doc)."""
    total = DEFAULT_REQUEST_TIMEOUT if timeout is None else timeout
    return max(0.01, total * _DEADLINE_SHARE - _DEADLINE_MARGIN)


def _decode(message_type: Any, payload: bytes) -> Any:
    try:
        return message_type.FromString(payload)
    except DecodeError as exc:
        log.warning("undecodable NRI request refused", message=message_type.DESCRIPTOR.name, error=str(exc))
        raise RpcError(StatusCode.INVALID_ARGUMENT, f"undecodable {message_type.DESCRIPTOR.name}: {exc}") from None
