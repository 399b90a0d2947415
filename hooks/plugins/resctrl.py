"""The ``resctrl`` plugin: last-level cache ways (L3 CAT) and memory bandwidth (MBA) per QoS class.

What it does
------------

**At start** (``on_start``) it creates one resctrl control group per class group and writes
each group's schemata -- the L3 line(s) and the MB line, every cache / MB domain listed -- in
ONE write, so the kernel applies it all or nothing. The groups and the classes in them:

===========  ===================  =================================================
group        classes              why
===========  ===================  =================================================
``rtpx-LSR`` LSE, LSR             Koordinator puts LSE pods into its LSR group
``rtpx-LS``  LS, SYSTEM           SYSTEM has no group in Koordinator; here it shares
                                  LS's (the default policy gives both the same values)
``rtpx-BE``  BE
===========  ===================  =================================================

A group's values come from the policy entries of its classes. When they differ (a policy
giving LSE other values than LSR, say), the group gets the widest of them -- the lowest
``l3_percent_range`` start, the highest end, the highest ``mb_percent`` -- so no class gets
less than its entry asks; the plan notes it (:func:`plan_groups`). Percentages become cache ways
as koordlet computes them (:func:`~runtimeproxy.hooks.resctrl_fs.l3_mask`); a range that
covers fewer ways than the cache accepts leaves that group's L3 line out (logged once; its ways
stay as they are, where koordlet's write of the same mask fails in the kernel).

**CLOSIDs are few** (often 16, 8 or 4 with CDP), the root group holds one, and other tools'
groups hold theirs. The plugin never creates more than ``num_closids - 1`` groups in all: with
room for fewer than three it merges, logging the merge once at start:

* two groups: ``rtpx-LS`` holds LSE, LSR, LS and SYSTEM (with the widest of their values),
  ``rtpx-BE`` holds BE;
* one group: only ``rtpx-BE``; the other classes stay in the root group (full cache and
  bandwidth, which nothing here changes);
* none: the plugin disables itself.

Groups named ``rtpx-*`` left over from an earlier run that the current layout does not use
are removed (their tasks go back to the root group) so that they hold no CLOSID.

**Without resctrl** -- no ``resctrl`` handle (``--resctrl-root`` not mounted): the plugin
``needs=("resctrl",)``, so it is not called at all. No allocation resource the plugin can use
(no L3 CAT and no percent-based MBA: AMD bandwidth units or an ``mba_MBps`` mount), or no
CLOSID left: the plugin logs ONE line saying why and does nothing afterwards. Only L3 or only
MB is fine: the other line is left out. Its state (``ResctrlState``, one per server: the
controller and counters) comes as ``state`` to every handler.

**PostStartContainer**: every thread of the new container joins its class's group. The
kernel moves the *thread* whose id is written, so the ids come from the container cgroup's
``cgroup.threads`` (v2) or ``tasks`` (v1, the ``cpu`` hierarchy), and from those of any cgroup
nested below it; one id per write (:meth:`ResctrlFS.add_tasks`). Threads created later inherit
the group. A pod's class is its containers' class.

**Reconcile** (every ``reconciler.interval_seconds``, with the pods the caller passes):

* every group is read back and its schemata compared, as parsed values, with what the
  *current* policy asks; a group that drifted (edited behind our back, or the policy changed)
  gets its schemata written again, a group that vanished is created again -- each counted
  in :func:`stats` as ``schemata_repaired``;
* each pod's threads -- its whole cgroup subtree, sandbox included -- that are not in their
  group yet are moved in (``tasks_moved``): threads someone moved out, and containers whose
  PostStartContainer call was missed (threads a process starts later inherit its group).

The handler returns groups repaired plus threads moved, the runner's drift count.

The plugin keeps no state per pod: a pod that is gone needs nothing in resctrl (its tasks
left the group as they exited), and reconcile only looks at the pods it is given. Stopping
the server leaves the groups as they are (tasks and all), so a restart changes nothing.

The pure parts -- :func:`group_layout`, :func:`class_group_settings`, :func:`plan_groups` --
touch no file, for ``explain`` and tests.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from ..cgroups import CgroupError, CgroupFS, CgroupVersion
from ..kernel_files import read_bytes
from ..pacing import paced
from ..policy import builtin_defaults
from ..qos import QoSClass
from ..resctrl_fs import (
    ResctrlError,
    ResctrlFS,
    ResctrlInfo,
    ResctrlTasksError,
    l3_mask,
    parse_schemata,
    schemata_lines,
)
from ..sdk import ContainerInfo, HookPoint, Plugin, PodInfo, qos_of
from ..settings import integer, parsed_by, percent_range

__all__ = [
    "GROUP_PREFIX",
    "LAYOUTS",
    "GroupPlan",
    "ResctrlPlan",
    "ResctrlReconcileReport",
    "ResctrlSettings",
    "ResctrlState",
    "cgroup_threads",
    "class_group_settings",
    "disabled_reason",
    "group_layout",
    "plan_groups",
    "plugin",
    "reconcile_pods",
    "stats",
    "usable_resources",
]


@dataclass(frozen=True)
class ResctrlSettings:
    """``l3_percent_range``: (start, end) of the L3 cache ways the class may fill, in percent
    (CAT), start < end. ``mb_percent``: its memory bandwidth ceiling (MBA), 1..100."""

    l3_percent_range: tuple[int, int] = field(metadata=parsed_by(percent_range))
    mb_percent: int = field(metadata=parsed_by(integer(1, 100, "a percentage")))


#: A class's settings, as handlers get them (``settings_for``).
SettingsFor = Callable[[QoSClass], ResctrlSettings]

#: Every group this plugin creates is named with this prefix; other groups are never touched.
GROUP_PREFIX: Final = "rtpx-"

_LSR: Final = GROUP_PREFIX + "LSR"
_LS: Final = GROUP_PREFIX + "LS"
_BE: Final = GROUP_PREFIX + "BE"

_Layout = tuple[tuple[str, tuple[QoSClass, ...]], ...]

#: Group layouts by the number of groups there is room for (3 or more: the full layout).
LAYOUTS: Final[Mapping[int, _Layout]] = MappingProxyType(
    {
        3: (
            (_LSR, (QoSClass.LSE, QoSClass.LSR)),
            (_LS, (QoSClass.LS, QoSClass.SYSTEM)),
            (_BE, (QoSClass.BE,)),
        ),
        2: (
            (_LS, (QoSClass.LSE, QoSClass.LSR, QoSClass.LS, QoSClass.SYSTEM)),
            (_BE, (QoSClass.BE,)),
        ),
        1: ((_BE, (QoSClass.BE,)),),
        0: (),
    }
)


# --- the plan (pure) ----------------------------------------------------------------------------


def group_layout(room: int) -> _Layout:
    """The groups (name, classes) to create when ``room`` more groups fit (see the module doc)."""
    return LAYOUTS[max(0, min(room, 3))]


def class_group_settings(settings_for: SettingsFor, classes: Iterable[QoSClass]) -> tuple[tuple[int, int], int, bool]:
    """The (l3 percent range, mb percent) of a group holding ``classes``: the widest of their
    policy entries. The third value says whether the entries differed (so widening happened)."""
    entries = [settings_for(QoSClass(qos)) for qos in classes]
    if not entries:
        raise ValueError("a group needs at least one class")
    start = min(entry.l3_percent_range[0] for entry in entries)
    end = max(entry.l3_percent_range[1] for entry in entries)
    mb = max(entry.mb_percent for entry in entries)
    differ = len({(entry.l3_percent_range, entry.mb_percent) for entry in entries}) > 1
    return (start, end), mb, differ


def usable_resources(info: ResctrlInfo) -> tuple[bool, bool, tuple[str, ...]]:
    """Whether L3 CAT and percent-based MBA can be used on this mount, and why not where not."""
    reasons: list[str] = []
    l3 = info.l3 is not None and bool(info.l3.cache_ids)
    if not l3:
        reasons.append("no L3 cache allocation")
    mb = info.mb is not None and info.mb.percent and bool(info.mb.domain_ids)
    if info.mb is None:
        reasons.append("no memory bandwidth allocation")
    elif not info.mb.percent:
        reasons.append("MB values are not percentages (AMD units or an mba_MBps mount)")
    return l3, bool(mb), tuple(reasons)


@dataclass(frozen=True)
class GroupPlan:
    """One group: its name, classes, the values it gets and the schemata text written for them."""

    name: str
    classes: tuple[QoSClass, ...]
    l3_percent_range: tuple[int, int] | None
    mb_percent: int | None
    schemata: str
    widened: bool = False
    #: why the group's L3 line is left out although the host has L3 CAT ("" when it is not)
    l3_refused: str = ""

    def parsed(self) -> dict[str, dict[int, int]]:
        return parse_schemata(self.schemata)


@dataclass(frozen=True)
class ResctrlPlan:
    """What the plugin sets up: the groups, each class's group (None: stays in the root group),
    and notes on merges and widening."""

    groups: tuple[GroupPlan, ...]
    class_group: Mapping[QoSClass, str | None]
    notes: tuple[str, ...] = ()

    def group(self, name: str) -> GroupPlan:
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(name)

    def describe(self) -> dict[str, Any]:
        """The plan as plain data (for ``explain``)."""
        return {
            "groups": {
                group.name: {
                    "classes": [qos.value for qos in group.classes],
                    "l3_percent_range": list(group.l3_percent_range) if group.l3_percent_range else None,
                    "mb_percent": group.mb_percent,
                    "schemata": group.schemata.splitlines(),
                }
                for group in self.groups
            },
            "classes": {qos.value: group for qos, group in self.class_group.items()},
            "notes": list(self.notes),
        }


def _l3_refusal(info: ResctrlInfo, l3_range: tuple[int, int]) -> str:
    """Why ``l3_range`` gives no mask this cache accepts ("" when it does). Such a group's L3
    line is left out: its cache ways stay as they are, as when the kernel refuses koordlet's
    write of that mask."""
    assert info.l3 is not None
    try:
        l3_mask(info.l3.cbm_mask, info.l3.min_cbm_bits, *l3_range)
    except ValueError as exc:
        return str(exc)
    return ""


def plan_groups(info: ResctrlInfo, settings_for: SettingsFor, room: int) -> ResctrlPlan:
    """The groups for ``room`` free CLOSIDs on a mount described by ``info``, with each class's
    settings from ``settings_for``.

    Raises ResctrlUnsupported (via schemata_lines) only for a resource ``info`` says it lacks,
    which usable_resources rules out first; returns a plan without groups when neither L3 nor
    percent MB is usable or there is no room.
    """
    use_l3, use_mb, reasons = usable_resources(info)
    layout = group_layout(room) if (use_l3 or use_mb) else ()
    notes: list[str] = []
    if not (use_l3 or use_mb):
        notes.append("nothing to allocate: " + "; ".join(reasons))
    elif room < 3:
        placed = {qos for _, classes in layout for qos in classes}
        merged = ", ".join(f"{name}: {'+'.join(q.value for q in classes)}" for name, classes in layout) or "none"
        rooted = ", ".join(q.value for q in QoSClass if q not in placed)
        notes.append(
            f"room for {max(room, 0)} resctrl group(s) only: {merged}"
            + (f"; {rooted} stay in the root group" if rooted else "")
        )
    groups: list[GroupPlan] = []
    for name, classes in layout:
        l3_range, mb, differ = class_group_settings(settings_for, classes)
        if differ:
            notes.append(f"{name}: its classes' policies differ; it gets the widest (L3 {l3_range}, MB {mb}%)")
        refused = _l3_refusal(info, l3_range) if use_l3 else ""
        if refused:
            notes.append(f"{name}: L3 left as it is: {refused}")
        group_l3 = use_l3 and not refused
        text = (
            schemata_lines(info, l3_range if group_l3 else None, mb if use_mb else None) if group_l3 or use_mb else ""
        )
        groups.append(
            GroupPlan(
                name=name,
                classes=classes,
                l3_percent_range=l3_range if group_l3 else None,
                mb_percent=mb if use_mb else None,
                schemata=text,
                widened=differ,
                l3_refused=refused,
            )
        )
    class_group: dict[QoSClass, str | None] = dict.fromkeys(QoSClass)
    for name, classes in layout:
        for qos in classes:
            class_group[qos] = name
    return ResctrlPlan(tuple(groups), MappingProxyType(class_group), tuple(notes))


# --- reading a cgroup's threads -----------------------------------------------------------------


def _read_ids(path: str) -> set[int]:
    try:
        data = read_bytes(path, follow=False)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENODEV, errno.ELOOP):
            return set()  # the cgroup went away (ELOOP: a link, not a cgroup file)
        raise
    return _parse_ids(data.decode("ascii", "replace"))


def _parse_ids(text: str) -> set[int]:
    return {int(word) for word in text.split() if word.isdigit() and int(word) > 0}


def cgroup_threads(cgroups: CgroupFS, parent: str, container_id: str | None = None) -> set[int]:
    """Every thread id in the pod's (or container's) cgroup and the cgroups below it.

    v2 lists a cgroup's threads in ``cgroup.threads`` (every cgroup has it), v1 in ``tasks``
    (the ``cpu`` hierarchy is read). Empty when the cgroup does not exist. The cgroup itself is
    read through ``cgroups`` (so a dry-run handle answers for it), those below it directly.
    """
    if not cgroups.exists(parent, container_id, "cpu"):
        return set()
    name = "cgroup.threads" if cgroups.version is CgroupVersion.V2 else "tasks"
    try:
        found = _parse_ids(cgroups.read("cpu", name, parent, container_id))
    except FileNotFoundError:
        found = set()
    return found | _threads_below(str(cgroups.path("cpu", parent, container_id)), name)


def _threads_below(top: str, name: str) -> set[int]:
    """The thread ids in the ``name`` files of every cgroup below ``top`` (not following links).
    Every cgroup directory has that file, so a directory's other entries are only skipped over
    (os.walk would sort them all into lists: ~3,400 steps a reconcile round of 75 pods). A
    directory that is gone (a dry-run handle's simulated cgroup, a container just removed) has
    nothing below it."""
    found: set[int] = set()
    pending = [top]
    while pending:
        try:
            entries = os.scandir(pending.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                    found |= _read_ids(os.path.join(entry.path, name))
    return found


# --- state --------------------------------------------------------------------------------------


@dataclass
class ResctrlReconcileReport:
    """What one reconcile did."""

    schemata_repaired: list[str] = field(default_factory=list)
    tasks_moved: int = 0
    tasks_exited: int = 0
    pods: int = 0

    @property
    def repaired(self) -> int:
        """What the reconcile handler returns: groups repaired plus threads moved."""
        return len(self.schemata_repaired) + self.tasks_moved


class _Controller:
    """The groups of one started plugin: the layout fixed at start, counters, and the moves."""

    def __init__(self, fs: ResctrlFS, info: ResctrlInfo, room: int) -> None:
        self.fs = fs
        self.info = info
        self.room = room
        self.layout = group_layout(room)
        self.lock = threading.Lock()
        self.counters = {"schemata_repaired": 0, "tasks_moved": 0, "tasks_exited": 0, "task_failures": 0}
        self.refusals_logged: set[tuple[str, str]] = set()

    @property
    def group_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.layout)

    def plan(self, settings_for: SettingsFor, log: Any) -> ResctrlPlan:
        """The plan for the current policy; an L3 range this cache refuses is logged once."""
        plan = plan_groups(self.info, settings_for, self.room)
        for group in plan.groups:
            key = (group.name, group.l3_refused)
            if group.l3_refused and key not in self.refusals_logged:
                self.refusals_logged.add(key)
                log.warning("resctrl L3 range refused for this cache", group=group.name, reason=group.l3_refused)
        return plan

    def group_for(self, qos: QoSClass) -> str | None:
        for name, classes in self.layout:
            if qos in classes:
                return name
        return None

    def _count(self, name: str, amount: int) -> None:
        with self.lock:
            self.counters[name] += amount

    def create(self, plan: ResctrlPlan) -> None:
        """At start: make every group and write its schemata (one write each)."""
        for group in plan.groups:
            self.fs.ensure_group(group.name)
            if group.schemata:
                self.fs.write_schemata(group.name, group.schemata)

    def repair(self, plan: ResctrlPlan, log: Any) -> list[str]:
        """Re-create missing groups and rewrite schemata that differ from the plan; the groups repaired."""
        repaired: list[str] = []
        existing = set(self.fs.groups())
        for group in plan.groups:
            missing = group.name not in existing
            if missing:
                self.fs.ensure_group(group.name)
                drifted = True
            else:
                want = group.parsed()
                have = self.fs.schemata(group.name)
                drifted = any(have.get(resource) != values for resource, values in want.items())
            if drifted:
                if group.schemata:  # empty: no resource this group may set (the plan's notes say why)
                    self.fs.write_schemata(group.name, group.schemata)
                repaired.append(group.name)
                log.info(
                    "resctrl group repaired",
                    group=group.name,
                    reason="group was missing" if missing else "schemata drifted",
                    schemata=group.schemata.strip().replace("\n", "; "),
                )
        if repaired:
            self._count("schemata_repaired", len(repaired))
        return repaired

    def move(self, group: str, tids: Iterable[int], log: Any, known: set[int] | None = None) -> tuple[int, int]:
        """Move the threads not in ``group`` yet (``known``: its tasks, read when None); (moved, exited)."""
        current = self.fs.tasks(group) if known is None else known
        new = sorted(set(tids) - current)
        if not new:
            return 0, 0
        try:
            result = self.fs.add_tasks(group, new)
        except ResctrlTasksError as exc:
            result = exc.result
            self._count("task_failures", len(result.failed))
            log.warning("some threads could not join their resctrl group", group=group, error=str(exc))
        current.update(result.moved)
        self._count("tasks_moved", len(result.moved))
        self._count("tasks_exited", len(result.exited))
        return len(result.moved), len(result.exited)


class ResctrlState:
    """The plugin's state in one server: its controller, set up on first use (on_start, or the
    first call), or why there is none. Nothing is kept per pod."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready = False
        self.controller: _Controller | None = None
        self.disabled_reason = ""

    def reset(self) -> None:
        with self.lock:
            self.ready, self.controller, self.disabled_reason = False, None, ""

    def ensure(self, resctrl: ResctrlFS, settings_for: SettingsFor, log: Any) -> _Controller | None:
        """The controller, set up on first use."""
        with self.lock:
            if not self.ready:
                self.controller, self.disabled_reason = _setup(resctrl, settings_for, log)
                self.ready = True
            return self.controller


