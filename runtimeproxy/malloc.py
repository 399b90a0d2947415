"""Hand memory freed after large requests back to the kernel (glibc malloc tuning).

glibc raises its mmap threshold each time a large mmapped block is freed, up to 32 MiB,
so after a few large requests later ones land on the heap, whose freed pages stay with
the process. Fixing the threshold keeps every large buffer (a held 15 MiB request, its
decoded copy) in its own mapping, returned to the kernel as soon as it is freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import structlog

log = structlog.get_logger("runtimeproxy.malloc")

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
LARGE_BLOCK = 256 * 1024


def return_large_blocks_to_the_kernel() -> bool:
    """Fix glibc's mmap and trim thresholds; False (and a debug line) on other C libraries."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        log.debug("mallopt not available; memory tuning skipped", libc=name)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK)) and bool(mallopt(M_TRIM_THRESHOLD, 2 * LARGE_BLOCK))
