"""CgroupFS.read_if_exists answers as has_file followed by read did, with one open: None where
has_file says False (no file, no cgroup, a link, a directory), read's error otherwise. And the
set_* helpers, which now write first and check only on failure, fail as they did before."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks import cgroups as cgroups_module
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupUnsupported, CgroupVersion
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1, make_fake_cgroup_v2

UID = "6d2f0c1e-3b4a-4c5d-8e9f-a0b1c2d3e4f5"


@pytest.fixture(params=["v1", "v2"])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    make = make_fake_cgroup_v1 if request.param == "v1" else make_fake_cgroup_v2
    return make(tmp_path / "cgroup")


def _as_before(fs: CgroupFS, file: str, parent: str) -> str | None:
    """What the plugins did before read_if_exists: has_file, then read."""
    return fs.read("cpu", file, parent) if fs.has_file("cpu", file, parent) else None


def test_a_present_file_is_read(tree: FakeCgroup) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    shares = fs.file_name("cpu.shares")
    fs.path("cpu", parent, None, shares).write_text("  512\n")
    assert fs.read_if_exists("cpu", shares, parent) == "512" == _as_before(fs, shares, parent)


def test_a_missing_file_or_cgroup_is_none(tree: FakeCgroup) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    assert fs.read_if_exists("cpu", "cpu.bvt_warp_ns", parent) is None
    assert fs.read_if_exists("cpu", "cpu.idle", "/kubepods/burstable/podgone") is None
    assert _as_before(fs, "cpu.bvt_warp_ns", parent) is None


def test_a_link_is_no_cgroup_file(tree: FakeCgroup, tmp_path: Path) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    target = tmp_path / "elsewhere"
    target.write_text("7\n")
    link = fs.path("cpu", parent, None, "cpu.idle")
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    assert fs.read_if_exists("cpu", "cpu.idle", parent) is None
    assert _as_before(fs, "cpu.idle", parent) is None
    with pytest.raises(OSError) as raised:  # read still refuses it outright
        fs.read("cpu", "cpu.idle", parent)
    assert raised.value.errno == errno.ELOOP


def test_a_directory_is_no_cgroup_file(tree: FakeCgroup) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    fs.path("cpu", parent, None, "cpu.bvt_warp_ns").mkdir()
    assert fs.read_if_exists("cpu", "cpu.bvt_warp_ns", parent) is None
    assert _as_before(fs, "cpu.bvt_warp_ns", parent) is None


_ABSENT = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EISDIR}


@given(code=st.sampled_from(sorted({errno.EACCES, errno.EPERM, errno.EIO, errno.EINVAL, errno.EBUSY} | _ABSENT)))
def test_an_unreadable_file_raises_as_read_does(code: int) -> None:
    fs = CgroupFS("/nonexistent-root", version=CgroupVersion.V1)

    def refuse(path: str | os.PathLike[str], *, follow: bool = True, one_record: bool = False) -> bytes:
        raise OSError(code, os.strerror(code), str(path))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cgroups_module, "read_bytes", refuse)
        with pytest.raises(OSError) as by_read:
            fs.read("cpu", "cpu.shares", "/kubepods/burstable/podx")
        assert by_read.value.errno == code
        if code in _ABSENT:
            assert fs.read_if_exists("cpu", "cpu.shares", "/kubepods/burstable/podx") is None
        else:
            with pytest.raises(OSError) as by_read_if_exists:
                fs.read_if_exists("cpu", "cpu.shares", "/kubepods/burstable/podx")
            assert by_read_if_exists.value.errno == code


def test_cpu_quota_if_present(tree: FakeCgroup) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    fs.set_cpu_quota(parent, 30000, 60000)
    assert fs.cpu_quota_if_present(parent) == fs.cpu_quota(parent) == (30000, 60000)
    fs.path("cpu", parent, None, fs.file_name("cpu.quota")).unlink()
    assert fs.cpu_quota_if_present(parent) is None
    assert fs.cpu_quota_if_present("/kubepods/burstable/podgone") is None
    with pytest.raises(FileNotFoundError):
        fs.cpu_quota(parent)


# --- the set_* helpers fail as before their checks moved after the write ------------------------

Setter = Callable[[CgroupFS, str], None]
SETTERS: dict[str, tuple[str, Setter]] = {
    "shares": ("cpu.shares", lambda fs, parent: fs.set_cpu_shares(parent, 512)),
    "burst": ("cpu.burst", lambda fs, parent: fs.set_cpu_burst(parent, 1000)),
    "idle": ("cpu.idle", lambda fs, parent: fs.set_cpu_idle(parent, True)),
    "period": ("cpu.period", lambda fs, parent: fs.set_cpu_quota(parent, 50000, 100000)),
}


@pytest.mark.parametrize("name", sorted(SETTERS))
def test_a_missing_cgroup_is_file_not_found(tree: FakeCgroup, name: str) -> None:
    with pytest.raises(FileNotFoundError, match="no such cgroup"):
        SETTERS[name][1](tree.fs(), "/kubepods/burstable/podgone")


def test_a_missing_cgroup_outside_the_pod_roots_is_still_file_not_found(tree: FakeCgroup) -> None:
    with pytest.raises(FileNotFoundError, match="no such cgroup"):
        tree.fs().set_cpu_shares("/system.slice/gone.service", 512)


@pytest.mark.parametrize("name", sorted(SETTERS))
@pytest.mark.parametrize("kind", ["missing", "link", "directory"])
def test_no_regular_file_is_unsupported_and_nothing_is_written(
    tree: FakeCgroup, tmp_path: Path, name: str, kind: str
) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    setting, setter = SETTERS[name]
    path = fs.path("cpu", parent, None, fs.file_name(setting))
    path.unlink(missing_ok=True)
    if kind == "link":
        (tmp_path / "target").write_text("0\n")
        path.symlink_to(tmp_path / "target")
    elif kind == "directory":
        path.mkdir()
    quota_before = fs.read_if_exists("cpu", fs.file_name("cpu.quota"), parent)
    with pytest.raises(CgroupUnsupported, match=f"no {re.escape(path.name)}"):
        setter(fs, parent)
    if kind == "link":
        assert (tmp_path / "target").read_text() == "0\n"
    # v1: the quota is written after the period, so a missing period leaves it alone too.
    assert fs.read_if_exists("cpu", fs.file_name("cpu.quota"), parent) == quota_before


def test_a_missing_v1_quota_file_leaves_the_period_alone(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v1(tmp_path / "cgroup")
    fs = tree.fs()
    parent = tree.add_pod(UID)
    period_before = tree.read(parent, "cpu.cfs_period_us")
    fs.path("cpu", parent, None, "cpu.cfs_quota_us").unlink()
    with pytest.raises(CgroupUnsupported, match=r"no cpu\.cfs_quota_us"):
        fs.set_cpu_quota(parent, 50000, 50000)
    assert tree.read(parent, "cpu.cfs_period_us") == period_before
