"""Reading what is on an interface now (pyroute2 messages): root qdisc, classes, filters."""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .plan import (
    CGROUP_FILTER_PRIO,
    ETH_P_IP,
    ETH_P_IPV6,
    IPV4_FILTER_PRIO,
    IPV6_FILTER_PRIO,
    OWN_PRIOS,
    ROOT_HANDLE,
)


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
    if protocol == ETH_P_IP and len(keys) == 1 and keys[0][0] == 0xFFFFFFFF and keys[0][2] == 12:
        return str(ipaddress.IPv4Address(keys[0][1]))
    if protocol == ETH_P_IPV6 and [(k[0], k[2]) for k in keys] == [(0xFFFFFFFF, off) for off in (8, 12, 16, 20)]:
        packed = b"".join(struct.pack(">I", k[1]) for k in keys)
        return str(ipaddress.IPv6Address(packed))
    return None


def read_snapshot(ipr: Any, index: int) -> TcSnapshot:
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
            if prio not in OWN_PRIOS or options is None:
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
