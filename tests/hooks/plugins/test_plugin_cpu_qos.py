"""Group identity per pod (hooks/plugins/cpu_qos.py) pinned to the values koordlet's groupidentity
hook gives the same pods under the same NodeSLO settings, and the pod's own override from the
koordinator.sh/cpuQOS annotation; through the cpu plugin on fake cgroup trees that have
cpu.bvt_warp_ns (no kernel here has it)."""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.cgroups import parent_path
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.plugins import cpu
from runtimeproxy.hooks.plugins.cpu_qos import CpuQoSOverride, pod_group_identity, read_cpu_qos
from runtimeproxy.hooks.podview import CPU_QOS_ANNOTATION, plugin_view
from runtimeproxy.hooks.policy import DEFAULT_POLICY, Policy
from runtimeproxy.hooks.qos import resolve_qos
from runtimeproxy.hooks.sdk import ContainerInfo, HookPoint, PodInfo, ServerContext
from runtimeproxy.hooks.testkit import policy_from
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1, make_fake_cgroup_v2
from structlog.testing import capture_logs

QOS_LABEL = "koordinator.sh/qosClass"
RUN = HookPoint.PRE_RUN_POD_SANDBOX
# Distinct values per class, so that every case shows whose value a pod got.
VALUES = (
    "  LSE: {group_identity: 2}\n  LSR: {group_identity: 2}\n  LS: {group_identity: 1}\n  BE: {group_identity: -1}\n"
)


def nodeslo(lsr: bool = True, ls: bool = True, be: bool = True) -> Policy:
    """The cpu section for a NodeSLO whose LSR / LS / BE CPU QoS is enabled or not (LSE follows LSR)."""
    switches = {"LSE": lsr, "LSR": lsr, "LS": ls, "BE": be}
    lines = "".join(
        f"  {cls}: {{group_identity: {value}, group_identity_enabled: {str(switches[cls]).lower()}}}\n"
        for cls, value in (("LSE", 2), ("LSR", 2), ("LS", 1), ("BE", -1))
    )
    return policy_from("cpu:\n" + lines)


def settings_for(policy: Policy) -> Any:
    assert cpu.plugin.settings_spec is not None
    return policy.section(cpu.plugin.settings_spec).for_class


def pod(label: str | None, kube_qos: str, annotations: dict[str, str] | None = None) -> PodInfo:
    middle = {"guaranteed": "", "burstable": "/burstable", "besteffort": "/besteffort"}[kube_qos]
    return PodInfo(
        name="p",
        namespace="default",
        uid="u1",
        labels=MappingProxyType({QOS_LABEL: label} if label else {}),
        annotations=MappingProxyType(annotations or {}),
        cgroup_parent=f"/kubepods{middle}/podu1",
    )


def chosen(info: PodInfo, policy: Policy) -> int:
    resolution = resolve_qos(info.labels, info.annotations, info.cgroup_parent)
    return pod_group_identity(resolution, info.cgroup_parent, info.annotations, settings_for(policy)).value


# --- koordlet's rule, case by case ---------------------------------------------------------------
# (label, kube QoS, LSR on, LS on, BE on) -> koordlet's cpu.bvt_warp_ns for the pod, with LSR 2, LS 1, BE -1.
KOORDLET_CASES = [
    # a class label decides: the class's value, 0 when the class's CPU QoS is off
    ("LSE", "guaranteed", True, True, True, 2),
    ("LSE", "guaranteed", False, True, True, 0),
    ("LSR", "guaranteed", True, True, True, 2),
    ("LSR", "guaranteed", False, True, True, 0),  # labelled LSR: not LS's value
    ("LS", "burstable", True, True, True, 1),
    ("LS", "guaranteed", True, False, True, 0),
    ("BE", "besteffort", True, True, True, -1),
    ("BE", "besteffort", True, True, False, 0),
    # no class label: by Kubernetes QoS
    (None, "guaranteed", True, True, True, 2),  # LSR's
    (None, "guaranteed", False, True, True, 1),  # LSR off: LS's
    (None, "guaranteed", False, False, True, 0),  # both off
    (None, "guaranteed", True, False, True, 2),
    (None, "burstable", True, True, True, 1),
    (None, "burstable", True, False, True, 0),
    (None, "besteffort", True, True, True, -1),
    (None, "besteffort", True, True, False, 0),
    # a label koordlet does not know counts as none
    ("gold", "guaranteed", False, True, True, 1),
]


