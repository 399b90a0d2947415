"""What the proxy remembers about each pod sandbox and container, and how it relearns it.

Hooks need more than the CRI call in hand: StartContainer names only a container ID, yet
the PreStartContainer hook is sent the pod's metadata, labels, cgroup parent and resources
and the container's resources and environment. `PodStore` keeps those, filled from the
RunPodSandbox / CreateContainer requests the proxy relays (`sandbox_from_request`,
`container_from_request`) and updated on resource updates and removals.

A restarted proxy has an empty store. `RuntimeLoader` rebuilds it from the runtime:
ListPodSandbox and ListContainers, then the verbose PodSandboxStatus / ContainerStatus of
each object, whose ``info["info"]`` JSON (containerd) holds the CRI config the object was
created with, as Go's encoding/json renders the cri-api structs: snake_case field names,
``omitempty``, enums as numbers and env values as JSON strings (our ``KeyValue.value`` is
``bytes``: they are UTF-8 encoded). `StoreRebuilder` runs that load in the background,
retrying while the runtime is down, and loads single unknown objects on demand.

What survives that round trip through containerd 1.6.20 and 1.7.24 (Debian's builds, whose
verbose info has the same shape; checked against both real daemons by
tests/test_dispatch_store.py): every field of `SandboxEntry` and `ContainerEntry` -
metadata, labels, annotations, cgroup parent, runtime handler, the pod's
``linux.resources`` and ``linux.overhead`` (hugepages, unified and swap included), the
container's resources, env order and values (``=``, empty, non-ASCII) and image. Lost
are only fields newer than the cri-api the containerd was built with, which appear in
``config`` alone: with 1.6.20 e.g. ``ContainerConfig.stop_signal`` / ``CDI_devices``,
``ImageSpec.user_specified_image`` / ``image_ref``, ``Mount.mount_options`` and the
security contexts' ``supplemental_groups_policy``; Debian's 1.7.24 (cri-api 0.32.3) keeps
``CDI_devices``, ``user_specified_image`` and ``supplemental_groups_policy``. The runtime
keeps the create-time config, not later UpdateContainerResources: a container's current
resources are the create-time ones with the values ContainerStatus reports (from the OCI
spec, which updates change) laid over them; see `current_resources`.

Objects the runtime cannot describe: containerd (1.6 and 1.7 checked) stores label,
annotation and other string values that are not UTF-8 (it does not check a RunPodSandbox /
CreateContainer from another client), and Python's protobuf refuses a whole message holding
one - a List response because of one bad item (grpc.aio then yields None). The loader decodes its
responses itself (`Undecodable` instead of None): a List that fails as a whole is decoded
item by item, so only the bad objects are skipped; a Status that fails makes its object
unreadable. Each such object is logged once (`UnreadableObjects`, not again on later loads
or rounds) and counted; the rebuild completes. For the hook layer an unreadable object is
not an unknown one: `StoreRebuilder.ensure_sandbox` / `ensure_container` raise
`UnreadableObjectError` for it (never None), so hooks are never run with empty data as if
the object were fine; the interceptor handles it as a failure of the hook layer (under a
Fail server at the call's hook point the call is refused, else it is relayed without hooks).

Concurrency: the store is plain dicts used from the proxy's one asyncio thread; every
method is synchronous and so atomic with respect to other coroutines. No locks are needed
and none must be added; do not touch a store from another thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Awaitable, Callable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Generic, TypeVar, cast

import grpc
import grpc.aio
import structlog
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.cri_client import DEFAULT_MAX_MESSAGE_BYTES, grpc_target

__all__ = [
    "ContainerEntry",
    "Listing",
    "LoadResult",
    "PodStore",
    "RuntimeLoader",
    "SandboxEntry",
    "StoreRebuilder",
    "Undecodable",
    "UnreadableObjectError",
    "UnreadableObjects",
    "container_from_request",
    "current_resources",
    "message_from_go_json",
    "sandbox_from_request",
]

log = structlog.get_logger("runtimeproxy.dispatch.store")

Env = tuple[str, bytes]
M = TypeVar("M", bound=Message)
T = TypeVar("T")


# -- entries ----------------------------------------------------------------------------


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


def _copy(message: M) -> M:
    duplicate = type(message)()
    duplicate.CopyFrom(message)
    return duplicate


def _optional_copy(parent: Message, name: str) -> Any:
    return _copy(getattr(parent, name)) if parent.HasField(name) else None


def sandbox_from_request(pod_sandbox_id: str, request: pb.RunPodSandboxRequest) -> SandboxEntry:
    """The entry for a sandbox the runtime created from `request` (copies, not views:
    later changes to the request do not reach the entry)."""
    config = _copy(request.config)
    meta = config.metadata
    return SandboxEntry(
        id=pod_sandbox_id,
        name=meta.name,
        namespace=meta.namespace,
        uid=meta.uid,
        attempt=meta.attempt,
        labels=dict(config.labels),
        annotations=dict(config.annotations),
        cgroup_parent=config.linux.cgroup_parent,
        runtime_handler=request.runtime_handler,
        resources=_optional_copy(config.linux, "resources"),
        overhead=_optional_copy(config.linux, "overhead"),
        config=config,
    )


def container_from_request(container_id: str, request: pb.CreateContainerRequest) -> ContainerEntry:
    """The entry for a container the runtime created from `request` (copies)."""
    config = _copy(request.config)
    return ContainerEntry(
        id=container_id,
        sandbox_id=request.pod_sandbox_id,
        name=config.metadata.name,
        attempt=config.metadata.attempt,
        labels=dict(config.labels),
        annotations=dict(config.annotations),
        resources=_optional_copy(config.linux, "resources"),
        envs=[(kv.key, kv.value) for kv in config.envs],
        image=config.image.image,
        config=config,
    )


# -- the store --------------------------------------------------------------------------


class PodStore:
    """Sandboxes and containers by ID. Single-threaded by design (see the module doc)."""

    sandbox_from_request = staticmethod(sandbox_from_request)
    container_from_request = staticmethod(container_from_request)

    def __init__(self) -> None:
        self._sandboxes: dict[str, SandboxEntry] = {}
        self._containers: dict[str, ContainerEntry] = {}
        self._by_sandbox: dict[str, set[str]] = {}
        # Open `watch_removals` sets: a load in flight must not bring back what was
        # removed while it waited for the runtime.
        self._watchers: list[set[str]] = []

    # reading

    def sandbox(self, sandbox_id: str) -> SandboxEntry | None:
        return self._sandboxes.get(sandbox_id)

    def container(self, container_id: str) -> ContainerEntry | None:
        return self._containers.get(container_id)

    def sandboxes(self) -> list[SandboxEntry]:
        return list(self._sandboxes.values())

    def containers(self) -> list[ContainerEntry]:
        return list(self._containers.values())

    def containers_of(self, sandbox_id: str) -> list[ContainerEntry]:
        return [self._containers[cid] for cid in sorted(self._by_sandbox.get(sandbox_id, ()))]

    def __len__(self) -> int:
        return len(self._sandboxes) + len(self._containers)

    # writing

    def put_sandbox(self, entry: SandboxEntry) -> None:
        """Add or replace a sandbox (its containers stay)."""
        self._sandboxes[entry.id] = entry

    def put_container(self, entry: ContainerEntry) -> None:
        """Add or replace a container (its sandbox need not be known)."""
        old = self._containers.get(entry.id)
        if old is not None:
            self._unindex(old)
        self._containers[entry.id] = entry
        self._by_sandbox.setdefault(entry.sandbox_id, set()).add(entry.id)

    def remove_sandbox(self, sandbox_id: str) -> SandboxEntry | None:
        """Forget a sandbox and every container in it; returns the sandbox's entry."""
        for container_id in list(self._by_sandbox.get(sandbox_id, ())):
            self.remove_container(container_id)
        self._removed(sandbox_id)
        return self._sandboxes.pop(sandbox_id, None)

    def remove_container(self, container_id: str) -> ContainerEntry | None:
        self._removed(container_id)
        entry = self._containers.pop(container_id, None)
        if entry is not None:
            self._unindex(entry)
        return entry

    def update_container_resources(
        self, container_id: str, resources: pb.LinuxContainerResources
    ) -> ContainerEntry | None:
        """Replace a container's resources (kubelet sends complete ones); None if unknown."""
        entry = self._containers.get(container_id)
        if entry is not None:
            entry.resources = _copy(resources)
            if entry.config is not None:
                entry.config.linux.resources.CopyFrom(resources)
        return entry

    def update_sandbox_resources(
        self,
        sandbox_id: str,
        resources: pb.LinuxContainerResources | None,
        overhead: pb.LinuxContainerResources | None = None,
    ) -> SandboxEntry | None:
        """Replace a sandbox's resources, and its overhead when given; None if unknown."""
        entry = self._sandboxes.get(sandbox_id)
        if entry is None:
            return None
        if resources is not None:
            entry.resources = _copy(resources)
            if entry.config is not None:
                entry.config.linux.resources.CopyFrom(resources)
        if overhead is not None:
            entry.overhead = _copy(overhead)
            if entry.config is not None:
                entry.config.linux.overhead.CopyFrom(overhead)
        return entry

    def clear(self) -> None:
        self._sandboxes.clear()
        self._containers.clear()
        self._by_sandbox.clear()

    # loading from the runtime

    @contextlib.contextmanager
    def watch_removals(self) -> Iterator[set[str]]:
        """Collect the IDs removed while the block runs (for loads in flight)."""
        removed: set[str] = set()
        self._watchers.append(removed)
        try:
            yield removed
        finally:
            self._watchers.remove(removed)

    def adopt_sandbox(self, entry: SandboxEntry, removed: AbstractSet[str] = frozenset()) -> SandboxEntry | None:
        """Add a loaded sandbox unless the store already knows it (a relayed request
        knows more than the runtime keeps) or it was removed meanwhile (None then)."""
        if entry.id in removed:
            return None
        return self._sandboxes.setdefault(entry.id, entry)

    def adopt_container(self, entry: ContainerEntry, removed: AbstractSet[str] = frozenset()) -> ContainerEntry | None:
        """`adopt_sandbox` for containers; also refused when its sandbox was removed."""
        if entry.id in removed or entry.sandbox_id in removed:
            return None
        known = self._containers.get(entry.id)
        if known is not None:
            return known
        self.put_container(entry)
        return entry

    def _removed(self, object_id: str) -> None:
        for watcher in self._watchers:
            watcher.add(object_id)

    def _unindex(self, entry: ContainerEntry) -> None:
        ids = self._by_sandbox.get(entry.sandbox_id)
        if ids is not None:
            ids.discard(entry.id)
            if not ids:
                del self._by_sandbox[entry.sandbox_id]


