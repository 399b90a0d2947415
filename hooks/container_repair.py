"""Container repair: each live container's resources put back to what the plugins' hooks set.

A container's CPU and memory values come from the plugins' answer when it is created (or
resized). A container created while that answer was missing keeps kubelet's values -- through
the proxy while an Ignore hook server was down, over NRI while runtime-hooks was not registered
or answered past NRI's deadline -- and a value can be changed behind the runtime's back later.
Container repair finds both and sets the plugins' values again:

1. **What the plugins set** (:meth:`ContainerRepair.wanted`): the plugins' PreUpdateContainerResources
   handlers run against the container as the runtime reports it, as they would for kubelet's
   resize of it (the built-in ones set the same values there as at creation); their calls are
   counted and logged under the hook ``repair``. A plugin whose container values should be kept
   handles PreUpdateContainerResources too.
2. **Where it differs** (:meth:`ContainerRepair.compare`, rules in hooks/drift.py): from the
   container's cgroup, which is read for the fields the answer sets, and from the runtime's
   record of it where the caller has one it can trust. A container whose record lacks the
   values was **unhooked** (created or updated without our answer); one whose record has them
   but whose cgroup does not has **drifted**.
3. **Setting them** (a :class:`RepairApplier`): in NRI mode the runtime updates the container
   (hooks/nri/repair.py: the Synchronize answer, and the runtime's CRI UpdateContainerResources
   in a reconcile round), which corrects its record and its cgroup alike; through the proxy,
   :class:`CgroupWrites` writes the container's cgroup files, as koordlet does -- only pod and
   container cgroups under the pod roots (hooks/cgroups.py, docs/security.md "Where it writes").

Each container repaired is one warning line ("container repaired": container, its id, pod, mode,
reason and each value as ``field: before -> after``) and one count in
``runtimeproxy_hooks_containers_repaired_total{mode,reason}``; a repair the runtime or the kernel
refused is one warning ("container repair failed", with the cause) and one count in
``runtimeproxy_hooks_container_repairs_failed_total{mode}``, and is tried again at the next round.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter

from runtimeproxy.hookapi.hookpoints import HookPoint

from .cgroups import MAX_SHARES, MIN_SHARES, CgroupError, CgroupFS, CgroupVersion
from .changes import ResourceChanges
from .drift import (
    DEFAULT_CFS_PERIOD_US,
    UNLIMITED,
    Drift,
    Seen,
    changes_for,
    drifts,
    seen_in_record,
    wanted_fields,
)
from .pacing import paced
from .plugin_runner import HookCallFailed, PluginRunner
from .plugins.batch_memory import parse_limit
from .views import ContainerInfo, PodInfo

__all__ = [
    "REPAIR_LABEL",
    "REPAIR_POINT",
    "CgroupWrites",
    "ContainerRepair",
    "Reason",
    "RepairApplier",
    "RepairDeferred",
    "RepairFailed",
    "RepairMetrics",
    "RepairPlan",
    "seen_in_cgroup",
]

log = structlog.get_logger("runtimeproxy.hooks.repair")

#: The hook point whose answer says what a live container should have, and the name its calls go by.
REPAIR_POINT: Final = HookPoint.PRE_UPDATE_CONTAINER_RESOURCES
REPAIR_LABEL: Final = "repair"
PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")


class Reason(enum.StrEnum):
    UNHOOKED = "unhooked"  # the runtime's record lacks the plugins' values
    DRIFTED = "drifted"  # the record has them, the cgroup does not


class RepairFailed(Exception):
    """The runtime or the kernel refused a repair; the message says why."""


class RepairDeferred(Exception):
    """No repair can be made now (not registered with NRI); the message says when it will be."""


class RepairMetrics:
    """``runtimeproxy_hooks_containers_repaired_total{mode,reason}`` and
    ``runtimeproxy_hooks_container_repairs_failed_total{mode}``; ``mode``'s series exist from the start."""

    def __init__(self, registry: CollectorRegistry | None = None, mode: str | None = None) -> None:
        reg = CollectorRegistry(auto_describe=True) if registry is None else registry
        self.repaired = Counter(
            "runtimeproxy_hooks_containers_repaired",
            "Containers whose resources differed from what the plugins set and were set back, by mode "
            "(nri, proxy) and reason (unhooked: the runtime's record lacked the values; drifted: the cgroup did).",
            ["mode", "reason"],
            registry=reg,
        )
        self.failed = Counter(
            "runtimeproxy_hooks_container_repairs_failed",
            "Container repairs the runtime or the kernel refused (tried again at the next round), by mode.",
            ["mode"],
            registry=reg,
        )
        if mode is not None:
            for reason in Reason:
                self.repaired.labels(mode=mode, reason=reason.value)
            self.failed.labels(mode=mode)


