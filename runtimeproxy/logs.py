"""Structured logging for the daemon: JSON lines on stdout that journald files by priority.

Under systemd, stdout is a journald stream and journald reads an ``<N>`` prefix on each line
as the syslog priority (sd-daemon(3)), so ``journalctl -p warning`` works without any
journald-specific library. ``fmt="console"`` is for humans running the daemon by hand.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

__all__ = ["FORMATS", "LEVELS", "configure_logging", "debug_enabled", "get_logger"]

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


class _StdoutLogger:
    """Writes whole lines to whatever ``sys.stdout`` is at call time.

    Looking stdout up per call (instead of binding it once like structlog's PrintLogger)
    keeps cached loggers valid when stdout is swapped, e.g. by pytest's capture.
    """

    _lock = threading.Lock()

    def __init__(self, name: str = "") -> None:
        self.name = name

    def msg(self, message: str) -> None:
        line = message + "\n"
        with self._lock:  # one write per line so threads never interleave inside a line
            out = sys.stdout
            out.write(line)
            out.flush()  # journald stream / pipe: a line must not sit in a buffer

    debug = info = warning = warn = error = critical = fatal = exception = log = msg


def _stdout_logger_factory(*args: Any) -> _StdoutLogger:
    # structlog.get_logger(name) passes its positional arguments to the factory.
    return _StdoutLogger(str(args[0]) if args else "")


def _add_logger_name(logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    name = getattr(logger, "name", "")
    if name:
        event_dict.setdefault("logger", name)
    return event_dict


_ENCODERS: dict[Callable[[Any], Any], json.JSONEncoder] = {}


def _dumps(obj: Any, *, default: Callable[[Any], Any]) -> str:
    """``json.dumps(obj, default=default)``, the same text, with the encoder built once: json.dumps
    builds a new one per call when given ``default`` (a few us of every line)."""
    encoder = _ENCODERS.get(default)
    if encoder is None:
        encoder = _ENCODERS[default] = json.JSONEncoder(default=default)
    return encoder.encode(obj)


class _PriorityJSONRenderer:
    """JSON renderer that prefixes the journald priority of the event's level."""

    def __init__(self) -> None:
        self._json = structlog.processors.JSONRenderer(serializer=_dumps)

    def __call__(self, logger: WrappedLogger, name: str, event_dict: EventDict) -> str:
        prefix = _PRIORITY_PREFIX.get(event_dict.get("level", ""), _DEFAULT_PREFIX)
        return prefix + str(self._json(logger, name, event_dict))


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
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "console":
        # ConsoleRenderer formats exc_info itself (and warns if it was pre-formatted).
        return [*shared, structlog.dev.ConsoleRenderer(colors=sys.stdout.isatty())]
    return [*shared, structlog.processors.format_exc_info, _PriorityJSONRenderer()]


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Configure structlog process-wide. Raises ValueError for an unknown level or format."""
    global _min_level
    min_level = _parse_level(level)
    processors = _processors(_parse_format(fmt))
    structlog.configure(
        processors=processors,
        # Methods below min_level compile to "return None": disabled levels cost a call only.
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        logger_factory=_stdout_logger_factory,
        context_class=dict,
        # Not cached: a cached module-level logger would keep this configuration for good,
        # so a later configure_logging (or structlog.testing.capture_logs) would not reach it.
        # Hot paths ask debug_enabled() before building a debug line instead.
        cache_logger_on_first_use=False,
    )
    _min_level = min_level


def get_logger(name: str) -> FilteringBoundLogger:
    """Return a logger whose lines carry ``"logger": name``.

    Safe at import time: structlog's lazy proxy picks up the configuration on first use.
    """
    logger: FilteringBoundLogger = structlog.get_logger(name)
    return logger


def debug_enabled() -> bool:
    """True when debug lines are emitted; hot paths check this once to skip building them."""
    return _min_level <= logging.DEBUG
