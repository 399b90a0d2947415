"""The cpuset plugin (hooks/plugins/cpuset.py), alone and with the cpu plugin, on fake cgroup v1
and v2 trees with both drivers, run through PluginRunner."""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from fake_trees import TREES, fake_tree, tree_id
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.cgroups import CgroupFS
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.plugins import cpu, cpuset
from runtimeproxy.hooks.policy import DEFAULT_POLICY, Policy
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.sdk import ContainerInfo, HookPoint, Plugin, PodInfo, Resources, ServerContext
from runtimeproxy.hooks.testkit import policy_from
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup
from structlog.testing import capture_logs

CREATE = HookPoint.PRE_CREATE_CONTAINER
UPDATE = HookPoint.PRE_UPDATE_CONTAINER_RESOURCES
RUN = HookPoint.PRE_RUN_POD_SANDBOX
STATUS = cpuset.RESOURCE_STATUS_ANNOTATION
APP = ContainerInfo(name="app", resources=Resources(cpu_quota=200000, cpu_period=100000, cpu_shares=2048))

assert cpuset.plugin.settings_spec is not None
SPEC = cpuset.plugin.settings_spec


@pytest.fixture(params=TREES, ids=tree_id)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    return fake_tree(request.param, tmp_path / "cgroup")  # the node has CPUs 0-3


@pytest.fixture
def make_runner(tree: FakeCgroup, runners: list[PluginRunner]) -> Any:
    def make(*plugins: Plugin, policy: str = "", cgroups: CgroupFS | None = None) -> PluginRunner:
        current: Policy = policy_from(policy) if policy else DEFAULT_POLICY
        context = ServerContext(cgroups=cgroups or tree.fs(), policy=lambda: current)
        runner = PluginRunner(plugins or [cpuset.plugin], context=context, registry=CollectorRegistry())
        runners.append(runner)
        return runner

    return make


def make_pod(tree: FakeCgroup, qos: str, status: str | None, kube_qos: Any = "guaranteed") -> PodInfo:
    uid = f"{qos.lower()}-1"
    return PodInfo(
        name=f"pod-{uid}",
        namespace="default",
        uid=uid,
        labels=MappingProxyType({"koordinator.sh/qosClass": qos}),
        annotations=MappingProxyType({STATUS: status} if status is not None else {}),
        cgroup_parent=tree.add_pod(uid, kube_qos),
    )


@pytest.mark.parametrize("qos", ["LSE", "LSR"])
async def test_pinned_containers_get_the_scheduler_cpuset(tree: FakeCgroup, make_runner: Any, qos: str) -> None:
    pod = make_pod(tree, qos, json.dumps({"cpuset": "3,0-1,2", "cpuSharedPools": []}))
    runner = make_runner()
    for point in (CREATE, UPDATE):
        result = await runner.run(point, pod=pod, container=APP)
        assert result.failures == [] and result.applied == ["cpuset"]
        assert result.response.resources.cpuset_cpus == "0-3"  # canonical form
        assert result.response.resources.cpu_quota == 0  # the quota is the cpu plugin's


@pytest.mark.parametrize(("qos", "kube_qos"), [("LS", "burstable"), ("BE", "besteffort"), ("SYSTEM", "burstable")])
async def test_classes_not_pinned_are_left_alone(tree: FakeCgroup, make_runner: Any, qos: str, kube_qos: str) -> None:
    pod = make_pod(tree, qos, json.dumps({"cpuset": "0-1"}), kube_qos)
    result = await make_runner().run(CREATE, pod=pod, container=APP)
    assert result.failures == [] and result.response.is_empty()


async def test_the_policy_decides_which_classes_are_pinned(tree: FakeCgroup, make_runner: Any) -> None:
    runner = make_runner(policy="cpuset: {LSR: {pinned: false}, LS: {pinned: true}}")
    lsr = await runner.run(CREATE, pod=make_pod(tree, "LSR", json.dumps({"cpuset": "0-1"})), container=APP)
    assert lsr.response.is_empty()
    ls = await runner.run(CREATE, pod=make_pod(tree, "LS", json.dumps({"cpuset": "2"}), "burstable"), container=APP)
    assert ls.response.resources.cpuset_cpus == "2"


@pytest.mark.parametrize("status", [None, "{}", '{"cpuset": ""}', "null", '{"cpuset": null}'])
async def test_no_assigned_cpuset_changes_nothing(tree: FakeCgroup, make_runner: Any, status: str | None) -> None:
    result = await make_runner().run(CREATE, pod=make_pod(tree, "LSR", status), container=APP)
    assert result.failures == [] and result.response.is_empty()


