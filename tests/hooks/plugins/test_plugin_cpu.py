"""The cpu plugin (hooks/plugins/cpu.py) on fake cgroup v1 and v2 trees, cgroupfs and systemd
drivers, run through PluginRunner as the hook server runs it."""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from fake_trees import TREES, fake_tree, tree_id
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.cgroups import (
    MAX_SHARES,
    MIN_SHARES,
    CgroupFS,
    CgroupPathError,
    CgroupVersion,
    shares_to_weight,
)
from runtimeproxy.hooks.extended_resources import BATCH_CPU
from runtimeproxy.hooks.extended_resources import EXTENDED_RESOURCE_SPEC_ANNOTATION as SPEC_KEY
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.plugins import cpu
from runtimeproxy.hooks.plugins.cpu_tiers import reconcile_tiers
from runtimeproxy.hooks.policy import DEFAULT_POLICY, Policy
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.sdk import ContainerInfo, HookPoint, PodInfo, ResourceChanges, Resources, ServerContext
from runtimeproxy.hooks.testkit import policy_from
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1, make_fake_cgroup_v2
from structlog.testing import capture_logs

RUN = HookPoint.PRE_RUN_POD_SANDBOX
CREATE = HookPoint.PRE_CREATE_CONTAINER
UPDATE = HookPoint.PRE_UPDATE_CONTAINER_RESOURCES
STARTED = HookPoint.POST_START_CONTAINER
QOS_LABEL = "koordinator.sh/qosClass"


