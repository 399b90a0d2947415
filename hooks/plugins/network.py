"""Network QoS: egress bandwidth bands (SYSTEM, LS, BE) on one interface with HTB.

The tree (policy section ``network``; ``interface: ""`` switches the plugin off)::

    root qdisc 1: htb default 10            unclassified traffic goes to SYSTEM (1:10)
    └── class 1:1   rate = ceil = link speed
        ├── class 1:10  SYSTEM  rate SYSTEM.rate_percent of the link, ceil ceil_percent, prio
        ├── class 1:20  LS      (LSE, LSR and LS pods)
        └── class 1:30  BE

**Default class: SYSTEM.** What no filter classifies is the node's own traffic (kubelet,
the container runtime, sshd, node agents) plus pods not classified yet. Node traffic is what
the SYSTEM band exists for, and sending it to BE would let batch pods starve the kubelet's
heartbeats; Koordinator makes the same choice. The cost: a pod that escapes classification
runs in the best band until the next reconcile classifies it.

**Link speed**: ``link_speed_mbit``, or ``/sys/class/net/<interface>/speed`` when it is 0.
When neither is known (virtio NICs report none) the tree is sized for
:data:`FALLBACK_LINK_MBIT` and a warning says to set ``link_speed_mbit``: an over-estimate
only means the bands take effect late, an under-estimate would throttle the node.

**How a pod's packets find their band** (two mechanisms, both always on):

1. *cgroup classid* (every pod, effective for host-network pods): the pod's cgroup in the
   cgroup v1 ``net_cls`` hierarchy gets ``net_cls.classid`` = its band's class (0x10030 is
   1:30), written on the pod directory (children created later inherit it) and on every
   directory below it. The kernel stamps the classid on the sockets of the processes in
   it. This kernel has no ``cls_cgroup`` (``tc filter ... cgroup`` fails with "TC
   classifier not found"), so the root qdisc gets a ``cls_bpf`` filter instead: a 10
   instruction program calling ``bpf_get_cgroup_classid`` that returns the classid when
   its major is 1 and its minor non-zero, and 0 (no match) otherwise. It only sees
   traffic that still carries its socket when it is queued on the interface: traffic of
   processes in the interface's own network namespace, i.e. host-network pods. Needs the
   ``net_cls`` hierarchy mounted at ``<cgroup root>/net_cls`` (before containers start:
   runc creates container cgroups only in mounted hierarchies); when it is not, the
   plugin says so once and classifies by address only.
2. *source address* (pod-network pods): hook requests carry no pod IP, so the plugin
   finds a process of the pod's sandbox container (``cgroup.procs`` of its cgroup), and
   when that process lives in another network namespace than the shaped interface, reads
   that namespace's global addresses. Each address gets a ``u32`` filter on the root
   qdisc matching the IPv4 (prio 2) or IPv6 (prio 3) source address. Routed pod traffic
   loses its socket when it leaves the pod's namespace, so mechanism 1 cannot see it.
   Limits: traffic source-NATed before the qdisc (masquerade to the node address) is
   seen with the node's address and lands in the default class; overlay traffic is
   matched on the outer header (the node's address); u32 filters are a linear list, fine
   for a node's ~100 pods.

The plugin owns filter priorities 1-3 under ``1:``; filters there that it did not make
are removed, other priorities are left alone.

**Idempotent**: every step reads what is there first. A root qdisc that is not ``htb 1:
default 10`` is replaced (which drops whatever tree hung below it); missing classes are
added, classes whose rate, ceil, prio or quantum differ are changed in place; classes it
does not plan are left alone; the cgroup filter is added once; address filters are
added, corrected or removed one by one. ``reconcile`` re-runs all of it and re-writes
pod classids, counting each repair (:attr:`NetworkQoS.drift`). ``on_stop`` leaves the
tree in place (traffic stays shaped while the daemon restarts); remove it with
:func:`teardown` or ``python -m runtimeproxy.hooks.plugins.network teardown IFACE``.

The pure planning (:func:`plan_tree`, :func:`band_rates`, :func:`explain`,
:func:`tc_commands`) does no I/O; ``runtime-hooks explain`` can show it.

Setting ``network_netns`` in the server's settings shapes an interface in that network
namespace (a name under /run/netns or a path) instead of the daemon's own; tests use it.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import errno
import ipaddress
import json
import os
import platform
import struct
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeVar

from .. import policy as policy_mod
from ..cgroups import CgroupError, CgroupFS, parent_path
from ..qos import QoSClass
from ..sdk import HookPoint, Plugin, PodInfo, qos_of
from ..settings import Invalid, SectionSettings, SettingsSpec, integer, parsed_by, show

__all__ = [
    "BANDS",
    "CGROUP_FILTER_NAME",
    "DEFAULT_BAND",
    "FALLBACK_LINK_MBIT",
    "NETWORK_BANDS",
    "ClassPlan",
    "IPFilter",
    "NetworkBandSettings",
    "NetworkConfig",
    "NetworkQoS",
    "NetworkSection",
    "Shaper",
    "TcSnapshot",
    "TreePlan",
    "band_classid",
    "band_of",
    "band_rates",
    "explain",
    "format_handle",
    "link_speed_mbit",
    "main",
    "network_config",
    "plan_tree",
    "plugin",
    "run_in_netns",
    "tc_commands",
    "teardown",
]

_T = TypeVar("_T")

# --- settings ------------------------------------------------------------------------------------

_IFNAMSIZ: Final = 16  # linux/if.h, with the terminating NUL


def _interface(value: object, path: str) -> str:
    """A network interface name as the kernel accepts it (dev_valid_name), or "" for none."""
    if not isinstance(value, str):
        raise Invalid(path, f'must be an interface name (a string, "" for none), got {show(value)}')
    if value == "":
        return value
    if (
        len(value.encode()) >= _IFNAMSIZ
        or value in (".", "..")
        or any(char in "/:" or char.isspace() or not char.isprintable() for char in value)
    ):
        reason = "at most 15 bytes, no '/', ':', space or control character"
        raise Invalid(path, f"{show(value)} is not a valid interface name ({reason})")
    return value


@dataclass(frozen=True)
class NetworkBandSettings:
    """One egress band: guaranteed ``rate_percent`` and ``ceil_percent`` of the link speed, HTB ``priority``."""

    rate_percent: int = field(metadata=parsed_by(integer(1, 100, "a percentage")))
    ceil_percent: int = field(metadata=parsed_by(integer(1, 100, "a percentage")))
    priority: int = field(metadata=parsed_by(integer(0, 7)))

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.rate_percent > self.ceil_percent:
            yield "rate_percent", f"{self.rate_percent} is above ceil_percent ({self.ceil_percent})"


@dataclass(frozen=True)
class NetworkSection:
    """``interface``: the shaped interface, "" = network QoS off. ``link_speed_mbit``: its speed,
    0 = read /sys/class/net/<interface>/speed."""

    interface: str = field(metadata=parsed_by(_interface))
    link_speed_mbit: int = field(metadata=parsed_by(integer(0)))


# The network band of each class, as Koordinator's tc plugin groups them (GetPodNetQoSClassByName).
NETWORK_BANDS: Final[Mapping[QoSClass, QoSClass]] = MappingProxyType(
    {
        QoSClass.LSE: QoSClass.LS,
        QoSClass.LSR: QoSClass.LS,
        QoSClass.LS: QoSClass.LS,
        QoSClass.BE: QoSClass.BE,
        QoSClass.SYSTEM: QoSClass.SYSTEM,
    }
)


@dataclass(frozen=True)
class NetworkConfig:
    """The whole ``network`` section as the shaper uses it: the interface, its speed and the bands."""

    interface: str
    link_speed_mbit: int
    SYSTEM: NetworkBandSettings
    LS: NetworkBandSettings
    BE: NetworkBandSettings


def network_config(section: NetworkSection, settings_for: Callable[[QoSClass], NetworkBandSettings]) -> NetworkConfig:
    """The config from the handlers' ``section`` and ``settings_for``."""
    bands = {band.value: settings_for(band) for band in (QoSClass.SYSTEM, QoSClass.LS, QoSClass.BE)}
    return NetworkConfig(section.interface, section.link_speed_mbit, **bands)


