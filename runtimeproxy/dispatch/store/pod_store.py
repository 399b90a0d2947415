"""The store itself: sandboxes and containers by ID, updated from the calls the proxy relays.

Concurrency: plain dicts used from the proxy's one asyncio thread; every method is
synchronous and so atomic with respect to other coroutines. No locks are needed and none
must be added; do not touch a store from another thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from collections.abc import Set as AbstractSet

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.runtime_state.entries import (
    ContainerEntry,
    SandboxEntry,
    container_from_request,
    copy_message,
    sandbox_from_request,
)


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
            entry.resources = copy_message(resources)
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
            entry.resources = copy_message(resources)
            if entry.config is not None:
                entry.config.linux.resources.CopyFrom(resources)
        if overhead is not None:
            entry.overhead = copy_message(overhead)
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