class RecordingFS(CgroupFS):
    """A CgroupFS that records every file it writes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes: list[str] = []

    def write(
        self, controller: str, file: str, value: str | int | bytes, parent: str, container_id: str | None = None
    ) -> None:
        self.writes.append(file)
        super().write(controller, file, value, parent, container_id)


assert cpu.plugin.settings_spec is not None
DEFAULTS = DEFAULT_POLICY.section(cpu.plugin.settings_spec)  # the cpu plugin's own defaults
SECTION: cpu.CPUSection = DEFAULTS.common


@pytest.fixture(params=TREES, ids=tree_id)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    return fake_tree(request.param, tmp_path / "cgroup", anolis=True)


@pytest.fixture
def fs(tree: FakeCgroup) -> RecordingFS:
    return RecordingFS(tree.root, tree.driver)


@pytest.fixture
def make_runner(runners: list[PluginRunner], request: pytest.FixtureRequest) -> Any:
    """make(policy_yaml="", cgroups=None): a runner of the cpu plugin (cgroups: the ``fs`` fixture)."""

    def make(policy: str = "", cgroups: CgroupFS | None = None) -> PluginRunner:
        current: Policy = policy_from(policy) if policy else DEFAULT_POLICY
        fs = cgroups if cgroups is not None else request.getfixturevalue("fs")
        context = ServerContext(cgroups=fs, policy=lambda: current)
        runner = PluginRunner([cpu.plugin], context=context, registry=CollectorRegistry())
        runners.append(runner)
        return runner

    return make


def batch_spec(**containers: dict[str, Any] | None) -> str:
    return json.dumps({"containers": containers})


def make_pod(
    parent: str,
    *,
    qos: str | None = None,
    uid: str = "u1",
    annotations: dict[str, str] | None = None,
    resources: Resources | None = None,
) -> PodInfo:
    return PodInfo(
        name=f"pod-{uid}",
        namespace="default",
        uid=uid,
        labels=MappingProxyType({QOS_LABEL: qos} if qos else {}),
        annotations=MappingProxyType(annotations or {}),
        cgroup_parent=parent,
        resources=resources,
    )


def settle_tiers(fs: CgroupFS) -> None:
    """Give kubelet's QoS-tier cgroups the default policy's group identity, as the first
    reconcile round does (tests/hooks/plugins/test_plugin_cpu_qos.py tests that), so a test
    sees only what its pods change."""
    reconcile_tiers(fs, DEFAULTS.for_class, _NullLog())
    if isinstance(fs, RecordingFS):
        fs.writes.clear()


def burst_file(tree: FakeCgroup) -> str:
    return "cpu.cfs_burst_us" if tree.version is CgroupVersion.V1 else "cpu.max.burst"


def shares_file(tree: FakeCgroup) -> str:
    return "cpu.shares" if tree.version is CgroupVersion.V1 else "cpu.weight"


def remove(tree: FakeCgroup, parent: str, file: str, container_id: str | None = None) -> None:
    (tree.dir(parent, container_id) / file).unlink()


#: Koordinator's cpuBurstPercent for LS (its "cpuBurstOnly" policy); the default is 0 (policy "none").
BURSTY = "cpu: {LS: {cfs_burst_percent: 1000}}"

# --- pod level ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("percent", "burst"), [(None, 0), (1000, 200000), (50, 100000), (0, 0)])
async def test_ls_pod_gets_a_burst_and_keeps_kubelets_quota_and_shares(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any, percent: int | None, burst: int
) -> None:
    parent = tree.add_pod("1234-5678", "burstable")
    fs.set_cpu_quota(parent, 200000)  # what kubelet wrote
    fs.set_cpu_shares(parent, 512)
    shares_before = tree.read(parent, shares_file(tree))
    fs.writes.clear()
    pod = make_pod(parent, uid="1234-5678", resources=Resources(cpu_quota=200000, cpu_period=100000, cpu_shares=512))
    runner = make_runner(f"cpu: {{LS: {{cfs_burst_percent: {percent}}}}}" if percent is not None else "")

    result = await runner.run(RUN, pod=pod)

    assert result.failures == [] and result.applied == ["cpu"]
    assert result.response.is_empty()  # pod level goes to the cgroup, not the sandbox request
    # Default 0: Koordinator's default burst policy is "none". Its 1000 % is capped at the quota:
    # the kernel refuses a burst above it.
    assert int(tree.read(parent, burst_file(tree))) == burst
    assert fs.cpu_quota(parent) == (200000, 100000)
    assert tree.read(parent, shares_file(tree)) == shares_before
    assert tree.read(parent, "cpu.bvt_warp_ns") == "2"  # LS group identity
    assert tree.read(parent, "cpu.idle") == "0"
    assert not {"cpu.shares", "cpu.weight", "cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us"} & set(fs.writes)


async def test_files_the_kernel_lacks_are_skipped(tmp_path: Path, make_runner: Any) -> None:
    for version, make in ((1, make_fake_cgroup_v1), (2, make_fake_cgroup_v2)):
        tree = make(tmp_path / f"v{version}", anolis=False)  # no cpu.bvt_warp_ns
        parent = tree.add_pod("u1", "burstable")
        fs = tree.fs()
        fs.set_cpu_quota(parent, 100000)
        for file in ("cpu.cfs_burst_us" if version == 1 else "cpu.max.burst", "cpu.idle"):
            remove(tree, parent, file)
        runner = make_runner("cpu: {LS: {cpu_idle: true}}", cgroups=fs)
        result = await runner.run(RUN, pod=make_pod(parent, resources=Resources(cpu_quota=100000)))
        assert result.failures == []
        assert fs.cpu_quota(parent) == (100000, 100000)
        assert not (tree.dir(parent) / "cpu.bvt_warp_ns").exists()


async def test_be_pod_quota_comes_from_its_batch_cpu_limits(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any
) -> None:
    parent = tree.add_pod("be-1", "besteffort")
    fs.set_cpu_shares(parent, 2)  # kubelet's BestEffort shares
    shares_before = tree.read(parent, shares_file(tree))
    spec = batch_spec(
        main={"requests": {BATCH_CPU: "1k"}, "limits": {BATCH_CPU: "2k"}},
        side={"requests": {BATCH_CPU: "250"}, "limits": {BATCH_CPU: 500}},
    )
    pod = make_pod(parent, qos="BE", uid="be-1", annotations={SPEC_KEY: spec})

    result = await make_runner().run(RUN, pod=pod)

    assert result.failures == []
    assert fs.cpu_quota(parent) == (2500 * 100, 100000)  # 2.5 cores
    # Koordinator's SetPodCPUShares: the summed batch-cpu requests (1.25 cores), not kubelet's 2.
    assert tree.read(parent, shares_file(tree)) != shares_before
    shares = 1280 if tree.version is CgroupVersion.V1 else shares_to_weight(1280)
    assert int(tree.read(parent, shares_file(tree))) == shares
    assert tree.read(parent, "cpu.idle") == "0"  # off by default
    assert tree.read(parent, "cpu.bvt_warp_ns") == "-1"
    assert int(tree.read(parent, burst_file(tree))) == 0  # BE: burst off


async def test_be_pod_shares_are_kept_by_the_reconciler(tree: FakeCgroup, fs: RecordingFS, make_runner: Any) -> None:
    parent = tree.add_pod("be-s", "besteffort")
    spec = batch_spec(a={"requests": {BATCH_CPU: "500"}}, b={"requests": {BATCH_CPU: "-3"}}, c=None)
    pod = make_pod(parent, qos="BE", uid="be-s", annotations={SPEC_KEY: spec})
    runner = make_runner()
    settle_tiers(fs)
    await runner.run(RUN, pod=pod)
    expected = "512" if tree.version is CgroupVersion.V1 else str(shares_to_weight(512))
    assert tree.read(parent, shares_file(tree)) == expected  # 0.5 core; a non-positive request counts as none
    fs.writes.clear()
    assert await runner.reconcile(pods=[pod]) == []
    assert fs.writes == []  # in sync (v2: the weight is compared, not the shares it maps back to)
    fs.set_cpu_shares(parent, 2)  # kubelet's reset
    assert await runner.reconcile(pods=[pod]) == []
    assert tree.read(parent, shares_file(tree)) == expected


@pytest.mark.parametrize("annotation", [None, "{}", '{"containers": {}}'])
async def test_be_pod_shares_left_to_kubelet_without_batch_containers(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any, annotation: str | None
) -> None:
    parent = tree.add_pod("be-n", "besteffort")
    fs.set_cpu_shares(parent, 2)
    pod = make_pod(parent, qos="BE", uid="be-n", annotations={SPEC_KEY: annotation} if annotation else {})
    await make_runner().run(RUN, pod=pod)
    assert fs.cpu_shares(parent) == 2


async def test_be_cpu_idle_only_when_the_policy_enables_it(tree: FakeCgroup, fs: RecordingFS, make_runner: Any) -> None:
    parent = tree.add_pod("be-2", "besteffort")
    pod = make_pod(parent, qos="BE", uid="be-2")
    await make_runner().run(RUN, pod=pod)
    assert tree.read(parent, "cpu.idle") == "0"
    result = await make_runner("cpu: {BE: {cpu_idle: true}}").run(RUN, pod=pod)
    assert result.failures == []
    assert tree.read(parent, "cpu.idle") == "1"
    assert fs.cpu_quota(parent)[0] == -1  # no batch annotation: quota left alone


async def test_a_be_pod_with_a_container_without_batch_limit_is_unlimited(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any
) -> None:
    parent = tree.add_pod("be-3", "besteffort")
    fs.set_cpu_quota(parent, 300000)
    spec = batch_spec(a={"limits": {BATCH_CPU: "1000"}}, b={"requests": {BATCH_CPU: "1000"}})
    pod = make_pod(parent, qos="BE", uid="be-3", annotations={SPEC_KEY: spec})
    await make_runner().run(RUN, pod=pod)
    assert fs.cpu_quota(parent)[0] == -1


@pytest.mark.parametrize(
    "annotation",
    ["{not json", "[]", '{"containers": []}', json.dumps({"containers": {"a": {"limits": {BATCH_CPU: "lots"}}}})],
)
async def test_a_malformed_batch_annotation_leaves_the_quota_alone(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any, annotation: str
) -> None:
    parent = tree.add_pod("be-4", "besteffort")
    fs.set_cpu_quota(parent, 300000)
    pod = make_pod(parent, qos="BE", uid="be-4", annotations={SPEC_KEY: annotation})
    result = await make_runner().run(RUN, pod=pod)
    assert result.failures == []
    assert fs.cpu_quota(parent) == (300000, 100000)


async def test_be_quota_source_kubelet_keeps_kubelets_pod_quota(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any
) -> None:
    parent = tree.add_pod("be-5", "besteffort")
    spec = batch_spec(a={"limits": {BATCH_CPU: "1000"}})
    pod = make_pod(parent, qos="BE", uid="be-5", annotations={SPEC_KEY: spec})
    await make_runner("cpu: {be_quota_source: kubelet}").run(RUN, pod=pod)
    assert fs.cpu_quota(parent)[0] == -1


PINNED = {"scheduling.koordinator.sh/resource-status": '{"cpuset": "0-1"}'}


async def test_pinned_lsr_pod_runs_without_a_cfs_quota(tree: FakeCgroup, fs: RecordingFS, make_runner: Any) -> None:
    parent = tree.add_pod("lsr-1", "guaranteed")
    fs.set_cpu_quota(parent, 400000)  # kubelet's Guaranteed pod quota
    pod = make_pod(
        parent, qos="LSR", uid="lsr-1", annotations=PINNED, resources=Resources(cpu_quota=400000, cpu_period=100000)
    )
    result = await make_runner().run(RUN, pod=pod)
    assert result.failures == []
    assert fs.cpu_quota(parent)[0] == -1
    assert int(tree.read(parent, burst_file(tree))) == 0
    assert tree.read(parent, "cpu.bvt_warp_ns") == "2"


async def test_unpinned_lsr_pod_keeps_kubelets_quota(tree: FakeCgroup, fs: RecordingFS, make_runner: Any) -> None:
    # Without CPUs of its own, lifting the quota would let it run unbounded on the shared pool.
    parent = tree.add_pod("lsr-3", "guaranteed")
    fs.set_cpu_quota(parent, 400000)
    pod = make_pod(parent, qos="LSR", uid="lsr-3", resources=Resources(cpu_quota=400000, cpu_period=100000))
    result = await make_runner().run(RUN, pod=pod)
    assert result.failures == []
    assert fs.cpu_quota(parent)[0] == 400000


async def test_a_missing_pod_cgroup_is_created_like_kubelet_would(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any
) -> None:
    parent = tree.pod_parent("new-1", "burstable")
    assert not tree.dir(parent).exists()
    result = await make_runner().run(RUN, pod=make_pod(parent, uid="new-1"))
    assert result.failures == []
    directory = tree.dir(parent)
    if tree.driver == "systemd":  # kubelet makes pod slices through systemd: never made here
        assert not directory.exists()
        return
    assert directory.is_dir()
    assert directory.resolve().is_relative_to(tree.root.resolve())
    # Only the hierarchy this plugin writes to (v1: cpu,cpuacct through the cpu link).
    if tree.version is CgroupVersion.V1:
        assert not (tree.root / "memory").joinpath(*directory.relative_to(tree.root / "cpu").parts).exists()


async def test_a_pod_cgroup_outside_the_root_is_never_created(
    tree: FakeCgroup, tmp_path: Path, make_runner: Any
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    base = tree.dir(tree.pod_parent("x", "burstable")).parent  # kubepods/burstable
    (base / "escape").symlink_to(outside)
    # Not a pod cgroup under the roots: withheld from the plugins, which then write nothing.
    result = await make_runner().run(RUN, pod=make_pod("/kubepods/../../etc", uid="z"))
    assert result.failures == [] and result.applied == ["cpu"]
    # Under the roots by name, but through a symlink: refused where the plugin creates it.
    parent = f"/{base.relative_to(tree.dir('')).as_posix()}/escape/podz"
    result = await make_runner().run(RUN, pod=make_pod(parent, uid="z"))
    assert [f.outcome for f in result.failures] == ["error"]
    assert "CgroupPathError" in result.failures[0].reason and "outside the cgroup root" in result.failures[0].reason
    assert list(outside.iterdir()) == []


def _snapshot(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` (links not followed) and its content: what a write would change."""
    found = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(directory))] = path.read_text()
    return found


