"""Per-pod order for NRI events whose hooks run after the runtime was answered.

Notifications (PostStartContainer, StopContainer, ...) are answered at once and their hooks run
afterwards (hooks/nri/service.py), so the next event of the same pod can arrive while they still
run. :class:`PodQueues` keeps the pod's events in arrival order: work submitted for a key starts
only when everything submitted earlier for that key has finished (succeeded, failed or been
cancelled); different keys run concurrently. :meth:`PodQueues.submit` must be called before the
caller's first ``await`` for the event, so that submission order is the order the events came in.
:meth:`PodQueues.run` is ``await submit(...)`` for a caller that waits for the work anyway: when
nothing of the key is queued, the work runs in the caller's own task (no task of its own, no
loop turn to start it), and work submitted meanwhile for the key waits for the caller's task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["PodQueues"]

T = TypeVar("T")


class PodQueues:
    """Work per key, one after the other in submission order; see the module doc."""

    def __init__(self) -> None:
        self._tails: dict[str, asyncio.Task[Any]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # see _running_loop

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the queues' work runs on, looked up once: each look at the running loop is a
        getpid(2) on Python 3.11, and this is on the path of every event."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def __len__(self) -> int:
        """Keys with work queued or running."""
        return len(self._tails)

    def submit(self, key: str, work: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """A task running ``work()`` once the earlier work for ``key`` is done. Awaiting it gives
        its result; cancelling it cancels ``work`` (or skips it, while still queued)."""
        previous = self._tails.get(key)
        task: asyncio.Task[T] = self._running_loop().create_task(_after(previous, work))
        self._tails[key] = task
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._finished(key, done))
        return task

    async def run(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        """``await self.submit(key, work)``, in the calling task when nothing of ``key`` is queued
        (module doc). Registers before its first suspension, as submit does."""
        previous = self._tails.get(key)
        caller = asyncio.current_task(self._running_loop())
        if caller is None or (previous is not None and not previous.done()):
            return await self.submit(key, work)
        self._tails[key] = caller
        try:
            return await work()
        finally:
            if self._tails.get(key) is caller:
                del self._tails[key]

    def _finished(self, key: str, task: asyncio.Task[T]) -> None:
        self._tasks.discard(task)
        if self._tails.get(key) is task:
            del self._tails[key]

    async def drain(self) -> None:
        """Wait until all work submitted so far is done."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def cancel(self) -> None:
        """Cancel all work and wait until it has stopped."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


async def _after(previous: asyncio.Task[Any] | None, work: Callable[[], Awaitable[T]]) -> T:
    if previous is not None and not previous.done():
        # asyncio.wait, not await: the earlier work's failure is its own, and cancelling this
        # task must not cancel the earlier one
        await asyncio.wait([previous])
    return await work()
