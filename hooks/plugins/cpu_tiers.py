"""Group identity above and beside the live pods: kubelet's QoS tiers and dangling pod cgroups.

koordlet's groupidentity hook keeps ``cpu.bvt_warp_ns`` on more than the pods it runs:

* **the QoS tiers** (:func:`reconcile_tiers`): kubelet's ``burstable`` cgroup gets LS's value
  and ``besteffort`` BE's (:func:`.cpu_qos.tier_group_identity`), under every pod root, in
  the cgroupfs form (``/kubepods/burstable``) or the systemd one
  (``kubepods.slice/kubepods-burstable.slice``; hooks/cgroups.py allows exactly these tiers);
* **dangling pod cgroups** (:class:`DanglingPods`): a pod cgroup under a root or a tier that
  no live pod owns (its pod is gone, the cgroup is not yet) gets the value of where it sits
  -- 0 right under a root (Guaranteed), the tier's value under a tier -- and so do its
  containers' cgroups, so that a policy change reaches them too.

The live pods come from the runtime (hooks/reconciler.py), which lists a sandbox only once it
exists: a pod cgroup kubelet has just made for a sandbox being started is not listed yet. So a
cgroup is taken for dangling only when two rounds in a row found it unowned, and only while no
process runs in it or its containers: a pod the runtime runs but the round could not read
(hooks/reconciler.py skips an undecodable one) keeps its value. koordlet, which lists pods from
kubelet, also resets a dangling cgroup that still has processes (a pod being torn down); here
that one is reset once it is empty. Only files that exist and differ are written; nothing is
created.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, get_args

from ..cgroups import CgroupError, CgroupFS, CgroupPathError, KubeTier, parent_path
from ..qos import QoSClass
from ..views import PodInfo
from .cpu_qos import GROUP_IDENTITY_OFF, GroupIdentitySettings, tier_group_identity

__all__ = ["BVT_FILE", "DanglingPods", "reconcile_tiers", "set_group_identity"]

BVT_FILE = "cpu.bvt_warp_ns"

SettingsFor = Callable[[QoSClass], GroupIdentitySettings]


def set_group_identity(fs: CgroupFS, parent: str, value: int, log: Any, container_id: str | None = None) -> bool:
    """``value`` into the cgroup's group identity where the file exists and differs; True if written."""
    try:
        now = fs.read_if_exists("cpu", BVT_FILE, parent, container_id)
        if now is None or now.strip() == str(value):
            return False
        fs.set_group_identity(parent, value, container_id)
    except (OSError, CgroupError, ValueError) as exc:
        log.warning("group identity not written", cgroup=parent, container=container_id, error=str(exc))
        return False
    return True


def reconcile_tiers(fs: CgroupFS, settings_for: SettingsFor, log: Any) -> int:
    """Bring each QoS tier's group identity to its class's; how many tiers were written."""
    written = 0
    for tier in get_args(KubeTier):
        value = tier_group_identity(tier, settings_for)
        for parent in fs.pod_roots.tiers(tier):
            if set_group_identity(fs, parent, value, log):
                log.info("QoS tier group identity set", cgroup=parent, value=value)
                written += 1
    return written


def _levels(fs: CgroupFS, settings_for: SettingsFor) -> Iterable[tuple[str, int]]:
    """Where pod cgroups sit and the value a dangling one there gets: each root (0), each tier."""
    for root in fs.pod_roots.root_paths():
        yield root, GROUP_IDENTITY_OFF
    for tier in get_args(KubeTier):
        value = tier_group_identity(tier, settings_for)
        for parent in fs.pod_roots.tiers(tier):
            yield parent, value


def _children(fs: CgroupFS, parent: str) -> list[str]:
    """The directory names right below the cgroup ``parent`` in the cpu hierarchy (none if absent)."""
    try:
        with os.scandir(fs.path("cpu", parent)) as entries:
            return [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    except (OSError, CgroupPathError):
        return []


class DanglingPods:
    """Pod cgroups no live pod owns, found across rounds (see the module doc); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unowned: set[str] = set()  # found unowned in the previous round

    def reconcile(
        self,
        fs: CgroupFS,
        pods: Sequence[PodInfo],
        settings_for: SettingsFor,
        log: Any,
    ) -> int:
        """Set the dangling pod cgroups (and their containers') to their level's value; how many
        cgroups were written."""
        owned = {_nested(pod.cgroup_parent) for pod in pods if pod.cgroup_parent}
        found: dict[str, int] = {}
        for level, value in _levels(fs, settings_for):
            for name in _children(fs, level):
                child = f"{level}/{name}"
                if fs.pod_roots.problem(child) is None and child not in owned:
                    found[child] = value
        with self._lock:
            confirmed = {child: value for child, value in found.items() if child in self._unowned}
            self._unowned = set(found)
        written = 0
        for child, value in confirmed.items():
            names = _children(fs, child)
            if _busy(fs, child, names):
                continue
            pod_written = set_group_identity(fs, child, value, log)
            containers = [name for name in names if set_group_identity(fs, child, value, log, name)]
            if pod_written or containers:
                log.info("dangling pod cgroup group identity set", cgroup=child, value=value, containers=containers)
            written += int(pod_written) + len(containers)
        return written


def _busy(fs: CgroupFS, pod: str, containers: Sequence[str]) -> bool:
    """Whether a process runs in the pod cgroup or one of its containers' (unreadable counts as busy)."""
    try:
        texts = [fs.read_if_exists("cpu", "cgroup.procs", pod)]
        texts.extend(fs.read_if_exists("cpu", "cgroup.procs", pod, name) for name in containers)
    except (OSError, CgroupError):
        return True
    return any(text and text.strip() for text in texts)


def _nested(parent: str) -> str:
    """A CRI cgroup parent as the nested path :func:`_levels` builds (``/kubepods/burstable/pod1``)."""
    try:
        return "/" + parent_path(parent)
    except CgroupPathError:
        return parent
