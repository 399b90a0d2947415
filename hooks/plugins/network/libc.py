"""The C library through ctypes, with errno kept: setns(2) and the bpf(2) syscall need it."""

from __future__ import annotations

import ctypes

libc = ctypes.CDLL(None, use_errno=True)
