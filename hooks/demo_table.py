"""The cgroup values ``runtime-proxy demo`` shows for its pod: before and after the hooks.

"Before" is what kubelet (pod cgroup) and runc (container cgroup, from the CRI request as
kubelet sends it) write: :func:`runtimeproxy.hooks.explain.kubelet_seed`, the values
``runtime-hooks explain`` starts from, over a new cgroup's kernel values for the files they
leave alone. "After" is read from the node once the pod runs, "-" where the file
is missing or unreadable; the hooks' pod-level writes show up only here, never in the
proxy's ``changes=`` log lines (which list changes to CRI requests).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .cgroups import CgroupError, CgroupFS, CgroupVersion
from .explain import kubelet_seed

__all__ = ["NEW_CGROUP", "SHOWN_FILES", "CgroupTable", "CgroupValue", "format_tables", "read_table"]

#: (controller, file) shown per cgroup version: the CPU and memory values the QoS plugins manage.
SHOWN_FILES: Final[Mapping[CgroupVersion, tuple[tuple[str, str], ...]]] = {
    CgroupVersion.V1: (
        ("cpu", "cpu.cfs_quota_us"),
        ("cpu", "cpu.cfs_period_us"),
        ("cpu", "cpu.shares"),
        ("cpu", "cpu.cfs_burst_us"),
        ("memory", "memory.limit_in_bytes"),
        ("memory", "memory.soft_limit_in_bytes"),
    ),
    CgroupVersion.V2: (
        ("cpu", "cpu.max"),
        ("cpu", "cpu.weight"),
        ("cpu", "cpu.max.burst"),
        ("memory", "memory.max"),
        ("memory", "memory.high"),
        ("memory", "memory.low"),
        ("memory", "memory.min"),
    ),
}
# A new cgroup's values, where kubelet and runc write nothing (cgroup-v2.rst defaults; on v1 an
# unlimited memory counter reads PAGE_COUNTER_MAX pages: the largest page multiple in int64).
_UNLIMITED_V1: Final = str(((1 << 63) - 1) // os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PAGE_SIZE"))
NEW_CGROUP: Final[Mapping[CgroupVersion, Mapping[str, str]]] = {
    CgroupVersion.V1: {
        "cpu.cfs_quota_us": "-1",
        "cpu.cfs_period_us": "100000",
        "cpu.shares": "1024",
        "cpu.cfs_burst_us": "0",
        "memory.limit_in_bytes": _UNLIMITED_V1,
        "memory.soft_limit_in_bytes": _UNLIMITED_V1,
    },
    CgroupVersion.V2: {
        "cpu.max": "max 100000",
        "cpu.weight": "100",
        "cpu.max.burst": "0",
        "memory.max": "max",
        "memory.high": "max",
        "memory.low": "0",
        "memory.min": "0",
    },
}
MISSING: Final = "-"


@dataclass(frozen=True)
class CgroupValue:
    file: str
    before: str
    after: str

    @property
    def changed(self) -> bool:
        return self.after not in (MISSING, self.before)


@dataclass(frozen=True)
class CgroupTable:
    """One cgroup: its name in the pod ("pod" or the container's), where it is, and its values."""

    name: str
    where: str
    values: tuple[CgroupValue, ...]


def _read(fs: CgroupFS, controller: str, file: str, parent: str, container_id: str | None) -> str:
    try:
        text: str = fs.read(controller, file, parent, container_id)
    except (OSError, CgroupError):
        return MISSING
    return text


def read_table(fs: CgroupFS, name: str, parent: str, container_id: str | None, resources: Any) -> CgroupTable:
    """The table of one cgroup: kubelet's/runc's values for CRI ``resources`` against the node's now."""
    before = {**NEW_CGROUP[fs.version], **kubelet_seed(fs.version, resources)}
    values = tuple(
        CgroupValue(file, before[file], _read(fs, controller, file, parent, container_id))
        for controller, file in SHOWN_FILES[fs.version]
    )
    return CgroupTable(name, str(fs.path("cpu", parent, container_id)), values)


def format_tables(tables: Sequence[CgroupTable]) -> str:
    """Aligned text: per cgroup a heading with its path, then file, before, after, and a mark
    where the value differs from kubelet's."""
    rows = [(value.file, value.before, value.after) for table in tables for value in table.values]
    widths = [max([len(head), *(len(row[i]) for row in rows)]) for i, head in enumerate(("file", "before", "after"))]
    lines: list[str] = []
    for table in tables:
        lines.append(f"{table.name}: {table.where}")
        lines.append(f"  {'file':<{widths[0]}}  {'before':>{widths[1]}}  {'after':>{widths[2]}}")
        for value in table.values:
            mark = "  <- changed" if value.changed else ""
            lines.append(f"  {value.file:<{widths[0]}}  {value.before:>{widths[1]}}  {value.after:>{widths[2]}}{mark}")
    return "\n".join(lines)
