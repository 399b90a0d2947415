"""Node-side cgroup access for runtime-hooks plugins: find a pod's or container's cgroup and
read or write its files, on cgroup v1 or v2, without ever leaving the cgroup root.

Where things are (``root`` is ``--cgroup-root``, default ``/sys/fs/cgroup``):

* **Version** (:func:`detect_version`): v2 when ``root/cgroup.controllers`` exists (the
  unified hierarchy's root has it); v1 when ``root`` holds per-controller hierarchies
  (``cpu/``, ``memory/``, ``cpu,cpuacct/``...). A hybrid mount (v1 controllers plus
  ``root/unified``) counts as v1: the resource controllers live in the v1 hierarchies.
* **Pod cgroup** (:func:`parent_path`): the CRI ``cgroup_parent`` the kubelet sends. The
  cgroupfs form is a path, ``/kubepods/burstable/pod<uid>``. The systemd form is a single
  slice name, ``kubepods-burstable-pod<uid>.slice``, which systemd nests by its dashes:
  ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice``. A parent
  that already is a nested path is taken as it is.
* **Container cgroup** (:meth:`CgroupFS.container_dir_names`): a child of the pod cgroup,
  named by the runtime: ``<id>`` (containerd, cgroupfs driver), ``cri-containerd-<id>.scope``
  (containerd, systemd driver), ``crio-<id>`` / ``crio-<id>.scope`` (CRI-O), ``docker-<id>.scope``.
  The first name that exists wins; ``--cgroup-driver`` only decides which is tried first
  (and which is reported when none exists yet).
* **Directory**: v1 ``root/<controller>/<pod>/<container>``, v2 ``root/<pod>/<container>``
  (the controller only picks file names there).

Safety: parents, container ids, controller and file names are checked before any path is
built: no ``..`` or ``.`` segment, no NUL, ids and file names without ``/``. Then the full
path is resolved (symlinks followed) and must still lie under the resolved root; v1's
``cpu -> cpu,cpuacct`` links stay inside and are fine, a link out of the root is refused
with :class:`CgroupPathError`. Files are opened with ``O_NOFOLLOW``; a write is one
``write(2)``, as the kernel wants for cgroup files.

**Where writes may go** (:class:`PodRoots`): reads may look anywhere under the root, but
:meth:`CgroupFS.write` changes only pod cgroups and what lies below them (containers), and
the QoS-tier cgroups themselves, under the configured pod roots: kubelet's ``/kubepods``
(cgroupfs driver) and ``kubepods.slice`` (systemd driver) by default, its ``--cgroup-root``
in front when it has one. A pod cgroup is a proper descendant of a root, other than the
QoS-tier cgroups kubelet keeps right below it (``besteffort``, ``burstable``,
``kubepods-besteffort.slice``...). A tier is written only in itself, as Koordinator keeps
values there (:meth:`PodRoots.tiers`); nothing below a tier but pods, and no tier is ever
created. Anything else (the root cgroup, ``/system.slice``, a root itself, a container id
under a tier) is refused with :class:`CgroupScopeError`, and so is a path that passes
through a symlink below the hierarchy root (the kernel makes none there).
:meth:`CgroupFS.create_pod_cgroup` makes pod cgroups only. The one write above a pod cgroup
besides the tiers is the one kubelet makes too: enabling a controller in an ancestor's
``cgroup.subtree_control`` (v2) while the pod cgroup is created.

File names differ between versions; :data:`FILES` maps the settings plugins use to each
version's file, and the ``set_*`` helpers write the right file in the right format::

    setting        v1                              v2
    cpu quota      cpu.cfs_quota_us + _period_us   cpu.max  ("<quota>|max <period>")
    cpu shares     cpu.shares (2..262144)          cpu.weight (1..10000, converted)
    cpu burst      cpu.cfs_burst_us                cpu.max.burst
    cpu idle       cpu.idle                        cpu.idle
    group id       cpu.bvt_warp_ns (Anolis)        cpu.bvt_warp_ns (Anolis)
    memory         memory.soft_limit_in_bytes      memory.min / memory.low / memory.high

A helper for a file the kernel does not have (``cpu.cfs_burst_us`` before Linux 5.14,
``cpu.bvt_warp_ns`` outside Anolis, ``memory.min`` on v1) raises :class:`CgroupUnsupported`;
ask :meth:`CgroupFS.has_file` first to skip quietly, or read with :meth:`CgroupFS.read_if_exists`
(None for such a file: one open instead of an lstat and an open, as kernel file syscalls are most
of a pod-level hook call's cost). The helpers write first and look why only when a write fails.
A FILES file this kernel lacks is looked for once per handle (``_note_absent``; on v2 only where
its controller is enabled, as only there its absence says anything: ``_lacks_everywhere``), and
a new pod's existence is read off the lstat that resolving its path makes (``_is_dir``).

**systemd driver.** There systemd owns the pod slices and puts its own values back into them
(docs/systemd.md). Every successful :meth:`CgroupFS.write` is shown to the handle's
``listener`` (:class:`WriteListener`, a :class:`CgroupWrite`); runtime-hooks serving with
``--cgroup-driver systemd`` passes :class:`~.systemd_sync.SystemdSync`, which sets the value
as the unit's property too. Plugins call the same helpers either way. And
:meth:`CgroupFS.create_pod_cgroup` never makes a pod cgroup under that driver: kubelet makes
pod slices through systemd, and a directory made beside it would become a slice systemd
adopts and keeps after the pod is gone.
"""

from __future__ import annotations

import enum
import errno
import functools
import math
import os
import re
import stat
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, Protocol

import structlog

from runtimeproxy.common import logs
from runtimeproxy.hookapi.defaults import DEFAULT_CGROUP_ROOTS
from runtimeproxy.hookapi.merge_rules import CgroupForm

from .kernel_files import read_bytes, write_bytes

__all__ = [
    "CGROUP_ROOT",
    "CONTAINER_DIR_FORMATS",
    "DRIVERS",
    "FILES",
    "MAX_SHARES",
    "MIN_SHARES",
    "CgroupDriver",
    "CgroupError",
    "CgroupFS",
    "CgroupPathError",
    "CgroupScopeError",
    "CgroupUnsupported",
    "CgroupVersion",
    "CgroupWrite",
    "KubeTier",
    "PodRoots",
    "WeightConversion",
    "WriteListener",
    "detect_version",
    "expand_slice",
    "parent_path",
    "shares_to_weight",
    "weight_to_shares",
]

LOGGER = "runtimeproxy.hooks.cgroups"
log = structlog.get_logger(LOGGER)

CGROUP_ROOT: Final = "/sys/fs/cgroup"

CgroupDriver = CgroupForm  # kubelet's --cgroup-driver is the form of the cgroup names it makes
#: kubelet's QoS tiers that have a cgroup of their own below a pod root (Guaranteed pods sit in the root).
KubeTier = Literal["burstable", "besteffort"]
DRIVERS: Final[tuple[CgroupDriver, ...]] = ("cgroupfs", "systemd")

