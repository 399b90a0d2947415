"""Sandbox and container entries: what hooks are told about an object, and how a relayed
RunPodSandbox / CreateContainer request becomes one (copies, never views of the request)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf.message import Message

from runtimeproxy.api.runtime.v1 import api_pb2 as pb

Env = tuple[str, bytes]
M = TypeVar("M", bound=Message)


@dataclass
class SandboxEntry:
    """A pod sandbox as hooks see it. ``resources`` / ``overhead`` are copies of
    ``PodSandboxConfig.linux.resources`` / ``.overhead`` (None when unset)."""

    id: str
    name: str = ""
    namespace: str = ""
    uid: str = ""
    attempt: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    cgroup_parent: str = ""
    runtime_handler: str = ""
    resources: pb.LinuxContainerResources | None = None
    overhead: pb.LinuxContainerResources | None = None
    # The whole config, its linux.resources/overhead kept equal to the two above.
    config: pb.PodSandboxConfig | None = None
    # True when rebuilt without the runtime's config (List/Status data only): no
    # cgroup parent, resources or overhead are known then.
    partial: bool = False


@dataclass
class ContainerEntry:
    """A container as hooks see it. ``resources`` are the current ones (create-time,
    replaced by each UpdateContainerResources); ``envs`` keep the request's order."""

    id: str
    sandbox_id: str = ""
    name: str = ""
    attempt: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    resources: pb.LinuxContainerResources | None = None
    envs: list[Env] = field(default_factory=list)
    image: str = ""
    # The whole config, its linux.resources kept equal to ``resources``.
    config: pb.ContainerConfig | None = None
    # True when rebuilt without the runtime's config: no envs, and resources only as
    # far as ContainerStatus reports them.
    partial: bool = False

    def env_text(self) -> list[tuple[str, str]]:
        """``envs`` with values decoded as UTF-8 (undecodable bytes replaced)."""
        return [(key, value.decode(errors="replace")) for key, value in self.envs]


#: Either kind of entry, for code that handles both alike.
EntryT = TypeVar("EntryT", SandboxEntry, ContainerEntry)


def copy_message(message: M) -> M:
    duplicate = type(message)()
    duplicate.CopyFrom(message)
    return duplicate


def _optional_copy(parent: Message, name: str) -> Any:
    return copy_message(getattr(parent, name)) if parent.HasField(name) else None


def sandbox_entry(
    sandbox_id: str, meta: Any, labels: Mapping[str, str], annotations: Mapping[str, str], **known: Any
) -> SandboxEntry:
    """An entry named by ``meta`` (a PodSandboxMetadata) with copies of ``labels`` and
    ``annotations``; ``known`` sets the other fields."""
    return SandboxEntry(
        id=sandbox_id,
        name=meta.name,
        namespace=meta.namespace,
        uid=meta.uid,
        attempt=meta.attempt,
        labels=dict(labels),
        annotations=dict(annotations),
        **known,
    )


def container_entry(
    container_id: str,
    sandbox_id: str,
    meta: Any,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    **known: Any,
) -> ContainerEntry:
    """`sandbox_entry` for a container (``meta`` a ContainerMetadata)."""
    return ContainerEntry(
        id=container_id,
        sandbox_id=sandbox_id,
        name=meta.name,
        attempt=meta.attempt,
        labels=dict(labels),
        annotations=dict(annotations),
        **known,
    )


def sandbox_from_request(pod_sandbox_id: str, request: pb.RunPodSandboxRequest) -> SandboxEntry:
    """The entry for a sandbox the runtime created from `request` (copies, not views:
    later changes to the request do not reach the entry)."""
    config = copy_message(request.config)
    return sandbox_entry(
        pod_sandbox_id,
        config.metadata,
        config.labels,
        config.annotations,
        cgroup_parent=config.linux.cgroup_parent,
        runtime_handler=request.runtime_handler,
        resources=_optional_copy(config.linux, "resources"),
        overhead=_optional_copy(config.linux, "overhead"),
        config=config,
    )


def container_from_request(container_id: str, request: pb.CreateContainerRequest) -> ContainerEntry:
    """The entry for a container the runtime created from `request` (copies)."""
    config = copy_message(request.config)
    return container_entry(
        container_id,
        request.pod_sandbox_id,
        config.metadata,
        config.labels,
        config.annotations,
        resources=_optional_copy(config.linux, "resources"),
        envs=[(kv.key, kv.value) for kv in config.envs],
        image=config.image.image,
        config=config,
    )
