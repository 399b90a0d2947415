"""Last-level cache ways (L3 CAT) and memory bandwidth (MBA) through the kernel's resctrl filesystem.

Kernel reference: ``Documentation/arch/x86/resctrl.rst`` (``Documentation/x86/resctrl.rst`` in
older trees) and the parser behind it, ``fs/resctrl/ctrlmondata.c`` and ``fs/resctrl/rdtgroup.c``
(``arch/x86/kernel/cpu/resctrl/`` in older trees). The section names quoted below are the doc's.

The module has two layers:

* pure arithmetic -- :func:`l3_mask`, :func:`mb_value`, :func:`schemata_lines`,
  :func:`parse_schemata` -- that never touches the filesystem;
* :class:`ResctrlFS`, the filesystem layer. Every mutation (mkdir, rmdir, file write) goes
  through a small :class:`ResctrlOps` object. On a real host that is :class:`KernelOps`:
  a plain ``os.mkdir``/``os.rmdir`` and exactly one ``write(2)`` per command. Tests pass the
  fake kernel from :mod:`runtimeproxy.hooks.testkit.fake_resctrl` instead, which populates group
  directories and validates writes the way the kernel does.

Rounding rules (the numbers a pod class asks for rarely fall on hardware steps):

* **L3 ways**, :func:`l3_mask`: with ``width`` the number of bits of ``cbm_mask``, a
  ``[start, end)`` percent range becomes bits ``[ceil(width*start/100), ceil(width*end/100))``
  -- both ends rounded *up*, the rounding koordlet uses for the same NodeSLO values
  (``docs/koordinator-parity.md``), so the same percentages give the same mask. Adjacent ranges
  never share a way. A range that covers no whole way, or fewer ways than ``min_cbm_bits``
  ("the minimum number of consecutive bits which must be set"), is refused with a
  :class:`ValueError` instead of being written: the kernel would refuse that mask anyway
  ("Cache Bit Masks (CBM)": Intel requires contiguous 1 bits, at least ``min_cbm_bits``).
* **MB percent**, :func:`mb_value`: clamp to ``[min_bandwidth, 100]`` then round *up* to a
  multiple of ``bandwidth_gran`` -- what the kernel itself stores ("Intermediate values are
  rounded to the next control step available on the hardware"; ``bw_validate()`` does
  ``roundup(bw, bw_gran)``). Pre-rounding means the value read back equals the value
  written, so a reconcile loop can compare without rewriting every time. A round-up past
  100 (only when the granularity does not divide 100) is capped at 100.

CDP (``mount -o cdp``): L3 is then split into ``L3CODE`` and ``L3DATA`` resources with half
the CLOSIDs. We detect it (:attr:`CacheInfo.cdp`) and write the *same* mask to both lines,
so a group behaves as on a non-CDP mount; only the smaller CLOSID count is visible.

MB values are percentages only on Intel with the default mount. With ``-o mba_MBps`` they are
MBps, on AMD they are in 1/8 GB/s units; :attr:`BandwidthInfo.percent` is False there and
:func:`schemata_lines` refuses an MB percentage rather than write a wrong number.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .kernel_files import read_bytes, write_bytes

__all__ = [
    "DEFAULT_ROOT",
    "RESERVED_NAMES",
    "AddTasksResult",
    "BandwidthInfo",
    "CacheInfo",
    "InvalidGroupName",
    "KernelOps",
    "ResctrlCapacityError",
    "ResctrlError",
    "ResctrlFS",
    "ResctrlInfo",
    "ResctrlOps",
    "ResctrlTasksError",
    "ResctrlUnsupported",
    "ResctrlWriteError",
    "l3_mask",
    "l3_way_range",
    "mb_value",
    "parse_schemata",
    "schemata_lines",
    "validate_group_name",
]

DEFAULT_ROOT = Path("/sys/fs/resctrl")

#: Names the kernel uses for its own directories in the resctrl root; never resource groups.
RESERVED_NAMES = frozenset({"info", "mon_groups", "mon_data"})

_GROUP_NAME = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)
_NAME_MAX = 255
_GROUP_PATHS_MAX = 1024  # group paths ResctrlFS remembers (a host has at most a few hundred CLOSIDs)
_DECIMAL = re.compile(r"[0-9]+", re.ASCII)
_HEX = re.compile(r"(?:0[xX])?[0-9a-fA-F]+", re.ASCII)

# kernfs hands a write of up to atomic_write_len (PAGE_SIZE for resctrl) to the parser in one
# piece and fails larger ones with E2BIG (fs/kernfs/file.c, kernfs_fop_write_iter).
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


# --------------------------------------------------------------------------------------
# errors


class ResctrlError(Exception):
    """Base class of everything this module raises on purpose."""


class ResctrlUnsupported(ResctrlError):
    """The host's resctrl cannot do what was asked (not mounted, no L3 CAT, no percent MBA...)."""