# -- Go JSON (cri-api structs) to protobuf ------------------------------------------------

_INT_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED32,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _scalar(fd: FieldDescriptor, value: Any) -> Any:
    kind = fd.type
    if isinstance(value, bool) and kind != FieldDescriptor.TYPE_BOOL:
        raise TypeError(f"boolean for a {fd.name} field")
    if kind in _INT_TYPES:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int | str):  # protojson writes 64-bit integers as strings
            return int(value)
    elif kind == FieldDescriptor.TYPE_ENUM:
        if isinstance(value, int):  # Go's encoding/json writes the number
            return value
        enum_type = fd.enum_type
        if isinstance(value, str) and enum_type is not None:
            named = enum_type.values_by_name.get(value)
            if named is None:
                raise ValueError(f"unknown {enum_type.name} {value!r}")
            return named.number
    elif kind == FieldDescriptor.TYPE_BOOL:
        if isinstance(value, bool):
            return value
    elif kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        if isinstance(value, int | float):
            return float(value)
    elif kind == FieldDescriptor.TYPE_STRING:
        if isinstance(value, str):
            return value
    elif kind == FieldDescriptor.TYPE_BYTES and isinstance(value, str):
        # Upstream CRI has strings where our proto has bytes (KeyValue.value).
        return value.encode()
    raise TypeError(f"{type(value).__name__} {value!r} for a {fd.name} field")