# Its handlers only read and write cgroup/resctrl files: async def, run on the loop (no thread hand-off).
plugin = Plugin(
    "resctrl",
    version="1.0",
    order=40,
    failure_policy="ignore",
    timeout=5.0,
    description="L3 cache ways and memory bandwidth per QoS class through resctrl groups",
    settings=ResctrlSettings,
    defaults=builtin_defaults("resctrl"),
    state=ResctrlState,
    needs=("resctrl",),
)


def _disabled(log: Any, reason: str) -> tuple[None, str]:
    log.info("resctrl plugin disabled", reason=reason)
    return None, reason


def _setup(resctrl: ResctrlFS, settings_for: SettingsFor, log: Any) -> tuple[_Controller | None, str]:
    if not resctrl.available():
        return _disabled(log, "resctrl is not mounted")
    try:
        info = resctrl.info(refresh=True)
        existing = resctrl.groups()
    except (ResctrlError, OSError) as exc:
        return _disabled(log, f"cannot read resctrl: {exc}")
    use_l3, use_mb, reasons = usable_resources(info)
    if not (use_l3 or use_mb):
        return _disabled(log, "; ".join(reasons))
    foreign = [name for name in existing if not name.startswith(GROUP_PREFIX)]
    room = min(3, info.max_groups - len(foreign))
    if room <= 0:
        detail = f"{', '.join(foreign)} hold the rest" if foreign else "the root group holds the only one"
        return _disabled(log, f"no CLOSID left: {info.num_closids} CLOSID(s), {detail}")
    controller = _Controller(resctrl, info, room)
    plan = controller.plan(settings_for, log)
    wanted = set(controller.group_names)
    try:
        for name in existing:
            if name.startswith(GROUP_PREFIX) and name not in wanted:
                resctrl.remove_group(name)  # left over from another layout: give its CLOSID back
        controller.create(plan)
    except (ResctrlError, OSError) as exc:
        return _disabled(log, f"cannot set up the resctrl groups: {exc}")
    if room < 3:
        log.warning("resctrl classes merged for lack of CLOSIDs", num_closids=info.num_closids, notes=list(plan.notes))
    log.info(
        "resctrl groups ready",
        groups={group.name: "+".join(q.value for q in group.classes) for group in plan.groups},
        l3=use_l3,
        mb=use_mb,
    )
    return controller, ""


