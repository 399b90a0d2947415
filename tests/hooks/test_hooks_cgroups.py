"""Node-side cgroup access (hooks/cgroups.py) against the fake kernel trees (hooks/testkit/fake_cgroups.py):
version detection, pod and container paths for both drivers, per-version files, and path safety."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtimeproxy.hooks.cgroups import (
    FILES,
    CgroupFS,
    CgroupPathError,
    CgroupScopeError,
    CgroupUnsupported,
    CgroupVersion,
    PodRoots,
    detect_version,
    expand_slice,
    parent_path,
    shares_to_weight,
    weight_to_shares,
)
from runtimeproxy.hooks.testkit.fake_cgroups import (
    V1_HIERARCHIES,
    V1_UNLIMITED,
    FakeCgroup,
    make_fake_cgroup_v1,
    make_fake_cgroup_v2,
)

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
CID = "4a5b6c7d8e9f"


@pytest.fixture(params=["v1", "v2"])
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["cgroupfs", "systemd"])
def tree(request: pytest.FixtureRequest, version: str, tmp_path: Path) -> FakeCgroup:
    make = make_fake_cgroup_v1 if version == "v1" else make_fake_cgroup_v2
    return make(tmp_path / "cgroup", driver=request.param)


# --- detection and parents -------------------------------------------------------------------------


def test_version_detection(tmp_path: Path) -> None:
    assert detect_version(make_fake_cgroup_v2(tmp_path / "v2").root) is CgroupVersion.V2
    assert detect_version(make_fake_cgroup_v1(tmp_path / "v1").root) is CgroupVersion.V1
    (tmp_path / "empty").mkdir()
    with pytest.raises(CgroupUnsupported, match="not a cgroup mount"):
        detect_version(tmp_path / "empty")
    assert not CgroupFS(tmp_path / "empty").available()
    assert CgroupFS(tmp_path / "v1").available()


@pytest.mark.parametrize(
    ("parent", "path"),
    [
        ("/kubepods/burstable/pod1", "kubepods/burstable/pod1"),
        ("/kubepods/pod1", "kubepods/pod1"),
        ("kubepods-burstable-pod1_2.slice", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice"),
        ("kubepods-pod1.slice", "kubepods.slice/kubepods-pod1.slice"),
        ("/kubepods.slice/kubepods-besteffort.slice", "kubepods.slice/kubepods-besteffort.slice"),  # already nested
        ("/", ""),
        ("", ""),
        ("-.slice", ""),
        ("//kubepods//x/", "kubepods/x"),
    ],
)
def test_parent_paths(parent: str, path: str) -> None:
    assert parent_path(parent) == path


@pytest.mark.parametrize("parent", ["/kubepods/../etc", "..", "/kubepods/./x", "a\0b", "kubepods--x.slice", "-a.slice"])
def test_bad_parents_are_refused(parent: str) -> None:
    with pytest.raises(CgroupPathError):
        parent_path(parent)


def test_expand_slice() -> None:
    assert expand_slice("a-b-c.slice") == ["a.slice", "a-b.slice", "a-b-c.slice"]
    with pytest.raises(CgroupPathError):
        expand_slice("a-b")


# --- the fake trees ----------------------------------------------------------------------------------


def test_fake_v2_tree_looks_like_the_kernel(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cg", anolis=True)
    root = tree.root
    controllers = ["cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc"]
    assert (root / "cgroup.controllers").read_text().split() == controllers
    assert not (root / "cpu.max").exists() and not (root / "memory.min").exists()  # never in the root
    parent = tree.add_pod(UID, "burstable")
    assert parent == f"/kubepods/burstable/pod{UID}"
    [container] = tree.add_container(parent, CID)
    assert container == root / "kubepods" / "burstable" / f"pod{UID}" / CID
    values = {name: (container / name).read_text().strip() for name in ("cpu.max", "cpu.weight", "cpu.max.burst")}
    assert values == {"cpu.max": "max 100000", "cpu.weight": "100", "cpu.max.burst": "0"}
    memory = [(container / name).read_text().strip() for name in ("memory.min", "memory.low", "memory.high")]
    assert memory == ["0", "0", "max"]
    assert (container / "cpu.bvt_warp_ns").read_text().strip() == "0"
    assert (container / "cgroup.subtree_control").read_text() == ""  # a leaf
    enabled = ["cpuset", "cpu", "io", "memory", "hugetlb", "pids"]
    assert (container.parent / "cgroup.subtree_control").read_text().split() == enabled


def test_fake_v2_children_only_get_enabled_controllers(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cg", subtree_control=["memory"], kubepods=False)
    [directory] = tree.mkdir("only-memory")
    assert (directory / "cgroup.controllers").read_text().split() == ["memory"]
    assert (directory / "memory.high").exists() and not (directory / "cpu.max").exists()
    assert (directory / "cpu.stat").exists()  # a core file, there without the cpu controller


def test_fake_v1_tree_looks_like_the_kernel(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v1(tmp_path / "cg", driver="systemd")
    root = tree.root
    assert os.readlink(root / "cpu") == "cpu,cpuacct" and os.readlink(root / "cpuacct") == "cpu,cpuacct"
    parent = tree.add_pod(UID, "besteffort")
    assert parent == f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice"
    dirs = tree.add_container(parent, CID)
    assert {d.parent.parent.parent.parent.name for d in dirs} == set(V1_HIERARCHIES)  # one per hierarchy
    cpu = tree.dir(parent, CID)
    assert cpu.name == f"cri-containerd-{CID}.scope"
    assert os.path.realpath(cpu).startswith(os.path.realpath(root / "cpu,cpuacct"))
    values = [(cpu / name).read_text().strip() for name in ("cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us")]
    assert values == ["1024", "-1", "100000"]
    memory = tree.dir(parent, CID, controller="memory")
    assert (memory / "memory.soft_limit_in_bytes").read_text().strip() == V1_UNLIMITED
    assert not (cpu / "cpu.bvt_warp_ns").exists()  # Anolis only


# --- paths -----------------------------------------------------------------------------------------


def test_pod_and_container_paths(tree: FakeCgroup) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    tree.add_container(parent, CID)
    base = tree.root / "cpu" if tree.version is CgroupVersion.V1 else tree.root
    pod_dir = base / parent_path(parent)
    assert fs.path("cpu", parent) == pod_dir
    expected = CID if tree.driver == "cgroupfs" else f"cri-containerd-{CID}.scope"
    assert fs.path("cpu", parent, CID, "cpu.stat") == pod_dir / expected / "cpu.stat"
    assert fs.exists(parent, CID) and not fs.exists(parent, "other")
    assert fs.has_file("cpu", "cpu.stat", parent, CID)


def test_container_dirs_of_other_runtimes_are_found(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cg", driver="systemd")
    parent = tree.add_pod(UID)
    tree.add_container(parent, CID, runtime="crio")
    assert tree.fs().path("cpu", parent, CID).name == f"crio-{CID}.scope"
    # Not created yet: the driver's usual name.
    assert tree.fs().path("cpu", parent, "new").name == "cri-containerd-new.scope"


def test_file_names_per_version(tmp_path: Path) -> None:
    v1 = make_fake_cgroup_v1(tmp_path / "v1").fs()
    v2 = make_fake_cgroup_v2(tmp_path / "v2").fs()
    settings = ("cpu.quota", "cpu.shares", "cpu.burst")
    assert [v1.file_name(s) for s in settings] == ["cpu.cfs_quota_us", "cpu.shares", "cpu.cfs_burst_us"]
    assert [v2.file_name(s) for s in settings] == ["cpu.max", "cpu.weight", "cpu.max.burst"]
    with pytest.raises(CgroupUnsupported):
        v1.file_name("memory.min")
    with pytest.raises(CgroupUnsupported):
        v2.file_name("memory.soft_limit")
    assert set(FILES) >= {"cpu.idle", "cpu.bvt_warp_ns", "memory.high"}


# --- helpers -------------------------------------------------------------------------------------


def test_cpu_helpers(tree: FakeCgroup) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    tree.add_container(parent, CID)
    fs.set_cpu_quota(parent, 50000, 100000, container_id=CID)
    assert fs.cpu_quota(parent, CID) == (50000, 100000)
    fs.set_cpu_quota(parent, -1, 50000, container_id=CID)
    assert fs.cpu_quota(parent, CID) == (-1, 50000)
    fs.set_cpu_shares(parent, 1024, container_id=CID)
    fs.set_cpu_burst(parent, 20000, container_id=CID)
    fs.set_cpu_idle(parent, True, container_id=CID)
    if tree.version is CgroupVersion.V2:
        assert tree.read(parent, "cpu.max", CID) == "max 50000"
        assert tree.read(parent, "cpu.weight", CID) == "39"
        assert tree.read(parent, "cpu.max.burst", CID) == "20000"
    else:
        assert tree.read(parent, "cpu.cfs_quota_us", CID) == "-1"
        assert tree.read(parent, "cpu.cfs_period_us", CID) == "50000"
        assert tree.read(parent, "cpu.shares", CID) == "1024"
        assert tree.read(parent, "cpu.cfs_burst_us", CID) == "20000"
    assert fs.cpu_shares(parent, CID) in (1024, weight_to_shares(39))
    assert tree.read(parent, "cpu.idle", CID) == "1"
    with pytest.raises(CgroupUnsupported, match=r"no cpu\.bvt_warp_ns"):
        fs.set_group_identity(parent, 2, container_id=CID)
    with pytest.raises(ValueError):
        fs.set_cpu_shares(parent, 1)


def test_group_identity_on_anolis(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v1(tmp_path / "cg", anolis=True)
    parent = tree.add_pod(UID)
    tree.fs().set_group_identity(parent, -1)
    assert tree.read(parent, "cpu.bvt_warp_ns") == "-1"


def test_memory_helpers(tree: FakeCgroup) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    if tree.version is CgroupVersion.V2:
        fs.set_memory_protection(parent, min_bytes=1 << 20, low_bytes=2 << 20, high_bytes=-1)
        values = [tree.read(parent, f) for f in ("memory.min", "memory.low", "memory.high")]
        assert values == [str(1 << 20), str(2 << 20), "max"]
        fs.set_memory_protection(parent, high_bytes=3 << 20)
        assert tree.read(parent, "memory.high") == str(3 << 20)
        with pytest.raises(CgroupUnsupported):
            fs.set_memory_soft_limit(parent, 1)
    else:
        fs.set_memory_soft_limit(parent, 1 << 20)
        assert tree.read(parent, "memory.soft_limit_in_bytes") == str(1 << 20)
        fs.set_memory_soft_limit(parent, None)
        assert tree.read(parent, "memory.soft_limit_in_bytes") == "-1"
        with pytest.raises(CgroupUnsupported):
            fs.set_memory_protection(parent, min_bytes=1)


def test_missing_cgroups_and_files(tree: FakeCgroup) -> None:
    fs = tree.fs()
    with pytest.raises(FileNotFoundError):
        fs.set_cpu_quota("/kubepods/burstable/podgone", 50000)
    with pytest.raises(FileNotFoundError):
        fs.write("cpu", "cpu.nonexistent", 1, tree.add_pod(UID))  # cgroup files are never created


def test_shares_and_weight_conversion() -> None:
    assert shares_to_weight(2) == 1 and shares_to_weight(262144) == 10000 and shares_to_weight(1024) == 39
    assert shares_to_weight(1) == 1 and shares_to_weight(10**9) == 10000
    assert all(shares_to_weight(weight_to_shares(w)) == w for w in range(1, 10001))


# --- safety --------------------------------------------------------------------------------------


def test_symlinks_out_of_the_root_are_refused(tmp_path: Path, version: str) -> None:
    tree = (make_fake_cgroup_v1 if version == "v1" else make_fake_cgroup_v2)(tmp_path / "cg")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpu.max").write_text("secret")
    base = tree.root / "cpu" if version == "v1" else tree.root
    (base / "kubepods" / "evil").symlink_to(outside)
    fs = tree.fs()
    with pytest.raises(CgroupPathError, match="outside the cgroup root"):
        fs.read("cpu", "cpu.max", "/kubepods/evil")
    with pytest.raises(CgroupPathError):
        fs.write("cpu", "cpu.max", "1", "/kubepods/evil")
    assert (outside / "cpu.max").read_text() == "secret"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("cpu", "../../etc/passwd", "/kubepods"), "file name"),
        (("cpu", "cpu.max", "/kubepods", "../x"), "container id"),
        (("cpu", "cpu.max", "/kubepods", "a/b"), "container id"),
        (("../cpu", "cpu.max", "/kubepods"), "controller"),
        (("cpu", "cpu.max", "/kubepods/../../"), r"'\.\.' segment"),
    ],
)
def test_names_that_could_leave_the_root_are_refused(tmp_path: Path, args: tuple[str, ...], match: str) -> None:
    fs = make_fake_cgroup_v1(tmp_path / "cg").fs()
    with pytest.raises(CgroupPathError, match=match):
        fs.read(*args)


_segments = st.one_of(
    st.sampled_from(["..", ".", "", "kubepods", "evil", "burstable", "a.slice", "kubepods-evil.slice", "\0", "/"]),
    st.text(max_size=12),
)
_parents = st.lists(_segments, max_size=6).map("/".join) | st.text(max_size=40)
_ids = st.one_of(st.none(), st.sampled_from(["..", ".", "a/b", "evil", CID, "/"]), st.text(max_size=20))
_files = st.one_of(st.sampled_from(["cpu.max", "..", "../cpu.max", "cpu.max/x", "."]), st.text(max_size=12))


@pytest.mark.parametrize("make", [make_fake_cgroup_v1, make_fake_cgroup_v2])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parent=_parents, container_id=_ids, file=_files)
def test_no_parent_or_container_escapes_the_root(
    tmp_path: Path, make: type, parent: str, container_id: str | None, file: str
) -> None:
    root = tmp_path / "cg"
    if not root.exists():
        tree = make(root, driver="systemd")
        outside = tmp_path / "outside"
        outside.mkdir()
        # The one way out is a symlink: plant some where generated parents may lead.
        for directory in (*tree.mkdir("kubepods"), *tree.mkdir("kubepods.slice")):
            target = directory / ("evil" if directory.name == "kubepods" else "kubepods-evil.slice")
            target.symlink_to(outside)
    fs = CgroupFS(root, "systemd")
    try:
        path = fs.path("cpu", parent, container_id, file)
    except CgroupPathError:
        return
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    assert real == real_root or real.startswith(real_root + os.sep), (parent, container_id, file, real)


# --- where writes may go: pod and container cgroups under the pod roots ------------------------------

POD_CGROUPS = [
    "/kubepods/pod1",  # Guaranteed
    "/kubepods/burstable/pod1",
    f"/kubepods/besteffort/pod1/{CID}",  # a container
    "//kubepods//burstable/pod1/",  # not normalized, same cgroup
    "kubepods-pod1.slice",
    "kubepods-burstable-pod1_2.slice",
    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice",
    "/kubepods/burstable/pod1/c1/deeper",  # anything below a pod
]
NOT_POD_CGROUPS = [
    "",
    "/",
    "-.slice",  # systemd's root slice
    "/system.slice",
    "system.slice",
    "/system.slice/kubepods/pod1",
    "/kubepods",  # a root itself
    "kubepods",
    "kubepods.slice",
    "/kubepods/burstable",  # QoS-class cgroups
    "/kubepods/besteffort",
    "kubepods-burstable.slice",
    "/kubepods.slice/kubepods-besteffort.slice",
    "/kubepodsX/pod1",
    "/evil/kubepods/pod1",
    "/kubepods/../kubepods/pod1",
    "/kubepods/./pod1",
    "/kubepods/pod1\0",
    "kubepods--pod1.slice",
]


@pytest.mark.parametrize("parent", POD_CGROUPS)
def test_pod_and_container_cgroups_under_the_roots_may_be_written(parent: str) -> None:
    assert PodRoots().problem(parent) is None
    PodRoots().check(parent)


@pytest.mark.parametrize("parent", NOT_POD_CGROUPS)
def test_no_other_cgroup_may_be_written(parent: str) -> None:
    problem = PodRoots().problem(parent)
    assert problem is not None and repr(parent) in problem
    with pytest.raises(CgroupScopeError, match="runtime-hooks writes only pod and container cgroups"):
        PodRoots().check(parent)


def test_roots_are_configurable() -> None:
    roots = PodRoots(["/rtpx-1/kubepods"])
    assert roots.problem("/rtpx-1/kubepods/besteffort/pod1") is None
    assert roots.problem("/rtpx-1/kubepods/pod1") is None
    assert "QoS-class" in (roots.problem("/rtpx-1/kubepods/burstable") or "")
    assert "not below a pod cgroup root (/rtpx-1/kubepods)" in (roots.problem("/kubepods/pod1") or "")
    assert "none" in (PodRoots([]).problem("/kubepods/pod1") or "")  # no roots: nothing is written


@pytest.mark.parametrize("root", ["/", "", "-.slice", "/kubepods/../x", "kubepods--x.slice"])
def test_bad_roots_are_configuration_errors(root: str) -> None:
    with pytest.raises(ValueError, match="pod cgroup root"):
        PodRoots([root])


def test_writes_outside_the_pod_cgroups_and_tiers_are_refused(tree: FakeCgroup) -> None:
    fs = tree.fs()
    tree.mkdir("system.slice")
    tree.mkdir("kubepods.slice/kubepods-burstable.slice")
    tree.mkdir("kubepods/burstable")
    tree.mkdir("other/burstable")
    name = fs.file_name("cpu.shares")
    before = _state(tree.root)
    for parent in ("/", "/system.slice", "/kubepods", "kubepods.slice", "/other/burstable"):
        with pytest.raises(CgroupScopeError):
            fs.write("cpu", name, 3, parent)
    for tier in ("/kubepods/burstable", "kubepods-burstable.slice"):  # a tier holds no container
        with pytest.raises(CgroupScopeError):
            fs.write("cpu", name, 3, tier, "c1")
    with pytest.raises(CgroupScopeError):
        fs.create_pod_cgroup("/kubepods/besteffort")  # nor is a tier ever made
    assert _state(tree.root) == before
    parent = tree.add_pod(UID, "burstable")
    fs.write("cpu", name, 3, parent)
    assert fs.read("cpu", name, parent) == "3"


@pytest.mark.parametrize(
    "tier", ["/kubepods/burstable", "kubepods-burstable.slice", "/kubepods.slice/kubepods-besteffort.slice"]
)
def test_the_qos_tiers_themselves_may_be_written(tree: FakeCgroup, tier: str) -> None:
    fs = tree.fs()
    tree.mkdir(parent_path(tier))
    name = fs.file_name("cpu.shares")
    fs.write("cpu", name, 3, tier)
    assert fs.read("cpu", name, tier) == "3"


def test_the_tiers_of_the_roots() -> None:
    roots = PodRoots(["/kubepods", "kubepods.slice", "/rtpx-1/kubepods", "rtpx_1-kubepods.slice"])
    assert roots.tiers("burstable") == (
        "/kubepods/burstable",
        "/kubepods.slice/kubepods-burstable.slice",
        "/rtpx-1/kubepods/burstable",
        "/rtpx_1.slice/rtpx_1-kubepods.slice/rtpx_1-kubepods-burstable.slice",
    )
    assert roots.tier_of("rtpx_1-kubepods-burstable.slice") == "burstable"  # the slice name alone
    for tier in ("burstable", "besteffort"):
        for parent in roots.tiers(tier):  # type: ignore[arg-type]
            assert roots.tier_of(parent) == tier
            roots.check_write(parent)
            with pytest.raises(CgroupScopeError):
                roots.check(parent)  # a tier is no pod's
    assert roots.tier_of("kubepods-besteffort.slice") == "besteffort"
    for other in ("/kubepods", "/kubepods/burstable/pod1", "/kubepods/guaranteed", "/x/burstable", "kubepods.slice"):
        assert roots.tier_of(other) is None
    with pytest.raises(ValueError, match="tier must be one of"):
        roots.tiers("guaranteed")  # type: ignore[arg-type]


def test_a_symlink_inside_the_root_does_not_lead_a_write_out_of_the_pod_cgroups(tmp_path: Path, version: str) -> None:
    tree = (make_fake_cgroup_v1 if version == "v1" else make_fake_cgroup_v2)(tmp_path / "cg")
    [system] = tree.mkdir("system.slice")[:1]
    base = tree.dir("/kubepods/burstable")
    (base / "podlink").symlink_to(system)  # cgroupfs has no symlinks; a tree that has one is not trusted
    fs = tree.fs()
    name = fs.file_name("cpu.shares")
    before = (system / name).read_text()
    with pytest.raises(CgroupScopeError, match="symlink"):
        fs.write("cpu", name, 3, "/kubepods/burstable/podlink")
    with pytest.raises(CgroupScopeError, match="symlink"):
        fs.create_pod_cgroup("/kubepods/burstable/podlink/x")
    assert (system / name).read_text() == before and not (system / "x").exists()


def test_create_pod_cgroup_makes_only_pod_cgroups(tree: FakeCgroup) -> None:
    fs = CgroupFS(tree.root, "cgroupfs")  # the systemd driver makes none (test_hooks_systemd_units.py)
    parent = tree.pod_parent("new", "besteffort")
    made = fs.create_pod_cgroup(parent)
    assert made and made[-1] == tree.dir(parent) and tree.dir(parent).is_dir()
    assert fs.create_pod_cgroup(parent) == []  # already there
    for bad in ("/system.slice/podx", "/kubepods/burstable", "/", "/podx"):
        with pytest.raises(CgroupScopeError):
            fs.create_pod_cgroup(bad)
    assert not tree.dir("/system.slice/podx").exists() and not tree.dir("/podx").exists()


def test_create_pod_cgroup_enables_the_controller_in_new_parents_on_v2(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cg", subtree_control=["memory"], kubepods=False)
    made = tree.fs().create_pod_cgroup("/kubepods/besteffort/pod1")
    assert [path.relative_to(tree.root).as_posix() for path in made] == [
        "kubepods",
        "kubepods/besteffort",
        "kubepods/besteffort/pod1",
    ]
    # The root's children get cpu (the fake's file is plain: the write replaced its content);
    # plain mkdir made the others without kernel files, so there was nothing to enable there.
    assert (tree.root / "cgroup.subtree_control").read_text() == "+cpu"


# Parents, as a hostile or broken kubelet/runtime could send them: kubepods-like names, other
# slices, QoS cgroups, dot segments, NULs, absolute and relative forms, planted links, any text.
_scope_segments = st.one_of(
    st.sampled_from(
        [
            "kubepods",
            "kubepods.slice",
            "burstable",
            "besteffort",
            "kubepods-burstable.slice",
            "kubepods-besteffort-pod1.slice",
            "pod1",
            "system.slice",
            "tolink",
            "outlink",
            "..",
            ".",
            "",
            "\0",
        ]
    ),
    st.text(max_size=10),
)
_scope_parents = st.lists(_scope_segments, max_size=5).map("/".join) | st.text(max_size=30)


_TIERS = {"besteffort", "burstable", "kubepods-besteffort.slice", "kubepods-burstable.slice"}


def _qos_free_pod_dir(segments: tuple[str, ...]) -> bool:
    """The test's own reading of "a pod's cgroup or below": under kubepods or kubepods.slice,
    deeper than the root, and not one of the QoS-tier cgroups right below it."""
    if len(segments) < 2 or segments[0] not in ("kubepods", "kubepods.slice"):
        return False
    return not (len(segments) == 2 and segments[1] in _TIERS)


def _tier_dir(segments: tuple[str, ...]) -> bool:
    """A QoS-tier cgroup itself: ``kubepods/burstable``, ``kubepods.slice/kubepods-besteffort.slice``..."""
    return len(segments) == 2 and segments[0] in ("kubepods", "kubepods.slice") and segments[1] in _TIERS


def _cgroup_segments(tree: FakeCgroup, path: Path) -> tuple[str, ...]:
    parts = path.relative_to(tree.root).parts
    return parts[1:] if tree.version is CgroupVersion.V1 else parts  # v1: below the hierarchy's directory


def _state(root: Path) -> dict[Path, str | None]:
    """Every directory (None) and file (content) under ``root``, links not followed."""
    found: dict[Path, str | None] = {}
    for path in root.rglob("*"):
        if path.is_symlink():
            continue
        found[path] = None if path.is_dir() else path.read_text(errors="replace")
    return found


@pytest.mark.parametrize("make", [make_fake_cgroup_v1, make_fake_cgroup_v2])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parent=_scope_parents, container_id=_ids)
def test_no_parent_leads_to_a_write_outside_the_pod_cgroups_and_tiers(
    tmp_path: Path, make: type, parent: str, container_id: str | None
) -> None:
    root = tmp_path / "cg"
    if not root.exists():
        tree = make(root, driver="systemd")
        tree.mkdir("system.slice")
        outside = tmp_path / "outside"
        outside.mkdir()
        for directory in tree.mkdir("kubepods/burstable"):  # links to the root cgroup and out of the tree
            (directory / "tolink").symlink_to(directory.parent.parent)
            (directory / "outlink").symlink_to(outside)
    tree = FakeCgroup(root, CgroupVersion.V1 if make is make_fake_cgroup_v1 else CgroupVersion.V2, "systemd", False)
    fs = tree.fs()
    before = _state(tmp_path)
    for attempt in (
        lambda: fs.write("cpu", fs.file_name("cpu.shares"), 7, parent, container_id),
        lambda: fs.create_pod_cgroup(parent),
    ):
        with contextlib.suppress(CgroupPathError, CgroupUnsupported, OSError):  # refused, or the kernel (fake) said no
            attempt()
    after = _state(tmp_path)
    changed = [path for path in after if before.get(path, "new") != after[path]]
    for path in changed:
        assert path.is_relative_to(root), (parent, path)
        directory = path if after[path] is None else path.parent
        segments = _cgroup_segments(tree, directory)
        if after[path] is None:  # a new directory: the pod's cgroup or an ancestor kubelet would make
            assert segments[:1] in (("kubepods",), ("kubepods.slice",)), (parent, path)
        elif container_id is None and _tier_dir(segments):
            assert path.name == fs.file_name("cpu.shares"), (parent, path)  # a tier's own file, written as asked
        else:
            assert _qos_free_pod_dir(segments), (parent, container_id, path)


REAL_CPU = Path("/sys/fs/cgroup/cpu")


@pytest.mark.skipif(not (REAL_CPU / "cpu.shares").is_file() or os.geteuid() != 0, reason="needs root and cgroup v1 cpu")
def test_a_real_tier_cgroup_is_written_and_nothing_beside_it() -> None:
    """On this kernel's cgroup v1 cpu hierarchy: a tier of the configured root takes a write,
    the root above it, a sibling that is no tier and a container id under the tier do not."""
    prefix = f"rtpx-tier-{os.getpid()}"
    made = [REAL_CPU / prefix / "kubepods" / "burstable", REAL_CPU / prefix / "kubepods" / "other"]
    for directory in made:
        directory.mkdir(parents=True, exist_ok=True)
    try:
        fs = CgroupFS("/sys/fs/cgroup", pod_roots=PodRoots([f"/{prefix}/kubepods"]))
        tier = f"/{prefix}/kubepods/burstable"
        fs.set_cpu_shares(tier, 2048)
        assert (REAL_CPU / prefix / "kubepods" / "burstable" / "cpu.shares").read_text().strip() == "2048"
        before = (REAL_CPU / prefix / "kubepods" / "cpu.shares").read_text()
        for parent, container_id in ((f"/{prefix}/kubepods", None), (f"/{prefix}", None), (tier, "c1")):
            with pytest.raises(CgroupScopeError):
                fs.write("cpu", "cpu.shares", 4096, parent, container_id)
        assert (REAL_CPU / prefix / "kubepods" / "cpu.shares").read_text() == before
        fs.set_cpu_shares(f"/{prefix}/kubepods/other", 4096)  # "other" is a pod cgroup by name, as kubelet's are
    finally:
        for directory in (*made, REAL_CPU / prefix / "kubepods", REAL_CPU / prefix):
            with contextlib.suppress(OSError):
                directory.rmdir()