class InvalidGroupName(ResctrlError, ValueError):
    """A group name that is not ``[A-Za-z0-9_-]+``, is reserved, or would leave the root."""


class ResctrlCapacityError(ResctrlError):
    """No CLOSID left for another group: the root group holds one of ``num_closids``."""


class ResctrlWriteError(ResctrlError):
    """A mkdir/rmdir/write the kernel refused; carries errno and ``info/last_cmd_status``."""

    def __init__(self, action: str, path: Path, err: OSError, status: str) -> None:
        self.action = action
        self.path = path
        self.errno = err.errno
        self.status = status
        reason = os.strerror(err.errno) if err.errno else str(err)
        # Some refusals (e.g. an unknown domain id) clear last_cmd_status without a reason.
        detail = status if status and status != "ok" else "the kernel gave no reason"
        super().__init__(f"{action} {path}: {reason} (last_cmd_status: {detail})")


@dataclass(frozen=True)
class AddTasksResult:
    """What :meth:`ResctrlFS.add_tasks` did: tasks moved, and tasks gone before the write (ESRCH)."""

    moved: tuple[int, ...] = ()
    exited: tuple[int, ...] = ()
    failed: Mapping[int, str] = field(default_factory=dict)


class ResctrlTasksError(ResctrlError):
    """Some tasks could not be moved for a reason other than having exited; see ``result``."""

    def __init__(self, group: str, result: AddTasksResult) -> None:
        self.group = group
        self.result = result
        detail = "; ".join(f"{pid}: {why}" for pid, why in sorted(result.failed.items()))
        super().__init__(f"resctrl group {group!r}: could not move {len(result.failed)} task(s): {detail}")


# --------------------------------------------------------------------------------------
# pure arithmetic


def _check_percent_range(start_percent: int, end_percent: int) -> None:
    if not 0 <= start_percent < end_percent <= 100:
        raise ValueError(f"L3 percent range must satisfy 0 <= start < end <= 100, got [{start_percent}, {end_percent})")