def _check_rates(section: SectionSettings) -> Iterator[tuple[str, str]]:
    """The bands' guaranteed rates must fit in the link together."""
    rates = {name: entry.rate_percent for name, entry in section.entries.items()}
    total = sum(rates.values())
    if total > 100:
        listed = " + ".join(f"{name} {rate}" for name, rate in rates.items())
        yield "", f"the bands' rate_percent add up to {total} ({listed}), more than 100"


# --- the plan (pure) ---------------------------------------------------------------------------

MAJOR: Final = 1
ROOT_HANDLE: Final = MAJOR << 16  # 1:
PARENT_CLASSID: Final = ROOT_HANDLE | 0x1  # 1:1
BANDS: Final = (QoSClass.SYSTEM, QoSClass.LS, QoSClass.BE)
_BAND_MINORS: Final = {QoSClass.SYSTEM: 0x10, QoSClass.LS: 0x20, QoSClass.BE: 0x30}
DEFAULT_BAND: Final = QoSClass.SYSTEM
#: Used when the link speed is neither in the policy nor readable (see the module doc).
FALLBACK_LINK_MBIT: Final = 10000
#: Bytes per second in one Mbit/s.
_MBIT_BYTES: Final = 125_000
# HTB quantum: rate / 10 (the kernel's r2q default), kept inside what HTB accepts without
# complaining (it warns above 200000) and at least one full-size frame.
_QUANTUM_MIN: Final = 1600
_QUANTUM_MAX: Final = 200_000

CGROUP_FILTER_PRIO: Final = 1
IPV4_FILTER_PRIO: Final = 2
IPV6_FILTER_PRIO: Final = 3
_OWN_PRIOS: Final = (CGROUP_FILTER_PRIO, IPV4_FILTER_PRIO, IPV6_FILTER_PRIO)
#: TCA_BPF_NAME of the cgroup filter; a new program version gets a new name and replaces the old.
CGROUP_FILTER_NAME: Final = "runtimeproxy-netcls-v1"
_ETH_P_ALL: Final = 0x0003
_ETH_P_IP: Final = 0x0800
_ETH_P_IPV6: Final = 0x86DD


def format_handle(handle: int) -> str:
    """A tc handle as tc prints it: 0x10030 -> "1:30", 0x10000 -> "1:"."""
    minor = handle & 0xFFFF
    return f"{handle >> 16:x}:{minor:x}" if minor else f"{handle >> 16:x}:"


def band_of(qos: QoSClass | str) -> QoSClass:
    """The band a QoS class uses: LSE, LSR and LS share LS."""
    return NETWORK_BANDS[QoSClass(qos)]


def band_classid(qos: QoSClass | str) -> int:
    """The HTB class (and net_cls.classid) of ``qos``'s band: 0x10010, 0x10020 or 0x10030."""
    return ROOT_HANDLE | _BAND_MINORS[band_of(qos)]


def band_rates(link_mbit: int, rate_percent: int, ceil_percent: int) -> tuple[int, int]:
    """(rate, ceil) in bytes per second for a band taking those percentages of a ``link_mbit`` link.

    Rounded down, so bands whose percentages add up to at most 100 never promise more than the
    link, and a ceil percentage at least the rate percentage gives a ceil at least the rate."""
    if link_mbit < 1:
        raise ValueError(f"link speed must be at least 1 Mbit/s, got {link_mbit}")
    if not (1 <= rate_percent <= 100 and 1 <= ceil_percent <= 100):
        raise ValueError(f"percentages must be 1..100, got rate {rate_percent}, ceil {ceil_percent}")
    link = link_mbit * _MBIT_BYTES
    return link * rate_percent // 100, link * ceil_percent // 100


