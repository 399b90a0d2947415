"""Lookups CgroupFS saves, with the answers it gave before:

* on a cgroup v2 mount a FILES file missing from a pod's cgroup that has the file's controller
  enabled (listed in its cgroup.controllers) is remembered as absent for every pod; missing where
  the controller is not enabled, it proves nothing and is looked for again;
* a container's cgroup is found with one lstat, which also serves as its resolution and its
  existence; a container directory that is a link is still refused for writes.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from runtimeproxy.hooks import cgroups as cgroups_module
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupScopeError
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1, make_fake_cgroup_v2

WMARK = "memory.wmark_ratio"  # an Alibaba Cloud Linux file: absent from the fake trees
CID = "c" * 64


@pytest.fixture
def v2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCgroup:
    """A v2 tree whose root counts as a cgroup2 mount."""
    tree = make_fake_cgroup_v2(tmp_path / "cgroup")
    mounts = frozenset({os.path.realpath(tree.root)})
    monkeypatch.setattr(cgroups_module, "_cgroup2_mounts", lambda: mounts)
    return tree


def _appear(fs: CgroupFS, parent: str, file: str = WMARK) -> None:
    fs.path("memory", parent, None, file).write_text("7\n")  # cannot happen on a real mount


def test_a_file_missing_where_its_controller_is_enabled_is_remembered_on_v2(v2: FakeCgroup) -> None:
    fs = v2.fs()
    parent = v2.add_pod("pod-1")
    assert "memory" in v2.dir(parent).joinpath("cgroup.controllers").read_text().split()
    assert fs.read_if_exists("memory", WMARK, parent) is None
    assert fs.lacks("memory", WMARK)
    _appear(fs, parent)
    assert not fs.has_file("memory", WMARK, parent)  # not looked for again
    other = v2.add_pod("pod-2")
    _appear(fs, other)
    assert fs.read_if_exists("memory", WMARK, other) is None


def test_a_file_missing_where_its_controller_is_off_proves_nothing_on_v2(v2: FakeCgroup) -> None:
    fs = v2.fs()
    parent = v2.add_pod("pod-1")
    v2.dir(parent).joinpath("cgroup.controllers").write_text("cpu pids\n")  # memory not enabled here
    assert not fs.has_file("memory", WMARK, parent)
    assert not fs.lacks("memory", WMARK)
    _appear(fs, parent)
    assert fs.has_file("memory", WMARK, parent)
    assert fs.read_if_exists("memory", WMARK, parent) == "7"


def _count_stats(monkeypatch: pytest.MonkeyPatch, needle: str) -> Counter[str]:
    """Count os.stat and os.lstat calls on paths containing ``needle`` (os.path.isdir is a stat)."""
    seen: Counter[str] = Counter()
    real_stat, real_lstat = os.stat, os.lstat

    def counting_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if needle in str(path):
            seen["stat"] += 1
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    def counting_lstat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if needle in str(path):
            seen["lstat"] += 1
        return real_lstat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counting_stat)
    monkeypatch.setattr(os, "lstat", counting_lstat)
    return seen


@pytest.mark.parametrize("make", [make_fake_cgroup_v1, make_fake_cgroup_v2], ids=["v1", "v2"])
def test_a_containers_cgroup_is_found_with_one_lstat(
    make: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree: FakeCgroup = make(tmp_path / "cgroup")  # type: ignore[operator]
    parent = tree.add_pod("pod-1")
    tree.add_container(parent, CID)
    fs = tree.fs()
    fs.exists(parent)  # the pod's own path resolved first, as a hook call does
    seen = _count_stats(monkeypatch, CID)
    assert fs.exists(parent, CID)
    assert seen == {"lstat": 1}
    fs.write("cpu", "cpu.shares" if fs.version == 1 else "cpu.weight", 7, parent, CID)
    assert seen == {"lstat": 1}


def test_a_linked_container_directory_is_still_refused(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v1(tmp_path / "cgroup")
    parent = tree.add_pod("pod-1")
    tree.add_container(parent, "elsewhere")
    link = tree.dir(parent) / CID
    link.symlink_to(tree.dir(parent) / "elsewhere")
    fs = tree.fs()
    assert fs.exists(parent, CID)  # a link to a directory is a directory, as before
    with pytest.raises(CgroupScopeError, match="symlink"):
        fs.write("cpu", "cpu.shares", 7, parent, CID)
    assert (tree.dir(parent) / "elsewhere" / "cpu.shares").read_text().strip() != "7"
