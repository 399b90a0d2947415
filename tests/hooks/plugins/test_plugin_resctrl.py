"""The resctrl plugin (hooks/plugins/resctrl.py) against the fake resctrl kernel and fake cgroup trees
whose thread lists hold real thread ids of processes the tests start."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.cgroups import CgroupDriver, CgroupVersion
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.plugins import resctrl as resctrl_plugin
from runtimeproxy.hooks.plugins.resctrl import (
    GROUP_PREFIX,
    cgroup_threads,
    class_group_settings,
    group_layout,
    plan_groups,
    plugin,
    stats,
)
from runtimeproxy.hooks.policy import DEFAULT_POLICY, Policy
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.resctrl_fs import ResctrlInfo, l3_mask, mb_value
from runtimeproxy.hooks.sdk import ContainerInfo, HookPoint, PodInfo, ServerContext
from runtimeproxy.hooks.testkit import policy_from
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, KubeQoS, make_fake_cgroup_v1, make_fake_cgroup_v2
from runtimeproxy.hooks.testkit.fake_resctrl import FakeResctrl, make_fake_resctrl
from structlog.testing import capture_logs

START = HookPoint.POST_START_CONTAINER
LSR, LS, BE = f"{GROUP_PREFIX}LSR", f"{GROUP_PREFIX}LS", f"{GROUP_PREFIX}BE"

# BE gets [0, 30] of the ways (the default) and 55% bandwidth, stored as 60 (granularity 10).
POLICY = policy_from(
    "resctrl:\n  BE: {l3_percent_range: [0, 30], mb_percent: 55}\n  LS: {mb_percent: 80}\n  SYSTEM: {mb_percent: 80}\n"
)


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def spawn() -> Iterator[Callable[..., list[int]]]:
    """Start a process (``threads`` extra threads); returns its thread ids. Killed at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(threads: int = 0) -> list[int]:
        if threads:
            code = (
                "import threading, time\n"
                f"for _ in range({threads}): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                "time.sleep(60)\n"
            )
            proc = subprocess.Popen([sys.executable, "-c", code])
        else:
            proc = subprocess.Popen(["sleep", "60"])
        procs.append(proc)
        task_dir = f"/proc/{proc.pid}/task"
        deadline = time.monotonic() + 10
        while len(os.listdir(task_dir)) < threads + 1:
            assert time.monotonic() < deadline, "threads did not start"
            time.sleep(0.01)
        return sorted(int(tid) for tid in os.listdir(task_dir))

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


class Node:
    """A fake node: resctrl mount, cgroup tree, and a runner with the resctrl plugin."""

    def __init__(self, fake: FakeResctrl | None, tree: FakeCgroup, runner: PluginRunner, policy: list[Policy]) -> None:
        self.fake = fake
        self.tree = tree
        self.runner = runner
        self.policy = policy

    def pod(self, name: str, qos: str, kube: KubeQoS = "burstable") -> PodInfo:
        uid = f"uid-{name}"
        parent = self.tree.add_pod(uid, kube)
        return PodInfo(
            name=name,
            namespace="default",
            uid=uid,
            sandbox_id=f"sb-{name}",
            labels=MappingProxyType({"koordinator.sh/qosClass": qos}),
            cgroup_parent=parent,
        )

    def container(self, pod: PodInfo, cid: str, tids: list[int]) -> ContainerInfo:
        self.tree.add_container(pod.cgroup_parent, cid)
        self.set_threads(pod, cid, tids)
        return ContainerInfo(name=cid, id=cid)

    def set_threads(self, pod: PodInfo, cid: str | None, tids: list[int]) -> None:
        name = "cgroup.threads" if self.tree.version is CgroupVersion.V2 else "tasks"
        (self.tree.dir(pod.cgroup_parent, cid) / name).write_text("".join(f"{tid}\n" for tid in tids))

    def stats(self) -> dict[str, int]:
        return stats(self.runner.state_of("resctrl"))

    async def started(self, pod: PodInfo, container: ContainerInfo) -> None:
        result = await self.runner.run(START, pod=pod, container=container)
        assert result.failures == []


