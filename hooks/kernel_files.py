"""Reading a kernel file (cgroupfs, resctrl) whole, with plain read(2)s.

A Python file object costs an fstat, an ioctl and lseeks more per open, and these files are read
at every pod and container start.
"""

from __future__ import annotations

import os

__all__ = ["read_bytes"]

_CHUNK = 65536


def read_bytes(path: str | os.PathLike[str], *, follow: bool = True, one_record: bool = False) -> bytes:
    """The whole content of ``path``. With ``follow=False`` a link is not followed (OSError ELOOP).
    OSError if it cannot be opened or read.

    ``one_record``: the file is one record to the kernel (a cgroup setting's value, not a list such
    as ``tasks``), so a first read shorter than asked is all of it and the empty read that would
    say so is saved. kernfs shows such a file in one go (fs/kernfs/file.c: without a seq_next it
    ends after the first record; fs/seq_file.c grows its buffer until that record fits); a regular
    file reads short only at its end.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
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
