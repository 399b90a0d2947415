"""runtime-hooks explain: the example Pods rehearsed through plugins that write cgroups and resctrl;
every value shows up, and nothing under the node's cgroup or resctrl root changes."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from click.testing import CliRunner
from runtimeproxy.hooks import cli as cli_module
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupVersion, WeightConversion, shares_to_weight
from runtimeproxy.hooks.cli import cli
from runtimeproxy.hooks.discovery import DiscoveryResult
from runtimeproxy.hooks.explain import (
    DryRunCgroupFS,
    DryRunResctrlFS,
    Explanation,
    WriteRecorder,
    explain_manifest,
    idle_reasons,
    render_text,
)
from runtimeproxy.hooks.plugins import cpuset as cpuset_plugin
from runtimeproxy.hooks.policy import DEFAULT_POLICY
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.resctrl_fs import ResctrlFS
from runtimeproxy.hooks.sdk import ContainerInfo, HookPoint, HookResponse, Plugin, PodInfo
from runtimeproxy.hooks.testkit import policy_from
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1, make_fake_cgroup_v2
from runtimeproxy.hooks.testkit.fake_resctrl import FakeResctrl, make_fake_resctrl

PODS = Path(__file__).parents[1] / "data" / "pods"
GI = 1 << 30


def snapshot(*roots: Path) -> dict[str, tuple[int, int, str]]:
    """Every file and directory under the roots: mode, mtime and a content hash."""
    found: dict[str, tuple[int, int, str]] = {}
    for root in roots:
        for directory, dirs, files in os.walk(root):
            for name in [*dirs, *files]:
                path = Path(directory, name)
                st = path.lstat()
                digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
                found[str(path)] = (st.st_mode, st.st_mtime_ns, digest)
    return found


# --- plugins that touch the node through the SDK handles --------------------------------------------------


@dataclass(frozen=True)
class CpuTestSettings:
    """Plain typed fields: checked by their type hints, no parser given."""

    cfs_quota_enabled: bool = True
    cfs_burst_percent: int = 0


# Per-class defaults over the dataclass's (as the built-in cpu plugin has them).
CPU_TEST_DEFAULTS = {
    "LSE": {"cfs_quota_enabled": False},
    "LSR": {"cfs_quota_enabled": False},
    "LS": {"cfs_burst_percent": 1000},
    "SYSTEM": {"cfs_burst_percent": 1000},
}


def cpu_plugin() -> Plugin:
    """Answers per class from its settings, and writes the container's cgroup once it runs."""
    plugin = Plugin("cpu-test", order=10, settings=CpuTestSettings, defaults=CPU_TEST_DEFAULTS)

    @plugin.on(HookPoint.PRE_RUN_POD_SANDBOX)
    def pre_run(*, qos: QoSClass, response: HookResponse, **kwargs: Any) -> None:
        response.annotations["cpu-test/qos"] = str(qos)

    @plugin.on(HookPoint.PRE_CREATE_CONTAINER)
    def pre_create(*, qos: QoSClass, settings: CpuTestSettings, response: HookResponse, **kwargs: Any) -> None:
        response.env.set("QOS_CLASS", str(qos))
        if qos is QoSClass.BE:
            response.resources.cpu_shares = 2
        if not settings.cfs_quota_enabled:
            response.resources.cpu_quota = -1

    @plugin.on(HookPoint.POST_START_CONTAINER)
    def post_start(
        *,
        pod: PodInfo,
        container: ContainerInfo,
        qos: QoSClass,
        settings: CpuTestSettings,
        cgroups: CgroupFS,
        dry_run: bool,
        **kwargs: Any,
    ) -> None:
        assert dry_run
        if cgroups.has_file("cpu", cgroups.file_name("cpu.burst"), pod.cgroup_parent, container.id):
            cgroups.set_cpu_burst(pod.cgroup_parent, 1000 * settings.cfs_burst_percent, container_id=container.id)
        if cgroups.has_file("cpu", "cpu.idle", pod.cgroup_parent):
            cgroups.set_cpu_idle(pod.cgroup_parent, qos is QoSClass.BE)

    return plugin