def _fill(message: Message, data: Any, path: str, problems: list[str]) -> None:
    if not isinstance(data, dict):
        problems.append(f"{path or '.'}: expected an object, got {type(data).__name__}")
        return
    message.SetInParent()
    descriptor = message.DESCRIPTOR
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        fd = cast(
            FieldDescriptor | None, descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        )
        if fd is None:
            problems.append(f"{where}: no such field in {descriptor.full_name}")
            continue
        if value is None:
            continue
        try:
            _fill_field(message, fd, value, where, problems)
        except (TypeError, ValueError) as exc:
            problems.append(f"{where}: {exc}")


def _fill_field(message: Message, fd: FieldDescriptor, value: Any, where: str, problems: list[str]) -> None:
    target = getattr(message, fd.name)
    entry_type = fd.message_type
    if entry_type is not None and entry_type.GetOptions().map_entry:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {type(value).__name__}")
        key_fd, value_fd = entry_type.fields_by_name["key"], entry_type.fields_by_name["value"]
        for k, v in value.items():
            try:
                map_key = _scalar(key_fd, k)
                if value_fd.message_type is not None:
                    _fill(target[map_key], v, f"{where}[{k}]", problems)
                else:
                    target[map_key] = _scalar(value_fd, v)
            except (TypeError, ValueError) as exc:
                problems.append(f"{where}[{k}]: {exc}")
    elif fd.is_repeated:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        for index, item in enumerate(value):
            if entry_type is not None:
                _fill(target.add(), item, f"{where}[{index}]", problems)
            else:
                try:
                    target.append(_scalar(fd, item))
                except (TypeError, ValueError) as exc:
                    problems.append(f"{where}[{index}]: {exc}")
    elif entry_type is not None:
        _fill(target, value, where, problems)
    else:
        setattr(message, fd.name, _scalar(fd, value))


def message_from_go_json(data: Any, message: M) -> list[str]:
    """Fill `message` from a JSON-decoded Go struct of the same CRI type; return what
    was skipped (unknown fields, wrong types), one "path: reason" each. Accepts Go
    JSON (snake_case names, numeric enums, strings for our bytes fields) and protojson
    (lowerCamel names, enum names, 64-bit integers as strings)."""
    problems: list[str] = []
    _fill(message, data, "", problems)
    return problems


# -- building entries from the runtime's answers -----------------------------------------

# Values the OCI spec holds and UpdateContainerResources changes; ContainerStatus reports
# them from the spec, so they are current where the info config is create-time.
_UPDATABLE_SCALARS = ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "cpuset_cpus", "cpuset_mems")


