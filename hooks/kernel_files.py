"""Reading a kernel file (cgroupfs, resctrl) whole, with plain read(2)s.

A Python file object costs an fstat, an ioctl and lseeks more per open, and these files are read
at every pod and container start.
"""

from __future__ import annotations

import os

__all__ = ["read_bytes"]

_CHUNK = 65536


def read_bytes(path: str | os.PathLike[str], *, follow: bool = True) -> bytes:
    """The whole content of ``path``. With ``follow=False`` a link is not followed (OSError ELOOP).
    OSError if it cannot be opened or read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    try:
        chunks = []
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
