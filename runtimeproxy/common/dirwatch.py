"""Watch one directory with Linux inotify: tell the owner "something changed" in it.

No event details reach the owner: it rescans whatever the events were, so many events read
at once make one call of ``on_change``. Watched: entries created, deleted, moved in or out,
written and closed, or with changed attributes (a ``chmod`` or a ``touch``), and the
directory itself deleted, moved or unmounted. When that last kind happens the watch is over
(``active`` turns False; the owner polls and arms a new one once the directory is back).

``DirectoryChanges`` is that owner's loop, shared by the hook registry and the policy watcher:
``await wait()`` returns whenever the directory is due a rescan (inotify saw a change; a
safety-net interval passed; a poll interval passed while nothing watches the directory).

inotify(7) and the kernel's ``include/uapi/linux/inotify.h`` give the layout read here: each
record is ``struct inotify_event { __s32 wd; __u32 mask; __u32 cookie; __u32 len; char name[]; }``
in native byte order, ``len`` counting the name's NUL terminator and padding NULs (0 when the
event is about the watched directory itself), and one read(2) returns whole records only.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import structlog

__all__ = ["SAFETY_NET_FACTOR", "WATCHED", "DirWatch", "DirectoryChanges", "InotifyEvent", "parse_events"]

log = structlog.get_logger("runtimeproxy.common.dirwatch")

# include/uapi/linux/inotify.h
IN_ATTRIB: Final = 0x00000004
IN_CLOSE_WRITE: Final = 0x00000008
IN_MOVED_FROM: Final = 0x00000040
IN_MOVED_TO: Final = 0x00000080
IN_CREATE: Final = 0x00000100
IN_DELETE: Final = 0x00000200
IN_DELETE_SELF: Final = 0x00000400
IN_MOVE_SELF: Final = 0x00000800
IN_UNMOUNT: Final = 0x00002000
IN_Q_OVERFLOW: Final = 0x00004000
IN_IGNORED: Final = 0x00008000
IN_ONLYDIR: Final = 0x01000000
# inotify_init1 flags equal O_NONBLOCK and O_CLOEXEC (inotify_init(2)).
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC

#: What the watch asks for. Not IN_MODIFY: that fires per write(2); IN_CLOSE_WRITE once per writer.
WATCHED: Final = (
    IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_CLOSE_WRITE | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF
)
#: Events after which this watch sees nothing more of the directory at its path. IN_MOVE_SELF
#: leaves the watch on the moved directory, which is no longer the one at the path.
_WATCH_OVER: Final = IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT

_LINUX = sys.platform.startswith("linux")
_HEADER: Final = struct.Struct("=iIII")  # wd, mask, cookie, len: native order, no padding
# Room for many records; the kernel needs only one header + NAME_MAX + 1 to return one.
_READ_SIZE: Final = 64 * 1024
#: While inotify watches the directory it is still rescanned this many poll intervals apart:
#: inotify sees only changes made through the watched inode, not a bind mount or overlay
#: swapped over the directory, nor the target of a symlinked file edited elsewhere, nor a
#: network file system changed by another host.
SAFETY_NET_FACTOR = 10


@dataclass(frozen=True)
class InotifyEvent:
    wd: int
    mask: int
    cookie: int
    name: str  # "" for an event about the watched directory itself


def parse_events(data: bytes) -> tuple[list[InotifyEvent], int]:
    """The whole records in ``data`` and how many bytes at its end were no whole record (the
    kernel never returns such a tail; the caller decides what a truncated buffer means)."""
    events: list[InotifyEvent] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        wd, mask, cookie, length = _HEADER.unpack_from(data, offset)
        end = offset + _HEADER.size + length
        if end > len(data):
            break
        name = data[offset + _HEADER.size : end].split(b"\0", 1)[0]
        events.append(InotifyEvent(wd, mask, cookie, os.fsdecode(name)))
        offset = end
    return events, len(data) - offset


class _Libc:
    """inotify_init1 and inotify_add_watch from the C library, loaded on first use."""

    _functions: tuple[Callable[..., int], Callable[..., int]] | None = None

    @classmethod
    def functions(cls) -> tuple[Callable[..., int], Callable[..., int]]:
        if cls._functions is None:
            if not _LINUX:
                raise OSError(errno.ENOSYS, f"inotify is Linux only, not {sys.platform}")
            # The interpreter's own symbols include the C library's (find_library would run ldconfig).
            libc = ctypes.CDLL(None, use_errno=True)
            try:
                init1, add_watch = libc.inotify_init1, libc.inotify_add_watch
            except AttributeError:
                raise OSError(errno.ENOSYS, "the C library has no inotify_init1") from None
            init1.argtypes, init1.restype = [ctypes.c_int], ctypes.c_int
            add_watch.argtypes, add_watch.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
            cls._functions = (init1, add_watch)
        return cls._functions


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


class DirWatch:
    """An inotify watch on ``directory``, read on the running event loop (``loop.add_reader``):
    one non-blocking read per wake-up, then ``on_change()`` once, whatever the read held."""

    def __init__(self, directory: str, on_change: Callable[[], None]) -> None:
        self.directory = directory
        self._on_change = on_change
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def active(self) -> bool:
        """Whether the watch still sees the directory at its path."""
        return self._fd >= 0

    def open(self) -> None:
        """Arm the watch on the running loop. OSError, and nothing left open, if it cannot be:
        no inotify (ENOSYS), instance or watch limits (EMFILE, ENOSPC), no such directory."""
        loop = asyncio.get_running_loop()
        init1, add_watch = _Libc.functions()
        fd = _check(init1(_IN_NONBLOCK | _IN_CLOEXEC), "inotify_init1")
        try:
            _check(add_watch(fd, os.fsencode(self.directory), WATCHED | IN_ONLYDIR), "inotify_add_watch")
            loop.add_reader(fd, self._readable)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._loop = fd, loop

    def close(self) -> None:
        """End the watch (closing the inotify instance drops it); safe to call again."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(fd)
        os.close(fd)

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, _READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return  # level-triggered: called again when there is something
        except OSError as exc:
            log.warning("inotify read failed; watch closed", directory=self.directory, error=str(exc))
            self.close()
        else:
            self._handle(data)
        self._on_change()

    def _handle(self, data: bytes) -> None:
        events, rest = parse_events(data)
        if rest:
            log.warning("inotify read ended inside a record", directory=self.directory, bytes_left=rest)
        if any(event.mask & _WATCH_OVER for event in events) or not data:
            self.close()


