"""Hook server registration: Koordinator-style ``*.json`` files in a directory, polled.

One file registers one hook server (Koordinator's format, plus ``timeout`` and ``index``)::

    {"remote-endpoint": "/var/run/koordlet/koordlet.sock",
     "failure-policy": "Fail",
     "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer"],
     "timeout": "500ms",
     "index": 10}

* ``remote-endpoint`` (required): the server's unix socket, ``/path`` or ``unix:///path``.
* ``failure-policy``: ``Fail`` or ``Ignore``; missing, ``null`` or ``""`` means ``Ignore``
  (Koordinator does the same: Go decodes all three to the empty string).
* ``runtime-hooks``: hook point names (see ``hookpoints.HookPoint``); missing means none.
* ``timeout``: per call, seconds as a number or a Go duration string (``"500ms"``, ``"2s"``,
  ``"1m"``); default 2 s, must be > 0 and <= 120 s.
* ``index``: an integer, default 0. Servers of a hook point run in (index, file name) order.
* Other keys are ignored with a warning, so newer files still load here.

Only ``*.json`` files count; dotfiles and editor backups (``x.json~``, ``x.json.swp``) are
ignored. A file that does not parse is skipped with one warning per version of the file;
if an earlier version parsed, that server stays registered as it was (a half-written
file must not drop a ``Fail`` hook for a poll interval). Files are re-read only when their
(mtime_ns, size, inode) changes; an in-place edit that keeps the size within one mtime
tick goes unseen, which atomic replacement (write + rename) always avoids.
"""

from __future__ import annotations

import asyncio
import enum
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from runtimeproxy.dispatch.hookpoints import HookPoint, parse_hook_point

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
    "ConfigError",
    "FailurePolicy",
    "HookRegistry",
    "HookServer",
    "Listener",
    "parse_config",
    "parse_duration",
]

log = structlog.get_logger("runtimeproxy.hooks.registry")

DEFAULT_TIMEOUT = 2.0
MAX_TIMEOUT = 120.0
_KNOWN_KEYS = frozenset({"remote-endpoint", "failure-policy", "runtime-hooks", "timeout", "index"})
# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107


class FailurePolicy(enum.StrEnum):
    FAIL = "Fail"
    IGNORE = "Ignore"


@dataclass(frozen=True)
class HookServer:
    name: str  # the registration file's name, e.g. "koordlet.json"
    endpoint: str  # absolute unix socket path
    failure_policy: FailurePolicy
    hooks: frozenset[HookPoint]
    timeout: float  # seconds
    index: int


class ConfigError(ValueError):
    """A registration file that cannot be used; the message names the file and the reason."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"hook config {name}: {reason}")
        self.name = name
        self.reason = reason


Listener = Callable[[list[HookServer]], None]


# --- parsing -------------------------------------------------------------------------

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h)"
_DURATION = re.compile(rf"([+-]?)((?:{_DURATION_PART})+)")
_DURATION_PIECE = re.compile(r"([0-9]*\.?[0-9]*)(ns|us|µs|μs|ms|h|m|s)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string ("1m30s", "1.5s", "500ms"); ValueError if malformed."""
    if text in ("0", "+0", "-0"):  # Go accepts a bare zero, and only zero, without a unit
        return 0.0
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f'invalid duration {text!r} (want e.g. "500ms", "2s", "1m")')
    total = sum(float(num) * _DURATION_UNITS[unit] for num, unit in _DURATION_PIECE.findall(match.group(2)))
    return -total if match.group(1) == "-" else total


def _load_object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"top level must be a JSON object, got {type(data).__name__}")
    return data


def _endpoint(value: Any) -> str:
    if value is None or value == "":
        raise ValueError("missing remote-endpoint")
    if not isinstance(value, str):
        raise ValueError(f"remote-endpoint must be a string, got {value!r}")
    path = value.removeprefix("unix://")
    if path == value and "://" in value:
        raise ValueError(f"remote-endpoint {value!r}: only unix sockets are supported (/path or unix:///path)")
    if not path.startswith("/"):
        raise ValueError(f"remote-endpoint {value!r} must be an absolute path (/path or unix:///path)")
    if "\0" in path:
        raise ValueError("remote-endpoint contains a NUL character")
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise ValueError(f"remote-endpoint {path!r} is longer than {_MAX_SOCKET_PATH} bytes (unix socket limit)")
    return path


