"""The ``cpuset`` plugin: pinned classes run on the CPUs Koordinator's scheduler assigned to the pod.

koord-scheduler writes the CPUs it allocated to an LSE or LSR pod into the pod annotation
``scheduling.koordinator.sh/resource-status``, a JSON object whose ``cpuset`` field is a
Linux CPU list (``{"cpuset": "0-3"}``; Koordinator ``apis/extension`` ResourceStatus). For a
container of a class whose policy says ``pinned`` (LSE and LSR by default, Koordinator's
``cpusetPodQOSConditions``), this plugin sets the response's ``cpuset_cpus`` to that list
at PreCreateContainer and PreUpdateContainerResources; the runtime writes it to the
container's ``cpuset.cpus`` (v1 and v2 alike). The CFS quota of these classes is the
``cpu`` plugin's business (``cfs_quota_enabled: false``).

Left untouched: containers of classes not pinned, pods without the annotation or with an
empty ``cpuset``, and every pod when the policy says ``trust.pod_cpuset: false`` (the
runner then withholds the annotation from all plugins: hooks/podview.py). An annotation
that is not such a JSON object, or a CPU list that ``parse_cpuset`` refuses, is logged and
skipped: the pod starts on the shared pool rather than failing. So is a list naming CPUs
the node does not have (checked against the cgroup root's effective CPUs when a cgroup
tree is at hand), since the runtime would fail the container on it. The list is passed on
in canonical form (``format_cpuset``).

The reconciler keeps it (Koordinator registers the same container- and sandbox-level cpuset
reconcilers, ``hooks/cpuset/cpuset.go``): every round, each live pod of a pinned class with a
usable cpuset gets that list back in its containers' and its sandbox's ``cpuset.cpus`` where
they differ. The sandbox is pinned that way only (a RunPodSandbox answer has no cpuset for
it). This does not fight kubelet: kubelet's own cpuset updates (its CPU manager's
UpdateContainerResources) pass through PreUpdateContainerResources, which answers the same
list. A pod whose annotation is unusable, or names CPUs the node lacks, is skipped, with one
warning per pod (not one a round).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from runtimeproxy.hookapi.value_bounds import format_cpuset, parse_cpuset

from ..cgroups import CgroupError, CgroupFS, CgroupVersion
from ..convert import qos_of
from ..pacing import paced
from ..podview import RESOURCE_STATUS_ANNOTATION
from ..policy import builtin_defaults
from ..qos import QoSClass
from ..sdk import ContainerInfo, HookPoint, HookResponse, Plugin, PodInfo
from ..settings import boolean, parsed_by

__all__ = [
    "RESOURCE_STATUS_ANNOTATION",
    "CPUSetSettings",
    "CpusetPlan",
    "cpuset_from_annotations",
    "node_cpus",
    "plan_container",
    "plugin",
    "reconcile",
]


@dataclass(frozen=True)
class CPUSetSettings:
    """``pinned``: the container runs on the cpuset assigned to its pod instead of the shared pool."""

    pinned: bool = field(metadata=parsed_by(boolean))


# Its handlers only read and write cgroup/resctrl files: async def, run on the loop (no thread hand-off).
plugin = Plugin(
    "cpuset",
    version="1.0",
    order=30,
    failure_policy="ignore",
    timeout=1.0,
    description="pins LSE and LSR containers to the cpuset koord-scheduler assigned to the pod",
    settings=CPUSetSettings,
    defaults=builtin_defaults("cpuset"),
    state=set,  # uids of the live pods the reconciler already warned about
)

# The root cgroup's effective CPUs, per version (v1: in the cpuset hierarchy).
_EFFECTIVE_CPUS: Final = {CgroupVersion.V1: "cpuset.effective_cpus", CgroupVersion.V2: "cpuset.cpus.effective"}


def cpuset_from_annotations(annotations: Mapping[str, str]) -> frozenset[int] | None:
    """The CPUs of the resource-status annotation; None when there is no annotation or no cpuset.

    ValueError (saying what is wrong) when the annotation is not a JSON object, its
    ``cpuset`` is not a string, or the string is not a CPU list.
    """
    text = annotations.get(RESOURCE_STATUS_ANNOTATION)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{RESOURCE_STATUS_ANNOTATION} is not JSON: {exc}") from None
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{RESOURCE_STATUS_ANNOTATION} must be a JSON object")
    value = data.get("cpuset")
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{RESOURCE_STATUS_ANNOTATION}: cpuset must be a string, got {type(value).__name__}")
    try:
        cpus = parse_cpuset(value.strip())
    except ValueError as exc:
        raise ValueError(f"{RESOURCE_STATUS_ANNOTATION}: cpuset: {exc}") from None
    return cpus or None


@dataclass(frozen=True)
class CpusetPlan:
    """The container's cpuset_cpus (None: unchanged) and why."""

    container: str
    qos: QoSClass
    cpuset_cpus: str | None = None
    notes: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {
            "level": "container",
            "container": self.container,
            "qos": self.qos.value,
            "cpuset_cpus": self.cpuset_cpus,
            "notes": list(self.notes),
        }