@pytest.mark.parametrize(("label", "kube_qos", "lsr", "ls", "be", "expected"), KOORDLET_CASES)
def test_group_identity_is_koordlets_for_the_same_pod_and_nodeslo(
    label: str | None, kube_qos: str, lsr: bool, ls: bool, be: bool, expected: int
) -> None:
    assert chosen(pod(label, kube_qos), nodeslo(lsr, ls, be)) == expected


def test_a_guaranteed_pod_without_a_label_says_whose_value_it_took() -> None:
    info = pod(None, "guaranteed")
    resolution = resolve_qos(info.labels, info.annotations, info.cgroup_parent)
    choice = pod_group_identity(resolution, info.cgroup_parent, info.annotations, settings_for(nodeslo(lsr=False)))
    assert choice.value == 1
    assert choice.notes == ("Guaranteed without a class label: LS's group identity",)


# --- the LS pod's override --------------------------------------------------------------------------
# annotation -> koordlet's value for an LS-labelled pod (LS's own value 1)
OVERRIDE_CASES = [
    ('{"enable": true, "groupIdentity": -1}', -1),
    ('{"enable": true, "groupIdentity": 2}', 2),
    ('{"enable": true}', 1),  # enabled, no value: LS's
    ('{"groupIdentity": -1}', 0),  # not enabled: off
    ('{"enable": false, "groupIdentity": 2}', 0),
    ("{}", 0),
    ("null", 0),  # decodes to an empty config: off
    ('{"Enable": true, "GROUPIDENTITY": 0}', 0),  # field names match whatever their case
    ('{"enable": true, "groupIdentity": 2, "groupIdentity": -1}', -1),  # the last wins
    ('{"enable": true, "groupIdentity": -1, "groupIdentity": null}', 1),  # null unsets it
    ('{"enable": true, "groupIdentity": -1, "other": [1, {"x": 2}]}', -1),  # unknown fields ignored
    ('{"enable": true, "groupIdentity": -1, "schedIdle": 1, "coreExpeller": true}', -1),
]


@pytest.mark.parametrize(("annotation", "expected"), OVERRIDE_CASES)
def test_an_ls_pod_overrides_its_group_identity_as_koordlet_reads_the_annotation(
    annotation: str, expected: int
) -> None:
    assert chosen(pod("LS", "burstable", {CPU_QOS_ANNOTATION: annotation}), nodeslo()) == expected


@pytest.mark.parametrize(
    ("label", "kube_qos"),
    [("LSR", "guaranteed"), ("LSE", "guaranteed"), ("BE", "besteffort"), ("SYSTEM", "burstable"), (None, "burstable")],
)
def test_only_a_pod_labelled_ls_may_override(label: str | None, kube_qos: str) -> None:
    annotations = {CPU_QOS_ANNOTATION: '{"enable": true, "groupIdentity": 0}'}
    assert chosen(pod(label, kube_qos, annotations), nodeslo()) == chosen(pod(label, kube_qos), nodeslo())


REFUSED = [
    ("", "not JSON"),
    ("{", "not JSON"),
    ("[]", "must be a JSON object, got an array"),
    ('"x"', "must be a JSON object, got a string"),
    ('{"enable": true, "groupIdentity": 3}', "out of range [-1, 2]"),
    ('{"enable": true, "groupIdentity": -2}', "out of range [-1, 2]"),
    ('{"enable": true, "groupIdentity": 1.0}', "groupIdentity must be an integer, got 1.0"),
    ('{"enable": true, "groupIdentity": 1e0}', "must be an integer"),
    ('{"enable": true, "groupIdentity": "1"}', "got a string"),
    ('{"enable": true, "groupIdentity": true}', "got a boolean"),
    ('{"enable": true, "groupIdentity": 9223372036854775808}', "int64"),
    ('{"enable": "true"}', "enable must be a boolean, got a string"),
    ('{"enable": 1}', "enable must be a boolean, got a number"),
    ('{"enable": true, "schedIdle": "1"}', "schedIdle must be an integer"),
    ('{"enable": true, "coreExpeller": 0}', "coreExpeller must be a boolean"),
    ('{"enable": true, "groupIdentity": NaN}', "not JSON"),
]


