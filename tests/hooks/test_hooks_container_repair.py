"""Container repair (hooks/container_repair.py) on fake cgroup trees of both versions and drivers: what the
plugins set is found missing from a container, written back (proxy mode), counted and logged once per
container; refusals, failed plugins, unstarted containers and updates still under way are each handled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_trees import TREES, fake_tree, tree_id
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupVersion, PodRoots, shares_to_weight
from runtimeproxy.hooks.container_repair import (
    CgroupWrites,
    ContainerRepair,
    RepairDeferred,
    RepairMetrics,
    RepairPlan,
    seen_in_cgroup,
)
from runtimeproxy.hooks.extended_resources import BATCH_CPU, EXTENDED_RESOURCE_SPEC_ANNOTATION
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.plugins import cpu
from runtimeproxy.hooks.reconciler import LivePods, Reconciler
from runtimeproxy.hooks.sdk import ContainerInfo, HookPoint, Plugin, PodInfo, ServerContext
from runtimeproxy.hooks.testkit.builders import container as make_container
from runtimeproxy.hooks.testkit.builders import pod as make_pod
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup
from runtimeproxy.hooks.views import Resources
from structlog.testing import capture_logs

# A BE container with a 500m batch-cpu limit and a 250m request: quota 50000 per 100000 µs, 256 shares.
SPEC = json.dumps({"containers": {"app": {"requests": {BATCH_CPU: "250"}, "limits": {BATCH_CPU: "500"}}}})
KUBELET_BE = Resources(cpu_period=100_000, cpu_shares=2)  # kubelet's BestEffort request
HOOKED_BE = Resources(cpu_period=100_000, cpu_quota=50_000, cpu_shares=256)  # that request, answered


@pytest.fixture(params=TREES, ids=tree_id)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    return fake_tree(request.param, tmp_path / "cgroup")


def be_pod(tree: FakeCgroup, uid: str = "be-1") -> tuple[PodInfo, ContainerInfo]:
    parent = tree.add_pod(uid, "besteffort")
    pod = make_pod(
        "batch",
        qos="BE",
        uid=uid,
        cgroup_parent=parent,
        sandbox_id=f"s-{uid}",
        annotations={EXTENDED_RESOURCE_SPEC_ANNOTATION: SPEC},
    )
    container = make_container("app", id=f"c-{uid}", pod=pod, cgroups=tree, resources=KUBELET_BE)
    tree.fs().set_cpu_shares(parent, KUBELET_BE.cpu_shares, container.id)  # as runc sets kubelet's request
    return pod, container


def cgroup_values(tree: FakeCgroup, pod: PodInfo, container: ContainerInfo) -> tuple[int, int]:
    """(quota, shares) the container's cgroup holds, in v1 terms (v2: the weight's shares)."""
    seen = seen_in_cgroup(tree.fs(), pod.cgroup_parent, container.id, ["cpu_quota", "cpu_shares"])
    assert seen is not None and seen.cpu_quota is not None and seen.cpu_shares is not None
    return seen.cpu_quota, seen.cpu_shares


def repair_for(tree: FakeCgroup, *plugins: Plugin) -> tuple[ContainerRepair, CollectorRegistry]:
    registry = CollectorRegistry()
    runner = PluginRunner(plugins or [cpu.plugin], context=ServerContext(cgroups=tree.fs()), registry=registry)
    return ContainerRepair(runner, RepairMetrics(registry, "proxy")), registry


def repaired(registry: CollectorRegistry, reason: str, mode: str = "proxy") -> float | None:
    return registry.get_sample_value("runtimeproxy_hooks_containers_repaired_total", {"mode": mode, "reason": reason})


async def test_an_unhooked_container_gets_the_plugins_values_written_once(tree: FakeCgroup) -> None:
    pod, container = be_pod(tree)
    repair, registry = repair_for(tree)
    assert repaired(registry, "unhooked") == 0.0  # the mode's series exist from the start
    applier = CgroupWrites(tree.fs())
    with capture_logs() as logs:
        assert await repair.reconcile([pod], {pod.sandbox_id: [container]}, applier) == 1
    quota, shares = cgroup_values(tree, pod, container)
    assert quota == 50_000
    if tree.version is CgroupVersion.V1:
        assert (shares, tree.read(pod.cgroup_parent, "cpu.shares", container.id)) == (256, "256")
    else:  # cpu.weight, as runc converts shares
        assert tree.read(pod.cgroup_parent, "cpu.weight", container.id) == str(shares_to_weight(256))
    assert repaired(registry, "unhooked") == 1.0 and repaired(registry, "drifted") == 0.0
    [line] = [entry for entry in logs if entry["event"] == "container repaired"]
    assert (line["container"], line["container_id"], line["pod"]) == ("app", "c-be-1", "default/batch")
    assert (line["mode"], line["reason"], line["how"]) == ("proxy", "unhooked", "cgroup write")
    shares_drift = "cpu_shares: 2 -> 256" if tree.version is CgroupVersion.V1 else "cpu_weight: 1 -> 10"
    assert line["values"] == ["cpu_quota: -1 -> 50000", shares_drift]
    # the runtime's record still lacks the values, but the cgroup has them: nothing more to do
    assert await repair.reconcile([pod], {pod.sandbox_id: [container]}, applier) == 0
    assert repaired(registry, "unhooked") == 1.0
    # the calls are the plugins' "repair" calls, not PreUpdateContainerResources ones
    calls = {"plugin": "cpu", "hook": "repair", "outcome": "ok"}
    assert registry.get_sample_value("runtimeproxy_hooks_plugin_calls_total", calls) == 2.0
    hooked = {"plugin": "cpu", "hook": "PreUpdateContainerResources", "outcome": "ok"}
    assert registry.get_sample_value("runtimeproxy_hooks_plugin_calls_total", hooked) == 0.0  # there, at 0


async def test_a_value_changed_behind_the_runtimes_back_is_set_back_as_drifted(tree: FakeCgroup) -> None:
    pod, kubelet = be_pod(tree)
    container = ContainerInfo(kubelet.name, kubelet.id, resources=HOOKED_BE)  # created with our answer
    fs = tree.fs()
    fs.set_cpu_quota(pod.cgroup_parent, 50_000, container_id=container.id)
    fs.set_cpu_shares(pod.cgroup_parent, 256, container.id)
    repair, registry = repair_for(tree)
    applier = CgroupWrites(fs)
    assert await repair.reconcile([pod], {pod.sandbox_id: [container]}, applier) == 0
    fs.set_cpu_quota(pod.cgroup_parent, -1, container_id=container.id)  # someone lifted the quota
    with capture_logs() as logs:
        assert await repair.reconcile([pod], {pod.sandbox_id: [container]}, applier) == 1
    assert cgroup_values(tree, pod, container)[0] == 50_000
    assert repaired(registry, "drifted") == 1.0 and repaired(registry, "unhooked") == 0.0
    [line] = [entry for entry in logs if entry["event"] == "container repaired"]
    assert line["values"] == ["cpu_quota: -1 -> 50000"]


async def test_a_write_outside_the_pod_roots_is_refused_counted_and_tried_again(tree: FakeCgroup) -> None:
    """The write scope holds for repairs too: a container whose pod cgroup is not under the pod
    roots is read, but never written."""
    pod, container = be_pod(tree)
    narrow = CgroupFS(tree.root, tree.driver, pod_roots=PodRoots(["/elsewhere"]))
    repair, registry = repair_for(tree)
    with capture_logs() as logs:
        assert await repair.reconcile([pod], {pod.sandbox_id: [container]}, CgroupWrites(narrow)) == 0
        assert await repair.reconcile([pod], {pod.sandbox_id: [container]}, CgroupWrites(narrow)) == 0
    assert cgroup_values(tree, pod, container)[0] == -1  # untouched
    assert registry.get_sample_value("runtimeproxy_hooks_container_repairs_failed_total", {"mode": "proxy"}) == 2.0
    failures = [entry for entry in logs if entry["event"] == "container repair failed; trying again at the next round"]
    assert len(failures) == 2 and failures[0]["container"] == "app"
    assert failures[0]["error"].startswith("cgroup write: ")
    assert "is not below a pod cgroup root (/elsewhere)" in failures[0]["error"]
    assert repaired(registry, "unhooked") == 0.0


async def test_nothing_is_repaired_without_a_cgroup_or_an_answer(tree: FakeCgroup) -> None:
    pod, container = be_pod(tree)
    unstarted = ContainerInfo("app", "c-not-started", resources=KUBELET_BE)  # created: no cgroup yet
    failing = Plugin("strict", version="1", failure_policy="fail", timeout=1.0)

    @failing.on(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
    async def boom(**kwargs: Any) -> None:
        raise RuntimeError("boom")

    repair, registry = repair_for(tree, cpu.plugin, failing)
    applier = CgroupWrites(tree.fs())
    # a "fail" plugin failed: what the plugins want is unknown, so nothing is written
    assert await repair.reconcile([pod], {pod.sandbox_id: [container, unstarted]}, applier) == 0
    assert cgroup_values(tree, pod, container)[0] == -1
    calls = {"plugin": "strict", "hook": "repair", "outcome": "error"}
    assert registry.get_sample_value("runtimeproxy_hooks_plugin_calls_total", calls) == 2.0
    # no plugin answering at PreUpdateContainerResources: container repair is off
    idle = ContainerRepair(PluginRunner([], context=ServerContext(cgroups=tree.fs())))
    assert not idle.enabled
    assert await idle.reconcile([pod], {pod.sandbox_id: [container]}, applier) == 0


class PendingUpdate:
    """An applier whose runtime still had the repairs ``pending`` under way: they land while it
    settles. With ``deferred``, it cannot take repairs now."""

    mode, how, record_known = "proxy", "test", True

    def __init__(self, fs: CgroupFS, pending: list[RepairPlan] | None = None, deferred: str = "") -> None:
        self.writes = CgroupWrites(fs)
        self.pending = pending or []
        self.deferred = deferred
        self.applied: list[RepairPlan] = []

    async def settle(self) -> None:
        if self.deferred:
            raise RepairDeferred(self.deferred)
        for plan in self.pending:
            await self.writes.apply(plan)

    async def apply(self, plan: RepairPlan) -> None:
        self.applied.append(plan)


async def test_containers_are_compared_again_once_pending_updates_are_made(tree: FakeCgroup) -> None:
    pod, container = be_pod(tree)
    repair, registry = repair_for(tree)
    wanted = await repair.wanted(pod, container)
    assert wanted is not None
    plan = repair.compare(pod, container, wanted, record=None, repair_record=False)
    assert plan is not None
    applier = PendingUpdate(tree.fs(), pending=[plan])
    assert await repair.reconcile([pod], {pod.sandbox_id: [container]}, applier) == 0
    assert applier.applied == [] and repaired(registry, "unhooked") == 0.0
    assert cgroup_values(tree, pod, container)[0] == 50_000


async def test_repairs_wait_while_the_runtime_cannot_take_them(tree: FakeCgroup) -> None:
    pod, container = be_pod(tree)
    repair, registry = repair_for(tree)
    applier = PendingUpdate(tree.fs(), deferred="not registered with NRI")
    with capture_logs() as logs:
        assert await repair.reconcile([pod], {pod.sandbox_id: [container]}, applier) == 0
    [line] = [entry for entry in logs if entry["event"] == "container repair deferred"]
    assert (line["containers"], line["reason"]) == (1, "not registered with NRI")
    assert registry.get_sample_value("runtimeproxy_hooks_container_repairs_failed_total", {"mode": "proxy"}) == 0.0


async def test_the_reconciler_repairs_containers_after_the_pod_cgroups(tree: FakeCgroup) -> None:
    pod, container = be_pod(tree)
    registry = CollectorRegistry()
    runner = PluginRunner([cpu.plugin], context=ServerContext(cgroups=tree.fs()), registry=registry)
    live = LivePods((pod,), {pod.sandbox_id: (container,)})

    async def lister() -> LivePods:
        return live

    repair = ContainerRepair(runner, RepairMetrics(registry, "proxy"))
    reconciler = Reconciler(runner, lister, registry=registry, repair=repair, applier=CgroupWrites(tree.fs()))
    assert reconciler.repairs_containers
    result = await reconciler.run_once()
    assert result.ok and result.containers_repaired == 1 and result.repaired == {"cpu": 2}  # pod quota and shares
    assert cgroup_values(tree, pod, container)[0] == 50_000
    assert (await reconciler.run_once()).containers_repaired == 0
    # without a way to set values, rounds leave containers alone
    assert not Reconciler(runner, lister, registry=CollectorRegistry(), repair=repair).repairs_containers


async def test_a_memory_limit_is_lowered_to_the_plugins_never_lifted(tree: FakeCgroup) -> None:
    pod, container = be_pod(tree)
    limits = Plugin("limits", version="1", timeout=1.0)

    @limits.on(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
    async def limit(*, response: Any, **kwargs: Any) -> None:
        response.resources.memory_limit_in_bytes = 64 << 20

    repair, registry = repair_for(tree, limits)
    applier = CgroupWrites(tree.fs())
    fs = tree.fs()
    limit_file = fs.file_name("memory.limit")
    assert await repair.reconcile([pod], {pod.sandbox_id: [container]}, applier) == 1  # none: set
    assert tree.read(pod.cgroup_parent, limit_file, container.id, "memory") == str(64 << 20)
    fs.write("memory", limit_file, 32 << 20, pod.cgroup_parent, container.id)  # tighter: kept
    assert await repair.reconcile([pod], {pod.sandbox_id: [container]}, applier) == 0
    fs.write("memory", limit_file, 128 << 20, pod.cgroup_parent, container.id)  # looser: lowered
    with capture_logs() as logs:
        assert await repair.reconcile([pod], {pod.sandbox_id: [container]}, applier) == 1
    assert tree.read(pod.cgroup_parent, limit_file, container.id, "memory") == str(64 << 20)
    [line] = [entry for entry in logs if entry["event"] == "container repaired"]
    assert line["values"] == [f"memory_limit_in_bytes: {128 << 20} -> {64 << 20}"]
    assert repaired(registry, "unhooked") == 2.0  # kubelet's record sets no limit: never ours
