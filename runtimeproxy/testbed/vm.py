"""Boot a node image under qemu (TCG) and collect what its scenario reports.

The guest's root is its initramfs: the cached image archive followed by the run layer
(the kernel unpacks concatenated archives in order, later files over earlier ones), so
nothing is mounted from the host and the guest writes nothing back. ``rdinit=/sbin/init``
makes systemd PID 1 straight away; systemd 257 mounts cgroup v2 only (unified).

Serial ports: ttyS0 is the console (kernel, systemd and the scenario's progress), ttyS1
the results port (`nodeproto` lines); qemu writes both to files. The guest powers itself
off when its scenario ends; `boot` waits at most `timeout` seconds and kills qemu past
that (and on any error or interrupt), so no run leaves a qemu behind.

KVM is not used: on this kind of host (itself a VM) a KVM guest hangs at once; TCG with
``-cpu max`` works, slowly. Nothing timed inside such a guest says anything about speed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .nodeproto import Facts, parse

__all__ = ["MEMORY_MB", "QEMU", "BootResult", "VMError", "boot", "qemu_command"]

QEMU = "qemu-system-x86_64"
# The kernel command line: console on ttyS0, systemd straight from the initramfs, no
# reboot loops on a panic, quiet enough that the console log stays readable.
_APPEND = ("console=ttyS0 rdinit=/sbin/init panic=-1 loglevel=4 systemd.show_status=auto "
           "systemd.unified_cgroup_hierarchy=1")


# The guest's RAM holds its whole root (the unpacked archives, over 500 MB), the images it
# imports (twice: the tar and the native snapshots) and its pods.
MEMORY_MB = 3072


class VMError(RuntimeError):
    """qemu could not be started."""


@dataclass
class BootResult:
    """How a boot ended and what it reported."""

    returncode: int | None
    timed_out: bool
    elapsed_s: float
    console_path: Path
    results_path: Path
    facts: Facts = field(default_factory=Facts)

    def console_tail(self, lines: int = 80) -> str:
        with contextlib.suppress(OSError):
            text = self.console_path.read_text(errors="replace").replace("\r", "")
            return "\n".join(text.splitlines()[-lines:])
        return "(no console log)"


def qemu_command(kernel: Path, initrd: Path, console: Path, results: Path, *, memory_mb: int, cpus: int,
                 append: str = "") -> list[str]:
    """The qemu command line: no network, no display, no disks; two serial ports to files."""
    return [QEMU, "-accel", "tcg", "-cpu", "max", "-m", str(memory_mb), "-smp", str(cpus),
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-kernel", str(kernel), "-initrd", str(initrd), "-append", f"{_APPEND} {append}".strip(),
            "-serial", f"file:{console}", "-serial", f"file:{results}"]


def _concatenate(parts: Sequence[Path], dest: Path) -> None:
    with dest.open("wb") as out:
        for part in parts:
            with part.open("rb") as source:
                shutil.copyfileobj(source, out, 1 << 20)
            # Each archive starts on a 4-byte boundary, as the kernel's unpacker expects.
            out.write(b"\0" * (-out.tell() % 4))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def boot(kernel: Path, initrds: Sequence[Path], workdir: Path, *, timeout: float, memory_mb: int = MEMORY_MB,
         cpus: int = 2, append: str = "", progress: Callable[[str], None] | None = None) -> BootResult:
    """Boot, wait for the guest to power off (at most `timeout` s), return its facts."""
    if shutil.which(QEMU) is None:
        raise VMError(f"{QEMU} is not installed (.ci/node-deps.sh installs qemu-system-x86)")
    workdir.mkdir(parents=True, exist_ok=True)
    initrd = workdir / "initrd.img"
    _concatenate(initrds, initrd)
    console, results = workdir / "console.log", workdir / "results.log"
    cmd = qemu_command(kernel, initrd, console, results, memory_mb=memory_mb, cpus=cpus, append=append)
    (workdir / "qemu.cmd").write_text(" ".join(cmd) + "\n")
    began = time.monotonic()
    with (workdir / "qemu.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        timed_out = False
        try:
            seen = 0
            while proc.poll() is None:
                if time.monotonic() - began > timeout:
                    timed_out = True
                    break
                time.sleep(1)
                if progress is not None:
                    seen = _report_progress(results, seen, progress, began)
        finally:
            _stop(proc)
        initrd.unlink(missing_ok=True)
    text = results.read_text(errors="replace") if results.exists() else ""
    return BootResult(returncode=proc.returncode, timed_out=timed_out, elapsed_s=round(time.monotonic() - began, 1),
                      console_path=console, results_path=results, facts=parse(text))


def _report_progress(results: Path, seen: int, progress: Callable[[str], None], began: float) -> int:
    """Name each fact as it arrives (long runs are easier to follow)."""
    if not results.exists():
        return seen
    facts = parse(results.read_text(errors="replace"))
    names = list(facts.data)
    for name in names[seen:]:
        progress(f"[{time.monotonic() - began:6.1f}s] guest reported {name}")
    return len(names)
