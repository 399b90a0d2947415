"""The plugin authors' test kit (runtimeproxy.hooks.testkit): its fixtures build trees with the
kernel's file names, its builders give what the proxy and the server would, run_plugin runs a
plugin as the server does, and a fake resctrl tree can be attached to another process. Also the
SDK's entry-point version fallback."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_dists import make_distribution
from runtimeproxy.hooks import resctrl_fs as resctrl_mod
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupVersion
from runtimeproxy.hooks.discovery import load_entry_point
from runtimeproxy.hooks.plugin_runner import HookCallFailed
from runtimeproxy.hooks.qos import KOORDINATOR_QOS_LABEL, QoSClass
from runtimeproxy.hooks.resctrl_fs import KernelOps, ResctrlCapacityError, ResctrlFS, ResctrlWriteError
from runtimeproxy.hooks.sdk import (
    ENTRY_POINT_GROUP,
    HookPoint,
    HookResponse,
    Plugin,
    PodInfo,
    Resources,
    discover_plugins,
    qos_of,
)
from runtimeproxy.hooks.server import (
    container_from_request,
    pod_from_container_request,
    pod_from_request,
)
from runtimeproxy.hooks.testkit import (
    DEFAULT_UID,
    FakeCgroup,
    FakeResctrl,
    attach_fake_resctrl,
    attached_fake_resctrl,
    container,
    container_request,
    detach_fake_resctrl,
    kube_qos_of,
    kubelet_cgroup_parent,
    make_fake_resctrl,
    pod,
    pod_request,
    run_plugin,
)

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.hookapi import cri_mapping

pytest_plugins = ["runtimeproxy.hooks.testkit.fixtures", "pytester"]

CREATE = HookPoint.PRE_CREATE_CONTAINER
RUN = HookPoint.PRE_RUN_POD_SANDBOX
MiB = 1 << 20


# --- fixtures ------------------------------------------------------------------------------------


def test_fake_cgroup_v1_has_the_kernel_files(fake_cgroup_v1: FakeCgroup) -> None:
    root = fake_cgroup_v1.root
    assert (fake_cgroup_v1.version, fake_cgroup_v1.driver) == (CgroupVersion.V1, "cgroupfs")
    assert (root / "cpu").resolve() == root / "cpu,cpuacct"  # the link systemd makes
    assert (root / "cpu" / "cpu.shares").read_text() == "1024\n"
    assert (root / "cpu" / "cpu.cfs_quota_us").read_text() == "-1\n"
    assert (root / "memory" / "memory.limit_in_bytes").is_file()
    assert (root / "cpuset" / "cpuset.cpus").is_file()
    assert (root / "cpu" / "kubepods" / "burstable" / "cpu.shares").is_file()
    assert fake_cgroup_v1.fs().version is CgroupVersion.V1


def test_fake_cgroup_v2_has_the_kernel_files(fake_cgroup_v2: FakeCgroup) -> None:
    root = fake_cgroup_v2.root
    assert (fake_cgroup_v2.version, fake_cgroup_v2.driver) == (CgroupVersion.V2, "cgroupfs")
    assert "cpu" in (root / "cgroup.controllers").read_text().split()
    assert not (root / "cpu.max").exists()  # the root cgroup has none, as in the kernel
    assert (root / "kubepods" / "cpu.max").read_text() == "max 100000\n"
    assert (root / "kubepods" / "besteffort" / "cpu.weight").read_text() == "100\n"
    assert fake_cgroup_v2.fs().version is CgroupVersion.V2


def test_both_versions_in_one_test_do_not_collide(fake_cgroup_v1: FakeCgroup, fake_cgroup_v2: FakeCgroup) -> None:
    assert fake_cgroup_v1.root != fake_cgroup_v2.root
    assert fake_cgroup_v1.fs().version is CgroupVersion.V1 and fake_cgroup_v2.fs().version is CgroupVersion.V2


def test_fake_cgroup_covers_versions_and_drivers(fake_cgroup: FakeCgroup, request: pytest.FixtureRequest) -> None:
    version, driver = request.node.callspec.id.split("-")
    assert (f"v{int(fake_cgroup.version)}", fake_cgroup.driver) == (version, driver)
    parent = fake_cgroup.add_pod(DEFAULT_UID, "besteffort")
    [directory, *_] = fake_cgroup.add_container(parent, "c1")
    if driver == "systemd":
        assert parent == f"kubepods-besteffort-pod{DEFAULT_UID.replace('-', '_')}.slice"
        assert directory.name == "cri-containerd-c1.scope"
        assert "kubepods.slice/kubepods-besteffort.slice" in str(directory)
    else:
        assert parent == f"/kubepods/besteffort/pod{DEFAULT_UID}"
        assert directory.name == "c1"
    cgroups = fake_cgroup.fs()
    cgroups.set_cpu_shares(parent, 1024, container_id="c1")
    expected = "cpu.shares" if version == "v1" else "cpu.weight"
    assert (directory / expected).read_text().strip() == ("1024" if version == "v1" else "39")


def test_fake_resctrl_is_still_there(fake_resctrl: FakeResctrl) -> None:
    assert (fake_resctrl.root / "info" / "L3" / "cbm_mask").read_text() == "7ff\n"
    assert fake_resctrl.fs().available()


def test_the_fixtures_load_with_pytest_plugins(pytester: pytest.Pytester) -> None:
    """In a project of their own, as authors use them: four fake_cgroup kinds, and fewer on request."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(
        test_author=textwrap.dedent(
            """
            import pytest

            pytest_plugins = ["runtimeproxy.hooks.testkit.fixtures"]


            def test_each(fake_cgroup):
                assert fake_cgroup.fs().available()


            @pytest.mark.parametrize("fake_cgroup", ["v2-systemd"], indirect=True)
            def test_one(fake_cgroup):
                assert (int(fake_cgroup.version), fake_cgroup.driver) == (2, "systemd")


            def test_others(fake_cgroup_v1, fake_cgroup_v2, fake_resctrl):
                assert fake_cgroup_v1.root.name == "cgroup-v1" and fake_resctrl.root.name == "resctrl"
            """
        )
    )
    result = pytester.runpytest("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(
        [
            "*test_each?v1-cgroupfs? PASSED*",
            "*test_each?v1-systemd? PASSED*",
            "*test_each?v2-cgroupfs? PASSED*",
            "*test_each?v2-systemd? PASSED*",
            "*test_one?v2-systemd? PASSED*",
        ]
    )


