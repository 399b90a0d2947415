"""Which systemd unit a cgroup v2 directory is, and which unit properties hold a cgroup file's value.

On a node whose kubelet uses the systemd cgroup driver, systemd owns the pod slices and the
container scopes: it writes their cgroup files from the units' properties whenever it
"realizes" a unit (its start, a sibling's start or stop, ``systemctl daemon-reload``, a
property change), and so undoes a value written only into cgroupfs. kubelet therefore sets
pod-slice limits as unit properties; runtime-hooks does the same for what its plugins write
(:mod:`.systemd_sync`, :mod:`.systemd_bus`). This module is the pure part: names and values.

**Unit of a cgroup** (:func:`unit_of_cgroup`): systemd puts a slice ``a-b-c.slice`` at
``a.slice/a-b.slice/a-b-c.slice`` (it nests by dashes, :func:`~.cgroups.expand_slice`) and a
scope or service right inside its slice's directory. A directory is a unit's only where its
whole path is what systemd makes for that name: ``kubepods-burstable-pod<uid>.slice`` at
``kubepods.slice/kubepods-burstable.slice/...``, a ``cri-containerd-<id>.scope`` in it.
Anything else (a cgroupfs-driver path, a runtime's own sub-cgroup) is no unit: None.

**Properties** (:func:`unit_properties`), with the D-Bus types systemd's
``SetUnitProperties`` takes (systemd src/core/dbus-cgroup.c, ``bus_cgroup_set_property``)
and what systemd then writes (src/core/cgroup.c, ``cgroup_context_apply``)::

    file          property (type)                          value
    cpu.max       CPUQuotaPerSecUSec (t)                   "Q P": ceil(Q * 1e6 / P) µs per second;
                  CPUQuotaPeriodUSec (t)                   "max P": UINT64_MAX (no limit); P
    cpu.weight    CPUWeight (t)                            the same number (both 1..10000)
    cpuset.cpus   AllowedCPUs (ay)                         bit n % 8 of byte n // 8 for CPU n
    cpuset.mems   AllowedMemoryNodes (ay)                  the same for memory nodes
    memory.min    MemoryMin (t)                            bytes; "max" is UINT64_MAX
    memory.low    MemoryLow (t)                            (systemd's CGROUP_LIMIT_MAX,
    memory.high   MemoryHigh (t)                            "infinity")
    memory.max    MemoryMax (t)

systemd writes ``cpu.max`` back as ``CPUQuotaPerSecUSec * period / 1e6`` (at least 1 ms), so
the value is exact when ``Q * 1e6`` is a multiple of ``P``; it keeps the property across
``daemon-reload`` as ``CPUQuota=`` with two decimals of a percent (100 µs per second), so it
survives a reload unchanged when ``Q * 10000`` is a multiple of ``P`` -- with the 100 ms
period the plugins use, every quota that is a whole number of 10 µs (the cpu plugin's are
whole milli-CPUs, 100 µs each). With no limit, systemd always writes the default period
(``max 100000``). The bitmask layout is systemd's ``cpu_set_to_dbus`` (src/shared/cpu-set-util.c).

**No property** (:data:`RESET_WITHOUT_PROPERTY`): ``cpu.idle``. systemd (since v252) writes
it at every realize: ``0``, unless ``CPUWeight=idle`` -- which would also replace the
``CPUWeight`` kubelet sets for the pod, so it is not used. A value other than systemd's is
re-applied instead (:class:`.systemd_sync.SystemdSync`). Files systemd never writes need
nothing: ``cpu.max.burst`` (systemd 257 has no such setting, and the kernel keeps the burst
when ``cpu.max`` is rewritten), ``cpu.bvt_warp_ns``, ``memory.wmark_*``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from runtimeproxy.hookapi.value_bounds import parse_cpuset

from .cgroups import CgroupPathError, expand_slice

__all__ = [
    "PROPERTY_FILES",
    "RESET_WITHOUT_PROPERTY",
    "UINT64_MAX",
    "UnitProperty",
    "cpu_quota_per_sec",
    "id_mask",
    "unit_of_cgroup",
    "unit_properties",
]

#: systemd's USEC_INFINITY and CGROUP_LIMIT_MAX: "no limit" for a 't' property.
UINT64_MAX: Final = (1 << 64) - 1
_USEC_PER_SEC: Final = 1_000_000
_MAX_WEIGHT: Final = 10000
# What the kernel takes in cpu.max (kernel/sched/core.c: max_cfs_runtime, min/max_cfs_quota_period).
_MAX_QUOTA_US: Final = (1 << 44) - 1
_PERIOD_US: Final = (1000, 1_000_000)

# systemd's unit-name characters (src/basic/unit-name.h VALID_CHARS, no "@": slices and scopes
# are never templates), at most 255 bytes (UNIT_NAME_MAX counts the NUL).
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\-]{1,249}\.(?:slice|scope)", re.ASCII)

_MEMORY: Final[Mapping[str, str]] = MappingProxyType(
    {"memory.min": "MemoryMin", "memory.low": "MemoryLow", "memory.high": "MemoryHigh", "memory.max": "MemoryMax"}
)
_ID_SETS: Final[Mapping[str, str]] = MappingProxyType(
    {"cpuset.cpus": "AllowedCPUs", "cpuset.mems": "AllowedMemoryNodes"}
)

#: The cgroup v2 files that have a unit property (see the module doc).
PROPERTY_FILES: Final = frozenset({"cpu.max", "cpu.weight", *_MEMORY, *_ID_SETS})

#: Files systemd writes at every realize with no property we can set: file -> what systemd writes.
RESET_WITHOUT_PROPERTY: Final[Mapping[str, str]] = MappingProxyType({"cpu.idle": "0"})


@dataclass(frozen=True)
class UnitProperty:
    """One unit property as ``SetUnitProperties`` takes it: ``name``, its D-Bus ``signature``
    (``t``: uint64, ``ay``: bytes) and ``value``."""

    name: str
    signature: str
    value: int | bytes

    def describe(self) -> str:
        value = self.value.hex() if isinstance(self.value, bytes) else str(self.value)
        return f"{self.name}={value}"


def unit_of_cgroup(relative: str) -> str | None:
    """The systemd unit whose cgroup is the directory ``relative`` (below the v2 hierarchy root,
    ``/``-separated), or None when systemd would not put a unit of that name there."""
    parts = [part for part in relative.split("/") if part]
    if not parts or not _UNIT_NAME.fullmatch(parts[-1]):
        return None
    name, above = parts[-1], parts[:-1]
    try:
        if name.endswith(".slice"):
            return name if expand_slice(name) == parts else None
        # A scope sits in its slice's directory; right below the root it is in -.slice.
        return name if not above or expand_slice(above[-1]) == above else None
    except CgroupPathError:  # a part with an empty dash-separated piece is no slice
        return None


def cpu_quota_per_sec(quota: int, period: int) -> int:
    """``quota`` µs per ``period`` µs as systemd's CPUQuotaPerSecUSec, rounded up (never less CPU)."""
    if quota <= 0 or period <= 0:
        raise ValueError(f"quota and period must be > 0 µs, got {quota} and {period}")
    return -(-quota * _USEC_PER_SEC // period)


def id_mask(text: str) -> bytes:
    """A kernel id list (``0-3,8``) as systemd's ``ay`` bitmask: id n is bit n % 8 of byte n // 8."""
    ids = parse_cpuset(text)
    mask = bytearray((max(ids) // 8 + 1) if ids else 0)
    for ident in ids:
        mask[ident // 8] |= 1 << (ident % 8)
    return bytes(mask)


def unit_properties(file: str, text: str) -> tuple[UnitProperty, ...]:
    """The properties that make systemd write ``text`` into ``file``; () for a file with none.

    ValueError (saying why) for content the kernel would not show for that file.
    """
    text = text.strip()
    if file == "cpu.max":
        return _cpu_max(text)
    if file == "cpu.weight":
        return (UnitProperty("CPUWeight", "t", _number(text, "cpu.weight", 1, _MAX_WEIGHT)),)
    if file in _MEMORY:
        value = UINT64_MAX if text == "max" else _number(text, file, 0, UINT64_MAX - 1)
        return (UnitProperty(_MEMORY[file], "t", value),)
    if file in _ID_SETS:
        return (UnitProperty(_ID_SETS[file], "ay", id_mask(text)),)
    return ()


def _cpu_max(text: str) -> tuple[UnitProperty, ...]:
    fields = text.split()
    if len(fields) != 2:
        raise ValueError(f"cpu.max {text!r}: want '<quota>|max <period>' (a quota alone keeps an unknown period)")
    period = _number(fields[1], "cpu.max period", *_PERIOD_US)
    if fields[0] == "max":
        quota = UINT64_MAX
    else:
        quota = cpu_quota_per_sec(_number(fields[0], "cpu.max quota", 1, _MAX_QUOTA_US), period)
    return UnitProperty("CPUQuotaPerSecUSec", "t", quota), UnitProperty("CPUQuotaPeriodUSec", "t", period)


def _number(text: str, what: str, low: int, high: int = UINT64_MAX - 1) -> int:
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"{what} {text!r} is not a decimal number")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{what} {value} is outside {low}..{high}")
    return value