def resctrl_plugin() -> Plugin:
    """One resctrl group per class, made at start; a started container's tasks join it."""
    plugin = Plugin("resctrl-test", order=20)

    @plugin.on_start
    def start(*, resctrl: ResctrlFS | None, **kwargs: Any) -> None:
        if resctrl is not None:
            resctrl.ensure_group("BE")
            resctrl.write_schemata("BE", "L3:0=3;1=3\nMB:0=50;1=50\n")

    @plugin.on(HookPoint.POST_START_CONTAINER)
    def join(*, qos: QoSClass, resctrl: ResctrlFS | None, **kwargs: Any) -> None:
        if resctrl is not None and qos is QoSClass.BE:
            assert resctrl.schemata("BE")["MB"] == {0: 50, 1: 50}  # what start "wrote" reads back
            resctrl.add_tasks("BE", [os.getpid()])

    return plugin


def broken_plugin() -> Plugin:
    plugin = Plugin("broken-test", order=30)

    @plugin.on(HookPoint.PRE_CREATE_CONTAINER)
    def fails(**kwargs: Any) -> None:
        raise RuntimeError("no luck")

    return plugin


PLUGINS = (cpu_plugin, resctrl_plugin, broken_plugin)


def fresh(factories: Iterable[Any] = PLUGINS) -> list[Plugin]:
    return [factory() for factory in factories]


@pytest.fixture
def node(tmp_path: Path) -> tuple[FakeCgroup, FakeResctrl]:
    return make_fake_cgroup_v2(tmp_path / "cgroup"), make_fake_resctrl(tmp_path / "resctrl")


async def explain(manifest: str, node: tuple[FakeCgroup, FakeResctrl], **options: Any) -> Explanation:
    tree, resctrl = node
    return await explain_manifest(
        PODS / manifest,
        options.pop("plugins", None) or fresh(),
        cgroup_root=tree.root,
        resctrl_root=resctrl.root,
        machine_memory=8 * GI,
        **options,
    )


def steps(explanation: Explanation, plugin: str) -> dict[str, Any]:
    [report] = [r for r in explanation.plugins if r.name == plugin]
    return {f"{s.hook} {s.container}".strip(): s for s in report.steps}


# --- the example pods --------------------------------------------------------------------------------------


async def test_a_be_pod_gets_its_class_values_and_nothing_is_written(node: tuple[FakeCgroup, FakeResctrl]) -> None:
    tree, resctrl = node
    before = snapshot(tree.root, resctrl.root)

    e = await explain("be-pod.yaml", node)

    assert snapshot(tree.root, resctrl.root) == before
    assert resctrl.groups() == [] and resctrl.writes == []  # the fake kernel saw no command at all
    assert (e.qos_class, e.qos_source, e.kubernetes_qos) == ("BE", "koordinator-label", "BestEffort")
    assert "koordinator.sh/qosClass=BE" in e.qos_reason
    cpu = steps(e, "cpu-test")
    assert cpu["PreRunPodSandbox"].response == {"annotations": {"cpu-test/qos": "BE"}}
    assert cpu["PreCreateContainer app"].response == {"resources": {"cpu_shares": 2}, "env": {"QOS_CLASS": "BE"}}
    assert cpu["PreCreateContainer app"].applied and not cpu["PostStartContainer app"].applied
    container_dir = tree.root / e.cgroup_parent.lstrip("/") / e.ids["app"]
    pod_dir = tree.root / e.cgroup_parent.lstrip("/")
    written = [(w.action, w.target, w.value) for w in cpu["PostStartContainer app"].writes]
    assert written == [
        ("write", str(container_dir / "cpu.max.burst"), "0"),  # BE: cfs_burst_percent 0
        ("write", str(pod_dir / "cpu.idle"), "1"),
    ]
    rdt = steps(e, "resctrl-test")
    assert [(w.action, w.target) for w in rdt["start"].writes] == [
        ("mkdir", str(resctrl.root / "BE")),
        ("write", str(resctrl.root / "BE" / "schemata")),
    ]
    assert [(w.target, w.value) for w in rdt["PostStartContainer app"].writes] == [
        (str(resctrl.root / "BE" / "tasks"), f"{os.getpid()}\n")
    ]
    broken = steps(e, "broken-test")["PreCreateContainer app"]
    assert (broken.outcome, broken.reason) == ("error", "RuntimeError: no luck")
    [run, create] = e.calls
    assert run.changes == ["annotations[cpu-test/qos]: None -> 'BE'"]
    assert "resources.cpu_shares: 2 -> 2" not in create.changes  # kubelet's own value: no change
    assert "env[QOS_CLASS] set" in create.changes  # names only: env values may be secrets