# --- builders: what a handler gets ---------------------------------------------------------------


def test_pod_defaults() -> None:
    made = pod()
    assert (made.name, made.namespace, made.uid, made.attempt, made.sandbox_id) == (
        "web",
        "default",
        DEFAULT_UID,
        0,
        "",
    )
    assert dict(made.labels) == {} and dict(made.annotations) == {}
    assert made.cgroup_parent == f"/kubepods/burstable/pod{DEFAULT_UID}"
    assert made.resources is None and made.overhead is None and made.runtime_handler == ""
    assert pod("db").uid != DEFAULT_UID and pod("db").uid == pod("db").uid  # stable, per name
    uuid.UUID(pod("db").uid)


@pytest.mark.parametrize(
    ("qos", "parent"),
    [
        ("BE", "/kubepods/besteffort/pod{uid}"),
        ("LS", "/kubepods/burstable/pod{uid}"),
        ("LSR", "/kubepods/pod{uid}"),
        (QoSClass.LSE, "/kubepods/pod{uid}"),
        ("SYSTEM", "/kubepods/burstable/pod{uid}"),
    ],
)
def test_the_qos_shortcut_sets_the_koordinator_label_and_a_fitting_parent(qos: str, parent: str) -> None:
    made = pod(qos=qos, labels={"app": "x"})
    assert dict(made.labels) == {"app": "x", KOORDINATOR_QOS_LABEL: str(qos)}
    assert made.cgroup_parent == parent.format(uid=DEFAULT_UID)
    resolution = qos_of(made)
    assert (resolution.qos_class, resolution.source) == (QoSClass(qos), "koordinator-label")


def test_an_unknown_qos_class_is_refused() -> None:
    with pytest.raises(ValueError, match="QoSClass"):
        pod(qos="GOLD")


