"""Reading a kernel file (cgroupfs, resctrl, /proc) whole with plain read(2)s, and writing one
with a single write(2).

A Python file object costs an fstat, an ioctl and lseeks more per open, and these files are read
and written at every pod and container start.
"""

from __future__ import annotations

import errno
import os

__all__ = ["read_bytes", "write_bytes"]

_CHUNK = 65536


def read_bytes(
    path: str | os.PathLike[str], *, follow: bool = True, one_record: bool = False, dir_fd: int | None = None
) -> bytes:
    """The whole content of ``path``. With ``follow=False`` a link is not followed (OSError ELOOP).
    A relative ``path`` is taken below the directory open as ``dir_fd`` when given (openat(2)).
    OSError if it cannot be opened or read.

    ``one_record``: the file is one record to the kernel (a cgroup setting's value, not a list such
    as ``tasks``), so a first read shorter than asked is all of it and the empty read that would
    say so is saved. kernfs shows such a file in one go (fs/kernfs/file.c: without a seq_next it
    ends after the first record; fs/seq_file.c grows its buffer until that record fits); a regular
    file reads short only at its end.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW), dir_fd=dir_fd)
    try:
        first = os.read(fd, _CHUNK) if one_record else b""
        if one_record and len(first) < _CHUNK:
            return first
        chunks = [first]
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def write_bytes(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    follow: bool = True,
    dir_fd: int | None = None,
    truncate: bool = True,
) -> None:
    """``data`` into the existing file ``path`` (truncated, never created) with one write(2), as the
    kernel wants for cgroup and /proc settings; ``follow`` and ``dir_fd`` as read_bytes takes them;
    ``truncate=False`` opens it without O_TRUNC (a resctrl command file takes a command, not
    content). Such a file takes a write whole or fails it: a short write is OSError EIO."""
    flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0) | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        written = os.write(fd, data)
    finally:
        os.close(fd)
    if written != len(data):
        raise OSError(errno.EIO, f"short write to {path}: {written} of {len(data)} bytes", str(path))