@pytest.mark.parametrize("parent", ["/", "/system.slice", "/system.slice/podx", "system.slice", "/kubepods/burstable"])
async def test_a_pod_whose_cgroup_is_no_pods_gets_nothing_written(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any, parent: str
) -> None:
    """The root cgroup, systemd's slices, a QoS-class cgroup: never written, never created."""
    tree.mkdir("system.slice")
    spec = batch_spec(main={"limits": {BATCH_CPU: "1500"}})
    pod = make_pod(parent, qos="BE", uid="x", annotations={SPEC_KEY: spec})
    settle_tiers(fs)
    before = _snapshot(tree.root)
    runner = make_runner()
    with capture_logs() as logs:
        result = await runner.run(RUN, pod=pod)
        assert await runner.reconcile(pods=[pod]) == []
    assert result.failures == [] and result.applied == ["cpu"]
    assert fs.writes == [] and _snapshot(tree.root) == before  # no file written, no directory made
    # Said at info for the hook call (and at debug, if shown, each reconcile round).
    withheld = [entry for entry in logs if entry["event"] == "withheld from the plugins"]
    assert (withheld[0]["log_level"], withheld[0]["hook"]) == ("info", "PreRunPodSandbox")
    assert all(repr(parent) in entry["reason"] and "no cgroup of this pod" in entry["reason"] for entry in withheld)