@pytest.fixture
def make_node(tmp_path: Path, stopped_runners: list[PluginRunner]) -> Callable[..., Node]:
    def make(
        *,
        version: int = 2,
        driver: CgroupDriver = "cgroupfs",
        resctrl: bool = True,
        policy: Policy = POLICY,
        **fake_options: Any,
    ) -> Node:
        fake = make_fake_resctrl(tmp_path / "resctrl", **fake_options) if resctrl else None
        maker = make_fake_cgroup_v2 if version == 2 else make_fake_cgroup_v1
        tree = maker(tmp_path / "cgroup", driver=driver)
        current = [policy]
        context = ServerContext(
            cgroups=tree.fs(), resctrl=fake.fs() if fake is not None else None, policy=lambda: current[0]
        )
        runner = PluginRunner([plugin], context=context, registry=CollectorRegistry())
        stopped_runners.append(runner)
        return Node(fake, tree, runner, current)

    return make


# --- the plan -----------------------------------------------------------------------------------


def settings_for(policy: Policy) -> Callable[[QoSClass], Any]:
    assert plugin.settings_spec is not None
    return policy.section(plugin.settings_spec).for_class


def test_layouts_never_need_more_groups_than_there_is_room_for() -> None:
    for room in range(-1, 6):
        layout = group_layout(room)
        assert len(layout) == max(0, min(room, 3))
        placed = [qos for _, classes in layout for qos in classes]
        assert len(placed) == len(set(placed)), "a class in two groups"
        if layout:
            assert QoSClass.BE in placed, "BE is the class that needs a group of its own first"
    assert dict(group_layout(3)) == {
        LSR: (QoSClass.LSE, QoSClass.LSR),
        LS: (QoSClass.LS, QoSClass.SYSTEM),
        BE: (QoSClass.BE,),
    }


def test_a_shared_group_gets_the_widest_of_its_classes_values() -> None:
    policy = policy_from(
        "resctrl:\n  LSE: {l3_percent_range: [10, 60], mb_percent: 40}\n"
        "  LSR: {l3_percent_range: [20, 80], mb_percent: 70}\n"
    )
    assert class_group_settings(settings_for(policy), (QoSClass.LSE, QoSClass.LSR)) == ((10, 80), 70, True)
    assert class_group_settings(settings_for(DEFAULT_POLICY), (QoSClass.LS, QoSClass.SYSTEM)) == ((0, 100), 100, False)


def test_plan_lists_every_cache_id_and_notes_merges(tmp_path: Path) -> None:
    fake = make_fake_resctrl(tmp_path / "r", l3_ids=(0, 1, 2, 3), mb_ids=(0, 1, 2, 3))
    info = ResctrlInfo.from_root(fake.root)
    plan = plan_groups(info, settings_for(POLICY), 3)
    assert plan.notes == ()
    assert plan.group(BE).schemata == "L3:0=f;1=f;2=f;3=f\nMB:0=60;1=60;2=60;3=60\n"
    assert plan.group(LSR).schemata == "L3:0=7ff;1=7ff;2=7ff;3=7ff\nMB:0=100;1=100;2=100;3=100\n"
    assert plan.describe()["classes"] == {"LSE": LSR, "LSR": LSR, "LS": LS, "BE": BE, "SYSTEM": LS}
    merged = plan_groups(info, settings_for(POLICY), 1)
    assert [g.name for g in merged.groups] == [BE]
    assert merged.class_group[QoSClass.LS] is None
    assert "LSE, LSR, LS, SYSTEM stay in the root group" in merged.notes[0]


def test_plan_uses_koordlets_way_rounding(tmp_path: Path) -> None:
    """11 ways: 10-50 % is ways 2..5 (mask 3c), 20-60 % ways 3..6 (mask 78), as koordlet writes them."""
    fake = make_fake_resctrl(tmp_path / "r", l3_ids=(0,), mb_ids=(0,))
    info = ResctrlInfo.from_root(fake.root)
    policy = policy_from(
        "resctrl:\n  BE: {l3_percent_range: [10, 50], mb_percent: 100}\n"
        "  LS: {l3_percent_range: [20, 60], mb_percent: 100}\n  SYSTEM: {l3_percent_range: [20, 60], mb_percent: 100}\n"
    )
    plan = plan_groups(info, settings_for(policy), 3)
    assert plan.group(BE).schemata == "L3:0=3c\nMB:0=100\n"
    assert plan.group(LS).schemata == "L3:0=78\nMB:0=100\n"


# A BE range of 10-15 % covers no whole way of 11 (2^(1.1 rounded up) .. 2^(1.65 rounded up)).
NO_WAY = policy_from("resctrl:\n  BE: {l3_percent_range: [10, 15], mb_percent: 55}\n")