def _quantum(rate: int) -> int:
    return min(max(rate // 10, _QUANTUM_MIN), _QUANTUM_MAX)


@dataclass(frozen=True)
class ClassPlan:
    """One HTB class: rates in bytes per second, as the kernel keeps them."""

    name: str
    classid: int
    parent: int
    rate: int
    ceil: int
    prio: int
    quantum: int

    @property
    def rate_bits(self) -> int:
        return self.rate * 8

    @property
    def ceil_bits(self) -> int:
        return self.ceil * 8


@dataclass(frozen=True)
class TreePlan:
    """The tree for one interface: ``link_source`` is "policy", "sysfs" or "fallback"."""

    interface: str
    link_mbit: int
    link_source: str
    parent: ClassPlan
    bands: tuple[ClassPlan, ...]
    default_minor: int = _BAND_MINORS[DEFAULT_BAND]

    @property
    def classes(self) -> tuple[ClassPlan, ...]:
        return (self.parent, *self.bands)

    def band(self, name: QoSClass | str) -> ClassPlan:
        for band in self.bands:
            if band.name == str(name):
                return band
        raise KeyError(name)


def plan_tree(section: NetworkConfig, link_mbit: int, link_source: str = "policy") -> TreePlan:
    """The HTB tree for ``section`` on a ``link_mbit`` link."""
    link = link_mbit * _MBIT_BYTES
    parent = ClassPlan("link", PARENT_CLASSID, ROOT_HANDLE, link, link, 0, _quantum(link))
    bands = []
    for band in BANDS:
        entry: NetworkBandSettings = getattr(section, band.value)
        rate, ceil = band_rates(link_mbit, entry.rate_percent, entry.ceil_percent)
        bands.append(
            ClassPlan(band.value, band_classid(band), PARENT_CLASSID, rate, ceil, entry.priority, _quantum(rate))
        )
    return TreePlan(section.interface, link_mbit, link_source, parent, tuple(bands))


def _bits(rate: int) -> str:
    bits = rate * 8
    for unit, size in (("Gbit", 10**9), ("Mbit", 10**6), ("Kbit", 10**3)):
        if bits >= size and bits % size == 0:
            return f"{bits // size}{unit}"
    return f"{bits}bit"


def tc_commands(plan: TreePlan) -> list[str]:
    """The iproute2 commands that build ``plan``'s tree (the plugin uses netlink, not these)."""
    dev = plan.interface or "<interface>"
    lines = [f"tc qdisc replace dev {dev} root handle {MAJOR}: htb default {plan.default_minor:x}"]
    for cls in plan.classes:
        prio = f" prio {cls.prio}" if cls.classid != PARENT_CLASSID else ""
        lines.append(
            f"tc class replace dev {dev} parent {format_handle(cls.parent)} classid {format_handle(cls.classid)} "
            f"htb rate {_bits(cls.rate)} ceil {_bits(cls.ceil)}{prio} quantum {cls.quantum}"
        )
    lines.append(
        f"tc filter add dev {dev} parent {MAJOR}: prio {CGROUP_FILTER_PRIO} protocol all bpf "
        f"(net_cls classid, name {CGROUP_FILTER_NAME})"
    )
    lines.append(
        f"tc filter add dev {dev} parent {MAJOR}: prio {IPV4_FILTER_PRIO} protocol ip u32 "
        "match ip src <pod-ip>/32 classid <band class>  (one per pod address)"
    )
    return lines


def explain(section: NetworkConfig, link_mbit: int | None = None) -> dict[str, Any]:
    """What the plugin would do with ``section``, as plain data. ``link_mbit`` overrides the policy's
    speed; with neither, rates are shown as percentages only (the speed is read at run time)."""
    speed = link_mbit if link_mbit else section.link_speed_mbit
    bands = []
    for band in BANDS:
        entry: NetworkBandSettings = getattr(section, band.value)
        item: dict[str, Any] = {
            "band": band.value,
            "classes": sorted(qos.value for qos, use in NETWORK_BANDS.items() if use is band),
            "classid": format_handle(band_classid(band)),
            "rate_percent": entry.rate_percent,
            "ceil_percent": entry.ceil_percent,
            "priority": entry.priority,
        }
        if speed:
            rate, ceil = band_rates(speed, entry.rate_percent, entry.ceil_percent)
            item["rate_bits"], item["ceil_bits"] = rate * 8, ceil * 8
        bands.append(item)
    result: dict[str, Any] = {
        "enabled": bool(section.interface),
        "interface": section.interface,
        "link_speed_mbit": speed or None,
        "link_speed_source": "argument"
        if link_mbit
        else "policy"
        if section.link_speed_mbit
        else f"/sys/class/net/{section.interface or '<interface>'}/speed",
        "root": f"{MAJOR}: htb default {format_handle(band_classid(DEFAULT_BAND))} ({DEFAULT_BAND.value})",
        "bands": bands,
        "classification": [
            "net_cls.classid of the pod cgroup + cls_bpf filter (host-network pods)",
            "u32 source-address filter per pod address (pod-network pods)",
        ],
    }
    if speed:
        result["tc"] = tc_commands(plan_tree(section, speed))
    return result


# --- running code in a network namespace ---------------------------------------------------------

_CLONE_NEWNET: Final = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _netns_path(netns: str | None) -> str | None:
    if not netns:
        return None
    return netns if "/" in netns else f"/run/netns/{netns}"


def run_in_netns(netns: str | None, fn: Callable[[], _T]) -> _T:
    """``fn()`` in a new thread, moved into network namespace ``netns`` (a name under /run/netns,
    a path such as /proc/PID/ns/net, or None for this process's own). A fresh thread also keeps
    pyroute2's sync API away from any running asyncio loop. Only that thread changes namespace."""
    path = _netns_path(netns)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC) if path is not None else None
    outcome: list[Any] = []

    def target() -> None:
        try:
            if fd is not None and _libc.setns(fd, _CLONE_NEWNET) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"setns({path}): {os.strerror(code)}")
            outcome.append((True, fn()))
        except BaseException as exc:
            outcome.append((False, exc))

    try:
        thread = threading.Thread(target=target, name="network-netns", daemon=True)
        thread.start()
        thread.join()
    finally:
        if fd is not None:
            os.close(fd)
    ok, value = outcome[0]
    if not ok:
        raise value
    result: _T = value
    return result


def _netns_id(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def link_speed_mbit(interface: str, netns: str | None = None, sys_root: str = "/sys") -> int | None:
    """The interface's speed from ``/sys/class/net/<interface>/speed``; None when unknown (no such
    file, -1, or an interface in another namespace, which this process's sysfs does not show)."""
    if netns is not None:
        return None
    try:
        text = Path(sys_root, "class", "net", interface, "speed").read_text().strip()
        speed = int(text)
    except (OSError, ValueError):
        return None
    return speed if 0 < speed < 0xFFFFFFFF else None


# --- the BPF program of the cgroup filter ---------------------------------------------------------

_BPF_PROG_LOAD: Final = 5
_BPF_PROG_TYPE_SCHED_CLS: Final = 3
_BPF_FUNC_GET_CGROUP_CLASSID: Final = 17
_SYS_BPF: Final = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _classid_program(major: int = MAJOR) -> bytes:
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


def _load_classid_program() -> int:
    """Load the program; its file descriptor (the filter keeps its own reference). OSError when the
    kernel refuses (no CAP_BPF, no BPF syscall on this architecture)."""
    number = _SYS_BPF.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"no bpf syscall number known for {platform.machine()}")
    program = _classid_program()
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
        fd = int(_libc.syscall(number, _BPF_PROG_LOAD, buf, len(attr)))
        if fd >= 0:
            return fd
        error = ctypes.get_errno()
    verifier = log_buf.value.decode(errors="replace").strip()
    raise OSError(error, f"loading the net_cls BPF program failed: {os.strerror(error)}. {verifier}".strip())


