"""Memory limits from ``kubernetes.io/batch-memory``: the part of Koordinator's batchresource hook
that the ``memory`` plugin does (its settings switch ``batch_memory_limit``, on for BE).

Kubelet knows no batch resources: a BE pod asking for ``kubernetes.io/batch-memory`` is
BestEffort to it and gets no memory limit, so without this a colocated batch pod can take the
node's memory. Koordinator (``pkg/koordlet/runtimehooks/hooks/batchresource/batch_resource.go``,
``SetPodMemoryLimit``, ``SetContainerMemoryLimit``) reads the limits from the pod annotation
``node.koordinator.sh/extended-resource-spec`` (:mod:`..extended_resources`) and sets:

* **container**: ``memory_limit_in_bytes`` in the CRI resources of PreCreateContainer and
  PreUpdateContainerResources (so containerd and runc set ``memory.limit_in_bytes`` /
  ``memory.max``): the container's batch-memory limit; reconciled in its cgroup;
* **pod**: the pod cgroup's ``memory.limit_in_bytes`` (v1) / ``memory.max`` (v2) at
  PreRunPodSandbox: the sum of the containers' limits, unlimited once a listed container has
  none; reconciled.

Where we differ, on purpose: **a limit is only ever tightened.** Koordinator writes -1
(unlimited) for a container without a batch-memory limit and for a pod with such a
container, which would lift a limit kubelet set for a BE pod that kubelet sees as Burstable;
here such a value is left as it is. A planned limit is used only when the cgroup (or the CRI
request) has no limit or a larger one: kubelet's tighter limit wins. So the reconciler lowers a
limit someone raised and never raises one. Also:

* a container limit below 6 MiB is raised to 6 MiB (runc's minimum, which the proxy enforces
  for hook output: ``runtimeproxy.hookapi.value_bounds``), with a note; the pod limit is the plain sum;
* when kubelet's request has a swap limit (memory + swap) equal to its memory limit (no swap),
  the swap limit follows the new memory limit, so the container still cannot swap;
* an annotation listing no containers changes nothing (Koordinator would write a pod limit of 0).

The planning is pure (:func:`pod_limit_plan`, :func:`container_limit_plan`) for ``explain`` and
tests; :func:`apply_limit` reads the cgroup's limit and writes only a tighter one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from runtimeproxy.hookapi.value_bounds import MEMORY_LIMIT_MIN

from ..cgroups import CgroupFS, CgroupVersion
from ..extended_resources import BATCH_MEMORY, EXTENDED_RESOURCE_SPEC_ANNOTATION, read_extended_resource_spec
from ..sdk import ContainerInfo, PodInfo, ResourceChanges

__all__ = [
    "V1_UNLIMITED_FLOOR",
    "LimitPlan",
    "apply_limit",
    "container_limit_plan",
    "parse_limit",
    "pod_limit_plan",
    "set_response_limit",
    "tightens",
]

# cgroup v1 reads PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages) for "no limit";
# no real limit comes near 2^62 bytes.
V1_UNLIMITED_FLOOR: Final = 1 << 62
_FILE: Final = "memory.limit"  # cgroups.FILES: memory.limit_in_bytes (v1) / memory.max (v2)


@dataclass(frozen=True)
class LimitPlan:
    """The limit in bytes a pod or container should have; None leaves it as it is."""

    level: Literal["pod", "container"]
    limit: int | None
    notes: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {"level": self.level, "batch_memory_limit": self.limit, "notes": list(self.notes)}


def _spec_notes(pod: PodInfo) -> tuple[Any, list[str]]:
    spec, problem = read_extended_resource_spec(pod.annotations)
    notes = [problem] if problem else []
    if spec is None and not problem:
        notes.append(f"no {EXTENDED_RESOURCE_SPEC_ANNOTATION} annotation: no batch-memory limit")
    if spec is not None:
        notes.extend(spec.notes)
    return spec, notes


def pod_limit_plan(pod: PodInfo) -> LimitPlan:
    """The pod cgroup's limit: the sum of the listed containers' batch-memory limits."""
    spec, notes = _spec_notes(pod)
    if spec is None:
        return LimitPlan("pod", None, tuple(notes))
    if not spec.containers:
        notes.append("the batch annotation lists no containers: pod memory limit left alone")
        return LimitPlan("pod", None, tuple(notes))
    total = spec.pod_limit(BATCH_MEMORY)
    if total is None:
        notes.append("a container has no batch-memory limit: the pod is unlimited, its limit left alone")
        return LimitPlan("pod", None, tuple(notes))
    notes.append(f"batch-memory limits add up to {total} bytes")
    return LimitPlan("pod", total, tuple(notes))


def container_limit_plan(pod: PodInfo, container: ContainerInfo) -> LimitPlan:
    """The container's limit: its batch-memory limit, at least MEMORY_LIMIT_MIN."""
    spec, notes = _spec_notes(pod)
    entry = spec.container(container.name) if spec is not None else None
    if spec is not None and entry is None:
        notes.append(f"container {container.name} is not in the batch annotation")
    limit = entry.limit(BATCH_MEMORY) if entry is not None else None
    if entry is not None and limit is None:
        notes.append(f"container {container.name} has no batch-memory limit: its limit left alone")
    if limit is not None and limit < MEMORY_LIMIT_MIN:
        notes.append(f"batch-memory limit {limit} is below runc's minimum: raised to {MEMORY_LIMIT_MIN}")
        limit = MEMORY_LIMIT_MIN
    return LimitPlan("container", limit, tuple(notes))


def tightens(planned: int, current: int | None) -> bool:
    """Whether ``planned`` is tighter than ``current`` (None or <= 0: no limit)."""
    return current is None or current <= 0 or planned < current


def parse_limit(text: str, version: CgroupVersion) -> int | None:
    """A memory.limit_in_bytes / memory.max content in bytes; None for no limit. ValueError otherwise."""
    text = text.strip()
    if version is CgroupVersion.V2 and text == "max":
        return None
    value = int(text)
    if value < 0 or (version is CgroupVersion.V1 and value >= V1_UNLIMITED_FLOOR):
        return None
    return value


def set_response_limit(plan: LimitPlan, container: ContainerInfo, changes: ResourceChanges) -> bool:
    """Put the planned limit into a hook response when it is tighter than the request's; True if set."""
    if plan.limit is None:
        return False
    requested = container.resources.memory_limit_in_bytes if container.resources is not None else 0
    if not tightens(plan.limit, requested):
        return False
    changes.memory_limit_in_bytes = plan.limit
    swap = container.resources.memory_swap_limit_in_bytes if container.resources is not None else 0
    if requested > 0 and swap == requested:  # kubelet's "no swap": keep it so
        changes.memory_swap_limit_in_bytes = plan.limit
    return True


def apply_limit(cgroups: CgroupFS, plan: LimitPlan, parent: str, container_id: str | None, log: Any) -> str | None:
    """Write the planned limit into the cgroup when it is tighter than what the cgroup has; the
    value written, else None. Raises FileNotFoundError without the cgroup, CgroupUnsupported
    without the file, OSError when the kernel refuses (v1: EBUSY below the usage it cannot reclaim)."""
    if plan.limit is None:
        return None
    name = cgroups.file_name(_FILE)
    raw = cgroups.read("memory", name, parent, container_id)
    try:
        current = parse_limit(raw, cgroups.version)
    except ValueError:
        log.warning("unreadable memory limit, rewritten", file=name, content=raw[:64])
        current = None
    if not tightens(plan.limit, current):
        return None
    cgroups.write("memory", name, plan.limit, parent, container_id)
    return str(plan.limit)
