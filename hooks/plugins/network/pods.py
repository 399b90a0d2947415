"""Pods: their net_cls classids, and the addresses of a pod-network pod's namespace."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from ...cgroups import CgroupError, CgroupFS, parent_path
from ...sdk import PodInfo
from .netns import netns_addresses, netns_id_of

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
            if netns_id_of(path) == shaper_netns:
                return PodAddresses(True)
            return PodAddresses(False, tuple(netns_addresses(path)))
        except OSError:  # the process is gone
            continue
    return PodAddresses(None)