def current_resources(
    configured: pb.LinuxContainerResources | None,
    reported: pb.LinuxContainerResources | None,
    *,
    config_known: bool = True,
) -> pb.LinuxContainerResources | None:
    """A container's current resources from its create-time config and ContainerStatus.

    Values the status reports as set replace the configured ones (containerd applies an
    update's non-zero values only, so a zero there means "unchanged"). ``oom_score_adj``
    stays as configured: containerd may raise it (restrict_oom_score_adj) and updates do
    not change it. The status's swap limit equal to the memory limit is containerd's
    default when none was asked for; it is taken only when one was configured or it
    differs. Without a config (`config_known` False) the status alone is used.
    """
    if reported is None or not reported.ListFields():
        return _copy(configured) if configured is not None else None
    swap = reported.memory_swap_limit_in_bytes
    asked_swap = configured is not None and configured.memory_swap_limit_in_bytes != 0
    derived_swap = swap == reported.memory_limit_in_bytes and not asked_swap
    if not config_known:
        merged = _copy(reported)
        if derived_swap:
            merged.memory_swap_limit_in_bytes = 0
        return merged
    merged = pb.LinuxContainerResources()
    if configured is not None:
        merged.CopyFrom(configured)
    changed = False
    for name in _UPDATABLE_SCALARS:
        value = getattr(reported, name)
        if value and value != getattr(merged, name):
            setattr(merged, name, value)
            changed = True
    if reported.hugepage_limits and list(reported.hugepage_limits) != list(merged.hugepage_limits):
        del merged.hugepage_limits[:]
        merged.hugepage_limits.extend(reported.hugepage_limits)
        changed = True
    if reported.unified and dict(reported.unified) != dict(merged.unified):
        merged.unified.clear()
        merged.unified.update(reported.unified)
        changed = True
    if swap and not derived_swap and swap != merged.memory_swap_limit_in_bytes:
        merged.memory_swap_limit_in_bytes = swap
        changed = True
    if configured is None and not changed:
        return None
    return merged


def _info_json(info: Any, kind: str, object_id: str) -> dict[str, Any] | None:
    """The verbose-status info document (containerd: key "info") or None, with a warning."""
    raw = info.get("info")
    if raw is None:  # another runtime may use another key: take any JSON with a config
        for value in info.values():
            with contextlib.suppress(ValueError):
                doc = json.loads(value)
                if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
                    return doc
        log.warning(
            "runtime gave no config for the store; using list/status data only",
            kind=kind,
            id=object_id,
            info_keys=sorted(info),
        )
        return None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        log.warning("unparseable status info; using list/status data only", kind=kind, id=object_id, error=str(exc))
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        log.warning("status info holds no config; using list/status data only", kind=kind, id=object_id)
        return None
    return doc


def _parse_config(doc: dict[str, Any] | None, message: M, kind: str, object_id: str) -> M | None:
    if doc is None:
        return None
    problems = message_from_go_json(doc["config"], message)
    if problems:
        log.warning("parts of the runtime's config skipped", kind=kind, id=object_id, skipped=problems[:20])
    return message


def sandbox_from_status(status: pb.PodSandboxStatus, info: Any, listed: pb.PodSandbox | None = None) -> SandboxEntry:
    """A sandbox entry from a verbose PodSandboxStatus (and its List item, if any)."""
    doc = _info_json(info, "sandbox", status.id)
    config = _parse_config(doc, pb.PodSandboxConfig(), "sandbox", status.id)
    handler = status.runtime_handler or (listed.runtime_handler if listed is not None else "")
    if not handler and doc is not None and isinstance(doc.get("runtimeHandler"), str):
        handler = doc["runtimeHandler"]
    if config is None:
        meta = status.metadata if status.HasField("metadata") or listed is None else listed.metadata
        return SandboxEntry(
            id=status.id,
            name=meta.name,
            namespace=meta.namespace,
            uid=meta.uid,
            attempt=meta.attempt,
            labels=dict(status.labels or (listed.labels if listed is not None else {})),
            annotations=dict(status.annotations or (listed.annotations if listed is not None else {})),
            runtime_handler=handler,
            partial=True,
        )
    entry = sandbox_from_request(status.id, pb.RunPodSandboxRequest(config=config, runtime_handler=handler))
    if not config.HasField("metadata"):  # keep what Status knows
        entry.name, entry.namespace = status.metadata.name, status.metadata.namespace
        entry.uid, entry.attempt = status.metadata.uid, status.metadata.attempt
    return entry


def sandbox_from_list_item(item: pb.PodSandbox) -> SandboxEntry:
    meta = item.metadata
    return SandboxEntry(
        id=item.id,
        name=meta.name,
        namespace=meta.namespace,
        uid=meta.uid,
        attempt=meta.attempt,
        labels=dict(item.labels),
        annotations=dict(item.annotations),
        runtime_handler=item.runtime_handler,
        partial=True,
    )


def container_from_status(status: pb.ContainerStatus, info: Any, listed: pb.Container | None = None) -> ContainerEntry:
    """A container entry from a verbose ContainerStatus (and its List item, if any)."""
    doc = _info_json(info, "container", status.id)
    config = _parse_config(doc, pb.ContainerConfig(), "container", status.id)
    sandbox_id = listed.pod_sandbox_id if listed is not None else ""
    if not sandbox_id and doc is not None and isinstance(doc.get("sandboxID"), str):
        sandbox_id = doc["sandboxID"]
    reported = status.resources.linux if status.resources.HasField("linux") else None
    if config is None:
        return ContainerEntry(
            id=status.id,
            sandbox_id=sandbox_id,
            name=status.metadata.name,
            attempt=status.metadata.attempt,
            labels=dict(status.labels),
            annotations=dict(status.annotations),
            resources=current_resources(None, reported, config_known=False),
            image=status.image.image,
            partial=True,
        )
    configured = config.linux.resources if config.linux.HasField("resources") else None
    resources = current_resources(configured, reported)
    if resources is not None:
        config.linux.resources.CopyFrom(resources)
    entry = container_from_request(status.id, pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config))
    if not config.HasField("metadata"):
        entry.name, entry.attempt = status.metadata.name, status.metadata.attempt
    return entry


