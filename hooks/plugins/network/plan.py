"""The HTB tree the policy asks for, and how to show it: pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ...qos import QoSClass
from .config import NETWORK_BANDS, NetworkBandSettings, NetworkConfig

MAJOR: Final = 1
ROOT_HANDLE: Final = MAJOR << 16  # 1:
PARENT_CLASSID: Final = ROOT_HANDLE | 0x1  # 1:1
BANDS: Final = (QoSClass.SYSTEM, QoSClass.LS, QoSClass.BE)
_BAND_MINORS: Final = {QoSClass.SYSTEM: 0x10, QoSClass.LS: 0x20, QoSClass.BE: 0x30}
DEFAULT_BAND: Final = QoSClass.SYSTEM
#: Used when the link speed is neither in the policy nor readable (see the package doc).
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
OWN_PRIOS: Final = (CGROUP_FILTER_PRIO, IPV4_FILTER_PRIO, IPV6_FILTER_PRIO)
#: TCA_BPF_NAME of the cgroup filter; a new program version gets a new name and replaces the old.
CGROUP_FILTER_NAME: Final = "runtimeproxy-netcls-v1"
# The filters' protocols (linux/if_ether.h).
ETH_P_ALL: Final = 0x0003
ETH_P_IP: Final = 0x0800
ETH_P_IPV6: Final = 0x86DD


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


def format_rate(rate: int) -> str:
    """A rate in bytes per second as tc writes it, in bits: 1250000 -> "10Mbit"."""
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
            f"htb rate {format_rate(cls.rate)} ceil {format_rate(cls.ceil)}{prio} quantum {cls.quantum}"
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
