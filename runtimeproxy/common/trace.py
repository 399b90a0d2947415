"""Timestamped trace events, for finding where a pod start's time goes (bench/pod_timeline.py).

Off unless the environment variable RUNTIMEPROXY_TRACE names a file when the process starts;
then each `event` records one JSON line for it: ``t`` (CLOCK_MONOTONIC in ns, the same clock in
every process of the machine, and Python's ``time.monotonic`` / ``perf_counter`` on Linux),
``pid``, ``cpu`` (this process's CPU time so far, ns), ``ev`` and the caller's fields.

Tracing must not add to what it measures (the daemons' CPU during pod starts), so an event only
appends a tuple to a list in memory: the lines are made and written in one ``write(2)`` per
`FLUSH_EVENTS` events, and at exit (atexit; the daemons return from their loop on SIGTERM, so
a normal stop writes everything; a SIGKILL loses what is buffered). Fields are therefore turned
into JSON at the flush: pass values that are not changed afterwards. Several processes may share
the file: each batch is one ``write(2)`` on an ``O_APPEND`` descriptor, of whole lines; readers
sort by ``t``. A forked child starts with an empty buffer and its own pid.

Callers test `ON` first (``if trace.ON: trace.event(...)``), so a trace point costs one global
lookup when tracing is off. A file that cannot be opened turns tracing off with one warning.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from typing import Any, Final

import structlog

log = structlog.get_logger("runtimeproxy.common.trace")

ENV = "RUNTIMEPROXY_TRACE"
# Events held before they are written (about 0.5 MiB of lines): a bench of tens of pods writes
# them all at exit, outside the pod starts it measures.
FLUSH_EVENTS: Final = 4096

PATH = os.environ.get(ENV, "")
ON = bool(PATH)
_fd: int | None = None
_pid = os.getpid()
_pending: list[tuple[int, int, str, dict[str, Any]]] = []


def now() -> int:
    """The trace clock (ns)."""
    return time.monotonic_ns()


def event(ev: str, **fields: Any) -> None:
    """Record one event (see the module doc); a no-op when tracing is off."""
    if not ON:
        return
    _pending.append((time.monotonic_ns(), time.process_time_ns(), ev, fields))
    if len(_pending) >= FLUSH_EVENTS:
        flush()


def flush() -> None:
    """Write the events recorded so far (one ``write(2)``)."""
    global ON
    if not _pending:
        return
    lines = "".join(
        json.dumps({"t": t, "pid": _pid, "cpu": cpu, "ev": ev, **fields}, default=str) + "\n"
        for t, cpu, ev, fields in _pending
    )
    _pending.clear()
    fd = _fd if _fd is not None else _open()
    if fd is None:
        return
    data = memoryview(lines.encode())
    try:
        while data:  # a regular file takes it whole but for a signal or a full disk
            data = data[os.write(fd, data) :]
    except OSError as exc:  # disk full, file removed under a read-only mount...: stop, say so once
        ON = False
        log.warning("trace file not writable; tracing stopped", path=PATH, error=str(exc))


def _open() -> int | None:
    global _fd, ON
    if not ON:
        return None
    try:
        _fd = os.open(PATH, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        ON = False
        log.warning("cannot open the trace file; tracing off", path=PATH, env=ENV, error=str(exc))
        return None
    return _fd


def _forked() -> None:
    """In a forked child: the parent's events are the parent's to write."""
    global _pid
    _pid = os.getpid()
    _pending.clear()


os.register_at_fork(after_in_child=_forked)
atexit.register(flush)