@pytest.mark.parametrize(
    ("resources", "kube_qos"),
    [
        (None, None),
        (Resources(cpu_shares=2), "besteffort"),
        (Resources(cpu_period=100_000, cpu_quota=50_000, cpu_shares=512, memory_limit_in_bytes=MiB), "guaranteed"),
        (Resources(cpu_period=100_000, cpu_quota=200_000, cpu_shares=2048, memory_limit_in_bytes=MiB), "guaranteed"),
        (Resources(cpu_period=100_000, cpu_quota=50_000, cpu_shares=256, memory_limit_in_bytes=MiB), "burstable"),
        (Resources(cpu_period=100_000, cpu_quota=50_000, cpu_shares=512), "burstable"),  # no memory limit
        (Resources(cpu_shares=256), "burstable"),
    ],
)
def test_the_kubernetes_qos_follows_the_resources_as_kubelet_sets_it(
    resources: Resources | None, kube_qos: Any
) -> None:
    assert kube_qos_of(resources) == kube_qos
    made = pod(resources=resources, qos="BE")  # the resources decide, as for kubelet
    expected = kube_qos or "besteffort"
    assert made.cgroup_parent == kubelet_cgroup_parent(made.uid, expected)


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
@pytest.mark.parametrize("kube_qos", ["guaranteed", "burstable", "besteffort"])
def test_parents_are_named_as_kubelet_and_the_fake_trees_name_them(driver: Any, kube_qos: Any) -> None:
    tree = FakeCgroup(Path("/nonexistent"), CgroupVersion.V2, driver)
    made = pod(kube_qos=kube_qos, driver=driver, qos="BE")  # kube_qos wins over the class
    assert (
        made.cgroup_parent == tree.pod_parent(made.uid, kube_qos) == kubelet_cgroup_parent(made.uid, kube_qos, driver)
    )
    assert pod(kube_qos=kube_qos.capitalize(), driver=driver).cgroup_parent == made.cgroup_parent  # "Guaranteed"
    assert pod(cgroup_parent="/custom", kube_qos=kube_qos).cgroup_parent == "/custom"


def test_pod_and_container_can_create_their_cgroups(fake_cgroup: FakeCgroup) -> None:
    made = pod(qos="LSR", cgroups=fake_cgroup)  # the tree's driver
    assert made.cgroup_parent == fake_cgroup.pod_parent(made.uid, "guaranteed")
    assert fake_cgroup.dir(made.cgroup_parent).is_dir()
    app = container(id="abc123", pod=made, cgroups=fake_cgroup)
    assert fake_cgroup.dir(made.cgroup_parent, app.id).is_dir()
    v1 = fake_cgroup.version is CgroupVersion.V1
    assert fake_cgroup.read(made.cgroup_parent, "cpu.shares" if v1 else "cpu.weight", app.id) == (
        "1024" if v1 else "100"
    )
    with pytest.raises(ValueError, match="container id"):
        container(pod=made, cgroups=fake_cgroup)
    other: Any = "systemd" if fake_cgroup.driver == "cgroupfs" else "cgroupfs"
    with pytest.raises(ValueError, match="driver"):
        pod(cgroups=fake_cgroup, driver=other)


def test_container_defaults_and_env() -> None:
    made = container()
    assert (made.name, made.id, made.attempt, made.resources, made.env) == ("app", "", 0, None, ())
    assert container(env={"A": "1", "B": "2"}).env == (("A", "1"), ("B", "2"))
    assert container(env=[("A", "1"), ("A", "2")]).env == (("A", "1"), ("A", "2"))  # repeats kept, as in CRI


# --- builders: what the proxy sends and the server makes of it ----------------------------------

POD_VARIANTS: list[dict[str, Any]] = [
    {},
    {"qos": "BE", "sandbox_id": "sandbox-1"},
    {
        "name": "db",
        "namespace": "shop",
        "uid": "u-1",
        "attempt": 2,
        "labels": {"tier": "db"},
        "annotations": {"a": "b"},
        "driver": "systemd",
        "kube_qos": "guaranteed",
        "runtime_handler": "kata",
        "resources": Resources(cpu_period=100_000, cpu_quota=100_000, cpu_shares=1024, memory_limit_in_bytes=MiB),
        "overhead": Resources(cpu_shares=10, unified={"memory.high": "max"}),
    },
    {"resources": Resources()},  # sent, but empty: still not None
]