def _failure_policy(value: Any) -> FailurePolicy:
    if value is None or value == "":
        return FailurePolicy.IGNORE
    if isinstance(value, str) and value in FailurePolicy._value2member_map_:
        return FailurePolicy(value)
    raise ValueError(f'failure-policy must be "Fail" or "Ignore", got {value!r}')


def _hooks(value: Any) -> frozenset[HookPoint]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"runtime-hooks must be a list of hook names, got {value!r}")
    return frozenset(parse_hook_point(item) for item in value)  # its ValueError lists the valid names


def _timeout(value: Any) -> float:
    if value is None:
        return DEFAULT_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f'timeout must be seconds or a duration string like "2s", got {value!r}')
    seconds = parse_duration(value) if isinstance(value, str) else float(value)
    # json.loads accepts NaN and Infinity, hence the isfinite.
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_TIMEOUT:
        raise ValueError(f"timeout {value!r} must be > 0 and <= {MAX_TIMEOUT:g}s")
    return seconds


def _index(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"index must be an integer, got {value!r}")
    return value


def parse_config(name: str, text: str) -> HookServer:
    """The hook server registered by file ``name`` with content ``text``; ConfigError if unusable."""
    try:
        data = _load_object(text)
        server = HookServer(
            name=name,
            endpoint=_endpoint(data.get("remote-endpoint")),
            failure_policy=_failure_policy(data.get("failure-policy")),
            hooks=_hooks(data.get("runtime-hooks")),
            timeout=_timeout(data.get("timeout")),
            index=_index(data.get("index")),
        )
    except ValueError as exc:
        raise ConfigError(name, str(exc)) from None
    unknown = sorted(set(data) - _KNOWN_KEYS)
    if unknown:  # forward compatibility: a newer file still works, minus what we don't know
        log.warning("unknown keys in hook config ignored", file=name, keys=unknown)
    return server


# --- the registry ----------------------------------------------------------------------

# (mtime_ns, size, inode), or why stat failed: a file is re-read (and re-warned about) only
# when this changes.
_FileKey = tuple[int, int, int] | str


@dataclass(frozen=True)
class _Entry:
    key: _FileKey
    server: HookServer | None  # None: no version of the file has parsed yet


def _file_key(st: os.stat_result) -> _FileKey:
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _is_config_name(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".")


def _server_fields(server: HookServer) -> dict[str, Any]:
    return {
        "server": server.name,
        "endpoint": server.endpoint,
        "hooks": sorted(point.value for point in server.hooks),
        "failure_policy": str(server.failure_policy),
        "timeout": server.timeout,
        "index": server.index,
    }


def _ordered(servers: Iterable[HookServer]) -> tuple[HookServer, ...]:
    return tuple(sorted(servers, key=lambda s: (s.index, s.name)))


