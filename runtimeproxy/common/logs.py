"""Structured logging for the daemon: JSON lines on stdout that journald files by priority.

Under systemd, stdout is a journald stream and journald reads an ``<N>`` prefix on each line
as the syslog priority (sd-daemon(3)), so ``journalctl -p warning`` works without any
journald-specific library. ``fmt="console"`` is for humans running the daemon by hand.

Every write(2) to that stream wakes journald (and costs the writer ~38 us when it was idle), so
info/warning/debug lines logged on a thread that runs an asyncio loop are collected and written
with ONE write per loop turn: the first line of a turn schedules a flush with ``loop.call_soon``.
Lines of other threads, lines with no running loop (start up, CLI commands) and error/critical
lines (they may precede a crash) are written at once, after whatever is collected, so lines of
one thread never change order. What is collected is also written at interpreter exit (atexit).
A SIGKILL or a segfault loses at most the info/warning lines of the loop turn it interrupts; a
loop closed with lines collected in its last turn leaves them for the next write or the exit.

A server whose caller waits for its answer takes :func:`hold` while it answers: collected lines
are then written after the answer, not in the loop turns before it (the caller's wait does not
include our logging); lines of the thread that holds are collected without scheduling a flush.
Lines wait at most as long as the longest answer held, and at most :data:`HELD_LINES_MAX` of
them: a handler that logs more has them written as they come (the answer then waits for them),
so a flood of lines cannot grow the daemon's memory. Meanwhile they are not even processed:
the processor chain (context variables, level, timestamp, renderer) runs when they are written,
on what was logged, with the time and the context variables of the moment it was logged; so a
value logged must not be changed afterwards. Error/critical lines and lines with ``exc_info``
(whose traceback is the one being handled) are processed at once.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import datetime
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

__all__ = [
    "FORMATS",
    "LEVELS",
    "cached_logger",
    "configure_logging",
    "debug_enabled",
    "dropped",
    "flush",
    "get_logger",
    "hold",
]

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
FORMATS = ("json", "console")

# syslog priorities (sd-daemon(3)); structlog level names -> "<N>" prefixes.
_PRIORITY_PREFIX: dict[str, str] = {
    "debug": "<7>",
    "info": "<6>",
    "warning": "<4>",
    "error": "<3>",
    "critical": "<2>",
    "fatal": "<2>",
}
_DEFAULT_PREFIX = "<6>"

_min_level = logging.INFO


_lock = threading.Lock()  # one write at a time, so lines never interleave or change order
_pending: list[str | _Held] = []  # lines collected on loop threads, oldest first ("...\n" when rendered)
_armed: set[asyncio.AbstractEventLoop] = set()  # loops with a flush scheduled and not yet run
_running_loop = asyncio._get_running_loop  # the C lookup asyncio.get_running_loop uses, minus the raise
# Answers in flight that write their answer before the collected lines (hold()), counted by the
# thread that took them: that thread's lines need no flush of their own.
_holding: dict[int, int] = {}
#: Lines kept (for the answers in flight, or a loop turn) at most; at this many they are written at once.
HELD_LINES_MAX = 1000


def _write(text: str) -> None:
    out = sys.stdout  # looked up per write: pytest's capture swaps it
    out.write(text)
    out.flush()  # journald stream / pipe: a line must not sit in a buffer


def _take_pending() -> str:
    """Everything collected, as one string (caller holds _lock), held lines processed now.
    Scheduled flushes left behind then find nothing to write: an extra callback, never a lost line."""
    if not _pending:
        return ""
    text = "".join(line if isinstance(line, str) else line.rendered() for line in _pending)
    _pending.clear()
    _armed.clear()
    return text


class _Held:
    """A line logged while its thread holds an answer: what was logged, when, and the context
    variables then, processed when it is written (module doc)."""

    __slots__ = ("context", "event", "event_kw", "logged_ns", "logger", "method")

    def __init__(self, logger: Any, method: str, event: str | None, event_kw: dict[str, Any]) -> None:
        self.logger = logger
        self.method = method
        self.event = event
        self.event_kw = event_kw
        self.logged_ns = time.time_ns()
        self.context = contextvars.copy_context()  # O(1): merge_contextvars reads it later

    def rendered(self) -> str:
        """The line, processed and rendered now, with its newline ("" when a processor drops it)."""
        try:
            args, _ = self.context.run(self._process)
        except structlog.DropEvent:  # e.g. structlog.testing.capture_logs took it
            return ""
        text = args[0] if args else ""
        return (text if isinstance(text, str) else repr(text)) + "\n"  # the renderers here give str

    def _process(self) -> tuple[Sequence[Any], Mapping[str, Any]]:
        _logged_ns.set(self.logged_ns)  # in this line's own copy of the context: for _UTCStamper
        processed: tuple[Sequence[Any], Mapping[str, Any]] = self.logger._process_event(
            self.method, self.event, self.event_kw
        )
        return processed


#: When a held line was logged, set while it is processed (_Held._process); unset: now.
_logged_ns: contextvars.ContextVar[int] = contextvars.ContextVar("runtimeproxy_logged_ns")

# Processed and written at once (_StdoutLogger.now), never held.
_AT_ONCE = frozenset({"error", "critical", "exception", "fatal"})


def _holding_wrapper(min_level: int) -> type[FilteringBoundLogger]:
    """structlog's filtering bound logger for ``min_level``, whose lines logged on a thread that
    holds an answer are kept unprocessed until it is written (module doc)."""
    base: Any = structlog.make_filtering_bound_logger(min_level)

    class HoldingBoundLogger(base):  # type: ignore[misc]
        def _proxy_to_logger(self, method_name: str, event: str | None = None, **event_kw: Any) -> Any:
            if (
                _holding
                and method_name not in _AT_ONCE
                and "exc_info" not in event_kw
                and _collected_for_holder(lambda: _Held(self, method_name, event, event_kw))
            ):
                return None
            return super()._proxy_to_logger(method_name, event, **event_kw)

    return HoldingBoundLogger


def _collected_for_holder(line: Callable[[], str | _Held]) -> bool:
    """Collect ``line()`` if this thread holds an answer, and say so. Its release writes the line:
    no flush to arm, nor a look for the loop (a getpid(2) per line on Python 3.11)."""
    with _lock:
        if threading.get_ident() not in _holding:
            return False
        _keep(line())
        return True


def _keep(line: str | _Held) -> bool:
    """Add ``line`` to the collected ones (caller holds _lock); at HELD_LINES_MAX of them, write
    them all now, in order, and say so."""
    _pending.append(line)
    if len(_pending) < HELD_LINES_MAX:
        return False
    _write_pending()
    return True


def _flush_turn(loop: asyncio.AbstractEventLoop) -> None:
    """The loop turn's flush: one write for every line collected since the last one."""
    with _lock:
        _armed.discard(loop)
        if _holding:  # an answer is in flight: its release() writes the lines
            return
        _write_pending()


