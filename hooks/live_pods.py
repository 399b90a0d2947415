"""The live pods of the CRI runtime, as the reconciler shows them to plugins, read cheaply round after round.

Each round lists the runtime (ListPodSandbox, ListContainers): sandboxes in state READY and their
containers in state CREATED or RUNNING are live. An object seen for the first time is rebuilt from
its verbose status by :class:`runtimeproxy.runtime_state.RuntimeLoader` -- the records the proxy
rebuilds its store from, so plugins see what a hook call would have shown them. :class:`LivePodCache`
keeps what it rebuilt, by id, and for an object it knows asks only for what can change after
creation. Checked against containerd 1.6.20 and 1.7.24 (tests/hooks/test_hooks_live_pods.py):

* a sandbox's verbose status (its info's config, runtime handler, metadata, labels, annotations)
  never changes while it is READY: a known sandbox costs no call;
* a container's info keeps its create-time config (UpdateContainerResources changes only the info's
  ``runtimeSpec`` and ``pid``, which entries do not read); its current resources come from
  ``status.resources``, which the non-verbose ContainerStatus reports exactly as the verbose one
  does. A known container costs one non-verbose ContainerStatus (about a tenth of the bytes, no JSON),
  and its resources are laid over the create-time ones as a full load does
  (:func:`runtimeproxy.runtime_state.current_resources`).

So a round gives what loading every object in full gives. Not checked: a runtime that implements
UpdatePodSandboxResources (no test-bed series does) and records it in the sandbox's info would
not be seen for a known pod. Only complete entries are kept: a
partial one (built from list data because a status call failed, or from a status without a config)
or an unreadable one is loaded in full again next round, as before. An object no longer listed as
live is forgotten, and so is everything when a round fails (the runtime down or restarting): the
listing is the truth for which objects exist, and the round after a failure loads everything anew.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final, TypeVar

import structlog

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.runtime_state import (
    RUNTIME_DOWN,
    ContainerEntry,
    RuntimeLoader,
    SandboxEntry,
    UnreadableObjectError,
    container_from_list_item,
    container_from_status,
    current_resources,
    describe_error,
    sandbox_from_list_item,
)
from runtimeproxy.runtime_state.entries import copy_message
from runtimeproxy.wire.grpc_client import status_of

from .convert import resources_from_proto
from .views import ContainerInfo, PodInfo

__all__ = ["LivePodCache", "LivePods", "container_info", "list_live_pods", "pod_info"]

log = structlog.get_logger("runtimeproxy.hooks.reconciler")

# Containers that have a cgroup: created (runc made it) or running. Exited ones are left alone.
_LIVE_CONTAINER_STATES: Final = frozenset({pb.CONTAINER_CREATED, pb.CONTAINER_RUNNING})
_READY: Final = pb.ListPodSandboxRequest(
    filter=pb.PodSandboxFilter(state=pb.PodSandboxStateValue(state=pb.SANDBOX_READY))
)

_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True)
class LivePods:
    """The pods a round works on, and their containers by the pod's sandbox id."""

    pods: tuple[PodInfo, ...] = ()
    containers: Mapping[str, tuple[ContainerInfo, ...]] = field(default_factory=lambda: MappingProxyType({}))
    unreadable: int = 0  # objects the runtime listed that could not be decoded: skipped

    def container_count(self) -> int:
        return sum(len(items) for items in self.containers.values())


def pod_info(entry: SandboxEntry) -> PodInfo:
    """A rebuilt sandbox as the PodInfo its hook calls carry (``sandbox_id`` set)."""
    return PodInfo(
        name=entry.name,
        namespace=entry.namespace,
        uid=entry.uid,
        attempt=entry.attempt,
        sandbox_id=entry.id,
        labels=MappingProxyType(dict(entry.labels)),
        annotations=MappingProxyType(dict(entry.annotations)),
        cgroup_parent=entry.cgroup_parent,
        runtime_handler=entry.runtime_handler,
        resources=resources_from_proto(entry.resources) if entry.resources is not None else None,
        overhead=resources_from_proto(entry.overhead) if entry.overhead is not None else None,
    )