async def test_the_trust_switch_keeps_a_pinned_pods_quota_in_reconcile(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any
) -> None:
    parent = tree.add_pod("lsr-1", "guaranteed")
    fs.set_cpu_quota(parent, 200000)
    status = {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "0-1"})}
    pod = make_pod(parent, qos="LSR", uid="lsr-1", annotations=status)
    await make_runner("trust: {pod_cpuset: false}").reconcile(pods=[pod])
    assert fs.cpu_quota(parent)[0] == 200000
    await make_runner().reconcile(pods=[pod])
    assert fs.cpu_quota(parent)[0] == -1  # trusted (the default): lifted for the pinned pod


class KernelLikeFS(RecordingFS):
    """Refuses, as tg_set_cfs_bandwidth does, any write that leaves the burst above a set quota."""

    def write(
        self, controller: str, file: str, value: str | int | bytes, parent: str, container_id: str | None = None
    ) -> None:
        burst_name, quota_name = self.file_name("cpu.burst"), self.file_name("cpu.quota")
        if file in (burst_name, quota_name):
            quota = self.cpu_quota(parent, container_id)[0]
            burst = int(self.read("cpu", burst_name, parent, container_id))
            if file == burst_name:
                burst = int(value)
            elif self.version is CgroupVersion.V2:
                text = str(value).split()[0]
                quota = -1 if text == "max" else int(text)
            else:
                quota = int(value)
            if quota > 0 and burst > quota:
                raise OSError(22, f"burst {burst} above quota {quota}")
        super().write(controller, file, value, parent, container_id)