def test_a_range_covering_no_whole_way_leaves_that_groups_l3_alone(tmp_path: Path) -> None:
    fake = make_fake_resctrl(tmp_path / "r", l3_ids=(0, 1), mb_ids=(0, 1))
    info = ResctrlInfo.from_root(fake.root)
    plan = plan_groups(info, settings_for(NO_WAY), 3)
    assert plan.group(BE).schemata == "MB:0=60;1=60\n"
    assert plan.group(BE).l3_percent_range is None
    assert "ways [2, 2)" in plan.group(BE).l3_refused
    assert any(note.startswith(f"{BE}: L3 left as it is") for note in plan.notes)
    assert plan.group(LS).schemata.startswith("L3:0=7ff;1=7ff\n")
    l3_only = plan_groups(
        ResctrlInfo.from_root(make_fake_resctrl(tmp_path / "l3", mb_ids=None).root), settings_for(NO_WAY), 3
    )
    assert l3_only.group(BE).schemata == ""


async def test_a_refused_l3_range_is_logged_once_and_the_group_keeps_its_ways(make_node: Any) -> None:
    node = make_node(mb_ids=None, policy=NO_WAY)
    with capture_logs() as logs:
        assert await node.runner.start() == []
        await node.runner.reconcile(pods=[])
        await node.runner.reconcile(pods=[])
    refused = [entry for entry in logs if entry["event"] == "resctrl L3 range refused for this cache"]
    assert len(refused) == 1 and refused[0]["group"] == BE
    assert node.fake.groups() == [BE, LS, LSR]
    assert node.fake.schemata_writes(BE) == []  # nothing the kernel would refuse is written
    assert node.fake.schemata(BE)["L3"] == {0: 0x7FF, 1: 0x7FF}  # a new group's full mask, untouched


# --- start: groups and schemata -----------------------------------------------------------------


async def test_start_creates_a_group_per_class_group_with_one_schemata_write_each(make_node: Any) -> None:
    node = make_node(l3_ids=(0, 1, 2, 3), mb_ids=(0, 1, 2, 3))
    assert await node.runner.start() == []
    fake = node.fake
    assert fake.groups() == [BE, LS, LSR]
    width_mask = 0x7FF
    be_mask = l3_mask(width_mask, 1, 0, 30)
    assert be_mask == 0xF
    ids = (0, 1, 2, 3)
    assert fake.schemata(BE) == {"L3": dict.fromkeys(ids, be_mask), "MB": dict.fromkeys(ids, mb_value(55, 10, 10))}
    assert fake.schemata(LS) == {"L3": dict.fromkeys(ids, width_mask), "MB": dict.fromkeys(ids, 80)}
    assert fake.schemata(LSR) == {"L3": dict.fromkeys(ids, width_mask), "MB": dict.fromkeys(ids, 100)}
    for group in (BE, LS, LSR):
        writes = fake.schemata_writes(group)
        assert len(writes) == 1, f"{group}: the L3 and MB lines must go in one write"
        assert writes[0].count(b"\n") == 2 and writes[0].endswith(b"\n")
    assert fake.schemata_writes(BE) == [b"L3:0=f;1=f;2=f;3=f\nMB:0=60;1=60;2=60;3=60\n"]


async def test_cdp_writes_the_same_mask_to_code_and_data(make_node: Any) -> None:
    node = make_node(cdp=True, num_closids=16)
    await node.runner.start()
    assert node.fake.schemata(BE)["L3CODE"] == node.fake.schemata(BE)["L3DATA"] == {0: 0xF, 1: 0xF}
    assert len(node.fake.schemata_writes(BE)) == 1


async def test_l3_only_and_mb_only_hosts_write_what_they_have(make_node: Any, tmp_path: Path) -> None:
    node = make_node(mb_ids=None)
    await node.runner.start()
    assert node.fake.schemata_writes(BE) == [b"L3:0=f;1=f\n"]
    await node.runner.stop()

    other = tmp_path / "mb-only"
    fake = make_fake_resctrl(other, l3_ids=None)
    runner = PluginRunner(
        [plugin],
        context=ServerContext(cgroups=node.tree.fs(), resctrl=fake.fs(), policy=lambda: POLICY),
        registry=CollectorRegistry(),
    )
    await runner.start()
    assert fake.schemata_writes(BE) == [b"MB:0=60;1=60\n"]
    await runner.stop()


