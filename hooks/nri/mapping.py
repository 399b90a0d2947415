"""NRI's pods, containers and resources as the plugins see them, and their answers as NRI adjustments.

The plugins get the same PodInfo / ContainerInfo in NRI mode as through the proxy; what NRI
describes differently is converted here:

* **Pod** (``PodSandbox``): name, namespace, uid, labels, annotations, runtime handler, the
  cgroup parent (``linux.cgroup_parent``) and the pod's resources and overhead
  (``linux.pod_resources`` / ``pod_overhead``, the CRI sandbox config's) as given. containerd
  adds its own labels and annotations (``io.cri-containerd.kind``, ``io.kubernetes.cri.*``) to
  kubelet's; the QoS rules read only keys kubelet and the scheduler set. NRI has no attempt
  number: ``attempt`` is 0. ``sandbox_id`` is known at RunPodSandbox already.
* **Container**: name, id, annotations, the environment (the OCI spec's ``NAME=value`` list,
  so the image's variables too, not only kubelet's), and resources from the OCI spec
  (``linux.resources``: CPU period/quota/shares/cpuset, memory limit and swap, hugepages,
  unified) with ``linux.oom_score_adj``.

Answers (:func:`container_adjustment`, :func:`resources_update`) carry only what the runtime's
NRI can apply; everything else a plugin set is listed as not applied (``NotApplied``), never
dropped silently: the caller logs and counts it. Not expressible in NRI up to 0.8 (containerd
2.1): pod labels, annotations, resources and cgroup parent (pod events are notifications), the
OOM score at an update, a swap limit of its own (NRI's spec generator sets swap to the memory
limit), environment values that are not UTF-8 (NRI carries strings), names and annotation keys
starting with ``-`` (NRI reads them as "remove"), and, at UpdateContainer, environment and
annotations. The OOM score at creation is in the adjustment from NRI 0.7 on; with NRI 0.6 it is
written to the container's process instead (hooks/nri/oom.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb

from ..changes import HookResponse, ResourceChanges
from ..views import ContainerInfo, HugepageLimit, PodInfo, Resources
from .oom import adjusted_score

__all__ = [
    "REMOVAL_PREFIX",
    "NotApplied",
    "container_adjustment",
    "container_from_nri",
    "container_update",
    "pod_from_nri",
    "pod_response_not_applied",
    "resources_from_nri",
    "resources_to_nri",
    "resources_update",
]

#: NRI reads an env name or annotation key starting with this as "remove it" (api/helpers.go IsMarkedForRemoval).
REMOVAL_PREFIX: Final = "-"


@dataclass
class NotApplied:
    """Fields a plugin answer set that NRI cannot apply: (field, why) pairs, for a log line and a counter."""

    fields: list[tuple[str, str]] = field(default_factory=list)

    def add(self, name: str, why: str) -> None:
        self.fields.append((name, why))

    def add_keys(self, name: str, keys: Iterable[str], why: str) -> None:
        """Each key of a map field the answer set, as ``name[key]``."""
        self.fields += ((f"{name}[{key}]", why) for key in keys)

    def __bool__(self) -> bool:
        return bool(self.fields)

    def names(self) -> list[str]:
        return [name for name, _ in self.fields]


# --- NRI -> plugin view ---------------------------------------------------------------------------


def resources_from_nri(message: Any, oom_score_adj: int = 0) -> Resources:
    """An NRI LinuxResources (optional wrappers; unset means 0 / "") as Resources."""
    cpu, memory = message.cpu, message.memory
    return Resources(
        cpu_period=cpu.period.value,
        cpu_quota=cpu.quota.value,
        cpu_shares=cpu.shares.value,
        memory_limit_in_bytes=memory.limit.value,
        oom_score_adj=oom_score_adj,
        cpuset_cpus=cpu.cpus,
        cpuset_mems=cpu.mems,
        hugepage_limits=tuple(HugepageLimit(h.page_size, h.limit) for h in message.hugepage_limits),
        unified=MappingProxyType(dict(message.unified)),
        memory_swap_limit_in_bytes=memory.swap.value,
    )


def pod_from_nri(pod: Any) -> PodInfo:
    """An NRI PodSandbox as PodInfo (see the module doc)."""
    linux = pod.linux
    return PodInfo(
        name=pod.name,
        namespace=pod.namespace,
        uid=pod.uid,
        sandbox_id=pod.id,
        labels=MappingProxyType(dict(pod.labels)),
        annotations=MappingProxyType(dict(pod.annotations)),
        cgroup_parent=linux.cgroup_parent,
        runtime_handler=pod.runtime_handler,
        resources=resources_from_nri(linux.pod_resources) if linux.HasField("pod_resources") else None,
        overhead=resources_from_nri(linux.pod_overhead) if linux.HasField("pod_overhead") else None,
    )


def _env(entries: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """OCI ``NAME=value`` entries as pairs; an entry without "=" is a name with an empty value."""
    return tuple((name, value) for name, _, value in (entry.partition("=") for entry in entries))


def container_from_nri(container: Any, resources: Any | None = None) -> ContainerInfo:
    """An NRI Container as ContainerInfo; ``resources`` (an NRI LinuxResources) replaces the
    container's own, as at UpdateContainer where the new ones come beside it."""
    linux = container.linux
    oom = linux.oom_score_adj.value if linux.HasField("oom_score_adj") else 0
    if resources is None and linux.HasField("resources"):
        resources = linux.resources
    return ContainerInfo(
        name=container.name,
        id=container.id,
        annotations=MappingProxyType(dict(container.annotations)),
        resources=resources_from_nri(resources, oom) if resources is not None else None,
        env=_env(container.env),
    )


