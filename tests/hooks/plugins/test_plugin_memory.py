"""The memory plugin (hooks/plugins/memory.py): the arithmetic, where request and limit come from,
and what it writes to fake cgroup v1 / v2 trees with both drivers."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks import systemd_units
from runtimeproxy.hooks.cgroups import CgroupDriver, CgroupVersion
from runtimeproxy.hooks.extended_resources import BATCH_MEMORY
from runtimeproxy.hooks.extended_resources import EXTENDED_RESOURCE_SPEC_ANNOTATION as EXTENDED_RESOURCE_SPEC
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.plugins import batch_memory
from runtimeproxy.hooks.plugins.memory import (
    PAGE_SIZE,
    MemorySettings,
    container_inputs,
    container_plan,
    oom_score_adj,
    plugin,
    pod_inputs,
    protection,
    soft_limit,
)
from runtimeproxy.hooks.policy import DEFAULT_POLICY, Policy
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.sdk import ContainerInfo, HookPoint, PodInfo, Resources, ServerContext
from runtimeproxy.hooks.testkit import policy_from
from runtimeproxy.hooks.testkit.fake_cgroups import (
    V1_UNLIMITED,
    FakeCgroup,
    KubeQoS,
    make_fake_cgroup_v1,
    make_fake_cgroup_v2,
)

GiB = 1 << 30
MiB = 1 << 20
POLICY = policy_from(
    """
memory:
  LSR: {min_percent: 100, low_percent: 100, throttling_percent: 0, v1_soft_limit: request}
  LS: {min_percent: 50, low_percent: 80, throttling_percent: 60, v1_soft_limit: request}
  BE: {min_percent: 0, low_percent: 0, throttling_percent: 90, v1_soft_limit: zero}
"""
)


def page(value: int) -> int:
    return value // PAGE_SIZE * PAGE_SIZE


def settings_of(policy: Policy, qos: str) -> MemorySettings:
    """The memory settings of class ``qos`` in ``policy``."""
    assert plugin.settings_spec is not None
    found: MemorySettings = policy.section(plugin.settings_spec).for_class(qos)
    return found


def policy_entry(min_percent: int = 0, low_percent: int = 0, throttling_percent: int = 0) -> MemorySettings:
    return MemorySettings(
        min_percent=min_percent,
        low_percent=low_percent,
        throttling_percent=throttling_percent,
        wmark_ratio=95,
        wmark_scale_permill=20,
        wmark_min_adj=0,
        v1_soft_limit="unset",
        batch_memory_limit=False,
        pod_oom_score_adj=False,
    )


def spec(containers: dict[str, dict[str, dict[str, str]]]) -> str:
    return json.dumps({"containers": containers})


# --- the annotation (read by hooks/extended_resources.py) ---------------------------------------


@pytest.mark.parametrize(
    "bad",
    ["not json", "[]", '{"containers": []}', '{"containers": {"a": {"requests": {"memory": "lots"}}}}'],
)
def test_an_unreadable_annotation_is_ignored_with_its_reason(bad: str) -> None:
    pod = PodInfo(name="p", namespace="n", uid="u", annotations={EXTENDED_RESOURCE_SPEC: bad})
    inputs = container_inputs(QoSClass.BE, pod, ContainerInfo(name="a"))
    assert (inputs.request, inputs.limit) == (None, None)
    assert inputs.notes[0].startswith(f"annotation {EXTENDED_RESOURCE_SPEC} ignored")


def test_koordinator_rules_where_the_old_parser_refused() -> None:
    """A negative quantity counts as unset (noted), a JSON number is a quantity, a null entry is
    a container with nothing: Go takes all three, so the other containers' values still count."""
    text = (
        '{"containers": {"a": {"requests": {"kubernetes.io/batch-memory": "-1Gi"},'
        ' "limits": {"kubernetes.io/batch-memory": 1073741824}}, "b": null}}'
    )
    pod = PodInfo(name="p", namespace="n", uid="u", annotations={EXTENDED_RESOURCE_SPEC: text})
    inputs = container_inputs(QoSClass.BE, pod, ContainerInfo(name="a"))
    assert (inputs.request, inputs.limit) == (None, GiB)
    assert any("not positive" in note for note in inputs.notes)
    assert pod_inputs(QoSClass.BE, pod).limit is None  # b has no limit: the pod is unlimited