# --- PostStartContainer: threads join -----------------------------------------------------------


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
async def test_container_threads_join_their_class_group(
    make_node: Any, spawn: Callable[..., list[int]], version: int, driver: CgroupDriver
) -> None:
    node = make_node(version=version, driver=driver)
    await node.runner.start()
    be_tids = spawn(threads=3)  # a process with 4 threads: every one must move
    assert len(be_tids) == 4
    be_pod = node.pod("batch", "BE", "besteffort")
    await node.started(be_pod, node.container(be_pod, "c-be", be_tids))
    assert sorted(node.fake.tasks(BE)) == be_tids

    lse_tids = spawn()
    lse_pod = node.pod("db", "LSE", "guaranteed")
    await node.started(lse_pod, node.container(lse_pod, "c-lse", lse_tids))
    assert node.fake.tasks(LSR) == lse_tids  # LSE shares LSR's group

    sys_tids = spawn()
    sys_pod = node.pod("agent", "SYSTEM")
    await node.started(sys_pod, node.container(sys_pod, "c-sys", sys_tids))
    assert node.fake.tasks(LS) == sys_tids  # SYSTEM uses LS's group
    assert node.stats()["tasks_moved"] == 6


async def test_threads_in_cgroups_nested_below_the_container_are_found(
    make_node: Any, spawn: Callable[..., list[int]]
) -> None:
    node = make_node()
    await node.runner.start()
    pod = node.pod("nested", "BE", "besteffort")
    outer, inner = spawn(), spawn()
    container = node.container(pod, "c1", outer)
    node.tree.mkdir(f"{node.tree.dir(pod.cgroup_parent, 'c1').relative_to(node.tree.root)}/init.scope", leaf=True)
    (node.tree.dir(pod.cgroup_parent, "c1") / "init.scope" / "cgroup.threads").write_text(f"{inner[0]}\n")
    assert cgroup_threads(node.tree.fs(), pod.cgroup_parent, "c1") == {outer[0], inner[0]}
    await node.started(pod, container)
    assert sorted(node.fake.tasks(BE)) == sorted(outer + inner)


async def test_threads_already_in_the_group_are_not_written_again(
    make_node: Any, spawn: Callable[..., list[int]]
) -> None:
    node = make_node()
    await node.runner.start()
    tids = spawn()
    pod = node.pod("p", "BE", "besteffort")
    container = node.container(pod, "c1", tids)
    await node.started(pod, container)
    writes = len(node.fake.writes)
    await node.started(pod, container)
    assert len(node.fake.writes) == writes


async def test_an_exited_thread_is_not_a_failure(make_node: Any, spawn: Callable[..., list[int]]) -> None:
    node = make_node()
    await node.runner.start()
    proc = subprocess.Popen(["true"])
    proc.wait()  # gone: the kernel (and the fake) answer ESRCH
    tids = spawn()
    pod = node.pod("p", "BE", "besteffort")
    await node.started(pod, node.container(pod, "c1", [proc.pid, *tids]))
    assert node.fake.tasks(BE) == tids
    assert node.stats()["tasks_exited"] == 1


# --- reconcile ----------------------------------------------------------------------------------


async def test_reconcile_repairs_drifted_schemata_and_moves_new_threads(
    make_node: Any, spawn: Callable[..., list[int]]
) -> None:
    node = make_node()
    await node.runner.start()
    first = spawn()
    pod = node.pod("p", "BE", "besteffort")
    await node.started(pod, node.container(pod, "c1", first))
    fake = node.fake

    # Behind the plugin's back: BE gets the whole cache back on domain 1, and a new process starts.
    fake.write(fake.root / BE / "schemata", b"L3:1=7ff\n")
    assert fake.schemata(BE)["L3"] == {0: 0xF, 1: 0x7FF}
    second = spawn(threads=1)
    node.set_threads(pod, "c1", first + second)

    with capture_logs() as logs:
        report = await node.runner.reconcile_report(pods=[pod])
    assert report.failures == []
    assert report.repaired == {"resctrl": 1 + 2}  # one group rewritten, two new threads moved
    assert fake.schemata(BE) == {"L3": {0: 0xF, 1: 0xF}, "MB": {0: 60, 1: 60}}
    assert fake.schemata_writes(BE)[-1] == b"L3:0=f;1=f\nMB:0=60;1=60\n"
    assert sorted(fake.tasks(BE)) == sorted(first + second)
    assert node.stats() == {"schemata_repaired": 1, "tasks_moved": 3, "tasks_exited": 0, "task_failures": 0}
    assert [e["event"] for e in logs if e["log_level"] == "info"] == ["resctrl group repaired", "resctrl reconciled"]

    # Nothing drifted: reconcile reads, writes nothing.
    writes = len(fake.writes)
    assert (await node.runner.reconcile_report(pods=[pod])).repaired == {"resctrl": 0}
    assert len(fake.writes) == writes
    assert node.stats()["schemata_repaired"] == 1