def plan_container(pod: PodInfo, container: ContainerInfo, qos: QoSClass, policy: CPUSetSettings) -> CpusetPlan:
    """The container's cpuset from the pod annotation when its class is pinned. Pure; ValueError
    for a malformed annotation (the handler logs it and skips)."""
    if not policy.pinned:
        return CpusetPlan(container.name, qos, None, (f"{qos.value} is not pinned: shared pool",))
    cpus = cpuset_from_annotations(pod.annotations)
    if cpus is None:
        return CpusetPlan(container.name, qos, None, (f"{qos.value} is pinned, but the pod has no cpuset assigned",))
    cpuset = format_cpuset(cpus)
    return CpusetPlan(container.name, qos, cpuset, (f"{qos.value} is pinned: cpuset {cpuset} from the scheduler",))


def node_cpus(fs: CgroupFS) -> frozenset[int] | None:
    """The CPUs the cgroup root may use (its effective cpuset); None when it cannot be read."""
    try:
        name = _EFFECTIVE_CPUS[fs.version]
        if not fs.has_file("cpuset", name, ""):
            return None
        return parse_cpuset(fs.read("cpuset", name, "")) or None
    except (OSError, CgroupError, ValueError):
        return None


@plugin.on(HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
async def pin_container(
    *,
    pod: PodInfo,
    container: ContainerInfo | None,
    qos: QoSClass,
    settings: CPUSetSettings,
    response: HookResponse,
    cgroups: CgroupFS | None,
    log: Any,
    **kwargs: Any,
) -> None:
    """Set cpuset_cpus for a pinned class's container; log and skip anything unusable."""
    if container is None or not settings.pinned:
        return
    try:
        plan = plan_container(pod, container, qos, settings)
    except ValueError as exc:
        log.warning("cpuset annotation unusable; container left on the shared pool", error=str(exc))
        return
    if plan.cpuset_cpus is None:
        return
    available = node_cpus(cgroups) if cgroups is not None else None
    if available is not None:
        missing = parse_cpuset(plan.cpuset_cpus) - available
        if missing:
            log.warning(
                "assigned cpuset names CPUs the node does not have; container left on the shared pool",
                cpuset=plan.cpuset_cpus,
                missing=format_cpuset(missing),
                node_cpus=format_cpuset(available),
            )
            return
    response.resources.cpuset_cpus = plan.cpuset_cpus


# --- the reconciler ------------------------------------------------------------------------------


def _pinned_cpus(
    pod: PodInfo, settings_for: Callable[[QoSClass], CPUSetSettings], fs: CgroupFS
) -> frozenset[int] | None:
    """The CPUs a live pod's cgroups must keep; None when it is not pinned. ValueError (why) when
    its annotation is unusable or names CPUs the node lacks."""
    if not settings_for(qos_of(pod).qos_class).pinned:
        return None
    cpus = cpuset_from_annotations(pod.annotations)
    available = node_cpus(fs) if cpus else None
    if cpus and available is not None and not cpus <= available:
        raise ValueError(f"cpuset names CPUs the node does not have: {format_cpuset(cpus - available)}")
    return cpus


def _set_back(fs: CgroupFS, parent: str, cgroup_id: str, cpus: frozenset[int]) -> bool:
    """Write ``cpus`` to the cgroup's cpuset.cpus if it holds another list; whether it did."""
    if not fs.has_file("cpuset", "cpuset.cpus", parent, cgroup_id):
        return False  # gone since the listing, or not made yet
    text = fs.read("cpuset", "cpuset.cpus", parent, cgroup_id)
    try:
        if parse_cpuset(text) == cpus:
            return False
    except ValueError:
        pass  # not a list: rewrite it
    fs.write("cpuset", "cpuset.cpus", format_cpuset(cpus), parent, cgroup_id)
    return True


@plugin.reconcile
async def reconcile(
    *,
    pods: Sequence[PodInfo],
    cgroups: CgroupFS | None,
    settings_for: Callable[[QoSClass], CPUSetSettings],
    state: set[str],
    log: Any,
    containers: Mapping[str, Sequence[ContainerInfo]] | None = None,
    **kwargs: Any,
) -> int:
    """Put the assigned cpuset back into pinned pods' containers and sandboxes; the files rewritten.
    In slices (hooks/pacing.py): a hook call arriving meanwhile is not kept waiting for the whole round."""
    if cgroups is None:
        return 0
    state.intersection_update(pod.uid for pod in pods)
    repaired = 0
    async for pod in paced(pods):
        if not pod.cgroup_parent or not pod.sandbox_id:
            continue
        where = f"{pod.namespace}/{pod.name}"
        try:
            cpus = _pinned_cpus(pod, settings_for, cgroups)
        except ValueError as exc:
            if pod.uid not in state:
                state.add(pod.uid)
                log.warning("cpuset not reconciled: annotation unusable", pod=where, error=str(exc))
            continue
        if not cpus:
            continue
        ids = [pod.sandbox_id, *(c.id for c in (containers or {}).get(pod.sandbox_id, ()) if c.id)]
        for cgroup_id in ids:
            try:
                repaired += _set_back(cgroups, pod.cgroup_parent, cgroup_id, cpus)
            except (OSError, CgroupError) as exc:
                log.warning("cpuset not reconciled", pod=where, cgroup=cgroup_id, error=str(exc))
    if repaired:
        log.info("cpuset set back", files=repaired)
    return repaired
