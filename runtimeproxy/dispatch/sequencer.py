"""Keeps calls for the same pod or container in order, with no node-wide lock.

A lifecycle call holds the keys of the objects it touches (a container id, a sandbox id)
from its pre-hooks until its post-hooks are done. Calls with disjoint keys run in
parallel; calls sharing a key run one after another, in arrival order: a released key
goes straight to its first waiter. Keys are taken in sorted order, so two calls can never
wait on each other. Taking a key nobody holds completes without yielding to the event
loop, which is what lets a post-hook task claim a new container's key before kubelet's
next call is read. An uncontended key costs one dict entry: no lock, no future (nearly
every key is uncontended, and this runs for every lifecycle call).
"""

from __future__ import annotations

import asyncio
from collections import deque


class KeyedSequencer:
    def __init__(self) -> None:
        # A key is here while it is held: its waiters in arrival order, None while it has none.
        self._held: dict[str, deque[asyncio.Future[None]] | None] = {}

    async def acquire(self, keys: list[str]) -> tuple[str, ...]:
        """Wait for every key; returns the held keys, to hand to ``release``."""
        held: list[str] = []
        try:
            for key in keys if len(keys) == 1 else sorted(set(keys)):
                if key in self._held:
                    await self._wait(key)
                else:
                    self._held[key] = None
                held.append(key)
        except BaseException:
            self.release(tuple(held))
            raise
        return tuple(held)

    async def _wait(self, key: str) -> None:
        """Queue for a held key until its holder hands it over."""
        queue = self._held[key]
        if queue is None:
            queue = self._held[key] = deque()
        waiter = asyncio.get_running_loop().create_future()
        queue.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._pass_on(key)  # handed the key as the task was cancelled: hand it on
            elif waiter in queue:
                queue.remove(waiter)
            raise

    def release(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            self._pass_on(key)

    def _pass_on(self, key: str) -> None:
        """Give ``key`` to its first waiter still waiting, or free it."""
        queue = self._held.get(key)
        while queue:
            waiter = queue.popleft()
            if not waiter.done():  # a cancelled waiter is done: skipped
                waiter.set_result(None)
                return
        self._held.pop(key, None)

    def __len__(self) -> int:
        return len(self._held)