async def test_reconcile_sweeps_the_whole_pod_and_a_missed_container(
    make_node: Any, spawn: Callable[..., list[int]]
) -> None:
    node = make_node(version=1, driver="systemd")
    await node.runner.start()
    pod = node.pod("p", "LSR", "guaranteed")
    sandbox, app = spawn(), spawn()
    node.set_threads(pod, None, sandbox)  # threads in the pod cgroup itself
    node.container(pod, "missed", app)  # PostStartContainer never came for this one
    other = node.pod("q", "LS")  # a pod of another class, also given
    ls_tids = spawn()
    node.container(other, "c", ls_tids)
    await node.runner.reconcile(pods=[pod, other])
    assert sorted(node.fake.tasks(LSR)) == sorted(sandbox + app)
    assert node.fake.tasks(LS) == ls_tids


async def test_reconcile_follows_a_policy_change_and_recreates_a_removed_group(make_node: Any) -> None:
    node = make_node()
    await node.runner.start()
    node.policy[0] = policy_from("resctrl:\n  BE: {l3_percent_range: [0, 50], mb_percent: 30}\n")
    node.fake.rmdir(node.fake.root / LS)
    await node.runner.reconcile(pods=[])
    assert node.fake.schemata(BE) == {"L3": {0: 0x3F, 1: 0x3F}, "MB": {0: 30, 1: 30}}
    assert LS in node.fake.groups()
    assert node.fake.schemata(LS) == {"L3": {0: 0x7FF, 1: 0x7FF}, "MB": {0: 100, 1: 100}}
    assert node.stats()["schemata_repaired"] == 2


async def test_pods_that_are_gone_leave_nothing_behind(make_node: Any, spawn: Callable[..., list[int]]) -> None:
    node = make_node()
    await node.runner.start()
    pod = node.pod("p", "BE", "besteffort")
    await node.started(pod, node.container(pod, "c1", spawn()))
    # The pod is gone: its cgroup with it, and reconcile is no longer given it.
    assert await node.runner.reconcile(pods=[]) == []
    gone = PodInfo(name="gone", namespace="x", uid="u", cgroup_parent="/kubepods/besteffort/podnothere")
    assert await node.runner.reconcile(pods=[gone]) == []
    assert not [name for name in vars(node.runner.state_of("resctrl")) if "pod" in name]  # nothing kept per pod


# --- CLOSID shortage ----------------------------------------------------------------------------


async def test_with_room_for_two_groups_the_latency_classes_share_one(
    make_node: Any, spawn: Callable[..., list[int]]
) -> None:
    node = make_node(num_closids=3)  # root + 2
    with capture_logs() as logs:
        await node.runner.start()
    assert node.fake.groups() == [BE, LS]
    merged = [e for e in logs if e["event"] == "resctrl classes merged for lack of CLOSIDs"]
    assert len(merged) == 1 and "rtpx-LS: LSE+LSR+LS+SYSTEM" in merged[0]["notes"][0]
    # The merged group gets the widest values of LSE, LSR, LS, SYSTEM: LSR's 100% bandwidth.
    assert node.fake.schemata(LS) == {"L3": {0: 0x7FF, 1: 0x7FF}, "MB": {0: 100, 1: 100}}
    tids = spawn()
    pod = node.pod("p", "LSR", "guaranteed")
    await node.started(pod, node.container(pod, "c1", tids))
    assert node.fake.tasks(LS) == tids


async def test_with_room_for_one_group_only_be_gets_it(make_node: Any, spawn: Callable[..., list[int]]) -> None:
    node = make_node(num_closids=4, mb_num_closids=2)  # the smaller count rules
    await node.runner.start()
    assert node.fake.groups() == [BE]
    tids = spawn()
    pod = node.pod("p", "LS")
    await node.started(pod, node.container(pod, "c1", tids))
    assert node.fake.tasks(BE) == [] and tids[0] not in node.fake.tasks()  # LS stays where it is


async def test_other_tools_groups_take_their_closids_and_ours_from_before_are_cleaned(make_node: Any) -> None:
    node = make_node(num_closids=4)
    fake = node.fake
    fs = fake.fs()
    fs.ensure_group("someone-else")
    fs.ensure_group(f"{GROUP_PREFIX}old")
    await node.runner.start()
    assert fake.groups() == [BE, LS, "someone-else"]  # 3 = num_closids - 1, never more