def stats(state: ResctrlState) -> dict[str, int]:
    """Counters since the plugin started (``state``: its state in the server):
    schemata_repaired (groups re-created or rewritten), tasks_moved, tasks_exited, task_failures."""
    controller = state.controller
    if controller is None:
        return {"schemata_repaired": 0, "tasks_moved": 0, "tasks_exited": 0, "task_failures": 0}
    with controller.lock:
        return dict(controller.counters)


def disabled_reason(state: ResctrlState) -> str:
    """Why the plugin does nothing (``state``: its state in the server); "" when it works or has not started."""
    return state.disabled_reason


# --- handlers -----------------------------------------------------------------------------------


@plugin.on_start
async def start(*, resctrl: ResctrlFS, settings_for: SettingsFor, state: ResctrlState, log: Any, **kwargs: Any) -> None:
    state.reset()
    state.ensure(resctrl, settings_for, log)


@plugin.on_stop
async def stop(*, state: ResctrlState, **kwargs: Any) -> None:
    state.reset()  # the groups stay: their tasks keep running with the class's allocation


@plugin.on(HookPoint.POST_START_CONTAINER)
async def join_group(
    *,
    pod: PodInfo,
    container: ContainerInfo,
    qos: QoSClass,
    cgroups: CgroupFS | None,
    resctrl: ResctrlFS,
    settings_for: SettingsFor,
    state: ResctrlState,
    log: Any,
    **kwargs: Any,
) -> None:
    controller = state.ensure(resctrl, settings_for, log)
    if controller is None:
        return
    group = controller.group_for(qos)
    if group is None:
        return  # this class stays in the root group
    if cgroups is None or not container.id or not pod.cgroup_parent:
        log.debug("container cgroup unknown; its threads join at the next reconcile", group=group)
        return
    try:
        tids = cgroup_threads(cgroups, pod.cgroup_parent, container.id)
    except (CgroupError, OSError) as exc:
        log.warning("cannot read the container's threads", error=str(exc))
        return
    if not tids:
        log.debug("container cgroup has no threads (yet)", group=group)
        return
    if group not in controller.fs.groups():
        controller.repair(controller.plan(settings_for, log), log)  # removed behind our back
    moved, exited = controller.move(group, tids, log)
    log.debug("container threads joined resctrl group", group=group, moved=moved, exited=exited)