def container_info(entry: ContainerEntry) -> ContainerInfo:
    """A rebuilt container as the ContainerInfo its hook calls carry (current resources)."""
    return ContainerInfo(
        name=entry.name,
        id=entry.id,
        attempt=entry.attempt,
        annotations=MappingProxyType(dict(entry.annotations)),
        resources=resources_from_proto(entry.resources) if entry.resources is not None else None,
        env=tuple((key, value.decode("utf-8", "surrogateescape")) for key, value in entry.envs),
    )


async def list_live_pods(loader: RuntimeLoader) -> LivePods:
    """The runtime's READY sandboxes and their CREATED or RUNNING containers, every one loaded in
    full (one round of a new :class:`LivePodCache`); see there."""
    return await LivePodCache(loader).read()


#: A live container as a round gives it: its sandbox's id and the container.
_Placed = tuple[str, ContainerInfo]


@dataclass(frozen=True)
class _Known:
    """A container loaded in full: what a round shows (``shown``, its resources from ``reported``)
    and the create-time resources a new status's are laid over."""

    sandbox_id: str
    configured: pb.LinuxContainerResources | None
    reported: pb.LinuxContainerResources | None
    shown: ContainerInfo

    def placed(self) -> _Placed:
        return self.sandbox_id, self.shown


class LivePodCache:
    """The live pods of ``loader``'s runtime, each object loaded in full once and then refreshed
    by the cheapest call that gives the same result (see the module doc).

    :meth:`read` raises RpcError when the runtime cannot be listed or stops answering.
    Objects the runtime cannot describe are taken from their list item (partial), objects removed
    meanwhile are skipped, objects that cannot be decoded are skipped (the loader logs them once).
    """

    def __init__(self, loader: RuntimeLoader) -> None:
        self.loader = loader
        self._pods: dict[str, PodInfo] = {}
        self._containers: dict[str, _Known] = {}

    def __len__(self) -> int:
        """How many objects are kept (complete ones, seen live in the last round)."""
        return len(self._pods) + len(self._containers)

    def forget(self) -> None:
        self._pods.clear()
        self._containers.clear()

    async def read(self) -> LivePods:
        """One round: list the runtime, load what is new, refresh what is known."""
        try:
            return await self._read()
        except BaseException:  # the runtime failed or restarts: nothing kept is trusted
            self.forget()
            raise

    async def _read(self) -> LivePods:
        loader = self.loader
        sandbox_listing = await loader.list_sandboxes(_READY)
        container_listing = await loader.list_containers()
        # A runtime may ignore filters.
        sandboxes = [item for item in sandbox_listing.items if item.state == pb.SANDBOX_READY]
        ready_ids = {item.id for item in sandboxes}
        containers = [
            item
            for item in container_listing.items
            if item.state in _LIVE_CONTAINER_STATES and item.pod_sandbox_id in ready_ids
        ]
        self._retain(ready_ids, {item.id for item in containers})
        gate = asyncio.Semaphore(max(1, loader.concurrency))
        # A known sandbox costs no call, so no task either (75 pods: 75 task steps in one loop turn).
        new = [item for item in sandboxes if item.id not in self._pods]
        results = await asyncio.gather(*(_bounded(gate, self._pod(item)) for item in new))
        loaded = {item.id: result for item, result in zip(new, results, strict=True)}
        pod_results = [loaded[item.id] if item.id in loaded else self._pods[item.id] for item in sandboxes]
        container_results = await asyncio.gather(*(_bounded(gate, self._container(item)) for item in containers))
        # Forget objects no longer listed (memory stays as small as the runtime's bad objects).
        loader.unreadable.retain(
            "sandbox", {item.id for item in sandbox_listing.items} | set(sandbox_listing.unreadable)
        )
        loader.unreadable.retain(
            "container", {item.id for item in container_listing.items} | set(container_listing.unreadable)
        )
        pods = tuple(pod for pod in pod_results if isinstance(pod, PodInfo))
        known = {pod.sandbox_id for pod in pods}
        by_sandbox: dict[str, list[ContainerInfo]] = {}
        for placed in container_results:
            if isinstance(placed, tuple) and placed[0] in known:
                by_sandbox.setdefault(placed[0], []).append(placed[1])
        unreadable = sum(isinstance(result, UnreadableObjectError) for result in (*pod_results, *container_results))
        return LivePods(
            pods=pods,
            containers=MappingProxyType({sandbox: tuple(items) for sandbox, items in by_sandbox.items()}),
            unreadable=unreadable + len(sandbox_listing.unreadable) + len(container_listing.unreadable),
        )

    def _retain(self, sandbox_ids: set[str], container_ids: set[str]) -> None:
        for gone in self._pods.keys() - sandbox_ids:
            del self._pods[gone]
        for gone in self._containers.keys() - container_ids:
            del self._containers[gone]

    # -- sandboxes: nothing of a known one changes while it is READY --

    async def _pod(self, item: pb.PodSandbox) -> PodInfo | UnreadableObjectError | None:
        known = self._pods.get(item.id)
        if known is not None:
            return known
        entry = await _load_listed("sandbox", self.loader.load_sandbox(item.id), item, sandbox_from_list_item)
        if not isinstance(entry, SandboxEntry):
            return entry
        pod = pod_info(entry)
        if not entry.partial:
            self._pods[item.id] = pod
        return pod

    # -- containers: a known one's current resources --

    async def _container(self, item: pb.Container) -> _Placed | UnreadableObjectError | None:
        known = self._containers.pop(item.id, None)  # put back when loaded or refreshed in full
        load = self._load_container(item) if known is None else self._refresh(item, known)
        return await _load_listed("container", load, item, _placed_from_list)

    async def _load_container(self, item: pb.Container) -> _Placed | None:
        """The container from its verbose status, as RuntimeLoader.load_container gives it."""
        response = await self.loader.container_status(item.id, verbose=True)
        if response is None:
            return None  # removed since it was listed
        status = response.status
        reported = _reported(status)
        # Without the status's resources the entry keeps the create-time ones of the info's config.
        status.ClearField("resources")
        entry = container_from_status(status, response.info)
        # The loader asks ListContainers when the info names no sandbox; the item has it.
        base = _Known(entry.sandbox_id or item.pod_sandbox_id, entry.resources, None, container_info(entry))
        known = _with_reported(base, reported, partial=entry.partial)
        if not entry.partial:
            self._containers[item.id] = known
        return known.placed()

    async def _refresh(self, item: pb.Container, known: _Known) -> _Placed | None:
        """A known container with the current resources of its non-verbose status."""
        response = await self.loader.container_status(item.id)
        if response is None:
            return None
        reported = _reported(response.status)
        if reported != known.reported:  # updated since: lay the new values over the create-time ones
            known = _with_reported(known, reported)
        self._containers[item.id] = known
        return known.placed()