def container_from_list_item(item: pb.Container) -> ContainerEntry:
    return ContainerEntry(
        id=item.id,
        sandbox_id=item.pod_sandbox_id,
        name=item.metadata.name,
        attempt=item.metadata.attempt,
        labels=dict(item.labels),
        annotations=dict(item.annotations),
        image=item.image.image,
        partial=True,
    )


# -- loading from the runtime --------------------------------------------------------------


@dataclass
class LoadResult:
    """Counts of one `RuntimeLoader.load_all`, for logging."""

    sandboxes: int = 0  # added to the store
    containers: int = 0  # added to the store
    partial: int = 0  # of those, built without the runtime's config
    already_known: int = 0  # the store had them (from relayed requests): kept as they were
    vanished: int = 0  # listed, then gone (NOT_FOUND) or removed through the proxy meanwhile
    unreadable: int = 0  # listed, but their data cannot be decoded: skipped

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


# -- objects the runtime has but protobuf cannot decode ---------------------------------------


class UnreadableObjectError(Exception):
    """The runtime has this sandbox or container, but its data cannot be decoded (e.g. a
    label that is not UTF-8): hooks cannot be given its data. Not the same as unknown."""

    def __init__(self, kind: str, object_id: str, reason: str) -> None:
        super().__init__(f"the runtime's {kind} {object_id} cannot be decoded: {reason}")
        self.kind = kind
        self.object_id = object_id
        self.reason = reason


@dataclass(frozen=True)
class Undecodable:
    """A response protobuf refused as a whole: its bytes, to decode part by part."""

    data: bytes
    error: str


def _lenient(message_type: type[M]) -> Callable[[bytes], M | Undecodable]:
    def decode(data: bytes) -> M | Undecodable:
        try:
            return message_type.FromString(data)
        except Exception as exc:  # DecodeError, e.g. "String field had bad UTF-8"
            return Undecodable(data, describe_error(exc))

    return decode


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


# The RuntimeService calls the loader makes, with their response types.
_LOADER_CALLS: dict[str, type[Message]] = {
    "ListPodSandbox": pb.ListPodSandboxResponse,
    "ListContainers": pb.ListContainersResponse,
    "PodSandboxStatus": pb.PodSandboxStatusResponse,
    "ContainerStatus": pb.ContainerStatusResponse,
}


def _lenient_stub(channel: grpc.aio.Channel) -> Any:
    """The loader's calls, answering `Undecodable` where grpc.aio's generated stub would give
    None (it logs the deserializer's exception and returns None)."""
    return SimpleNamespace(
        **{
            name: channel.unary_unary(
                f"/runtime.v1.RuntimeService/{name}",
                request_serializer=_serialize,
                response_deserializer=_lenient(response_type),
            )
            for name, response_type in _LOADER_CALLS.items()
        }
    )


def _first_field_type() -> type[Message]:
    """A message whose field 1 is ``repeated bytes``. Any message parses as it: field 1's
    entries come out raw and unchecked (the items of a List response, an object's id), the
    other fields stay unknown, undecoded."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="runtimeproxy/dispatch/first_field.proto", package="runtimeproxy.store", syntax="proto3"
    )
    message = proto.message_type.add(name="FirstField")
    message.field.add(
        name="values",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("runtimeproxy.store.FirstField"))


_FirstField = _first_field_type()


def _first_field(data: bytes) -> list[bytes]:
    """Field 1's raw entries: the items of ListPodSandboxResponse / ListContainersResponse, the
    id of a PodSandbox / Container. DecodeError only if ``data`` is not protobuf at all."""
    values: Any = _FirstField.FromString(data)
    return list(values.values)


def _raw_id(item: bytes) -> str:
    try:
        ids = _first_field(item)
    except Exception:  # not even protobuf framing
        ids = []
    return ids[-1].decode(errors="replace") if ids else "(no id)"


@dataclass(frozen=True)
class Listing(Generic[T]):
    """What a List call gave: the items that decode, and the ids of those that do not."""

    items: list[T]
    unreadable: tuple[str, ...] = ()


class UnreadableObjects:
    """The objects found undecodable so far. Each is logged, and passed to the listeners (a
    metric), once, when first found; `discard` / `retain` forget the ones the runtime no
    longer has, which keeps this as small as the runtime's bad objects."""

    def __init__(self) -> None:
        self._kinds: dict[str, str] = {}  # id -> kind
        self.listeners: list[Callable[[str], None]] = []  # called with the kind

    def __contains__(self, object_id: object) -> bool:
        return object_id in self._kinds

    def __len__(self) -> int:
        return len(self._kinds)

    def report(self, kind: str, object_id: str, reason: str) -> None:
        if object_id in self._kinds:
            return
        self._kinds[object_id] = kind
        log.warning("cannot decode this object from the runtime; skipped", kind=kind, id=object_id, reason=reason)
        for listener in self.listeners:
            listener(kind)

    def discard(self, object_id: str) -> None:
        self._kinds.pop(object_id, None)

    def retain(self, kind: str, listed: AbstractSet[str]) -> None:
        """Forget the objects of ``kind`` that are not in ``listed`` (a complete listing)."""
        for object_id in [i for i, k in self._kinds.items() if k == kind and i not in listed]:
            del self._kinds[object_id]


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# Errors that mean "the runtime is not answering": a load fails (and is retried) rather
# than settling for List data.
_DOWN = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