# --- inputs -------------------------------------------------------------------------------------


def test_container_request_and_limit_sources() -> None:
    annotations = MappingProxyType(
        {
            EXTENDED_RESOURCE_SPEC: spec(
                {
                    "app": {"requests": {"memory": "1Gi"}, "limits": {"memory": "3Gi"}},
                    "job": {"requests": {BATCH_MEMORY: "512Mi"}, "limits": {BATCH_MEMORY: "1Gi"}},
                }
            )
        }
    )
    pod = PodInfo(name="p", namespace="n", uid="u", annotations=annotations)
    app = ContainerInfo(name="app", id="c1", resources=Resources(memory_limit_in_bytes=2 * GiB))
    ls = container_inputs(QoSClass.LS, pod, app)
    assert (ls.request, ls.limit) == (GiB, 2 * GiB)  # CRI limit first for non-BE
    assert ls.limit_source == "CRI memory_limit_in_bytes"
    job = ContainerInfo(name="job", id="c2", resources=Resources(memory_limit_in_bytes=8 * GiB))
    be = container_inputs(QoSClass.BE, pod, job)
    assert (be.request, be.limit) == (512 * MiB, GiB)  # batch-memory first for BE
    # No annotation entry: kubelet's MemoryQoS memory.min stands for the request.
    lone = ContainerInfo(
        name="lone", id="c3", resources=Resources(memory_limit_in_bytes=GiB, unified={"memory.min": str(256 * MiB)})
    )
    assert container_inputs(QoSClass.LS, pod, lone).request == 256 * MiB
    unknown = container_inputs(QoSClass.LS, PodInfo(name="p", namespace="n", uid="u"), ContainerInfo(name="x"))
    assert (unknown.request, unknown.limit, unknown.request_source) == (None, None, "unknown")


def test_a_request_above_the_limit_is_taken_as_the_limit() -> None:
    annotations = MappingProxyType({EXTENDED_RESOURCE_SPEC: spec({"app": {"requests": {"memory": "4Gi"}}})})
    pod = PodInfo(name="p", namespace="n", uid="u", annotations=annotations)
    inputs = container_inputs(
        QoSClass.LS, pod, ContainerInfo(name="app", resources=Resources(memory_limit_in_bytes=GiB))
    )
    assert (inputs.request, inputs.limit) == (GiB, GiB)
    assert "above the limit" in inputs.notes[0]


def test_pod_totals() -> None:
    annotations = MappingProxyType(
        {
            EXTENDED_RESOURCE_SPEC: spec(
                {
                    "a": {"requests": {BATCH_MEMORY: "1Gi"}, "limits": {BATCH_MEMORY: "2Gi"}},
                    "b": {"requests": {BATCH_MEMORY: "1Gi"}, "limits": {BATCH_MEMORY: "1Gi"}},
                }
            )
        }
    )
    pod = PodInfo(name="p", namespace="n", uid="u", annotations=annotations, resources=Resources())
    be = pod_inputs(QoSClass.BE, pod)
    assert (be.request, be.limit) == (2 * GiB, 3 * GiB)
    one_unlimited = MappingProxyType(
        {EXTENDED_RESOURCE_SPEC: spec({"a": {"limits": {BATCH_MEMORY: "2Gi"}}, "b": {"requests": {}}})}
    )
    assert pod_inputs(QoSClass.BE, PodInfo(name="p", namespace="n", uid="u", annotations=one_unlimited)).limit is None


# --- the arithmetic -----------------------------------------------------------------------------


