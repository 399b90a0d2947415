"""Protobuf conversion between the hook API and the plugin SDK's plain values (used by the
server and the runner; plugins never see protobuf). The fields come from the descriptor
(runtimeproxy/dispatch/resource_fields.py), not from a list kept here."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.dispatch import resource_fields

from .qos import QoSResolution, resolve_qos
from .views import ContainerInfo, HugepageLimit, PodInfo, Resources

if TYPE_CHECKING:
    from .changes import ResourceChanges

__all__ = ["qos_of", "resources_from_proto", "resources_to_proto"]


def resources_from_proto(message: Any) -> Resources:
    """A LinuxContainerResources message (hook API or CRI) as Resources."""
    return Resources(
        **{name: getattr(message, name) for name in resource_fields.SCALARS},
        hugepage_limits=tuple(HugepageLimit(h.page_size, h.limit) for h in message.hugepage_limits),
        unified=MappingProxyType(dict(message.unified)),
    )


def resources_to_proto(changes: ResourceChanges) -> Any:
    """ResourceChanges as a hook-API LinuxContainerResources message."""
    return resource_fields.fill(hook_pb.LinuxContainerResources(), changes)


def _qos_resources(resources: Resources | None) -> Any:
    if resources is None:
        return None
    return hook_pb.LinuxContainerResources(
        cpu_shares=resources.cpu_shares,
        cpu_quota=resources.cpu_quota,
        memory_limit_in_bytes=resources.memory_limit_in_bytes,
    )


def qos_of(pod: PodInfo, container: ContainerInfo | None = None) -> QoSResolution:
    """The pod's QoS class (the container's resources stand in when the pod's are unknown)."""
    resources = pod.resources if pod.resources is not None else (container.resources if container else None)
    return resolve_qos(pod.labels, pod.annotations, pod.cgroup_parent, _qos_resources(resources))