def _write_pending() -> None:
    """Write every collected line (caller holds _lock); a failed write is said on stderr."""
    text = _take_pending()
    if not text:
        return
    try:
        _write(text)
    except (OSError, ValueError) as exc:  # stdout closed or gone: say so where it can still be read
        lost = text.count("\n")
        sys.stderr.write(f"runtimeproxy.common.logs: {lost} log lines lost: {exc!r}\n")


def hold() -> Callable[[], None]:
    """Keep collected lines until the returned release is called (once, when the answer is
    written); with several holds, until the last is released. Error lines are not held."""
    thread = threading.get_ident()
    with _lock:
        _holding[thread] = _holding.get(thread, 0) + 1
    released = False

    def release() -> None:
        nonlocal released
        if released:
            return
        released = True
        with _lock:
            if _holding[thread] == 1:
                del _holding[thread]
            else:
                _holding[thread] -= 1
            if _holding:
                return
        flush()

    return release


def flush() -> None:
    """Write what loop threads collected; for exit paths and tests (also runs at exit)."""
    with _lock:
        text = _take_pending()
        if text:
            _write(text)


def _forget_in_child() -> None:
    """A forked child starts with no lines of its parent's (the parent writes them) and a fresh
    lock (another thread of the parent may have held it at the fork)."""
    global _lock
    _lock = threading.Lock()
    _holding.clear()
    _pending.clear()
    _armed.clear()


os.register_at_fork(after_in_child=_forget_in_child)


@atexit.register
def _flush_at_exit() -> None:
    with contextlib.suppress(OSError, ValueError):  # stdout already closed at exit: nowhere to write
        flush()