@dataclass(frozen=True)
class RepairPlan:
    """One container to repair: what differs (``found``), the values that set it right
    (``changes``: the plugins' values of those fields), why, and its cgroup as read (None: none)."""

    pod: PodInfo
    container: ContainerInfo
    found: tuple[Drift, ...]
    changes: ResourceChanges
    reason: Reason
    cgroup: Seen | None

    @property
    def where(self) -> dict[str, str]:
        """What a log line about the repair names."""
        pod = self.pod
        return {
            "container": self.container.name,
            "container_id": self.container.id,
            "pod": f"{pod.namespace}/{pod.name}",
        }


class RepairApplier(Protocol):
    """How one mode sets a container's values. ``record_known``: the runtime's record of a live
    container (the CRI status a reconcile round lists) shows the plugins' values when it got them."""

    mode: str
    how: str
    record_known: bool

    async def settle(self) -> None:
        """Wait until updates the runtime has still to make are made (RepairDeferred: not now)."""

    async def apply(self, plan: RepairPlan) -> None:
        """Set ``plan``'s values; RepairFailed, RepairDeferred with the reason."""

    async def close(self) -> None:
        """Release what it holds (a connection); at the reconciler's stop."""


def seen_in_cgroup(fs: CgroupFS, parent: str, container_id: str, fields: Iterable[str]) -> Seen | None:
    """The container's cgroup values of ``fields`` (REPAIRED_FIELDS names); None without its cgroup
    (not started yet, or gone). A file the kernel lacks leaves its field unknown. OSError,
    CgroupError or ValueError when a file cannot be read or parsed."""
    if not fs.exists(parent, container_id):
        return None
    wanted = set(fields)
    quota = period = shares = limit = None
    if wanted & {"cpu_quota", "cpu_period"}:
        bandwidth = fs.cpu_quota_if_present(parent, container_id)
        if bandwidth is not None:
            quota, period = bandwidth
    if "cpu_shares" in wanted:
        text = fs.read_if_exists("cpu", fs.file_name("cpu.shares"), parent, container_id)
        shares = int(text) if text is not None else None
    cpus = fs.read_if_exists("cpuset", "cpuset.cpus", parent, container_id) if "cpuset_cpus" in wanted else None
    mems = fs.read_if_exists("cpuset", "cpuset.mems", parent, container_id) if "cpuset_mems" in wanted else None
    if "memory_limit_in_bytes" in wanted:
        text = fs.read_if_exists("memory", fs.file_name("memory.limit"), parent, container_id)
        if text is not None:
            in_bytes = parse_limit(text, fs.version)
            limit = UNLIMITED if in_bytes is None else in_bytes
    v2 = fs.version is CgroupVersion.V2
    return Seen(quota, period, shares, cpus, mems, limit, weights=v2, page_size=PAGE_SIZE,
                conversion=fs.weight_conversion)