async def test_an_ls_pod(node: tuple[FakeCgroup, FakeResctrl]) -> None:
    tree, resctrl = node
    before = snapshot(tree.root, resctrl.root)
    e = await explain("ls-pod.yaml", node)
    assert snapshot(tree.root, resctrl.root) == before
    assert (e.qos_class, e.kubernetes_qos) == ("LS", "Burstable")
    cpu = steps(e, "cpu-test")
    assert cpu["PreCreateContainer app"].response == {"env": {"QOS_CLASS": "LS"}}
    container_dir = tree.root / e.cgroup_parent.lstrip("/") / e.ids["app"]
    burst = cpu["PostStartContainer app"].writes[0]
    assert (burst.target, burst.value) == (str(container_dir / "cpu.max.burst"), "1000000")  # LS: 1000 %
    assert cpu["PostStartContainer app"].writes[1].value == "0"  # cpu.idle off
    assert steps(e, "resctrl-test")["PostStartContainer app"].writes == []  # LS stays in the root group
    text = render_text(e)
    assert "QoS class:      LS  (koordinator-label: label koordinator.sh/qosClass=LS)" in text
    assert f"cgroups: write {container_dir / 'cpu.max.burst'} = '1000000'" in text
    assert "env: QOS_CLASS=LS" in text


async def test_a_guaranteed_pod_with_two_containers_on_cgroup_v1(tmp_path: Path) -> None:
    node = (make_fake_cgroup_v1(tmp_path / "cgroup"), make_fake_resctrl(tmp_path / "resctrl"))
    before = snapshot(tmp_path)
    e = await explain(
        "guaranteed-pod.yaml", node, policy=policy_from("cpu-test:\n  LSR: {cfs_burst_percent: 50}\n", cpu_plugin())
    )
    assert snapshot(tmp_path) == before
    assert (e.qos_class, e.qos_source, e.kubernetes_qos) == ("LSR", "kubernetes-cgroup-parent", "Guaranteed")
    assert "Kubernetes Guaranteed" in e.qos_reason and e.node["cgroup_version"] == "v1"
    cpu = steps(e, "cpu-test")
    assert set(cpu) == {
        "PreRunPodSandbox",
        *(f"{hook} {name}" for name in ("app", "helper") for hook in ("PreCreateContainer", "PostStartContainer")),
    }
    assert cpu["PreCreateContainer helper"].response == {"resources": {"cpu_quota": -1}, "env": {"QOS_CLASS": "LSR"}}
    burst = cpu["PostStartContainer helper"].writes[0]
    helper_dir = tmp_path / "cgroup" / "cpu" / e.cgroup_parent.lstrip("/") / e.ids["helper"]
    assert (burst.target, burst.value) == (str(helper_dir / "cpu.cfs_burst_us"), "50000")
    [_, app, helper] = e.calls
    assert (app.container, helper.container) == ("app", "helper")
    assert "resources.cpu_quota: 100000 -> -1" in app.changes