# kubelet's bounds for cpu.shares (pkg/kubelet/cm: MinShares, MaxShares).
MIN_SHARES: Final = 2
MAX_SHARES: Final = 262144
_MAX_WEIGHT: Final = 10000

# Controllers whose v1 hierarchy directory tells a v1 root apart from a random directory.
_V1_MARKERS: Final = ("cpu", "cpu,cpuacct", "cpuacct,cpu", "memory", "cpuset", "pids", "blkio")

_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}", re.ASCII)
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}", re.ASCII)
_CONTROLLER = re.compile(r"[a-z0-9_]+(?:,[a-z0-9_]+)*", re.ASCII)
_NAME_MAX: Final = 255


class CgroupVersion(enum.IntEnum):
    V1 = 1
    V2 = 2


class CgroupError(Exception):
    """Base class of the errors this module raises on purpose (OSErrors from the kernel pass through)."""


class CgroupPathError(CgroupError, ValueError):
    """A parent, container id, controller or file name that is malformed or would leave the cgroup root."""


class CgroupScopeError(CgroupPathError):
    """A write to a cgroup that is not a pod's or container's under the pod roots (see PodRoots)."""


class CgroupUnsupported(CgroupError):
    """Not a cgroup mount, or the file a setting needs does not exist in this version or kernel."""


# --- which file holds what -----------------------------------------------------------------

#: setting -> (v1 file, v2 file); None: the version has no such file.
FILES: Final[Mapping[str, tuple[str | None, str | None]]] = MappingProxyType(
    {
        "cpu.quota": ("cpu.cfs_quota_us", "cpu.max"),
        "cpu.period": ("cpu.cfs_period_us", "cpu.max"),
        "cpu.shares": ("cpu.shares", "cpu.weight"),
        "cpu.burst": ("cpu.cfs_burst_us", "cpu.max.burst"),
        "cpu.idle": ("cpu.idle", "cpu.idle"),
        "cpu.bvt_warp_ns": ("cpu.bvt_warp_ns", "cpu.bvt_warp_ns"),
        "cpuset.cpus": ("cpuset.cpus", "cpuset.cpus"),
        "cpuset.mems": ("cpuset.mems", "cpuset.mems"),
        "memory.limit": ("memory.limit_in_bytes", "memory.max"),
        "memory.soft_limit": ("memory.soft_limit_in_bytes", None),
        "memory.min": (None, "memory.min"),
        "memory.low": (None, "memory.low"),
        "memory.high": (None, "memory.high"),
        "memory.wmark_ratio": ("memory.wmark_ratio", "memory.wmark_ratio"),
        "memory.wmark_scale_factor": ("memory.wmark_scale_factor", "memory.wmark_scale_factor"),
        "memory.wmark_min_adj": ("memory.wmark_min_adj", "memory.wmark_min_adj"),
    }
)

#: Container directory names by runtime, "{id}" replaced; see CgroupFS.container_dir_names.
CONTAINER_DIR_FORMATS: Final[Mapping[CgroupDriver, tuple[str, ...]]] = MappingProxyType(
    {
        "cgroupfs": ("{id}", "crio-{id}", "cri-containerd-{id}.scope", "crio-{id}.scope", "docker-{id}.scope"),
        "systemd": ("cri-containerd-{id}.scope", "crio-{id}.scope", "docker-{id}.scope", "{id}", "crio-{id}"),
    }
)

#: The files of FILES: each holds one value (one record to the kernel, see kernel_files.read_bytes), and
#: belongs to a controller built into the kernel (cpu, cpuset, memory: no module adds their files).
_VALUE_FILES: Final = frozenset(name for names in FILES.values() for name in names if name is not None)

# v1 "no limit" for memory.*_in_bytes: PAGE_COUNTER_MAX pages, as the kernel prints it (4 KiB pages).
_V1_UNLIMITED = "-1"


class WeightConversion(enum.StrEnum):
    """How the OCI runtime on the node turns cpu.shares into cgroup v2 cpu.weight, which plugins
    must follow so that their weights rank with the ones the runtime writes for kubelet.

    ``linear`` (runc before 1.3.2, crun before 1.23): 2..262144 onto 1..10000 in a straight line,
    so kubelet's 1024 shares for one CPU become 39. ``log-quadratic`` (runc 1.3.2+, crun 1.23+):
    a quadratic in log2(shares) through (2, 1), (1024, 100) and (262144, 10000): 1024 becomes
    the default weight 100."""

    LINEAR = "linear"
    LOG_QUADRATIC = "log-quadratic"


def shares_to_weight(shares: int, conversion: WeightConversion = WeightConversion.LINEAR) -> int:
    """cpu.shares (2..262144, clamped) as cpu.weight (1..10000) under ``conversion``."""
    shares = min(max(shares, MIN_SHARES), MAX_SHARES)
    if conversion is WeightConversion.LINEAR:
        return 1 + ((shares - MIN_SHARES) * (_MAX_WEIGHT - 1)) // (MAX_SHARES - MIN_SHARES)
    if shares == MIN_SHARES:
        return 1
    if shares == MAX_SHARES:
        return _MAX_WEIGHT
    log = math.log2(shares)
    return math.ceil(10 ** ((log * log + 125 * log) / 612 - 7 / 34))


