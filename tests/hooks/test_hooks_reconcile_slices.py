"""A reconcile round works in slices (hooks/pacing.py): a hook call that arrives while the built-in
plugins walk the live pods is answered before the round ends, and the round sets the same values
and counts the same drift as one that never gives the loop a turn."""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks import pacing
from runtimeproxy.hooks.cgroups import CgroupFS
from runtimeproxy.hooks.extended_resources import EXTENDED_RESOURCE_SPEC_ANNOTATION
from runtimeproxy.hooks.live_pods import LivePods
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.plugins import cpu, cpuset, memory
from runtimeproxy.hooks.reconciler import Reconciler, RoundResult
from runtimeproxy.hooks.sdk import ContainerInfo, HookPoint, PodInfo, Resources, ServerContext
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v2

PODS = 80  # each pod a few cgroup reads per plugin: a round takes several slices of 1 ms anywhere
BATCH = json.dumps(
    {
        "containers": {
            "app": {
                "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "512Mi"},
                "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"},
            }
        }
    }
)


# --- paced ----------------------------------------------------------------------------------------


@given(st.lists(st.integers()), st.sampled_from([0.0, 0.001, math.inf]))
def test_paced_gives_every_item_once_in_order(items: list[int], budget: float) -> None:
    async def collect() -> list[int]:
        return [item async for item in pacing.paced(items, budget)]

    assert asyncio.run(collect()) == items


@pytest.mark.parametrize(("budget", "turns_seen"), [(0.0, [0, 1, 2]), (math.inf, [0, 0, 0])])
async def test_paced_gives_the_loop_a_turn_once_a_slice_is_used_up(budget: float, turns_seen: list[int]) -> None:
    loop = asyncio.get_running_loop()
    turns: list[int] = []
    seen: list[int] = []
    async for item in pacing.paced([1, 2, 3], budget):
        seen.append(len(turns))  # the callbacks of earlier items that ran: loop turns given
        loop.call_soon(turns.append, item)  # runs at the next loop turn
    assert seen == turns_seen


async def test_a_cancelled_walk_stops_between_two_items() -> None:
    seen: list[int] = []

    async def walk() -> None:
        async for item in pacing.paced(range(10), 0.0):
            seen.append(item)

    task = asyncio.get_running_loop().create_task(walk())
    await asyncio.sleep(0)  # the walk's first step: the first item, then its turn
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [0]


# --- a round with the built-in plugins -------------------------------------------------------------


class VisitingFS(CgroupFS):
    """Records each look at a pod's cgroup by controller: the cpu plugin's reconcile makes one per
    pod ("visit cpu"), the memory plugin's one per pod and container ("visit memory")."""

    def __init__(self, tree: FakeCgroup, events: list[str]) -> None:
        super().__init__(tree.root, tree.driver)
        self.events = events

    def exists(self, parent: str, container_id: str | None = None, controller: str = "cpu") -> bool:
        self.events.append(f"visit {controller}")
        return super().exists(parent, container_id, controller)


def live_pods(tree: FakeCgroup) -> LivePods:
    """PODS pods, BE (batch resources) and LS in turn, one container each, every plugin-owned value
    drifted from what the plugins want: a round repairs many."""
    fs = tree.fs()
    pods: list[PodInfo] = []
    containers: dict[str, tuple[ContainerInfo, ...]] = {}
    for n in range(PODS):
        be = n % 2 == 0
        uid = f"pod-{n}"
        parent = tree.add_pod(uid, "besteffort" if be else "burstable")
        container_id = f"c{n:03d}"
        tree.add_container(parent, container_id)
        for cid in (None, container_id):
            fs.set_cpu_shares(parent, 7, container_id=cid)
            fs.set_cpu_quota(parent, 900_000, container_id=cid)
            fs.write("memory", "memory.max", "max", parent, cid)
        annotations = {EXTENDED_RESOURCE_SPEC_ANNOTATION: BATCH} if be else {}
        pods.append(
            PodInfo(
                name=uid,
                namespace="default",
                uid=uid,
                sandbox_id=f"s{n:03d}",
                labels=MappingProxyType({"koordinator.sh/qosClass": "BE" if be else "LS"}),
                annotations=MappingProxyType(annotations),
                cgroup_parent=parent,
                resources=Resources(cpu_shares=2) if be else Resources(cpu_shares=512, memory_limit_in_bytes=1 << 30),
            )
        )
        containers[f"s{n:03d}"] = (ContainerInfo(name="app", id=container_id, resources=Resources(cpu_shares=2)),)
    return LivePods(pods=tuple(pods), containers=MappingProxyType(containers))


def snapshot(tree: FakeCgroup) -> dict[str, str]:
    """Every file of the pods' cgroups, by path relative to the tree."""
    files: dict[str, str] = {}
    for directory, _, names in os.walk(tree.root):
        for name in names:
            path = Path(directory, name)
            if "pod-" in str(path):
                files[str(path.relative_to(tree.root))] = path.read_text()
    return files


async def one_round(tree: FakeCgroup, events: list[str], *, hook: bool) -> RoundResult:
    """One reconcile round over live_pods(tree); with ``hook``, a PreRunPodSandbox for another pod
    is issued as soon as the round's cpu plugin has looked at its first pod cgroup."""
    live = live_pods(tree)

    async def listing() -> LivePods:
        return live

    fs = VisitingFS(tree, events)
    runner = PluginRunner([cpu.plugin, cpuset.plugin, memory.plugin], context=ServerContext(cgroups=fs))
    reconciler = Reconciler(runner, listing)
    newcomer = PodInfo(
        name="newcomer",
        namespace="default",
        uid="newcomer",
        labels=MappingProxyType({"koordinator.sh/qosClass": "LS"}),
        cgroup_parent=tree.pod_parent("newcomer", "burstable"),
    )

    async def hook_call() -> None:
        while "visit cpu" not in events:
            await asyncio.sleep(0)
        await runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=newcomer)
        events.append("hook answered")

    caller = asyncio.get_running_loop().create_task(hook_call()) if hook else None
    result = await reconciler.run_once()
    events.append("round ended")
    if caller is not None:
        await caller
    runner.close()
    return result


async def test_a_hook_call_mid_round_is_answered_before_the_round_ends_and_the_round_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sliced, whole = make_fake_cgroup_v2(tmp_path / "sliced"), make_fake_cgroup_v2(tmp_path / "whole")
    events: list[str] = []
    result = await one_round(sliced, events, hook=True)

    answered = events.index("hook answered")
    assert answered < events.index("round ended")
    # Answered while the cpu plugin (the first to reconcile) was still walking the pods, not after it.
    assert "visit cpu" in events[answered:]
    assert result.ok and not result.failures and result.pods == PODS

    monkeypatch.setattr(pacing, "SLICE_SECONDS", math.inf)  # the same round in one loop turn
    reference = await one_round(whole, [], hook=False)
    assert dict(result.repaired) == dict(reference.repaired)
    assert result.repaired["cpu"] > 0 and result.repaired["memory"] > 0
    assert {path: text for path, text in snapshot(sliced).items() if "newcomer" not in path} == snapshot(whole)