async def test_without_resctrl_plugins_get_none_and_without_plugins_nothing_happens(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cgroup")
    e = await explain_manifest(
        PODS / "be-pod.yaml", fresh(), cgroup_root=tree.root, resctrl_root=tmp_path / "none", machine_memory=GI
    )
    assert e.node["resctrl"].startswith("not mounted")
    assert all(not step.writes for step in steps(e, "resctrl-test").values())
    empty = await explain_manifest(
        PODS / "be-pod.yaml", [], cgroup_root=tree.root, resctrl_root=tmp_path / "none", machine_memory=GI
    )
    assert empty.plugins == [] and all(not call.changes for call in empty.calls)
    assert "no plugin enabled" in render_text(empty)


async def test_fail_plugins_and_answers_the_proxy_would_refuse(node: tuple[FakeCgroup, FakeResctrl]) -> None:
    strict = Plugin("strict", failure_policy="fail")

    @strict.on(HookPoint.PRE_CREATE_CONTAINER)
    def fails(**kwargs: Any) -> None:
        raise OSError("no cgroup")

    mover = Plugin("mover")

    @mover.on(HookPoint.PRE_RUN_POD_SANDBOX)
    def move(*, response: HookResponse, **kwargs: Any) -> None:
        response.cgroup_parent = "/elsewhere/pod1"

    e = await explain("ls-pod.yaml", node, plugins=[strict, mover])
    [run, create] = e.calls
    assert "the proxy would refuse the hook server's answer" in run.error and "cgroup_parent" in run.error
    assert create.error == "the proxy would fail CreateContainer: plugin strict failed at PreCreateContainer: " + (
        "OSError: no cgroup"
    )


async def test_a_plugin_whose_start_fails(node: tuple[FakeCgroup, FakeResctrl]) -> None:
    def failing(name: str, policy: str) -> Plugin:
        plugin = Plugin(name, failure_policy=policy)

        @plugin.on_start
        def start(**kwargs: Any) -> None:
            raise RuntimeError("cannot start")

        @plugin.on(HookPoint.PRE_CREATE_CONTAINER)
        def create(*, response: HookResponse, **kwargs: Any) -> None:
            response.annotations["x"] = "y"

        return plugin

    e = await explain("ls-pod.yaml", node, plugins=[failing("soft", "ignore"), failing("hard", "fail")])
    statuses = {r.name: (r.status, [s.hook for s in r.steps]) for r in e.plugins}
    assert statuses == {"soft": ("disabled", ["start"]), "hard": ("refuses-start", ["start"])}
    text = render_text(e)
    assert "the server would refuse to start" in text and "the server runs without this plugin" in text


# --- the dry-run handles -----------------------------------------------------------------------------------


def test_dry_run_cgroups_read_real_files_and_record_writes(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cgroup")
    parent = tree.add_pod("u1", qos="besteffort")
    tree.add_container(parent, "c1")
    before = snapshot(tree.root)
    recorder = WriteRecorder()
    fs = DryRunCgroupFS(tree.root, recorder=recorder)

    fs.set_cpu_quota(parent, 30000, container_id="c1")
    assert fs.cpu_quota(parent, container_id="c1") == (30000, 100000)  # reads what the dry run wrote
    assert fs.read("memory", "memory.high", parent) == "max"  # and the real file otherwise
    assert not fs.exists("/kubepods/burstable/podnew")
    with pytest.raises(FileNotFoundError):
        fs.set_cpu_shares("/kubepods/burstable/podnew", 512)
    fs.simulate("/kubepods/burstable/podnew", "c2", seed={"cpu.max": "20000 100000"})
    assert fs.exists("/kubepods/burstable/podnew") and fs.exists("/kubepods/burstable/podnew", "c2")
    assert fs.cpu_quota("/kubepods/burstable/podnew", "c2") == (20000, 100000)
    assert fs.read("memory", "memory.high", "/kubepods/burstable/podnew", "c2") == "max"  # as kubepods/burstable has
    fs.set_cpu_shares("/kubepods/burstable/podnew", 512, container_id="c2")
    assert not fs.has_file("cpu", "cpu.bvt_warp_ns", "/kubepods/burstable/podnew")  # not on this kernel

    assert snapshot(tree.root) == before
    assert [(Path(w.target).name, w.value) for w in recorder.writes] == [
        ("cpu.max", "30000 100000"),
        ("cpu.weight", "20"),
    ]


def test_dry_run_resctrl_keeps_its_groups_to_itself(tmp_path: Path) -> None:
    fake = make_fake_resctrl(tmp_path / "resctrl", num_closids=3)
    fake.fs().ensure_group("LS")
    before = snapshot(fake.root)
    recorder = WriteRecorder()
    fs = DryRunResctrlFS(fake.root, recorder=recorder)

    assert fs.groups() == ["LS"]
    fs.ensure_group("BE")
    assert fs.groups() == ["BE", "LS"]
    assert fs.schemata("BE") == {"L3": {0: 0x7FF, 1: 0x7FF}, "MB": {0: 100, 1: 100}}  # a new group's defaults
    fs.write_schemata("BE", "L3:0=f;1=f")
    assert fs.schemata("BE") == {"L3": {0: 0xF, 1: 0xF}, "MB": {0: 100, 1: 100}}
    with pytest.raises(Exception, match="CLOSIDs"):
        fs.ensure_group("SYSTEM")  # 3 CLOSIDs: the root, LS and BE
    assert fs.add_tasks("BE", [1]).moved == (1,) and fs.tasks("BE") == {1}
    assert fs.remove_group("LS") and fs.groups() == ["BE"]

    assert snapshot(fake.root) == before and fake.groups() == ["LS"]
    assert [(w.action, Path(w.target).relative_to(fake.root).as_posix()) for w in recorder.writes] == [
        ("mkdir", "BE"),
        ("write", "BE/schemata"),
        ("write", "BE/tasks"),
        ("rmdir", "LS"),
    ]


# --- the command ---------------------------------------------------------------------------------------------


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test plugins, as if installed (and only them: not what the machine has); the
    logging configuration the command sets (process-wide) is put back afterwards."""
    monkeypatch.setattr(cli_module, "discover_plugins", lambda: DiscoveryResult(tuple(fresh()), ()))
    saved = {key: list(value) if key == "processors" else value for key, value in structlog.get_config().items()}
    yield
    structlog.configure(**saved)


@pytest.mark.parametrize(
    ("manifest", "qos"), [("ls-pod.yaml", "LS"), ("be-pod.yaml", "BE"), ("guaranteed-pod.yaml", "LSR")]
)
def test_explain_command_prints_class_and_values(
    installed: None, node: tuple[FakeCgroup, FakeResctrl], manifest: str, qos: str
) -> None:
    tree, resctrl = node
    before = snapshot(tree.root, resctrl.root)
    args = ["explain", str(PODS / manifest), "--cgroup-root", str(tree.root), "--resctrl-root", str(resctrl.root)]

    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert f"QoS class:      {qos}  (" in result.output
    assert f"env: QOS_CLASS={qos}" in result.output
    assert "plugin cpu-test 0 (order 10, failure policy ignore, policy section cpu-test)" in result.output
    assert "cgroups: write " in result.output and "cpu.max.burst" in result.output
    assert "error: RuntimeError: no luck (its changes are discarded)" in result.output

    result = CliRunner().invoke(cli, [*args, "--output", "json", "--disable", "broken-test"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["qos_class"] == qos and data["qos_reason"]
    assert [p["name"] for p in data["plugins"]] == ["cpu-test", "resctrl-test"]
    writes = [w for p in data["plugins"] for s in p["steps"] for w in s["writes"]]
    assert writes and all(w["target"].startswith((str(tree.root), str(resctrl.root))) for w in writes)
    assert snapshot(tree.root, resctrl.root) == before


def test_explain_command_errors(installed: None, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["explain", str(PODS / "bad-quantity.yaml")])
    assert result.exit_code == 1 and "runtime-hooks: " in result.output and "quantity" in result.output
    bad = tmp_path / "policy.yaml"
    bad.write_text("cpu-test:\n  BE: {cfs_burst_percent: high}\n")
    result = CliRunner().invoke(cli, ["explain", str(PODS / "be-pod.yaml"), "--policy", str(bad)])
    assert result.exit_code == 1 and "cpu-test.BE.cfs_burst_percent: must be an integer" in result.output
    bad.write_text("cpu: {}\n")  # the built-in cpu plugin is not installed here: no such section
    result = CliRunner().invoke(cli, ["explain", str(PODS / "be-pod.yaml"), "--policy", str(bad)])
    assert result.exit_code == 1 and "unknown section 'cpu'" in result.output and "cpu-test" in result.output
    result = CliRunner().invoke(cli, ["explain", str(PODS / "be-pod.yaml"), "--enable", "nope"])
    assert result.exit_code == 1 and "cannot enable nope: no such plugin" in result.output


def test_explain_command_uses_the_policy_file(
    installed: None, node: tuple[FakeCgroup, FakeResctrl], tmp_path: Path
) -> None:
    tree, resctrl = node
    policy = tmp_path / "policy.yaml"
    policy.write_text("cpu-test:\n  LS: {cfs_burst_percent: 7}\n")
    args = ["explain", str(PODS / "ls-pod.yaml"), "--cgroup-root", str(tree.root), "--resctrl-root", str(resctrl.root)]
    result = CliRunner().invoke(cli, [*args, "--policy", str(policy), "--output", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["policy"] == f"{policy} over the defaults"
    [cpu] = [p for p in data["plugins"] if p["name"] == "cpu-test"]
    [post] = [s for s in cpu["steps"] if s["hook"] == "PostStartContainer"]
    assert post["writes"][0]["value"] == "7000"


# --- why plugins do nothing ---------------------------------------------------------------------------


def test_idle_reasons_name_the_missing_annotation_and_zero_policy_values() -> None:
    be = idle_reasons(DEFAULT_POLICY, QoSClass.BE, {}, version=CgroupVersion.V2, resctrl=False, besteffort=True)
    assert "node.koordinator.sh/extended-resource-spec" in be["cpu"]
    assert "cpu.BE.cfs_burst_percent is 0" in be["cpu"]
    assert "memory.BE.min_percent/low_percent/throttling_percent are 0" in be["memory"]
    assert "oom_score_adj 1000" in be["memory"]
    assert "memory.BE.pod_oom_score_adj is false: the pod's oom-score-adj annotations are not read" in be["memory"]
    assert be["cpuset"] == "cpuset.BE.pinned is false (shared pool)"
    assert "resctrl is not mounted" in be["resctrl"]
    assert 'network.interface is ""' in be["network"]

    lsr = idle_reasons(DEFAULT_POLICY, QoSClass.LSR, {}, version=CgroupVersion.V1, resctrl=True)
    assert "not pinned" in lsr["cpu"] and "extended-resource-spec" not in lsr["cpu"]
    assert "has no cpuset in scheduling.koordinator.sh/resource-status" in lsr["cpuset"]
    assert "v1_soft_limit is unset" in lsr["memory"]
    assert "BE only, the pod is LSR; memory.LSR.pod_oom_score_adj is false" in lsr["memory"]
    from_annotations = policy_from("memory: {LSR: {pod_oom_score_adj: true}}")
    lsr_read = idle_reasons(from_annotations, QoSClass.LSR, {}, version=CgroupVersion.V1, resctrl=True)
    assert "memory.LSR.pod_oom_score_adj is true, but no koordinator.sh/oom-score-adj" in lsr_read["memory"]
    assert "BE only" not in lsr_read["memory"]
    assert "not mounted" not in lsr["resctrl"]

    pinned = {"scheduling.koordinator.sh/resource-status": '{"cpuset": "0-1"}'}
    lsr_pinned = idle_reasons(DEFAULT_POLICY, QoSClass.LSR, pinned, version=CgroupVersion.V1, resctrl=True)
    assert "not pinned" not in lsr_pinned["cpu"]
    assert lsr_pinned["cpuset"] == "the cpuset is already as assigned"

    no_cgroups = idle_reasons(DEFAULT_POLICY, QoSClass.LS, {}, version=None, resctrl=False)
    assert all(reason.startswith("no cgroup hierarchy") for reason in no_cgroups.values())


async def test_text_groups_idle_plugins_in_one_line_each_with_its_reason(
    node: tuple[FakeCgroup, FakeResctrl],
) -> None:
    idle = Plugin("idle-test", order=5)

    @idle.on(HookPoint.PRE_CREATE_CONTAINER)
    def nothing(**kwargs: Any) -> None:
        pass

    explanation = await explain("be-pod.yaml", node, plugins=[idle, cpuset_plugin.plugin, cpu_plugin()])
    text = render_text(explanation)
    assert "\n    nothing" not in text  # no per-hook "nothing" lines any more
    assert "plugin idle-test" not in text and "plugin cpuset" not in text  # idle plugins lose their section
    assert "  cpuset: cpuset.BE.pinned is false (shared pool)" in text.splitlines()
    assert "  idle-test: no reason known (not a built-in plugin)" in text.splitlines()
    assert "plugin cpu-test" in text  # a plugin that does something keeps its section
    assert explanation.idle_reasons["cpuset"] == "cpuset.BE.pinned is false (shared pool)"
    assert "idle-test" not in explanation.idle_reasons


@dataclass(frozen=True)
class SwitchSettings:
    enabled: bool = True


async def test_plugins_not_called_are_grouped_in_one_line_with_why(
    node: tuple[FakeCgroup, FakeResctrl],
) -> None:
    """A plugin its settings switch off for the pod's class, and plugins needing a handle the node
    lacks, are not called; the text says so once per reason, naming every such plugin."""
    off = Plugin("off-test", settings=SwitchSettings, defaults={"BE": {"enabled": False}})
    needy = [Plugin(name, needs=("resctrl",)) for name in ("needy-a", "needy-b")]
    called: list[str] = []
    for plugin in (off, *needy):

        @plugin.on(HookPoint.PRE_CREATE_CONTAINER)
        def handler(*, plugin: Plugin, **kwargs: Any) -> None:
            called.append(plugin.name)

    tree, _ = node
    no_resctrl = (tree, make_fake_resctrl(tree.root.parent / "no-resctrl"))
    no_resctrl[1].root.rename(tree.root.parent / "gone")  # resctrl not mounted: plugins get resctrl=None
    e = await explain("be-pod.yaml", no_resctrl, plugins=[off, *needy])
    assert called == []
    reports = {report.name: report.not_called for report in e.plugins}
    assert reports == {
        "off-test": "off-test.BE.enabled is false",
        "needy-a": "needs resctrl, which this node lacks",
        "needy-b": "needs resctrl, which this node lacks",
    }
    lines = render_text(e).splitlines()
    assert "  off-test: not called: off-test.BE.enabled is false" in lines
    assert "  needy-a, needy-b: not called: needs resctrl, which this node lacks" in lines

    ls = await explain("ls-pod.yaml", no_resctrl, plugins=[off])  # LS keeps the dataclass default
    assert called == ["off-test"] and ls.plugins[0].not_called == ""


async def test_env_values_show_as_strings(node: tuple[FakeCgroup, FakeResctrl]) -> None:
    e = await explain("be-pod.yaml", node)
    text = render_text(e)
    assert "env: QOS_CLASS=BE" in text
    assert "b'" not in text and 'b"' not in text
    assert json.loads(json.dumps(e.to_dict()))["plugins"][0]["steps"][1]["response"]["env"] == {"QOS_CLASS": "BE"}


# --- CPU weights under the node runtime's conversion -------------------------------------------------------


def weight_plugin(seen: list[str]) -> Plugin:
    """Reads the weight runc gave the container (kubelet's shares), then sets 512 shares."""
    plugin = Plugin("weight-test", order=10)

    @plugin.on(HookPoint.POST_START_CONTAINER)
    def post_start(*, pod: PodInfo, container: ContainerInfo, cgroups: CgroupFS, **kwargs: Any) -> None:
        seen.append(cgroups.read("cpu", "cpu.weight", pod.cgroup_parent, container.id))
        cgroups.set_cpu_shares(pod.cgroup_parent, 512, container_id=container.id)

    return plugin


# ls-pod.yaml requests 250m: kubelet's 256 shares.
@pytest.mark.parametrize(
    ("conversion", "runc_weight", "written"),
    [(WeightConversion.LINEAR, "10", "20"), (WeightConversion.LOG_QUADRATIC, "35", "59")],
)
async def test_weights_follow_the_runtimes_conversion(
    node: tuple[FakeCgroup, FakeResctrl], conversion: WeightConversion, runc_weight: str, written: str
) -> None:
    assert shares_to_weight(256, conversion) == int(runc_weight)  # the seed is runc's weight
    seen: list[str] = []
    e = await explain("ls-pod.yaml", node, plugins=[weight_plugin(seen)], weight_conversion=conversion)
    assert seen == [runc_weight]
    [write] = steps(e, "weight-test")["PostStartContainer app"].writes
    assert (Path(write.target).name, write.value) == ("cpu.weight", written)
    assert e.node["cpu_weight_conversion"] == conversion.value
    assert f"(cgroupfs driver, {conversion.value} shares-to-weight)" in render_text(e)


def test_explain_command_takes_the_weight_conversion(
    monkeypatch: pytest.MonkeyPatch, installed: None, node: tuple[FakeCgroup, FakeResctrl]
) -> None:
    monkeypatch.setattr(cli_module, "discover_plugins", lambda: DiscoveryResult((weight_plugin([]),), ()))
    tree, resctrl = node
    args = ["explain", str(PODS / "ls-pod.yaml"), "--cgroup-root", str(tree.root), "--resctrl-root", str(resctrl.root),
            "--output", "json"]
    values = {}
    for conversion in ("linear", "log-quadratic"):
        result = CliRunner().invoke(cli, [*args, "--cpu-weight-conversion", conversion])
        assert result.exit_code == 0, result.output
        data = json.loads(result.output)
        values[conversion] = [w["value"] for p in data["plugins"] for s in p["steps"] for w in s["writes"]]
        assert data["node"]["cpu_weight_conversion"] == conversion
    assert values == {"linear": ["20"], "log-quadratic": ["59"]}
    result = CliRunner().invoke(cli, [*args], env={"RUNTIME_HOOKS_CPU_WEIGHT_CONVERSION": "log-quadratic"})
    assert result.exit_code == 0 and json.loads(result.output)["node"]["cpu_weight_conversion"] == "log-quadratic"
    result = CliRunner().invoke(cli, [*args, "--cpu-weight-conversion", "cubic"])
    assert result.exit_code == 2 and "'cubic' is not one of 'linear', 'log-quadratic'" in result.output


CONFIG_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop, labels: {koordinator.sh/qosClass: LS}}
spec:
  containers:
    - name: app
      image: localhost/runtimeproxy-testbed/busybox:1
      command: ["sleep", "3600"]
      resources: {requests: {cpu: 500m}}
      env:
        - {name: MODE, valueFrom: {configMapKeyRef: {name: settings, key: mode}}}
        - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}
      volumeMounts: [{name: config, mountPath: /etc/app}]
  volumes:
    - {name: config, configMap: {name: settings}}
"""
CONFIG_MAP = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: shop}
data: {mode: fast}
"""


def test_explain_command_reads_the_configmaps_the_pod_names(
    installed: None, node: tuple[FakeCgroup, FakeResctrl], tmp_path: Path
) -> None:
    """A pod with a configMap volume and variables is explained as `runtime-proxy play` would
    start it: with the ConfigMaps of its input or of --configmap files, and the node's address."""
    tree, resctrl = node
    alone, together, maps = tmp_path / "pod.yaml", tmp_path / "pod-and-map.yaml", tmp_path / "maps.yaml"
    alone.write_text(CONFIG_POD)
    together.write_text(CONFIG_POD + "---\n" + CONFIG_MAP)
    maps.write_text(CONFIG_MAP)
    node_args = ["--cgroup-root", str(tree.root), "--resctrl-root", str(resctrl.root), "--node-ip", "10.0.0.7"]

    missing = CliRunner().invoke(cli, ["explain", str(alone), *node_args])
    assert missing.exit_code == 1
    assert "configmap 'settings' not found" in missing.output and "--configmap" in missing.output
    for args in ([str(together)], [str(alone), "--configmap", str(maps)]):
        result = CliRunner().invoke(cli, ["explain", *args, *node_args, "--output", "json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["qos_class"] == "LS"
    no_ip = CliRunner().invoke(cli, ["explain", str(together), "--cgroup-root", str(tree.root)])
    assert no_ip.exit_code == 1 and "--node-ip" in no_ip.output
