"""Changing the tree through netlink (pyroute2): the :class:`Shaper` of one interface."""

from __future__ import annotations

import ipaddress
import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from .bpf import load_classid_program
from .netns import netns_id_of, netns_path, run_in_netns
from .plan import (
    CGROUP_FILTER_NAME,
    CGROUP_FILTER_PRIO,
    ETH_P_ALL,
    ETH_P_IP,
    ETH_P_IPV6,
    IPV4_FILTER_PRIO,
    IPV6_FILTER_PRIO,
    ROOT_HANDLE,
    ClassPlan,
    TreePlan,
    format_handle,
)
from .snapshot import TcSnapshot, read_snapshot

_T = TypeVar("_T")


def _u32_match(address: str) -> tuple[int, int, list[str]]:
    """(prio, protocol, pyroute2 keys) of the filter matching source ``address``."""
    ip = ipaddress.ip_address(address)
    if ip.version == 4:
        return IPV4_FILTER_PRIO, ETH_P_IP, [f"0x{int(ip):08x}/0xffffffff+12"]
    words = struct.unpack(">IIII", ip.packed)
    return IPV6_FILTER_PRIO, ETH_P_IPV6, [f"0x{w:08x}/0xffffffff+{8 + 4 * i}" for i, w in enumerate(words)]


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
        path = netns_path(self.netns)
        return netns_id_of(path if path is not None else "/proc/self/ns/net")

    # -- reading --

    def snapshot(self) -> TcSnapshot:
        return self._run(read_snapshot)

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
            snap = read_snapshot(ipr, index)
            if not snap.ours:
                return False
            ipr.tc("del", "htb", index, ROOT_HANDLE, parent=0xFFFFFFFF)
            return True

        return self._run(work)


def _class_kwargs(cls: ClassPlan) -> dict[str, Any]:
    return {"parent": cls.parent, "rate": cls.rate, "ceil": cls.ceil, "prio": cls.prio, "quantum": cls.quantum}


def _ensure_tree(ipr: Any, index: int, plan: TreePlan, problems: list[str]) -> list[str]:
    repairs: list[str] = []
    snap = read_snapshot(ipr, index)
    if not snap.ours or snap.default_minor != plan.default_minor:
        # HTB cannot change its default class in place (EINVAL): replace the root qdisc.
        what = f"{snap.root_kind} {format_handle(snap.root_handle)}" if snap.root_kind else "none"
        repairs.append(f"root qdisc (was {what}, default {snap.default_minor})")
        if snap.root_kind == "htb" and snap.root_handle == ROOT_HANDLE:
            ipr.tc("del", "htb", index, ROOT_HANDLE, parent=0xFFFFFFFF)
        ipr.tc("replace", "htb", index, ROOT_HANDLE, parent=0xFFFFFFFF, default=plan.default_minor)
        snap = read_snapshot(ipr, index)
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
            fd = load_classid_program()
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
                    protocol=ETH_P_ALL,
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
    snap = read_snapshot(ipr, index)
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