class ContainerRepair:
    """Finds and reports container repairs for ``runner``'s plugins; see the module doc."""

    def __init__(self, runner: PluginRunner, metrics: RepairMetrics | None = None) -> None:
        self.runner = runner
        self.metrics = metrics if metrics is not None else RepairMetrics()
        runner.expect_calls_as(REPAIR_LABEL, REPAIR_POINT)

    @property
    def enabled(self) -> bool:
        """Whether any enabled plugin answers for a container at REPAIR_POINT."""
        return REPAIR_POINT in self.runner.hook_points

    async def wanted(self, pod: PodInfo, container: ContainerInfo) -> ResourceChanges | None:
        """The resources the plugins set for ``container``; None when a "fail" plugin failed (the
        runner has logged and counted it: the container is looked at again next time)."""
        try:
            result = await self.runner.run(REPAIR_POINT, pod=pod, container=container, label=REPAIR_LABEL)
        except HookCallFailed:
            return None
        return result.response.resources

    def compare(
        self,
        pod: PodInfo,
        container: ContainerInfo,
        wanted: ResourceChanges,
        *,
        record: Seen | None,
        repair_record: bool,
    ) -> RepairPlan | None:
        """What to repair of ``container`` (None: nothing). ``record``: the runtime's record of it,
        when trusted; ``repair_record``: the applier sets the record too, so a field the record
        alone has wrong is repaired as well (over NRI)."""
        fields = wanted_fields(wanted)
        if not fields:
            return None
        in_record = drifts(wanted, record) if record is not None else []
        cgroup = self._cgroup(pod, container, fields)
        found = drifts(wanted, cgroup) if cgroup is not None else []
        if repair_record:
            names = {_repaired_name(drift) for drift in found}
            found += [drift for drift in in_record if _repaired_name(drift) not in names]
        if not found:
            return None
        reason = Reason.UNHOOKED if in_record else Reason.DRIFTED
        return RepairPlan(pod, container, tuple(found), changes_for(wanted, found), reason, cgroup)

    def _cgroup(self, pod: PodInfo, container: ContainerInfo, fields: Sequence[str]) -> Seen | None:
        fs = self.runner.context.cgroups
        if fs is None or not pod.cgroup_parent or not container.id:
            return None
        try:
            return seen_in_cgroup(fs, pod.cgroup_parent, container.id, fields)
        except FileNotFoundError:  # gone since it was listed
            return None
        except (OSError, CgroupError, ValueError) as exc:
            log.warning(
                "cannot read the container's cgroup; its values are not checked there",
                container=container.name,
                pod=f"{pod.namespace}/{pod.name}",
                error=str(exc),
            )
            return None

    def repaired(self, plan: RepairPlan, mode: str, how: str) -> None:
        self.metrics.repaired.labels(mode=mode, reason=plan.reason.value).inc()
        log.warning(
            "container repaired",
            mode=mode,
            reason=plan.reason.value,
            how=how,
            values=[str(drift) for drift in plan.found],
            **plan.where,
        )

    def failed(self, plan: RepairPlan, mode: str, cause: str) -> None:
        self.metrics.failed.labels(mode=mode).inc()
        log.warning(
            "container repair failed; trying again at the next round",
            mode=mode,
            reason=plan.reason.value,
            values=[str(drift) for drift in plan.found],
            error=cause,
            **plan.where,
        )

    async def reconcile(
        self, pods: Sequence[PodInfo], containers: Mapping[str, Sequence[ContainerInfo]], applier: RepairApplier
    ) -> int:
        """One reconcile round's repairs over the live ``pods`` and their ``containers`` (by sandbox
        id), set by ``applier``; the containers repaired. In slices (hooks/pacing.py). Containers
        found to differ are compared again once the runtime has made the updates it still had to
        make (``applier.settle``), so that an update already under way is not made twice."""
        if not self.enabled:
            return 0
        found: list[tuple[RepairPlan, ResourceChanges]] = []
        pairs = [(pod, container) for pod in pods for container in containers.get(pod.sandbox_id, ())]
        async for pod, container in paced(pairs):
            wanted = await self.wanted(pod, container)
            if wanted is None:
                continue
            record = seen_in_record(container.resources) if applier.record_known else None
            plan = self.compare(pod, container, wanted, record=record, repair_record=False)
            if plan is not None:
                found.append((plan, wanted))
        if not found:
            return 0
        try:
            await applier.settle()
            return await self._apply(found, applier)
        except RepairDeferred as exc:
            log.info("container repair deferred", mode=applier.mode, containers=len(found), reason=str(exc))
            return 0

    async def _apply(self, found: list[tuple[RepairPlan, ResourceChanges]], applier: RepairApplier) -> int:
        repaired = 0
        for first, wanted in found:
            record = seen_in_record(first.container.resources) if applier.record_known else None
            plan = self.compare(first.pod, first.container, wanted, record=record, repair_record=False)
            if plan is None:  # set meanwhile
                continue
            try:
                await applier.apply(plan)
            except RepairFailed as exc:
                self.failed(plan, applier.mode, str(exc))
                continue
            self.repaired(plan, applier.mode, applier.how)
            repaired += 1
        return repaired


