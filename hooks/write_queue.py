"""Node writes taken off a hook call's critical path: a handler's cgroup writes queued during the
call and applied right after the answer has gone (containerd creates the sandbox meanwhile).

Which writes: only those a plugin with failure policy "ignore" makes through the ``cgroups``
handle (:meth:`~.cgroups.CgroupFS.write`) during a hook call of a runner asked to defer (the
runtime-hooks gRPC server). A "fail" plugin's writes stay inline, so its failure still refuses
the call; explain/dry-run, the NRI plugin mode, lifecycle and reconcile calls never defer.

Order: a queue is applied whole, in the order the writes were made. Anything that could observe
or overtake a queued write applies the queue first: a read of a file through the handle in the
same call, an inline write in the same call (a "fail" plugin after an "ignore" one), the next
hook call about the same pod, a reconcile round, and the runner's stop.

Failures: a deferred write that fails is logged (warning, naming plugin, hook, pod and error)
and counted in ``runtimeproxy_hooks_deferred_write_failures_total``; the hook call has already
answered with the plugin's CRI changes, which the write's failure could not have changed for an
"ignore" plugin whose handler catches write errors (the built-in ones do).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import structlog

__all__ = ["Scope", "WriteQueue", "active", "scope"]

log = structlog.get_logger("runtimeproxy.hooks.write_queue")

#: Called when a queued write fails: (plugin, hook, pod, the exception).
FailureSink = Callable[[str, str, str, BaseException], None]


@dataclass
class _Write:
    plugin: str
    path: str
    apply: Callable[[], None]


@dataclass
class WriteQueue:
    """One hook call's deferred writes (``pod``: namespace/name, for logs). Thread-safe: a sync
    handler queues from its own thread. Once applied it is closed: a late write (a timed-out
    sync handler still running) goes inline instead of waiting in a queue nobody applies."""

    hook: str
    pod: str
    on_failure: FailureSink
    _writes: list[_Write] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _closed: bool = False

    def __len__(self) -> int:
        return len(self._writes)

    def add(self, plugin: str, path: str, apply: Callable[[], None]) -> bool:
        """Queue ``apply`` (the write of ``path``); False when closed: the caller writes inline."""
        with self._lock:
            if self._closed:
                return False
            self._writes.append(_Write(plugin, path, apply))
            return True

    def has(self, path: str) -> bool:
        with self._lock:
            return any(write.path == path for write in self._writes)

    def apply(self, *, deadline: float | None = None, close: bool = False) -> int:
        """Apply the queued writes in order (``close``: queue no more); the number left unapplied
        because ``deadline`` (time.monotonic) passed, each logged as cut."""
        with self._lock:
            self._closed = self._closed or close
            writes, self._writes = self._writes, []
            for index, write in enumerate(writes):
                if deadline is not None and time.monotonic() > deadline:
                    for cut in writes[index:]:
                        log.error("deferred cgroup write not applied: too late", plugin=cut.plugin, file=cut.path)
                    return len(writes) - index
                self._apply_one(write)
            return 0

    def _apply_one(self, write: _Write) -> None:
        try:
            write.apply()
        except Exception as exc:  # a node write may fail any way; the others must still land
            log.warning(
                "deferred cgroup write failed",
                plugin=write.plugin,
                hook=self.hook,
                pod=self.pod,
                file=write.path,
                error=f"{type(exc).__name__}: {exc}",
            )
            self.on_failure(write.plugin, self.hook, self.pod, exc)


@dataclass(frozen=True)
class Scope:
    """What a handler's writes do: queued in ``queue`` when ``defer`` (the plugin's policy is
    "ignore"), else inline after applying what the queue holds (order)."""

    queue: WriteQueue
    plugin: str
    defer: bool


_ACTIVE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("runtimeproxy_write_scope", default=None)


def active() -> Scope | None:
    """The scope of the handler running in this context (None: outside a deferring hook call)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def scope(queue: WriteQueue, plugin: str, *, defer: bool) -> Iterator[None]:
    """Run a handler in this scope; its task or thread inherits it (contextvars are copied)."""
    token = _ACTIVE.set(Scope(queue, plugin, defer))
    try:
        yield
    finally:
        _ACTIVE.reset(token)