class _StdoutLogger:
    """Writes whole lines to whatever ``sys.stdout`` is at call time.

    Looking stdout up per call (instead of binding it once like structlog's PrintLogger)
    keeps cached loggers valid when stdout is swapped, e.g. by pytest's capture.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name

    def msg(self, message: str) -> None:
        if _holding and _collected_for_holder(lambda: message + "\n"):
            return
        loop = _running_loop()
        if loop is None:  # not on a loop thread: nothing would flush a collected line
            self.now(message)
            return
        with _lock:
            if _keep(message + "\n"):  # as many kept as may be (another thread's answer in flight)
                return
            if loop in _armed:
                return
            _armed.add(loop)
        loop.call_soon(_flush_turn, loop)

    def now(self, message: str) -> None:
        """Write the line at once, after (and in the same write as) what was collected."""
        with _lock:
            _write(_take_pending() + message + "\n")

    debug = info = warning = warn = log = msg
    error = critical = fatal = exception = now


def _stdout_logger_factory(*args: Any) -> _StdoutLogger:
    # structlog.get_logger(name) passes its positional arguments to the factory.
    return _StdoutLogger(str(args[0]) if args else "")


def _add_logger_name(logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    name = getattr(logger, "name", "")
    if name:
        event_dict.setdefault("logger", name)
    return event_dict


def _dumps(obj: Any, *, default: Callable[[Any], Any]) -> str:
    """``json.dumps(obj, default=default)``, the same text, cheaper: json.dumps builds a new
    JSONEncoder per call when given ``default``, and JSONEncoder.encode a new C encoder; this
    builds only the C encoder, with a fresh circular-reference memo as json.dumps does (a shared
    one is not thread-safe). Arguments as in json.encoder.JSONEncoder.iterencode's defaults."""
    if c_make_encoder is None:  # interpreter without the _json accelerator
        return json.dumps(obj, default=default)
    encode = c_make_encoder({}, default, encode_basestring_ascii, None, ": ", ", ", False, False, True)
    return "".join(encode(obj, 0))


class _PriorityJSONRenderer:
    """JSON renderer that prefixes the journald priority of the event's level.

    The text of structlog's ``format_exc_info`` then ``JSONRenderer()`` (same fallback for
    objects JSON has no type for). format_exc_info runs only for a line with ``exc_info``: it
    pops that key and does nothing else, so the other lines skip its 3 calls each."""

    def __call__(self, logger: WrappedLogger, name: str, event_dict: EventDict) -> str:
        if "exc_info" in event_dict:
            event_dict = structlog.processors.format_exc_info(logger, name, event_dict)
        prefix = _PRIORITY_PREFIX.get(event_dict.get("level", ""), _DEFAULT_PREFIX)
        return prefix + _dumps(event_dict, default=_json_fallback)


def _own_json_fallback(obj: Any) -> Any:
    """What structlog's JSONRenderer does with an object JSON has no type for."""
    try:
        return obj.__structlog__()
    except AttributeError:
        return repr(obj)


# JSONRenderer's own default where this structlog has it (a private name: never fail on its absence).
_json_fallback: Callable[[Any], Any] = getattr(structlog.processors, "_json_fallback_handler", _own_json_fallback)


class _UTCStamper:
    """``TimeStamper(fmt="iso", utc=True)`` with the same text, rendering the date and time once
    per second: ``datetime.now(utc).isoformat()`` with "+00:00" as "Z", whose microseconds are
    left out when they are 0 (datetime.now floors the system clock to microseconds, as here).
    One function per line, no helper calls: it runs for every line."""

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock  # nanoseconds since the epoch; tests pass their own readings
        self._second: tuple[int, str] = (-1, "")  # replaced whole: threads read a consistent pair

    def __call__(self, logger: WrappedLogger, name: str, event_dict: EventDict) -> EventDict:
        logged = _logged_ns.get(None)  # a held line's time of logging (_Held)
        us = (self._clock() if logged is None else logged) // 1000
        second = us // 1_000_000
        micro = us - second * 1_000_000
        cached, text = self._second
        if cached != second:
            text = datetime.datetime.fromtimestamp(second, datetime.UTC).isoformat()[:-6]  # "+00:00"
            self._second = (second, text)
        event_dict["timestamp"] = f"{text}.{micro:06d}Z" if micro else text + "Z"
        return event_dict