def _repaired_name(drift: Drift) -> str:
    """The field that repairs ``drift`` (a cgroup v2 weight is set through the shares)."""
    return "cpu_shares" if drift.field == "cpu_weight" else drift.field


# --- proxy mode: the cgroup files ------------------------------------------------------------------


class CgroupWrites:
    """Container repair through the proxy: the plugins' values written into the container's cgroup
    files (hooks/cgroups.py writes only pod and container cgroups under the pod roots)."""

    mode = "proxy"
    how = "cgroup write"
    record_known = True  # through the proxy the runtime records the hooked request

    def __init__(self, fs: CgroupFS) -> None:
        self.fs = fs

    async def settle(self) -> None:
        """Nothing is pending: the writes are made here."""

    async def close(self) -> None:
        """Nothing is held."""

    async def apply(self, plan: RepairPlan) -> None:
        try:
            write_container_values(self.fs, plan)
        except (OSError, CgroupError, ValueError) as exc:
            raise RepairFailed(f"cgroup write: {exc}") from None


def write_container_values(fs: CgroupFS, plan: RepairPlan) -> None:
    """Write ``plan.changes`` into the container's cgroup, CFS bandwidth first (a burst above the
    new quota lowered before it: the kernel refuses a quota below the burst)."""
    parent, container_id, changes = plan.pod.cgroup_parent, plan.container.id, plan.changes
    seen = plan.cgroup if plan.cgroup is not None else Seen()
    if changes.cpu_quota or changes.cpu_period:
        quota = changes.cpu_quota or (seen.cpu_quota if seen.cpu_quota is not None else UNLIMITED)
        period = changes.cpu_period or seen.cpu_period or DEFAULT_CFS_PERIOD_US
        if quota > 0:
            _lower_burst(fs, parent, container_id, quota)
        fs.set_cpu_quota(parent, quota, period, container_id, period_now=seen.cpu_period)
    if changes.cpu_shares:
        fs.set_cpu_shares(parent, min(max(changes.cpu_shares, MIN_SHARES), MAX_SHARES), container_id)
    for name in ("cpuset_mems", "cpuset_cpus"):
        value: str = getattr(changes, name)
        if value:
            fs.write("cpuset", name.replace("_", "."), value, parent, container_id)
    if changes.memory_limit_in_bytes:
        fs.write("memory", fs.file_name("memory.limit"), changes.memory_limit_in_bytes, parent, container_id)


def _lower_burst(fs: CgroupFS, parent: str, container_id: str, quota: int) -> None:
    burst = fs.read_if_exists("cpu", fs.file_name("cpu.burst"), parent, container_id)
    if burst is not None and int(burst) > quota:
        fs.set_cpu_burst(parent, quota, container_id)
