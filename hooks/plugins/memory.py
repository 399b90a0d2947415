"""The ``memory`` plugin: memory protection and throttling per QoS class, and BE's OOM order.

What it sets, and when
----------------------

=====================  ==========================  =================================================
hook                   cgroup v2                   cgroup v1
=====================  ==========================  =================================================
PreRunPodSandbox       pod cgroup: ``memory.min``, pod cgroup: ``memory.soft_limit_in_bytes``
(pod resources given)  ``memory.low``,             (``v1_soft_limit``), ``memory.wmark_*``
                       ``memory.high``,
                       ``memory.wmark_*``
PreCreateContainer     BE: ``oom_score_adj`` 1000 in the response, only if that raises it (both);
                       with ``pod_oom_score_adj``, the pod's Koordinator annotation instead
PostStartContainer     container cgroup: as the    container cgroup: as the pod's
                       pod's
reconcile              the same values for every pod (resources known) and every container given;
                       only files whose content differs are written; returns how many were
=====================  ==========================  =================================================

With ``batch_memory_limit`` (BE by default) it also limits the pod cgroup at PreRunPodSandbox
and each container through the CRI answer at PreCreateContainer / PreUpdateContainerResources
to their ``kubernetes.io/batch-memory`` limits, only ever tightening a limit, and reconciles
both (:mod:`.batch_memory`). The annotation is read by :mod:`..extended_resources`.

Reconcile is what makes a policy change reach running containers, and sets back what someone
else wrote. The plugin keeps no state: every value follows from the pod, container and policy.

From the class's ``memory`` policy entry (:class:`MemorySettings`), with ``request`` and
``limit`` the memory request and limit of the container (or the pod's totals):

* ``memory.min`` = request * ``min_percent`` / 100 and ``memory.low`` = request *
  ``low_percent`` / 100, Koordinator's formulas (``minLimitPercent``, ``lowLimitPercent``); low
  is raised to min if it would be below it (as Koordinator does).
* ``memory.high`` = request + (limit - request) * ``throttling_percent`` / 100, the formula the
  policy documents (:class:`MemorySettings`). NOTE: Koordinator's current code computes
  the container's memory.high as limit * throttlingPercent / 100 (qosmanager
  cgreconcile ``calculateContainerResources``); with an unknown request (taken as 0, below)
  the two agree.
* Each value is rounded down to a whole page, so it reads back as written (the kernel keeps
  whole pages, cgroup-v2.rst "Memory Interface Files").
* "Off" means the file is not written and keeps what it has (a new cgroup's ``0``, ``0`` and
  ``max``; or what kubelet's MemoryQoS feature wrote): ``*_percent`` 0 is off; so is
  memory.min/low with an unknown request (nothing to protect) and memory.high with no limit
  (nothing to throttle below). So min <= low <= high <= limit wherever they are set.
* ``memory.wmark_ratio`` / ``memory.wmark_scale_factor`` / ``memory.wmark_min_adj``
  (``wmark_ratio``, ``wmark_scale_permill``, ``wmark_min_adj``): written where the kernel has
  the files (Alibaba Cloud Linux), on both versions.
* cgroup v1 has no memory.min/low/high; ``v1_soft_limit`` decides
  ``memory.soft_limit_in_bytes``: ``unset`` leaves it alone, ``request`` writes the request
  in whole pages (left alone when the request is unknown), ``zero`` writes 0.
* Protection is hierarchical: the kernel caps a cgroup's effective memory.min/low by its
  ancestors' (cgroup-v2.rst). This plugin writes the pod and container levels only; the
  kubepods QoS cgroups above them need values at least as large for protection to hold.

**OOM order.** kubelet gives a BestEffort container oom_score_adj 1000 and a Burstable one
2..999 by its memory request; a pod labelled BE may be either. At PreCreateContainer a BE
container whose oom_score_adj is below 1000 gets 1000 through the response; a value is only
ever raised, never lowered, and other classes are left to kubelet. With ``pod_oom_score_adj``
(off by default) a container's value from ``koordinator.sh/oom-score-adj-spec`` /
``koordinator.sh/oom-score-adj`` (:mod:`.oom_score`) takes the place of both rules, for every
class, as koordlet's oomscoreadj hook does; it is set at creation only (koordlet also rewrites
``/proc/<pid>/oom_score_adj`` from its reconciler; ours does not). A value of 0 cannot be asked
for (0 means "unset" in the CRI answer): it is logged and kubelet's value stays.

Where request and limit come from
---------------------------------

The CRI carries a container's memory *limit* (``memory_limit_in_bytes``) but not its
*request*; the pod's total limit comes with RunPodSandbox (``PodInfo.resources``). So:

* **request**, first found of:

  1. the pod annotation ``node.koordinator.sh/extended-resource-spec`` (Koordinator's webhook
     writes it: ``{"containers": {"<name>": {"requests": {...}, "limits": {...}}}}``), entry
     ``kubernetes.io/batch-memory`` for BE (Koordinator's batch resource), ``memory`` for the
     other classes; a pod's request is the sum over the containers listed;
  2. ``unified["memory.min"]`` of the container's (or pod's) resources, which is the request
     when kubelet's MemoryQoS feature gate is on;
  3. unknown: memory.min and memory.low are not written, memory.high takes the request as 0
     (as Koordinator does for a container without a request), v1 ``request`` writes nothing.

* **limit**: for BE, the annotation's ``kubernetes.io/batch-memory`` limit first (kubelet
  knows no batch resources, so a BE container's CRI limit is usually 0), then the CRI limit;
  for the other classes the CRI limit first, then the annotation's ``memory`` limit. A pod's
  annotation limit is the sum over its listed containers, only when each of them has one.
  0 or absent means no limit. A request above the limit is taken as the limit.

Every value, where it came from and why a file is left alone are in the plan
(:func:`container_plan`, :func:`pod_plan`, :meth:`MemoryPlan.describe`): the pure functions
read nothing from the node, for ``explain`` and tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

from ..cgroups import CgroupError, CgroupFS, CgroupUnsupported, CgroupVersion
from ..extended_resources import (
    BATCH_MEMORY,
    EXTENDED_RESOURCE_SPEC_ANNOTATION,
    ExtendedResourceSpec,
    read_extended_resource_spec,
)
from ..pacing import paced
from ..policy import builtin_defaults
from ..qos import QoSClass
from ..sdk import ContainerInfo, HookPoint, HookResponse, Plugin, PodInfo, Resources, qos_of
from ..settings import boolean, choice, integer, parsed_by, percent
from . import batch_memory
from .cpu import pod_cgroup_ready
from .oom_score import oom_score_adj_for

__all__ = [
    "BE_OOM_SCORE_ADJ",
    "PAGE_SIZE",
    "MemoryInputs",
    "MemoryPlan",
    "MemorySettings",
    "Protection",
    "V1SoftLimit",
    "apply_plan",
    "container_inputs",
    "container_plan",
    "oom_score_adj",
    "plugin",
    "pod_inputs",
    "pod_plan",
    "protection",
    "soft_limit",
    "wmark_values",
]

V1SoftLimit = Literal["unset", "request", "zero"]


@dataclass(frozen=True)
class MemorySettings:
    """Memory settings of one class (cgroup v2 unless said otherwise).

    memory.min = request * ``min_percent`` / 100 and memory.low = request * ``low_percent`` /
    100 (0 = off; low may not be below min); memory.high = request + (limit - request) *
    ``throttling_percent`` / 100 (0 = off, "max"). ``wmark_ratio``, ``wmark_scale_permill``,
    ``wmark_min_adj``: Anolis OS memcg async reclaim, written only where the files exist.
    ``v1_soft_limit`` (cgroup v1): memory.soft_limit_in_bytes "unset", "request" or "zero".
    ``batch_memory_limit``: limit the pod and its containers to their kubernetes.io/batch-memory
    limits (:mod:`.batch_memory`; Koordinator's batchresource hook, for BE).
    ``pod_oom_score_adj``: take a container's oom_score_adj from Koordinator's
    ``koordinator.sh/oom-score-adj(-spec)`` annotations (:mod:`.oom_score`; off for every
    class, as koordlet's OOMScoreAdj gate is by default: a pod could lower its own score).
    """

    min_percent: int = field(metadata=parsed_by(percent))
    low_percent: int = field(metadata=parsed_by(percent))
    throttling_percent: int = field(metadata=parsed_by(percent))
    wmark_ratio: int = field(metadata=parsed_by(percent))
    wmark_scale_permill: int = field(metadata=parsed_by(integer(1, 1000, "a per-mille value")))
    wmark_min_adj: int = field(metadata=parsed_by(integer(-25, 50)))
    v1_soft_limit: V1SoftLimit = field(metadata=parsed_by(choice("unset", "request", "zero")))
    batch_memory_limit: bool = field(metadata=parsed_by(boolean))
    pod_oom_score_adj: bool = field(metadata=parsed_by(boolean))

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.low_percent and self.low_percent < self.min_percent:
            reason = f"{self.low_percent} is below min_percent ({self.min_percent}): memory.low < memory.min"
            yield "low_percent", reason


# Its handlers only read and write cgroup/resctrl files: async def, run on the loop (no thread hand-off).
plugin = Plugin(
    "memory",
    version="1.0",
    order=50,
    failure_policy="ignore",
    timeout=2.0,
    description=(
        "memory.min/low/high (v2) or soft limit (v1) per QoS class; BE memory limits from batch-memory; "
        "BE containers OOM-killed first"
    ),
    settings=MemorySettings,
    defaults=builtin_defaults("memory"),
    needs=("cgroups",),
)

#: kubelet's oom_score_adj for BestEffort containers, the highest there is.
BE_OOM_SCORE_ADJ: Final = 1000
#: The kernel keeps memory.min/low/high in whole pages.
PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")

_V2_FILES: Final = ("memory.min", "memory.low", "memory.high")
_V1_FILE: Final = "memory.soft_limit_in_bytes"
Level = Literal["pod", "container"]

# --- inputs (pure) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryInputs:
    """A container's (or pod's) memory request and limit in bytes, None when unknown / unlimited,
    and where each came from."""

    request: int | None
    limit: int | None
    request_source: str = "unknown"
    limit_source: str = "none"
    notes: tuple[str, ...] = ()


def _resource_name(qos: QoSClass) -> str:
    return BATCH_MEMORY if qos is QoSClass.BE else "memory"


def _unified_request(resources: Resources | None) -> int | None:
    if resources is None:
        return None
    value = resources.unified.get("memory.min", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _finish(request: tuple[int | None, str], limit: tuple[int | None, str], notes: list[str]) -> MemoryInputs:
    req, req_source = request
    lim, lim_source = limit
    if req is not None and lim is not None and req > lim:
        notes.append(f"request {req} is above the limit {lim}; taken as the limit")
        req = lim
    return MemoryInputs(req, lim, req_source, lim_source, tuple(notes))


def _spec(pod: PodInfo) -> tuple[ExtendedResourceSpec, list[str]]:
    """The pod's extended-resource spec (empty when absent or ignored) and notes on it."""
    spec, problem = read_extended_resource_spec(pod.annotations)
    notes = [problem] if problem else []
    if spec is None:
        return ExtendedResourceSpec(), notes
    return spec, notes + list(spec.notes)


def container_inputs(qos: QoSClass, pod: PodInfo, container: ContainerInfo) -> MemoryInputs:
    """The container's memory request and limit, from the sources in the module doc."""
    spec, notes = _spec(pod)
    name = _resource_name(qos)
    entry = spec.container(container.name)
    request: tuple[int | None, str] = (None, "unknown")
    if entry is not None and (value := entry.request(name)) is not None:
        request = (value, f"{EXTENDED_RESOURCE_SPEC_ANNOTATION} requests[{name}]")
    elif (unified := _unified_request(container.resources)) is not None:
        request = (unified, "unified memory.min (kubelet MemoryQoS)")
    cri = container.resources.memory_limit_in_bytes if container.resources is not None else 0
    from_cri = (cri, "CRI memory_limit_in_bytes") if cri > 0 else None
    limit_value = entry.limit(name) if entry is not None else None
    from_spec = (limit_value, f"{EXTENDED_RESOURCE_SPEC_ANNOTATION} limits[{name}]") if limit_value else None
    first, second = (from_spec, from_cri) if qos is QoSClass.BE else (from_cri, from_spec)
    limit: tuple[int | None, str] = first or second or (None, "none")
    return _finish(request, limit, notes)


def pod_inputs(qos: QoSClass, pod: PodInfo) -> MemoryInputs:
    """The pod's total memory request and limit (sums over the annotation's containers)."""
    spec, notes = _spec(pod)
    name = _resource_name(qos)
    request: tuple[int | None, str] = (None, "unknown")
    if (requested := spec.pod_request(name)) is not None:
        request = (requested, f"{EXTENDED_RESOURCE_SPEC_ANNOTATION} requests[{name}], summed")
    elif (unified := _unified_request(pod.resources)) is not None:
        request = (unified, "unified memory.min (kubelet MemoryQoS)")
    cri = pod.resources.memory_limit_in_bytes if pod.resources is not None else 0
    from_cri = (cri, "pod resources memory_limit_in_bytes") if cri > 0 else None
    total = spec.pod_limit(name)
    from_spec = (total, f"{EXTENDED_RESOURCE_SPEC_ANNOTATION} limits[{name}], summed") if total else None
    first, second = (from_spec, from_cri) if qos is QoSClass.BE else (from_cri, from_spec)
    limit: tuple[int | None, str] = first or second or (None, "none")
    return _finish(request, limit, notes)


# --- values (pure) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Protection:
    """cgroup v2 memory.min / memory.low / memory.high in bytes; None leaves the file as it is."""

    min: int | None = None
    low: int | None = None
    high: int | None = None
    notes: tuple[str, ...] = ()


def _page_floor(value: int, page_size: int) -> int:
    return value // page_size * page_size


def protection(
    request: int | None, limit: int | None, policy: MemorySettings, page_size: int = PAGE_SIZE
) -> Protection:
    """memory.min / low / high for a request and limit (None: unknown / unlimited); see the module doc."""
    if page_size <= 0:
        raise ValueError(f"page size must be > 0, got {page_size}")
    for what, value in (("request", request), ("limit", limit)):
        if value is not None and value < 0:
            raise ValueError(f"memory {what} must be >= 0, got {value}")
    notes: list[str] = []
    if request is not None and limit is not None and request > limit:
        request = limit
    mem_min = mem_low = mem_high = None
    if request is not None:
        if policy.min_percent:
            mem_min = _page_floor(request * policy.min_percent // 100, page_size)
        if policy.low_percent:
            mem_low = _page_floor(request * policy.low_percent // 100, page_size)
            if mem_min is not None and mem_low < mem_min:
                mem_low = mem_min
    elif policy.min_percent or policy.low_percent:
        notes.append("memory.min/low left alone: the memory request is unknown")
    if policy.throttling_percent:
        if limit is None:
            notes.append("memory.high left alone: no memory limit")
        else:
            base = request if request is not None else 0
            mem_high = _page_floor(base + (limit - base) * policy.throttling_percent // 100, page_size)
            if mem_high == 0:
                notes.append("memory.high left alone: the limit is below one page")
                mem_high = None
            elif mem_min is not None and mem_high < mem_min:
                mem_high = mem_min
    return Protection(mem_min, mem_low, mem_high, tuple(notes))


def soft_limit(request: int | None, policy: MemorySettings, page_size: int = PAGE_SIZE) -> int | None:
    """cgroup v1 memory.soft_limit_in_bytes for ``v1_soft_limit`` (whole pages, as the kernel
    keeps it); None leaves the file alone."""
    if policy.v1_soft_limit == "zero":
        return 0
    if policy.v1_soft_limit == "request" and request is not None:
        return _page_floor(request, page_size)
    return None


def wmark_values(policy: MemorySettings) -> dict[str, int]:
    """The Alibaba Cloud Linux memcg watermark settings (setting name of cgroups.FILES -> value)."""
    return {
        "memory.wmark_ratio": policy.wmark_ratio,
        "memory.wmark_scale_factor": policy.wmark_scale_permill,
        "memory.wmark_min_adj": policy.wmark_min_adj,
    }


def oom_score_adj(qos: QoSClass, current: int) -> int | None:
    """The oom_score_adj to ask for: BE_OOM_SCORE_ADJ for a BE container below it, else None.
    Never lower than ``current``."""
    if qos is QoSClass.BE and current < BE_OOM_SCORE_ADJ:
        return BE_OOM_SCORE_ADJ
    return None


@dataclass(frozen=True)
class MemoryPlan:
    """What to write to one cgroup: the inputs, and per file the value (None: left alone)."""

    level: Level
    qos: QoSClass
    version: CgroupVersion
    inputs: MemoryInputs
    protection: Protection | None = None  # v2
    soft_limit: int | None = None  # v1
    wmark: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def files(self) -> dict[str, str | None]:
        """File name -> value written ("max" for no memory.high), None for files left alone.
        The wmark files are written only where the kernel has them."""
        shown: dict[str, str | None] = {}
        if self.version is CgroupVersion.V2:
            prot = self.protection or Protection()
            shown["memory.min"] = None if prot.min is None else str(prot.min)
            shown["memory.low"] = None if prot.low is None else str(prot.low)
            shown["memory.high"] = None if prot.high is None else str(prot.high)
        else:
            shown["memory.soft_limit_in_bytes"] = None if self.soft_limit is None else str(self.soft_limit)
        shown.update({name: str(value) for name, value in self.wmark.items()})
        return shown

    @property
    def notes(self) -> tuple[str, ...]:
        return self.inputs.notes + (self.protection.notes if self.protection else ())

    def describe(self) -> dict[str, Any]:
        """The plan as plain data (for ``explain``)."""
        return {
            "level": self.level,
            "class": self.qos.value,
            "cgroup": f"v{int(self.version)}",
            "request": self.inputs.request,
            "request_source": self.inputs.request_source,
            "limit": self.inputs.limit,
            "limit_source": self.inputs.limit_source,
            "files": self.files(),
            "notes": list(self.notes),
        }


def _plan(
    level: Level,
    qos: QoSClass,
    policy: MemorySettings,
    version: CgroupVersion,
    inputs: MemoryInputs,
    page_size: int,
) -> MemoryPlan:
    if version is CgroupVersion.V2:
        prot = protection(inputs.request, inputs.limit, policy, page_size)
        return MemoryPlan(level, qos, version, inputs, protection=prot, wmark=MappingProxyType(wmark_values(policy)))
    return MemoryPlan(
        level,
        qos,
        version,
        inputs,
        soft_limit=soft_limit(inputs.request, policy, page_size),
        wmark=MappingProxyType(wmark_values(policy)),
    )


def container_plan(
    qos: QoSClass,
    policy: MemorySettings,
    pod: PodInfo,
    container: ContainerInfo,
    version: CgroupVersion,
    page_size: int = PAGE_SIZE,
) -> MemoryPlan:
    """What PostStartContainer writes to the container's cgroup."""
    return _plan("container", qos, policy, version, container_inputs(qos, pod, container), page_size)


def pod_plan(
    qos: QoSClass, policy: MemorySettings, pod: PodInfo, version: CgroupVersion, page_size: int = PAGE_SIZE
) -> MemoryPlan:
    """What PreRunPodSandbox writes to the pod's cgroup."""
    return _plan("pod", qos, policy, version, pod_inputs(qos, pod), page_size)


# --- writing ------------------------------------------------------------------------------------


def _same(cgroups: CgroupFS, file: str, value: str, parent: str, container_id: str | None) -> bool:
    # read_if_exists: a file this kernel lacks (v1 has no memory.wmark_*) is probed once, not read
    # and missed twice per pod every round (CgroupFS remembers it); apply_plan then skips it.
    return cgroups.read_if_exists("memory", file, parent, container_id) == value


def apply_plan(
    cgroups: CgroupFS,
    plan: MemoryPlan,
    parent: str,
    container_id: str | None = None,
    *,
    only_drifted: bool = False,
    exists: bool | None = None,
) -> dict[str, str]:
    """Write ``plan`` to the pod's (or container's) cgroup; the files written and their values.

    ``only_drifted``: read each file first and write only those that differ (reconcile).
    ``exists``: whether the caller has just seen the cgroup (None: look here).
    Raises FileNotFoundError when the cgroup does not exist and CgroupUnsupported when the
    memory controller's files are missing (not enabled for this cgroup); wmark files that
    the kernel lacks are skipped. A plan left with nothing to write once the files the kernel
    is known to lack are set aside (CgroupFS.lacks: v1's defaults, whose only files are the
    wmark ones) writes nothing and looks at no cgroup: a container start saves its lstats.
    """
    wanted = {
        name: value for name, value in plan.files().items() if value is not None and not cgroups.lacks("memory", name)
    }
    if not wanted:
        return {}
    if not (cgroups.exists(parent, container_id, "memory") if exists is None else exists):
        raise FileNotFoundError(f"no memory cgroup for {parent!r} {container_id or ''}".strip())
    if only_drifted:
        wanted = {
            name: value for name, value in wanted.items() if not _same(cgroups, name, value, parent, container_id)
        }
    written: dict[str, str] = {}
    if plan.version is CgroupVersion.V2:
        values = {name: int(wanted[name]) if name in wanted else None for name in _V2_FILES}
        if any(value is not None for value in values.values()):
            cgroups.set_memory_protection(
                parent,
                min_bytes=values["memory.min"],
                low_bytes=values["memory.low"],
                high_bytes=values["memory.high"],
                container_id=container_id,
            )
            written.update({name: wanted[name] for name in _V2_FILES if name in wanted})
    elif _V1_FILE in wanted:
        cgroups.set_memory_soft_limit(parent, int(wanted[_V1_FILE]), container_id=container_id)
        written[_V1_FILE] = wanted[_V1_FILE]
    for setting in plan.wmark:
        name = cgroups.file_name(setting)
        if name in wanted and cgroups.has_file("memory", name, parent, container_id):
            cgroups.write("memory", name, wanted[name], parent, container_id)
            written[name] = wanted[name]
    return written


def _apply(
    cgroups: CgroupFS,
    plan: MemoryPlan,
    parent: str,
    container_id: str | None,
    log: Any,
    *,
    only_drifted: bool = False,
    exists: bool | None = None,
) -> dict[str, str]:
    for note in plan.notes:
        log.debug("memory plan note", level=plan.level, note=note)
    try:
        written = apply_plan(cgroups, plan, parent, container_id, only_drifted=only_drifted, exists=exists)
    except FileNotFoundError:
        log.debug("no memory cgroup to write", level=plan.level)
        return {}
    except CgroupUnsupported as exc:
        log.debug("memory files not available", level=plan.level, error=str(exc))
        return {}
    if written:
        log.debug("memory settings written", level=plan.level, files=written, drifted=only_drifted)
    return written


# --- handlers -----------------------------------------------------------------------------------


def _pod_limit(cgroups: CgroupFS, pod: PodInfo, log: Any, *, create: bool, dry_run: bool = False) -> int:
    """Bring the pod cgroup's memory limit to its batch-memory plan; 1 if written, else 0."""
    return _created_pod_limit(cgroups, pod, log, create=create, dry_run=dry_run)[0]


def _created_pod_limit(
    cgroups: CgroupFS, pod: PodInfo, log: Any, *, create: bool, dry_run: bool = False
) -> tuple[int, bool | None]:
    """_pod_limit, and whether the pod cgroup exists when ``create`` looked (None: not looked)."""
    plan = batch_memory.pod_limit_plan(pod)
    if plan.limit is None:
        return 0, None
    exists = None
    if create:
        exists = pod_cgroup_ready(cgroups, pod.cgroup_parent, log, dry_run=dry_run, controller="memory")
    return _write_limit(cgroups, plan, pod.cgroup_parent, None, log), exists


def _write_limit(
    cgroups: CgroupFS, plan: batch_memory.LimitPlan, parent: str, container_id: str | None, log: Any
) -> int:
    try:
        written = batch_memory.apply_limit(cgroups, plan, parent, container_id, log)
    except FileNotFoundError:
        log.debug("no memory cgroup for the batch-memory limit", level=plan.level)
        return 0
    except (OSError, CgroupError) as exc:  # v1 EBUSY: usage above the limit and not reclaimable
        log.warning("batch-memory limit not written", level=plan.level, limit=plan.limit, error=str(exc))
        return 0
    if written is None:
        return 0
    log.info("batch-memory limit written", level=plan.level, limit=written, notes=list(plan.notes))
    return 1


@plugin.on(HookPoint.PRE_RUN_POD_SANDBOX)
async def pod_memory(
    *,
    pod: PodInfo,
    qos: QoSClass,
    settings: MemorySettings,
    cgroups: CgroupFS,
    log: Any,
    dry_run: bool = False,
    **kwargs: Any,
) -> None:
    if not pod.cgroup_parent:
        return
    try:
        exists = None  # the pod cgroup is looked at once per call
        if settings.batch_memory_limit:
            _, exists = _created_pod_limit(cgroups, pod, log, create=True, dry_run=dry_run)
        if pod.resources is not None:
            plan = pod_plan(qos, settings, pod, cgroups.version)
            _apply(cgroups, plan, pod.cgroup_parent, None, log, exists=exists)
    except CgroupError as exc:  # not a cgroup mount, or a parent we refuse to touch
        log.warning("pod memory settings not written", error=str(exc))


@plugin.on(HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
async def container_resources(
    *,
    hook: HookPoint,
    pod: PodInfo,
    container: ContainerInfo,
    qos: QoSClass,
    settings: MemorySettings,
    response: HookResponse,
    log: Any,
    **kwargs: Any,
) -> None:
    """The batch-memory limit (when tighter than kubelet's) and, at creation, the oom_score_adj."""
    if settings.batch_memory_limit:
        plan = batch_memory.container_limit_plan(pod, container)
        if batch_memory.set_response_limit(plan, container, response.resources):
            log.debug("batch-memory limit set", limit=plan.limit)
    if hook is HookPoint.PRE_CREATE_CONTAINER:
        current = container.resources.oom_score_adj if container.resources is not None else 0
        target = _container_oom_score_adj(qos, settings, pod, container, current, log)
        if target is not None:
            response.resources.oom_score_adj = target


def _container_oom_score_adj(
    qos: QoSClass, settings: MemorySettings, pod: PodInfo, container: ContainerInfo, current: int, log: Any
) -> int | None:
    """The oom_score_adj to answer (None: leave kubelet's): the pod's annotation when the class
    takes it and it asks for a value, else BE's rule."""
    if settings.pod_oom_score_adj:
        wanted, problem = oom_score_adj_for(pod.annotations, container.name)
        if problem:
            log.warning("oom_score_adj annotation not used", reason=problem)
        elif wanted == 0 and current != 0:
            log.warning("oom_score_adj 0 cannot be set through the CRI answer (0 means unset)", kept=current)
        elif wanted is not None:
            return wanted if wanted != current else None
    return oom_score_adj(qos, current)


@plugin.on(HookPoint.POST_START_CONTAINER)
async def container_memory(
    *,
    pod: PodInfo,
    container: ContainerInfo,
    qos: QoSClass,
    settings: MemorySettings,
    cgroups: CgroupFS,
    log: Any,
    **kwargs: Any,
) -> None:
    if not container.id or not pod.cgroup_parent:
        return
    try:
        plan = container_plan(qos, settings, pod, container, cgroups.version)
        _apply(cgroups, plan, pod.cgroup_parent, container.id, log)
    except CgroupError as exc:
        log.warning("container memory settings not written", error=str(exc))


def _reconcile_pod(
    cgroups: CgroupFS, pod: PodInfo, policy: MemorySettings, containers: Sequence[ContainerInfo], log: Any
) -> int:
    qos = qos_of(pod).qos_class
    repaired = 0
    if policy.batch_memory_limit:
        repaired += _pod_limit(cgroups, pod, log, create=False)
    if pod.resources is not None:
        plan = pod_plan(qos, policy, pod, cgroups.version)
        repaired += len(_apply(cgroups, plan, pod.cgroup_parent, None, log, only_drifted=True))
    for container in containers:
        if not container.id:
            continue
        if policy.batch_memory_limit:
            limit = batch_memory.container_limit_plan(pod, container)
            repaired += _write_limit(cgroups, limit, pod.cgroup_parent, container.id, log)
        plan = container_plan(qos, policy, pod, container, cgroups.version)
        repaired += len(_apply(cgroups, plan, pod.cgroup_parent, container.id, log, only_drifted=True))
    return repaired


@plugin.reconcile
async def reconcile(
    *,
    pods: Sequence[PodInfo],
    cgroups: CgroupFS,
    settings_for: Callable[[QoSClass], MemorySettings],
    log: Any,
    containers: Mapping[str, Sequence[ContainerInfo]] | None = None,
    **kwargs: Any,
) -> int:
    """Set back what drifted from the current policy: each pod's cgroup (its batch-memory limit;
    the protection when its resources are known) and its containers' (``containers``, by
    sandbox id). Returns the files rewritten. In slices (hooks/pacing.py): a hook call arriving
    meanwhile is not kept waiting for the whole round."""
    repaired = 0
    async for pod in paced(pods):
        if not pod.cgroup_parent:
            continue
        try:
            policy = settings_for(qos_of(pod).qos_class)
            repaired += _reconcile_pod(cgroups, pod, policy, (containers or {}).get(pod.sandbox_id, ()), log)
        except CgroupError as exc:
            log.warning("memory settings not reconciled", pod=f"{pod.namespace}/{pod.name}", error=str(exc))
    if repaired:
        log.info("memory settings set back", files=repaired)
    return repaired
