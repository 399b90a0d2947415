"""What CgroupFS saves on a pod's first look, with the answers it gave before:

* a file this kernel lacks (a FILES one, in a pod's or container's existing cgroup, on a cgroup v1
  mount) is remembered as absent and not probed again; nothing is remembered on v2, in a tree of plain
  files, at the root cgroup or where the cgroup itself is missing, and bad input still raises;
* exists / pod_cgroup_exists answer a new path from the lstat its resolution made (no stat after it),
  never from an older look;
* set_cpu_quota with the period just read writes only the quota when the period is the same (v1).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtimeproxy.hooks import cgroups as cgroups_module
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupPathError, CgroupUnsupported, CgroupVersion, CgroupWrite
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1, make_fake_cgroup_v2

UID = "0f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b"
WMARK = "memory.wmark_ratio"  # an Alibaba Cloud Linux file: absent from the fake trees


@pytest.fixture
def v1(tmp_path: Path) -> FakeCgroup:
    return make_fake_cgroup_v1(tmp_path / "cgroup")


def _as_mounted(patch: pytest.MonkeyPatch, fs: CgroupFS, *controllers: str) -> None:
    """Make ``controllers``' hierarchies of a fake tree count as cgroup v1 mounts."""
    mounts = frozenset(os.path.realpath(fs.root / controller) for controller in controllers)
    patch.setattr(cgroups_module, "_cgroup_mounts", lambda: mounts)


def _appear(fs: CgroupFS, parent: str, file: str = WMARK, value: str = "7\n") -> None:
    fs.path("memory", parent, None, file).write_text(value)