# --- reading and changing the tree (pyroute2) ----------------------------------------------------


@dataclass(frozen=True)
class ClassState:
    classid: int
    parent: int
    rate: int
    ceil: int
    prio: int
    quantum: int
    bytes: int = 0


@dataclass(frozen=True)
class IPFilter:
    """A u32 filter at one of the plugin's address priorities; ``address`` None when it is not
    one the plugin would have made."""

    prio: int
    handle: int
    protocol: int
    address: str | None
    classid: int


@dataclass(frozen=True)
class TcSnapshot:
    """What is on the interface now: root qdisc, the classes under 1:, and the filters at 1:."""

    ifindex: int
    root_kind: str | None
    root_handle: int
    default_minor: int | None
    classes: Mapping[int, ClassState]
    cgroup_filters: tuple[tuple[int, str], ...]  # (handle, name) of bpf filters at prio 1
    ip_filters: tuple[IPFilter, ...]
    foreign_filters: tuple[tuple[int, int, str], ...]  # (prio, handle, kind) at our prios, not ours

    @property
    def ours(self) -> bool:
        return self.root_kind == "htb" and self.root_handle == ROOT_HANDLE


def _attr(message: Any, name: str) -> Any:
    return message.get_attr(name) if message is not None else None


def _u32_keys(sel: Any) -> list[tuple[int, int, int]] | None:
    """(mask, value, offset) of each key in a TCA_U32_SEL attribute, read from its raw bytes
    (pyroute2 0.9 decodes the keys shifted by four bytes); None when they cannot be read."""
    try:
        raw = bytes(sel.data[sel.offset + 4 : sel.offset + sel.length])
        count = raw[2]
        keys = []
        for i in range(count):
            mask, value = struct.unpack_from(">II", raw, 16 + 16 * i)
            (offset,) = struct.unpack_from("=i", raw, 16 + 16 * i + 8)
            keys.append((mask, value, offset))
    except (AttributeError, IndexError, TypeError, struct.error):
        return None
    return keys


def _address_of(protocol: int, keys: list[tuple[int, int, int]] | None) -> str | None:
    """The source address a filter with these keys matches, when it is exactly the plugin's match."""
    if keys is None:
        return None
    if protocol == _ETH_P_IP and len(keys) == 1 and keys[0][0] == 0xFFFFFFFF and keys[0][2] == 12:
        return str(ipaddress.IPv4Address(keys[0][1]))
    if protocol == _ETH_P_IPV6 and [(k[0], k[2]) for k in keys] == [(0xFFFFFFFF, off) for off in (8, 12, 16, 20)]:
        packed = b"".join(struct.pack(">I", k[1]) for k in keys)
        return str(ipaddress.IPv6Address(packed))
    return None


def _u32_match(address: str) -> tuple[int, int, list[str]]:
    """(prio, protocol, pyroute2 keys) of the filter matching source ``address``."""
    ip = ipaddress.ip_address(address)
    if ip.version == 4:
        return IPV4_FILTER_PRIO, _ETH_P_IP, [f"0x{int(ip):08x}/0xffffffff+12"]
    words = struct.unpack(">IIII", ip.packed)
    return IPV6_FILTER_PRIO, _ETH_P_IPV6, [f"0x{w:08x}/0xffffffff+{8 + 4 * i}" for i, w in enumerate(words)]


class NoSuchInterface(LookupError):
    pass


