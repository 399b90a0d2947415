"""The OOM score in NRI mode: what a PreCreateContainer answer asks for, given to the container's process.

As the memory plugin asks and as the proxy applies it, a value is only ever raised, never
lowered (proc(5): the file holds one integer, -1000..1000; raising needs no privilege, lowering
CAP_SYS_RESOURCE). A runtime on NRI 0.7 or later takes it in the CreateContainer adjustment
(``LinuxContainerAdjustment.oom_score_adj``; :func:`adjusted_score` decides whether to set it)
and starts the process with it (hooks/nri/runtime_features.py tells the versions apart).

NRI 0.6's ContainerAdjustment has no OOM score, so there the value a plugin sets at
PreCreateContainer is remembered here by container id and written at PostStartContainer to
``/proc/<pid>/oom_score_adj`` of the container's process, whose host pid NRI gives in
``Container.pid``.

Before writing, the process must be in the container's cgroup: its ``/proc/<pid>/cgroup``
must show the very cgroup the runtime gave the container (``Container.linux.cgroups_path``),
compared by whole path components (hooks/nri/membership.py). A pid that exited and was reused
by another process, or a pid the runtime's message pairs with the wrong container, is never
touched. Processes the container forked before PostStartContainer keep the value they had
(the kernel copies oom_score_adj at fork); its later children inherit ours.

Every outcome other than "raised" or "already as high" is an :class:`OomNotApplied` naming the
cause, for the caller to log and count. Entries for containers that never start are dropped at
StopContainer (:meth:`OomScores.forget`), and at most ``limit`` are kept (the oldest go first).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..kernel_files import read_bytes, write_bytes
from .membership import ContainerCgroup

__all__ = ["OOM_SCORE_ADJ_MAX", "OOM_SCORE_ADJ_MIN", "OomApplied", "OomNotApplied", "OomScores", "adjusted_score"]

OOM_SCORE_ADJ_MIN: Final = -1000
OOM_SCORE_ADJ_MAX: Final = 1000
_DEFAULT_LIMIT: Final = 4096


class OomNotApplied(Exception):
    """The remembered OOM score could not be written; the message says why."""


def _check_range(value: int) -> None:
    if not OOM_SCORE_ADJ_MIN <= value <= OOM_SCORE_ADJ_MAX:
        raise ValueError(f"oom_score_adj {value} is outside {OOM_SCORE_ADJ_MIN}..{OOM_SCORE_ADJ_MAX}")


def adjusted_score(current: int | None, target: int) -> int | None:
    """The OOM score to put in a CreateContainer adjustment for ``target`` when the container's
    spec has ``current`` (None: the spec sets none): ``target`` when it raises the score, None
    when the spec's is already as high. ValueError outside -1000..1000."""
    _check_range(target)
    return target if current is None or target > current else None


@dataclass(frozen=True, slots=True)
class OomApplied:
    """What was found and left: ``after`` > ``before`` when written, equal when already as high."""

    pid: int
    before: int
    after: int

    @property
    def raised(self) -> bool:
        return self.after > self.before


class OomScores:
    """Remembered OOM scores by container id, applied to processes under ``proc_root``; see the module doc."""

    def __init__(self, proc_root: str | Path = "/proc", limit: int = _DEFAULT_LIMIT) -> None:
        self.proc_root = Path(proc_root)
        self.limit = limit
        self._pending: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pending)

    def remember(self, container_id: str, value: int) -> list[str]:
        """Apply ``value`` when ``container_id`` starts; ValueError outside -1000..1000 or without an id.
        The ids pushed out by ``limit`` (containers that never started), to be logged."""
        if not container_id:
            raise ValueError("no container id to remember an OOM score for")
        _check_range(value)
        self._pending[container_id] = value
        self._pending.move_to_end(container_id)
        dropped = []
        while len(self._pending) > self.limit:
            dropped.append(self._pending.popitem(last=False)[0])
        return dropped

    def forget(self, container_id: str) -> int | None:
        """Drop what was remembered for ``container_id`` (it stopped); the value, or None."""
        return self._pending.pop(container_id, None)

    def apply(self, container_id: str, pid: int, cgroups_path: str) -> OomApplied | None:
        """Raise the OOM score of ``pid`` (``container_id``'s process, in the cgroup ``cgroups_path``)
        to the remembered value. None when nothing was remembered; OomNotApplied with the cause
        when it cannot be done."""
        target = self._pending.pop(container_id, None)
        if target is None:
            return None
        if pid <= 0:
            raise OomNotApplied("the runtime gave no pid for the container")
        try:
            cgroup = ContainerCgroup.of(container_id, cgroups_path)
        except ValueError as exc:
            raise OomNotApplied(str(exc)) from None
        try:
            current = _raise_score(self.proc_root / str(pid), container_id, cgroup, target)
        except (FileNotFoundError, ProcessLookupError):  # ESRCH: the process exited in between
            raise OomNotApplied(f"process {pid} is gone (the container exited)") from None
        except OSError as exc:
            raise OomNotApplied(f"/proc/{pid}/oom_score_adj: {exc.strerror or exc}") from None
        return OomApplied(pid, current, max(current, target))


def _raise_score(process: Path, container_id: str, cgroup: ContainerCgroup, target: int) -> int:
    """The OOM score of the process at ``process`` (its /proc directory), raised to ``target`` when
    lower; OomNotApplied when the process is not in ``cgroup``. Every file is opened below that
    directory: once the process exits it stays that process's (ENOENT, ESRCH), even when its pid
    is given to another. Plain open/read/write(2)s: a file object costs an fstat, an ioctl and
    lseeks more per open (kernel_files)."""
    pid = process.name
    directory = os.open(process, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if not cgroup.holds(_read(directory, "cgroup")):
            raise OomNotApplied(
                f"process {pid} is not in the cgroup of container {container_id} ({cgroup.described}): "
                "another process, or the pid was reused; left alone"
            )
        current = _parse(_read(directory, "oom_score_adj"), pid)
        if current < target:
            # One write(2); the kernel takes an oom_score_adj write whole or fails it (oom_score_adj_write).
            write_bytes("oom_score_adj", f"{target}\n".encode("ascii"), dir_fd=directory)
        return current
    finally:
        os.close(directory)


def _read(directory: int, name: str) -> str:
    """The file ``name`` below ``directory``. Both files are one record to the kernel, shown by one
    read(2): ``cgroup`` is a single_open seq_file (fs/proc/base.c proc_cgroup_show), and
    ``oom_score_adj`` is formatted into a buffer and copied out whole (oom_score_adj_read)."""
    return read_bytes(name, one_record=True, dir_fd=directory).decode("utf-8", errors="replace")


def _parse(text: str, pid: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise OomNotApplied(f"/proc/{pid}/oom_score_adj holds {text.strip()[:40]!r}, not an integer") from None
    if not OOM_SCORE_ADJ_MIN <= value <= OOM_SCORE_ADJ_MAX:
        raise OomNotApplied(f"/proc/{pid}/oom_score_adj holds {value}, outside -1000..1000")
    return value
