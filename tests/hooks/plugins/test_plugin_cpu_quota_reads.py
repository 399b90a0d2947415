"""The cpu plugin reads a pod cgroup's quota at most once per PreRunPodSandbox (for the plan and for
applying it), with the same outcome as reading it twice: the batch quota written, and an unreadable
file the plugin's error. A plan that sets the quota itself does not read it on cgroup v1 (only the
period, in a file of its own); v2's cpu.max holds both and is read once. Likewise a container's quota
once per PostStartContainer (for the burst's plan and its cap)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_trees import TREES, fake_tree, tree_id
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupVersion
from runtimeproxy.hooks.extended_resources import BATCH_CPU, BATCH_MEMORY, EXTENDED_RESOURCE_SPEC_ANNOTATION
from runtimeproxy.hooks.plugins import cpu, memory
from runtimeproxy.hooks.sdk import HookPoint
from runtimeproxy.hooks.testkit.builders import container as make_container
from runtimeproxy.hooks.testkit.builders import pod as make_pod
from runtimeproxy.hooks.testkit.builders import run_plugin
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup
from runtimeproxy.hooks.views import Resources

SPEC = json.dumps({"containers": {"main": {"limits": {BATCH_CPU: "1500"}}}})


class CountingFS(CgroupFS):
    """A CgroupFS that counts the reads of each file (read_if_exists's of a file that is there too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads: dict[str, int] = {}
        self.exists_asked: dict[str, int] = {}  # by controller

    def exists(self, parent: str, container_id: str | None = None, controller: str = "cpu") -> bool:
        self.exists_asked[controller] = self.exists_asked.get(controller, 0) + 1
        return super().exists(parent, container_id, controller)

    def pod_cgroup_exists(self, controller: str, parent: str) -> bool:
        self.exists_asked[controller] = self.exists_asked.get(controller, 0) + 1
        return super().pod_cgroup_exists(controller, parent)

    def read(self, controller: str, file: str, parent: str, container_id: str | None = None) -> str:
        self.reads[file] = self.reads.get(file, 0) + 1
        return super().read(controller, file, parent, container_id)

    def read_if_exists(self, controller: str, file: str, parent: str, container_id: str | None = None) -> str | None:
        text = super().read_if_exists(controller, file, parent, container_id)
        if text is not None:
            self.reads[file] = self.reads.get(file, 0) + 1
        return text


@pytest.fixture(params=TREES, ids=tree_id)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    return fake_tree(request.param, tmp_path / "cgroup")


def quota_file(fs: CgroupFS) -> str:
    return "cpu.cfs_quota_us" if fs.version is CgroupVersion.V1 else "cpu.max"


def period_file(fs: CgroupFS) -> str:
    return "cpu.cfs_period_us" if fs.version is CgroupVersion.V1 else "cpu.max"


async def test_the_quota_is_read_once_and_the_batch_quota_written(tree: FakeCgroup) -> None:
    parent = tree.add_pod("be-1", "besteffort")
    fs = CountingFS(tree.root, tree.driver)
    pod = make_pod(
        "batch", qos="BE", uid="be-1", cgroup_parent=parent, annotations={EXTENDED_RESOURCE_SPEC_ANNOTATION: SPEC}
    )
    result = await run_plugin(cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=pod, cgroups=fs)
    assert result.failures == []
    assert fs.reads.get(quota_file(fs), 0) == (0 if fs.version is CgroupVersion.V1 else 1)
    assert fs.reads[period_file(fs)] == 1
    assert fs.cpu_quota(parent) == (150000, 100000)


async def test_an_unreadable_quota_file_is_the_plugins_error(tree: FakeCgroup) -> None:
    parent = tree.add_pod("be-2", "besteffort")
    fs = CountingFS(tree.root, tree.driver)
    fs.path("cpu", parent, None, period_file(fs)).write_text("garbage\n")  # the file the plan reads
    pod = make_pod(
        "batch", qos="BE", uid="be-2", cgroup_parent=parent, annotations={EXTENDED_RESOURCE_SPEC_ANNOTATION: SPEC}
    )
    result = await run_plugin(cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=pod, cgroups=fs)
    assert [(f.plugin, f.outcome) for f in result.failures] == [("cpu", "error")]
    assert "ValueError" in result.failures[0].reason or "CgroupError" in result.failures[0].reason


def burst_file(fs: CgroupFS) -> str:
    return "cpu.cfs_burst_us" if fs.version is CgroupVersion.V1 else "cpu.max.burst"


@pytest.mark.parametrize(("percent", "burst"), [(1000, 200000), (50, 100000)])
async def test_poststart_reads_the_containers_quota_once_and_caps_the_burst_by_it(
    tree: FakeCgroup, percent: int, burst: int
) -> None:
    parent = tree.add_pod("ls-1", "burstable")
    cid = "c" * 64
    tree.add_container(parent, cid)
    fs = CountingFS(tree.root, tree.driver)
    fs.set_cpu_quota(parent, 200000, container_id=cid)
    pod = make_pod("web", qos="LS", uid="ls-1", cgroup_parent=parent)
    container = make_container("app", id=cid, resources=Resources(cpu_quota=200000, cpu_period=100000))
    policy = f"cpu: {{LS: {{cfs_burst_percent: {percent}}}}}"
    result = await run_plugin(
        cpu.plugin, HookPoint.POST_START_CONTAINER, pod=pod, container=container, cgroups=fs, policy=policy
    )
    assert result.failures == []
    assert fs.reads[quota_file(fs)] == 1
    assert fs.read("cpu", burst_file(fs), parent, cid) == str(burst)


async def test_poststart_writes_no_burst_without_the_containers_cgroup(tree: FakeCgroup) -> None:
    parent = tree.add_pod("ls-2", "burstable")
    fs = CountingFS(tree.root, tree.driver)
    pod = make_pod("web", qos="LS", uid="ls-2", cgroup_parent=parent)
    container = make_container("app", id="d" * 64, resources=Resources(cpu_quota=200000, cpu_period=100000))
    result = await run_plugin(
        cpu.plugin,
        HookPoint.POST_START_CONTAINER,
        pod=pod,
        container=container,
        cgroups=fs,
        policy="cpu: {LS: {cfs_burst_percent: 1000}}",
    )
    assert result.failures == [] and result.applied == ["cpu"]
    assert fs.reads == {}


async def test_prerun_looks_at_the_pod_cgroup_once_per_plugin(tree: FakeCgroup) -> None:
    """cpu and memory each stat the pod cgroup once per PreRunPodSandbox, and still write their values."""
    parent = tree.add_pod("be-3", "besteffort")
    fs = CountingFS(tree.root, tree.driver)
    batch = {"main": {"limits": {BATCH_CPU: "1500", BATCH_MEMORY: "64Mi"}}}
    pod = make_pod(
        "batch",
        qos="BE",
        uid="be-3",
        cgroup_parent=parent,
        annotations={EXTENDED_RESOURCE_SPEC_ANNOTATION: json.dumps({"containers": batch})},
        resources=Resources(memory_limit_in_bytes=64 << 20),
    )
    result = await run_plugin([cpu.plugin, memory.plugin], HookPoint.PRE_RUN_POD_SANDBOX, pod=pod, cgroups=fs)
    assert result.failures == []
    assert fs.exists_asked == {"cpu": 1, "memory": 1}
    assert fs.cpu_quota(parent) == (150000, 100000)
    limit = "memory.limit_in_bytes" if fs.version is CgroupVersion.V1 else "memory.max"
    assert fs.read("memory", limit, parent) == str(64 << 20)
