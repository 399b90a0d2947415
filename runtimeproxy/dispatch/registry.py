"""Hook server registration: Koordinator-style ``*.json`` files in a directory, watched.

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
ignored. A file that cannot be used is skipped with one warning per version of the file
naming it and the reason; if an earlier version parsed, that server stays registered as it
was (a half-written file must not drop a ``Fail`` hook for a poll interval). Files are
re-read only when their (mtime_ns, size, inode) changes; an in-place edit that keeps the
size within one mtime tick goes unseen, which atomic replacement (write + rename) always
avoids.

Hostile or odd files never stop the watcher: a file over `MAX_CONFIG_BYTES` is skipped
unread (and never more than that plus one byte is read, whatever stat said); JSON nested
too deeply (RecursionError), any other error while reading or parsing one file skips that
file only; a FIFO, socket, device or directory named ``*.json`` is skipped without being
opened (and files are opened non-blocking, so one swapped in meanwhile cannot hang the
scan); a dangling symlink counts as no file, with one line saying so. Reading and parsing
run in a worker thread, so a slow disk never stalls the event loop, and each poll catches
whatever escapes, logged once per distinct error, so the next poll still applies changes.

The directory is rescanned when inotify says something in it changed, and every
`SAFETY_NET_FACTOR` poll intervals (2 s by default) besides. Without a watch (inotify
unavailable or out of watches, no directory yet, the directory removed or moved) it is polled
every poll interval, as before inotify, and watched again as soon as that works
(`runtimeproxy.common.dirwatch.DirectoryChanges`).
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

from runtimeproxy.common.dirwatch import SAFETY_NET_FACTOR, DirectoryChanges
from runtimeproxy.hookapi.defaults import MAX_TIMEOUT
from runtimeproxy.hookapi.hookpoints import HookPoint, parse_hook_point

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_CONFIG_BYTES",
    "SAFETY_NET_FACTOR",
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
_KNOWN_KEYS = frozenset({"remote-endpoint", "failure-policy", "runtime-hooks", "timeout", "index"})
# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107
# A registration is a few hundred bytes; a file this big is not one (and must not be read whole).
MAX_CONFIG_BYTES = 1 << 20
_READ_CHUNK = 64 * 1024


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
    except RecursionError:  # the C decoder recurses per nesting level, up to the recursion limit
        raise ValueError("invalid JSON: nested too deeply") from None
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

# (mtime_ns, size, inode), or why the file cannot be read: a file is re-read (and re-warned
# about) only when this changes.
_FileKey = tuple[int, int, int] | str


@dataclass(frozen=True)
class _Entry:
    key: _FileKey
    server: HookServer | None  # None: no version of the file has parsed yet


class _Skip(Exception):
    """This version of a file (``key``) cannot be used, for ``reason``."""

    def __init__(self, key: _FileKey, reason: str) -> None:
        super().__init__(reason)
        self.key = key
        self.reason = reason

    @classmethod
    def of(cls, reason: str) -> _Skip:
        """A skip that is its own key: warned about again only when the reason changes."""
        return cls(reason, reason)


def _file_key(st: os.stat_result) -> _FileKey:
    return (st.st_mtime_ns, st.st_size, st.st_ino)


_FILE_TYPES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_regular(st: os.stat_result) -> _Skip:
    kind = next((name for is_kind, name in _FILE_TYPES if is_kind(st.st_mode)), f"mode {st.st_mode:o}")
    return _Skip.of(f"not a regular file ({kind})")


def _too_big(key: _FileKey, size: int | str) -> _Skip:
    return _Skip(key, f"{size} bytes, over the {MAX_CONFIG_BYTES}-byte limit for a registration file")


def _read_capped(path: str) -> tuple[bytes, _FileKey]:
    """The content of the regular file at ``path`` and the key of the version read; never reads
    more than MAX_CONFIG_BYTES + 1 bytes, whatever its size said. Opened non-blocking, so a FIFO
    swapped in after the caller's stat cannot block the open."""
    # POSIX open(), fifo(7): with O_NONBLOCK a read-only open of a FIFO returns at once (without,
    # it waits for a writer); on a regular file the flag changes nothing.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        key = _file_key(st)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(st)
        if st.st_size > MAX_CONFIG_BYTES:
            raise _too_big(key, st.st_size)
        chunks: list[bytes] = []
        left = MAX_CONFIG_BYTES + 1
        while left > 0 and (chunk := os.read(fd, min(left, _READ_CHUNK))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if left <= 0:  # grew since the fstat
        raise _too_big(key, f"more than {MAX_CONFIG_BYTES}")
    return b"".join(chunks), key


def _parse(name: str, data: bytes, key: _FileKey) -> HookServer:
    try:
        return parse_config(name, data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _Skip(key, f"not UTF-8 at byte {exc.start}") from None
    except ConfigError as exc:
        raise _Skip(key, exc.reason) from None


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


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class HookRegistry:
    """The hook servers registered in ``directory``, kept current by watching it.

    ``servers_for`` is called on every CRI call, so the per-point lists are built once
    per change, not per lookup. The watcher reads the files in a worker thread and applies
    the result (the lists, the listeners) on the event loop thread; ``scan`` does both at
    once, blocking, for callers without a loop. ``poll_interval``: how often the directory
    is polled when inotify cannot watch it (and, times SAFETY_NET_FACTOR, when it can).
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
        self._scan_problem: str | None = None  # logged once until a scan works again
        self._task: asyncio.Task[None] | None = None
        self._watch: DirectoryChanges | None = None  # while started

    def servers_for(self, point: HookPoint) -> list[HookServer]:
        """The servers registered for ``point``, in (index, file name) order."""
        return list(self._by_point[point])

    def servers(self) -> list[HookServer]:
        """All registered servers, in (index, file name) order."""
        return list(self._servers)

    def registers(self, server: HookServer, point: HookPoint) -> bool:
        """Whether ``server``'s file still registers its endpoint for ``point`` (other fields,
        such as its timeout, may have changed since ``server`` was read)."""
        return any(s.name == server.name and s.endpoint == server.endpoint for s in self._by_point[point])

    def add_listener(self, callback: Listener) -> None:
        """Call ``callback(all servers now registered)`` after each change of the set."""
        self._listeners.append(callback)

    def scan(self) -> bool:
        """Re-read the directory now, blocking; True if the registered servers changed."""
        return self._apply(self._collect())

    async def start(self) -> None:
        """Watch the directory, scan once, then keep rescanning in a background task until
        ``stop``. Never raises for what is in the directory: a scan that fails is logged and
        tried at the next change or poll."""
        if self._task is not None:
            return
        self._watch = DirectoryChanges(self.directory, self.poll_interval, what="hook config directory", logger=log)
        self._watch.open()  # before the scan, so nothing changed in between goes unseen
        await self._poll_once()
        self._task = asyncio.create_task(self._watch_loop(self._watch), name="hook-registry-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task})  # unlike awaiting the task, lets our own cancellation through
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    async def _watch_loop(self, changes: DirectoryChanges) -> None:
        while True:
            await changes.wait()
            await self._poll_once()

    def _watching(self) -> bool:
        return self._watch is not None and self._watch.watching

    async def _poll_once(self) -> None:
        try:
            self._apply(await asyncio.to_thread(self._collect))
        except Exception as exc:  # the watcher must outlive any surprise; the next poll retries
            problem = _describe(exc)
            if problem != self._scan_problem:  # once per distinct error, not 5 times a second
                log.error("hook config scan failed", directory=self.directory, error=problem, exc_info=exc)
                self._scan_problem = problem
            return
        if self._scan_problem is not None:
            log.info("hook config scan works again", directory=self.directory)
            self._scan_problem = None

    def _collect(self) -> dict[str, _Entry]:
        """Every file's entry (blocking file I/O: the watcher runs this in a worker thread)."""
        previous = self._entries
        entries: dict[str, _Entry] = {}
        for name in self._list_directory():
            entry = self._load(name, previous.get(name))
            if entry is not None:
                entries[name] = entry
        return entries

    def _apply(self, entries: dict[str, _Entry]) -> bool:
        self._entries = entries
        return self._publish({e.server.name: e.server for e in entries.values() if e.server is not None})

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
        """The file's entry: ``previous`` if unchanged, else re-read; None if there is no file.
        Whatever goes wrong with this one file skips it alone."""
        path = os.path.join(self.directory, name)
        try:
            st = os.stat(path)  # follows symlinks: a linked file registers its target
        except FileNotFoundError:
            if not os.path.islink(path):
                return None  # removed since the listing
            # Counts as no file (its server is dropped, as for a removed file), said once.
            return self._skipped(name, previous, _Skip.of("dangling symlink (its target does not exist)"), keep=False)
        except OSError as exc:  # e.g. a symlink loop
            return self._skipped(name, previous, _Skip.of(f"stat failed: {exc.strerror or exc}"))
        if not stat.S_ISREG(st.st_mode):  # never opened: opening a FIFO would block until a writer came
            return self._skipped(name, previous, _not_regular(st))
        key = _file_key(st)
        if previous is not None and previous.key == key:
            return previous
        try:
            if st.st_size > MAX_CONFIG_BYTES:  # not even opened
                raise _too_big(key, st.st_size)
            data, key = _read_capped(path)
            return _Entry(key, _parse(name, data, key))
        except FileNotFoundError:
            return None
        except _Skip as skip:
            return self._skipped(name, previous, skip)
        except OSError as exc:
            return self._skipped(name, previous, _Skip(key, exc.strerror or str(exc)))
        except Exception as exc:  # MemoryError, a bug...: this file only
            return self._skipped(name, previous, _Skip(key, _describe(exc)))

    def _skipped(self, name: str, previous: _Entry | None, skip: _Skip, *, keep: bool = True) -> _Entry:
        """Remember ``skip.key`` so the file is not read again, nor warned about, until it changes;
        with ``keep``, a server an earlier version registered stays."""
        if previous is not None and previous.key == skip.key:
            return previous
        kept = previous.server if previous is not None and keep else None
        log.warning(
            "hook config skipped",
            file=name,
            reason=skip.reason,
            kept="previous version" if kept is not None else "nothing",
        )
        return _Entry(skip.key, kept)

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
