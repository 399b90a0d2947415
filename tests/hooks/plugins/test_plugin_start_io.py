"""What the cpu and memory plugins read and write at a pod's and a container's start, on every tree:

* PreRunPodSandbox writes the BE pod's batch shares (and, on v1, its batch quota) without reading
  them first, yet still lowers a burst above the new quota before writing the quota, as the kernel
  refuses a burst above the quota in force;
* PostStartContainer at 0 % burst reads no quota (the burst is 0 whatever it is), only the burst;
* the memory plugin looks at no container cgroup when all it could write are files this kernel is
  known to lack (v1's defaults: only the Alibaba Cloud Linux wmark files).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from fake_trees import TREES, fake_tree, tree_id
from runtimeproxy.hooks import cgroups as cgroups_module
from runtimeproxy.hooks.cgroups import CgroupVersion
from runtimeproxy.hooks.extended_resources import BATCH_CPU, EXTENDED_RESOURCE_SPEC_ANNOTATION
from runtimeproxy.hooks.plugins import cpu, memory
from runtimeproxy.hooks.sdk import HookPoint
from runtimeproxy.hooks.testkit.builders import container as make_container
from runtimeproxy.hooks.testkit.builders import pod as make_pod
from runtimeproxy.hooks.testkit.builders import run_plugin
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1
from runtimeproxy.hooks.views import Resources
from test_plugin_cpu_quota_reads import CountingFS, burst_file, quota_file

SPEC = json.dumps({"containers": {"main": {"requests": {BATCH_CPU: "500"}, "limits": {BATCH_CPU: "1500"}}}})


class RecordingFS(CountingFS):
    """A CountingFS that also keeps the files written, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.written: list[str] = []

    def write(
        self, controller: str, file: str, value: str | int | bytes, parent: str, container_id: str | None = None
    ) -> None:
        super().write(controller, file, value, parent, container_id)
        self.written.append(file)


@pytest.fixture(params=TREES, ids=tree_id)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    return fake_tree(request.param, tmp_path / "cgroup")


def shares_file(fs: CountingFS) -> str:
    return "cpu.shares" if fs.version is CgroupVersion.V1 else "cpu.weight"


async def test_prerun_writes_the_batch_shares_without_reading_them(tree: FakeCgroup) -> None:
    parent = tree.add_pod("be-1", "besteffort")
    fs = RecordingFS(tree.root, tree.driver)
    pod = make_pod(
        "batch", qos="BE", uid="be-1", cgroup_parent=parent, annotations={EXTENDED_RESOURCE_SPEC_ANNOTATION: SPEC}
    )
    result = await run_plugin(cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=pod, cgroups=fs)
    assert result.failures == []
    assert shares_file(fs) not in fs.reads
    assert shares_file(fs) in fs.written
    assert fs.cpu_shares(parent) in (512, cgroups_module.weight_to_shares(cgroups_module.shares_to_weight(512)))
    assert fs.cpu_quota(parent) == (150000, 100000)


async def test_prerun_lowers_a_burst_above_the_new_quota_first(tree: FakeCgroup) -> None:
    parent = tree.add_pod("be-2", "besteffort")
    fs = RecordingFS(tree.root, tree.driver)
    fs.set_cpu_quota(parent, 400000)
    fs.set_cpu_burst(parent, 300000)
    fs.written.clear()
    pod = make_pod(
        "batch", qos="BE", uid="be-2", cgroup_parent=parent, annotations={EXTENDED_RESOURCE_SPEC_ANNOTATION: SPEC}
    )
    result = await run_plugin(cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=pod, cgroups=fs)
    assert result.failures == []
    assert fs.written.index(burst_file(fs)) < fs.written.index(quota_file(fs))
    assert fs.read("cpu", burst_file(fs), parent) == "0"
    assert fs.cpu_quota(parent) == (150000, 100000)


async def test_prerun_leaves_the_period_alone_when_it_is_the_plans(tree: FakeCgroup) -> None:
    parent = tree.add_pod("be-3", "besteffort")
    fs = RecordingFS(tree.root, tree.driver)
    pod = make_pod(
        "batch", qos="BE", uid="be-3", cgroup_parent=parent, annotations={EXTENDED_RESOURCE_SPEC_ANNOTATION: SPEC}
    )
    await run_plugin(cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=pod, cgroups=fs)
    assert "cpu.cfs_period_us" not in fs.written
    fs.set_cpu_quota(parent, -1, 50000)  # another period: written with the quota
    fs.written.clear()
    await run_plugin(cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=pod, cgroups=fs)
    assert fs.cpu_quota(parent) == (150000, 100000)
    if fs.version is CgroupVersion.V1:
        assert fs.written[:2] == ["cpu.cfs_period_us", "cpu.cfs_quota_us"]


async def test_poststart_at_zero_percent_reads_only_the_burst(tree: FakeCgroup) -> None:
    parent = tree.add_pod("ls-1", "burstable")
    cid = "c" * 64
    tree.add_container(parent, cid)
    fs = RecordingFS(tree.root, tree.driver)
    fs.set_cpu_quota(parent, 200000, container_id=cid)
    fs.set_cpu_burst(parent, 50000, container_id=cid)
    pod = make_pod("web", qos="LS", uid="ls-1", cgroup_parent=parent)
    container = make_container("app", id=cid, resources=Resources(cpu_quota=200000, cpu_period=100000))
    result = await run_plugin(cpu.plugin, HookPoint.POST_START_CONTAINER, pod=pod, container=container, cgroups=fs)
    assert result.failures == []
    assert fs.reads == {burst_file(fs): 1}
    assert fs.read("cpu", burst_file(fs), parent, cid) == "0"


async def test_memory_looks_at_no_container_cgroup_with_nothing_to_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = make_fake_cgroup_v1(tmp_path / "cgroup")
    mounts = frozenset(os.path.realpath(tree.root / controller) for controller in ("cpu", "memory"))
    monkeypatch.setattr(cgroups_module, "_cgroup_mounts", lambda: mounts)  # as on a real v1 node
    parent = tree.add_pod("be-4", "besteffort")
    fs = RecordingFS(tree.root, tree.driver)
    pod = make_pod("batch", qos="BE", uid="be-4", cgroup_parent=parent)
    looks = []
    for cid in ("a" * 64, "b" * 64):
        tree.add_container(parent, cid)
        container = make_container("main", id=cid)
        result = await run_plugin(
            memory.plugin, HookPoint.POST_START_CONTAINER, pod=pod, container=container, cgroups=fs
        )
        assert result.failures == []
        looks.append(fs.exists_asked.pop("memory", 0))
    assert looks == [1, 0]  # the first start learns that this kernel has no wmark files
    assert fs.written == []