@pytest.mark.parametrize(
    "status",
    ["{cpuset: 0-3", '["0-3"]', '{"cpuset": 3}', '{"cpuset": "3-1"}', '{"cpuset": "0-3:2"}', '{"cpuset": "a"}'],
)
async def test_a_malformed_annotation_is_logged_and_skipped(tree: FakeCgroup, make_runner: Any, status: str) -> None:
    with capture_logs() as logs:
        result = await make_runner().run(CREATE, pod=make_pod(tree, "LSR", status), container=APP)
    assert result.failures == [] and result.applied == ["cpuset"]  # the pod is never failed
    assert result.response.is_empty()
    assert [entry["log_level"] for entry in logs if entry.get("plugin") == "cpuset"] == ["warning"]


async def test_cpus_the_node_lacks_are_refused(tree: FakeCgroup, make_runner: Any) -> None:
    with capture_logs() as logs:
        result = await make_runner().run(CREATE, pod=make_pod(tree, "LSR", '{"cpuset": "2-5"}'), container=APP)
    assert result.failures == [] and result.response.is_empty()
    [warning] = [entry for entry in logs if entry.get("plugin") == "cpuset"]
    assert (warning["missing"], warning["node_cpus"]) == ("4-5", "0-3")


async def test_without_a_cgroup_tree_the_cpuset_is_passed_on_unchecked(tree: FakeCgroup) -> None:
    runner = PluginRunner([cpuset.plugin], context=ServerContext(cgroups=None), registry=CollectorRegistry())
    try:
        result = await runner.run(CREATE, pod=make_pod(tree, "LSR", '{"cpuset": "8-9"}'), container=APP)
    finally:
        runner.close()
    assert result.response.resources.cpuset_cpus == "8-9"


async def test_lsr_container_gets_no_quota_and_its_cpuset_with_the_cpu_plugin(
    tree: FakeCgroup, make_runner: Any
) -> None:
    pod = make_pod(tree, "LSR", json.dumps({"cpuset": "0-1"}))
    fs = tree.fs()
    fs.set_cpu_quota(pod.cgroup_parent, 200000)  # kubelet's Guaranteed pod quota
    runner = make_runner(cpu.plugin, cpuset.plugin)
    pod_result = await runner.run(RUN, pod=pod)
    assert pod_result.failures == []
    assert fs.cpu_quota(pod.cgroup_parent)[0] == -1
    result = await runner.run(CREATE, pod=pod, container=APP)
    assert result.failures == [] and result.applied == ["cpu", "cpuset"]
    resources = result.response.resources
    assert (resources.cpu_quota, resources.cpuset_cpus, resources.cpu_shares) == (-1, "0-1", 0)


async def test_the_trust_switch_ignores_pod_supplied_cpusets_and_keeps_the_quota(
    tree: FakeCgroup, make_runner: Any
) -> None:
    """``trust.pod_cpuset: false``: no pinning, and no quota lift that only pinning justifies."""
    pod = make_pod(tree, "LSR", json.dumps({"cpuset": "0-1"}))
    fs = tree.fs()
    fs.set_cpu_quota(pod.cgroup_parent, 200000)  # kubelet's Guaranteed pod quota
    runner = make_runner(cpu.plugin, cpuset.plugin, policy="trust: {pod_cpuset: false}")
    with capture_logs() as logs:
        pod_result = await runner.run(RUN, pod=pod)
        result = await runner.run(CREATE, pod=pod, container=APP)
    assert pod_result.failures == [] and result.failures == []
    assert fs.cpu_quota(pod.cgroup_parent)[0] == 200000  # not lifted
    assert result.applied == ["cpu", "cpuset"]
    assert (result.response.resources.cpu_quota, result.response.resources.cpuset_cpus) == (0, "")
    withheld = [entry for entry in logs if entry["event"] == "withheld from the plugins"]
    assert len(withheld) == 2 and all("trust.pod_cpuset is false" in entry["reason"] for entry in withheld)
    # The same pod with the switch on (the default) is pinned and unlimited.
    trusted = await make_runner(cpu.plugin, cpuset.plugin).run(CREATE, pod=pod, container=APP)
    assert (trusted.response.resources.cpu_quota, trusted.response.resources.cpuset_cpus) == (-1, "0-1")


def test_the_plan_is_pure() -> None:
    pod = PodInfo(name="p", namespace="d", uid="u", annotations=MappingProxyType({STATUS: '{"cpuset": "1,2,3,7"}'}))
    plan = cpuset.plan_container(pod, APP, QoSClass.LSE, DEFAULT_POLICY.section(SPEC).for_class("LSE"))
    assert plan.cpuset_cpus == "1-3,7" and plan.describe()["notes"]
    shared = cpuset.plan_container(pod, APP, QoSClass.LS, DEFAULT_POLICY.section(SPEC).for_class("LS"))
    assert shared.cpuset_cpus is None
    with pytest.raises(ValueError, match="resource-status"):
        cpuset.cpuset_from_annotations({STATUS: "nope"})