def test_a_missing_file_is_remembered_on_a_v1_mount(v1: FakeCgroup, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = v1.fs()
    _as_mounted(monkeypatch, fs, "memory")
    parent = v1.add_pod(UID)
    assert not fs.has_file("memory", WMARK, parent)
    _appear(fs, parent)  # cannot happen on a real mount: shows the file is not looked for again
    assert not fs.has_file("memory", WMARK, parent)
    assert fs.read_if_exists("memory", WMARK, parent) is None
    other = v1.add_pod("other-pod")  # the kernel's answer holds for every pod
    _appear(fs, other)
    assert fs.read_if_exists("memory", WMARK, other) is None


def test_read_if_exists_remembers_too(v1: FakeCgroup, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = v1.fs()
    _as_mounted(monkeypatch, fs, "cpu")
    parent = v1.add_pod(UID)
    assert fs.read_if_exists("cpu", "cpu.bvt_warp_ns", parent) is None
    fs.path("cpu", parent, None, "cpu.bvt_warp_ns").write_text("0\n")
    assert not fs.has_file("cpu", "cpu.bvt_warp_ns", parent)


@pytest.mark.parametrize("where", ["plain files", "root cgroup", "missing cgroup", "not a FILES file", "v2"])
def test_nothing_is_remembered_where_files_may_come(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cgroup") if where == "v2" else make_fake_cgroup_v1(tmp_path / "cgroup")
    fs = tree.fs()
    if where != "plain files":
        _as_mounted(monkeypatch, fs, "memory")
    file = "memory.custom_feature" if where == "not a FILES file" else WMARK
    parent = {"root cgroup": "/", "missing cgroup": tree.pod_parent(UID)}.get(where) or tree.add_pod(UID)
    assert not fs.has_file("memory", file, parent)
    if where == "missing cgroup":
        tree.add_pod(UID)
    _appear(fs, parent, file)
    assert fs.has_file("memory", file, parent)
    assert fs.read_if_exists("memory", file, parent) == "7"


def test_bad_input_still_raises_for_a_remembered_file(v1: FakeCgroup, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = v1.fs()
    _as_mounted(monkeypatch, fs, "memory")
    assert not fs.has_file("memory", WMARK, v1.add_pod(UID))
    for probe in (fs.has_file, fs.read_if_exists):
        with pytest.raises(CgroupPathError):
            probe("memory", WMARK, "/kubepods/../etc")
        with pytest.raises(CgroupPathError):
            probe("memory", WMARK, v1.pod_parent(UID), "bad/id")


def test_the_real_hierarchies_are_fixed_on_v1_only() -> None:
    fs = CgroupFS()  # this machine's /sys/fs/cgroup
    for controller in ("cpu", "memory"):
        assert fs._files_fixed(controller) is (fs.version is CgroupVersion.V1)


# -- exists from the resolution's lstat --------------------------------------------------------


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The os.stat calls made (os.path.isdir's): an lstat made for a resolution is not counted."""
    calls: list[str] = []
    real_stat = os.stat

    def counting(path: str, *args: object, **kwargs: object) -> os.stat_result:
        calls.append(str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counting)
    yield calls


def test_a_new_pods_existence_costs_no_stat(v1: FakeCgroup, stats: list[str]) -> None:
    fs = v1.fs()
    parent = v1.add_pod(UID)
    fs.path("cpu", "/")  # the hierarchies' own resolutions, made once per server
    fs.path("memory", "/")
    stats.clear()
    assert fs.pod_cgroup_exists("cpu", parent)
    assert fs.exists(parent, None, "memory")
    assert stats == []
    missing = v1.pod_parent("not-made")
    assert not fs.pod_cgroup_exists("cpu", missing)
    assert not fs.exists(missing, None, "memory")
    assert stats == []


def test_a_known_path_is_looked_at_again(v1: FakeCgroup, stats: list[str]) -> None:
    fs = v1.fs()
    parent = v1.add_pod(UID)
    fs.path("cpu", "/")
    stats.clear()
    assert fs.pod_cgroup_exists("cpu", parent) and fs.exists(parent)
    shutil.rmtree(v1.dir(parent, controller="cpu"))
    stats.clear()
    assert not fs.pod_cgroup_exists("cpu", parent)
    assert not fs.exists(parent)
    assert len(stats) == 2  # once resolved, each look is a stat of its own


def test_a_file_where_the_cgroup_should_be_is_no_cgroup(v1: FakeCgroup) -> None:
    fs = v1.fs()
    parent = v1.pod_parent(UID)
    v1.dir(parent, controller="cpu").write_text("")
    assert not fs.pod_cgroup_exists("cpu", parent)
    assert not CgroupFS(fs.root).exists(parent)


def test_a_link_inside_the_root_is_followed_by_exists(v1: FakeCgroup) -> None:
    fs = v1.fs()
    real = v1.add_pod(UID)
    link = v1.dir(v1.pod_parent("linked"), controller="memory")
    link.symlink_to(v1.dir(real, controller="memory"))
    assert fs.exists(v1.pod_parent("linked"), None, "memory")  # as os.path.isdir says


# -- the quota without an equal period ---------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.files: list[str] = []

    def written(self, cgroups: CgroupFS, write: CgroupWrite) -> None:
        self.files.append(write.file)


BOTH = ["cpu.cfs_period_us", "cpu.cfs_quota_us"]


@pytest.mark.parametrize(
    ("period", "period_now", "expected"),
    [(50000, 50000, ["cpu.cfs_quota_us"]), (100000, 50000, BOTH), (50000, None, BOTH)],
)
def test_an_equal_period_is_not_written_again(
    v1: FakeCgroup, period: int, period_now: int | None, expected: list[str]
) -> None:
    recorder = Recorder()
    fs = CgroupFS(v1.root, listener=recorder)
    parent = v1.add_pod(UID)
    fs.set_cpu_quota(parent, 100000, 50000)
    recorder.files.clear()
    fs.set_cpu_quota(parent, 30000, period, period_now=period_now)
    assert recorder.files == expected
    assert fs.cpu_quota(parent) == (30000, period)
    fs.set_cpu_quota(parent, -5, period, period_now=period)
    assert fs.cpu_quota(parent) == (-1, period)


def test_v2_writes_cpu_max_whole(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cgroup")
    recorder = Recorder()
    fs = CgroupFS(tree.root, listener=recorder)
    parent = tree.add_pod(UID)
    fs.set_cpu_quota(parent, 30000, 100000, period_now=100000)
    assert recorder.files == ["cpu.max"]
    assert fs.read("cpu", "cpu.max", parent) == "30000 100000"


def test_a_quota_alone_fails_as_both_did(v1: FakeCgroup) -> None:
    recorder = Recorder()
    fs = CgroupFS(v1.root, listener=recorder)
    parent = v1.add_pod(UID)
    fs.path("cpu", parent, None, "cpu.cfs_quota_us").unlink()
    with pytest.raises(CgroupUnsupported):
        fs.set_cpu_quota(parent, 30000, 100000, period_now=100000)
    with pytest.raises(FileNotFoundError):
        fs.set_cpu_quota(v1.pod_parent("gone"), 30000, 100000, period_now=100000)
    assert recorder.files == []
