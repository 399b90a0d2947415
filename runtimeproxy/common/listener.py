"""Safe creation of the daemon's listening unix socket.

Binding over a path that a live server still uses silently steals its name, and
removing "stale" sockets without care deletes a live one. So: one instance per path is
enforced with an flock on ``<path>.lock``, an existing socket is removed only when nothing
answers on it, and the socket is never reachable with looser permissions than asked for.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import socket
import stat
from dataclasses import dataclass, field
from types import TracebackType

__all__ = ["BACKLOG", "AlreadyServing", "UnixListener", "open_unix_listener"]

BACKLOG = 1024
_MAX_PATH = 107  # sizeof(sun_path) - 1 on Linux
_PROBE_TIMEOUT = 1.0
_LOCK_ATTEMPTS = 100  # each retry means another process released the lock meanwhile


class AlreadyServing(Exception):
    """Another server owns the socket path (holds the lock, or answers on the socket)."""

    def __init__(self, path: str, pid: int | None = None, reason: str = "") -> None:
        self.path = path
        self.pid = pid
        detail = reason or "another instance holds its lock"
        if pid is not None:
            detail += f" (pid {pid})"
        super().__init__(f"{path} is already being served: {detail}")


@dataclass
class UnixListener:
    """A bound, listening, non-blocking unix socket plus the lock that guards its path.

    Hand ``sock`` to the server (e.g. ``asyncio.start_unix_server(sock=...)``) and call
    ``close()`` on shutdown. The lock file is removed too, while still locked; a contender
    that locked the removed file checks that its lock is on the file at the path and tries
    again otherwise, so two processes never hold locks on different inodes.
    """

    path: str
    sock: socket.socket
    lock_fd: int
    _ident: tuple[int, int] = field(repr=False)  # (st_dev, st_ino) of the file we bound
    _closed: bool = field(default=False, repr=False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        """Close the socket, unlink its file if it is still ours, then release the lock."""
        if self._closed:
            return
        self._closed = True
        self.sock.close()
        _unlink_if_ours(self.path, self._ident)
        _release_lock(self.path, self.lock_fd)

    def __enter__(self) -> UnixListener:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_unix_listener(
    path: str,
    mode: int = 0o660,
    dir_mode: int = 0o750,
    group: str | None = None,
) -> UnixListener:
    """Create, lock, bind and listen on the unix socket ``path``.

    ``group`` is a group name or numeric gid given to the socket (and to the parent
    directory if this call creates it). Raises AlreadyServing if another instance owns
    the path, FileExistsError if ``path`` is something other than a socket, ValueError
    for an unknown group or an over-long path, and OSError for other failures.
    """
    path = os.path.abspath(path)
    if len(os.fsencode(path)) > _MAX_PATH:
        raise ValueError(f"unix socket path {path!r} is longer than {_MAX_PATH} bytes")
    gid = _resolve_group(group)
    _ensure_dir(os.path.dirname(path), dir_mode, gid)
    lock_fd = _acquire_lock(path)
    try:
        _remove_stale_socket(path)
        sock, ident = _bind(path, mode, gid)
    except BaseException:
        _release_lock(path, lock_fd)
        raise
    return UnixListener(path, sock, lock_fd, ident)


def _resolve_group(group: str | None) -> int | None:
    if group is None or group == "":
        return None
    if group.isascii() and group.isdecimal():
        return int(group)  # a bare gid need not exist in /etc/group, as with chown(1)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"unknown group {group!r} (give a group name or numeric gid)") from None


def _ensure_dir(directory: str, dir_mode: int, gid: int | None) -> None:
    """Create the socket's directory if missing; only a directory we created is changed."""
    if os.path.isdir(directory):
        return
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    try:
        os.mkdir(directory, dir_mode)
    except FileExistsError:
        return  # created concurrently by someone else: not ours to chmod
    if gid is not None:
        os.chown(directory, -1, gid)
    os.chmod(directory, dir_mode)  # mkdir's mode was filtered through the umask


def _acquire_lock(path: str) -> int:
    lock_path = path + ".lock"
    for _ in range(_LOCK_ATTEMPTS):
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise AlreadyServing(path, holder) from None
        except BaseException:
            os.close(fd)
            raise
        if _is_file_at(lock_path, fd):
            break
        os.close(fd)  # locked a file its last holder removed on release: open the new one
    else:
        raise OSError(errno.EAGAIN, f"{lock_path} keeps being replaced; cannot take the lock", lock_path)
    # Record our pid so the next contender can name us in its error.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdecimal() else None


def _is_file_at(path: str, fd: int) -> bool:
    """Whether ``fd`` is the file now at ``path``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (opened.st_dev, opened.st_ino)


def _release_lock(path: str, fd: int) -> None:
    """Remove the lock file (while still holding it, and only if it is ours), then unlock."""
    lock_path = path + ".lock"
    with contextlib.suppress(OSError):
        if _is_file_at(lock_path, fd):
            os.unlink(lock_path)
    os.close(fd)  # closing the only descriptor drops the flock


def _remove_stale_socket(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(errno.EEXIST, f"{path} exists and is not a socket; refusing to replace it", path)
    if _is_live(path):
        raise AlreadyServing(path, reason="a server that does not use our lock answers on it")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _is_live(path: str) -> bool:
    """Whether something accepts connections on the socket file ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
        probe.settimeout(_PROBE_TIMEOUT)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False  # no process has it bound: a leftover from a crash
        except OSError as exc:
            # EPROTOTYPE: a live socket of another type; timeout/EAGAIN: a live server with
            # a full backlog. Both mean the name is in use.
            if exc.errno in (errno.EPROTOTYPE, errno.EAGAIN) or isinstance(exc, TimeoutError):
                return True
            raise
    return True


def _bind(path: str, mode: int, gid: int | None) -> tuple[socket.socket, tuple[int, int]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        _bind_owner_only(sock, path)
    except BaseException:
        sock.close()
        raise
    try:
        st = os.lstat(path)  # fstat on a socket fd describes the socket, not its file
        if gid is not None:
            os.chown(path, -1, gid)
        os.chmod(path, mode)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # we created it moments ago and still hold the lock
        raise
    return sock, (st.st_dev, st.st_ino)


def _bind_owner_only(sock: socket.socket, path: str) -> None:
    # bind() creates the file as 0777 & ~umask; a 0177 umask keeps it owner-only until the
    # caller's chown/chmod, so no one else can connect in between. The umask is
    # process-wide, which is acceptable during start-up.
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)


def _unlink_if_ours(path: str, ident: tuple[int, int]) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if (st.st_dev, st.st_ino) == ident:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