class RuntimeLoader:
    """Reads sandboxes and containers back from the runtime (grpc.aio, RuntimeService).

    `target` is a gRPC target or socket path (a channel is opened on first use and
    closed by `close()`), or an open ``grpc.aio.Channel`` the caller keeps owning.
    Objects that cannot be decoded are skipped and recorded in `unreadable`; ``on_unreadable``
    (e.g. a metric) is called with the kind of each, once.
    """

    def __init__(
        self,
        target: str | grpc.aio.Channel,
        *,
        timeout: float = 10.0,
        concurrency: int = 8,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        on_unreadable: Callable[[str], None] | None = None,
    ) -> None:
        self.timeout = timeout
        self.concurrency = concurrency
        self.unreadable = UnreadableObjects()
        if on_unreadable is not None:
            self.unreadable.listeners.append(on_unreadable)
        self._max_message_bytes = max_message_bytes
        self._target: str | None = None
        self._channel: grpc.aio.Channel | None = None
        self._owned = isinstance(target, str)
        if isinstance(target, str):
            self._target = grpc_target(target)
        else:
            self._channel = target
        self._stub: Any = None

    @property
    def stub(self) -> Any:
        """The calls the loader makes (ListPodSandbox, ListContainers, PodSandboxStatus,
        ContainerStatus); a response that does not decode comes as `Undecodable`."""
        if self._stub is None:
            if self._channel is None:
                assert self._target is not None
                options: list[tuple[str, Any]] = [
                    ("grpc.max_send_message_length", self._max_message_bytes),
                    ("grpc.max_receive_message_length", self._max_message_bytes),
                    # Calls fail at once while the channel backs off; keep its backoff
                    # short so a restarted runtime is seen within two seconds.
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 2000),
                ]
                self._channel = grpc.aio.insecure_channel(self._target, options=options)
            self._stub = _lenient_stub(self._channel)
        return self._stub

    async def close(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None and self._owned:
            await channel.close(None)

    # listing

    async def list_sandboxes(
        self, request: pb.ListPodSandboxRequest | None = None, *, timeout: float | None = None
    ) -> Listing[pb.PodSandbox]:
        """ListPodSandbox; an item that cannot be decoded is skipped (and reported)."""
        response = await self.stub.ListPodSandbox(
            request or pb.ListPodSandboxRequest(), timeout=timeout or self.timeout
        )
        return self._listing(response, "items", pb.PodSandbox, "sandbox")

    async def list_containers(
        self, request: pb.ListContainersRequest | None = None, *, timeout: float | None = None
    ) -> Listing[pb.Container]:
        """ListContainers; an item that cannot be decoded is skipped (and reported)."""
        response = await self.stub.ListContainers(
            request or pb.ListContainersRequest(), timeout=timeout or self.timeout
        )
        return self._listing(response, "containers", pb.Container, "container")

    def _listing(self, response: Any, field_name: str, item_type: type[M], kind: str) -> Listing[M]:
        if not isinstance(response, Undecodable):
            return Listing(list(getattr(response, field_name)))
        items: list[M] = []
        unreadable: list[str] = []
        for raw in _first_field(response.data):  # both List responses hold their items in field 1
            try:
                items.append(item_type.FromString(raw))
            except Exception as exc:  # this object only
                object_id = _raw_id(raw)
                self.unreadable.report(kind, object_id, describe_error(exc))
                unreadable.append(object_id)
        return Listing(items, tuple(unreadable))

    def _decoded(self, response: Any, kind: str, object_id: str) -> Any:
        """``response`` itself, or UnreadableObjectError (reported) if it did not decode."""
        if isinstance(response, Undecodable):
            self.unreadable.report(kind, object_id, response.error)
            raise UnreadableObjectError(kind, object_id, response.error)
        return response

    # whole store

    async def load_all(self, store: PodStore) -> LoadResult:
        """Add every sandbox and container the runtime has to `store` (those it knows
        already are kept as they are; those it cannot decode are skipped). Raises
        grpc.aio.AioRpcError when the runtime cannot be listed or stops answering."""
        result = LoadResult()
        with store.watch_removals() as removed:
            sandboxes = await self.list_sandboxes()
            containers = await self.list_containers()
            result.unreadable = len(sandboxes.unreadable) + len(containers.unreadable)
            gate = asyncio.Semaphore(self.concurrency)
            sandbox_entries = await asyncio.gather(
                *(self._bounded(gate, self._sandbox_entry(s)) for s in sandboxes.items)
            )
            container_entries = await asyncio.gather(
                *(self._bounded(gate, self._container_entry(c)) for c in containers.items)
            )
            for s_entry in sandbox_entries:
                kept_sandbox = store.adopt_sandbox(s_entry, removed) if isinstance(s_entry, SandboxEntry) else None
                self._count(result, s_entry, kept_sandbox, "sandboxes")
            for c_entry in container_entries:
                kept_container = (
                    store.adopt_container(c_entry, removed) if isinstance(c_entry, ContainerEntry) else None
                )
                self._count(result, c_entry, kept_container, "containers")
        return result

    @staticmethod
    def _count(result: LoadResult, loaded: Any, kept: Any, kind: str) -> None:
        if isinstance(loaded, UnreadableObjectError):
            result.unreadable += 1
        elif loaded is None or kept is None:
            result.vanished += 1
        elif kept is not loaded:
            result.already_known += 1
        else:
            setattr(result, kind, getattr(result, kind) + 1)
            result.partial += loaded.partial

    @staticmethod
    async def _bounded(gate: asyncio.Semaphore, work: Awaitable[T]) -> T:
        async with gate:
            return await work

    async def _sandbox_entry(self, item: pb.PodSandbox) -> SandboxEntry | UnreadableObjectError | None:
        request = pb.PodSandboxStatusRequest(pod_sandbox_id=item.id, verbose=True)
        try:
            response = self._decoded(
                await self.stub.PodSandboxStatus(request, timeout=self.timeout), "sandbox", item.id
            )
        except grpc.aio.AioRpcError as exc:
            return self._status_failed(exc, "sandbox", item.id, lambda: sandbox_from_list_item(item))
        except UnreadableObjectError as exc:
            return exc
        return sandbox_from_status(response.status, response.info, item)

    async def _container_entry(self, item: pb.Container) -> ContainerEntry | UnreadableObjectError | None:
        request = pb.ContainerStatusRequest(container_id=item.id, verbose=True)
        try:
            response = self._decoded(
                await self.stub.ContainerStatus(request, timeout=self.timeout), "container", item.id
            )
        except grpc.aio.AioRpcError as exc:
            return self._status_failed(exc, "container", item.id, lambda: container_from_list_item(item))
        except UnreadableObjectError as exc:
            return exc
        return container_from_status(response.status, response.info, item)

    @staticmethod
    def _status_failed(exc: grpc.aio.AioRpcError, kind: str, object_id: str, fallback: Callable[[], T]) -> T | None:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return None  # removed since it was listed
        if exc.code() in _DOWN:
            raise exc
        log.warning("status call failed; using list data only", kind=kind, id=object_id, error=describe_error(exc))
        return fallback()

    # single objects

    async def load_sandbox(
        self, sandbox_id: str, store: PodStore | None = None, *, timeout: float | None = None
    ) -> SandboxEntry | None:
        """The sandbox's entry from its verbose status, added to `store` if given (an
        entry the store has meanwhile wins). None if the runtime has no such sandbox;
        UnreadableObjectError if it cannot be decoded; other errors raise
        grpc.aio.AioRpcError."""
        if store is None:
            return await self._fetch_sandbox(sandbox_id, timeout or self.timeout)
        with store.watch_removals() as removed:
            entry = await self._fetch_sandbox(sandbox_id, timeout or self.timeout)
            return store.adopt_sandbox(entry, removed) if entry is not None else None

    async def load_container(
        self, container_id: str, store: PodStore | None = None, *, timeout: float | None = None
    ) -> ContainerEntry | None:
        """`load_sandbox` for a container."""
        if store is None:
            return await self._fetch_container(container_id, timeout or self.timeout)
        with store.watch_removals() as removed:
            entry = await self._fetch_container(container_id, timeout or self.timeout)
            return store.adopt_container(entry, removed) if entry is not None else None

    async def _fetch_sandbox(self, sandbox_id: str, timeout: float) -> SandboxEntry | None:
        request = pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True)
        try:
            response = await self.stub.PodSandboxStatus(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            self._gone_or_raise(exc, sandbox_id)
            return None
        response = self._decoded(response, "sandbox", sandbox_id)
        return sandbox_from_status(response.status, response.info)

    async def _fetch_container(self, container_id: str, timeout: float) -> ContainerEntry | None:
        request = pb.ContainerStatusRequest(container_id=container_id, verbose=True)
        try:
            response = self._decoded(
                await self.stub.ContainerStatus(request, timeout=timeout), "container", container_id
            )
            entry = container_from_status(response.status, response.info)
            if not entry.sandbox_id:  # no info: ListContainers names the sandbox
                listing = pb.ListContainersRequest(filter=pb.ContainerFilter(id=container_id))
                found = await self.list_containers(listing, timeout=timeout)
                entry.sandbox_id = next((c.pod_sandbox_id for c in found.items), "")
        except grpc.aio.AioRpcError as exc:
            self._gone_or_raise(exc, container_id)
            return None
        return entry

    def _gone_or_raise(self, exc: grpc.aio.AioRpcError, object_id: str) -> None:
        """Raise ``exc`` unless it is NOT_FOUND: then the object is gone (and no longer
        remembered as unreadable)."""
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise exc
        self.unreadable.discard(object_id)


# -- rebuilding in the background --------------------------------------------------------------


class StoreRebuilder:
    """Loads the store from the runtime at start without holding up the proxy.

    `start()` runs `RuntimeLoader.load_all` in a background task, retried after each
    failure with exponential backoff (`initial_backoff` doubling to `max_backoff`, each
    delay jittered by +-`jitter` but never above `max_backoff`), every failure logged
    with its cause; `ready` is set
    once a load succeeded (objects that cannot be decoded are skipped, they do not fail
    it). `ensure_sandbox` / `ensure_container` give an entry from the store or, if it is
    unknown, load it from the runtime within `ensure_timeout`; None when that fails (the
    proxy relays the call anyway, without the hooks' full picture); UnreadableObjectError
    when the runtime has the object but it cannot be decoded.
    """

    def __init__(
        self,
        store: PodStore,
        loader: RuntimeLoader,
        *,
        initial_backoff: float = 0.5,
        max_backoff: float = 30.0,
        jitter: float = 0.2,
        ensure_timeout: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.loader = loader
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.jitter = jitter
        self.ensure_timeout = ensure_timeout
        self._rng = rng or random.Random()
        self.ready = asyncio.Event()
        self.attempts = 0
        self.failures = 0
        self.last_error: BaseException | None = None
        self.result: LoadResult | None = None
        self._task: asyncio.Task[None] | None = None
        self._inflight: dict[tuple[str, str], asyncio.Task[Any]] = {}

    def backoff(self, failures: int) -> float:
        """The delay after the `failures`-th consecutive failure (1-based)."""
        nominal = min(self.max_backoff, self.initial_backoff * 2.0 ** max(0, failures - 1))
        # Uniform in nominal +-jitter, never above the cap (at the cap: cap*(1-jitter)..cap).
        return self._rng.uniform(nominal * (1 - self.jitter), min(self.max_backoff, nominal * (1 + self.jitter)))

    def start(self) -> None:
        """Begin the background load (again after `stop()`); needs a running loop."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="store-rebuild")

    async def stop(self) -> None:
        """Cancel the background load and on-demand loads; wait until they ended."""
        tasks = [t for t in (self._task, *self._inflight.values()) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None
        self._inflight.clear()

    async def _run(self) -> None:
        while True:
            self.attempts += 1
            try:
                result = await self.loader.load_all(self.store)
            except Exception as exc:
                self.failures += 1
                self.last_error = exc
                delay = self.backoff(self.failures)
                log.warning(
                    "store rebuild from the runtime failed; retrying",
                    attempt=self.attempts,
                    retry_in_s=round(delay, 3),
                    error=describe_error(exc),
                )
                await asyncio.sleep(delay)
                continue
            self.result = result
            self.ready.set()
            log.info("store rebuilt from the runtime", attempts=self.attempts, **result.as_dict())
            return

    async def ensure_sandbox(self, sandbox_id: str) -> SandboxEntry | None:
        """The sandbox's entry, loading it on demand; raises UnreadableObjectError if the
        runtime has it but it cannot be decoded."""
        entry = self.store.sandbox(sandbox_id)
        if entry is not None or not sandbox_id:
            return entry
        found: SandboxEntry | None = await self._on_demand("sandbox", sandbox_id, self._load_sandbox)
        return found

    async def ensure_container(self, container_id: str) -> ContainerEntry | None:
        """The container's entry, loading it (and its sandbox, if unknown) on demand; raises
        UnreadableObjectError if the runtime has it but it cannot be decoded."""
        entry = self.store.container(container_id)
        if entry is not None or not container_id:
            return entry
        found: ContainerEntry | None = await self._on_demand("container", container_id, self._load_container)
        return found

    async def _load_sandbox(self, sandbox_id: str) -> SandboxEntry | None:
        return await self.loader.load_sandbox(sandbox_id, self.store, timeout=self.ensure_timeout)

    async def _load_container(self, container_id: str) -> ContainerEntry | None:
        entry = await self.loader.load_container(container_id, self.store, timeout=self.ensure_timeout)
        if entry is not None and entry.sandbox_id and self.store.sandbox(entry.sandbox_id) is None:
            with contextlib.suppress(UnreadableObjectError):  # the sandbox's own ensure raises it
                await self.loader.load_sandbox(entry.sandbox_id, self.store, timeout=self.ensure_timeout)
        return entry

    async def _on_demand(self, kind: str, object_id: str, load: Callable[[str], Awaitable[Any]]) -> Any:
        key = (kind, object_id)
        task = self._inflight.get(key)
        if task is None:  # one load per object, however many calls wait for it
            task = asyncio.get_running_loop().create_task(self._guarded(kind, object_id, load))
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._settled(key, done))
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.ensure_timeout)
        except TimeoutError:
            log.warning(
                "loading an unknown object timed out; relaying without it",
                kind=kind,
                id=object_id,
                timeout_s=self.ensure_timeout,
            )
            return None

    def _settled(self, key: tuple[str, str], task: asyncio.Task[Any]) -> None:
        self._inflight.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: a waiter that timed out must not leave it "never retrieved"

    @staticmethod
    async def _guarded(kind: str, object_id: str, load: Callable[[str], Awaitable[Any]]) -> Any:
        try:
            entry = await load(object_id)
        except UnreadableObjectError:
            raise  # logged once by the loader; the caller must not take it for "unknown"
        except Exception as exc:
            log.warning(
                "could not load an unknown object; relaying without it",
                kind=kind,
                id=object_id,
                error=describe_error(exc),
            )
            return None
        if entry is None:
            log.info("the runtime does not know this object", kind=kind, id=object_id)
        return entry
