"""A fake resctrl mount for tests: the kernel's file names and formats, and its write validation.

Build one with :func:`make_fake_resctrl` and drive it through ``fake.fs()`` -- a
:class:`~runtimeproxy.hooks.resctrl_fs.ResctrlFS` whose mkdir/rmdir/write go to the
:class:`FakeResctrl` (it implements :class:`~runtimeproxy.hooks.resctrl_fs.ResctrlOps`). A plain
directory cannot react to mkdir or validate a write, so the fake keeps the kernel's state in
memory and re-renders the files after every command, as the kernel would show them:

* ``info/{L3,L3CODE,L3DATA}/{cbm_mask,min_cbm_bits,num_closids,shareable_bits,bit_usage,
  sparse_masks}``, ``info/MB/{min_bandwidth,bandwidth_gran,num_closids,delay_linear,
  thread_throttle_mode}``, ``info/L3_MON/...`` and ``info/last_cmd_status``;
* per group (the root included): ``tasks``, ``cpus``, ``cpus_list``, ``schemata``, ``mode``,
  ``size``, and with monitoring ``mon_groups/`` and ``mon_data/mon_L3_NN/``.

Behaviour follows ``fs/resctrl/ctrlmondata.c`` and ``fs/resctrl/rdtgroup.c`` of current kernels
(older ones have the same rules under ``arch/x86/kernel/cpu/resctrl/``; their messages differ
slightly, e.g. "mask f7 has non-consecutive 1-bits" in the doc):

* schemata writes need a trailing newline, are parsed line by line (``RES:id=val;id=val``),
  and are applied all-or-nothing; masks must be hex, non-empty, inside ``cbm_mask``,
  contiguous and at least ``min_cbm_bits`` long; MB values decimal within
  ``[min_bandwidth, 100]``, stored rounded up to ``bandwidth_gran``; an unknown domain id
  fails with EINVAL and -- as in the kernel -- no ``last_cmd_status`` text;
* schemata are displayed as the kernel does: newest resource first (``MB`` before ``L3``),
  names right-aligned to the widest name (``L3CODE`` on CDP-capable parts), unpadded values;
* ``tasks`` writes take ``pid[,pid...]``; a task that does not exist fails with ESRCH
  ("No task N"); moving a task removes it from its previous group; a task that has exited
  leaves a group's ``tasks`` file when that file is next rendered (the kernel's lists it no
  longer at once; :meth:`FakeResctrl.tasks` drops it at once);
* mkdir past ``num_closids - 1`` groups fails with ENOSPC ("Out of CLOSIDs"); new groups
  start with the full mask and 100% bandwidth; rmdir gives the tasks back to the root group;
* a write longer than a page fails with E2BIG (kernfs ``atomic_write_len``);
* a read sees a whole file, old or new, never one half rendered: each file is written under a
  temporary name and renamed over the old one (a kernel read is a snapshot; another process
  reading while this one renders would otherwise find a file emptied by the truncate).

Not modelled: exclusive/pseudo-locked modes, ``cpus`` writes, monitor groups, RMID limits,
``mba_MBps``. The root group's ``tasks`` lists only tasks given back by a removed group,
not every task of the system. Writes of files not modelled raise ``NotImplementedError``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..resctrl_fs import PAGE_SIZE, RESERVED_NAMES, ResctrlFS

__all__ = [
    "FakeKernelError",
    "FakeResctrl",
    "FakeResource",
    "FakeWrite",
    "kernel_schemata_write",
    "make_fake_resctrl",
]

_ROOT = ""  # key of the root (default) group
_HEX = re.compile(r"[0-9a-fA-F]+", re.ASCII)
_DEC = re.compile(r"[0-9]+", re.ASCII)
_OCT = re.compile(r"[0-7]+", re.ASCII)
_SPACE = " \t\n\v\f\r"  # C isspace(), what the kernel's strim() strips


class FakeKernelError(OSError):
    """A command the fake kernel refused. ``status`` is the ``last_cmd_status`` text it set,
    or None when the kernel fails before touching ``last_cmd_status`` (it then keeps its old text)."""

    def __init__(self, err: int, status: str | None = None) -> None:
        super().__init__(err, os.strerror(err))
        self.status = status


@dataclass(frozen=True)
class FakeResource:
    """One allocation resource: a schemata line type such as ``L3``, ``L3CODE`` or ``MB``."""

    name: str
    domain_ids: tuple[int, ...]
    num_closids: int
    cbm_mask: int = 0
    min_cbm_bits: int = 0
    shareable_bits: int = 0
    cache_size: int = 0
    min_bandwidth: int = 0
    bandwidth_gran: int = 1
    max_bandwidth: int = 100
    delay_linear: bool = True

    @property
    def is_cache(self) -> bool:
        return self.name.startswith(("L2", "L3"))

    @property
    def cbm_len(self) -> int:
        return self.cbm_mask.bit_length()

    @property
    def default(self) -> int:
        """The value of a new group: the full mask (all groups are shareable) or max bandwidth."""
        return self.cbm_mask if self.is_cache else self.max_bandwidth

    def format(self, value: int) -> str:
        return f"{value:x}" if self.is_cache else str(value)


@dataclass(frozen=True)
class FakeWrite:
    """One write(2) the fake received, successful or not."""

    path: Path
    data: bytes


@dataclass
class _Group:
    schemata: dict[str, dict[int, int]]
    tasks: list[int] = field(default_factory=list)


# --------------------------------------------------------------------------------------
# the kernel's number parsing (lib/kstrtox.c): an optional '+', digits, one optional '\n'


def _kstrtoul(text: str, base: int, bits: int = 64) -> int | None:
    s = text[1:] if text.startswith("+") else text
    if base == 16 and s[:1] == "0" and s[1:2] in ("x", "X"):
        s = s[2:]
    if s.endswith("\n"):
        s = s[:-1]
    if not (_HEX if base == 16 else _DEC).fullmatch(s):
        return None
    value = int(s, base)
    return value if value < 1 << bits else None


def _kstrtoint_base0(text: str) -> int | None:
    negative = text.startswith("-")
    s = text[1:] if negative or text.startswith("+") else text
    if s.endswith("\n"):
        s = s[:-1]
    if s[:1] == "0" and s[1:2] in ("x", "X") and _HEX.fullmatch(s[2:3] or "-"):
        digits, pattern, base = s[2:], _HEX, 16
    elif s[:1] == "0":
        digits, pattern, base = s, _OCT, 8
    else:
        digits, pattern, base = s, _DEC, 10
    if not pattern.fullmatch(digits):
        return None
    value = -int(digits, base) if negative else int(digits, base)
    return value if -(1 << 31) <= value < 1 << 31 else None


def _validate_cbm(res: FakeResource, text: str) -> int:
    """``cbm_validate()``: a hex mask, in range, contiguous, at least min_cbm_bits long."""
    val = _kstrtoul(text, 16)
    if val is None:
        raise FakeKernelError(errno.EINVAL, f"Non-hex character in the mask {text}\n")
    supported = (1 << res.cbm_len) - 1
    if (res.min_cbm_bits > 0 and val == 0) or val > supported:
        raise FakeKernelError(errno.EINVAL, "Mask out of range\n")
    if val:
        low = val & -val
        run = val + low  # a contiguous run carries out past its top bit and leaves nothing
        if run & val:
            raise FakeKernelError(errno.EINVAL, f"The mask {val:x} has non-consecutive 1-bits\n")
    if val.bit_count() < res.min_cbm_bits:
        raise FakeKernelError(errno.EINVAL, f"Need at least {res.min_cbm_bits} bits in the mask\n")
    return val


def _validate_bw(res: FakeResource, text: str) -> int:
    """``bw_validate()``: a decimal percentage in range, stored rounded up to the granularity."""
    if not res.delay_linear:
        raise FakeKernelError(errno.EINVAL, "No support for non-linear MB domains\n")
    bw = _kstrtoul(text, 10, bits=32)
    if bw is None:
        raise FakeKernelError(errno.EINVAL, f"Invalid MB value {text}\n")
    if bw < res.min_bandwidth or bw > res.max_bandwidth:
        raise FakeKernelError(errno.EINVAL, f"MB value {bw} out of range [{res.min_bandwidth},{res.max_bandwidth}]\n")
    return -(-bw // res.bandwidth_gran) * res.bandwidth_gran


def kernel_schemata_write(
    data: bytes, resources: Mapping[str, FakeResource], current: Mapping[str, Mapping[int, int]]
) -> dict[str, dict[int, int]]:
    """What ``rdtgroup_schemata_write()`` makes of ``data`` for a group whose config is ``current``.

    Returns the group's whole new configuration (only the domains named in ``data`` change) or
    raises :class:`FakeKernelError` with the errno and ``last_cmd_status`` text the kernel gives.
    Pure: usable in property tests without a fake mount.
    """
    if len(data) > PAGE_SIZE:
        raise FakeKernelError(errno.E2BIG)
    if not data or data[-1:] != b"\n":
        raise FakeKernelError(errno.EINVAL)  # before rdt_last_cmd_clear(): status untouched
    text = data[:-1].decode("latin-1")
    staged: dict[str, dict[int, int]] = {}
    for token in text.split("\n"):
        resname, colon, line = token.partition(":")
        resname = resname.strip(_SPACE)
        if not colon:
            raise FakeKernelError(errno.EINVAL, "Missing ':'\n")
        if not line:
            raise FakeKernelError(errno.EINVAL, f"Missing '{resname}' value\n")
        res = resources.get(resname)
        if res is None:
            raise FakeKernelError(errno.EINVAL, f"Unknown or unsupported resource name '{resname}'\n")
        values = staged.setdefault(resname, {})
        rest: str | None = line
        while rest:
            dom, semi, after = rest.partition(";")
            rest = after if semi else None
            id_text, eq, value = dom.partition("=")
            dom_id = _kstrtoul(id_text, 10) if eq else None
            if dom_id is None:
                raise FakeKernelError(errno.EINVAL, "Missing '=' or non-numeric domain\n")
            value = value.strip(_SPACE)
            if dom_id not in res.domain_ids:
                raise FakeKernelError(errno.EINVAL, "")  # parse_line() gives no reason for this one
            if dom_id in values:
                raise FakeKernelError(errno.EINVAL, f"Duplicate domain {dom_id}\n")
            values[dom_id] = _validate_cbm(res, value) if res.is_cache else _validate_bw(res, value)
    result = {name: dict(current.get(name, {})) for name in resources}
    for name, values in staged.items():
        result[name].update(values)
    return result


# --------------------------------------------------------------------------------------
# rendering helpers


def _cpumask(cpus: Iterable[int], ncpus: int) -> str:
    """``%*pb``: hex in 32-bit chunks separated by commas, the first chunk only as wide as needed."""
    value = sum(1 << cpu for cpu in cpus)
    chunks = max(1, -(-ncpus // 32))
    first_bits = ncpus - 32 * (chunks - 1)
    parts = []
    for i in reversed(range(chunks)):
        width = -(-first_bits // 4) if i == chunks - 1 else 8
        parts.append(f"{(value >> (32 * i)) & 0xFFFFFFFF:0{width}x}")
    return ",".join(parts)


def _cpulist(cpus: Iterable[int]) -> str:
    """``%*pbl``: ranges such as ``0-3,8``."""
    ordered = sorted(cpus)
    ranges: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(ranges)


def _publish(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename, so that no reader sees it half written."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_native_id()}.rendering")
    temporary.write_text(text)
    os.replace(temporary, path)


def _task_exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


class FakeResctrl:
    """A fake resctrl mount at ``root``; also the :class:`ResctrlOps` that drives it.

    Use :meth:`fs` for a ResctrlFS bound to it. Inspect with :meth:`schemata`,
    :meth:`tasks`, :meth:`groups`, :attr:`last_cmd_status` and :attr:`writes` (every write(2)
    received). A group directory made with a plain ``os.mkdir`` becomes a group on
    :meth:`sync`, as if the kernel had seen the mkdir.
    """

    def __init__(
        self,
        root: Path,
        resources: Iterable[FakeResource],
        *,
        cdp_capable: bool = True,
        mon: bool = True,
        ncpus: int = 4,
    ) -> None:
        self.root = Path(root)
        # The kernel adds schemata with list_add() (at the head): the display is newest first.
        created = list(resources)
        self.resources: dict[str, FakeResource] = {r.name: r for r in reversed(created)}
        self.cdp_capable = cdp_capable
        self.mon = mon
        self.ncpus = ncpus
        self.writes: list[FakeWrite] = []
        self._status = ""
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}
        names = [len(name) for name in self.resources]
        if cdp_capable and any(name == "L3" for name in self.resources):
            names.append(len("L3CODE"))
        self._name_width = max(names, default=0)

    # -- inspection --------------------------------------------------------------------

    @property
    def num_closids(self) -> int:
        """The kernel's CLOSID limit: the smallest num_closids of all resources."""
        return min((r.num_closids for r in self.resources.values()), default=0)

    @property
    def last_cmd_status(self) -> str:
        return self._status or "ok\n"

    def fs(self) -> ResctrlFS:
        """A ResctrlFS over this fake mount."""
        return ResctrlFS(self.root, ops=self)

    def groups(self) -> list[str]:
        return sorted(name for name in self._groups if name != _ROOT)

    def schemata(self, group: str = _ROOT) -> dict[str, dict[int, int]]:
        """The group's configuration as the kernel holds it (root group: ``""``)."""
        return {name: dict(values) for name, values in self._groups[group].schemata.items()}

    def tasks(self, group: str = _ROOT) -> list[int]:
        """The group's live tasks, in the order they joined."""
        return self._live_tasks(group)

    def schemata_writes(self, group: str) -> list[bytes]:
        """The data of every write(2) to the group's schemata file."""
        path = self.root / group / "schemata" if group else self.root / "schemata"
        return [w.data for w in self.writes if w.path == path]

    def check_schemata(self, text: str, group: str = _ROOT) -> dict[str, dict[int, int]]:
        """What writing ``text`` to the group's schemata would result in, without applying it."""
        return kernel_schemata_write(text.encode("latin-1"), self.resources, self._groups[group].schemata)

    # -- ResctrlOps: what the kernel does on mkdir(2), rmdir(2) and write(2) ----------------

    def mkdir(self, path: Path) -> None:
        with self._lock:
            name = self._child_name(path)
            if name is None:
                raise FakeKernelError(errno.EPERM)
            if "\n" in name:
                raise FakeKernelError(errno.EINVAL)
            if os.path.lexists(self.root / name):
                raise FakeKernelError(errno.EEXIST)  # the VFS answers before resctrl sees it
            self._status = ""
            if len(self._groups) >= self.num_closids:  # the root group holds CLOSID 0
                self._status = "Out of CLOSIDs\n"
                self._render_status()
                raise FakeKernelError(errno.ENOSPC, self._status)
            os.mkdir(self.root / name)
            self._add_group(name)
            self._render_status()

    def rmdir(self, path: Path) -> None:
        with self._lock:
            name = self._child_name(path)
            if not os.path.lexists(path):
                raise FakeKernelError(errno.ENOENT)
            if name is None or name not in self._groups:
                raise FakeKernelError(errno.EPERM)  # info/, mon_data/, the root, or not a group
            self._status = ""
            group = self._groups.pop(name)
            self._groups[_ROOT].tasks.extend(group.tasks)
            shutil.rmtree(self.root / name)
            self._render_group(_ROOT)
            self._render_bit_usage()
            self._render_status()

    def write(self, path: Path, data: bytes) -> None:
        with self._lock:
            path = Path(path)
            self.writes.append(FakeWrite(path, bytes(data)))
            rel = self._relative(path)
            if not os.path.exists(path):
                raise FakeKernelError(errno.ENOENT)
            group = _ROOT if len(rel) == 1 else rel[0]
            if len(rel) not in (1, 2) or group not in self._groups or rel[-1] not in ("schemata", "tasks"):
                raise NotImplementedError(f"fake resctrl: writing {path} is not modelled")
            if len(data) > PAGE_SIZE:
                raise FakeKernelError(errno.E2BIG)
            try:
                if rel[-1] == "schemata":
                    self._write_schemata(group, data)
                else:
                    self._write_tasks(group, data)
            except FakeKernelError as exc:
                if exc.status is not None:  # None: refused before rdt_last_cmd_clear()
                    self._status = exc.status
                    self._render_status()
                raise

    # -- plain-mkdir support -------------------------------------------------------------

    def sync(self) -> list[str]:
        """Adopt directories made with a plain mkdir as groups (and forget removed ones).

        Returns the adopted names. Past the CLOSID limit the directory is removed again and
        ENOSPC raised, as the kernel's mkdir would have failed.
        """
        adopted: list[str] = []
        with self._lock:
            for name in list(self._groups):
                if name != _ROOT and not (self.root / name).is_dir():
                    self._groups[_ROOT].tasks.extend(self._groups.pop(name).tasks)
            for entry in sorted(self.root.iterdir()):
                if entry.is_symlink() or not entry.is_dir() or entry.name in RESERVED_NAMES:
                    continue
                if entry.name in self._groups:
                    continue
                if len(self._groups) >= self.num_closids:
                    shutil.rmtree(entry)
                    self._status = "Out of CLOSIDs\n"
                    self._render_status()
                    raise FakeKernelError(errno.ENOSPC, self._status)
                self._add_group(entry.name)
                adopted.append(entry.name)
            self._render_group(_ROOT)
        return adopted

    # -- internals -----------------------------------------------------------------------

    def _relative(self, path: Path) -> tuple[str, ...]:
        full = os.path.normpath(os.path.abspath(path))
        root = os.path.normpath(os.path.abspath(self.root))
        if os.path.commonpath([full, root]) != root:
            raise ValueError(f"fake resctrl at {root}: {full} is outside the mount")
        return Path(os.path.relpath(full, root)).parts if full != root else ()

    def _child_name(self, path: Path) -> str | None:
        rel = self._relative(path)
        if len(rel) != 1 or rel[0] in RESERVED_NAMES:
            return None
        return rel[0]

    def _add_group(self, name: str) -> None:
        self._groups[name] = _Group({r.name: dict.fromkeys(r.domain_ids, r.default) for r in self.resources.values()})
        self._render_group(name)
        self._render_bit_usage()

    def _write_schemata(self, group: str, data: bytes) -> None:
        new = kernel_schemata_write(data, self.resources, self._groups[group].schemata)
        self._groups[group].schemata = new
        self._status = ""
        self._render_group(group)
        self._render_bit_usage()
        self._render_status()

    def _write_tasks(self, group: str, data: bytes) -> None:
        self._status = ""
        changed = {group}  # only these files are rendered again: the others list the same tasks
        try:
            buf: str | None = data.decode("latin-1")
            while buf and buf[0] not in ("\0", "\n"):
                pid_text, comma, after = buf.partition(",")
                buf = after if comma else None
                pid_text = pid_text.strip(_SPACE)
                pid = _kstrtoint_base0(pid_text)
                if pid is None:
                    raise FakeKernelError(errno.EINVAL, f"Task list parsing error pid {pid_text}\n")
                if pid < 0:
                    raise FakeKernelError(errno.EINVAL, f"Invalid pid {pid}\n")
                task = pid or threading.get_native_id()  # 0 is the writing task itself
                if not _task_exists(task):
                    raise FakeKernelError(errno.ESRCH, f"No task {pid}\nError while processing task {pid}\n")
                for name, other in self._groups.items():
                    if task in other.tasks:
                        other.tasks.remove(task)
                        changed.add(name)
                self._groups[group].tasks.append(task)
        finally:  # tasks moved before a failing one stay moved, as in the kernel
            for name in changed:
                self._render_tasks(name)
        self._render_status()

    def _group_dir(self, group: str) -> Path:
        return self.root / group if group else self.root

    def _schemata_text(self, group: str, *, sizes: bool = False) -> str:
        lines = []
        for res in self.resources.values():
            values = self._groups[group].schemata[res.name]
            if sizes and res.is_cache:
                shown = [f"{dom}={res.cache_size // res.cbm_len * v.bit_count()}" for dom, v in values.items()]
            else:
                shown = [f"{dom}={res.format(v)}" for dom, v in values.items()]
            lines.append(f"{res.name:>{self._name_width}}:{';'.join(shown)}\n")
        return "".join(lines)

    def _live_tasks(self, group: str) -> list[int]:
        return [task for task in self._groups[group].tasks if _task_exists(task)]

    def _render_tasks(self, group: str) -> None:
        """Render ``tasks``, forgetting the tasks that have exited (a kernel's list holds live
        tasks only; kept, a group's list would grow with every container that came and went)."""
        tasks = self._groups[group].tasks = self._live_tasks(group)
        _publish(self._group_dir(group) / "tasks", "".join(f"{t}\n" for t in tasks))

    def _render_group(self, group: str) -> None:
        d = self._group_dir(group)
        cpus = range(self.ncpus) if group == _ROOT else range(0)
        self._render_tasks(group)
        _publish(d / "cpus", _cpumask(cpus, self.ncpus) + "\n")
        _publish(d / "cpus_list", _cpulist(cpus) + "\n")
        _publish(d / "schemata", self._schemata_text(group))
        _publish(d / "size", self._schemata_text(group, sizes=True))
        _publish(d / "mode", "shareable\n")
        if self.mon:
            (d / "mon_groups").mkdir(exist_ok=True)
            domains = next((r.domain_ids for r in reversed(self.resources.values())), ())
            for dom in domains:
                mon = d / "mon_data" / f"mon_L3_{dom:02d}"
                mon.mkdir(parents=True, exist_ok=True)
                for event in ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes"):
                    _publish(mon / event, "0\n")

    def _render_bit_usage(self) -> None:
        for res in self.resources.values():
            if not res.is_cache:
                continue
            shown = []
            for dom in res.domain_ids:
                sw = 0
                for group in self._groups.values():
                    sw |= group.schemata[res.name][dom]
                hw = res.shareable_bits
                bits = []
                for i in reversed(range(res.cbm_len)):
                    hwb, swb = hw >> i & 1, sw >> i & 1
                    bits.append("X" if hwb and swb else "H" if hwb else "S" if swb else "0")
                shown.append(f"{dom}={''.join(bits)}")
            _publish(self.root / "info" / res.name / "bit_usage", ";".join(shown) + "\n")

    def _render_status(self) -> None:
        _publish(self.root / "info" / "last_cmd_status", self.last_cmd_status)

    def _render_info(self) -> None:
        info = self.root / "info"
        info.mkdir(parents=True, exist_ok=True)
        for res in self.resources.values():
            d = info / res.name
            d.mkdir(exist_ok=True)
            files: dict[str, object]
            if res.is_cache:
                files = {
                    "cbm_mask": f"{res.cbm_mask:x}",
                    "min_cbm_bits": res.min_cbm_bits,
                    "num_closids": res.num_closids,
                    "shareable_bits": f"{res.shareable_bits:x}",
                    "sparse_masks": 0,
                }
            else:
                files = {
                    "min_bandwidth": res.min_bandwidth,
                    "bandwidth_gran": res.bandwidth_gran,
                    "num_closids": res.num_closids,
                    "delay_linear": int(res.delay_linear),
                    "thread_throttle_mode": "max",
                }
            for fname, value in files.items():
                _publish(d / fname, f"{value}\n")
        if self.mon:
            d = info / "L3_MON"
            d.mkdir(exist_ok=True)
            _publish(d / "num_rmids", "176\n")
            _publish(d / "mon_features", "llc_occupancy\nmbm_total_bytes\nmbm_local_bytes\n")
            _publish(d / "max_threshold_occupancy", "737280\n")
        self._render_status()

    def _mount(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if any(self.root.iterdir()):
            raise FileExistsError(f"fake resctrl root {self.root} is not empty")
        self._render_info()
        self._groups[_ROOT] = _Group({r.name: dict.fromkeys(r.domain_ids, r.default) for r in self.resources.values()})
        self._render_group(_ROOT)
        self._render_bit_usage()


def make_fake_resctrl(
    root: Path,
    *,
    l3_ids: Iterable[int] | None = (0, 1),
    cbm_mask: str = "7ff",
    min_cbm_bits: int = 1,
    num_closids: int = 16,
    mb_ids: Iterable[int] | None = (0, 1),
    min_bandwidth: int = 10,
    bandwidth_gran: int = 10,
    cdp: bool = False,
    shareable_bits: str = "0",
    mb_num_closids: int | None = None,
    delay_linear: bool = True,
    cdp_capable: bool = True,
    mon: bool = True,
    ncpus: int = 4,
    l3_cache_size: int | None = None,
) -> FakeResctrl:
    """Mount a fake resctrl at ``root`` (created; must be empty) and return it.

    ``l3_ids``/``mb_ids`` empty or None leave that resource out (MB-only / L3-only hosts).
    ``num_closids`` is the hardware count; with ``cdp=True`` the L3 becomes ``L3CODE`` +
    ``L3DATA`` with half of it each, as the kernel shows. ``mb_num_closids`` defaults to
    ``num_closids``. ``l3_cache_size`` (bytes, per cache id) feeds the ``size`` files; the
    default is 1 MiB per way.
    """
    mask = int(cbm_mask, 16)
    resources: list[FakeResource] = []
    l3 = tuple(sorted(l3_ids or ()))
    if l3:
        size = l3_cache_size if l3_cache_size is not None else mask.bit_length() << 20
        names = ("L3CODE", "L3DATA") if cdp else ("L3",)
        for name in names:
            resources.append(
                FakeResource(
                    name=name,
                    domain_ids=l3,
                    num_closids=num_closids // 2 if cdp else num_closids,
                    cbm_mask=mask,
                    min_cbm_bits=min_cbm_bits,
                    shareable_bits=int(shareable_bits, 16),
                    cache_size=size,
                )
            )
    mb = tuple(sorted(mb_ids or ()))
    if mb:
        resources.append(
            FakeResource(
                name="MB",
                domain_ids=mb,
                num_closids=mb_num_closids if mb_num_closids is not None else num_closids,
                min_bandwidth=min_bandwidth,
                bandwidth_gran=bandwidth_gran,
                delay_linear=delay_linear,
            )
        )
    fake = FakeResctrl(Path(root), resources, cdp_capable=cdp_capable or cdp, mon=mon, ncpus=ncpus)
    fake._mount()
    return fake