def _reported(status: pb.ContainerStatus) -> pb.LinuxContainerResources | None:
    return copy_message(status.resources.linux) if status.resources.HasField("linux") else None


def _with_reported(known: _Known, reported: pb.LinuxContainerResources | None, *, partial: bool = False) -> _Known:
    """``known`` showing ``reported`` laid over its create-time resources, as container_from_status
    does (partial: no config, the status's values alone)."""
    resources = current_resources(known.configured, reported, config_known=not partial)
    shown = replace(known.shown, resources=resources_from_proto(resources) if resources is not None else None)
    return replace(known, reported=reported, shown=shown)


def _placed_from_list(item: pb.Container) -> _Placed:
    entry = container_from_list_item(item)
    return item.pod_sandbox_id, container_info(entry)


async def _bounded(gate: asyncio.Semaphore, work: Awaitable[_T]) -> _T:
    async with gate:
        return await work


async def _load_listed(
    kind: str, load: Awaitable[_R | None], item: Any, from_list: Callable[[Any], _R]
) -> _R | UnreadableObjectError | None:
    """What ``load`` gives (None: removed since it was listed), the error when it cannot be
    decoded, or ``item``'s list data when its status call failed while the runtime answers."""
    try:
        return await load
    except UnreadableObjectError as exc:  # reported by the loader
        return exc
    except Exception as exc:
        if status_of(exc) in RUNTIME_DOWN | {None}:  # runtime down, or no call's status at all
            raise
        log.warning(f"{kind} status failed; using list data only", id=item.id, error=describe_error(exc))
        return from_list(item)