@pytest.mark.parametrize(("quota_before", "burst_before"), [(400000, 400000), (100000, 0)])
async def test_burst_and_quota_are_written_in_an_order_the_kernel_accepts(
    tree: FakeCgroup, make_runner: Any, quota_before: int, burst_before: int
) -> None:
    fs = KernelLikeFS(tree.root, tree.driver)
    parent = tree.add_pod("be-10", "besteffort")
    fs.set_cpu_quota(parent, quota_before)
    fs.set_cpu_burst(parent, burst_before)
    spec = batch_spec(main={"limits": {BATCH_CPU: "3000" if burst_before == 0 else "1500"}})
    pod = make_pod(parent, qos="BE", uid="be-10", annotations={SPEC_KEY: spec})
    quota = 300000 if burst_before == 0 else 150000
    result = await make_runner("cpu: {BE: {cfs_burst_percent: 100}}", cgroups=fs).run(RUN, pod=pod)
    assert result.failures == []
    assert fs.cpu_quota(parent)[0] == quota  # raised (burst after) or lowered (burst first)
    assert int(tree.read(parent, burst_file(tree))) == quota


# --- container level ------------------------------------------------------------------------------


async def test_be_container_gets_quota_and_shares_from_batch_cpu(tree: FakeCgroup, make_runner: Any) -> None:
    parent = tree.add_pod("be-6", "besteffort")
    spec = batch_spec(main={"requests": {BATCH_CPU: "1500"}, "limits": {BATCH_CPU: "2k"}})
    pod = make_pod(parent, qos="BE", uid="be-6", annotations={SPEC_KEY: spec})
    runner = make_runner()
    for point in (CREATE, UPDATE):
        result = await runner.run(point, pod=pod, container=ContainerInfo(name="main", resources=Resources()))
        resources = result.response.resources
        assert (resources.cpu_quota, resources.cpu_period, resources.cpu_shares) == (200000, 100000, 1536)
    other = await runner.run(CREATE, pod=pod, container=ContainerInfo(name="other"))
    assert other.response.is_empty()  # not in the annotation: kubelet's values stay
    only_shares = await make_runner("cpu: {be_quota_source: kubelet}").run(
        CREATE, pod=pod, container=ContainerInfo(name="main")
    )
    assert (only_shares.response.resources.cpu_quota, only_shares.response.resources.cpu_shares) == (0, 1536)


async def test_be_container_without_batch_limit_or_request(tree: FakeCgroup, make_runner: Any) -> None:
    parent = tree.add_pod("be-7", "besteffort")
    spec = batch_spec(main={})
    pod = make_pod(parent, qos="BE", uid="be-7", annotations={SPEC_KEY: spec})
    result = await make_runner().run(CREATE, pod=pod, container=ContainerInfo(name="main"))
    resources = result.response.resources
    assert (resources.cpu_quota, resources.cpu_period, resources.cpu_shares) == (-1, 0, MIN_SHARES)


@pytest.mark.parametrize("qos", ["LSE", "LSR"])
async def test_pinned_class_containers_get_no_quota(tree: FakeCgroup, make_runner: Any, qos: str) -> None:
    parent = tree.add_pod("lsr-2", "guaranteed")
    pod = make_pod(parent, qos=qos, uid="lsr-2", annotations=PINNED)
    container = ContainerInfo(name="app", resources=Resources(cpu_quota=200000, cpu_period=100000, cpu_shares=2048))
    for point in (CREATE, UPDATE):
        result = await make_runner().run(point, pod=pod, container=container)
        assert result.response.resources.cpu_quota == -1
        assert result.response.resources.cpu_shares == 0  # kubelet's shares stay


