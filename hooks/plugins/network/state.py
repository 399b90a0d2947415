"""The plugin's state (:class:`NetworkQoS`): the tree in use, each pod's band and addresses."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...cgroups import CgroupError, CgroupFS
from ...qos import QoSClass
from ...sdk import PodInfo, qos_of
from .config import NetworkConfig
from .netns import link_speed_mbit
from .plan import FALLBACK_LINK_MBIT, TreePlan, band_classid, band_of, format_handle, format_rate, plan_tree
from .pods import ensure_pod_classid, net_cls_available, pod_addresses
from .tc import Shaper


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
                bands={
                    b.name: f"rate {format_rate(b.rate)} ceil {format_rate(b.ceil)} prio {b.prio}" for b in plan.bands
                },
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