@pytest.mark.parametrize("fields", POD_VARIANTS)
def test_pod_matches_what_the_server_makes_of_pod_request(fields: dict[str, Any]) -> None:
    made = pod(**fields)
    assert pod_from_request(pod_request(**fields)) == made
    assert pod_from_request(pod_request(made)) == made
    with pytest.raises(TypeError):
        pod_request(made, name="other")


@pytest.mark.parametrize("fields", POD_VARIANTS)
def test_container_matches_what_the_server_makes_of_container_request(fields: dict[str, Any]) -> None:
    owner = pod(**fields)
    made = container(
        "side",
        id="c-1",
        attempt=1,
        annotations={"k": "v"},
        resources=Resources(cpu_shares=2, oom_score_adj=1000, hugepage_limits=()),
        env=[("B", "2"), ("A", "1"), ("B", "3"), ("RAW", b"\xff".decode("utf-8", "surrogateescape"))],
    )
    request = container_request(made, pod=owner)
    assert container_from_request(request) == made
    assert pod_from_container_request(request) == owner
    assert container_from_request(container_request(pod=owner)) == container()
    assert pod_from_container_request(container_request()) == pod()


def test_requests_are_the_proxys_own() -> None:
    """The requests equal those the proxy builds from the CRI calls (hookapi/cri_mapping.py)."""
    limits = cri.LinuxContainerResources(cpu_period=100_000, cpu_quota=50_000, cpu_shares=512)
    config = cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name="web", uid="u-1", namespace="shop", attempt=1),
        labels={KOORDINATOR_QOS_LABEL: "LS"},
        annotations={"a": "b"},
        linux=cri.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable/podu-1", resources=limits),
    )
    config_c = cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name="app", attempt=0),
        annotations={"c": "d"},
        envs=[cri.KeyValue(key="A", value=b"1"), cri.KeyValue(key="BAD", value=b"\xff")],
        linux=cri.LinuxContainerConfig(resources=cri.LinuxContainerResources(cpu_shares=256, oom_score_adj=900)),
    )
    view = cri_mapping.PodView(sandbox_id="sb-1", runtime_handler="runc", config=config)
    proxy_pod = cri_mapping.pod_hook_request(view)
    proxy_container = cri_mapping.container_hook_request(view, cri_mapping.ContainerView("ctr-1", config_c))

    owner = pod(
        "web",
        "shop",
        "u-1",
        attempt=1,
        qos="LS",
        annotations={"a": "b"},
        sandbox_id="sb-1",
        runtime_handler="runc",
        resources=Resources(cpu_period=100_000, cpu_quota=50_000, cpu_shares=512),
    )
    app = container(
        id="ctr-1",
        annotations={"c": "d"},
        env=[("A", "1"), ("BAD", b"\xff".decode("utf-8", "surrogateescape"))],
        resources=Resources(cpu_shares=256, oom_score_adj=900),
    )
    assert pod_request(owner) == proxy_pod
    assert container_request(app, pod=owner) == proxy_container


# --- run_plugin ----------------------------------------------------------------------------------


def tiny() -> Plugin:
    plugin = Plugin("tiny", version="0.1")

    @plugin.on(CREATE, RUN)
    def handler(*, hook: HookPoint, pod: PodInfo, container: Any, qos: Any, response: HookResponse, **kw: Any) -> None:
        response.annotations["seen"] = f"{hook.value} {pod.name} {container.name if container else '-'} {qos}"
        if container is not None:
            response.env.set("QOS", str(qos))

    return plugin