@plugin.reconcile
async def reconcile(
    *,
    pods: Sequence[PodInfo],
    cgroups: CgroupFS | None,
    resctrl: ResctrlFS,
    settings_for: SettingsFor,
    state: ResctrlState,
    log: Any,
    **kwargs: Any,
) -> int:
    """Repair drifted or missing groups and move the pods' stray threads into their groups;
    returns how many things it set back (groups repaired + threads moved). reconcile_pods, in slices
    (hooks/pacing.py): a hook call arriving meanwhile is not kept waiting for the whole round."""
    round_ = _Round.begin(cgroups, resctrl, settings_for, state, log)
    if round_ is not None:
        async for pod in paced(pods):
            round_.pod(pod)
        round_.end()
    return round_.report.repaired if round_ is not None else 0


def reconcile_pods(
    pods: Sequence[PodInfo],
    cgroups: CgroupFS | None,
    resctrl: ResctrlFS,
    settings_for: SettingsFor,
    state: ResctrlState,
    log: Any,
) -> ResctrlReconcileReport:
    """One reconcile round (see the module doc), with what it did."""
    round_ = _Round.begin(cgroups, resctrl, settings_for, state, log)
    if round_ is None:
        return ResctrlReconcileReport()
    for pod in pods:
        round_.pod(pod)
    round_.end()
    return round_.report