@pytest.mark.parametrize(("annotation", "reason"), REFUSED)
def test_an_annotation_koordlet_cannot_decode_is_ignored_with_the_reason(annotation: str, reason: str) -> None:
    override, problem = read_cpu_qos({CPU_QOS_ANNOTATION: annotation})
    assert override is None
    assert problem.startswith(f"annotation {CPU_QOS_ANNOTATION} ignored: ") and reason in problem
    info = pod("LS", "burstable", {CPU_QOS_ANNOTATION: annotation})
    assert chosen(info, nodeslo()) == 1  # the class's value


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
field_names = st.sampled_from(["enable", "groupIdentity", "schedIdle", "coreExpeller", "ENABLE", "groupidentity", "x"])


@given(st.lists(st.tuples(field_names, json_values), max_size=6), st.booleans())
def test_any_annotation_gives_a_value_in_range_or_a_reason(pairs: list[tuple[str, object]], enabled: bool) -> None:
    text = "{" + ", ".join(f"{json.dumps(key)}: {json.dumps(value)}" for key, value in pairs) + "}"
    override, problem = read_cpu_qos({CPU_QOS_ANNOTATION: text})
    assert (override is None) == bool(problem)
    info = pod("LS", "burstable", {CPU_QOS_ANNOTATION: text})
    assert chosen(info, nodeslo(ls=enabled)) in (-1, 0, 1, 2)
    if override is not None and override.enable is not True:
        assert chosen(info, nodeslo(ls=enabled)) == 0  # not switched on by the pod: off


def test_override_arithmetic() -> None:
    assert CpuQoSOverride(enable=True, group_identity=None).apply(2) == 2
    assert CpuQoSOverride(enable=True, group_identity=-1).apply(2) == -1
    assert CpuQoSOverride(enable=None, group_identity=-1).apply(2) == 0
    assert CpuQoSOverride(enable=False, group_identity=None).apply(2) == 0


def test_the_annotation_is_withheld_when_the_policy_does_not_trust_it() -> None:
    info = pod("LS", "burstable", {CPU_QOS_ANNOTATION: '{"enable": true, "groupIdentity": -1}', "other": "kept"})
    untrusted = policy_from("trust: {pod_cpu_qos: false}")
    view, reasons = plugin_view(info, None, untrusted)
    assert dict(view.annotations) == {"other": "kept"}
    assert reasons == (f"policy trust.pod_cpu_qos is false: {CPU_QOS_ANNOTATION} ignored, the class's group identity",)
    trusted_view, none = plugin_view(info, None, DEFAULT_POLICY)
    assert trusted_view is info and none == ()


# --- through the cpu plugin, on fake trees with cpu.bvt_warp_ns ---------------------------------------


@pytest.fixture(params=["v1", "v2"])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    maker = make_fake_cgroup_v1 if request.param == "v1" else make_fake_cgroup_v2
    return maker(tmp_path / "cgroup", anolis=True)


def runner_for(tree: FakeCgroup, policy: Policy, runners: list[PluginRunner]) -> PluginRunner:
    context = ServerContext(cgroups=tree.fs(), policy=lambda: policy)
    runner = PluginRunner([cpu.plugin], context=context, registry=CollectorRegistry())
    runners.append(runner)
    return runner


def cri_pod(tree: FakeCgroup, uid: str, kube_qos: Any, label: str | None, annotations: dict[str, str]) -> PodInfo:
    return PodInfo(
        name=f"pod-{uid}",
        namespace="default",
        uid=uid,
        labels=MappingProxyType({QOS_LABEL: label} if label else {}),
        annotations=MappingProxyType(annotations),
        cgroup_parent=tree.add_pod(uid, kube_qos),
    )