def weight_to_shares(weight: int, conversion: WeightConversion = WeightConversion.LINEAR) -> int:
    """The smallest cpu.shares that shares_to_weight maps to ``weight`` (1..10000, clamped)."""
    weight = min(max(weight, 1), _MAX_WEIGHT)
    if conversion is WeightConversion.LINEAR:
        return MIN_SHARES - (-((weight - 1) * (MAX_SHARES - MIN_SHARES)) // (_MAX_WEIGHT - 1))
    low, high = MIN_SHARES, MAX_SHARES  # the mapping only grows: search it
    while low < high:
        middle = (low + high) // 2
        if shares_to_weight(middle, conversion) >= weight:
            high = middle
        else:
            low = middle + 1
    return low


# --- versions and paths ----------------------------------------------------------------------


def detect_version(root: str | os.PathLike[str]) -> CgroupVersion:
    """The cgroup version mounted at ``root``; CgroupUnsupported if it looks like neither."""
    base = Path(root)
    if (base / "cgroup.controllers").is_file():
        return CgroupVersion.V2
    if any((base / name).is_dir() for name in _V1_MARKERS):
        return CgroupVersion.V1
    raise CgroupUnsupported(
        f"{base} is not a cgroup mount: no cgroup.controllers (v2) and no controller directories such as cpu/ (v1)"
    )


def expand_slice(name: str) -> list[str]:
    """The nested directories of a systemd slice: ``a-b-c.slice`` -> ``[a.slice, a-b.slice, a-b-c.slice]``.

    ``-.slice`` is the root slice (no directory). A name with an empty dash-separated part
    (``a--b.slice``, ``-a.slice``) is not a valid slice: CgroupPathError.
    """
    if not name.endswith(".slice"):
        raise CgroupPathError(f"{name!r} is not a systemd slice name (ends in .slice)")
    if name == "-.slice":
        return []
    parts = name[: -len(".slice")].split("-")
    if any(part == "" for part in parts):
        raise CgroupPathError(f"invalid systemd slice name {name!r}: empty part between dashes")
    return ["-".join(parts[: i + 1]) + ".slice" for i in range(len(parts))]


def parent_path(parent: str) -> str:
    """A CRI cgroup parent as a path relative to the hierarchy root ("" for the root itself).

    A single segment ending in ``.slice`` is a systemd slice and is nested (expand_slice);
    anything else is a cgroupfs path whose leading ``/`` means the hierarchy root.
    CgroupPathError for NUL, ``.`` or ``..`` segments, or an over-long segment.
    """
    if not isinstance(parent, str):
        raise CgroupPathError(f"cgroup parent must be a string, got {type(parent).__name__}")
    return _parent_path(parent)


# A hook call asks for its pod's few paths about ten times; the answer depends on the text alone.
@functools.lru_cache(maxsize=1024)
def _parent_path(parent: str) -> str:
    if "\0" in parent:
        raise CgroupPathError(f"cgroup parent {parent!r} contains NUL")
    segments = [segment for segment in parent.split("/") if segment]
    for segment in segments:
        if segment in (".", ".."):
            raise CgroupPathError(f"cgroup parent {parent!r} has a {segment!r} segment")
        if len(os.fsencode(segment)) > _NAME_MAX:
            raise CgroupPathError(f"cgroup parent {parent!r} has a segment longer than {_NAME_MAX} bytes")
    if len(segments) == 1 and segments[0].endswith(".slice"):
        segments = expand_slice(segments[0])
    return "/".join(segments)


def _in_dir(directory: str, name: str) -> str:
    """``os.path.join(directory, name)`` for a checked relative ``name`` (a FILES name, or one
    _check_file accepts: no separator, so plain concatenation is the join); CgroupPathError
    for any other name. Built for each file a hook call reads or writes: a FILES name is not
    matched against the pattern again."""
    if name not in _VALUE_FILES:
        _check_file(name)
    return _joined(directory, name)


def _joined(directory: str, relative: str) -> str:
    """``os.path.join(directory, relative)`` for a ``relative`` path with no leading, trailing or
    doubled separator (a checked file name, or what parent_path gives)."""
    return directory + relative if directory.endswith("/") else directory + "/" + relative


def _split(path: str) -> tuple[str, str]:
    """``os.path.split(path)``, with string operations for the absolute paths CgroupFS builds (no
    doubled separator): a new pod's paths are resolved part by part in each hook call."""
    if not path.startswith("/") or "//" in path:
        return os.path.split(path)
    cut = path.rfind("/")
    return path[:cut] or "/", path[cut + 1 :]


def _check_container_id(container_id: str) -> str:
    if not isinstance(container_id, str) or not _CONTAINER_ID.fullmatch(container_id):
        raise CgroupPathError(f"invalid container id {container_id!r} (letters, digits, '_', '.', '-'; no '/')")
    return container_id


def _check_file(name: str) -> str:
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name):
        raise CgroupPathError(f"invalid cgroup file name {name!r} (letters, digits, '_', '.', '-'; no '/')")
    return name


def _check_controller(controller: str) -> str:
    if not isinstance(controller, str) or not _CONTROLLER.fullmatch(controller):
        raise CgroupPathError(f"invalid cgroup controller {controller!r} (e.g. cpu, memory, cpu,cpuacct)")
    return controller


# kubelet's QoS-class cgroups right below a pod root (pkg/kubelet/cm qos_container_manager).
_QOS_CLASS_DIRS: Final[tuple[KubeTier, ...]] = ("besteffort", "burstable")


class PodRoots:
    """The cgroups kubelet's pods live under (``roots``: cgroupfs paths or systemd slice names,
    both forms as :func:`parent_path` reads a parent); decides which cgroups may be written.

    ValueError for a root that is malformed or is the whole hierarchy (``/``): configuration.
    """

    def __init__(self, roots: Sequence[str] = DEFAULT_CGROUP_ROOTS) -> None:
        if isinstance(roots, str):
            raise TypeError("roots is a sequence of roots, not one string")
        self.roots = tuple(roots)
        self._segments = tuple(_root_segments(root) for root in self.roots)
        self._qos_dirs = tuple(_qos_class_dirs(root) for root in self._segments)
        # problem's answers: a pure function of the parent, asked for each new path of a pod.
        self._answers: dict[str, str | None] = {}

    def __repr__(self) -> str:
        return f"PodRoots({self.roots!r})"

    def problem(self, parent: str) -> str | None:
        """Why the cgroup ``parent`` is not a pod cgroup (or one below it) under the roots; None if it is."""
        if not isinstance(parent, str):
            return self._problem(parent)
        try:
            return self._answers[parent]
        except KeyError:
            pass
        if len(self._answers) >= _RESOLVED_MAX:
            self._answers.clear()
        answer = self._answers[parent] = self._problem(parent)
        return answer

    def _problem(self, parent: str) -> str | None:
        try:
            relative = parent_path(parent)
        except CgroupPathError as exc:
            return str(exc)
        segments = tuple(relative.split("/")) if relative else ()
        for root, qos_dirs, name in zip(self._segments, self._qos_dirs, self.roots, strict=True):
            below = segments[len(root) :]
            if segments[: len(root)] != root or not below:
                continue
            if len(below) == 1 and below[0] in qos_dirs:
                return f"cgroup parent {parent!r} is the QoS-class cgroup {below[0]!r} under {name!r}, not a pod's"
            return None
        if not segments:
            return f"cgroup parent {parent!r} is the root cgroup, not a pod's"
        return f"cgroup parent {parent!r} is not below a pod cgroup root ({', '.join(self.roots) or 'none'})"

    def check(self, parent: str) -> None:
        """CgroupScopeError naming the reason unless ``parent`` is a pod cgroup or below one (see problem)."""
        problem = self.problem(parent)
        if problem is not None:
            raise CgroupScopeError(f"{problem}: runtime-hooks writes only pod and container cgroups")

    def check_write(self, parent: str, container_id: str | None = None) -> None:
        """CgroupScopeError unless ``parent`` (with ``container_id``) may be written: a pod's or
        container's cgroup (:meth:`check`), or a QoS-tier cgroup itself (no container id)."""
        if container_id is None and self.tier_of(parent) is not None:
            return
        self.check(parent)

    def tier_of(self, parent: str) -> KubeTier | None:
        """The tier (``burstable`` or ``besteffort``) when ``parent`` is exactly one of the roots'
        QoS-tier cgroups, in either form (``/kubepods/burstable``, ``kubepods-burstable.slice``)."""
        try:
            segments = tuple(parent_path(parent).split("/"))
        except CgroupPathError:
            return None
        for root, qos_dirs in zip(self._segments, self._qos_dirs, strict=True):
            if len(segments) == len(root) + 1 and segments[:-1] == root and segments[-1] in qos_dirs:
                last = segments[-1].removesuffix(".slice")
                return next(tier for tier in _QOS_CLASS_DIRS if last == tier or last.endswith(f"-{tier}"))
        return None

    def root_paths(self) -> tuple[str, ...]:
        """Each root as a nested path (``/kubepods``, ``/kubepods.slice``): where Guaranteed pods sit."""
        return tuple("/" + "/".join(root) for root in self._segments)

    def tiers(self, tier: KubeTier) -> tuple[str, ...]:
        """The cgroup of ``tier`` under each root, as a nested path: ``/kubepods/burstable`` under a
        cgroupfs root, ``/kubepods.slice/kubepods-burstable.slice`` under a slice root."""
        if tier not in _QOS_CLASS_DIRS:
            raise ValueError(f"tier must be one of {', '.join(_QOS_CLASS_DIRS)}, got {tier!r}")
        found: list[str] = []
        for root in self._segments:
            last = root[-1]
            name = f"{last.removesuffix('.slice')}-{tier}.slice" if last.endswith(".slice") else tier
            found.append("/" + "/".join((*root, name)))
        return tuple(found)


