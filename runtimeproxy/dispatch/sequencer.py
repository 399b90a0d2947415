"""Keeps calls for the same pod or container in order, with no node-wide lock.

A lifecycle call holds the keys of the objects it touches (a container id, a sandbox id)
from its pre-hooks until its post-hooks are done. Calls with disjoint keys run in
parallel; calls sharing a key run one after another, in arrival order (asyncio locks
are fair). Keys are taken in sorted order, so two calls can never wait on each other.
Taking a key nobody holds completes without yielding to the event loop, which is what
lets a post-hook task claim a new container's key before kubelet's next call is read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class KeyedSequencer:
    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    async def acquire(self, keys: Iterable[str]) -> tuple[str, ...]:
        """Wait for every key; returns the held keys, to hand to ``release``."""
        held: list[str] = []
        try:
            for key in sorted(set(keys)):
                lock = self._locks.get(key)
                if lock is None:
                    lock = self._locks[key] = asyncio.Lock()
                self._users[key] = self._users.get(key, 0) + 1
                try:
                    await lock.acquire()
                except BaseException:
                    self._forget(key)
                    raise
                held.append(key)
        except BaseException:
            self.release(tuple(held))
            raise
        return tuple(held)

    def release(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            lock = self._locks.get(key)
            if lock is not None and lock.locked():
                lock.release()
            self._forget(key)

    def _forget(self, key: str) -> None:
        users = self._users.get(key, 0) - 1
        if users <= 0:
            self._users.pop(key, None)
            self._locks.pop(key, None)
        else:
            self._users[key] = users

    def __len__(self) -> int:
        return len(self._locks)