def test_koordinator_formulas() -> None:
    prot = protection(GiB, 2 * GiB, policy_entry(50, 80, 60), page_size=4096)
    assert prot.min == GiB // 2
    assert prot.low == (GiB * 80 // 100) // 4096 * 4096
    assert prot.high == (GiB + GiB * 60 // 100) // 4096 * 4096


def test_off_means_left_alone() -> None:
    assert protection(GiB, 2 * GiB, policy_entry(), page_size=4096) == protection(None, None, policy_entry(), 4096)
    nothing = protection(GiB, 2 * GiB, policy_entry(), page_size=4096)
    assert (nothing.min, nothing.low, nothing.high) == (None, None, None)
    no_limit = protection(GiB, None, policy_entry(0, 0, 80), page_size=4096)
    assert no_limit.high is None and "no memory limit" in no_limit.notes[0]
    no_request = protection(None, 2 * GiB, policy_entry(50, 50, 50), page_size=4096)
    assert (no_request.min, no_request.low) == (None, None)
    assert no_request.high == GiB  # the request taken as 0: limit * percent / 100


def test_low_is_raised_to_min() -> None:
    prot = protection(GiB, None, policy_entry(60, 30, 0), page_size=4096)  # a policy file could not say this
    assert prot.low == prot.min == (GiB * 60 // 100) // 4096 * 4096


@given(
    request=st.none() | st.integers(0, 1 << 50),
    limit=st.none() | st.integers(0, 1 << 50),
    min_percent=st.integers(0, 100),
    low_percent=st.integers(0, 100),
    throttling=st.integers(0, 100),
    page_size=st.sampled_from([1, 4096, 16384, 65536]),
)
def test_protection_is_ordered_bounded_and_page_aligned(
    request: int | None, limit: int | None, min_percent: int, low_percent: int, throttling: int, page_size: int
) -> None:
    prot = protection(request, limit, policy_entry(min_percent, low_percent, throttling), page_size)
    values = [v for v in (prot.min, prot.low, prot.high) if v is not None]
    assert all(v >= 0 and v % page_size == 0 for v in values)
    effective = request if request is None or limit is None else min(request, limit)
    if prot.min is not None:
        assert effective is not None and prot.min <= effective
    if prot.low is not None:
        assert effective is not None and prot.low <= effective
        if prot.min is not None:
            assert prot.min <= prot.low
    if prot.high is not None:
        assert limit is not None and 0 < prot.high <= limit
        assert all(v <= prot.high for v in (prot.min, prot.low) if v is not None)
    if not min_percent:
        assert prot.min is None
    if not throttling:
        assert prot.high is None


def test_soft_limit_and_oom_rules() -> None:
    entry = settings_of(DEFAULT_POLICY, "LS")
    assert soft_limit(GiB, entry) is None  # unset
    assert soft_limit(GiB, settings_of(POLICY, "LS")) == GiB
    assert soft_limit(None, settings_of(POLICY, "LS")) is None
    assert soft_limit(GiB, settings_of(POLICY, "BE")) == 0
    assert oom_score_adj(QoSClass.BE, 500) == 1000
    assert oom_score_adj(QoSClass.BE, -997) == 1000
    assert oom_score_adj(QoSClass.BE, 1000) is None
    assert oom_score_adj(QoSClass.LS, 500) is None


@given(st.sampled_from(list(QoSClass)), st.integers(-1000, 1000))
def test_oom_score_adj_is_only_ever_raised(qos: QoSClass, current: int) -> None:
    target = oom_score_adj(qos, current)
    assert target is None or target > current


def test_plan_describes_itself_for_explain() -> None:
    annotations = MappingProxyType({EXTENDED_RESOURCE_SPEC: spec({"app": {"requests": {"memory": "1Gi"}}})})
    pod = PodInfo(name="p", namespace="n", uid="u", annotations=annotations)
    app = ContainerInfo(name="app", id="c", resources=Resources(memory_limit_in_bytes=2 * GiB))
    plan = container_plan(QoSClass.LSR, settings_of(POLICY, "LSR"), pod, app, CgroupVersion.V2, page_size=4096)
    described = plan.describe()
    assert described["files"]["memory.min"] == str(GiB)
    assert described["files"]["memory.high"] is None  # throttling off: left as it is
    assert described["request_source"] == f"{EXTENDED_RESOURCE_SPEC} requests[memory]"
    v1 = container_plan(QoSClass.LSR, settings_of(POLICY, "LSR"), pod, app, CgroupVersion.V1, page_size=4096)
    assert v1.files()["memory.soft_limit_in_bytes"] == str(GiB)


# --- on the node --------------------------------------------------------------------------------


class Node:
    def __init__(self, tree: FakeCgroup, runner: PluginRunner) -> None:
        self.tree = tree
        self.runner = runner

    def pod(
        self,
        qos: str,
        kube: KubeQoS = "burstable",
        containers: dict[str, dict[str, dict[str, str]]] | None = None,
        resources: Resources | None = None,
    ) -> PodInfo:
        uid = f"uid-{qos.lower()}"
        parent = self.tree.add_pod(uid, kube)
        annotations = {EXTENDED_RESOURCE_SPEC: spec(containers)} if containers else {}
        return PodInfo(
            name=qos.lower(),
            namespace="default",
            uid=uid,
            labels=MappingProxyType({"koordinator.sh/qosClass": qos}),
            annotations=MappingProxyType(annotations),
            cgroup_parent=parent,
            resources=resources,
        )

    def container(self, pod: PodInfo, name: str, limit: int = 0, oom: int = 0) -> ContainerInfo:
        cid = f"{pod.uid}-{name}"
        self.tree.add_container(pod.cgroup_parent, cid)
        return ContainerInfo(name=name, id=cid, resources=Resources(memory_limit_in_bytes=limit, oom_score_adj=oom))

    def read(self, pod: PodInfo, file: str, container: ContainerInfo | None = None) -> str:
        return self.tree.read(pod.cgroup_parent, file, container.id if container else None, controller="memory")


@pytest.fixture
def make_node(tmp_path: Path, stopped_runners: list[PluginRunner]) -> Callable[..., Node]:
    def make(
        version: int = 2, driver: CgroupDriver = "cgroupfs", policy: Policy = POLICY, anolis: bool = False
    ) -> Node:
        maker = make_fake_cgroup_v2 if version == 2 else make_fake_cgroup_v1
        tree = maker(tmp_path / "cgroup", driver=driver, anolis=anolis)
        runner = PluginRunner(
            [plugin], context=ServerContext(cgroups=tree.fs(), policy=lambda: policy), registry=CollectorRegistry()
        )
        stopped_runners.append(runner)
        return Node(tree, runner)

    return make


DRIVERS = pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])


@DRIVERS
async def test_v2_container_values_per_class(make_node: Any, driver: CgroupDriver) -> None:
    node = make_node(driver=driver)
    ls = node.pod("LS", containers={"app": {"requests": {"memory": "1Gi"}}})
    app = node.container(ls, "app", limit=2 * GiB)
    result = await node.runner.run(HookPoint.POST_START_CONTAINER, pod=ls, container=app)
    assert result.failures == [] and result.applied == ["memory"]
    assert node.read(ls, "memory.min", app) == str(page(GiB // 2))
    assert node.read(ls, "memory.low", app) == str(page(GiB * 80 // 100))
    assert node.read(ls, "memory.high", app) == str(page(GiB + GiB * 60 // 100))

    lsr = node.pod("LSR", "guaranteed", containers={"db": {"requests": {"memory": "2Gi"}}})
    db = node.container(lsr, "db", limit=2 * GiB)
    await node.runner.run(HookPoint.POST_START_CONTAINER, pod=lsr, container=db)
    assert node.read(lsr, "memory.min", db) == node.read(lsr, "memory.low", db) == str(2 * GiB)
    assert node.read(lsr, "memory.high", db) == "max"  # throttling_percent 0: off

    be = node.pod(
        "BE", "besteffort", containers={"job": {"requests": {BATCH_MEMORY: "1Gi"}, "limits": {BATCH_MEMORY: "2Gi"}}}
    )
    job = node.container(be, "job")  # kubelet knows no batch memory: CRI limit 0
    await node.runner.run(HookPoint.POST_START_CONTAINER, pod=be, container=job)
    assert node.read(be, "memory.min", job) == node.read(be, "memory.low", job) == "0"  # off: untouched
    assert node.read(be, "memory.high", job) == str(page(GiB + GiB * 90 // 100))

    lse = node.pod("LSE", "guaranteed", containers={"x": {"requests": {"memory": "1Gi"}}})
    x = node.container(lse, "x", limit=GiB)
    await node.runner.run(HookPoint.POST_START_CONTAINER, pod=lse, container=x)  # LSE: all off in POLICY
    assert [node.read(lse, f, x) for f in ("memory.min", "memory.low", "memory.high")] == ["0", "0", "max"]


async def test_v2_high_stays_max_without_a_limit(make_node: Any) -> None:
    node = make_node()
    be = node.pod("BE", "besteffort")
    job = node.container(be, "job")
    await node.runner.run(HookPoint.POST_START_CONTAINER, pod=be, container=job)
    assert node.read(be, "memory.high", job) == "max"


@DRIVERS
async def test_v2_pod_level_at_run_pod_sandbox(make_node: Any, driver: CgroupDriver) -> None:
    node = make_node(driver=driver)
    containers = {"a": {"requests": {"memory": "1Gi"}}, "b": {"requests": {"memory": "512Mi"}}}
    pod = node.pod("LS", containers=containers, resources=Resources(memory_limit_in_bytes=4 * GiB))
    result = await node.runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=pod)
    assert result.failures == [] and result.response.is_empty()
    request = GiB + 512 * MiB
    assert node.read(pod, "memory.min") == str(page(request // 2))
    assert node.read(pod, "memory.low") == str(page(request * 80 // 100))
    assert node.read(pod, "memory.high") == str(page(request + (4 * GiB - request) * 60 // 100))

    # Without the pod's resources, nothing is written at pod level.
    other = node.pod("LSR", "guaranteed", containers={"a": {"requests": {"memory": "1Gi"}}})
    await node.runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=other)
    assert node.read(other, "memory.min") == "0"


@DRIVERS
async def test_v1_soft_limit_per_class(make_node: Any, driver: CgroupDriver) -> None:
    node = make_node(version=1, driver=driver)
    ls = node.pod("LS", containers={"app": {"requests": {"memory": "1Gi"}}}, resources=Resources())
    app = node.container(ls, "app", limit=2 * GiB)
    await node.runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=ls)
    await node.runner.run(HookPoint.POST_START_CONTAINER, pod=ls, container=app)
    assert node.read(ls, "memory.soft_limit_in_bytes", app) == str(GiB)  # request
    assert node.read(ls, "memory.soft_limit_in_bytes") == str(GiB)  # pod total
    be = node.pod("BE", "besteffort")
    job = node.container(be, "job")
    await node.runner.run(HookPoint.POST_START_CONTAINER, pod=be, container=job)
    assert node.read(be, "memory.soft_limit_in_bytes", job) == "0"  # zero
    lse = node.pod("LSE", "guaranteed", containers={"x": {"requests": {"memory": "1Gi"}}})
    x = node.container(lse, "x", limit=GiB)
    await node.runner.run(HookPoint.POST_START_CONTAINER, pod=lse, container=x)
    assert node.read(lse, "memory.soft_limit_in_bytes", x) == V1_UNLIMITED  # unset: left alone
    # v1 has no memory.min: nothing of the v2 settings is attempted.
    assert not node.tree.dir(ls.cgroup_parent, app.id, "memory").joinpath("memory.min").exists()


@pytest.mark.parametrize("version", [1, 2])
async def test_watermarks_where_the_kernel_has_them(make_node: Any, version: int) -> None:
    node = make_node(version=version, anolis=True)
    be = node.pod("BE", "besteffort")
    job = node.container(be, "job")
    await node.runner.run(HookPoint.POST_START_CONTAINER, pod=be, container=job)
    entry = settings_of(POLICY, "BE")
    assert node.read(be, "memory.wmark_ratio", job) == str(entry.wmark_ratio)
    assert node.read(be, "memory.wmark_scale_factor", job) == str(entry.wmark_scale_permill)
    assert node.read(be, "memory.wmark_min_adj", job) == str(entry.wmark_min_adj)


async def test_no_watermark_files_no_failure(make_node: Any) -> None:
    node = make_node()
    be = node.pod("BE", "besteffort")
    job = node.container(be, "job")
    result = await node.runner.run(HookPoint.POST_START_CONTAINER, pod=be, container=job)
    assert result.failures == []
    assert not node.tree.dir(be.cgroup_parent, job.id).joinpath("memory.wmark_ratio").exists()


async def test_a_missing_cgroup_is_skipped(make_node: Any) -> None:
    node = make_node()
    pod = node.pod("LS", containers={"app": {"requests": {"memory": "1Gi"}}})
    ghost = ContainerInfo(name="app", id="not-created", resources=Resources(memory_limit_in_bytes=GiB))
    result = await node.runner.run(HookPoint.POST_START_CONTAINER, pod=pod, container=ghost)
    assert result.failures == []


@pytest.mark.parametrize(
    ("qos", "kube", "current", "expected"),
    [
        ("BE", "besteffort", 1000, 0),  # kubelet's BestEffort value: nothing to raise
        ("BE", "burstable", 500, 1000),  # a Burstable pod labelled BE: OOM-killed first
        ("BE", "guaranteed", -997, 1000),
        ("LS", "burstable", 500, 0),  # other classes: kubelet's value stays
        ("LSR", "guaranteed", -997, 0),
    ],
)
async def test_oom_score_adj_in_the_create_response(
    make_node: Any, qos: str, kube: KubeQoS, current: int, expected: int
) -> None:
    node = make_node()
    pod = node.pod(qos, kube)
    container = ContainerInfo(name="c", resources=Resources(oom_score_adj=current))
    result = await node.runner.run(HookPoint.PRE_CREATE_CONTAINER, pod=pod, container=container)
    assert result.failures == []
    assert result.response.resources.oom_score_adj == expected


async def test_oom_score_adj_without_container_resources(make_node: Any) -> None:
    node = make_node()
    pod = node.pod("BE", "besteffort")
    result = await node.runner.run(HookPoint.PRE_CREATE_CONTAINER, pod=pod, container=ContainerInfo(name="c"))
    assert result.response.resources.oom_score_adj == 1000


# --- reconcile ----------------------------------------------------------------------------------


async def test_reconcile_sets_back_drift_and_follows_policy_changes(
    tmp_path: Path, stopped_runners: list[PluginRunner]
) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cgroup", driver="systemd")
    current = [POLICY]
    runner = PluginRunner(
        [plugin], context=ServerContext(cgroups=tree.fs(), policy=lambda: current[0]), registry=CollectorRegistry()
    )
    stopped_runners.append(runner)
    node = Node(tree, runner)
    ls = node.pod(
        "LS", containers={"app": {"requests": {"memory": "1Gi"}}}, resources=Resources(memory_limit_in_bytes=2 * GiB)
    )
    ls = dataclasses.replace(ls, sandbox_id="sb-ls")
    app = node.container(ls, "app", limit=2 * GiB)
    await runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=ls)
    await runner.run(HookPoint.POST_START_CONTAINER, pod=ls, container=app)
    containers = {"sb-ls": (app,)}

    report = await runner.reconcile_report(pods=[ls], containers=containers)
    assert report.failures == [] and report.repaired == {"memory": 0}  # nothing drifted

    tree.dir(ls.cgroup_parent, app.id).joinpath("memory.min").write_text("0\n")  # someone else's write
    report = await runner.reconcile_report(pods=[ls], containers=containers)
    assert report.repaired == {"memory": 1}
    assert node.read(ls, "memory.min", app) == str(page(GiB // 2))

    current[0] = policy_from("memory:\n  LS: {min_percent: 100, low_percent: 100, throttling_percent: 60}\n")
    report = await runner.reconcile_report(pods=[ls], containers=containers)
    assert report.repaired == {"memory": 4}  # min and low, at pod and container level
    assert node.read(ls, "memory.min", app) == node.read(ls, "memory.low", app) == str(GiB)
    assert node.read(ls, "memory.min") == str(GiB)

    # Without the containers (an older caller): the pod level only, and no failure.
    assert (await runner.reconcile_report(pods=[ls])).repaired == {"memory": 0}


# --- memory limits from batch-memory (hooks/plugins/batch_memory.py) -----------------------------

BATCH_POD = {
    "a": {"limits": {BATCH_MEMORY: "64Mi"}},
    "b": {"requests": {BATCH_MEMORY: "16Mi"}, "limits": {BATCH_MEMORY: "32Mi"}},
}


def _limit_file(version: int) -> str:
    return "memory.max" if version == 2 else "memory.limit_in_bytes"


@pytest.mark.parametrize("version", [1, 2])
@DRIVERS
async def test_be_pod_limit_is_the_sum_of_batch_limits(make_node: Any, version: int, driver: CgroupDriver) -> None:
    node = make_node(version=version, driver=driver, policy=DEFAULT_POLICY)
    be = node.pod("BE", "besteffort", containers=BATCH_POD)
    result = await node.runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=be)
    assert result.failures == []
    assert node.read(be, _limit_file(version)) == str(96 * MiB)


@pytest.mark.parametrize(
    ("containers", "why"),
    [
        ({"a": {"limits": {BATCH_MEMORY: "64Mi"}}, "b": {"requests": {BATCH_MEMORY: "1Mi"}}}, "one has no limit"),
        ({}, "no containers listed"),
        (None, "no annotation"),
    ],
)
async def test_be_pod_limit_left_alone(make_node: Any, containers: Any, why: str) -> None:
    node = make_node(version=1, policy=DEFAULT_POLICY)
    be = node.pod("BE", "besteffort")
    if containers is not None:
        be = dataclasses.replace(be, annotations=MappingProxyType({EXTENDED_RESOURCE_SPEC: spec(containers)}))
    await node.runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=be)
    assert node.read(be, "memory.limit_in_bytes") == V1_UNLIMITED, why


async def test_the_switch_and_the_class_decide(make_node: Any) -> None:
    """Only classes with batch_memory_limit on (BE by default) get a limit from batch-memory."""
    node = make_node(version=2, policy=DEFAULT_POLICY)
    ls = node.pod("LS", containers=BATCH_POD)
    await node.runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=ls)
    app = ContainerInfo(name="a")
    result = await node.runner.run(HookPoint.PRE_CREATE_CONTAINER, pod=ls, container=app)
    assert node.read(ls, "memory.max") == "max"
    assert result.response.resources.memory_limit_in_bytes == 0
    off = make_node(version=2, policy=policy_from("memory:\n  BE: {batch_memory_limit: false}\n"))
    be = off.pod("BE", "besteffort", containers=BATCH_POD)
    await off.runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=be)
    result = await off.runner.run(HookPoint.PRE_CREATE_CONTAINER, pod=be, container=app)
    assert off.read(be, "memory.max") == "max"
    assert result.response.resources.memory_limit_in_bytes == 0


@pytest.mark.parametrize(
    ("name", "kubelet", "swap", "expected", "expected_swap"),
    [
        ("a", 0, 0, 64 * MiB, 0),  # kubelet set none: the batch limit
        ("a", GiB, GiB, 64 * MiB, 64 * MiB),  # tighter than kubelet's; "no swap" kept
        ("a", GiB, 2 * GiB, 64 * MiB, 0),  # kubelet allows swap: its swap limit is left alone
        ("a", 16 * MiB, 16 * MiB, 0, 0),  # kubelet's is tighter: left alone
        ("c", 0, 0, 0, 0),  # not in the annotation
    ],
)
async def test_be_container_limit_in_the_cri_response(
    make_node: Any, name: str, kubelet: int, swap: int, expected: int, expected_swap: int
) -> None:
    node = make_node(policy=DEFAULT_POLICY)
    be = node.pod("BE", "besteffort", containers=BATCH_POD)
    container = ContainerInfo(
        name=name, resources=Resources(memory_limit_in_bytes=kubelet, memory_swap_limit_in_bytes=swap)
    )
    for hook in (HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES):
        result = await node.runner.run(hook, pod=be, container=container)
        assert result.failures == []
        assert result.response.resources.memory_limit_in_bytes == expected
        assert result.response.resources.memory_swap_limit_in_bytes == expected_swap


async def test_a_tiny_batch_limit_is_raised_to_runcs_minimum(make_node: Any) -> None:
    node = make_node(policy=DEFAULT_POLICY)
    be = node.pod("BE", "besteffort", containers={"a": {"limits": {BATCH_MEMORY: "1Mi"}}})
    result = await node.runner.run(HookPoint.PRE_CREATE_CONTAINER, pod=be, container=ContainerInfo(name="a"))
    assert result.response.resources.memory_limit_in_bytes == 6 * MiB


@pytest.mark.parametrize("version", [1, 2])
async def test_reconcile_keeps_batch_limits_and_never_lifts_a_tighter_one(make_node: Any, version: int) -> None:
    node = make_node(version=version, policy=DEFAULT_POLICY)
    be = dataclasses.replace(node.pod("BE", "besteffort", containers=BATCH_POD), sandbox_id="sb-be")
    a = node.container(be, "a")
    await node.runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=be)
    file, unlimited = _limit_file(version), ("max" if version == 2 else V1_UNLIMITED)
    node.tree.dir(be.cgroup_parent, a.id, controller="memory").joinpath(file).write_text(f"{unlimited}\n")
    node.tree.dir(be.cgroup_parent, controller="memory").joinpath(file).write_text(f"{unlimited}\n")
    report = await node.runner.reconcile_report(pods=[be], containers={"sb-be": (a,)})
    assert report.failures == [] and report.repaired == {"memory": 2}
    assert node.read(be, file) == str(96 * MiB)
    assert node.read(be, file, a) == str(64 * MiB)
    # Someone tightened the container's limit: ours is looser, so it stays.
    node.tree.dir(be.cgroup_parent, a.id, controller="memory").joinpath(file).write_text(f"{32 * MiB}\n")
    report = await node.runner.reconcile_report(pods=[be], containers={"sb-be": (a,)})
    assert report.repaired == {"memory": 0}
    assert node.read(be, file, a) == str(32 * MiB)


async def test_an_unreadable_limit_file_is_rewritten_and_logged(make_node: Any) -> None:
    node = make_node(version=2, policy=DEFAULT_POLICY)
    be = node.pod("BE", "besteffort", containers=BATCH_POD)
    node.tree.dir(be.cgroup_parent, controller="memory").joinpath("memory.max").write_text("garbage\n")
    await node.runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=be)
    assert node.read(be, "memory.max") == str(96 * MiB)


@pytest.mark.parametrize(
    ("text", "version", "value"),
    [
        ("max", 2, None),
        ("1048576", 2, MiB),
        (V1_UNLIMITED, 1, None),
        ("-1", 1, None),
        ("1048576", 1, MiB),
    ],
)
def test_parse_limit(text: str, version: int, value: int | None) -> None:
    assert batch_memory.parse_limit(text, CgroupVersion(version)) == value


@given(st.integers(1, 1 << 62), st.one_of(st.none(), st.integers(-1, 1 << 62)))
def test_tightens_never_lifts(planned: int, current: int | None) -> None:
    if batch_memory.tightens(planned, current):
        assert current is None or current <= 0 or planned < current
    else:
        assert current is not None and 0 < current <= planned


def test_systemd_gets_the_pod_limit_as_memory_max() -> None:
    """Under the systemd driver the pod slice's memory.max is synced as MemoryMax."""
    assert systemd_units.unit_properties("memory.max", str(96 * MiB)) == (
        systemd_units.UnitProperty("MemoryMax", "t", 96 * MiB),
    )