def _root_segments(root: str) -> tuple[str, ...]:
    try:
        relative = parent_path(root)
    except CgroupPathError as exc:
        raise ValueError(f"invalid pod cgroup root {root!r}: {exc}") from None
    if not relative:
        raise ValueError(f"pod cgroup root {root!r} is the whole hierarchy; name kubelet's (e.g. /kubepods)")
    return tuple(relative.split("/"))


def _qos_class_dirs(root: tuple[str, ...]) -> frozenset[str]:
    """The QoS-class cgroups' names under ``root``: ``besteffort`` (cgroupfs) or ``kubepods-besteffort.slice``."""
    stem = root[-1].removesuffix(".slice")
    return frozenset({*_QOS_CLASS_DIRS, *(f"{stem}-{qos}.slice" for qos in _QOS_CLASS_DIRS)})


def _format(value: str | int | bytes) -> bytes:
    if isinstance(value, bool):
        raise TypeError("cgroup values are numbers or strings, not booleans (write 1 or 0)")
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    raise TypeError(f"cgroup values are str, int or bytes, got {type(value).__name__}")


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").strip()


# Open/read errors meaning "no regular file there", as has_file's lstat would say: missing file or
# cgroup (ENOENT, ENOTDIR), a link refused by O_NOFOLLOW (ELOOP), a directory (EISDIR from read).
_ABSENT: Final = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EISDIR})


def _mount_points(fstype: str) -> frozenset[str]:
    """The mount points of file systems of type ``fstype`` (/proc/self/mountinfo: the 5th field, and
    the file system type after " - "); none when it cannot be read."""
    try:
        lines = read_bytes("/proc/self/mountinfo").decode("utf-8", "replace").splitlines()
    except OSError:
        return frozenset()
    mounts = (line.split() for line in lines)
    return frozenset(fields[4] for fields in mounts if "-" in fields[:-1] and fields[fields.index("-") + 1] == fstype)


def _cgroup_mounts() -> frozenset[str]:
    """The mount points of cgroup v1 hierarchies."""
    return _mount_points("cgroup")


def _cgroup2_mounts() -> frozenset[str]:
    """The mount points of cgroup v2 (unified) hierarchies."""
    return _mount_points("cgroup2")


def _lstat_mode(path: str) -> int | None:
    """``path``'s mode, not following a link; None where there is nothing to see."""
    try:
        return os.lstat(path).st_mode
    except OSError:
        return None


def _write_file(path: str | Path, data: bytes) -> None:
    """``data`` into the existing file ``path`` with one write(2), as the kernel wants for cgroup
    files; a link is not followed."""
    write_bytes(path, data, follow=False)


@dataclass(frozen=True)
class CgroupWrite:
    """One successful :meth:`CgroupFS.write`: what was written where. ``cgroup`` is the cgroup's
    directory below its hierarchy root, ``/``-separated ("" for the root)."""

    controller: str
    file: str
    data: bytes
    parent: str
    container_id: str | None
    cgroup: str


class WriteListener(Protocol):
    """Told of every successful write of a CgroupFS, right after it (in the writer's thread).
    It must not raise: the write is done either way."""

    def written(self, cgroups: CgroupFS, write: CgroupWrite) -> None: ...


# Paths whose resolution CgroupFS remembers (a few per pod and container).
_RESOLVED_MAX = 8192