async def test_run_plugin_runs_one_hook_and_returns_the_response() -> None:
    result = await run_plugin(tiny(), CREATE, pod=pod(qos="BE"), container=container("app"))
    assert result.applied == ["tiny"] and result.failures == []
    assert result.response.annotations == {"seen": "PreCreateContainer web app BE"}
    assert result.response.env.items() == [("QOS", "BE")]
    # Again (a fresh metrics registry each time), by name, with the default container.
    again = await run_plugin(tiny(), "PreCreateContainerHook", pod=pod())
    assert again.response.annotations == {"seen": "PreCreateContainer web app LS"}
    pod_hook = await run_plugin(tiny(), RUN, pod=pod(qos="LSR"))
    assert pod_hook.response.annotations == {"seen": "PreRunPodSandbox web - LSR"}
    with pytest.raises(ValueError, match="pod hook"):
        await run_plugin(tiny(), RUN, pod=pod(), container=container())


async def test_run_plugin_reports_and_raises_failures_as_the_server_does() -> None:
    def failing(policy: str) -> Plugin:
        plugin = Plugin(f"bad-{policy}", failure_policy=policy)

        @plugin.on(CREATE)
        def handler(*, response: HookResponse, **kwargs: Any) -> None:
            response.resources.cpu_shares = 1  # below the proxy's minimum: invalid

        return plugin

    result = await run_plugin([failing("ignore"), tiny()], CREATE, pod=pod())
    assert result.applied == ["tiny"]
    [failure] = result.failures
    assert (failure.plugin, failure.outcome) == ("bad-ignore", "invalid")
    with pytest.raises(HookCallFailed, match="bad-fail"):
        await run_plugin(failing("fail"), CREATE, pod=pod())


@dataclass(frozen=True)
class BurstSettings:
    cfs_burst_percent: int = 0


async def test_run_plugin_passes_node_handles_and_policy(fake_cgroup_v2: FakeCgroup, fake_resctrl: FakeResctrl) -> None:
    seen: dict[str, Any] = {}
    plugin = Plugin("handles", settings=BurstSettings)

    @plugin.on(CREATE)
    def handler(*, cgroups: Any, resctrl: Any, settings: BurstSettings, dry_run: bool, **kwargs: Any) -> None:
        seen.update(cgroups=cgroups, resctrl=resctrl, burst=settings.cfs_burst_percent, dry_run=dry_run)

    await run_plugin(plugin, CREATE, pod=pod(qos="LS"), cgroups=fake_cgroup_v2, resctrl=fake_resctrl)
    assert isinstance(seen["cgroups"], CgroupFS) and seen["cgroups"].root == fake_cgroup_v2.root
    assert isinstance(seen["resctrl"], ResctrlFS) and seen["resctrl"].root == fake_resctrl.root
    assert seen["dry_run"] is False
    await run_plugin(
        plugin, CREATE, pod=pod(qos="LS"), policy="handles:\n  LS: {cfs_burst_percent: 40}\n", dry_run=True
    )
    assert (seen["cgroups"], seen["resctrl"], seen["burst"], seen["dry_run"]) == (None, None, 40, True)


# --- entry-point version fallback ----------------------------------------------------------------


PLUGIN_MODULE = """
from runtimeproxy.hooks.sdk import Plugin

plugin = Plugin("{name}"{version})

@plugin.on("PreCreateContainer")
def handler(**kwargs):
    pass
"""


def test_a_plugin_without_a_version_takes_its_distributions(site: tuple[Path, str]) -> None:
    path, prefix = site
    make_distribution(
        path,
        f"{prefix}-dist",
        {"bare": f"{prefix}_bare:plugin", "pinned": f"{prefix}_pinned:plugin"},
        {
            f"{prefix}_bare": PLUGIN_MODULE.format(name=f"{prefix}-bare", version=""),
            f"{prefix}_pinned": PLUGIN_MODULE.format(name=f"{prefix}-pinned", version=', version="9"'),
        },
        version="2.3.4",
    )
    found = {p.name: p.version for p in discover_plugins().plugins if p.name.startswith(prefix)}
    assert found == {f"{prefix}-bare": "2.3.4", f"{prefix}-pinned": "9"}

    # An entry point without a distribution (made by hand) leaves the default.
    (path / f"{prefix}_loose.py").write_text(PLUGIN_MODULE.format(name=f"{prefix}-loose", version=""))
    loose = importlib.metadata.EntryPoint("loose", f"{prefix}_loose:plugin", ENTRY_POINT_GROUP)
    assert load_entry_point(loose).version == "0"


