"""The ``cpu`` plugin: CFS quota, CFS burst, cpu.idle and group identity per QoS class.

It reads the ``cpu`` section of the policy (docs/qos-classes.md) and works at two levels.

**Pod level**, written straight into the pod cgroup (``pod.cgroup_parent``) at
PreRunPodSandbox and PreUpdatePodSandboxResources, and re-applied by the reconciler:

====================  =============================  ===================  =====================================
what                  cgroup v1                      cgroup v2            when
====================  =============================  ===================  =====================================
CFS quota             cpu.cfs_quota_us + period      cpu.max              BE with ``be_quota_source: batch`` and
                                                                          the batch annotation; -1 for classes
                                                                          with ``cfs_quota_enabled: false``
CFS burst             cpu.cfs_burst_us               cpu.max.burst        every class, where the file exists
CPU shares            cpu.shares                     cpu.weight           BE with the batch annotation
CPU idle              cpu.idle                       cpu.idle             every class, where the file exists
group identity        cpu.bvt_warp_ns                cpu.bvt_warp_ns      every class, where the file exists
====================  =============================  ===================  =====================================

These are the values this plugin owns at pod level: the reconciler puts them back when
they drift. Everything else is kubelet's: ``cpu.shares`` / ``cpu.weight`` are written at pod
level only for a BE pod with batch resources (kubelet gives a BestEffort pod 2; Koordinator's
batchresource hook replaces that, and its reconciler, like ours, wins any later reset), and
the pod quota is left as kubelet set it unless the table says otherwise. Kubelet writes the pod quota only when
it creates the pod cgroup and on an in-place resize, so the two do not fight; the
reconciler re-applies ours after a resize.

* **BE quota** (Koordinator's ``batchresource`` hook): the pod annotation
  ``node.koordinator.sh/extended-resource-spec`` holds each container's
  ``kubernetes.io/batch-cpu`` requests and limits (resource.Quantity values counting
  milli-cores). The pod quota is the sum of the containers' limits *
  period / 1000 µs, at least 1000; a container without a batch-cpu limit makes the pod
  unlimited (-1), as in Koordinator. No annotation, or one that does not parse: the quota
  is left alone. The annotation is read by :mod:`..extended_resources` (Koordinator's rules).
* **BE shares** (batchresource ``SetPodCPUShares``): the pod's ``cpu.shares`` = the sum of the
  containers' batch-cpu requests * 1024 / 1000, within 2..262144 (``cpu.weight`` on v2, by
  the runtime's mapping); an annotation listing no containers changes nothing.
* **Burst**: ``cfs_burst_percent`` of the quota the cgroup ends up with, capped at that
  quota: the kernel refuses a burst above the quota (``tg_set_cfs_bandwidth``, and
  cgroup-v2.rst: "the burst in the range [0, $MAX]"), so Koordinator's ``cpuBurstPercent``
  of 1000 % acts as 100 % here. The default is 0 for every class: Koordinator's default burst
  policy is ``none`` (its cpuburst strategy then writes 0). 0 % or an unlimited quota write 0
  (no burst). When both change, the writes are ordered so that the burst never exceeds the
  quota in force. Koordinator's other burst, CFS *quota* burst (raising a throttled
  container's quota up to ``cfsQuotaBurstPercent`` while the node's share pool is idle), is
  not done: it is driven by usage and throttling metrics over time (koordlet's metric cache),
  which this plugin does not collect (docs/koordinator-parity.md).
* **cpu.idle** is the class's ``cpu_idle`` (1 or 0); the defaults leave it 0 for every
  class. The kernel pins an idle group's shares (and refuses writes to them), so a pod's
  shares are written before its group is made idle and after it is made not idle, never while
  it stays idle. **Group identity** (Alibaba Cloud Linux only) is chosen per pod as koordlet chooses
  it (:mod:`.cpu_qos`: the class's ``group_identity``, 0 when its ``group_identity_enabled``
  is false, Kubernetes QoS for a pod without a class label, an LS pod's own
  ``koordinator.sh/cpuQOS``); the reconciler also keeps it in the pod's containers, in
  kubelet's QoS-tier cgroups and in pod cgroups no live pod owns (:mod:`.cpu_tiers`).

If the pod cgroup does not exist yet at PreRunPodSandbox (no kubelet, e.g. on a test bed),
it is created as kubelet would name it (``CgroupFS.create_pod_cgroup``), only for a pod
cgroup under the pod roots: on v1 in the ``cpu`` hierarchy, on v2 with the ``cpu``
controller enabled in each ancestor's ``cgroup.subtree_control`` so that the new cgroup
gets the cpu files. Only what this plugin writes into is created; kubelet and the runtime make the rest.
Under the systemd cgroup driver nothing is created (logged instead): kubelet makes pod slices
through systemd (docs/systemd.md).
In a dry run (``dry_run``, ``runtime-hooks explain``) nothing is created, and every
cgroup access goes through the ``cgroups`` handle, which then records instead of writing.

**Container level**, through the hook response at PreCreateContainer and
PreUpdateContainerResources (the runtime writes it):

* BE (``be_quota_source: batch``), for a container listed in the batch annotation:
  ``cpu_quota`` = its batch-cpu limit * period / 1000 (at least 1000; -1 without a
  limit) with ``cpu_period``, and ``cpu_shares`` = its batch-cpu request * 1024 / 1000
  within 2..262144 (2 without a request), on v2 converted to ``cpu.weight`` by the runtime.
  With ``be_quota_source: kubelet`` only the shares are set.
* Classes with ``cfs_quota_enabled: false`` (LSE, LSR by default): ``cpu_quota`` -1,
  as Koordinator's cpuset hook does for pinned pods.
* Burst: written into the container cgroup at PostStartContainer and
  PostUpdateContainerResources, where the burst file exists; at PreUpdateContainerResources
  a burst above the coming quota is lowered first, or the runtime's quota write would fail.

The computations are pure (:func:`plan_pod`, :func:`plan_container`, and the arithmetic
below) so that ``runtime-hooks explain`` can show a plan without touching the node; the
``apply_*`` functions do the I/O, reading a value before writing it and writing only what
differs, except at PreRunPodSandbox, where the batch quota (cgroup v1) and shares are written
without being read: a read there could only spare rewriting an equal value (``_plan_and_apply``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ..cgroups import (
    MAX_SHARES,
    MIN_SHARES,
    CgroupError,
    CgroupFS,
    CgroupUnsupported,
    CgroupVersion,
    WeightConversion,
    shares_to_weight,
)
from ..extended_resources import (
    BATCH_CPU,
    EXTENDED_RESOURCE_SPEC_ANNOTATION,
    ExtendedResourceSpec,
    read_extended_resource_spec,
)
from ..pacing import paced
from ..policy import builtin_defaults
from ..qos import QoSClass, QoSResolution
from ..sdk import ContainerInfo, HookPoint, HookResponse, Plugin, PodInfo, ResourceChanges, Resources, qos_of
from ..settings import boolean, choice, integer, parsed_by
from .cpu_qos import GroupIdentityChoice, class_group_identity, pod_group_identity
from .cpu_tiers import DanglingPods, reconcile_tiers, set_group_identity
from .cpuset import cpuset_from_annotations

__all__ = [
    "CFS_PERIOD_US",
    "MAX_CFS_QUOTA_US",
    "MIN_CFS_QUOTA_US",
    "BEQuotaSource",
    "CPUSection",
    "CPUSettings",
    "CpuContainerPlan",
    "CpuPodPlan",
    "CpuState",
    "apply_container_burst",
    "apply_pod_plan",
    "cfs_burst_us",
    "ensure_pod_cgroup",
    "milli_cpu_to_quota",
    "milli_cpu_to_shares",
    "plan_container",
    "plan_pod",
    "plugin",
    "pod_cgroup_ready",
    "reconcile_pods",
]

BEQuotaSource = Literal["batch", "kubelet"]


@dataclass(frozen=True)
class CPUSettings:
    """CPU settings of one class.

    ``cfs_quota_enabled``: false runs the container with no CFS quota (-1).
    ``cfs_burst_percent``: cpu.cfs_burst_us (v1) / cpu.max.burst (v2) as a percentage of the
    cpu limit, 0 = off. ``cpu_idle``: cgroup cpu.idle. ``group_identity``: cpu.bvt_warp_ns
    (-1..2) on kernels that have it; ``group_identity_enabled``: false gives the class's pods 0
    instead (Koordinator's CPUQOS ``enable``; :mod:`.cpu_qos` says who takes which value).
    """

    cfs_quota_enabled: bool = field(metadata=parsed_by(boolean))
    cfs_burst_percent: int = field(metadata=parsed_by(integer(0, 10000, "a percentage")))
    cpu_idle: bool = field(metadata=parsed_by(boolean))
    group_identity: int = field(metadata=parsed_by(integer(-1, 2)))
    group_identity_enabled: bool = field(metadata=parsed_by(boolean))


@dataclass(frozen=True)
class CPUSection:
    """``be_quota_source``: "batch" sets a BE container's CFS quota from its kubernetes.io/batch-cpu
    limit, "kubelet" keeps kubelet's."""

    be_quota_source: BEQuotaSource = field(metadata=parsed_by(choice("batch", "kubelet")))


class CpuState:
    """The plugin's state in one server: how many pod-level values the reconciler put back, and
    the pod cgroups found unowned (hooks/plugins/cpu_tiers.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._drift_total = 0
        self.dangling = DanglingPods()

    def add_drift(self, repaired: int) -> None:
        with self._lock:
            self._drift_total += repaired

    @property
    def drift_repaired_total(self) -> int:
        with self._lock:
            return self._drift_total


# Its handlers only read and write cgroup/resctrl files: async def, run on the loop (no thread hand-off).
plugin = Plugin(
    "cpu",
    version="1.0",
    order=20,
    failure_policy="ignore",
    timeout=1.0,
    description="CFS quota (BE from batch-cpu, none for pinned classes), CFS burst, cpu.idle and group identity",
    settings=CPUSettings,
    section=CPUSection,
    defaults=builtin_defaults("cpu"),
    state=CpuState,
    needs=("cgroups",),
)

#: The CFS period Koordinator computes quotas with (CFSBasePeriodValue), kubelet's default too.
CFS_PERIOD_US: Final = 100_000
#: The smallest quota the kernel takes (1 ms); Koordinator's CFSQuotaMinValue.
MIN_CFS_QUOTA_US: Final = 1000
#: The largest quota (and quota + burst) the kernel takes: max_cfs_runtime, 2^44 - 1 µs.
MAX_CFS_QUOTA_US: Final = (1 << 44) - 1
_SHARES_PER_CPU: Final = 1024


# --- arithmetic ------------------------------------------------------------------------------


def milli_cpu_to_quota(milli_cpu: int, period_us: int = CFS_PERIOD_US) -> int:
    """The CFS quota for a limit of ``milli_cpu`` milli-cores: -1 (unlimited) for <= 0,
    else milli * period / 1000 µs, kept within MIN_CFS_QUOTA_US..MAX_CFS_QUOTA_US."""
    if milli_cpu <= 0 or period_us <= 0:
        return -1
    quota = milli_cpu * period_us // 1000
    return min(max(quota, MIN_CFS_QUOTA_US), MAX_CFS_QUOTA_US)


def milli_cpu_to_shares(milli_cpu: int) -> int:
    """cpu.shares for a request of ``milli_cpu`` milli-cores: milli * 1024 / 1000 within 2..262144."""
    if milli_cpu <= 0:
        return MIN_SHARES
    return min(max(milli_cpu * _SHARES_PER_CPU // 1000, MIN_SHARES), MAX_SHARES)


def cfs_burst_us(quota_us: int, percent: int) -> int:
    """The burst for ``quota_us`` at ``percent`` %: 0 for an unlimited quota or 0 %, never above the quota."""
    if quota_us <= 0 or percent <= 0:
        return 0
    return min(quota_us * percent // 100, quota_us)


# --- plans ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuPodPlan:
    """What the pod cgroup should hold. None: this plugin leaves the value as it is.

    ``cfs_quota`` µs per ``cfs_period`` µs, -1 = unlimited. ``cfs_burst`` µs (capped again
    at the quota found when applied). ``notes`` say why, for ``runtime-hooks explain``.
    """

    cgroup_parent: str
    qos: QoSClass
    cfs_quota: int | None = None
    cfs_period: int = CFS_PERIOD_US
    cfs_burst: int | None = None
    cpu_shares: int | None = None
    cpu_idle: bool | None = None
    group_identity: int | None = None
    notes: tuple[str, ...] = ()

    def files(self, version: CgroupVersion, conversion: WeightConversion = WeightConversion.LINEAR) -> dict[str, str]:
        """The planned cgroup files and their contents in ``version`` (files the kernel may lack
        included); on v2 the shares as the weight the node's runtime would make of them (``conversion``)."""
        out: dict[str, str] = {}
        if self.cfs_quota is not None:
            if version is CgroupVersion.V1:
                out["cpu.cfs_period_us"] = str(self.cfs_period)
                out["cpu.cfs_quota_us"] = str(self.cfs_quota if self.cfs_quota > 0 else -1)
            else:
                out["cpu.max"] = f"{self.cfs_quota if self.cfs_quota > 0 else 'max'} {self.cfs_period}"
        if self.cfs_burst is not None:
            out["cpu.cfs_burst_us" if version is CgroupVersion.V1 else "cpu.max.burst"] = str(self.cfs_burst)
        if self.cpu_shares is not None:
            if version is CgroupVersion.V1:
                out["cpu.shares"] = str(self.cpu_shares)
            else:
                out["cpu.weight"] = str(shares_to_weight(self.cpu_shares, conversion))
        if self.cpu_idle is not None:
            out["cpu.idle"] = "1" if self.cpu_idle else "0"
        if self.group_identity is not None:
            out["cpu.bvt_warp_ns"] = str(self.group_identity)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "level": "pod",
            "cgroup_parent": self.cgroup_parent,
            "qos": self.qos.value,
            "cfs_quota": self.cfs_quota,
            "cfs_period": self.cfs_period,
            "cfs_burst": self.cfs_burst,
            "cpu_shares": self.cpu_shares,
            "cpu_idle": self.cpu_idle,
            "group_identity": self.group_identity,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class CpuContainerPlan:
    """What the container gets: response fields (None: unchanged) and the burst written after start."""

    container: str
    qos: QoSClass
    cpu_quota: int | None = None
    cpu_period: int | None = None
    cpu_shares: int | None = None
    cfs_burst: int | None = None
    notes: tuple[str, ...] = ()

    def apply_to(self, resources: ResourceChanges) -> None:
        """Put the planned fields into a hook response's resources."""
        if self.cpu_quota is not None:
            resources.cpu_quota = self.cpu_quota
            if self.cpu_quota > 0 and self.cpu_period:
                resources.cpu_period = self.cpu_period
        if self.cpu_shares is not None:
            resources.cpu_shares = self.cpu_shares

    def describe(self) -> dict[str, Any]:
        return {
            "level": "container",
            "container": self.container,
            "qos": self.qos.value,
            "cpu_quota": self.cpu_quota,
            "cpu_period": self.cpu_period,
            "cpu_shares": self.cpu_shares,
            "cfs_burst": self.cfs_burst,
            "notes": list(self.notes),
        }


def _batch_spec(annotations: Mapping[str, str], notes: list[str]) -> ExtendedResourceSpec | None:
    """The pod's batch resources (hooks/extended_resources.py); None without a usable annotation."""
    spec, problem = read_extended_resource_spec(annotations)
    if problem:
        notes.append(f"batch resources ignored: {problem}")
    elif spec is None:
        notes.append(f"no {EXTENDED_RESOURCE_SPEC_ANNOTATION} annotation: batch resources unknown")
    else:
        notes.extend(spec.notes)
    return spec


def _effective_quota(planned: int | None, current: int | None, resources: Resources | None) -> int | None:
    """The quota the cgroup will run with: the plan's, else what the cgroup has, else what the
    request's resources say (0 there: no limit); None when nothing tells."""
    if planned is not None:
        return planned
    if current is not None:
        return current
    if resources is not None:
        return resources.cpu_quota if resources.cpu_quota > 0 else -1
    return None


def _pod_batch_quota(spec: ExtendedResourceSpec | None, period: int, notes: list[str]) -> int | None:
    """A BE pod's quota from the summed batch-cpu limits (-1 once one is missing); None: kubelet's."""
    if spec is None:
        return None
    if not spec.containers:
        notes.append("BE: the batch annotation lists no containers: quota left to kubelet")
        return None
    milli = spec.pod_limit(BATCH_CPU)
    if milli is None:
        notes.append("BE: a container has no batch-cpu limit: pod unlimited")
        return -1
    quota = milli_cpu_to_quota(milli, period)
    notes.append(f"BE: batch-cpu limits add up to {milli}m: quota {quota} per {period} µs")
    return quota


def _pod_batch_shares(spec: ExtendedResourceSpec | None, notes: list[str]) -> int | None:
    """A BE pod's cpu.shares from the summed batch-cpu requests (batchresource SetPodCPUShares)."""
    if spec is None or not spec.containers:
        return None
    milli = spec.pod_request(BATCH_CPU) or 0
    shares = milli_cpu_to_shares(milli)
    notes.append(f"BE: batch-cpu requests add up to {milli}m: pod cpu shares {shares}")
    return shares


def plan_pod(
    pod: PodInfo,
    qos: QoSClass,
    policy: CPUSettings,
    section: CPUSection,
    *,
    current_quota: int | None = None,
    group_identity: GroupIdentityChoice | None = None,
) -> CpuPodPlan:
    """The pod cgroup's planned values (see the module doc). ``current_quota``: the quota the
    pod cgroup has now (read by the caller; None without I/O), which the burst is computed
    from when the plan sets no quota; ``pod.resources`` stands in when it is None.
    ``group_identity``: the pod's, from :func:`.cpu_qos.pod_group_identity`; None: the class's."""
    notes: list[str] = []
    if group_identity is None:
        group_identity = GroupIdentityChoice(class_group_identity(policy))
    notes.extend(group_identity.notes)
    period = pod.resources.cpu_period if pod.resources is not None and pod.resources.cpu_period > 0 else CFS_PERIOD_US
    quota: int | None = None
    spec = _batch_spec(pod.annotations, notes) if qos is QoSClass.BE else None
    shares = _pod_batch_shares(spec, notes)
    if not policy.cfs_quota_enabled and _pinned(pod.annotations):
        quota = -1
        notes.append(f"{qos.value}: pinned to its own cpuset and cfs_quota_enabled is false: no CFS quota")
    elif qos is QoSClass.BE and section.be_quota_source == "batch":
        quota = _pod_batch_quota(spec, period, notes)
    else:
        notes.append("CFS quota left to kubelet")

    effective = _effective_quota(quota, current_quota, pod.resources)
    burst: int | None = None
    if effective is not None:
        burst = cfs_burst_us(effective, policy.cfs_burst_percent)
        if policy.cfs_burst_percent and effective > 0:
            notes.append(f"burst {policy.cfs_burst_percent}% of quota {effective}, at most the quota: {burst}")
    else:
        notes.append("pod quota unknown: burst left alone")
    return CpuPodPlan(
        cgroup_parent=pod.cgroup_parent,
        qos=qos,
        cfs_quota=quota,
        cfs_period=period,
        cfs_burst=burst,
        cpu_shares=shares,
        cpu_idle=policy.cpu_idle,
        group_identity=group_identity.value,
        notes=tuple(notes),
    )


def plan_container(
    pod: PodInfo,
    container: ContainerInfo,
    qos: QoSClass,
    policy: CPUSettings,
    section: CPUSection,
    *,
    current_quota: int | None = None,
) -> CpuContainerPlan:
    """The container's planned values (see the module doc). ``current_quota``: its cgroup's quota
    now (None without I/O), which the burst is computed from when the plan sets no quota;
    ``container.resources`` stands in when it is None."""
    notes: list[str] = []
    resources = container.resources
    period = resources.cpu_period if resources is not None and resources.cpu_period > 0 else CFS_PERIOD_US
    quota: int | None = None
    shares: int | None = None
    if qos is QoSClass.BE:
        spec = _batch_spec(pod.annotations, notes)
        entry = spec.container(container.name) if spec is not None else None
        if spec is not None and entry is None:
            notes.append(f"BE: container {container.name} is not in the batch annotation")
        if entry is not None:
            request = entry.request(BATCH_CPU) or 0
            shares = milli_cpu_to_shares(request)
            notes.append(f"BE: batch-cpu request {request}m: cpu shares {shares}")
            if section.be_quota_source == "batch":
                limit = entry.limit(BATCH_CPU) or 0
                quota = milli_cpu_to_quota(limit, period)
                notes.append(f"BE: batch-cpu limit {limit}m: quota {quota}")
    if not policy.cfs_quota_enabled and _pinned(pod.annotations):
        quota = -1
        notes.append(f"{qos.value}: pinned to its own cpuset and cfs_quota_enabled is false: no CFS quota")

    effective = _effective_quota(quota, current_quota, resources)
    burst = cfs_burst_us(effective, policy.cfs_burst_percent) if effective is not None else None
    return CpuContainerPlan(
        container=container.name,
        qos=qos,
        cpu_quota=quota,
        cpu_period=period if quota is not None and quota > 0 else None,
        cpu_shares=shares,
        cfs_burst=burst,
        notes=tuple(notes),
    )


# --- applying -----------------------------------------------------------------------------------


#: The period of a ``quota_now`` whose period was not read (no period is 0): apply_pod_plan looks at
#: the period only for a plan that sets a quota, so _plan_and_apply reads it only then.
_PERIOD_UNREAD: Final = 0
#: The quota of a ``quota_now`` whose quota was not read (a read quota is -1 or above 0): any quota a
#: plan sets differs from it, so it is written (see _plan_and_apply's ``at_start``).
_QUOTA_UNREAD: Final = 0


def _to_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _quota_and_period(fs: CgroupFS, parent: str, container_id: str | None = None) -> tuple[int, int] | None:
    """The cgroup's (quota, period) now (quota -1: unlimited); None without the file. Read errors are raised."""
    return fs.cpu_quota_if_present(parent, container_id)


def _current_quota(fs: CgroupFS, parent: str, container_id: str | None = None) -> int | None:
    """The cgroup's quota now (-1 unlimited); None where it cannot be read. v1's period file is not
    read: the quota alone is asked for."""
    try:
        now = fs.cpu_quota_first_if_present(parent, container_id)
    except (OSError, CgroupError, ValueError):
        return None
    return now[0] if now is not None else None


def ensure_pod_cgroup(fs: CgroupFS, parent: str, log: Any, *, dry_run: bool = False, controller: str = "cpu") -> bool:
    """Create the pod cgroup ``parent`` in ``controller``'s hierarchy if it is missing (see the
    module doc; the memory plugin uses it for batch-memory limits); True if it was made.
    With ``dry_run`` nothing is created (a mkdir is no cgroup-file write a dry-run handle records).
    CgroupPathError for a bad parent, CgroupScopeError for one that is no pod's under the pod roots."""
    return _ensure_pod_cgroup(fs, parent, log, dry_run=dry_run, controller=controller)[0]


def pod_cgroup_ready(fs: CgroupFS, parent: str, log: Any, *, dry_run: bool = False, controller: str = "cpu") -> bool:
    """:func:`ensure_pod_cgroup`, answering whether the pod cgroup exists afterwards: the caller
    need not stat it again."""
    return _ensure_pod_cgroup(fs, parent, log, dry_run=dry_run, controller=controller)[1]


def _ensure_pod_cgroup(fs: CgroupFS, parent: str, log: Any, *, dry_run: bool, controller: str) -> tuple[bool, bool]:
    """(made, exists now) for ensure_pod_cgroup and pod_cgroup_ready."""
    if fs.pod_cgroup_exists(controller, parent):
        return False, True
    target = fs.pod_path(controller, parent)
    if dry_run:
        log.info("would create the missing pod cgroup", path=str(target))
        return False, False
    try:
        made = fs.create_pod_cgroup(parent, controller, log=log)
    except CgroupUnsupported as exc:
        log.warning("pod cgroup not created", path=str(target), error=str(exc))
        return False, False
    log.info("created missing pod cgroup", path=str(target))
    return bool(made), True


def _write(what: str, log: Any, action: Any, *args: Any, present: bool = False, **kwargs: Any) -> bool:
    """Run the ``fs.set_*`` ``action``; False, logged, when it fails. ``present``: a file the kernel
    lacks (CgroupUnsupported from the setter) is skipped quietly, as a read of it would have been."""
    try:
        action(*args, **kwargs)
    except CgroupUnsupported as exc:
        if not present:
            log.warning("cgroup write failed", setting=what, error=str(exc))
        else:
            log.debug("cgroup file absent; not written", setting=what, error=str(exc))
        return False
    except (OSError, CgroupError, ValueError) as exc:
        log.warning("cgroup write failed", setting=what, error=str(exc))
        return False
    return True


def apply_pod_plan(
    fs: CgroupFS,
    plan: CpuPodPlan,
    log: Any,
    *,
    quota_now: tuple[int, int] | Literal["unread"] | None = "unread",
    exists: bool | None = None,
    at_start: bool = False,
) -> list[str]:
    """Bring the pod cgroup to ``plan``: read each value, write only those that differ, skip
    files the kernel lacks. The settings written (quota, burst, idle, group_identity).
    ``quota_now``: the (quota, period) the caller has just read (None: no quota file; the period
    may be _PERIOD_UNREAD for a plan that sets no quota, the quota _QUOTA_UNREAD for one that
    sets it), to save reading it again; "unread": read it here. ``exists``: whether the caller
    has just seen the pod cgroup (None: look here). ``at_start``: the shares are written without
    being read first (see _plan_and_apply)."""
    parent = plan.cgroup_parent
    if not (fs.exists(parent) if exists is None else exists):
        log.debug("pod cgroup does not exist; nothing applied", cgroup_parent=parent)
        return []
    written: list[str] = []

    if quota_now == "unread":
        quota_now = _quota_and_period(fs, parent)
    # Each file is read where it exists: one open answers both (read_if_exists).
    burst_text = fs.read_if_exists("cpu", fs.file_name("cpu.burst"), parent)
    burst_now = _to_int(burst_text) if burst_text is not None else None

    quota_to: tuple[int, int] | None = None
    if plan.cfs_quota is not None and quota_now is not None:
        quota = plan.cfs_quota if plan.cfs_quota > 0 else -1
        period = plan.cfs_period if quota > 0 else quota_now[1]  # unlimited: keep the period
        if (quota, period) != quota_now:
            quota_to = (quota, period)
    final_quota = quota_to[0] if quota_to is not None else (quota_now[0] if quota_now is not None else -1)

    burst_to: int | None = None
    if burst_now is not None:
        target = plan.cfs_burst
        if target is not None and final_quota > 0:
            target = min(target, final_quota)
        elif target is None and quota_to is not None and final_quota > 0 and burst_now > final_quota:
            target = final_quota  # else the kernel refuses the new quota
        if target is not None and target != burst_now:
            burst_to = target

    # The burst may never exceed the quota in force: lower it before the quota, raise it after.
    if burst_to is not None and burst_now is not None and burst_to < burst_now:
        if _write("burst", log, fs.set_cpu_burst, parent, burst_to):
            written.append("burst")
        burst_to = None
    # quota_to comes with the quota and period just read: an equal period is not written again.
    if (
        quota_to is not None
        and quota_now is not None
        and _write("quota", log, fs.set_cpu_quota, parent, quota_to[0], quota_to[1], period_now=quota_now[1])
    ):
        written.append("quota")
    if burst_to is not None and _write("burst", log, fs.set_cpu_burst, parent, burst_to):
        written.append("burst")

    # The kernel pins an idle group's shares and refuses to write them (EINVAL); making it not
    # idle resets them to 1024. So the shares are written while the group is not idle: after
    # making it not idle, before making it idle, never while it is and stays so.
    idle_text = fs.read_if_exists("cpu", "cpu.idle", parent) if plan.cpu_idle is not None else None
    idle_now = _to_int(idle_text) if idle_text is not None else None
    idle_to = None if idle_now is None or idle_now == (1 if plan.cpu_idle else 0) else plan.cpu_idle
    if idle_to is False and _write("idle", log, fs.set_cpu_idle, parent, False):
        written.append("idle")
    if (
        plan.cpu_shares is not None
        and not (idle_now == 1 and idle_to is None)  # idle, and stays so: pinned
        and (at_start or _shares_differ(fs, plan))
        and _write("shares", log, fs.set_cpu_shares, parent, plan.cpu_shares, present=at_start)
    ):
        written.append("shares")
    if idle_to is True and _write("idle", log, fs.set_cpu_idle, parent, True):
        written.append("idle")

    bvt_text = fs.read_if_exists("cpu", "cpu.bvt_warp_ns", parent) if plan.group_identity is not None else None
    if plan.group_identity is not None and bvt_text is not None:
        bvt_now = _to_int(bvt_text)
        if bvt_now != plan.group_identity and _write(
            "group_identity", log, fs.set_group_identity, parent, plan.group_identity
        ):
            written.append("group_identity")
    return written


def _shares_differ(fs: CgroupFS, plan: CpuPodPlan) -> bool:
    """Whether the pod cgroup's shares file exists and holds other shares than the plan's, compared
    as the file holds them: on v2 a weight, which maps back to other shares."""
    shares_file = fs.file_name("cpu.shares")
    text = fs.read_if_exists("cpu", shares_file, plan.cgroup_parent)
    return text is not None and _to_int(text) != int(plan.files(fs.version, fs.weight_conversion)[shares_file])


def apply_container_burst(
    fs: CgroupFS,
    parent: str,
    container_id: str,
    burst: int,
    log: Any,
    *,
    only_lower: bool = False,
    quota_now: int | Literal["unread"] | None = "unread",
) -> bool:
    """Set the container cgroup's burst to ``burst`` (capped at its quota) where the file exists
    and the value differs; with ``only_lower``, only if that lowers it. True if written.
    ``quota_now``: the quota as the caller just read it (_current_quota), not read again."""
    burst_file = fs.file_name("cpu.burst")
    # No file without the cgroup: one open answers for both.
    text = fs.read_if_exists("cpu", burst_file, parent, container_id)
    if text is None:
        return False
    now = _to_int(text)
    quota = _current_quota(fs, parent, container_id) if quota_now == "unread" else quota_now
    if quota is not None and quota > 0:
        burst = min(burst, quota)
    if now == burst or (only_lower and now is not None and burst > now):
        return False
    return _write("burst", log, fs.set_cpu_burst, parent, burst, container_id=container_id)


def _plan_and_apply(
    fs: CgroupFS,
    pod: PodInfo,
    qos: QoSClass,
    settings: CPUSettings,
    section: CPUSection,
    log: Any,
    *,
    exists: bool | None = None,
    group_identity: GroupIdentityChoice | None = None,
    at_start: bool = False,
) -> tuple[CpuPodPlan, list[str]]:
    """Plan the pod cgroup from the quota it has now and apply the plan, reading the quota once
    for both (the plan goes without it when it cannot be read; applying then reads it again
    and raises why). v1's period, a file of its own, is read only for a plan that sets a quota:
    nothing else needs it (a pod start saves an open, a read and a close). ``exists``: as
    apply_pod_plan's. ``group_identity``: as plan_pod's.

    ``at_start`` (PreRunPodSandbox): the quota and shares a plan sets are written without being
    read first. There the read could only spare a write of the value the file already holds:
    the pod cgroup is new (kubelet gave a BestEffort pod no quota and 2 shares, which the batch
    values replace) or a re-created sandbox's, whose values this plugin set; a write of an equal
    value changes nothing in the kernel. What protects something is still read: v1's period (a
    quota is written alone only where the period stays the same) and the burst (lowered before
    the quota, as the kernel refuses a burst above it). The reconciler reads and compares, as
    it repairs drift and counts it. On v2 cpu.max holds quota and period: it is read as before."""
    parent = pod.cgroup_parent
    if at_start and fs.version is CgroupVersion.V1:
        plan = plan_pod(pod, qos, settings, section, group_identity=group_identity)
        if plan.cfs_quota is not None:  # then the plan does not depend on the quota the cgroup has
            period_now = _period_only(fs, parent)
            return plan, apply_pod_plan(fs, plan, log, quota_now=period_now, exists=exists, at_start=True)
    first: tuple[int, int | None] | Literal["unread"] | None
    try:
        first = fs.cpu_quota_first_if_present(parent)
    except (OSError, CgroupError, ValueError):
        first = "unread"
    current = first[0] if isinstance(first, tuple) else None
    plan = plan_pod(pod, qos, settings, section, current_quota=current, group_identity=group_identity)
    quota_now: tuple[int, int] | Literal["unread"] | None
    if not isinstance(first, tuple):
        quota_now = first
    elif first[1] is not None:
        quota_now = (first[0], first[1])
    elif plan.cfs_quota is None:  # the period is not looked at: the current quota is what counts
        quota_now = (first[0], _PERIOD_UNREAD)
    else:
        try:
            quota_now = (first[0], fs.cpu_period(parent))
        except (OSError, CgroupError, ValueError):
            quota_now = "unread"
    return plan, apply_pod_plan(fs, plan, log, quota_now=quota_now, exists=exists, at_start=at_start)


def _period_only(fs: CgroupFS, parent: str) -> tuple[int, int] | Literal["unread"] | None:
    """(_QUOTA_UNREAD, the period) of a v1 pod cgroup; None without the period file (no CFS
    bandwidth: the quota file goes with it); "unread" when it cannot be read (applying reads
    again and says why)."""
    try:
        text = fs.read_if_exists("cpu", fs.file_name("cpu.period"), parent)
        return None if text is None else (_QUOTA_UNREAD, int(text))
    except (OSError, CgroupError, ValueError):
        return "unread"


# --- reconciling -----------------------------------------------------------------------------


def reconcile_pods(
    fs: CgroupFS,
    pods: Sequence[PodInfo],
    settings_for: Callable[[QoSClass], CPUSettings],
    section: CPUSection,
    log: Any,
    state: CpuState | None = None,
    containers: Mapping[str, Sequence[ContainerInfo]] | None = None,
) -> int:
    """Re-apply the pod-level plan to each pod's existing cgroup, and its group identity to its
    containers' (``containers``: by sandbox id); how many values were repaired (also added to
    ``state``'s total). The handler does the same in slices (hooks/pacing.py), with the tiers."""
    found = containers or {}
    repaired = sum(_reconcile_pod(fs, pod, settings_for, section, log, found.get(pod.sandbox_id, ())) for pod in pods)
    if state is not None:
        state.add_drift(repaired)
    return repaired


def _reconcile_pod(
    fs: CgroupFS,
    pod: PodInfo,
    settings_for: Callable[[QoSClass], CPUSettings],
    section: CPUSection,
    log: Any,
    containers: Sequence[ContainerInfo] = (),
) -> int:
    """Re-apply the pod-level plan to the pod's cgroup if it exists, and the pod's group identity
    to its containers' cgroups (koordlet keeps them equal); how many values were repaired."""
    if not pod.cgroup_parent:
        return 0
    try:
        if not fs.exists(pod.cgroup_parent):
            return 0
        resolution = qos_of(pod)
        qos = resolution.qos_class
        choice = pod_group_identity(resolution, pod.cgroup_parent, pod.annotations, settings_for)
        _, written = _plan_and_apply(fs, pod, qos, settings_for(qos), section, log, exists=True, group_identity=choice)
    except (OSError, CgroupError, ValueError) as exc:
        log.warning("cannot reconcile pod", pod=f"{pod.namespace}/{pod.name}", error=str(exc))
        return 0
    written.extend(
        f"group_identity of {container.name}"
        for container in containers
        if container.id and set_group_identity(fs, pod.cgroup_parent, choice.value, log, container.id)
    )
    if written:
        log.info("repaired drifted cpu settings", pod=f"{pod.namespace}/{pod.name}", settings=written)
    return len(written)


# --- handlers ----------------------------------------------------------------------------------


@plugin.on(HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_UPDATE_POD_SANDBOX_RESOURCES)
async def set_pod_cgroup(
    *,
    hook: HookPoint,
    pod: PodInfo,
    qos: QoSClass,
    qos_resolution: QoSResolution,
    settings: CPUSettings,
    settings_for: Callable[[QoSClass], CPUSettings],
    section: CPUSection,
    cgroups: CgroupFS,
    log: Any,
    dry_run: bool = False,
    **kwargs: Any,
) -> None:
    """Write the pod-level values into the pod cgroup (creating it at PreRunPodSandbox if missing)."""
    if not pod.cgroup_parent:
        return
    choice = pod_group_identity(qos_resolution, pod.cgroup_parent, pod.annotations, settings_for)
    if choice.problem:
        log.warning("pod CPU QoS annotation refused; the class's group identity applies", reason=choice.problem)
    exists: bool | None = None  # the pod cgroup is looked at once per call
    at_start = hook is HookPoint.PRE_RUN_POD_SANDBOX
    if at_start:
        exists = pod_cgroup_ready(cgroups, pod.cgroup_parent, log, dry_run=dry_run)
    plan, written = _plan_and_apply(
        cgroups,
        pod,
        qos,
        settings,
        section,
        log,
        exists=exists,
        group_identity=choice,
        at_start=at_start and not dry_run,  # a dry run shows only the writes that change a value
    )
    if written:
        log.debug("pod cpu settings applied", settings=written, plan=plan.describe())


@plugin.on(HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
async def set_container_resources(
    *,
    hook: HookPoint,
    pod: PodInfo,
    container: ContainerInfo,
    qos: QoSClass,
    settings: CPUSettings,
    section: CPUSection,
    response: HookResponse,
    cgroups: CgroupFS,
    log: Any,
    **kwargs: Any,
) -> None:
    """Set the container's quota, period and shares in the response."""
    plan = plan_container(pod, container, qos, settings, section)
    plan.apply_to(response.resources)
    if (
        hook is HookPoint.PRE_UPDATE_CONTAINER_RESOURCES
        and container.id
        and pod.cgroup_parent
        and plan.cfs_burst is not None
    ):
        apply_container_burst(cgroups, pod.cgroup_parent, container.id, plan.cfs_burst, log, only_lower=True)


@plugin.on(HookPoint.POST_START_CONTAINER, HookPoint.POST_UPDATE_CONTAINER_RESOURCES)
async def set_container_burst(
    *,
    pod: PodInfo,
    container: ContainerInfo,
    qos: QoSClass,
    settings: CPUSettings,
    section: CPUSection,
    cgroups: CgroupFS,
    log: Any,
    **kwargs: Any,
) -> None:
    """Write the container's CFS burst into its cgroup, where the kernel has the file."""
    if not container.id or not pod.cgroup_parent:
        return
    # At 0 % the burst is 0 whatever the quota (cfs_burst_us): the quota is read only where it counts.
    current = _current_quota(cgroups, pod.cgroup_parent, container.id) if settings.cfs_burst_percent else -1
    plan = plan_container(pod, container, qos, settings, section, current_quota=current)
    if plan.cfs_burst is not None:
        apply_container_burst(cgroups, pod.cgroup_parent, container.id, plan.cfs_burst, log, quota_now=current)


@plugin.reconcile
async def reconcile(
    *,
    pods: Sequence[PodInfo],
    cgroups: CgroupFS,
    settings_for: Callable[[QoSClass], CPUSettings],
    section: CPUSection,
    state: CpuState,
    log: Any,
    containers: Mapping[str, Sequence[ContainerInfo]] | None = None,
    **kwargs: Any,
) -> int:
    """Re-apply the pod-level values of ``pods`` and their containers' group identity
    (``containers``, by sandbox id), the QoS tiers' and the dangling pod cgroups' group identity
    (hooks/plugins/cpu_tiers.py); the number of drifted values repaired. In slices
    (hooks/pacing.py): a hook call arriving meanwhile is not kept waiting for the whole round."""
    repaired = reconcile_tiers(cgroups, settings_for, log)
    found = containers or {}
    async for pod in paced(pods):
        repaired += _reconcile_pod(cgroups, pod, settings_for, section, log, found.get(pod.sandbox_id, ()))
    repaired += state.dangling.reconcile(cgroups, pods, settings_for, log)
    state.add_drift(repaired)
    return repaired


def _pinned(annotations: Mapping[str, str]) -> bool:
    """Whether the scheduler gave the pod CPUs of its own: only then is its quota lifted.

    Lifting it without a cpuset would let the pod run unbounded on the shared pool."""
    try:
        return bool(cpuset_from_annotations(annotations))
    except ValueError:
        return False