class CgroupFS:
    """The cgroup hierarchy at ``root``, for ``driver`` (``cgroupfs`` or ``systemd``); see the module doc.

    The version is detected on first use (CgroupUnsupported if ``root`` is no cgroup mount)
    and cached; pass ``version`` to skip detection. Methods take the pod's CRI cgroup parent
    and optionally a container id; ``controller`` picks the v1 hierarchy (ignored on v2).
    Writes go only below ``pod_roots`` (PodRoots; kubelet's defaults when not given); each
    successful one is shown to ``listener`` when there is one.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = CGROUP_ROOT,
        driver: CgroupDriver = "cgroupfs",
        *,
        version: CgroupVersion | None = None,
        pod_roots: PodRoots | None = None,
        listener: WriteListener | None = None,
        weight_conversion: WeightConversion = WeightConversion.LINEAR,
    ) -> None:
        if driver not in DRIVERS:
            raise ValueError(f"cgroup driver must be one of {', '.join(DRIVERS)}, got {driver!r}")
        self.root = Path(root)
        self.pod_roots = pod_roots if pod_roots is not None else PodRoots()
        self.listener = listener
        self._resolved_root: str | None = None
        self._resolved_hierarchies: dict[str, str] = {}
        self._hierarchy_dirs: dict[str, str] = {}  # see _hierarchy_dir
        self._resolved: dict[str, str] = {}  # see _realpath
        # see _remembered; key: (kind, controller, parent, file, container id or None)
        self._paths: dict[tuple[str, str, str, str | None, str | None], str] = {}
        self._container_dirs: dict[tuple[str, str, str], str] = {}  # see _container_dir
        self._absent: set[tuple[str, str]] = set()  # (controller, file) this kernel lacks: see _note_absent
        self._fixed: dict[str, bool] = {}  # see _files_fixed
        self._unified_mount: bool | None = None  # root is a cgroup2 mount: see _lacks_everywhere
        self._seen: tuple[str, int | None] | None = None  # see _is_dir
        self.driver: CgroupDriver = driver
        self.weight_conversion = weight_conversion  # the node's OCI runtime's, on cgroup v2
        self._version = version

    def __repr__(self) -> str:
        return f"CgroupFS(root={str(self.root)!r}, driver={self.driver!r})"

    @property
    def version(self) -> CgroupVersion:
        if self._version is None:
            self._version = detect_version(self.root)
        return self._version

    def available(self) -> bool:
        """True when ``root`` is a cgroup v1 or v2 mount."""
        try:
            self.version  # noqa: B018 - detection is the point
        except CgroupUnsupported:
            return False
        return True

    def file_name(self, setting: str) -> str:
        """The file that holds ``setting`` (a key of FILES) in this version; CgroupUnsupported if none."""
        try:
            v1, v2 = FILES[setting]
        except KeyError:
            raise ValueError(f"unknown cgroup setting {setting!r} (known: {', '.join(FILES)})") from None
        name = v1 if self.version is CgroupVersion.V1 else v2
        if name is None:
            raise CgroupUnsupported(f"cgroup v{int(self.version)} has no file for {setting}")
        return name

    def container_dir_names(self, container_id: str) -> tuple[str, ...]:
        """The names a runtime may give the container's cgroup under its pod's, driver's first."""
        _check_container_id(container_id)
        return tuple(fmt.format(id=container_id) for fmt in CONTAINER_DIR_FORMATS[self.driver])

    # -- paths --

    def path(self, controller: str, parent: str, container_id: str | None = None, file: str | None = None) -> Path:
        """The cgroup directory (or ``file`` in it) of the pod ``parent`` / its container.

        Raises CgroupPathError for malformed input or a path that resolves outside the root.
        The path need not exist; for a container, the first existing runtime naming wins.
        """
        return Path(self._path_text(controller, parent, container_id, file))

    def _path_text(self, controller: str, parent: str, container_id: str | None, file: str | None) -> str:
        """:meth:`path` as a string (the methods here need no Path object)."""
        key = ("path", controller, parent, file, container_id)
        return self._remembered(key, self._path, controller, parent, file, container_id)

    def _path(self, controller: str, parent: str, file: str | None, container_id: str | None = None) -> str:
        target = self._target(controller, parent, container_id, file)
        self._check_inside(target)
        return target

    def pod_path(self, controller: str, parent: str, container_id: str | None = None, file: str | None = None) -> Path:
        """:meth:`path`, for a cgroup runtime-hooks may change: a pod's or container's under the pod
        roots, or a QoS tier itself (:meth:`PodRoots.check_write`), reached without a symlink below
        the hierarchy root; CgroupScopeError otherwise."""
        return Path(self._pod_path_text(controller, parent, container_id, file))

    def _pod_path_text(self, controller: str, parent: str, container_id: str | None, file: str | None) -> str:
        """:meth:`pod_path` as a string. A file's is its checked directory's and its checked name:
        _pod_path checks a file's path by its directory alone, so each new file of a pod costs a
        join, not a path build and a resolution lookup."""
        key = ("pod", controller, parent, None, container_id)
        directory = self._remembered(key, self._pod_dir, controller, parent, None, container_id)
        return directory if file is None else _in_dir(directory, file)

    def _pod_dir(self, controller: str, parent: str, file: str | None, container_id: str | None) -> str:
        """:meth:`_pod_path` of a directory, remembered as :meth:`path`'s too: a pod path is a path
        inside the root (its resolution is below the resolved hierarchy root), so the reads that
        follow a write check (exists, read_if_exists) need not build and check it again."""
        directory = self._pod_path(controller, parent, file, container_id)
        key = ("path", controller, parent, None, container_id)
        if container_id is None or (controller, parent, container_id) in self._container_dirs:
            self._paths.setdefault(key, directory)  # bounded with them: _remembered clears both kinds
        return directory

    def _pod_path(self, controller: str, parent: str, file: str | None, container_id: str | None = None) -> str:
        self.pod_roots.check_write(parent, container_id)
        target = self._target(controller, parent, container_id, file)
        directory = os.path.dirname(target) if file is not None else target
        # One resolution answers both questions: a directory that resolves to exactly where
        # its name says, below the resolved hierarchy root, is inside the root and symlink-free.
        # (The pod roots check above keeps the hierarchy root itself out: directory is below it.)
        expected = self._real_hierarchy(controller) + directory[len(self._hierarchy_dir(controller)) :]
        real = self._realpath(directory)
        if real != expected:
            self._check_inside(directory)  # outside the root altogether: say that first
            raise CgroupScopeError(f"{directory} passes through a symlink ({real})")
        return target

    def _target(self, controller: str, parent: str, container_id: str | None, file: str | None) -> str:
        """The path as a string: built with string joins, not pathlib, as a new pod's paths are
        built several times per hook call (the same text: parent_path leaves no empty, "." or ".."
        segment for pathlib to normalise)."""
        _check_controller(controller)
        base = self._hierarchy_dir(controller)
        relative = parent_path(parent)
        directory = _joined(base, relative) if relative else base
        if container_id is not None:
            directory = self._container_dir(controller, parent, directory, container_id)
        return _in_dir(directory, file) if file is not None else directory

    def _container_dir(self, controller: str, parent: str, pod_dir: str, container_id: str) -> str:
        """The container's directory under ``pod_dir``: the first of its runtime namings that
        exists, else the driver's naming. One found is remembered: a container id is never
        reused, so its cgroup keeps the name it was made with (a removed one is simply missing,
        as the driver's naming would be); one not found yet is looked up again next time."""
        key = (controller, parent, container_id)
        found = self._container_dirs.get(key)
        if found is not None:
            return found
        names = self.container_dir_names(container_id)
        for name in names:
            path = os.path.join(pod_dir, name)
            if self._looked_up_dir(path):
                if len(self._container_dirs) >= _RESOLVED_MAX:
                    self._container_dirs.clear()
                self._container_dirs[key] = path
                return path
        return os.path.join(pod_dir, names[0])

    def _looked_up_dir(self, path: str) -> bool:
        """``os.path.isdir(path)`` for a container's directory, with an lstat that also serves as the
        resolution the path checks make next (_realpath, and _is_dir's _seen): a directory that is
        no link resolves to its parent's resolution plus its name, so a new container's cgroup costs
        one lstat per hierarchy, not a stat and an lstat. A link is left to isdir and _realpath."""
        mode = _lstat_mode(path)
        if mode is not None and stat.S_ISLNK(mode):
            return os.path.isdir(path)
        parent, name = _split(path)
        if path.startswith("/") and name not in ("", ".", ".."):  # as _realpath takes a plain path
            real = _joined(self._realpath(parent), name)
            if len(self._resolved) >= _RESOLVED_MAX:
                self._resolved.clear()
            self._resolved[path] = real
            self._seen = (path, mode)
        return mode is not None and stat.S_ISDIR(mode)

    def _real_hierarchy(self, controller: str) -> str:
        # Like the root's, a hierarchy root's resolution does not change while the server runs.
        real = self._resolved_hierarchies.get(controller)
        if real is None:
            base = self._hierarchy_dir(controller)
            self._check_inside(base)  # e.g. v1's cpu -> cpu,cpuacct: a link, but inside the root
            real = self._resolved_hierarchies[controller] = os.path.realpath(base)
        return real

    def _hierarchy(self, controller: str) -> Path:
        """The directory of the hierarchy root cgroup that ``controller``'s files are in."""
        return self.root / controller if self.version is CgroupVersion.V1 else self.root

    def _hierarchy_dir(self, controller: str) -> str:
        """:meth:`_hierarchy` as a string, remembered (the version and root do not change)."""
        base = self._hierarchy_dirs.get(controller)
        if base is None:
            base = self._hierarchy_dirs[controller] = str(self._hierarchy(controller))
        return base

    def _check_inside(self, target: str | Path) -> None:
        real_root = self._real_root()
        real = self._realpath(target)
        if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
            raise CgroupPathError(f"{target} resolves to {real}, outside the cgroup root {real_root}")

    def retain(self, parents: Collection[str]) -> int:
        """Keep what is remembered of the paths of the pods ``parents`` (the live ones) and drop the
        rest, so the caches hold today's pods rather than every pod the node ever ran (a pod that
        lived between two reconcile rounds is never seen gone). Resolutions are simply dropped:
        they come back with one lstat each. Returns how many entries went."""
        live = frozenset(parents)
        before = len(self._paths) + len(self._resolved) + len(self._container_dirs)
        self._paths = {key: path for key, path in self._paths.items() if key[2] in live}
        self._container_dirs = {key: path for key, path in self._container_dirs.items() if key[1] in live}
        self._resolved = {}
        return before - len(self._paths) - len(self._container_dirs)

    def _remembered(
        self,
        key: tuple[str, str, str, str | None, str | None],
        find: Callable[[str, str, str | None, str | None], str],
        *args: Any,
    ) -> str:
        """A checked path, remembered: a plugin call asks for the same few paths many times (a
        build and checks, about 15 us each, most of a write's cost). Sound for the reason
        :meth:`_realpath` is; a container's path is kept only once its cgroup was found (its
        naming is looked up in the tree: :meth:`_container_dir`). Failures are not kept;
        bounded like _realpath."""
        path = self._paths.get(key)
        if path is None:
            path = find(*args)
            container = key[4]
            if container is None or (key[1], key[2], container) in self._container_dirs:
                if len(self._paths) >= _RESOLVED_MAX:
                    self._paths.clear()
                self._paths[key] = path
        return path

    def _realpath(self, path: str | os.PathLike[str]) -> str:
        """``os.path.realpath``, remembered: every check resolves a pod's few paths again and
        again (about 50 us each, most of a plugin call). Sound because no symlink can appear
        below a hierarchy root on a real cgroup filesystem: cgroupfs has no symlink operation,
        so a path that once resolved to itself keeps doing so. Bounded: a full cache starts
        over. A path is its parent's resolution (remembered in turn) plus its last part unless
        that is a link: one lstat for a new path instead of one per part, and the same answer as
        os.path.realpath's (a link, or a part such as "..", is left to os.path.realpath)."""
        key = str(path)
        real = self._resolved.get(key)
        if real is None:
            if len(self._resolved) >= _RESOLVED_MAX:
                self._resolved.clear()
            parent, name = _split(key)
            plain = name not in ("", ".", "..") and key.startswith("/")
            mode = _lstat_mode(key) if plain else None
            if not plain or (mode is not None and stat.S_ISLNK(mode)):
                real = os.path.realpath(key)
            else:
                real = _joined(self._realpath(parent), name)
            self._resolved[key] = real
            self._seen = (key, mode) if plain else None
        return real

    def _real_root(self) -> str:
        # The root's own resolution does not change while the server runs; every target's
        # resolution is still checked afresh, which is what keeps writes inside it.
        if self._resolved_root is None:
            self._resolved_root = os.path.realpath(self.root)
        return self._resolved_root

    def exists(self, parent: str, container_id: str | None = None, controller: str = "cpu") -> bool:
        """Whether the pod's (or container's) cgroup directory exists."""
        self._seen = None
        return self._is_dir(self._path_text(controller, parent, container_id, None))

    def pod_cgroup_exists(self, controller: str, parent: str) -> bool:
        """Whether the pod cgroup ``parent`` exists, checked first as :meth:`pod_path` checks it."""
        self._seen = None
        return self._is_dir(self._pod_path_text(controller, parent, None, None))

    def _is_dir(self, path: str) -> bool:
        """``os.path.isdir(path)`` for a path just resolved, after _seen was cleared: a new path's
        resolution has lstat'ed it (_realpath), and what is no link there is what isdir would find,
        so a new pod's first look costs one syscall, not two."""
        seen, self._seen = self._seen, None
        if seen is not None and seen[0] == path and (seen[1] is None or not stat.S_ISLNK(seen[1])):
            return seen[1] is not None and stat.S_ISDIR(seen[1])
        return os.path.isdir(path)

    def has_file(self, controller: str, file: str, parent: str, container_id: str | None = None) -> bool:
        """Whether the cgroup has ``file`` (kernel features show up as files). A link is no cgroup file."""
        directory = self._path_text(controller, parent, container_id, None)  # checked even when absent
        if (controller, file) in self._absent:  # a FILES name: checked when it was noted
            return False
        path = _in_dir(directory, file)
        try:
            return stat.S_ISREG(os.lstat(path).st_mode)
        except OSError as exc:  # missing (or unreadable directory): no such file, as os.path.isfile says
            self._note_absent(exc, controller, file, path, parent, container_id)
            return False

    def _note_absent(
        self, exc: OSError, controller: str, file: str, path: str, parent: str, container_id: str | None
    ) -> None:
        """Remember that this kernel lacks ``file`` (a FILES one) when a pod's or container's existing
        cgroup has none where that proves it (_lacks_everywhere): every later probe of it (a kernel
        feature such as cpu.bvt_warp_ns, cpu.idle, memory.wmark_*) would find none either."""
        if (
            exc.errno == errno.ENOENT
            and file in _VALUE_FILES
            and (container_id is not None or parent_path(parent))  # the root cgroup lacks some files
            and self._lacks_everywhere(controller, file, os.path.dirname(path))
        ):
            self._absent.add((controller, file))

    def _lacks_everywhere(self, controller: str, file: str, directory: str) -> bool:
        """Whether ``file`` missing from the non-root cgroup ``directory`` means no cgroup has it.

        A controller's interface files are the kernel's (its cftypes; the controllers of FILES are
        built in, no module adds files). On a v1 mount every cgroup of a hierarchy gets all of them
        (_files_fixed), so an existing cgroup without the file settles it. On v2 a cgroup has a
        controller's files only while the controller is enabled for it (listed in its
        cgroup.controllers, cgroup-v2.rst "Enabling and Disabling"), so a file can be missing just
        because its controller is off in that subtree: only a cgroup that lists the controller (the
        file name's prefix) settles it, and one that does not proves nothing. Neither holds in a tree
        of plain files (a test's), where files come and go."""
        if self.version is CgroupVersion.V1:
            return self._files_fixed(controller) and os.path.isdir(directory)
        if self._unified_mount is None:
            self._unified_mount = self._real_root() in _cgroup2_mounts()
        if not self._unified_mount:
            return False
        try:
            enabled = read_bytes(_joined(directory, "cgroup.controllers"), follow=False, one_record=True).split()
        except OSError:  # no such cgroup (any more): nothing learnt
            return False
        return file.partition(".")[0].encode() in enabled

    def lacks(self, controller: str, file: str) -> bool:
        """Whether this kernel is known to lack ``file`` in ``controller``'s cgroups (learnt when a
        probe missed it; see _note_absent): a caller may leave it out without building a path."""
        return (controller, file) in self._absent

    def _files_fixed(self, controller: str) -> bool:
        """Whether every non-root cgroup of ``controller`` has the same files while the server runs: on a
        cgroup v1 hierarchy mounted as such (cgroup_addrm_files gives each cgroup its controllers'
        files). Not on v2, where a cgroup's files follow the controllers enabled for it, nor in a tree of
        plain files (a test's), where files come and go."""
        fixed = self._fixed.get(controller)
        if fixed is None:
            fixed = self.version is CgroupVersion.V1 and self._real_hierarchy(controller) in _cgroup_mounts()
            self._fixed[controller] = fixed
        return fixed

    def _file_text(self, controller: str, parent: str, container_id: str | None, file: str) -> str:
        """``file``'s path for has_file and read: its cgroup's checked directory (remembered) and the
        checked name. The file itself is not resolved (an lstat per new file saved): neither follows
        it (lstat, O_NOFOLLOW), so a link there cannot lead out of the root (cgroupfs has none)."""
        return _in_dir(self._path_text(controller, parent, container_id, None), file)

    # -- raw access --

    def read(self, controller: str, file: str, parent: str, container_id: str | None = None) -> str:
        """The content of ``file``, surrounding whitespace stripped. OSError if it cannot be read
        (ELOOP: the file is a link)."""
        path = self._file_text(controller, parent, container_id, file)
        return _text(read_bytes(path, follow=False, one_record=file in _VALUE_FILES))

    def read_if_exists(self, controller: str, file: str, parent: str, container_id: str | None = None) -> str | None:
        """:meth:`read`, or None where :meth:`has_file` says False (no such file or cgroup, a link,
        a directory): one open answers both, saving has_file's lstat per file. Other errors
        (EACCES, EIO...) are raised as read raises them."""
        directory = self._path_text(controller, parent, container_id, None)  # checked even when absent
        if (controller, file) in self._absent:  # a FILES name: checked when it was noted
            return None
        path = _in_dir(directory, file)
        try:
            return _text(read_bytes(path, follow=False, one_record=file in _VALUE_FILES))
        except OSError as exc:
            if exc.errno in _ABSENT:
                self._note_absent(exc, controller, file, path, parent, container_id)
                return None
            raise

    def write(
        self, controller: str, file: str, value: str | int | bytes, parent: str, container_id: str | None = None
    ) -> None:
        """Write ``value`` to ``file`` with one write(2). The file must exist (cgroup files are never
        created), in a pod's or container's cgroup (:meth:`pod_path`). Then the listener is told."""
        data = _format(value)
        directory = self._pod_path_text(controller, parent, container_id, None)
        path = _in_dir(directory, file)  # as _pod_path_text(..., file) builds it
        _write_file(path, data)
        # The directory below the hierarchy root, "." for the root (pod_path's are below it).
        cgroup = directory[len(self._hierarchy_dir(controller)) + 1 :] or "."
        # One info line per write that reached the node: the only place every plugin's write passes.
        text = data.decode("utf-8", "backslashreplace").strip()
        # a logger assembled once, not per line: this line comes with every write
        logs.cached_logger(LOGGER).info("cgroup written", file=path, value=text, cgroup=cgroup)
        if self.listener is not None:
            write = CgroupWrite(controller, file, data, parent, container_id, "" if cgroup == "." else cgroup)
            self.listener.written(self, write)

    def create_pod_cgroup(self, parent: str, controller: str = "cpu", *, log: Any = log) -> list[Path]:
        """Make the pod cgroup ``parent`` and its missing ancestors in ``controller``'s hierarchy, as
        kubelet names them; the directories made, top first (none when it exists).

        Only a pod cgroup (:meth:`pod_path`); CgroupUnsupported without the hierarchy, and under
        the systemd driver for a pod cgroup that is missing (see the module doc). On v2 the
        parent of each new cgroup first gets ``+controller`` in ``cgroup.subtree_control``, as
        kubelet and runc do, so that the new cgroup has the controller's files; a parent that
        refuses it is logged, and the cgroup is made all the same.
        """
        self.pod_roots.check(parent)  # a pod's: a QoS tier is kubelet's to make
        target = self.pod_path(controller, parent)
        base = self._hierarchy(controller)
        if not base.is_dir():
            raise CgroupUnsupported(f"no {controller} cgroup hierarchy at {base}")
        if self.driver == "systemd" and not target.is_dir():
            raise CgroupUnsupported(
                f"{target} not created: with the systemd cgroup driver kubelet makes pod slices through "
                "systemd, and one made here would stay a systemd slice after the pod"
            )
        parts = target.relative_to(base).parts
        made: list[Path] = []
        for depth in range(1, len(parts) + 1):  # each a prefix of target, which pod_path checked
            directory = base.joinpath(*parts[:depth])
            if directory.is_dir():
                continue
            if self.version is CgroupVersion.V2:
                self._enable_controller(directory.parent, controller, log)
            directory.mkdir(exist_ok=True)  # another pod may be making the same ancestor
            made.append(directory)
        return made

    def _enable_controller(self, directory: Path, controller: str, log: Any) -> None:
        control = directory / "cgroup.subtree_control"
        if not control.is_file():
            return
        if controller in control.read_text(encoding="utf-8", errors="replace").split():
            return
        try:
            _write_file(control, f"+{controller}".encode())
        except OSError as exc:
            log.warning("cannot enable the controller", controller=controller, cgroup=str(directory), error=str(exc))

    def _require(self, controller: str, file: str, parent: str, container_id: str | None) -> None:
        if not self.has_file(controller, file, parent, container_id):
            where = self.path(controller, parent, container_id)
            if not where.is_dir():
                raise FileNotFoundError(errno.ENOENT, "no such cgroup", str(where))
            raise CgroupUnsupported(f"{where} has no {file} (not in this kernel or cgroup version)")

    def _setting(self, controller: str, setting: str, parent: str, container_id: str | None) -> str:
        name = self.file_name(setting)
        self._require(controller, name, parent, container_id)
        return name

    def _write_setting(
        self, controller: str, setting: str, value: str | int, parent: str, container_id: str | None
    ) -> None:
        """Write ``setting``'s file; a failed write is explained first as :meth:`_require` would have
        before it (no cgroup, no such file), so that check's lstat is paid only on failure."""
        name = self.file_name(setting)
        try:
            self.write(controller, name, value, parent, container_id)
        except (OSError, CgroupPathError):
            self._require(controller, name, parent, container_id)
            raise

    # -- cpu --

    def set_cpu_quota(
        self,
        parent: str,
        quota: int,
        period: int = 100000,
        container_id: str | None = None,
        *,
        period_now: int | None = None,
    ) -> None:
        """CFS bandwidth: ``quota`` µs per ``period`` µs; quota <= 0 means no limit (-1 / "max").

        ``period_now``: the period the cgroup has, as the caller has just read it. On v1 an equal
        period is not written again (an open, a write(2) and a close saved): the quota write alone
        sets the same bandwidth, as both files go through the kernel's tg_set_cfs_bandwidth with the
        quota and the period (kernel/sched/core.c)."""
        if period <= 0:
            raise ValueError(f"cpu period must be > 0 µs, got {period}")
        if self.version is CgroupVersion.V2:
            self._write_setting("cpu", "cpu.quota", f"{quota if quota > 0 else 'max'} {period}", parent, container_id)
            return
        if period_now == period:
            self._write_setting("cpu", "cpu.quota", quota if quota > 0 else -1, parent, container_id)
            return
        # The quota file is checked before the period is written: a missing one leaves both alone.
        quota_file = self._setting("cpu", "cpu.quota", parent, container_id)
        # Period first, as runc does: the quota is then checked against the period it will run with.
        self._write_setting("cpu", "cpu.period", period, parent, container_id)
        self.write("cpu", quota_file, quota if quota > 0 else -1, parent, container_id)

    def cpu_quota(self, parent: str, container_id: str | None = None) -> tuple[int, int]:
        """(quota, period) in µs; quota -1 means no limit."""
        text = self.read("cpu", self.file_name("cpu.quota"), parent, container_id)
        return self._cpu_quota(text, parent, container_id)

    def cpu_quota_if_present(self, parent: str, container_id: str | None = None) -> tuple[int, int] | None:
        """:meth:`cpu_quota`, or None where the quota file is absent (see :meth:`read_if_exists`)."""
        first = self.cpu_quota_first_if_present(parent, container_id)
        if first is None:
            return None
        quota, period = first  # v2's cpu.max gives both; v1's period is a file of its own
        return quota, self._period(parent, container_id) if period is None else period

    def cpu_quota_first_if_present(self, parent: str, container_id: str | None = None) -> tuple[int, int | None] | None:
        """:meth:`cpu_quota_if_present` without reading v1's period file (None in its place; v2's
        cpu.max holds both): for a caller that needs the period only at times (:meth:`cpu_period`)."""
        text = self.read_if_exists("cpu", self.file_name("cpu.quota"), parent, container_id)
        if text is None:
            return None
        if self.version is CgroupVersion.V2:
            return self._cpu_quota(text, parent, container_id)
        quota = int(text)
        return (quota if quota > 0 else -1), None

    def cpu_period(self, parent: str, container_id: str | None = None) -> int:
        """The CFS period in µs."""
        if self.version is CgroupVersion.V2:
            return self.cpu_quota(parent, container_id)[1]
        return self._period(parent, container_id)

    def _period(self, parent: str, container_id: str | None) -> int:
        return int(self.read("cpu", "cpu.cfs_period_us", parent, container_id))

    def _cpu_quota(self, quota_text: str, parent: str, container_id: str | None) -> tuple[int, int]:
        """(quota, period) from the quota file's content (v1: the period file is read too)."""
        if self.version is CgroupVersion.V2:
            text = quota_text.split()
            if len(text) != 2:
                raise CgroupError(f"unexpected cpu.max content {' '.join(text)!r}")
            return (-1 if text[0] == "max" else int(text[0])), int(text[1])
        quota = int(quota_text)
        return (quota if quota > 0 else -1), self._period(parent, container_id)

    def set_cpu_shares(self, parent: str, shares: int, container_id: str | None = None) -> None:
        """cpu.shares on v1; on v2 the equivalent cpu.weight (shares_to_weight, the runtime's
        conversion)."""
        if not MIN_SHARES <= shares <= MAX_SHARES:
            raise ValueError(f"cpu shares must be {MIN_SHARES}..{MAX_SHARES}, got {shares}")
        value = shares if self.version is CgroupVersion.V1 else shares_to_weight(shares, self.weight_conversion)
        self._write_setting("cpu", "cpu.shares", value, parent, container_id)

    def cpu_shares(self, parent: str, container_id: str | None = None) -> int:
        """cpu.shares on v1; on v2 the shares that cpu.weight stands for."""
        value = int(self.read("cpu", self.file_name("cpu.shares"), parent, container_id))
        return value if self.version is CgroupVersion.V1 else weight_to_shares(value, self.weight_conversion)

    def set_cpu_burst(self, parent: str, burst_us: int, container_id: str | None = None) -> None:
        """cpu.cfs_burst_us (v1) / cpu.max.burst (v2), Linux 5.14+; CgroupUnsupported on older kernels."""
        if burst_us < 0:
            raise ValueError(f"cpu burst must be >= 0 µs, got {burst_us}")
        self._write_setting("cpu", "cpu.burst", burst_us, parent, container_id)

    def set_cpu_idle(self, parent: str, idle: bool, container_id: str | None = None) -> None:
        """cpu.idle (Linux 5.15+): an idle cgroup's tasks run as SCHED_IDLE."""
        self._write_setting("cpu", "cpu.idle", 1 if idle else 0, parent, container_id)

    def set_group_identity(self, parent: str, bvt_warp_ns: int, container_id: str | None = None) -> None:
        """cpu.bvt_warp_ns (-1..2), Anolis OS group identity; CgroupUnsupported elsewhere."""
        if not -1 <= bvt_warp_ns <= 2:
            raise ValueError(f"cpu.bvt_warp_ns must be -1..2, got {bvt_warp_ns}")
        self._write_setting("cpu", "cpu.bvt_warp_ns", bvt_warp_ns, parent, container_id)

    # -- memory --

    def set_memory_protection(
        self,
        parent: str,
        *,
        min_bytes: int | None = None,
        low_bytes: int | None = None,
        high_bytes: int | None = None,
        container_id: str | None = None,
    ) -> None:
        """cgroup v2 memory.min / memory.low / memory.high; None leaves a file alone, high -1 is "max".

        CgroupUnsupported on v1 (use set_memory_soft_limit there).
        """
        if self.version is CgroupVersion.V1:
            raise CgroupUnsupported("memory.min/low/high are cgroup v2 files; use set_memory_soft_limit on v1")
        for setting, value in (("memory.min", min_bytes), ("memory.low", low_bytes), ("memory.high", high_bytes)):
            if value is None:
                continue
            if value < 0 and not (setting == "memory.high" and value == -1):
                raise ValueError(f"{setting} must be >= 0 bytes, got {value}")
            self._write_setting("memory", setting, "max" if value == -1 else value, parent, container_id)

    def set_memory_soft_limit(self, parent: str, soft_limit: int | None, container_id: str | None = None) -> None:
        """cgroup v1 memory.soft_limit_in_bytes; None removes the limit. CgroupUnsupported on v2."""
        if self.version is CgroupVersion.V2:
            raise CgroupUnsupported("memory.soft_limit_in_bytes is a cgroup v1 file; use set_memory_protection")
        if soft_limit is not None and soft_limit < 0:
            raise ValueError(f"soft limit must be >= 0 bytes, got {soft_limit}")
        value = _V1_UNLIMITED if soft_limit is None else soft_limit
        self._write_setting("memory", "memory.soft_limit", value, parent, container_id)