class Shaper:
    """The HTB tree on ``interface`` (in network namespace ``netns``; None: this process's)."""

    def __init__(self, interface: str, netns: str | None = None) -> None:
        self.interface = interface
        self.netns = netns
        self.problems: list[str] = []

    def __repr__(self) -> str:
        return f"Shaper({self.interface!r}, netns={self.netns!r})"

    def _run(self, fn: Callable[[Any, int], _T]) -> _T:
        def work() -> _T:
            from pyroute2 import IPRoute

            with IPRoute() as ipr:
                found = ipr.link_lookup(ifname=self.interface)
                if not found:
                    where = f" in network namespace {self.netns}" if self.netns else ""
                    raise NoSuchInterface(f"no interface {self.interface!r}{where}")
                return fn(ipr, int(found[0]))

        return run_in_netns(self.netns, work)

    def netns_id(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the interface's network namespace."""
        path = _netns_path(self.netns)
        return _netns_id(path if path is not None else "/proc/self/ns/net")

    # -- reading --

    def snapshot(self) -> TcSnapshot:
        return self._run(_snapshot)

    # -- changing --

    def ensure_tree(self, plan: TreePlan) -> list[str]:
        """Make the tree ``plan`` (and the cgroup filter); the repairs made, [] when all was in place.
        What could not be done without failing the rest (no BPF) is in ``problems`` afterwards."""
        problems: list[str] = []
        repairs = self._run(lambda ipr, index: _ensure_tree(ipr, index, plan, problems))
        self.problems = problems
        return repairs

    def sync_addresses(self, wanted: Mapping[str, int], *, remove_others: bool) -> list[str]:
        """Make address filters send each of ``wanted`` (address -> classid) to its class; with
        ``remove_others`` also remove the ones for other addresses. The changes made."""
        return self._run(lambda ipr, index: _sync_addresses(ipr, index, wanted, remove_others, ()))

    def remove_addresses(self, addresses: Iterable[str]) -> list[str]:
        gone = tuple(addresses)
        return self._run(lambda ipr, index: _sync_addresses(ipr, index, {}, False, gone))

    def class_bytes(self) -> dict[int, int]:
        """Bytes each class has sent (classid -> bytes)."""
        return {classid: cls.bytes for classid, cls in self.snapshot().classes.items()}

    def teardown(self) -> bool:
        """Delete the root qdisc if it is the plugin's (htb 1:); True if one was deleted."""

        def work(ipr: Any, index: int) -> bool:
            snap = _snapshot(ipr, index)
            if not snap.ours:
                return False
            ipr.tc("del", "htb", index, ROOT_HANDLE, parent=0xFFFFFFFF)
            return True

        return self._run(work)


def _snapshot(ipr: Any, index: int) -> TcSnapshot:
    root_kind, root_handle, default = None, 0, None
    for qdisc in ipr.get_qdiscs(index):
        if qdisc["parent"] == 0xFFFFFFFF:
            root_kind, root_handle = _attr(qdisc, "TCA_KIND"), int(qdisc["handle"])
            init = _attr(_attr(qdisc, "TCA_OPTIONS"), "TCA_HTB_INIT")
            default = int(init["defcls"]) if init else None
    classes: dict[int, ClassState] = {}
    cgroup_filters: list[tuple[int, str]] = []
    ip_filters: list[IPFilter] = []
    foreign: list[tuple[int, int, str]] = []
    if root_kind == "htb" and root_handle == ROOT_HANDLE:
        for cls in ipr.get_classes(index):
            options = _attr(cls, "TCA_OPTIONS")
            parms = _attr(options, "TCA_HTB_PARMS")
            if parms is None:
                continue
            rate = _attr(options, "TCA_HTB_RATE64") or parms["rate"]
            ceil = _attr(options, "TCA_HTB_CEIL64") or parms["ceil"]
            basic = _attr(_attr(cls, "TCA_STATS2"), "TCA_STATS_BASIC")
            sent = int(basic["bytes"]) if basic else 0
            parent = int(cls["parent"])
            parent = ROOT_HANDLE if parent == 0xFFFFFFFF else parent  # a class right under the qdisc says "root"
            classes[int(cls["handle"])] = ClassState(
                int(cls["handle"]), parent, int(rate), int(ceil), parms["prio"], parms["quantum"], sent
            )
        for filt in ipr.get_filters(index, parent=ROOT_HANDLE):
            info = int(filt["info"])
            prio, protocol = info >> 16, int.from_bytes((info & 0xFFFF).to_bytes(2, "little"), "big")
            options = _attr(filt, "TCA_OPTIONS")
            handle, kind = int(filt["handle"]), _attr(filt, "TCA_KIND")
            if prio not in _OWN_PRIOS or options is None:
                continue  # not ours, or the per-priority header entry
            if kind == "u32" and _attr(options, "TCA_U32_DIVISOR") is not None:
                continue  # the hash table u32 keeps for itself
            if prio == CGROUP_FILTER_PRIO and kind == "bpf":
                cgroup_filters.append((handle, str(_attr(options, "TCA_BPF_NAME") or "")))
            elif prio in (IPV4_FILTER_PRIO, IPV6_FILTER_PRIO) and kind == "u32":
                sel = _attr(options, "TCA_U32_SEL")
                address = _address_of(protocol, _u32_keys(sel)) if sel is not None else None
                classid = int(_attr(options, "TCA_U32_CLASSID") or 0)
                ip_filters.append(IPFilter(prio, handle, protocol, address, classid))
            else:
                foreign.append((prio, handle, str(kind)))
    return TcSnapshot(
        index, root_kind, root_handle, default, classes, tuple(cgroup_filters), tuple(ip_filters), tuple(foreign)
    )


def _class_kwargs(cls: ClassPlan) -> dict[str, Any]:
    return {"parent": cls.parent, "rate": cls.rate, "ceil": cls.ceil, "prio": cls.prio, "quantum": cls.quantum}


def _ensure_tree(ipr: Any, index: int, plan: TreePlan, problems: list[str]) -> list[str]:
    repairs: list[str] = []
    snap = _snapshot(ipr, index)
    if not snap.ours or snap.default_minor != plan.default_minor:
        # HTB cannot change its default class in place (EINVAL): replace the root qdisc.
        what = f"{snap.root_kind} {format_handle(snap.root_handle)}" if snap.root_kind else "none"
        repairs.append(f"root qdisc (was {what}, default {snap.default_minor})")
        if snap.root_kind == "htb" and snap.root_handle == ROOT_HANDLE:
            ipr.tc("del", "htb", index, ROOT_HANDLE, parent=0xFFFFFFFF)
        ipr.tc("replace", "htb", index, ROOT_HANDLE, parent=0xFFFFFFFF, default=plan.default_minor)
        snap = _snapshot(ipr, index)
    for cls in plan.classes:
        have = snap.classes.get(cls.classid)
        if have is None:
            ipr.tc("add-class", "htb", index, cls.classid, **_class_kwargs(cls))
            repairs.append(f"class {format_handle(cls.classid)} added")
        elif (have.parent, have.rate, have.ceil, have.prio, have.quantum) != (
            cls.parent,
            cls.rate,
            cls.ceil,
            cls.prio,
            cls.quantum,
        ):
            ipr.tc("change-class", "htb", index, cls.classid, **_class_kwargs(cls))
            repairs.append(f"class {format_handle(cls.classid)} changed")
    foreign = {prio: kind for prio, _handle, kind in snap.foreign_filters}
    mine = [name for _handle, name in snap.cgroup_filters]
    if mine != [CGROUP_FILTER_NAME] or CGROUP_FILTER_PRIO in foreign:
        if mine or CGROUP_FILTER_PRIO in foreign:
            # One priority holds one kind of filter: drop the whole priority and start afresh.
            kind = foreign.get(CGROUP_FILTER_PRIO, "bpf")
            ipr.tc("del-filter", kind, index, parent=ROOT_HANDLE, prio=CGROUP_FILTER_PRIO, protocol=0)
            repairs.append(f"cgroup filter replaced (found {kind}: {', '.join(mine) or '-'})")
        else:
            repairs.append("cgroup filter added")
        try:
            fd = _load_classid_program()
        except OSError as exc:  # no BPF here: the tree and the address filters still work
            problems.append(f"cgroup filter unavailable: {exc}")
            repairs.pop()
        else:
            try:
                ipr.tc(
                    "add-filter",
                    "bpf",
                    index,
                    1,
                    parent=ROOT_HANDLE,
                    prio=CGROUP_FILTER_PRIO,
                    protocol=_ETH_P_ALL,
                    fd=fd,
                    name=CGROUP_FILTER_NAME,
                )
            finally:
                os.close(fd)
    for prio in (IPV4_FILTER_PRIO, IPV6_FILTER_PRIO):
        if prio in foreign:  # not u32: the address filters could not be added there
            ipr.tc("del-filter", foreign[prio], index, parent=ROOT_HANDLE, prio=prio, protocol=0)
            repairs.append(f"foreign {foreign[prio]} filters at prio {prio} removed")
    return repairs


def _delete_filter(ipr: Any, index: int, prio: int, handle: int, protocol: int) -> None:
    # No kind: pyroute2 would build u32 options (and want a target) for a deletion; so the
    # priority and protocol go in tcm_info by hand.
    info = (prio << 16) | int.from_bytes(protocol.to_bytes(2, "big"), "little")
    ipr.tc("del-filter", None, index, handle=handle, parent=ROOT_HANDLE, info=info)


def _sync_addresses(
    ipr: Any, index: int, wanted: Mapping[str, int], remove_others: bool, remove: Sequence[str]
) -> list[str]:
    changes: list[str] = []
    snap = _snapshot(ipr, index)
    if not snap.ours:
        raise RuntimeError(
            f"no {format_handle(ROOT_HANDLE)} htb root qdisc on interface {index}: set up the tree first"
        )
    wanted = {str(ipaddress.ip_address(address)): classid for address, classid in wanted.items()}
    gone = {str(ipaddress.ip_address(address)) for address in remove}
    present: dict[str, int] = {}
    for filt in snap.ip_filters:
        keep = (
            filt.address is not None
            and filt.address not in gone
            and filt.address not in present
            and (filt.address in wanted or not remove_others)
            and wanted.get(filt.address, filt.classid) == filt.classid
        )
        if keep:
            assert filt.address is not None
            present[filt.address] = filt.classid
            continue
        _delete_filter(ipr, index, filt.prio, filt.handle, filt.protocol)
        what = filt.address or "unrecognised match"
        changes.append(f"address filter {what} -> {format_handle(filt.classid)} removed")
    for address, classid in wanted.items():
        if present.get(address) == classid:
            continue
        prio, protocol, keys = _u32_match(address)
        ipr.tc("add-filter", "u32", index, parent=ROOT_HANDLE, prio=prio, protocol=protocol, target=classid, keys=keys)
        changes.append(f"address filter {address} -> {format_handle(classid)} added")
    return changes


# --- pods: net_cls classids and addresses ----------------------------------------------------------

_NET_CLS: Final = "net_cls"
_PID_CONTROLLERS: Final = (_NET_CLS, "pids", "cpu", "memory")


def net_cls_available(cgroups: CgroupFS | None) -> bool:
    if cgroups is None:
        return False
    try:
        return cgroups.version == 1 and (cgroups.root / _NET_CLS / "net_cls.classid").is_file()
    except CgroupError:
        return False


def ensure_pod_classid(cgroups: CgroupFS, cgroup_parent: str, classid: int) -> int:
    """Write ``classid`` to net_cls.classid of the pod's cgroup and every cgroup below it (the
    pod's own first, so that cgroups created later inherit it); how many files were changed.
    0 when the pod has no net_cls cgroup (yet). Reads and writes go through ``cgroups`` (which
    records instead of writing in a dry run)."""
    if not cgroups.exists(cgroup_parent, controller=_NET_CLS):
        return 0
    base = cgroups.path(_NET_CLS, "")
    top = cgroups.path(_NET_CLS, cgroup_parent)
    below = sorted(os.path.relpath(directory, base) for directory, _dirs, _files in os.walk(top))
    parents = ["/" + parent_path(cgroup_parent), *("/" + rel for rel in below if rel != os.path.relpath(top, base))]
    changed = 0
    for parent in parents:
        try:
            if cgroups.read(_NET_CLS, "net_cls.classid", parent) == str(classid):
                continue
            cgroups.write(_NET_CLS, "net_cls.classid", classid, parent)
        except FileNotFoundError:  # removed meanwhile
            continue
        changed += 1
    return changed


def sandbox_pids(cgroups: CgroupFS, cgroup_parent: str, sandbox_id: str) -> list[int]:
    """The processes in the sandbox container's cgroup (the first controller that has them)."""
    for controller in _PID_CONTROLLERS:
        try:
            text = cgroups.read(controller, "cgroup.procs", cgroup_parent, sandbox_id)
        except (OSError, CgroupError):
            continue
        pids = [int(line) for line in text.split() if line.isdigit()]
        if pids:
            return pids
    return []


def netns_addresses(netns: str) -> list[str]:
    """The global unicast addresses in network namespace ``netns`` (a path or /run/netns name)."""

    def work() -> list[str]:
        from pyroute2 import IPRoute

        found: list[str] = []
        with IPRoute() as ipr:
            for message in ipr.get_addr():
                text = message.get_attr("IFA_LOCAL") or message.get_attr("IFA_ADDRESS")
                if not text:
                    continue
                ip = ipaddress.ip_address(text)
                if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
                    continue
                if str(ip) not in found:
                    found.append(str(ip))
        return found

    return run_in_netns(netns, work)


@dataclass(frozen=True)
class PodAddresses:
    """``host_network`` None when no process of the sandbox was found (addresses unknown)."""

    host_network: bool | None
    addresses: tuple[str, ...] = ()


def pod_addresses(cgroups: CgroupFS, pod: PodInfo, shaper_netns: tuple[int, int]) -> PodAddresses:
    """Whether the pod shares the shaped interface's network namespace, and if not its addresses."""
    if not pod.sandbox_id or not pod.cgroup_parent:
        return PodAddresses(None)
    for pid in sandbox_pids(cgroups, pod.cgroup_parent, pod.sandbox_id):
        path = f"/proc/{pid}/ns/net"
        try:
            if _netns_id(path) == shaper_netns:
                return PodAddresses(True)
            return PodAddresses(False, tuple(netns_addresses(path)))
        except OSError:  # the process is gone
            continue
    return PodAddresses(None)


# --- the plugin --------------------------------------------------------------------------------------


@dataclass
class _Pod:
    band: QoSClass
    sandbox_id: str = ""
    addresses: tuple[str, ...] = ()


@dataclass
class NetworkQoS:
    """The plugin's state: the shaper in use and what it knows of each pod. Thread-safe."""

    shaper: Shaper | None = None
    plan: TreePlan | None = None
    netns: str | None = None
    pods: dict[str, _Pod] = field(default_factory=dict)
    drift: Counter[str] = field(default_factory=Counter)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _warned: set[str] = field(default_factory=set)

    @property
    def active(self) -> bool:
        return self.shaper is not None

    def _warn_once(self, logger: Any, key: str, message: str, **fields: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, **fields)

    def resolve_plan(self, section: NetworkConfig, logger: Any) -> TreePlan:
        if section.link_speed_mbit:
            return plan_tree(section, section.link_speed_mbit, "policy")
        speed = link_speed_mbit(section.interface, self.netns)
        if speed is not None:
            return plan_tree(section, speed, "sysfs")
        self._warn_once(
            logger,
            f"speed:{section.interface}",
            "link speed unknown; sizing the tree for the fallback speed: set network.link_speed_mbit",
            interface=section.interface,
            fallback_mbit=FALLBACK_LINK_MBIT,
            sysfs=f"/sys/class/net/{section.interface}/speed",
        )
        return plan_tree(section, FALLBACK_LINK_MBIT, "fallback")

    def start(self, section: NetworkConfig, logger: Any, *, netns: str | None = None) -> list[str]:
        """Set up the tree for ``section`` (a no-op with one log line when its interface is "")."""
        with self._lock:
            self.netns = netns
            if not section.interface:
                self.shaper, self.plan = None, None
                logger.info("network QoS disabled: policy network.interface is empty")
                return []
            try:
                return self._apply_tree(section, logger, startup=True)
            except BaseException:
                self.shaper, self.plan = None, None
                raise

    def _apply_tree(self, section: NetworkConfig, logger: Any, *, startup: bool = False) -> list[str]:
        if self.shaper is not None and self.shaper.interface != section.interface:
            old = self.shaper
            removed = old.teardown()
            logger.info("network interface changed; old tree removed", old=old.interface, removed=removed)
            self.pods.clear()
            self.shaper, self.plan = None, None
        if self.shaper is None:  # first set-up (or after a tear-down): what it does is not drift
            self.shaper, startup = Shaper(section.interface, self.netns), True
        plan = self.resolve_plan(section, logger)
        # Changes the policy (or a new link speed) asks for are updates; the rest is drift.
        updated, self.plan = self.plan is not None and plan != self.plan, plan
        repairs = self.shaper.ensure_tree(plan)
        for problem in self.shaper.problems:
            self._warn_once(logger, problem, "network QoS degraded", interface=section.interface, problem=problem)
        if updated and repairs:
            logger.info("network QoS tree updated to the policy", interface=section.interface, changes=repairs)
        elif startup:
            logger.info(
                "network QoS tree in place",
                interface=section.interface,
                link_mbit=plan.link_mbit,
                link_source=plan.link_source,
                bands={b.name: f"rate {_bits(b.rate)} ceil {_bits(b.ceil)} prio {b.prio}" for b in plan.bands},
                changes=repairs,
            )
        elif repairs:
            self._count(logger, "tree", repairs)
        return repairs

    def _count(self, logger: Any, kind: str, repairs: Sequence[str], **fields: Any) -> None:
        self.drift[kind] += len(repairs)
        logger.warning("network QoS drift repaired", kind=kind, repairs=list(repairs), **fields)

    def classify(self, pod: PodInfo, qos: QoSClass, cgroups: CgroupFS | None, logger: Any) -> _Pod | None:
        """Put ``pod`` into its band: net_cls classid, and address filters for a pod-network pod."""
        with self._lock:
            if self.shaper is None:
                return None
            return self._classify(pod, qos, cgroups, logger, drift=False)

    @staticmethod
    def rehearse(pod: PodInfo, qos: QoSClass, cgroups: CgroupFS | None, logger: Any) -> None:
        """A dry run of ``classify``: the classid writes go to ``cgroups`` (which records them);
        the address filters, which need netlink, are only described."""
        band = band_of(qos)
        classid = band_classid(band)
        if cgroups is not None and pod.cgroup_parent and net_cls_available(cgroups):
            ensure_pod_classid(cgroups, pod.cgroup_parent, classid)
        logger.info(
            "network: pod goes to its band (dry run)",
            band=band.value,
            classid=format_handle(classid),
            address_filters="one u32 source-address filter per address, for a pod-network pod (not shown)",
        )

    def _classify(self, pod: PodInfo, qos: QoSClass, cgroups: CgroupFS | None, logger: Any, *, drift: bool) -> _Pod:
        assert self.shaper is not None
        band = band_of(qos)
        classid = band_classid(band)
        entry = self.pods.get(pod.uid)
        # Changes for a pod seen before, unchanged, are drift; a new pod, sandbox or band is not.
        drift = drift and entry is not None and entry.sandbox_id == pod.sandbox_id and entry.band is band
        if entry is None or entry.sandbox_id != pod.sandbox_id:  # a new sandbox may have new addresses
            entry = self.pods[pod.uid] = _Pod(band, pod.sandbox_id)
        entry.band = band
        if cgroups is None:
            return entry
        if net_cls_available(cgroups):
            if pod.cgroup_parent:
                try:
                    changed = ensure_pod_classid(cgroups, pod.cgroup_parent, classid)
                except (OSError, CgroupError) as exc:
                    logger.warning("cannot set net_cls.classid", pod_uid=pod.uid, error=str(exc))
                    changed = 0
                if changed and drift:
                    self._count(logger, "classid", [f"{changed} net_cls.classid file(s)"], pod_uid=pod.uid)
        else:
            self._warn_once(
                logger,
                "net_cls",
                "no cgroup v1 net_cls hierarchy: host-network pods stay in the default band "
                "(mount one: mount -t cgroup -o net_cls net_cls <cgroup root>/net_cls)",
                cgroup_root=str(cgroups.root),
            )
        if not entry.addresses:
            found = pod_addresses(cgroups, pod, self.shaper.netns_id())
            entry.addresses = found.addresses
        if entry.addresses:
            changes = self.shaper.sync_addresses(dict.fromkeys(entry.addresses, classid), remove_others=False)
            if changes and drift:
                self._count(logger, "address", changes, pod_uid=pod.uid)
            elif changes:
                logger.info("pod classified", pod_uid=pod.uid, band=band.value, changes=changes)
        return entry

    def forget(self, pod: PodInfo, logger: Any) -> None:
        """Drop a stopped pod's address filters (its addresses may go to a new pod)."""
        with self._lock:
            entry = self.pods.pop(pod.uid, None)
            if self.shaper is None or entry is None or not entry.addresses:
                return
            changes = self.shaper.remove_addresses(entry.addresses)
            logger.info("pod address filters removed", pod_uid=pod.uid, changes=changes)

    def reconcile(
        self, pods: Sequence[PodInfo], section: NetworkConfig, cgroups: CgroupFS | None, logger: Any
    ) -> Counter[str]:
        """Re-check the tree and every pod's classification against ``section``; the drift found
        this time, by kind (also added to ``drift``)."""
        with self._lock:
            before = Counter(self.drift)
            if not section.interface:
                if self.shaper is not None:
                    removed = self.shaper.teardown()
                    logger.info("network QoS disabled by policy; tree removed", removed=removed)
                    self.shaper, self.plan = None, None
                    self.pods.clear()
                return Counter()
            self._apply_tree(section, logger)
            live = {pod.uid for pod in pods}
            for uid in set(self.pods) - live:
                del self.pods[uid]
            wanted: dict[str, int] = {}
            for pod in pods:
                try:
                    entry = self._classify(pod, qos_of(pod).qos_class, cgroups, logger, drift=True)
                except Exception as exc:  # one pod must not stop the others
                    logger.warning("cannot classify pod", pod_uid=pod.uid, error=f"{type(exc).__name__}: {exc}")
                    continue
                for address in entry.addresses:
                    wanted[address] = band_classid(entry.band)
            assert self.shaper is not None
            stale = self.shaper.sync_addresses(wanted, remove_others=True)
            if stale:
                self._count(logger, "address", stale)
            found = self.drift - before
            return found


plugin = Plugin(
    "network",
    version="1.0",
    order=60,
    failure_policy="ignore",
    timeout=5.0,
    description="Egress bandwidth bands (SYSTEM/LS/BE) with HTB; pods classified by net_cls classid and address",
    settings=NetworkBandSettings,
    section=NetworkSection,
    class_entry={qos.value: band.value for qos, band in NETWORK_BANDS.items()},
    defaults=policy_mod.builtin_defaults("network"),
    check=_check_rates,
    state=NetworkQoS,
)
assert plugin.settings_spec is not None
_SPEC: Final[SettingsSpec] = plugin.settings_spec
BandsFor = Callable[[QoSClass], NetworkBandSettings]


# In a dry run (``runtime-hooks explain``) nothing goes through netlink: on_start describes the
# tree, hook calls write classids through the recording ``cgroups`` handle only.


@plugin.on_start
def _start(
    *,
    server: Any,
    section: NetworkSection,
    settings_for: BandsFor,
    state: NetworkQoS,
    log: Any,
    dry_run: bool = False,
    **kwargs: Any,
) -> None:
    config = network_config(section, settings_for)
    if dry_run:
        info = explain(config)
        log.info(
            "network: tree the policy asks for (dry run)", **{k: info[k] for k in ("enabled", "interface", "root")}
        )
        return
    netns = server.settings.get("network_netns") if server is not None else None
    state.start(config, log, netns=netns or None)


@plugin.on_stop
def _stop(*, state: NetworkQoS, log: Any, **kwargs: Any) -> None:
    if state.shaper is not None:
        log.info("leaving the network QoS tree in place", interface=state.shaper.interface)


# The hook handlers are async so that, with shaping off (no interface in the policy), a call
# costs nothing; the netlink work runs on a thread (pyroute2's sync API cannot run inside
# the server's event loop).


@plugin.on(HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER)
async def _classify(
    *,
    pod: PodInfo,
    qos: QoSClass,
    section: NetworkSection,
    state: NetworkQoS,
    cgroups: CgroupFS | None,
    log: Any,
    dry_run: bool = False,
    **kwargs: Any,
) -> None:
    if dry_run:
        if section.interface:
            NetworkQoS.rehearse(pod, qos, cgroups, log)
        return
    if state.shaper is not None:
        await asyncio.to_thread(state.classify, pod, qos, cgroups, log)


@plugin.on(HookPoint.POST_STOP_POD_SANDBOX)
async def _forget(*, pod: PodInfo, state: NetworkQoS, log: Any, dry_run: bool = False, **kwargs: Any) -> None:
    if not dry_run and state.shaper is not None:
        await asyncio.to_thread(state.forget, pod, log)


@plugin.reconcile
def _reconcile(
    *,
    pods: Sequence[PodInfo],
    section: NetworkSection,
    settings_for: BandsFor,
    state: NetworkQoS,
    cgroups: CgroupFS | None,
    log: Any,
    dry_run: bool = False,
    **kwargs: Any,
) -> int:
    """The number of drifted things set back (tree parts, classid files, address filters)."""
    if dry_run:
        return 0
    return sum(state.reconcile(pods, network_config(section, settings_for), cgroups, log).values())


# --- tear-down and the command line ------------------------------------------------------------------


def teardown(interface: str, netns: str | None = None, state: NetworkQoS | None = None) -> bool:
    """Remove the plugin's tree from ``interface`` (its root qdisc, with all classes and filters).
    Leaves any other root qdisc alone; True if the tree was there. ``state``: the plugin's state
    in a running server, which then forgets the tree."""
    removed = Shaper(interface, netns).teardown()
    if state is not None:
        with state._lock:
            if state.shaper is not None and state.shaper.interface == interface and state.shaper.netns == netns:
                state.shaper, state.plan = None, None
                state.pods.clear()
    return removed


def _section(policy_file: str | None, interface: str | None, link_mbit: int | None) -> NetworkConfig:
    specs = {plugin.name: _SPEC}
    policy = policy_mod.load_policy(policy_file, specs=specs) if policy_file else policy_mod.default_policy(specs)
    loaded = policy.section(_SPEC)
    config = network_config(loaded.common, loaded.for_class)
    changes: dict[str, Any] = {}
    if interface is not None:
        changes["interface"] = interface
    if link_mbit is not None:
        changes["link_speed_mbit"] = link_mbit
    return replace(config, **changes) if changes else config


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m runtimeproxy.hooks.plugins.network {plan,show,teardown} ...``"""
    parser = argparse.ArgumentParser(
        prog="python -m runtimeproxy.hooks.plugins.network", description="runtimeproxy network QoS (HTB bands)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    plan_cmd = commands.add_parser("plan", help="print the tree the policy asks for (no changes)")
    plan_cmd.add_argument("--policy", help="policy YAML (default: the built-in policy)")
    plan_cmd.add_argument("--interface")
    plan_cmd.add_argument("--link-speed", type=int, help="Mbit/s (default: the policy's)")
    for name, text in (("show", "print the tree on an interface"), ("teardown", "remove the tree from an interface")):
        cmd = commands.add_parser(name, help=text)
        cmd.add_argument("interface")
        cmd.add_argument("--netns", help="network namespace (name under /run/netns or a path)")
    args = parser.parse_args(argv)
    if args.command == "plan":
        section = _section(args.policy, args.interface, args.link_speed)
        print(json.dumps(explain(section), indent=2))
        return 0
    try:
        if args.command == "teardown":
            removed = teardown(args.interface, args.netns)
            print(f"{args.interface}: tree removed" if removed else f"{args.interface}: no runtimeproxy tree")
            return 0
        snap = Shaper(args.interface, args.netns).snapshot()
    except (NoSuchInterface, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "root": f"{snap.root_kind} {format_handle(snap.root_handle)}" if snap.root_kind else None,
                "ours": snap.ours,
                "default": format_handle(ROOT_HANDLE | snap.default_minor) if snap.default_minor else None,
                "classes": {
                    format_handle(c.classid): {"rate": _bits(c.rate), "ceil": _bits(c.ceil), "prio": c.prio}
                    for c in snap.classes.values()
                },
                "cgroup_filter": [name for _, name in snap.cgroup_filters],
                "address_filters": {f.address or f"?{f.handle:#x}": format_handle(f.classid) for f in snap.ip_filters},
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
