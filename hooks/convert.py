"""Protobuf conversion between the hook API and the plugin SDK's plain values (used by the
server and the runner; plugins never see protobuf). The fields come from the descriptor
(runtimeproxy/hookapi/resource_fields.py), not from a list kept here."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.hookapi import resource_fields

from .qos import QoSResolution, resolve_qos
from .views import ContainerInfo, HugepageLimit, PodInfo, Resources

if TYPE_CHECKING:
    from .changes import ResourceChanges

__all__ = ["qos_of", "resources_from_proto", "resources_to_proto"]  # frozen_map: the server's, not the SDK's


_NO_ENTRIES: Mapping[str, str] = MappingProxyType({})  # read-only: one for every empty map


def frozen_map(entries: Any) -> Mapping[str, str]:
    """A protobuf map field (or any mapping) as a read-only copy. A comprehension, not dict(): a
    protobuf map is a Mapping whose keys() and items() are Python-level views (several function
    calls per entry); its own iteration and lookups are C."""
    return MappingProxyType({key: entries[key] for key in entries}) if entries else _NO_ENTRIES


def resources_from_proto(message: Any) -> Resources:
    """A LinuxContainerResources message (hook API or CRI) as Resources."""
    return Resources(
        **dict(zip(resource_fields.SCALARS, resource_fields.SCALAR_VALUES(message), strict=True)),
        hugepage_limits=tuple([HugepageLimit(h.page_size, h.limit) for h in message.hugepage_limits]),
        unified=frozen_map(message.unified),
    )


def resources_to_proto(changes: ResourceChanges) -> Any:
    """ResourceChanges as a hook-API LinuxContainerResources message."""
    return resource_fields.fill(hook_pb.LinuxContainerResources(), changes)


def qos_of(pod: PodInfo, container: ContainerInfo | None = None) -> QoSResolution:
    """The pod's QoS class (the container's resources stand in when the pod's are unknown)."""
    resources = pod.resources if pod.resources is not None else (container.resources if container else None)
    return resolve_qos(pod.labels, pod.annotations, pod.cgroup_parent, resources)
