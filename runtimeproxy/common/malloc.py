"""Hand memory freed after large requests back to the kernel (glibc malloc tuning).

glibc raises its mmap threshold each time a large mmapped block is freed, up to 32 MiB,
so after a few large requests later ones land on the heap, whose freed pages stay with
the process. Fixing the threshold keeps every large buffer (a held 15 MiB request, its
decoded copy) in its own mapping, returned to the kernel as soon as it is freed.

`trim_every` hands back the free pages inside the heap too (malloc_trim(3)), which only
the top of the heap otherwise returns: start-up frees a few MiB of import-time garbage there, and
a daemon with several threads (runtime-hooks: gRPC's, plugin threads) spreads churn over arenas.
"""

from __future__ import annotations

import asyncio
import ctypes
from typing import Any

import structlog

log = structlog.get_logger("runtimeproxy.common.malloc")

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
LARGE_BLOCK = 256 * 1024


def _libc_function(name: str) -> Any:
    """``name`` (a ctypes function) from the C library the process runs on (its global symbols: no ctypes.util,
    whose find_library runs ldconfig and imports a megabyte of modules); None if missing."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        log.debug("C library function not available; memory tuning skipped", function=name)
        return None
    return function


def return_large_blocks_to_the_kernel() -> bool:
    """Fix glibc's mmap and trim thresholds; False (and a debug line) on other C libraries."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK)) and bool(mallopt(M_TRIM_THRESHOLD, 2 * LARGE_BLOCK))


# Free heap pages go back to the kernel this often: start-up, bursts of large requests and
# churn across threads' arenas leave some inside the heap, where glibc keeps them otherwise.
TRIM_INTERVAL = 30.0


def _malloc_trim() -> Any:
    malloc_trim = _libc_function("malloc_trim")
    if malloc_trim is not None:
        malloc_trim.argtypes = [ctypes.c_size_t]
        malloc_trim.restype = ctypes.c_int
    return malloc_trim


async def trim_every(interval: float = TRIM_INTERVAL) -> None:
    """Return the heap's free pages to the kernel (glibc's malloc_trim(0), every arena) now and
    every ``interval`` seconds, until cancelled; returns at once where the C library has no
    malloc_trim (a debug line says so). malloc_trim's result says whether anything was
    released, not whether it worked, so it does not stop the loop."""
    malloc_trim = _malloc_trim()
    while malloc_trim is not None:
        malloc_trim(0)
        await asyncio.sleep(interval)