async def test_ls_container_gets_no_resource_changes(tree: FakeCgroup, make_runner: Any) -> None:
    parent = tree.add_pod("ls-1", "burstable")
    container = ContainerInfo(name="app", resources=Resources(cpu_quota=50000, cpu_period=100000))
    result = await make_runner().run(CREATE, pod=make_pod(parent, uid="ls-1"), container=container)
    assert result.response.is_empty()


@pytest.mark.parametrize(("percent", "burst"), [(None, 0), (1000, 50000), (40, 20000)])
async def test_ls_container_burst_is_written_after_start(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any, percent: int | None, burst: int
) -> None:
    parent = tree.add_pod("ls-2", "burstable")
    tree.add_container(parent, "c1")
    fs.set_cpu_quota(parent, 50000, container_id="c1")  # what the runtime wrote
    runner = make_runner(f"cpu: {{LS: {{cfs_burst_percent: {percent}}}}}" if percent is not None else "")
    result = await runner.run(STARTED, pod=make_pod(parent, uid="ls-2"), container=ContainerInfo(name="app", id="c1"))
    assert result.failures == []
    assert int(tree.read(parent, burst_file(tree), container_id="c1")) == burst
    fs.writes.clear()
    await runner.run(STARTED, pod=make_pod(parent, uid="ls-2"), container=ContainerInfo(name="app", id="c1"))
    assert fs.writes == []  # already right: nothing written


async def test_container_burst_is_skipped_where_the_file_is_missing(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any
) -> None:
    parent = tree.add_pod("ls-3", "burstable")
    tree.add_container(parent, "c1")
    fs.set_cpu_quota(parent, 50000, container_id="c1")
    remove(tree, parent, burst_file(tree), container_id="c1")
    fs.writes.clear()
    result = await make_runner(BURSTY).run(
        STARTED, pod=make_pod(parent, uid="ls-3"), container=ContainerInfo(name="app", id="c1")
    )
    assert result.failures == [] and fs.writes == []


async def test_an_update_lowers_the_burst_before_the_quota_shrinks(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any
) -> None:
    parent = tree.add_pod("ls-4", "burstable")
    tree.add_container(parent, "c1")
    fs.set_cpu_quota(parent, 100000, container_id="c1")
    fs.set_cpu_burst(parent, 100000, container_id="c1")
    pod = make_pod(parent, uid="ls-4")
    smaller = ContainerInfo(name="app", id="c1", resources=Resources(cpu_quota=30000, cpu_period=100000))
    await make_runner(BURSTY).run(UPDATE, pod=pod, container=smaller)
    assert int(tree.read(parent, burst_file(tree), container_id="c1")) == 30000
    larger = ContainerInfo(name="app", id="c1", resources=Resources(cpu_quota=300000, cpu_period=100000))
    await make_runner(BURSTY).run(UPDATE, pod=pod, container=larger)  # raising waits for the Post hook
    assert int(tree.read(parent, burst_file(tree), container_id="c1")) == 30000


# --- reconcile ------------------------------------------------------------------------------------


async def test_reconcile_repairs_drift_counts_it_and_leaves_settled_pods_alone(
    tree: FakeCgroup, fs: RecordingFS, make_runner: Any
) -> None:
    be_parent = tree.add_pod("be-8", "besteffort")
    spec = batch_spec(main={"limits": {BATCH_CPU: "1500"}})
    be = make_pod(be_parent, qos="BE", uid="be-8", annotations={SPEC_KEY: spec})
    ls_parent = tree.add_pod("ls-5", "burstable")
    fs.set_cpu_quota(ls_parent, 100000)
    ls = make_pod(ls_parent, uid="ls-5", resources=Resources(cpu_quota=100000, cpu_period=100000))
    gone = make_pod(tree.pod_parent("gone", "burstable"), uid="gone")
    runner = make_runner(BURSTY)
    settle_tiers(fs)
    await runner.run(RUN, pod=be)
    await runner.run(RUN, pod=ls)
    assert fs.cpu_quota(be_parent) == (150000, 100000)

    fs.writes.clear()
    state = runner.state_of("cpu")
    assert isinstance(state, cpu.CpuState)  # made by the plugin's factory, once for this runner
    before = state.drift_repaired_total
    assert await runner.reconcile(pods=[be, ls, gone]) == []
    assert fs.writes == [] and state.drift_repaired_total == before  # in sync: reads only

    fs.set_cpu_quota(be_parent, 400000)  # someone overwrote the BE quota
    fs.set_group_identity(ls_parent, 0)  # and the LS group identity
    fs.set_cpu_burst(ls_parent, 0)
    fs.writes.clear()
    assert await runner.reconcile(pods=[be, ls, gone]) == []
    assert fs.cpu_quota(be_parent) == (150000, 100000)
    assert tree.read(ls_parent, "cpu.bvt_warp_ns") == "2"
    assert int(tree.read(ls_parent, burst_file(tree))) == 100000
    assert state.drift_repaired_total == before + 3
    assert not tree.dir(gone.cgroup_parent).exists()  # reconcile never creates cgroups

    fs.writes.clear()
    log = _NullLog()
    assert cpu.plugin.settings_spec is not None
    bursty = policy_from(BURSTY).section(cpu.plugin.settings_spec)  # the policy the runner ran with
    assert cpu.reconcile_pods(fs, [be, ls, gone], bursty.for_class, SECTION, log) == 0
    assert fs.writes == []


