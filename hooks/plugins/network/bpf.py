"""The BPF program of the cgroup filter: the pod's net_cls classid as its HTB class."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from typing import Final

from .libc import libc
from .plan import MAJOR

_BPF_PROG_LOAD: Final = 5
_BPF_PROG_TYPE_SCHED_CLS: Final = 3
_BPF_FUNC_GET_CGROUP_CLASSID: Final = 17
_SYS_BPF: Final = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def classid_program(major: int = MAJOR) -> bytes:
    """r0 = bpf_get_cgroup_classid(skb); return r0 if major(r0) == ``major`` and minor(r0) != 0, else 0.

    cls_bpf (not direct-action) takes a non-zero return value as the classid, 0 as no match."""
    return b"".join(
        (
            _insn(0x85, imm=_BPF_FUNC_GET_CGROUP_CLASSID),  # call
            _insn(0xBF, dst=1, src=0),  # r1 = r0
            _insn(0x77, dst=1, imm=16),  # r1 >>= 16
            _insn(0x55, dst=1, off=4, imm=major),  # if r1 != major goto +4
            _insn(0xBF, dst=2, src=0),  # r2 = r0
            _insn(0x57, dst=2, imm=0xFFFF),  # r2 &= 0xffff
            _insn(0x15, dst=2, off=1, imm=0),  # if r2 == 0 goto +1
            _insn(0x95),  # exit
            _insn(0xB7, dst=0, imm=0),  # r0 = 0
            _insn(0x95),  # exit
        )
    )


def load_classid_program() -> int:
    """Load the program; its file descriptor (the filter keeps its own reference). OSError when the
    kernel refuses (no CAP_BPF, no BPF syscall on this architecture)."""
    number = _SYS_BPF.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"no bpf syscall number known for {platform.machine()}")
    program = classid_program()
    code = ctypes.create_string_buffer(program)
    license_ = ctypes.create_string_buffer(b"GPL")
    log_buf = ctypes.create_string_buffer(4096)
    for log_level in (0, 1):
        attr = struct.pack(
            "<IIQQIIQII16s",
            _BPF_PROG_TYPE_SCHED_CLS,
            len(program) // 8,
            ctypes.addressof(code),
            ctypes.addressof(license_),
            log_level,
            len(log_buf) if log_level else 0,
            ctypes.addressof(log_buf) if log_level else 0,
            0,
            0,
            b"rp_netcls",
        ).ljust(128, b"\0")
        buf = ctypes.create_string_buffer(attr, len(attr))
        fd = int(libc.syscall(number, _BPF_PROG_LOAD, buf, len(attr)))
        if fd >= 0:
            return fd
        error = ctypes.get_errno()
    verifier = log_buf.value.decode(errors="replace").strip()
    raise OSError(error, f"loading the net_cls BPF program failed: {os.strerror(error)}. {verifier}".strip())