# --- attaching a fake resctrl tree ---------------------------------------------------------------

OPTIONS: dict[str, Any] = {"l3_ids": [0, 1], "cbm_mask": "fffff", "mb_ids": [0], "num_closids": 4}


@pytest.fixture
def detached() -> Iterator[None]:
    yield
    detach_fake_resctrl()
    assert resctrl_mod.KernelOps is KernelOps


def test_an_attached_tree_is_driven_like_a_kernel(tmp_path: Path, detached: None) -> None:
    maker = make_fake_resctrl(tmp_path / "resctrl", **OPTIONS)
    maker.fs().ensure_group("made-before")
    maker.fs().write_schemata("made-before", "L3:0=3\n")

    kernel = attach_fake_resctrl(tmp_path / "resctrl", **OPTIONS)
    assert attached_fake_resctrl(tmp_path / "resctrl") is kernel
    assert kernel.groups() == ["made-before"]  # the tree's state, taken over
    assert kernel.schemata("made-before")["L3"] == {0: 0x3, 1: 0xFFFFF}

    fs = ResctrlFS(tmp_path / "resctrl")  # no ops=: what the server makes
    fs.ensure_group("new")
    assert (tmp_path / "resctrl" / "new" / "schemata").read_text() == "    MB:0=100\n    L3:0=fffff;1=fffff\n"
    fs.write_schemata("new", "MB:0=35\n")
    assert fs.schemata("new")["MB"] == {0: 40}  # rounded up to the granularity, as the kernel does
    with pytest.raises(ResctrlWriteError, match="Invalid argument"):
        fs.write_schemata("new", "L3:0=5\n")  # non-contiguous mask
    assert fs.last_cmd_status() == "The mask 5 has non-consecutive 1-bits"
    fs.ensure_group("third")
    with pytest.raises(ResctrlCapacityError, match="CLOSIDs"):
        fs.ensure_group("fourth")  # four CLOSIDs: the root and three groups
    assert [w.path.name for w in kernel.writes] == ["schemata", "schemata"]

    # Anywhere else, the real kernel's plain mkdir.
    ResctrlFS(tmp_path / "elsewhere")._ops.mkdir(tmp_path / "elsewhere")
    assert (tmp_path / "elsewhere").is_dir() and kernel.groups() == ["made-before", "new", "third"]

    detach_fake_resctrl(tmp_path / "resctrl")
    assert resctrl_mod.KernelOps is KernelOps and attached_fake_resctrl(tmp_path / "resctrl") is None


def test_attaching_checks_the_tree(tmp_path: Path, detached: None) -> None:
    make_fake_resctrl(tmp_path / "resctrl", **OPTIONS)
    with pytest.raises(ValueError, match="other options"):
        attach_fake_resctrl(tmp_path / "resctrl", **{**OPTIONS, "cbm_mask": "7ff"})
    with pytest.raises(ValueError, match="not a fake resctrl tree"):
        attach_fake_resctrl(tmp_path)
    assert resctrl_mod.KernelOps is KernelOps


def test_another_process_drives_the_tree(tmp_path: Path) -> None:
    """What the end-to-end tests do with a runtime-hooks subprocess, with a short script."""
    tree = make_fake_resctrl(tmp_path / "resctrl", **OPTIONS)
    script = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from runtimeproxy.hooks.resctrl_fs import ResctrlFS
        from runtimeproxy.hooks.testkit import attach_fake_resctrl

        root, options = sys.argv[1], json.loads(sys.argv[2])
        attach_fake_resctrl(root, **options)
        fs = ResctrlFS(Path(root))
        fs.ensure_group("rtpx-BE")
        fs.write_schemata("rtpx-BE", "L3:0=3f;1=3f\\n")
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(tree.root), json.dumps(OPTIONS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert (tree.root / "rtpx-BE" / "schemata").read_text() == "    MB:0=100\n    L3:0=3f;1=3f\n"
    assert (tree.root / "info" / "L3" / "bit_usage").read_text() == "0=" + "S" * 20 + ";1=" + "S" * 20 + "\n"