class _NullLog:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _policy_for(qos: QoSClass) -> Any:
    return DEFAULTS.for_class(qos)


async def test_reconcile_follows_a_policy_change(tree: FakeCgroup, fs: RecordingFS, make_runner: Any) -> None:
    parent = tree.add_pod("be-9", "besteffort")
    pod = make_pod(parent, qos="BE", uid="be-9")
    await make_runner().run(RUN, pod=pod)
    assert tree.read(parent, "cpu.idle") == "0"
    await make_runner("cpu: {BE: {cpu_idle: true}}").reconcile(pods=[pod])
    assert tree.read(parent, "cpu.idle") == "1"


# --- plans: pure, for explain -----------------------------------------------------------------------


def test_plans_compute_without_touching_the_node() -> None:
    spec = batch_spec(main={"requests": {BATCH_CPU: "500"}, "limits": {BATCH_CPU: "1"}})
    pod = make_pod("/kubepods/besteffort/podq", qos="BE", annotations={SPEC_KEY: spec})
    plan = cpu.plan_pod(pod, QoSClass.BE, DEFAULTS.for_class("BE"), SECTION)
    assert (plan.cfs_quota, plan.cfs_period, plan.cfs_burst, plan.cpu_idle, plan.group_identity) == (
        1000,  # 1 milli-core is 100 µs: raised to the kernel's minimum
        100000,
        0,
        False,
        -1,
    )
    assert plan.files(CgroupVersion.V1) == {
        "cpu.cfs_period_us": "100000",
        "cpu.cfs_quota_us": "1000",
        "cpu.cfs_burst_us": "0",
        "cpu.shares": "512",  # the summed batch-cpu requests
        "cpu.idle": "0",
        "cpu.bvt_warp_ns": "-1",
    }
    assert plan.files(CgroupVersion.V2)["cpu.max"] == "1000 100000"
    assert plan.files(CgroupVersion.V2)["cpu.weight"] == str(shares_to_weight(512))
    assert plan.describe()["notes"]
    container = cpu.plan_container(pod, ContainerInfo(name="main"), QoSClass.BE, DEFAULTS.for_class("BE"), SECTION)
    assert (container.cpu_quota, container.cpu_period, container.cpu_shares) == (1000, 100000, 512)

    ls = make_pod("/kubepods/burstable/podl")
    unknown = cpu.plan_pod(ls, QoSClass.LS, DEFAULTS.for_class("LS"), SECTION)
    assert unknown.cfs_quota is None and unknown.cfs_burst is None  # nothing says the quota
    assert "cpu.max" not in unknown.files(CgroupVersion.V2)
    pinned = make_pod("/kubepods/podp", annotations=PINNED)
    lsr = cpu.plan_pod(pinned, QoSClass.LSR, DEFAULTS.for_class("LSR"), SECTION)
    assert lsr.files(CgroupVersion.V2)["cpu.max"] == "max 100000"


def test_the_batch_annotation_is_read_by_koordinators_rules() -> None:
    """One parser (hooks/extended_resources.py): a bad quantity of any resource drops the whole
    annotation, as Go's decoder does; a null entry is a listed container with nothing."""
    pod = make_pod("/kubepods/besteffort/podq", qos="BE", annotations={SPEC_KEY: batch_spec(a=None)})
    plan = cpu.plan_pod(pod, QoSClass.BE, _policy_for(QoSClass.BE), SECTION)
    assert (plan.cfs_quota, plan.cpu_shares) == (-1, MIN_SHARES)  # listed without a limit: unlimited
    bad_other = batch_spec(a={"limits": {BATCH_CPU: "1k", "memory": "lots"}})
    pod = make_pod("/kubepods/besteffort/podq", qos="BE", annotations={SPEC_KEY: bad_other})
    plan = cpu.plan_pod(pod, QoSClass.BE, _policy_for(QoSClass.BE), SECTION)
    assert (plan.cfs_quota, plan.cpu_shares) == (None, None)
    assert any("ignored" in note and "memory" in note for note in plan.notes)


