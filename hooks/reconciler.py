"""The reconciler of runtime-hooks: every interval, the plugins re-apply what they own to the live pods.

Hook calls apply a plugin's settings once, when a pod or container starts. Afterwards they
can drift: someone edits a cgroup or resctrl file, a policy reload changes a class's values,
a hook call was missed while the hook server was down. Every
``policy.reconciler.interval_seconds`` (10 s by default; a policy reload that changes it
takes effect at once) the :class:`Reconciler`:

1. lists the live pods from the CRI runtime: sandboxes in state READY and their containers
   in state CREATED or RUNNING, each rebuilt from the runtime's verbose status by
   :class:`runtimeproxy.runtime_state.RuntimeLoader` -- the same records the proxy rebuilds
   its store from, so plugins see what a hook call would have shown them. Objects are loaded
   in full once and kept (hooks/live_pods.py): a later round costs the two List calls and a
   non-verbose ContainerStatus per known container (its current resources), and gives what
   loading everything in full would;
2. calls :meth:`PluginRunner.reconcile_report <runtimeproxy.hooks.sdk.PluginRunner.reconcile_report>`
   with ``pods`` (PodInfo), ``containers`` (ContainerInfo by sandbox id) and what went away
   since the previous round (``gone``, ``gone_containers``), so that each plugin re-applies
   its class-level settings and its per-pod values and clears the state it kept for pods
   that are gone;
3. counts what the plugins repaired (each reconcile handler returns the number of values
   it found drifted and set back) in ``runtimehooks_reconcile_drift_total{plugin}``, and
   the round's duration in ``runtimehooks_reconcile_duration_seconds``;
4. repairs the containers whose CPU and memory values differ from what the plugins' hooks set
   (hooks/container_repair.py), when given a :class:`~.container_repair.ContainerRepair` and the
   mode's way of setting them: the runtime's CRI UpdateContainerResources in NRI mode
   (hooks/nri/repair.py), the container's cgroup files through the proxy
   (:class:`~.container_repair.CgroupWrites`). Pod cgroups come first: on cgroup v1 the kernel
   refuses a container quota above its pod's.

**It never stalls hook calls.** Hook calls and rounds share one event loop: the built-in plugins'
reconcile handlers walk the pods in slices of about a millisecond (hooks/pacing.py), so a hook call
arriving mid-round waits for one slice, not for the round (75 pods: ~30 ms before). Handlers of
other plugins can do the same with ``async for pod in paced(pods)``.

**It never fights kubelet.** Reconcile handlers touch only values their plugin owns: what
their own hooks set on the node (resctrl groups and their schemata, a class's cgroup knobs, tc
classes...), and the values a plugin decides in place of kubelet for what kubelet cannot know:
a BE pod's batch-cpu shares and quota and batch-memory limit (kubelet sees such a pod as
BestEffort), and the cpuset of a pinned LSE/LSR container; Koordinator's reconciler keeps the
same ones. Container repair sets only the container values the plugins' own answers set, which
are those same ones. Kubelet writes those files only on its own CRI calls (create, in-place
resize), which pass through the same hooks and get the same values, so the two never take
turns. Everything else kubelet owns -- the other CRI resources and the QoS-level cgroups it
manages -- is changed only through hook responses, on kubelet's own calls, and never
re-applied here.

**systemd driver.** On cgroup v2 every value a plugin writes into a pod slice or container
scope also becomes the unit's property (hooks/systemd_sync.py), so systemd does not undo it
between rounds; a repair made here is sent to systemd the same way, which is also how a
property systemd once refused or never got reaches it again.

**Failures.** A runtime that cannot be listed (containerd down or restarting) is logged
and tried again at the next interval, which loads every object in full again; the previous
round's pods stay the reference for ``gone``. A sandbox or container the runtime has but
whose data cannot be decoded (e.g. a label that is not UTF-8, which containerd stores and
Python's protobuf refuses) is skipped alone: the round goes on with the others, the object
is logged once (not every round) and counted in
``runtimehooks_reconcile_unreadable_objects_total{kind}``; plugins are not shown it (its pod
is not in ``pods``). A failing plugin is logged and counted by the runner and does not stop
the others. ``gone`` is relative to the last successful round
and is empty at the first one (after a restart nothing is known about earlier rounds):
plugins must treat ``pods`` as the authoritative list and may drop any state for a pod
not in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from runtimeproxy.common import trace
from runtimeproxy.common.endpoints import DEFAULT_RUNTIME_ENDPOINT
from runtimeproxy.common.metrics_export import DURATION_BUCKETS
from runtimeproxy.runtime_state import RuntimeLoader, describe_error

from .container_repair import ContainerRepair, RepairApplier
from .live_pods import LivePodCache, LivePods, container_info, list_live_pods, pod_info
from .plugin_runner import PluginFailure, PluginRunner
from .policy import Policy
from .views import ContainerInfo, PodInfo

__all__ = [
    "DEFAULT_RUNTIME_ENDPOINT",
    "LivePodCache",
    "LivePods",
    "PodLister",
    "ReconcileMetrics",
    "Reconciler",
    "RoundResult",
    "container_info",
    "list_live_pods",
    "pod_info",
]

log = structlog.get_logger("runtimeproxy.hooks.reconciler")

# --- the live pods --------------------------------------------------------------------------------

#: Anything that gives the live pods: a LivePodCache's read, or a fake in tests.
PodLister = Callable[[], Awaitable[LivePods]]


# --- metrics ---------------------------------------------------------------------------------------


class ReconcileMetrics:
    """Drift repaired per plugin, round durations and outcomes, and the pods of the last round."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = CollectorRegistry(auto_describe=True) if registry is None else registry
        self.registry = reg
        self.drift = Counter(
            "runtimehooks_reconcile_drift",
            "Values a plugin's reconcile found drifted from what it owns and set back, by plugin.",
            ["plugin"],
            registry=reg,
        )
        self.duration = Histogram(
            "runtimehooks_reconcile_duration_seconds",
            "Time one reconcile round took: listing the runtime's pods and running every plugin's reconcile.",
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.rounds = Counter(
            "runtimehooks_reconcile_rounds",
            "Reconcile rounds by result: ok, plugin_failures (some plugin's reconcile failed), "
            "runtime_error (the runtime could not be listed; retried at the next interval).",
            ["result"],
            registry=reg,
        )
        self.pods = Gauge(
            "runtimehooks_reconcile_pods",
            "Live pods the last successful reconcile round worked on.",
            registry=reg,
        )
        self.unreadable = Counter(
            "runtimehooks_reconcile_unreadable_objects",
            "Sandboxes and containers the runtime has but whose data cannot be decoded (e.g. a label "
            "that is not UTF-8), by kind: skipped by reconciling, each counted once.",
            ["kind"],
            registry=reg,
        )

    def count_unreadable(self, kind: str) -> None:
        self.unreadable.labels(kind=kind).inc()


# --- the loop --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundResult:
    """One round: whether the runtime was listed (``ok``), what was seen, repaired and failed."""

    ok: bool
    pods: int = 0
    containers: int = 0
    gone: int = 0
    unreadable: int = 0
    repaired: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    containers_repaired: int = 0
    failures: tuple[PluginFailure, ...] = ()
    error: str = ""
    seconds: float = 0.0


def _policy_interval(runner: PluginRunner) -> Callable[[], float]:
    return lambda: runner.context.policy().reconciler.interval_seconds


class Reconciler:
    """Runs ``runner``'s reconcile handlers on the live pods every interval; see the module doc.

    ``source``: a RuntimeLoader (its pods come from a :class:`LivePodCache` over it; closed by
    :meth:`stop` when ``close_source`` is true) or any :data:`PodLister`. ``interval``: the
    seconds between the starts of two rounds, asked before every wait (default: the policy
    in force, ``reconciler.interval_seconds``); call :meth:`poke` when it may have changed
    (e.g. from PolicyWatcher's on_change) so a long wait is cut short. ``repair`` and
    ``applier``: container repair (module doc, step 4), off when either is None.
    """

    def __init__(
        self,
        runner: PluginRunner,
        source: RuntimeLoader | PodLister,
        *,
        interval: Callable[[], float] | None = None,
        registry: CollectorRegistry | None = None,
        metrics: ReconcileMetrics | None = None,
        close_source: bool = False,
        repair: ContainerRepair | None = None,
        applier: RepairApplier | None = None,
    ) -> None:
        self.runner = runner
        self.repair = repair if applier is not None else None
        self.applier = applier
        self.interval = interval if interval is not None else _policy_interval(runner)
        self.metrics = metrics if metrics is not None else ReconcileMetrics(registry)
        self._loader = source if isinstance(source, RuntimeLoader) else None
        self._close_loader = close_source and self._loader is not None
        self._list: PodLister = LivePodCache(source).read if isinstance(source, RuntimeLoader) else source
        self._previous: LivePods | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.rounds = 0
        self.runtime_failures = 0
        self.last: RoundResult | None = None
        for plugin in self.reconciling:  # every series exists from the start, at 0
            self.metrics.drift.labels(plugin=plugin)
        if self._loader is not None:
            self._loader.unreadable.listeners.append(self.metrics.count_unreadable)

    @classmethod
    def for_endpoint(
        cls, runner: PluginRunner, endpoint: str = DEFAULT_RUNTIME_ENDPOINT, *, timeout: float = 10.0, **options: Any
    ) -> Reconciler:
        """A reconciler reading the CRI runtime at ``endpoint`` (its channel closed by stop())."""
        return cls(runner, RuntimeLoader(endpoint, timeout=timeout), close_source=True, **options)

    @property
    def reconciling(self) -> list[str]:
        """The enabled plugins that have a reconcile handler."""
        return [plugin.name for plugin in self.runner.plugins if plugin.reconcile_handler is not None]

    @property
    def repairs_containers(self) -> bool:
        """Whether rounds repair containers: container repair is given and a plugin answers for it."""
        return self.repair is not None and self.repair.enabled

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # -- one round --

    async def run_once(self) -> RoundResult:
        """List the live pods and run the plugins' reconcile handlers once; never raises for
        a runtime or plugin failure (the result says what happened)."""
        started = time.perf_counter()
        self.rounds += 1
        try:
            live = await self._list()
        except Exception as exc:
            self.runtime_failures += 1
            result = RoundResult(ok=False, error=describe_error(exc), seconds=time.perf_counter() - started)
            self.metrics.rounds.labels(result="runtime_error").inc()
            self.metrics.duration.observe(result.seconds)
            log.warning(
                "cannot list the runtime's pods; reconciling again at the next interval",
                error=result.error,
                failures_in_a_row=self.runtime_failures,
                retry_in_s=self._interval(),
            )
            self.last = result
            return result
        self.runtime_failures = 0
        gone, gone_containers = self._gone(live)
        report = await self.runner.reconcile_report(
            pods=live.pods, containers=live.containers, gone=gone, gone_containers=gone_containers
        )
        self._previous = live
        cgroups = self.runner.context.cgroups
        if cgroups is not None:  # the path caches keep the live pods only
            cgroups.retain([pod.cgroup_parent for pod in live.pods])
        for plugin, count in report.repaired.items():
            if count:
                self.metrics.drift.labels(plugin=plugin).inc(count)
        containers_repaired = await self._repair_containers(live)
        result = RoundResult(
            ok=True,
            pods=len(live.pods),
            containers=live.container_count(),
            gone=len(gone),
            unreadable=live.unreadable,
            repaired=MappingProxyType(dict(report.repaired)),
            containers_repaired=containers_repaired,
            failures=tuple(report.failures),
            seconds=time.perf_counter() - started,
        )
        self.metrics.rounds.labels(result="plugin_failures" if report.failures else "ok").inc()
        self.metrics.duration.observe(result.seconds)
        self.metrics.pods.set(result.pods)
        fields = {
            "pods": result.pods,
            "containers": result.containers,
            "gone": result.gone,
            "unreadable": result.unreadable,
            "repaired": {name: count for name, count in result.repaired.items() if count},
            "containers_repaired": containers_repaired,
            "failed": [failure.plugin for failure in result.failures],
            "seconds": round(result.seconds, 3),
        }
        if fields["repaired"] or fields["failed"] or gone or containers_repaired:
            log.info("reconciled", **fields)
        else:
            log.debug("reconciled", **fields)
        self.last = result
        return result

    async def _repair_containers(self, live: LivePods) -> int:
        """Step 4 of the module doc; the containers repaired (a bug in it is logged, not raised)."""
        if self.repair is None or self.applier is None:
            return 0
        try:
            return await self.repair.reconcile(live.pods, live.containers, self.applier)
        except Exception:  # a bug must not end the round's bookkeeping
            log.exception("container repair failed")
            return 0

    def _gone(self, live: LivePods) -> tuple[list[PodInfo], dict[str, tuple[ContainerInfo, ...]]]:
        previous = self._previous
        if previous is None:
            return [], {}
        live_pods = {pod.sandbox_id for pod in live.pods}
        gone = [pod for pod in previous.pods if pod.sandbox_id not in live_pods]
        gone_containers: dict[str, tuple[ContainerInfo, ...]] = {}
        for sandbox_id, containers in previous.containers.items():
            still = {container.id for container in live.containers.get(sandbox_id, ())}
            left = tuple(container for container in containers if container.id not in still)
            if left:
                gone_containers[sandbox_id] = left
        return gone, gone_containers

    # -- the loop --

    def _interval(self) -> float:
        try:
            return max(0.01, float(self.interval()))
        except Exception:  # a broken interval source must not stop reconciling
            log.exception("cannot read the reconcile interval; using 10 s")
            return 10.0

    def start(self) -> None:
        """Start the loop in a background task (first round at once); needs a running loop."""
        if self.running:
            return
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="runtime-hooks-reconcile")
        log.info(
            "reconciler started",
            plugins=self.reconciling,
            containers=self.applier.mode if self.repairs_containers and self.applier is not None else "off",
            interval_s=self._interval(),
        )

    def poke(self, policy: Policy | None = None) -> None:
        """Re-read the interval now (a policy reload may have changed it); takes the new policy
        so that it can be PolicyWatcher's on_change. Call on the event loop."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop the loop (a round in progress is cancelled) and close the runtime channel if owned."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._close_loader and self._loader is not None:
            await self._loader.close()
        if self.applier is not None:
            await self.applier.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            traced = trace.now() if trace.ON else 0  # bench/pod_timeline.py: which starts a round overlapped
            try:
                await self.run_once()
            except Exception:  # a bug in a round must not end reconciling
                log.exception("reconcile round failed")
            if trace.ON:
                trace.event("hooks.reconcile", began=traced)
            await self._wait(began, loop)

    async def _wait(self, began: float, loop: asyncio.AbstractEventLoop) -> None:
        """Until ``began`` + the interval in force, re-reading it whenever poked."""
        while True:
            remaining = began + self._interval() - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except TimeoutError:
                return