async def test_pods_get_koordlets_group_identity_at_start_and_keep_it(tree: FakeCgroup, runners: Any) -> None:
    policy = nodeslo(lsr=False)
    runner = runner_for(tree, policy, runners)
    guaranteed = cri_pod(tree, "g1", "guaranteed", None, {})
    override = cri_pod(tree, "ls1", "burstable", "LS", {CPU_QOS_ANNOTATION: '{"enable": true, "groupIdentity": -1}'})
    for info in (guaranteed, override):
        await runner.run(RUN, pod=info)
    assert tree.read(guaranteed.cgroup_parent, "cpu.bvt_warp_ns") == "1"  # LSR off: LS's value
    assert tree.read(override.cgroup_parent, "cpu.bvt_warp_ns") == "-1"

    tree.fs().set_group_identity(guaranteed.cgroup_parent, 2)
    tree.fs().set_group_identity(override.cgroup_parent, 1)
    await runner.reconcile(pods=[guaranteed, override])
    assert tree.read(guaranteed.cgroup_parent, "cpu.bvt_warp_ns") == "1"
    assert tree.read(override.cgroup_parent, "cpu.bvt_warp_ns") == "-1"


async def test_a_refused_annotation_is_logged_and_the_class_value_written(tree: FakeCgroup, runners: Any) -> None:
    runner = runner_for(tree, policy_from("cpu:\n" + VALUES), runners)
    info = cri_pod(tree, "ls2", "burstable", "LS", {CPU_QOS_ANNOTATION: '{"enable": true, "groupIdentity": 7}'})
    with capture_logs() as logs:
        await runner.run(RUN, pod=info)
    assert tree.read(info.cgroup_parent, "cpu.bvt_warp_ns") == "1"
    warned = [entry for entry in logs if entry["event"].startswith("pod CPU QoS annotation refused")]
    assert len(warned) == 1 and "groupIdentity 7 is out of range [-1, 2]" in warned[0]["reason"]


async def test_an_untrusted_annotation_changes_nothing(tree: FakeCgroup, runners: Any) -> None:
    policy = policy_from("cpu:\n" + VALUES + "trust: {pod_cpu_qos: false}\n")
    runner = runner_for(tree, policy, runners)
    info = cri_pod(tree, "ls3", "burstable", "LS", {CPU_QOS_ANNOTATION: '{"enable": true, "groupIdentity": 2}'})
    await runner.run(RUN, pod=info)
    await runner.reconcile(pods=[info])
    assert tree.read(info.cgroup_parent, "cpu.bvt_warp_ns") == "1"


# --- the QoS tiers ---------------------------------------------------------------------------------


@pytest.fixture(params=[("v1", "cgroupfs"), ("v2", "cgroupfs"), ("v1", "systemd"), ("v2", "systemd")], ids="-".join)
def driver_tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    version, driver = request.param
    maker = make_fake_cgroup_v1 if version == "v1" else make_fake_cgroup_v2
    return maker(tmp_path / "cgroup", driver=driver, anolis=True)


def tier_dirs(tree: FakeCgroup) -> dict[str, str]:
    """kubelet's tier cgroups in the tree's driver form, made; by tier."""
    found = {}
    for tier in ("burstable", "besteffort"):
        parent = tree.pod_parent("x", tier).rsplit("/", 1)[0] if tree.driver == "cgroupfs" else f"kubepods-{tier}.slice"
        tree.mkdir(parent.lstrip("/") if tree.driver == "cgroupfs" else f"kubepods.slice/{parent}")
        found[tier] = parent
    return found


@pytest.mark.parametrize(
    ("ls", "be", "burstable", "besteffort"),
    [(True, True, "1", "-1"), (False, True, "0", "-1"), (True, False, "1", "0")],
)
async def test_the_qos_tiers_get_ls_and_bes_group_identity_as_under_koordlet(
    driver_tree: FakeCgroup, runners: Any, ls: bool, be: bool, burstable: str, besteffort: str
) -> None:
    tree = driver_tree
    tiers = tier_dirs(tree)
    root = "/kubepods" if tree.driver == "cgroupfs" else "kubepods.slice"
    tree.fs().set_group_identity(tiers["burstable"], 2)  # something else was there
    runner = runner_for(tree, nodeslo(ls=ls, be=be), runners)
    assert await runner.reconcile(pods=[]) == []
    assert tree.read(tiers["burstable"], "cpu.bvt_warp_ns") == burstable
    assert tree.read(tiers["besteffort"], "cpu.bvt_warp_ns") == besteffort
    assert tree.read(root, "cpu.bvt_warp_ns") == "0"  # the root (Guaranteed) is not written
    report = await runner.reconcile_report(pods=[])
    assert report.repaired == {"cpu": 0}  # in step: nothing written again


