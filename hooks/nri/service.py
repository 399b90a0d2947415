"""NRI's Plugin service, answered by the same PluginRunner that serves the proxy's hook calls.

Each NRI event runs the hook points hooks/nri/modes.py maps it to, with the pod and container
converted by hooks/nri/mapping.py, through :meth:`PluginRunner.run` -- the one path both modes
share, so plugins, their order, timeouts, failure policies and metrics are the same.

**Deadlines.** NRI gives a plugin 2 s per request by default and drops a plugin that misses
it (nri adaptation/plugin.go: DeadlineExceeded is fatal, the connection is closed). The
runtime sends its deadline with each request (ttrpc ``timeout_nano``); the plugins get 90 % of
it less 50 ms. When they take longer the event is answered without changes, logged as an
error and counted (outcome ``deadline``): the pod goes on and the plugin stays connected.

**Notifications first, hooks after.** containerd waits for a plugin's answer to every event
before its CRI call goes on (and holds one lock over all of its NRI calls). The events that are
notifications (modes.DEFERRED: PostCreate/PostStart/PostUpdateContainer, StopContainer,
StopPodSandbox, RemovePodSandbox) are answered at once and their hooks run afterwards.
**Order** is kept per pod (hooks/nri/ordering.py): an event's hooks start only when the hooks
of the pod's earlier events have finished, so a CreateContainer arriving while the previous
container's PostStartContainer hooks still run waits for them -- within its own deadline, which
counts from its arrival.

**Failures.** A plugin with failure policy "fail" that fails makes the answer an error
(INTERNAL, naming the plugin), which fails the CRI call in the runtime, as a "Fail"
registration does through the proxy -- at the events answered after their hooks. At a
notification the runtime has been answered already (and containerd only logs an error answer
to one): the failure is logged as an error and counted (outcome ``failed``). Everything else a
plugin does wrong is the runner's to log and count, as in proxy mode.

**The OOM score** a PreCreateContainer answer sets is in the CreateContainer adjustment when the
runtime's NRI is 0.7 or later (told at Configure: hooks/nri/runtime_features.py), else written to
the container's process at PostStartContainer (hooks/nri/oom.py).

**What NRI cannot apply** of an answer is logged (warning, with the field and why) and counted
in ``runtimehooks_nri_not_applied_total``; see hooks/nri/mapping.py.

Synchronize (the runtime's pods and containers when the plugin connects) is handed to
``on_synchronize``: the reconciler's starting state. Its answer updates the containers whose
values differ from what the plugins set (hooks/nri/repair.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import structlog
from google.protobuf.message import DecodeError

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb
from runtimeproxy.common import logs
from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint

from ..changes import HookResponse
from ..container_repair import ContainerRepair
from ..plugin_runner import HookCallFailed, PluginRunner
from ..views import ContainerInfo, PodInfo
from .mapping import (
    NotApplied,
    container_adjustment,
    container_from_nri,
    pod_response_not_applied,
    resources_update,
)
from .modes import DEFERRED, EVENT_NAMES, EVENT_POINTS, event_mask
from .nri_metrics import NriMetrics
from .oom import OomNotApplied, OomScores
from .ordering import PodQueues
from .pod_infos import PodInfos
from .repair import LIVE_STATES, SynchronizeUpdates, synchronize_updates
from .rpc import Method, RpcError, StatusCode, after_answer
from .runtime_features import NRI_0_6, RuntimeNri
from .sync_parts import SyncParts

__all__ = ["DEFAULT_REQUEST_TIMEOUT", "PLUGIN_SERVICE", "RUNTIME_SERVICE", "NriHooks", "SyncCallback"]

LOGGER: Final = "runtimeproxy.hooks.nri"
log = structlog.get_logger(LOGGER)

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
    """The Plugin service's methods (:meth:`methods`) for ``runner``; see the module doc.
    ``repair``: container repair at Synchronize (default: one with metrics of its own)."""

    def __init__(
        self,
        runner: PluginRunner,
        metrics: NriMetrics | None = None,
        *,
        on_synchronize: SyncCallback | None = None,
        on_shutdown: Callable[[], None] | None = None,
        oom: OomScores | None = None,
        repair: ContainerRepair | None = None,
    ) -> None:
        self.runner = runner
        self.repair = repair if repair is not None else ContainerRepair(runner)
        self.synchronized = SynchronizeUpdates()  # what the last Synchronize answer asked, for the reconciler
        self.metrics = metrics if metrics is not None else NriMetrics()
        self.on_synchronize = on_synchronize
        self.on_shutdown = on_shutdown
        self.oom = oom if oom is not None else OomScores()
        self.queues = PodQueues()
        self.pods = PodInfos()  # each pod converted once, not at each of its events
        self.runtime = NRI_0_6  # what the runtime's NRI carries, from its Configure
        self.sync_parts = SyncParts()

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
        self.runtime = RuntimeNri.of(request)
        self.sync_parts.reset()  # a new connection: no parts of an earlier one's Synchronize
        mask = event_mask(self.runner.hook_points, oom_at_start=not self.runtime.oom_in_adjustment)
        subscribed = [name for event, name in EVENT_NAMES.items() if mask & (1 << (event - 1))]
        self.metrics.expect(subscribed)
        log.info(
            "NRI configured",
            runtime=request.runtime_name,
            runtime_version=request.runtime_version,
            nri=self.runtime.described,
            events=subscribed,
        )
        if request.config:
            log.info("NRI plugin configuration ignored: runtime-hooks takes its settings from its flags and policy")
        return bytes(nri_pb.ConfigureResponse(events=mask).SerializeToString())

    async def synchronize(self, payload: bytes, timeout: float | None) -> bytes:
        request = self.sync_parts.add(_decode(nri_pb.SynchronizeRequest, payload))
        if request is None:  # a part of a split state (hooks/nri/sync_parts.py)
            return bytes(nri_pb.SynchronizeResponse(more=True).SerializeToString())
        deadline = asyncio.get_running_loop().time() + _budget(timeout)
        pods = {pod.id: self.pods.of(pod) for pod in request.pods}
        containers: dict[str, list[ContainerInfo]] = {}
        live: list[tuple[PodInfo, ContainerInfo]] = []
        for container in request.containers:
            info = container_from_nri(container)
            containers.setdefault(container.pod_sandbox_id, []).append(info)
            pod = pods.get(container.pod_sandbox_id)
            if pod is not None and container.state in LIVE_STATES:
                live.append((pod, info))
        log.info("NRI synchronized", pods=len(pods), containers=len(request.containers))
        if self.on_synchronize is not None:
            self.on_synchronize(list(pods.values()), containers)
        updates = await synchronize_updates(self.repair, live, deadline, self.synchronized)
        return bytes(nri_pb.SynchronizeResponse(update=updates).SerializeToString())

    async def shutdown(self, payload: bytes, timeout: float | None) -> bytes:
        log.info("the runtime is shutting NRI down")
        if self.on_shutdown is not None:
            self.on_shutdown()
        return bytes(nri_pb.Empty().SerializeToString())

    # -- events --

    async def create_container(self, payload: bytes, timeout: float | None) -> bytes:
        request = _decode(nri_pb.CreateContainerRequest, payload)
        answer = nri_pb.CreateContainerResponse()
        response = await self._in_line(_Event.of(nri_pb.CREATE_CONTAINER, request.pod, request.container, timeout))
        if response is not None:
            in_adjustment = self.runtime.oom_in_adjustment
            adjust, not_applied = container_adjustment(response, request.container, oom_in_adjustment=in_adjustment)
            if not in_adjustment:
                self._remember_oom(request.container, response.resources.oom_score_adj, not_applied)
            self._report(nri_pb.CREATE_CONTAINER, request.container, not_applied)
            answer.adjust.CopyFrom(adjust)
        return bytes(answer.SerializeToString())

    async def update_container(self, payload: bytes, timeout: float | None) -> bytes:
        request = _decode(nri_pb.UpdateContainerRequest, payload)
        answer = nri_pb.UpdateContainerResponse()
        resources = request.linux_resources if request.HasField("linux_resources") else None
        event = _Event.of(nri_pb.UPDATE_CONTAINER, request.pod, request.container, timeout, resources)
        response = await self._in_line(event)
        if response is not None:
            updates, not_applied = resources_update(request.container.id, response)
            self._report(nri_pb.UPDATE_CONTAINER, request.container, not_applied)
            answer.update.extend(updates)
        return bytes(answer.SerializeToString())

    async def stop_container(self, payload: bytes, timeout: float | None) -> bytes:
        request = _decode(nri_pb.StopContainerRequest, payload)
        self.oom.forget(request.container.id)  # never started, or started long ago
        self._later(_Event.of(nri_pb.STOP_CONTAINER, request.pod, request.container, timeout))
        return bytes(nri_pb.StopContainerResponse().SerializeToString())

    async def state_change(self, payload: bytes, timeout: float | None) -> bytes:
        message = _decode(nri_pb.StateChangeEvent, payload)
        if message.event not in EVENT_POINTS:
            log.debug("NRI event with no hook point ignored", nri_event=EVENT_NAMES.get(message.event, message.event))
            return bytes(nri_pb.Empty().SerializeToString())
        container = message.container if message.HasField("container") else None
        event = _Event.of(message.event, message.pod, container, timeout)
        if message.event in DEFERRED:
            self._later(event)
        else:
            await self._in_line(event)
        return bytes(nri_pb.Empty().SerializeToString())

    async def close(self, grace: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        """The plugin stops: the hooks of events still queued or running get ``grace`` seconds
        (their own deadlines end sooner), then are cancelled."""
        try:
            async with asyncio.timeout(grace):
                await self.queues.drain()
        except TimeoutError:
            log.warning("NRI event hooks still running at stop cancelled", pods=len(self.queues))
            await self.queues.cancel()

    def _in_line(self, event: _Event) -> Awaitable[HookResponse | None]:
        """The event's hooks, after the pod's earlier events' hooks, for the caller to answer with
        (in the caller's task when none are queued). Awaited before any other await of the
        caller's, so that the pod's events keep their order."""
        return self.queues.run(event.pod.id, lambda: self._handle(event))

    def _later(self, event: _Event) -> None:
        """A notification: its hooks run after the pod's earlier ones; the runtime is answered now."""
        self.queues.submit(event.pod.id, lambda: self._notified(event))

    async def _notified(self, event: _Event) -> None:
        """A notification's hooks; no one waits for their outcome, so it is logged and counted here."""
        try:
            await self._handle(event)
        except RpcError as exc:  # a "fail" plugin failed: the runtime only logs that of a notification
            log.error("a plugin failed at an NRI notification answered already", error=exc.message, **event.bound)
        except Exception:  # a bug must not go unseen, nor stop the pod's queue
            log.exception("NRI notification hooks failed", **event.bound)
        if event.event == nri_pb.POST_START_CONTAINER and event.container is not None:
            self._apply_oom(event)
        elif event.event == nri_pb.REMOVE_POD_SANDBOX:
            self.pods.forget(event.pod.id)

    async def _handle(self, event: _Event) -> HookResponse | None:
        """Run the event's hook points; the answer of the one that has an answer (None: nothing to apply)."""
        hook_points = self.runner.hook_points
        points = [point for point in EVENT_POINTS[event.event] if point in hook_points]
        if not points:
            return None
        answer: HookResponse | None = None
        outcome = "error"
        try:
            answer = await self._run_points(event, points)
            outcome = "ok"
        except HookCallFailed as exc:
            outcome = "failed"
            raise RpcError(StatusCode.INTERNAL, f"runtime-hooks: {exc}") from None
        except TimeoutError:
            outcome, answer = "deadline", None
            budget = round(event.budget, 3)
            log.error("plugins missed NRI's deadline; answered without changes", budget_s=budget, **event.bound)
        finally:
            seconds = time.perf_counter() - event.arrived
            after_answer(lambda: self._handled(event, points, outcome, seconds))
        return answer

    async def _run_points(self, event: _Event, points: Sequence[HookPoint]) -> HookResponse | None:
        """Run ``points`` in turn for the event's pod and container; the answer of the one that has one."""
        pod = self.pods.of(event.pod)
        container = container_from_nri(event.container, event.resources) if event.container is not None else None
        answer: HookResponse | None = None
        for point in points:
            given = container if point.kind is HookKind.CONTAINER else None
            result = await self.runner.run(point, pod=pod, container=given, deadline=event.deadline)
            if point in _ANSWERED:
                answer = result.response
            elif point in _POD_ANSWERS:
                self._report(event.event, None, pod_response_not_applied(result.response), event.bound)
        return answer

    def _handled(self, event: _Event, points: Sequence[HookPoint], outcome: str, seconds: float) -> None:
        """An event's metrics and log line: once it is answered (hooks/nri/rpc.py after_answer)."""
        self.metrics.record(event.name, outcome, seconds)
        logs.cached_logger(LOGGER).info(  # one line per event: not a logger assembled per line
            "NRI event handled",
            hooks=[p.value for p in points],
            outcome=outcome,
            seconds=round(seconds, 6),
            answered="before the hooks" if event.event in DEFERRED else "after the hooks",
            **event.bound,
        )

    # -- the OOM score (hooks/nri/oom.py) --

    def _remember_oom(self, container: Any, value: int, not_applied: NotApplied) -> None:
        if not value:
            return
        try:
            dropped = self.oom.remember(container.id, value)
        except ValueError as exc:
            not_applied.add("resources.oom_score_adj", str(exc))
            return
        for container_id in dropped:
            log.warning("OOM score of a container that never started forgotten", container_id=container_id)

    def _apply_oom(self, event: _Event) -> None:
        container = event.container
        assert container is not None  # PostStartContainer always names its container
        try:
            applied = self.oom.apply(container.id, container.pid, container.linux.cgroups_path)
        except OomNotApplied as exc:
            not_applied = NotApplied()
            not_applied.add("resources.oom_score_adj", str(exc))
            self._report(event.event, container, not_applied, event.bound)
            return
        if applied is not None:
            what = "oom_score_adj raised" if applied.raised else "oom_score_adj already as high; left"
            log.info(what, pid=applied.pid, before=applied.before, after=applied.after, **event.bound)

    def _report(
        self, event: int, container: Any | None, not_applied: NotApplied, bound: Mapping[str, str] | None = None
    ) -> None:
        if not_applied:
            after_answer(lambda: self._report_now(event, container, not_applied, bound))

    def _report_now(
        self, event: int, container: Any | None, not_applied: NotApplied, bound: Mapping[str, str] | None
    ) -> None:
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


@dataclass(frozen=True)
class _Event:
    """One NRI event as it arrived: its messages, when, and the deadline for its hooks."""

    event: int
    pod: Any
    container: Any | None
    resources: Any | None
    arrived: float  # time.perf_counter()
    budget: float  # seconds from arrival

    @classmethod
    def of(cls, event: int, pod: Any, container: Any | None, timeout: float | None, resources: Any = None) -> _Event:
        return cls(event, pod, container, resources, time.perf_counter(), _budget(timeout))

    def deadline(self) -> float:
        """The end of the budget on the loop's clock (asked only where a handler can wait:
        PluginRunner.run's ``deadline``; each look at the running loop is a getpid(2) on Python 3.11)."""
        return asyncio.get_running_loop().time() + self.budget - (time.perf_counter() - self.arrived)

    @property
    def name(self) -> str:
        return EVENT_NAMES[self.event]

    @property
    def bound(self) -> dict[str, str]:
        """What each log line about the event names."""
        bound = {"nri_event": self.name, "pod": f"{self.pod.namespace}/{self.pod.name}"}
        if self.container is not None:
            bound["container"] = self.container.name
        return bound


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