class DirectoryChanges:
    """When ``directory`` is due a rescan: ``await wait()`` returns on an inotify change, after
    ``SAFETY_NET_FACTOR`` poll intervals while watched, or after ``poll_interval`` while not.

    Without a watch (inotify unavailable or out of watches, no directory yet, the directory
    removed or moved) every ``wait`` tries to arm one; ``what`` names the directory in the log
    lines, one warning per distinct cause and one line when it is watched again, logged by
    ``logger`` (the owner's, so the lines name it). Use on one event loop; ``close`` ends the watch.
    """

    def __init__(self, directory: str, poll_interval: float, *, what: str, logger: Any = log) -> None:
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval!r}")
        self.directory = directory
        self.poll_interval = poll_interval
        self.what = what
        self._log = logger
        self._watch: DirWatch | None = None
        self._changed = asyncio.Event()  # set by the watch: rescan
        self._problem: str | None = None  # why there is no watch; logged once per cause

    @property
    def watching(self) -> bool:
        return self._watch is not None and self._watch.active

    def open(self) -> bool:
        """Arm the watch now (call before the first scan, so nothing changed in between goes
        unseen); False, logged, if it cannot be: ``wait`` polls meanwhile and tries again."""
        return self.watching or self._arm()

    async def wait(self) -> None:
        """Until a rescan is due. A watch armed here returns at once: whatever changed while
        nothing watched. The flag is cleared before the caller rescans, so a change seen
        during the rescan makes the next ``wait`` return at once."""
        if not self.watching and self._arm():
            return
        if self.watching:
            try:
                async with asyncio.timeout(self.poll_interval * SAFETY_NET_FACTOR):
                    await self._changed.wait()
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(self.poll_interval)
        self._changed.clear()

    def close(self) -> None:
        """End the watch; safe to call again (a later ``wait`` arms a new one)."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()

    def _arm(self) -> bool:
        if self._watch is not None:  # its watch ended: the directory went away or moved
            self._watch = None
            self._no_watch("the directory was removed, moved or unmounted")
        watch = DirWatch(self.directory, self._changed.set)
        try:
            watch.open()
        except OSError as exc:
            self._no_watch(exc.strerror or str(exc))
            return False
        self._watch = watch
        if self._problem is not None:
            self._log.info(f"{self.what} watched again", directory=self.directory)
            self._problem = None
        return True

    def _no_watch(self, problem: str) -> None:
        if problem != self._problem:
            self._log.warning(
                f"{self.what} not watched; polling it",
                directory=self.directory,
                error=problem,
                poll_interval_s=self.poll_interval,
            )
            self._problem = problem