async def test_a_tier_without_the_file_or_missing_is_left_alone(tmp_path: Path, runners: Any) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cgroup")  # no cpu.bvt_warp_ns in this kernel, no kubepods.slice
    tree.mkdir("kubepods/burstable")
    before = sorted(str(path) for path in tree.root.rglob("*"))
    with capture_logs() as logs:
        assert await runner_for(tree, DEFAULT_POLICY, runners).reconcile(pods=[]) == []
    assert not [entry for entry in logs if entry["log_level"] == "warning"]
    assert sorted(str(path) for path in tree.root.rglob("*")) == before  # nothing made
    assert not tree.dir("kubepods.slice").exists()


# --- containers and dangling pod cgroups --------------------------------------------------------------


async def test_containers_keep_their_pods_group_identity_when_it_is_switched_off(
    driver_tree: FakeCgroup, runners: Any
) -> None:
    tree = driver_tree
    info = cri_pod(tree, "ls4", "burstable", "LS", {})
    tree.add_container(info.cgroup_parent, "c1")
    fs = tree.fs()
    fs.set_group_identity(info.cgroup_parent, 1)
    fs.set_group_identity(info.cgroup_parent, 1, "c1")
    containers = {"": [ContainerInfo("app", "c1"), ContainerInfo("not-yet")]}
    assert await runner_for(tree, nodeslo(ls=False), runners).reconcile(pods=[info], containers=containers) == []
    assert tree.read(info.cgroup_parent, "cpu.bvt_warp_ns") == "0"
    assert tree.read(info.cgroup_parent, "cpu.bvt_warp_ns", container_id="c1") == "0"


async def test_a_dangling_pod_cgroup_gets_its_tiers_value_from_the_second_round_once_empty(
    driver_tree: FakeCgroup, runners: Any
) -> None:
    tree = driver_tree
    tier_dirs(tree)
    live = cri_pod(tree, "live", "besteffort", "BE", {})
    gone = tree.add_pod("gone", "burstable")
    tree.add_container(gone, "c9")
    gone_guaranteed = tree.add_pod("gone-g", "guaranteed")
    busy = tree.add_pod("busy", "besteffort")
    fs = tree.fs()
    for parent in (gone, gone_guaranteed, busy):
        fs.set_group_identity(parent, 2)
    fs.set_group_identity(gone, 2, "c9")
    fs.write("cpu", "cgroup.procs", "4242", busy)  # the fake keeps what is written: a process runs there
    runner = runner_for(tree, nodeslo(), runners)
    await runner.reconcile(pods=[live])
    assert tree.read(gone, "cpu.bvt_warp_ns") == "2"  # one round unowned: perhaps a pod being started
    with capture_logs() as logs:
        await runner.reconcile(pods=[live])
    assert tree.read(gone, "cpu.bvt_warp_ns") == "1"  # burstable: LS's
    assert tree.read(gone, "cpu.bvt_warp_ns", container_id="c9") == "1"
    assert tree.read(gone_guaranteed, "cpu.bvt_warp_ns") == "0"  # right under the root
    assert tree.read(busy, "cpu.bvt_warp_ns") == "2"  # a process still runs there
    assert tree.read(live.cgroup_parent, "cpu.bvt_warp_ns") == "-1"  # the live pod: its own value
    assert {entry["cgroup"] for entry in logs if entry["event"] == "dangling pod cgroup group identity set"} == {
        "/" + parent_path(gone),
        "/" + parent_path(gone_guaranteed),
    }


async def test_a_pod_cgroup_owned_again_is_not_dangling(tree: FakeCgroup, runners: Any) -> None:
    info = cri_pod(tree, "back", "burstable", "LS", {CPU_QOS_ANNOTATION: '{"enable": true, "groupIdentity": -1}'})
    runner = runner_for(tree, nodeslo(), runners)
    await runner.reconcile(pods=[])  # not listed this round (e.g. its sandbox was being made)
    await runner.reconcile(pods=[info])
    await runner.reconcile(pods=[info])
    assert tree.read(info.cgroup_parent, "cpu.bvt_warp_ns") == "-1"
