"""At PreRunPodSandbox the cpu plugin reads cgroup v1's period file only for a plan that sets a quota
(a BE pod's batch quota, a pinned pod's -1): a pod whose quota is left to kubelet gets its other
values as before without it. On v2 cpu.max holds both, read once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_trees import TREES, fake_tree, tree_id
from runtimeproxy.hooks.cgroups import CgroupVersion
from runtimeproxy.hooks.extended_resources import BATCH_CPU, EXTENDED_RESOURCE_SPEC_ANNOTATION
from runtimeproxy.hooks.plugins import cpu
from runtimeproxy.hooks.podview import RESOURCE_STATUS_ANNOTATION
from runtimeproxy.hooks.sdk import HookPoint
from runtimeproxy.hooks.testkit.builders import pod as make_pod
from runtimeproxy.hooks.testkit.builders import run_plugin
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup
from test_plugin_cpu_quota_reads import CountingFS, quota_file

PERIOD = "cpu.cfs_period_us"


@pytest.fixture(params=TREES, ids=tree_id)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    return fake_tree(request.param, tmp_path / "cgroup")


async def test_a_quota_left_to_kubelet_reads_no_period(tree: FakeCgroup) -> None:
    parent = tree.add_pod("ls-1", "burstable")
    fs = CountingFS(tree.root, tree.driver)
    fs.set_cpu_quota(parent, 50000, 200000)
    pod = make_pod("web", qos="LS", uid="ls-1", cgroup_parent=parent)
    result = await run_plugin(
        cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=pod, cgroups=fs, policy="cpu: {LS: {cpu_idle: true}}"
    )
    assert result.failures == [] and result.applied == ["cpu"]
    assert fs.reads[quota_file(fs)] == 1
    assert PERIOD not in fs.reads
    assert fs.cpu_quota(parent) == (50000, 200000)  # left as it was
    if fs.has_file("cpu", "cpu.idle", parent):
        assert fs.read("cpu", "cpu.idle", parent) == "1"


async def test_a_batch_quota_reads_the_period_once_and_writes_the_quota(tree: FakeCgroup) -> None:
    parent = tree.add_pod("be-1", "besteffort")
    fs = CountingFS(tree.root, tree.driver)
    spec = json.dumps({"containers": {"main": {"limits": {BATCH_CPU: "500"}}}})
    pod = make_pod(
        "batch", qos="BE", uid="be-1", cgroup_parent=parent, annotations={EXTENDED_RESOURCE_SPEC_ANNOTATION: spec}
    )
    result = await run_plugin(cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=pod, cgroups=fs)
    assert result.failures == []
    assert fs.reads.get(quota_file(fs), 0) == (0 if fs.version is CgroupVersion.V1 else 1)  # v1: set, not read
    assert fs.reads.get(PERIOD, 0) == (1 if fs.version is CgroupVersion.V1 else 0)
    assert fs.cpu_quota(parent) == (50000, 100000)


async def test_a_lifted_quota_keeps_the_period_it_read(tree: FakeCgroup) -> None:
    parent = tree.add_pod("lsr-1", "guaranteed")
    fs = CountingFS(tree.root, tree.driver)
    fs.set_cpu_quota(parent, 100000, 50000)
    pinned = json.dumps({"cpuset": "0-1"})
    pod = make_pod(
        "pinned", qos="LSR", uid="lsr-1", cgroup_parent=parent, annotations={RESOURCE_STATUS_ANNOTATION: pinned}
    )
    result = await run_plugin(cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=pod, cgroups=fs)
    assert result.failures == []
    assert fs.cpu_quota(parent) == (-1, 50000)
    assert fs.reads.get(PERIOD, 0) == (2 if fs.version is CgroupVersion.V1 else 0)  # the plugin's, and the line above


def test_the_quota_first_and_the_period_make_cpu_quota(tree: FakeCgroup) -> None:
    parent = tree.add_pod("any-1", "burstable")
    fs = CountingFS(tree.root, tree.driver)
    for quota, period in ((30000, 60000), (-1, 100000)):
        fs.set_cpu_quota(parent, quota, period)
        first = fs.cpu_quota_first_if_present(parent)
        assert first == (quota, None if fs.version is CgroupVersion.V1 else period)
        assert fs.cpu_period(parent) == period
        assert fs.cpu_quota_if_present(parent) == fs.cpu_quota(parent) == (quota, period)
    assert fs.cpu_quota_first_if_present(tree.pod_parent("gone")) is None