def l3_way_range(width: int, start_percent: int, end_percent: int) -> tuple[int, int]:
    """The ways ``[lo, hi)`` that ``[start_percent, end_percent)`` of ``width`` ways stands for.

    Both ends are rounded up to a whole way (``lo = ceil(width*start/100)``,
    ``hi = ceil(width*end/100)``), as koordlet rounds; ``lo == hi`` when the range covers no
    whole way. Integer arithmetic: exact for every width and percentage.
    """
    _check_percent_range(start_percent, end_percent)
    return -(-width * start_percent // 100), -(-width * end_percent // 100)


def l3_mask(cbm_mask: int, min_cbm_bits: int, start_percent: int, end_percent: int) -> int:
    """A contiguous capacity bitmask covering ``[start_percent, end_percent)`` of the cache ways.

    ``cbm_mask`` is ``info/L3/cbm_mask`` (100% of the cache; contiguous from bit 0), so
    ``width = cbm_mask.bit_length()`` ways, and the mask is the ways of :func:`l3_way_range`.
    E.g. 11 ways: 10-50 % is ``3c``, 20-60 % is ``78``, 0-30 % is ``f``; ``0..100`` yields
    ``cbm_mask`` itself. Raises ValueError for a ``cbm_mask`` that is not a run of 1 bits from
    bit 0, a percent range outside ``0 <= start < end <= 100``, and a range whose ways are
    fewer than ``max(1, min_cbm_bits)`` (a mask the kernel refuses).
    """
    if cbm_mask <= 0 or cbm_mask & (cbm_mask + 1):
        raise ValueError(f"cbm_mask must be a non-empty run of 1 bits from bit 0, got {cbm_mask:#x}")
    if min_cbm_bits < 0:
        raise ValueError(f"min_cbm_bits must be >= 0, got {min_cbm_bits}")
    width = cbm_mask.bit_length()
    lo, hi = l3_way_range(width, start_percent, end_percent)
    need = max(1, min_cbm_bits)
    if hi - lo < need:
        raise ValueError(
            f"L3 range [{start_percent}, {end_percent}) % of {width} ways is ways [{lo}, {hi}):"
            f" {hi - lo} way(s), the cache needs at least {need}"
        )
    return ((1 << hi) - 1) ^ ((1 << lo) - 1)


def mb_value(percent: int, min_bandwidth: int, bandwidth_gran: int) -> int:
    """The MB schemata value for ``percent`` of memory bandwidth.

    Clamped to ``[min_bandwidth, 100]``, then rounded up to a multiple of ``bandwidth_gran``
    like the kernel (``bw_validate()``: ``roundup(bw, bw_gran)``; the doc: "Intermediate values
    are rounded to the next control step"), capped at 100 if that rounding overshoots. The
    result is monotonic in ``percent`` and is stored unchanged by the kernel whenever the
    granularity divides 100 (true of every Intel part: 10, or 1 on some).
    """
    if not 1 <= min_bandwidth <= 100:
        raise ValueError(f"min_bandwidth must be in 1..100 for percentage MBA, got {min_bandwidth}")
    if bandwidth_gran < 1:
        raise ValueError(f"bandwidth_gran must be >= 1, got {bandwidth_gran}")
    clamped = min(max(percent, min_bandwidth), 100)
    rounded = -(-clamped // bandwidth_gran) * bandwidth_gran
    return min(rounded, 100)


def _is_cache_resource(name: str) -> bool:
    return name.startswith(("L2", "L3"))


def parse_schemata(text: str) -> dict[str, dict[int, int]]:
    """Parse schemata text (as read, or as to be written) into ``{resource: {domain id: value}}``.

    Tolerates the kernel's display quirks: resource names right-aligned with spaces
    (``"    L3:0=7ff"``), zero-padded hex and space-padded decimals (older kernels), a trailing
    ``;``. Cache resources (``L2*``/``L3*``) are hex masks, the others (``MB``, ``SMBA``) decimal.
    Entries without ``=`` (``L3:uninitialized`` of a pseudo-lock setup group) are skipped.
    """
    result: dict[str, dict[int, int]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        name, sep, rest = line.partition(":")
        if not sep:
            raise ValueError(f"schemata line without ':': {raw!r}")
        name = name.strip()
        base = 16 if _is_cache_resource(name) else 10
        values = result.setdefault(name, {})
        for entry in rest.split(";"):
            dom, eq, value = entry.partition("=")
            if not eq:
                continue
            dom, value = dom.strip(), value.strip()
            pattern = _HEX if base == 16 else _DECIMAL
            if not _DECIMAL.fullmatch(dom) or not pattern.fullmatch(value):
                raise ValueError(f"bad schemata entry {entry!r} in line {raw!r}")
            values[int(dom)] = int(value, base)
    return result


# --------------------------------------------------------------------------------------
# what the host offers


@dataclass(frozen=True)
class CacheInfo:
    """``info/L3`` (or ``info/L3CODE`` under CDP) and the L3 cache ids of the root schemata."""

    cbm_mask: int
    min_cbm_bits: int
    num_closids: int
    shareable_bits: int
    cache_ids: tuple[int, ...]
    cdp: bool = False

    @property
    def width(self) -> int:
        """Number of cache ways one bit stands for 1/width of."""
        return self.cbm_mask.bit_length()

    @property
    def schema_names(self) -> tuple[str, ...]:
        """The schemata lines a group's L3 allocation is written to."""
        return ("L3CODE", "L3DATA") if self.cdp else ("L3",)


@dataclass(frozen=True)
class BandwidthInfo:
    """``info/MB`` and the MB domain ids of the root schemata."""

    min_bandwidth: int
    bandwidth_gran: int
    num_closids: int
    delay_linear: bool
    domain_ids: tuple[int, ...]
    #: False when MB values are not percentages: AMD (1/8 GB/s units, min_bandwidth 0) or an
    #: ``mba_MBps`` mount (root values far above 100).
    percent: bool = True


@dataclass(frozen=True)
class ResctrlInfo:
    """What a resctrl mount offers for allocation. ``l3``/``mb`` are None when absent."""

    l3: CacheInfo | None
    mb: BandwidthInfo | None
    #: The smallest num_closids over every allocation resource: the kernel's CLOSID limit.
    num_closids: int
    #: Resource names of the root schemata, e.g. ("L3", "MB") or ("L3CODE", "L3DATA", "MB").
    resources: tuple[str, ...] = ()

    @property
    def max_groups(self) -> int:
        """How many groups can exist besides the root group (which holds CLOSID 0)."""
        return max(0, self.num_closids - 1)

    @classmethod
    def from_root(cls, root: Path) -> ResctrlInfo:
        """Read ``info/`` and the root ``schemata`` of a mounted resctrl at ``root``."""
        info_dir = root / "info"
        if not info_dir.is_dir():
            raise ResctrlUnsupported(f"{root} is not a mounted resctrl filesystem (no info/ directory)")
        schemata = parse_schemata(_read(root / "schemata"))

        l3: CacheInfo | None = None
        if (info_dir / "L3").is_dir():
            l3 = _cache_info(info_dir / "L3", schemata, "L3", cdp=False)
        elif (info_dir / "L3CODE").is_dir() and (info_dir / "L3DATA").is_dir():
            l3 = _cache_info(info_dir / "L3CODE", schemata, "L3CODE", cdp=True)
            data = _cache_info(info_dir / "L3DATA", schemata, "L3DATA", cdp=True)
            if (data.cbm_mask, data.cache_ids) != (l3.cbm_mask, l3.cache_ids):
                raise ResctrlError(f"{info_dir}: L3CODE and L3DATA disagree on cbm_mask or cache ids")

        mb: BandwidthInfo | None = None
        if (info_dir / "MB").is_dir():
            mb_dir = info_dir / "MB"
            ids = _domain_ids(schemata, "MB", mb_dir)
            min_bw = _read_int(mb_dir / "min_bandwidth")
            delay = mb_dir / "delay_linear"
            mb = BandwidthInfo(
                min_bandwidth=min_bw,
                bandwidth_gran=_read_int(mb_dir / "bandwidth_gran"),
                num_closids=_read_int(mb_dir / "num_closids"),
                delay_linear=_read_int(delay) != 0 if delay.exists() else True,
                domain_ids=ids,
                percent=min_bw > 0 and all(v <= 100 for v in schemata["MB"].values()),
            )

        closids = [
            _read_int(entry / "num_closids")
            for entry in sorted(info_dir.iterdir())
            if entry.is_dir() and not entry.name.endswith("_MON") and (entry / "num_closids").exists()
        ]
        return cls(l3=l3, mb=mb, num_closids=min(closids, default=0), resources=tuple(schemata))


def _read(path: Path) -> str:
    """The file's ASCII text, newlines as text mode reads them, with plain read(2)s: a text-mode
    open costs an fstat, an ioctl and two lseeks more (``tasks`` is read at each container start)."""
    try:
        text = read_bytes(path).decode("ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ResctrlError(f"cannot read {path}: {exc}") from exc
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _read_int(path: Path, base: int = 10) -> int:
    text = _read(path).strip()
    if not (_HEX if base == 16 else _DECIMAL).fullmatch(text):
        raise ResctrlError(f"{path}: expected a base-{base} number, got {text!r}")
    return int(text, base)


def _domain_ids(schemata: Mapping[str, Mapping[int, int]], name: str, info_dir: Path) -> tuple[int, ...]:
    if name not in schemata:
        raise ResctrlError(f"{info_dir} exists but the root schemata has no {name} line")
    return tuple(sorted(schemata[name]))


def _cache_info(info_dir: Path, schemata: Mapping[str, Mapping[int, int]], name: str, *, cdp: bool) -> CacheInfo:
    cbm_mask = _read_int(info_dir / "cbm_mask", 16)
    if cbm_mask <= 0 or cbm_mask & (cbm_mask + 1):
        raise ResctrlError(f"{info_dir / 'cbm_mask'}: {cbm_mask:x} is not a run of 1 bits from bit 0")
    shareable = info_dir / "shareable_bits"
    return CacheInfo(
        cbm_mask=cbm_mask,
        min_cbm_bits=_read_int(info_dir / "min_cbm_bits"),
        num_closids=_read_int(info_dir / "num_closids"),
        shareable_bits=_read_int(shareable, 16) if shareable.exists() else 0,
        cache_ids=_domain_ids(schemata, name, info_dir),
        cdp=cdp,
    )


def schemata_lines(info: ResctrlInfo, l3_range: tuple[int, int] | None = None, mb_percent: int | None = None) -> str:
    """The schemata text for one group: a line per requested resource, every domain listed.

    ``l3_range`` is a ``(start, end)`` percent range for :func:`l3_mask` (written to ``L3``, or
    to both ``L3CODE`` and ``L3DATA`` under CDP); ``mb_percent`` goes through :func:`mb_value`.
    E.g. ``"L3:0=3f;1=3f\\nMB:0=50;1=50\\n"``. The text ends with exactly one newline, as the
    kernel requires, and contains no empty line (the kernel rejects one with "Missing ':'").
    Raises :class:`ResctrlUnsupported` for a resource the host lacks -- check ``info.l3`` /
    ``info.mb`` first to degrade gracefully.
    """
    lines: list[str] = []
    if l3_range is not None:
        l3 = info.l3
        if l3 is None:
            raise ResctrlUnsupported("L3 cache allocation is not available (no info/L3 in resctrl)")
        if not l3.cache_ids:
            raise ResctrlError("resctrl lists no L3 cache ids")
        mask = l3_mask(l3.cbm_mask, l3.min_cbm_bits, *l3_range)
        entries = ";".join(f"{cache_id}={mask:x}" for cache_id in l3.cache_ids)
        lines.extend(f"{name}:{entries}" for name in l3.schema_names)
    if mb_percent is not None:
        mb = info.mb
        if mb is None:
            raise ResctrlUnsupported("memory bandwidth allocation is not available (no info/MB in resctrl)")
        if not mb.percent:
            raise ResctrlUnsupported(
                "MB values on this host are not percentages (AMD bandwidth units or an mba_MBps mount)"
            )
        if not mb.domain_ids:
            raise ResctrlError("resctrl lists no MB domain ids")
        value = mb_value(mb_percent, mb.min_bandwidth, mb.bandwidth_gran)
        lines.append("MB:" + ";".join(f"{dom}={value}" for dom in mb.domain_ids))
    if not lines:
        raise ValueError("nothing to write: give l3_range, mb_percent or both")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# filesystem layer


class ResctrlOps(Protocol):
    """The mutations :class:`ResctrlFS` makes. Reads are plain file reads."""

    def mkdir(self, path: Path) -> None: ...

    def rmdir(self, path: Path) -> None: ...

    def write(self, path: Path, data: bytes) -> None:
        """Deliver ``data`` to the file in exactly one ``write(2)``; raise OSError on refusal."""
        ...


class KernelOps:
    """The real kernel: plain mkdir/rmdir, one write(2) per command (no O_TRUNC, no buffering)."""

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)

    def rmdir(self, path: Path) -> None:
        os.rmdir(path)

    def write(self, path: Path, data: bytes) -> None:
        if len(data) > PAGE_SIZE:
            raise OSError(errno.E2BIG, f"{len(data)} bytes exceed the {PAGE_SIZE}-byte resctrl command limit")
        write_bytes(path, data, truncate=False)


def validate_group_name(name: str) -> str:
    """Return ``name`` if it may name a group directly under the resctrl root, else raise."""
    if not isinstance(name, str) or not _GROUP_NAME.fullmatch(name):
        raise InvalidGroupName(f"resctrl group name must match [A-Za-z0-9_-]+, got {name!r}")
    if name in RESERVED_NAMES:
        raise InvalidGroupName(f"{name!r} is a resctrl directory of the kernel, not a group name")
    if len(name) > _NAME_MAX:
        raise InvalidGroupName(f"resctrl group name longer than {_NAME_MAX} characters")
    return name


def _parse_tasks(text: str, path: Path) -> set[int]:
    pids: set[int] = set()
    for line in text.split():
        if not _DECIMAL.fullmatch(line):
            raise ResctrlError(f"{path}: unexpected task id {line!r}")
        pids.add(int(line))
    return pids


class ResctrlFS:
    """Resource groups under a resctrl mount (default ``/sys/fs/resctrl``).

    Mutations take the advisory lock the doc recommends ("Locking between applications":
    ``flock(LOCK_EX)`` on the root directory), reentrant within this object, so the
    CLOSID count and the ``info/last_cmd_status`` read after a failure are not raced by
    other well-behaved writers.
    """

    def __init__(self, root: Path = DEFAULT_ROOT, *, ops: ResctrlOps | None = None) -> None:
        self.root = Path(root)
        self._resolved_root: str | None = None
        self._group_paths: dict[str, Path] = {}  # see group_path
        self._ops: ResctrlOps = ops if ops is not None else KernelOps()
        self._info: ResctrlInfo | None = None
        self._mutex = threading.RLock()
        self._lock_depth = 0
        self._lock_fd = -1

    # -- discovery ---------------------------------------------------------------------

    def available(self) -> bool:
        """True when ``root`` is a mounted resctrl (it has ``info/``)."""
        return (self.root / "info").is_dir()

    def info(self, *, refresh: bool = False) -> ResctrlInfo:
        """What the mount offers; read once and cached (``refresh=True`` re-reads, e.g. after CPU hotplug)."""
        if self._info is None or refresh:
            self._info = ResctrlInfo.from_root(self.root)
        return self._info

    def groups(self) -> list[str]:
        """Names of the control groups under the root (every directory but info/mon_groups/mon_data)."""
        with os.scandir(self.root) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False) and e.name not in RESERVED_NAMES)

    def group_path(self, name: str) -> Path:
        """``root/<name>`` for a valid group name; raises :class:`InvalidGroupName` otherwise.

        A name that passed is remembered (each PostStartContainer asks twice, about 4 lstats each):
        resctrl has no symlink operation, so a group path that resolved to itself keeps doing so,
        also when the group is removed and made again. Failures are not kept."""
        known = self._group_paths.get(name) if isinstance(name, str) else None
        if known is not None:
            return known
        validate_group_name(name)
        path = self.root / name
        if self._resolved_root is None:  # the root's resolution does not change; each group's is checked
            self._resolved_root = os.path.realpath(self.root)
        real_root = self._resolved_root
        real = os.path.realpath(path)
        if os.path.dirname(real) != real_root or os.path.basename(real) != name:
            raise InvalidGroupName(f"resctrl group {name!r} resolves to {real}, outside {real_root}")
        if len(self._group_paths) < _GROUP_PATHS_MAX:  # group names are few (CLOSIDs); bounded anyway
            self._group_paths[name] = path
        return path

    def last_cmd_status(self) -> str:
        """``info/last_cmd_status``: "ok" or the kernel's reason for the last failed command."""
        try:
            return (self.root / "info" / "last_cmd_status").read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            return ""

    # -- groups ------------------------------------------------------------------------

    def check_room_for(self, name: str) -> None:
        """Raise unless one more group fits: the root group holds one CLOSID, each group one."""
        info = self.info()
        if info.num_closids == 0:
            raise ResctrlUnsupported(f"{self.root}: no allocation resource (monitoring-only resctrl)")
        existing = self.groups()
        if len(existing) >= info.max_groups:
            raise ResctrlCapacityError(
                f"cannot create resctrl group {name!r}: the host has {info.num_closids} CLOSIDs, the root group "
                f"holds one and {len(existing)} group(s) exist ({', '.join(existing) or 'none'})"
            )

    def ensure_group(self, name: str) -> Path:
        """Create group ``name`` unless it exists; return its directory.

        Raises :class:`ResctrlCapacityError` rather than create more than ``num_closids - 1``
        groups (CLOSID 0 is the root group's: ``closid_init()`` reserves it).
        """
        path = self.group_path(name)
        with self._locked():
            if path.is_dir():
                return path
            self.check_room_for(name)
            try:
                self._ops.mkdir(path)
            except FileExistsError:
                if path.is_dir():
                    return path
                raise
            except OSError as exc:
                status = self.last_cmd_status()
                if exc.errno == errno.ENOSPC:
                    raise ResctrlCapacityError(
                        f"cannot create resctrl group {name!r}: {os.strerror(exc.errno)} (last_cmd_status: {status})"
                    ) from exc
                raise ResctrlWriteError("mkdir", path, exc, status) from exc
        return path

    def remove_group(self, name: str) -> bool:
        """Remove group ``name`` (the kernel moves its tasks back to the root group). False if absent."""
        path = self.group_path(name)
        with self._locked():
            if not path.is_dir():
                return False
            try:
                self._ops.rmdir(path)
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise ResctrlWriteError("rmdir", path, exc, self.last_cmd_status()) from exc
        return True

    # -- schemata ----------------------------------------------------------------------

    def write_schemata(self, name: str, text: str) -> None:
        """Write ``text`` (see :func:`schemata_lines`) to the group's schemata in ONE write(2).

        The kernel parses each write as a whole command and applies it all or nothing
        (``rdtgroup_schemata_write()``), so the lines must not be split over several writes.
        A missing final newline is added (the kernel requires one).
        """
        if not text.strip():
            raise ValueError("empty schemata text")
        if not text.endswith("\n"):
            text += "\n"
        data = text.encode("ascii")
        self._write(self.group_path(name) / "schemata", data)

    def schemata(self, name: str) -> dict[str, dict[int, int]]:
        """The group's current schemata, parsed (see :func:`parse_schemata`)."""
        return parse_schemata(_read(self.group_path(name) / "schemata"))

    # -- tasks -------------------------------------------------------------------------

    def add_tasks(self, name: str, pids: Iterable[int]) -> AddTasksResult:
        """Move tasks into group ``name``, one task id per write(2).

        One id per write is what every kernel accepts (only recent ones take comma lists) and
        attributes each failure to its task. Note the kernel moves the *task* (thread) whose
        id is written, not its whole thread group: pass every thread id (e.g. from the
        container's ``cgroup.threads``); threads created later inherit the group.

        Tasks that exited in the meantime (ESRCH) are reported in ``exited`` and otherwise
        ignored. Any other failure is collected; after trying every task a
        :class:`ResctrlTasksError` carrying the full :class:`AddTasksResult` is raised.
        """
        tasks_path = self.group_path(name) / "tasks"
        ids = list(pids)
        for pid in ids:
            if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
                # 0 would mean "the writing task" to the kernel: never move ourselves by accident.
                raise ValueError(f"task ids must be positive integers, got {pid!r}")
        moved: list[int] = []
        exited: list[int] = []
        failed: dict[int, str] = {}
        with self._locked():
            if not tasks_path.exists():
                raise ResctrlError(f"resctrl group {name!r} does not exist; call ensure_group() first")
            for pid in ids:
                try:
                    self._ops.write(tasks_path, f"{pid}\n".encode("ascii"))
                except OSError as exc:
                    if exc.errno == errno.ESRCH:
                        exited.append(pid)
                    else:
                        reason = os.strerror(exc.errno) if exc.errno else str(exc)
                        failed[pid] = f"{reason} (last_cmd_status: {self.last_cmd_status()})"
                else:
                    moved.append(pid)
        result = AddTasksResult(moved=tuple(moved), exited=tuple(exited), failed=failed)
        if failed:
            raise ResctrlTasksError(name, result)
        return result

    def tasks(self, name: str) -> set[int]:
        """Task ids currently in group ``name``."""
        path = self.group_path(name) / "tasks"
        return _parse_tasks(_read(path), path)

    # -- internals ---------------------------------------------------------------------

    def _write(self, path: Path, data: bytes) -> None:
        with self._locked():
            if not path.exists():
                raise ResctrlError(f"{path} does not exist; call ensure_group() first")
            try:
                self._ops.write(path, data)
            except OSError as exc:
                raise ResctrlWriteError("write", path, exc, self.last_cmd_status()) from exc

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._mutex:
            if self._lock_depth == 0:
                fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._lock_fd = fd
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
                if self._lock_depth == 0:
                    fd, self._lock_fd = self._lock_fd, -1
                    os.close(fd)  # closing the last descriptor releases the flock