@dataclass
class _Round:
    """One reconcile round, pod by pod (the handler gives the loop a turn between slices of pods)."""

    controller: _Controller
    cgroups: CgroupFS | None
    log: Any
    report: ResctrlReconcileReport
    known: dict[str, set[int]]  # per group: its tasks, read once a round

    @classmethod
    def begin(
        cls, cgroups: CgroupFS | None, resctrl: ResctrlFS, settings_for: SettingsFor, state: ResctrlState, log: Any
    ) -> _Round | None:
        """The round after its groups are repaired; None when the plugin has no groups."""
        controller = state.ensure(resctrl, settings_for, log)
        if controller is None:
            return None
        report = ResctrlReconcileReport(schemata_repaired=controller.repair(controller.plan(settings_for, log), log))
        known = {name: controller.fs.tasks(name) for name in controller.group_names} if cgroups is not None else {}
        return cls(controller, cgroups, log, report, known)

    def pod(self, pod: PodInfo) -> None:
        """Move the pod's threads that are not in its class's group yet."""
        group = self.controller.group_for(qos_of(pod).qos_class)
        if self.cgroups is None or group is None or not pod.cgroup_parent:
            return
        try:
            tids = cgroup_threads(self.cgroups, pod.cgroup_parent)
        except (CgroupError, OSError) as exc:
            self.log.warning("cannot read the pod's threads", pod=f"{pod.namespace}/{pod.name}", error=str(exc))
            return
        report = self.report
        report.pods += 1
        moved, exited = self.controller.move(group, tids, self.log, self.known[group])
        report.tasks_moved += moved
        report.tasks_exited += exited

    def end(self) -> None:
        report = self.report
        if report.repaired:
            self.log.info(
                "resctrl reconciled",
                schemata_repaired=report.schemata_repaired,
                tasks_moved=report.tasks_moved,
                pods=report.pods,
            )