async def test_no_closid_left_disables_the_plugin_with_one_line(make_node: Any) -> None:
    node = make_node(num_closids=2)
    node.fake.fs().ensure_group("someone-else")
    with capture_logs() as logs:
        await node.runner.start()
    assert [e["event"] for e in logs] == ["resctrl plugin disabled"]
    assert "no CLOSID left" in logs[0]["reason"]
    assert node.fake.groups() == ["someone-else"]


# --- without resctrl ----------------------------------------------------------------------------


async def test_without_resctrl_the_plugin_is_not_called(make_node: Any, spawn: Callable[..., list[int]]) -> None:
    """It needs the resctrl handle: on a node without one the runner never calls it."""
    node = make_node(resctrl=False)
    pod = node.pod("p", "BE", "besteffort")
    container = node.container(pod, "c1", spawn())
    with capture_logs() as logs:
        assert await node.runner.start() == []
        result = await node.runner.run(START, pod=pod, container=container)
        assert await node.runner.reconcile(pods=[pod]) == []
    assert result.failures == [] and result.response.is_empty() and result.applied == []
    assert result.skipped == {"resctrl": "needs resctrl, which this node lacks"}
    assert [e for e in logs if e.get("plugin") == "resctrl" and e["log_level"] != "debug"] == []
    assert node.stats()["schemata_repaired"] == 0
    assert resctrl_plugin.disabled_reason(node.runner.state_of("resctrl")) == ""  # never set up


async def test_a_host_without_usable_allocation_disables_it_too(tmp_path: Path) -> None:
    # AMD-style MB (not percentages) and no L3: nothing this plugin can write.
    fake = make_fake_resctrl(tmp_path / "r", l3_ids=None, min_bandwidth=10)
    (fake.root / "schemata").write_text("MB:0=2048;1=2048\n")  # what an mba_MBps / AMD mount shows
    runner = PluginRunner(
        [plugin], context=ServerContext(resctrl=fake.fs(), policy=lambda: POLICY), registry=CollectorRegistry()
    )
    with capture_logs() as logs:
        await runner.start()
    await runner.stop()
    assert [e["event"] for e in logs] == ["resctrl plugin disabled"]
    assert "not percentages" in logs[0]["reason"]
    assert fake.groups() == []


async def test_handlers_before_start_set_up_on_first_use(make_node: Any, spawn: Callable[..., list[int]]) -> None:
    node = make_node()  # no runner.start(): the first call sets the groups up
    tids = spawn()
    pod = node.pod("p", "BE", "besteffort")
    await node.started(pod, node.container(pod, "c1", tids))
    assert node.fake.tasks(BE) == tids
    assert node.fake.groups() == [BE, LS, LSR]


# A small directory tree: each node is (has its own thread file, its thread ids, whether it is a
# symlink to its sibling instead of a directory, its children).
_TREES = st.recursive(
    st.tuples(st.booleans(), st.lists(st.integers(1, 99999), max_size=3), st.just(False), st.just(())),
    lambda children: st.tuples(
        st.booleans(),
        st.lists(st.integers(1, 99999), max_size=3),
        st.booleans(),
        st.lists(children, max_size=3).map(tuple),
    ),
    max_leaves=8,
)


def _build(where: Path, node: Any, name: str) -> None:
    has_file, tids, _link, children = node
    where.mkdir()
    if has_file:
        (where / name).write_text("".join(f"{tid}\n" for tid in tids))
    for index, child in enumerate(children):
        if child[2] and index:  # a link to the previous sibling: never followed
            (where / f"link{index}").symlink_to(where / f"c{index - 1}")
        else:
            _build(where / f"c{index}", child, name)


def _walked(top: str, name: str) -> set[int]:
    """What cgroup_threads found below a cgroup before (os.walk, files listed)."""
    found: set[int] = set()
    for directory, _dirs, files in os.walk(top, followlinks=False):
        if directory != top and name in files:
            found |= resctrl_plugin._read_ids(os.path.join(directory, name))
    return found


@given(_TREES)
@settings(max_examples=30, deadline=None)
def test_the_threads_below_a_cgroup_are_those_a_full_walk_finds(tree: Any) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        top = Path(scratch) / "top"
        _build(top, tree, "tasks")
        assert resctrl_plugin._threads_below(str(top), "tasks") == _walked(str(top), "tasks")
    assert resctrl_plugin._threads_below(str(top), "tasks") == set()  # gone: nothing below