# --- reconcile ----------------------------------------------------------------------------------


def live_pod(tree: FakeCgroup, qos: str, status: str | None, *containers: str) -> tuple[PodInfo, dict[str, Any]]:
    """A running pod: its sandbox's and containers' cgroups made, as the reconciler lists them."""
    pod = make_pod(tree, qos, status)
    pod = PodInfo(**{**pod.__dict__, "sandbox_id": f"sb-{pod.uid}"})
    for cgroup_id in (pod.sandbox_id, *containers):
        tree.add_container(pod.cgroup_parent, cgroup_id)
    listed = tuple(ContainerInfo(name=f"c{i}", id=cid) for i, cid in enumerate(containers))
    return pod, {pod.sandbox_id: listed}


def cpus_of(tree: FakeCgroup, pod: PodInfo, *ids: str) -> list[str]:
    return [tree.read(pod.cgroup_parent, "cpuset.cpus", cgroup_id) for cgroup_id in ids]


async def test_reconcile_pins_the_sandbox_and_sets_back_drifted_containers(tree: FakeCgroup, make_runner: Any) -> None:
    pod, containers = live_pod(tree, "LSR", json.dumps({"cpuset": "2,1"}), "ca", "cb")
    ids = (pod.sandbox_id, "ca", "cb")
    runner = make_runner()
    report = await runner.reconcile_report(pods=[pod], containers=containers)
    assert report.failures == [] and report.repaired == {"cpuset": 3}
    assert cpus_of(tree, pod, *ids) == ["1-2"] * 3
    assert (await runner.reconcile_report(pods=[pod], containers=containers)).repaired == {"cpuset": 0}
    fs = tree.fs()
    fs.write("cpuset", "cpuset.cpus", "0-3", pod.cgroup_parent, "cb")  # drift
    assert (await runner.reconcile_report(pods=[pod], containers=containers)).repaired == {"cpuset": 1}
    assert cpus_of(tree, pod, *ids) == ["1-2"] * 3


async def test_reconcile_leaves_unpinned_classes_and_untrusted_cpusets_alone(
    tree: FakeCgroup, make_runner: Any
) -> None:
    status = json.dumps({"cpuset": "1"})
    ls, ls_containers = live_pod(tree, "LS", status, "ls-app")
    lsr, lsr_containers = live_pod(tree, "LSR", status, "lsr-app")
    untrusted = make_runner(policy="trust: {pod_cpuset: false}")
    report = await untrusted.reconcile_report(pods=[ls, lsr], containers=ls_containers | lsr_containers)
    assert report.repaired == {"cpuset": 0}
    report = await make_runner().reconcile_report(pods=[ls, lsr], containers=ls_containers | lsr_containers)
    assert report.repaired == {"cpuset": 2}  # the LSR pod's sandbox and container only
    assert cpus_of(tree, ls, ls.sandbox_id, "ls-app") == ["", ""]


@pytest.mark.parametrize(("status", "error"), [('{"cpuset": "x"}', "resource-status"), ('{"cpuset": "3-7"}', "4-7")])
async def test_reconcile_skips_an_unusable_cpuset_with_one_warning(
    tree: FakeCgroup, make_runner: Any, status: str, error: str
) -> None:
    pod, containers = live_pod(tree, "LSE", status, "app")
    runner = make_runner()
    with capture_logs() as logs:
        for _ in range(3):
            report = await runner.reconcile_report(pods=[pod], containers=containers)
            assert report.failures == [] and report.repaired == {"cpuset": 0}
    [warning] = [entry for entry in logs if entry.get("plugin") == "cpuset"]
    assert warning["log_level"] == "warning" and error in warning["error"]
    assert cpus_of(tree, pod, pod.sandbox_id, "app") == ["", ""]


async def test_reconcile_skips_containers_whose_cgroup_is_gone(tree: FakeCgroup, make_runner: Any) -> None:
    pod, containers = live_pod(tree, "LSR", json.dumps({"cpuset": "0"}), "app")
    listed = {pod.sandbox_id: (*containers[pod.sandbox_id], ContainerInfo(name="gone", id="gone"))}
    with capture_logs() as logs:
        report = await make_runner().reconcile_report(pods=[pod], containers=listed)
    assert report.failures == [] and report.repaired == {"cpuset": 2}
    assert [entry for entry in logs if entry.get("log_level") == "warning"] == []