def _parse_level(level: str) -> int:
    key = level.strip().lower()
    if key == "warn":  # common alias; accepting it costs nothing
        key = "warning"
    try:
        return LEVELS[key]
    except KeyError:
        allowed = ", ".join(LEVELS)
        raise ValueError(f"invalid log level {level!r}: expected one of {allowed}") from None


def _parse_format(fmt: str) -> str:
    key = fmt.strip().lower()
    if key not in FORMATS:
        allowed = ", ".join(FORMATS)
        raise ValueError(f"invalid log format {fmt!r}: expected one of {allowed}")
    return key


def _processors(fmt: str) -> list[Processor]:
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _add_logger_name,
        _UTCStamper(),
    ]
    if fmt == "console":
        # ConsoleRenderer formats exc_info itself (and warns if it was pre-formatted).
        return [*shared, structlog.dev.ConsoleRenderer(colors=sys.stdout.isatty())]
    return [*shared, _PriorityJSONRenderer()]  # it formats exc_info itself


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Configure structlog process-wide. Raises ValueError for an unknown level or format."""
    global _min_level
    min_level = _parse_level(level)
    processors = _processors(_parse_format(fmt))
    structlog.configure(
        processors=processors,
        # Methods below min_level compile to "return None": disabled levels cost a call only.
        wrapper_class=_holding_wrapper(min_level),
        logger_factory=_stdout_logger_factory,
        context_class=dict,
        # Not cached: a cached module-level logger would keep this configuration for good,
        # so a later configure_logging (or structlog.testing.capture_logs) would not reach it.
        # Hot paths use cached_logger() (checked per line) and ask debug_enabled() before
        # building a debug line.
        cache_logger_on_first_use=False,
    )
    _min_level = min_level


def get_logger(name: str) -> FilteringBoundLogger:
    """Return a logger whose lines carry ``"logger": name``.

    Safe at import time: structlog's lazy proxy picks up the configuration on first use (and
    builds a bound logger per line: a hot path asks cached_logger(name) per line instead).
    """
    logger: FilteringBoundLogger = structlog.get_logger(name)
    return logger


# What a bound logger is built from (structlog.get_config() keys); a configure() that replaces
# any of them makes the loggers built before it stale.
_BUILT_FROM = ("processors", "wrapper_class", "logger_factory", "context_class")
# The configuration (as get_config() gave it) the loggers were built from, and the loggers by
# name. Replaced whole on a change, so a logger built from another configuration never lands
# in the new dict.
_cache: tuple[dict[str, Any], dict[str, FilteringBoundLogger]] = (dict.fromkeys(_BUILT_FROM, object()), {})


def cached_logger(name: str) -> FilteringBoundLogger:
    """``get_logger(name)``'s logger assembled once per structlog configuration, not per line.

    For hot paths, asked per line (never kept: it is only valid for the configuration it was
    built from). structlog's lazy proxy builds a new bound logger and wrapped logger on every
    line; this checks the configuration through the public ``structlog.get_config()`` by
    identity: capture_logs edits the processors list in place, which a cached logger shares,
    and configure() with new objects (configure_logging, reset_defaults) builds anew.
    """
    config = structlog.get_config()
    built, loggers = _cache
    for key in _BUILT_FROM:
        if config[key] is not built[key]:
            loggers = _new_cache(config)
            break
    try:
        return loggers[name]
    except KeyError:  # structlog's own assembly: the lazy proxy's bind()
        logger: FilteringBoundLogger = structlog.get_logger(name).bind()
        loggers[name] = logger  # two threads may both build one: the last one stays, both are good
        return logger


def _new_cache(config: dict[str, Any]) -> dict[str, FilteringBoundLogger]:
    global _cache
    loggers: dict[str, FilteringBoundLogger] = {}
    _cache = (config, loggers)
    return loggers


_METHOD_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING}


def dropped(method: str) -> bool:
    """True when lines logged with logger method ``method`` ("debug", "info", ...) are not
    emitted: a caller can skip binding a logger for them."""
    return _METHOD_LEVELS.get(method, logging.CRITICAL) < _min_level


def debug_enabled() -> bool:
    """True when debug lines are emitted; hot paths check this once to skip building them."""
    return not dropped("debug")
