"""Reading sandboxes and containers back from the runtime: a restarted proxy's store, and the
pods runtime-hooks keeps in line.

ListPodSandbox and ListContainers, then the verbose PodSandboxStatus / ContainerStatus of
each object (entries built by from_runtime.py). Objects that cannot be decoded are skipped
and reported once (unreadable.py); the load completes. The calls go over the project's own
HTTP/2 client (runtimeproxy.wire.grpc_client), so the daemons never load grpc for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any, Final, Protocol, TypeVar

import structlog
from google.protobuf.message import Message

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.common.endpoints import socket_path
from runtimeproxy.common.message_size import DEFAULT_MAX_MESSAGE_SIZE
from runtimeproxy.wire.grpc_client import H2Channel, status_of
from runtimeproxy.wire.grpc_framing import StatusCode

from .entries import ContainerEntry, EntryT, SandboxEntry
from .from_runtime import container_from_list_item, container_from_status, sandbox_from_list_item, sandbox_from_status
from .unreadable import (
    Listing,
    Undecodable,
    UnreadableObjectError,
    UnreadableObjects,
    describe_error,
    first_field,
    lenient,
    raw_id,
)

log = structlog.get_logger(__package__)

M = TypeVar("M", bound=Message)
T = TypeVar("T")


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


class EntryStore(Protocol):
    """Where loaded entries go (the proxy's PodStore): an entry it already has, or one removed
    meanwhile (named in ``removed``, from ``watch_removals``), wins over the loaded one."""

    def watch_removals(self) -> AbstractContextManager[set[str]]: ...

    def adopt_sandbox(self, entry: SandboxEntry, removed: AbstractSet[str] = ...) -> SandboxEntry | None: ...

    def adopt_container(self, entry: ContainerEntry, removed: AbstractSet[str] = ...) -> ContainerEntry | None: ...


# The RuntimeService calls the loader makes, with their response types.
_LOADER_CALLS: dict[str, type[Message]] = {
    "ListPodSandbox": pb.ListPodSandboxResponse,
    "ListContainers": pb.ListContainersResponse,
    "PodSandboxStatus": pb.PodSandboxStatusResponse,
    "ContainerStatus": pb.ContainerStatusResponse,
}


def _lenient_stub(channel: H2Channel) -> Any:
    """The loader's calls (``await stub.Name(request, timeout=...)``), answering `Undecodable`
    for a response protobuf refuses."""

    def call(name: str, response_type: type[Message]) -> Callable[..., Awaitable[Any]]:
        decode = lenient(response_type)
        method = f"/runtime.v1.RuntimeService/{name}"

        async def unary(request: Message, *, timeout: float) -> Any:
            return decode(await channel.unary(method, request.SerializeToString(), timeout))

        return unary

    return SimpleNamespace(**{name: call(name, response_type) for name, response_type in _LOADER_CALLS.items()})


# Errors that mean "the runtime is not answering": a load fails (and is retried) rather
# than settling for List data. The reconciler's rounds go by the same set.
RUNTIME_DOWN: Final = frozenset({StatusCode.UNAVAILABLE, StatusCode.CANCELLED})


class RuntimeLoader:
    """Reads sandboxes and containers back from the runtime (RuntimeService).

    `target` is the runtime's unix socket (``unix:///path`` or ``/path``); a connection is
    opened on first use (again after it is lost) and closed by `close()`. Failed calls raise
    `RpcError`. Objects that cannot be decoded are skipped and recorded in `unreadable`;
    ``on_unreadable`` (e.g. a metric) is called with the kind of each, once.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 10.0,
        concurrency: int = 8,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_SIZE,
        on_unreadable: Callable[[str], None] | None = None,
    ) -> None:
        self.timeout = timeout
        self.concurrency = concurrency
        self.unreadable = UnreadableObjects()
        if on_unreadable is not None:
            self.unreadable.listeners.append(on_unreadable)
        self._channel = H2Channel(socket_path(target), max_message_size=max_message_bytes)
        self._stub: Any = None

    @property
    def stub(self) -> Any:
        """The calls the loader makes (ListPodSandbox, ListContainers, PodSandboxStatus,
        ContainerStatus); a response that does not decode comes as `Undecodable`."""
        if self._stub is None:
            self._stub = _lenient_stub(self._channel)
        return self._stub

    async def close(self) -> None:
        """Close the connection; a later call opens a new one."""
        await self._channel.close()

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
        for raw in first_field(response.data):  # both List responses hold their items in field 1
            try:
                items.append(item_type.FromString(raw))
            except Exception as exc:  # this object only
                object_id = raw_id(raw)
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

    async def load_all(self, store: EntryStore) -> LoadResult:
        """Add every sandbox and container the runtime has to `store` (those it knows
        already are kept as they are; those it cannot decode are skipped). Raises
        RpcError when the runtime cannot be listed or stops answering."""
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
        status = partial(self.stub.PodSandboxStatus, request, timeout=self.timeout)
        return await self._listed_entry(item, "sandbox", status, sandbox_from_status, sandbox_from_list_item)

    async def _container_entry(self, item: pb.Container) -> ContainerEntry | UnreadableObjectError | None:
        request = pb.ContainerStatusRequest(container_id=item.id, verbose=True)
        status = partial(self.stub.ContainerStatus, request, timeout=self.timeout)
        return await self._listed_entry(item, "container", status, container_from_status, container_from_list_item)

    async def _listed_entry(
        self,
        item: Any,
        kind: str,
        status: Callable[[], Awaitable[Any]],
        from_status: Callable[[Any, Any, Any], EntryT],
        from_list: Callable[[Any], EntryT],
    ) -> EntryT | UnreadableObjectError | None:
        """A listed object's entry from its verbose status, or from ``item`` alone when the
        status call fails (None: it is gone; the error: it cannot be decoded)."""
        try:
            response = self._decoded(await status(), kind, item.id)
        except UnreadableObjectError as exc:
            return exc
        except Exception as exc:
            return self._status_failed(exc, kind, item.id, lambda: from_list(item))
        return from_status(response.status, response.info, item)

    @staticmethod
    def _status_failed(exc: Exception, kind: str, object_id: str, fallback: Callable[[], T]) -> T | None:
        code = status_of(exc)
        if code is None or code in RUNTIME_DOWN:
            raise exc  # not a call's status (a bug), or the runtime is down
        if code == StatusCode.NOT_FOUND:
            return None  # removed since it was listed
        log.warning("status call failed; using list data only", kind=kind, id=object_id, error=describe_error(exc))
        return fallback()

    # single objects

    async def load_sandbox(
        self, sandbox_id: str, store: EntryStore | None = None, *, timeout: float | None = None
    ) -> SandboxEntry | None:
        """The sandbox's entry from its verbose status, added to `store` if given (an
        entry the store has meanwhile wins). None if the runtime has no such sandbox;
        UnreadableObjectError if it cannot be decoded; other errors raise RpcError."""
        return await self._load(self._fetch_sandbox, _adopt_sandbox, sandbox_id, store, timeout)

    async def load_container(
        self, container_id: str, store: EntryStore | None = None, *, timeout: float | None = None
    ) -> ContainerEntry | None:
        """`load_sandbox` for a container."""
        return await self._load(self._fetch_container, _adopt_container, container_id, store, timeout)

    async def _load(
        self,
        fetch: Callable[[str, float], Awaitable[EntryT | None]],
        adopt: Callable[[EntryStore, EntryT, AbstractSet[str]], EntryT | None],
        object_id: str,
        store: EntryStore | None,
        timeout: float | None,
    ) -> EntryT | None:
        if store is None:
            return await fetch(object_id, timeout or self.timeout)
        with store.watch_removals() as removed:
            entry = await fetch(object_id, timeout or self.timeout)
            return adopt(store, entry, removed) if entry is not None else None

    async def _fetch_sandbox(self, sandbox_id: str, timeout: float) -> SandboxEntry | None:
        request = pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True)
        try:
            response = await self.stub.PodSandboxStatus(request, timeout=timeout)
        except Exception as exc:
            self._gone_or_raise(exc, sandbox_id)
            return None
        response = self._decoded(response, "sandbox", sandbox_id)
        return sandbox_from_status(response.status, response.info)

    async def container_status(
        self, container_id: str, *, verbose: bool = False, timeout: float | None = None
    ) -> pb.ContainerStatusResponse | None:
        """The container's ContainerStatus (``verbose``: with the info holding its create-time
        config; without, its current resources alone). None if the runtime has no such
        container; UnreadableObjectError if it cannot be decoded; other errors raise RpcError."""
        request = pb.ContainerStatusRequest(container_id=container_id, verbose=verbose)
        try:
            response = await self.stub.ContainerStatus(request, timeout=timeout or self.timeout)
        except Exception as exc:
            self._gone_or_raise(exc, container_id)
            return None
        decoded: pb.ContainerStatusResponse = self._decoded(response, "container", container_id)
        return decoded

    async def _fetch_container(self, container_id: str, timeout: float) -> ContainerEntry | None:
        response = await self.container_status(container_id, verbose=True, timeout=timeout)
        if response is None:
            return None
        entry = container_from_status(response.status, response.info)
        if not entry.sandbox_id:  # no info: ListContainers names the sandbox
            listing = pb.ListContainersRequest(filter=pb.ContainerFilter(id=container_id))
            try:
                found = await self.list_containers(listing, timeout=timeout)
            except Exception as exc:
                self._gone_or_raise(exc, container_id)
                return None
            entry.sandbox_id = next((c.pod_sandbox_id for c in found.items), "")
        return entry

    def _gone_or_raise(self, exc: Exception, object_id: str) -> None:
        """Raise ``exc`` unless it is NOT_FOUND: then the object is gone (and no longer
        remembered as unreadable)."""
        if status_of(exc) != StatusCode.NOT_FOUND:
            raise exc
        self.unreadable.discard(object_id)


def _adopt_sandbox(store: EntryStore, entry: SandboxEntry, removed: AbstractSet[str]) -> SandboxEntry | None:
    return store.adopt_sandbox(entry, removed)


def _adopt_container(store: EntryStore, entry: ContainerEntry, removed: AbstractSet[str]) -> ContainerEntry | None:
    return store.adopt_container(entry, removed)
