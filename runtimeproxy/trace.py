"""Timestamped trace events, for finding where a pod start's time goes (bench/pod_timeline.py).

Off unless the environment variable RUNTIMEPROXY_TRACE names a file when the process starts;
then each `event` appends one JSON line to it: ``t`` (CLOCK_MONOTONIC in ns, the same clock in
every process of the machine, and Python's ``time.monotonic`` / ``perf_counter`` on Linux),
``pid``, ``cpu`` (this process's CPU time so far, ns), ``ev`` and the caller's fields. Several
processes may share the file: each line is one ``write(2)`` on an ``O_APPEND`` descriptor.

Callers test `ON` first (``if trace.ON: trace.event(...)``), so a trace point costs one global
lookup when tracing is off. A file that cannot be opened turns tracing off with one warning.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import structlog

log = structlog.get_logger("runtimeproxy.trace")

ENV = "RUNTIMEPROXY_TRACE"

PATH = os.environ.get(ENV, "")
ON = bool(PATH)
_fd: int | None = None


def now() -> int:
    """The trace clock (ns)."""
    return time.monotonic_ns()


def event(ev: str, **fields: Any) -> None:
    """Append one event (see the module doc); a no-op when tracing is off."""
    global ON
    fd = _fd if _fd is not None else _open()
    if fd is None:
        return
    record = {"t": time.monotonic_ns(), "pid": os.getpid(), "cpu": time.process_time_ns(), "ev": ev, **fields}
    try:
        os.write(fd, (json.dumps(record, default=str) + "\n").encode())
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
