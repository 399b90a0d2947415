"""Rebuilding the store in the background at start, and loading unknown objects on demand."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from runtimeproxy.runtime_state.entries import ContainerEntry, EntryT, SandboxEntry
from runtimeproxy.runtime_state.loader import LoadResult, RuntimeLoader
from runtimeproxy.runtime_state.unreadable import UnreadableObjectError, describe_error

from .pod_store import PodStore

log = structlog.get_logger(__package__)


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
        return await self._ensure("sandbox", sandbox_id, self.store.sandbox, self._load_sandbox)

    async def ensure_container(self, container_id: str) -> ContainerEntry | None:
        """The container's entry, loading it (and its sandbox, if unknown) on demand; raises
        UnreadableObjectError if the runtime has it but it cannot be decoded."""
        return await self._ensure("container", container_id, self.store.container, self._load_container)

    async def _ensure(
        self,
        kind: str,
        object_id: str,
        known: Callable[[str], EntryT | None],
        load: Callable[[str], Awaitable[EntryT | None]],
    ) -> EntryT | None:
        entry = known(object_id)
        if entry is not None or not object_id:
            return entry
        found: EntryT | None = await self._on_demand(kind, object_id, load)
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