# --- properties of the arithmetic ---------------------------------------------------------------------


@given(st.integers(min_value=-(10**6), max_value=10**15), st.integers(min_value=1000, max_value=1_000_000))
def test_quota_is_unlimited_or_at_least_the_kernel_minimum(milli: int, period: int) -> None:
    quota = cpu.milli_cpu_to_quota(milli, period)
    assert quota == -1 or cpu.MIN_CFS_QUOTA_US <= quota <= cpu.MAX_CFS_QUOTA_US
    assert (quota == -1) == (milli <= 0)


@given(st.integers(min_value=-(10**6), max_value=10**15))
def test_shares_stay_in_the_kernel_range(milli: int) -> None:
    assert MIN_SHARES <= cpu.milli_cpu_to_shares(milli) <= MAX_SHARES


def koordlet_shares(milli: int) -> int:
    """koordlet's batch-cpu request -> cpu.shares: 2 for none, else milli * 1024 / 1000 (truncated) within 2..262144."""
    return 2 if milli <= 0 else min(max(milli * 1024 // 1000, 2), 262144)


def koordlet_quota(milli: int) -> int:
    """koordlet's batch-cpu limit -> CFS quota on its 100 ms period: -1 when not positive, at least 1000 µs."""
    quota = milli * 100_000 // 1000
    return -1 if quota <= 0 else max(quota, 1000)


# Up to 10^8 milli-cores (10^5 CPUs): koordlet's quota stays far below the kernel's 2^44 µs cap.
@given(st.integers(min_value=-(10**6), max_value=10**8))
def test_batch_shares_and_quota_are_koordlets_for_the_same_quantities(milli: int) -> None:
    assert cpu.milli_cpu_to_shares(milli) == koordlet_shares(milli)
    assert cpu.milli_cpu_to_quota(milli) == koordlet_quota(milli)


@given(st.integers(min_value=-1, max_value=cpu.MAX_CFS_QUOTA_US), st.integers(min_value=0, max_value=10000))
def test_burst_is_never_negative_nor_above_the_quota(quota: int, percent: int) -> None:
    burst = cpu.cfs_burst_us(quota, percent)
    assert 0 <= burst <= max(quota, 0)


@given(
    limit=st.one_of(st.none(), st.integers(min_value=-5, max_value=10**9)),
    request=st.one_of(st.none(), st.integers(min_value=-5, max_value=10**9)),
)
def test_container_plans_always_pass_the_proxys_checks(limit: int | None, request: int | None) -> None:
    entry: dict[str, Any] = {}
    if limit is not None:
        entry["limits"] = {BATCH_CPU: str(limit)}
    if request is not None:
        entry["requests"] = {BATCH_CPU: str(request)}
    pod = make_pod(
        "/kubepods/besteffort/podh",
        qos="BE",
        annotations={SPEC_KEY: batch_spec(main=entry)},
    )
    plan = cpu.plan_container(pod, ContainerInfo(name="main"), QoSClass.BE, DEFAULTS.for_class("BE"), SECTION)
    changes = ResourceChanges()
    plan.apply_to(changes)
    assert changes.problems() == []
    assert changes.cpu_quota == -1 or changes.cpu_quota >= cpu.MIN_CFS_QUOTA_US
    assert MIN_SHARES <= changes.cpu_shares <= MAX_SHARES


def test_a_bad_parent_is_refused_before_any_directory_is_made(tree: FakeCgroup) -> None:
    with pytest.raises(CgroupPathError):
        cpu.ensure_pod_cgroup(tree.fs(), "/kubepods/../x", _NullLog())


def test_a_dry_run_never_creates_the_pod_cgroup(tree: FakeCgroup) -> None:
    parent = tree.pod_parent("dry", "burstable")
    assert cpu.ensure_pod_cgroup(tree.fs(), parent, _NullLog(), dry_run=True) is False
    assert not tree.dir(parent).exists()
    assert cpu.ensure_pod_cgroup(tree.fs(), parent, _NullLog()) is (tree.driver == "cgroupfs")
    assert tree.dir(parent).is_dir() is (tree.driver == "cgroupfs")  # systemd: kubelet's slices only