# --- plugin answers -> NRI ------------------------------------------------------------------------


def resources_to_nri(changes: ResourceChanges, not_applied: NotApplied, *, oom_elsewhere: bool = False) -> Any | None:
    """The set fields of ``changes`` as an NRI LinuxResources (None when none applies).
    ``oom_elsewhere``: the caller applies the OOM score itself (at creation: hooks/nri/oom.py)."""
    message = nri_pb.LinuxResources()
    if changes.cpu_period:
        message.cpu.period.value = changes.cpu_period
    if changes.cpu_quota:
        message.cpu.quota.value = changes.cpu_quota
    if changes.cpu_shares:
        message.cpu.shares.value = changes.cpu_shares
    if changes.cpuset_cpus:
        message.cpu.cpus = changes.cpuset_cpus
    if changes.cpuset_mems:
        message.cpu.mems = changes.cpuset_mems
    if changes.memory_limit_in_bytes:
        message.memory.limit.value = changes.memory_limit_in_bytes
    message.hugepage_limits.extend(
        nri_pb.HugepageLimit(page_size=h.page_size, limit=h.limit) for h in changes.hugepage_limits
    )
    message.unified.update(changes.unified)
    if changes.oom_score_adj and not oom_elsewhere:
        not_applied.add("resources.oom_score_adj", "NRI updates carry no OOM score")
    if changes.memory_swap_limit_in_bytes:
        not_applied.add("resources.memory_swap_limit_in_bytes", "NRI sets swap to the memory limit itself")
    return message if message.ByteSize() else None


def _env_entries(response: HookResponse, not_applied: NotApplied) -> list[Any]:
    entries = []
    for name, value in response.env.items():
        if name.startswith(REMOVAL_PREFIX):
            not_applied.add(f"env[{name}]", "a name starting with '-' means 'remove' to NRI")
        elif any(0xDC80 <= ord(char) <= 0xDCFF for char in value):  # surrogateescape: bytes not UTF-8
            not_applied.add(f"env[{name}]", "the value is not UTF-8; NRI carries strings")
        else:
            entries.append(nri_pb.KeyValue(key=name, value=value))
    return entries


def _annotations(annotations: Mapping[str, str], not_applied: NotApplied) -> dict[str, str]:
    kept = {}
    for key, value in annotations.items():
        if key.startswith(REMOVAL_PREFIX):
            not_applied.add(f"annotations[{key}]", "a key starting with '-' means 'remove' to NRI")
        else:
            kept[key] = value
    return kept


def container_adjustment(
    response: HookResponse, container: Any | None = None, *, oom_in_adjustment: bool = False
) -> tuple[Any, NotApplied]:
    """A merged PreCreateContainer answer for ``container`` (the NRI Container being created) as
    a ContainerAdjustment, and what it could not carry. Its OOM score is in the adjustment when
    ``oom_in_adjustment`` (NRI 0.7+), and only when it raises the container's; else the caller
    writes it to the container's process once started (hooks/nri/oom.py)."""
    not_applied = NotApplied()
    adjust = nri_pb.ContainerAdjustment(
        annotations=_annotations(response.annotations, not_applied), env=_env_entries(response, not_applied)
    )
    resources = resources_to_nri(response.resources, not_applied, oom_elsewhere=True)
    if resources is not None:
        adjust.linux.resources.CopyFrom(resources)
    if oom_in_adjustment and response.resources.oom_score_adj:
        _adjust_oom(adjust, container, response.resources.oom_score_adj, not_applied)
    if response.cgroup_parent:
        not_applied.add("cgroup_parent", "NRI cannot move a pod's cgroup")
    return adjust, not_applied


def _adjust_oom(adjust: Any, container: Any | None, target: int, not_applied: NotApplied) -> None:
    linux = container.linux if container is not None else None
    current = linux.oom_score_adj.value if linux is not None and linux.HasField("oom_score_adj") else None
    try:
        value = adjusted_score(current, target)
    except ValueError as exc:
        not_applied.add("resources.oom_score_adj", str(exc))
        return
    if value is not None:
        adjust.linux.oom_score_adj.value = value


def resources_update(container_id: str, response: HookResponse) -> tuple[list[Any], NotApplied]:
    """A merged PreUpdateContainerResources answer as the container's own ContainerUpdate (none
    when it changes no resource), and what NRI cannot apply at an update."""
    not_applied = NotApplied()
    resources = resources_to_nri(response.resources, not_applied)
    not_applied.add_keys("env", response.env, "NRI updates change resources only")
    not_applied.add_keys("annotations", response.annotations, "NRI updates change resources only")
    if response.cgroup_parent:
        not_applied.add("cgroup_parent", "NRI cannot move a pod's cgroup")
    if resources is None:
        return [], not_applied
    return [container_update(container_id, resources)], not_applied


def container_update(container_id: str, resources: Any) -> Any:
    """A ContainerUpdate of ``container_id`` setting ``resources`` (an NRI LinuxResources)."""
    update = nri_pb.ContainerUpdate(container_id=container_id)
    update.linux.resources.CopyFrom(resources)
    return update


def pod_response_not_applied(response: HookResponse) -> NotApplied:
    """What a pod hook's answer set: NRI pod events are notifications, so none of it applies
    (pod-level cgroup values are the plugins' own node writes, which do happen)."""
    not_applied = NotApplied()
    not_applied.add_keys("labels", response.labels, "NRI pod events take no answer")
    not_applied.add_keys("annotations", response.annotations, "NRI pod events take no answer")
    if response.cgroup_parent:
        not_applied.add("cgroup_parent", "NRI pod events take no answer")
    if not response.resources.is_empty():
        not_applied.add("resources", "NRI pod events take no answer")
    return not_applied