class HookRegistry:
    """The hook servers registered in ``directory``, kept current by polling it.

    ``servers_for`` is called on every CRI call, so the per-point lists are built once
    per change, not per lookup. Everything runs on the event loop thread: a scan is a
    listdir and a stat per file, too cheap to be worth a thread.
    """

    def __init__(self, directory: str, poll_interval: float = 0.2) -> None:
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval!r}")
        self.directory = directory
        self.poll_interval = poll_interval
        self._entries: dict[str, _Entry] = {}
        self._servers: tuple[HookServer, ...] = ()
        self._by_point: dict[HookPoint, tuple[HookServer, ...]] = {point: () for point in HookPoint}
        self._listeners: list[Listener] = []
        self._directory_problem: str | None = None  # logged once until the directory is back
        self._task: asyncio.Task[None] | None = None

    def servers_for(self, point: HookPoint) -> list[HookServer]:
        """The servers registered for ``point``, in (index, file name) order."""
        return list(self._by_point[point])

    def servers(self) -> list[HookServer]:
        """All registered servers, in (index, file name) order."""
        return list(self._servers)

    def add_listener(self, callback: Listener) -> None:
        """Call ``callback(all servers now registered)`` after each change of the set."""
        self._listeners.append(callback)

    def scan(self) -> bool:
        """Re-read the directory now; True if the registered servers changed."""
        names = self._list_directory()
        entries: dict[str, _Entry] = {}
        for name in names:
            entry = self._load(name, self._entries.get(name))
            if entry is not None:
                entries[name] = entry
        self._entries = entries
        return self._publish({e.server.name: e.server for e in entries.values() if e.server is not None})

    async def start(self) -> None:
        """Scan once, then keep polling in a background task until ``stop``."""
        if self._task is not None:
            return
        self.scan()
        self._task = asyncio.create_task(self._poll(), name="hook-registry-poll")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task})  # unlike awaiting the task, lets our own cancellation through

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                self.scan()
            except Exception:  # the watcher must outlive any surprise; the next poll retries
                log.exception("hook config scan failed", directory=self.directory)

    def _list_directory(self) -> list[str]:
        try:
            names = os.listdir(self.directory)
        except OSError as exc:
            problem = exc.strerror or str(exc)
            if problem != self._directory_problem:  # once, not every poll
                log.info("hook config directory unreadable; no hook servers", directory=self.directory, error=problem)
                self._directory_problem = problem
            return []
        if self._directory_problem is not None:
            log.info("hook config directory readable", directory=self.directory)
            self._directory_problem = None
        return sorted(name for name in names if _is_config_name(name))

    def _load(self, name: str, previous: _Entry | None) -> _Entry | None:
        """The file's entry: ``previous`` if unchanged, else re-read; None if it is gone."""
        path = os.path.join(self.directory, name)
        try:
            st = os.stat(path)  # follows symlinks: a linked file registers its target
        except FileNotFoundError:
            return None
        except OSError as exc:  # e.g. a symlink loop; a dangling symlink is FileNotFoundError: not there yet
            reason = f"stat failed: {exc.strerror or exc}"
            unchanged = previous is not None and previous.key == reason
            return previous if unchanged else self._rejected(name, previous, reason, reason)
        if not stat.S_ISREG(st.st_mode):
            return None
        if previous is not None and previous.key == _file_key(st):
            return previous
        return self._read(name, path, previous, _file_key(st))

    def _read(self, name: str, path: str, previous: _Entry | None, key: _FileKey) -> _Entry | None:
        try:
            with open(path, "rb") as file:
                key = _file_key(os.fstat(file.fileno()))  # the version actually read
                data = file.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._rejected(name, previous, key, exc.strerror or str(exc))
        try:
            return _Entry(key, parse_config(name, data.decode("utf-8")))
        except UnicodeDecodeError as exc:
            return self._rejected(name, previous, key, f"not UTF-8 at byte {exc.start}")
        except ConfigError as exc:
            return self._rejected(name, previous, key, exc.reason)

    def _rejected(self, name: str, previous: _Entry | None, key: _FileKey, reason: str) -> _Entry:
        # Recording the key means the file is not read again, nor warned about, until it changes.
        kept = previous.server if previous is not None else None
        log.warning(
            "hook config skipped",
            file=name,
            reason=reason,
            kept="previous version" if kept is not None else "nothing",
        )
        return _Entry(key, kept)

    def _publish(self, current: Mapping[str, HookServer]) -> bool:
        old = {server.name: server for server in self._servers}
        if not self._log_changes(old, current):
            return False
        self._servers = _ordered(current.values())
        self._by_point = {point: tuple(s for s in self._servers if point in s.hooks) for point in HookPoint}
        self._notify()
        return True

    @staticmethod
    def _log_changes(old: Mapping[str, HookServer], new: Mapping[str, HookServer]) -> bool:
        changed = False
        for name in sorted(old.keys() | new.keys()):
            before, after = old.get(name), new.get(name)
            if before == after:
                continue
            changed = True
            if after is None:
                assert before is not None
                log.info("hook server removed", **_server_fields(before))
            else:
                log.info("hook server added" if before is None else "hook server changed", **_server_fields(after))
        return changed

    def _notify(self) -> None:
        for callback in list(self._listeners):
            try:
                callback(list(self._servers))
            except Exception:  # one broken listener must not stop the others or the watcher
                log.exception("hook registry listener failed", listener=repr(callback))
