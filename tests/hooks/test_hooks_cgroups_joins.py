"""CgroupFS builds a hook call's paths with string operations where os.path's would cost several
Python calls each: the answers must be os.path's, a file's pod path is its checked directory's, and a
pod cgroup checked once (pod_path) is not built and checked again for the reads that follow."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupPathError, _joined, _split
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1, make_fake_cgroup_v2

UID = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d"


@given(st.text(alphabet="/a.", max_size=14))
def test_split_is_os_path_split(path: str) -> None:
    assert _split(path) == os.path.split(path)


segments = st.lists(st.text(alphabet="ab.-", min_size=1, max_size=4), min_size=1, max_size=4)


@given(st.sampled_from(["/", "/r", "/r/s"]), segments)
def test_joined_is_os_path_join(directory: str, parts: list[str]) -> None:
    relative = "/".join(parts)  # as parent_path gives it: no leading, trailing or doubled "/"
    assert _joined(directory, relative) == os.path.join(directory, relative)


@pytest.fixture(params=["v1", "v2"])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    make = make_fake_cgroup_v1 if request.param == "v1" else make_fake_cgroup_v2
    return make(tmp_path / "cgroup")


def test_a_files_pod_path_is_its_directorys(tree: FakeCgroup) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    for file in ("cpu.idle", "cgroup.procs", "memory.custom_feature"):
        assert fs.pod_path("cpu", parent, None, file) == fs.pod_path("cpu", parent) / file
        assert fs.pod_path("cpu", parent, None, file) == fs.path("cpu", parent, None, file)


@pytest.mark.parametrize("file", ["", "a/b", "../cpu.idle", ".hidden", "cpu.idle\0"])
def test_a_bad_file_name_is_refused_however_it_is_reached(tree: FakeCgroup, file: str) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    fs.pod_path("cpu", parent)  # the directory remembered: the name is still checked
    calls: list[Callable[[], Any]] = [
        lambda: fs.pod_path("cpu", parent, None, file),
        lambda: fs.write("cpu", file, 1, parent),
        lambda: fs.read("cpu", file, parent),
        lambda: fs.read_if_exists("cpu", file, parent),
        lambda: fs.has_file("cpu", file, parent),
    ]
    for call in calls:
        with pytest.raises(CgroupPathError):
            call()


def test_a_checked_pod_cgroup_serves_the_reads_after_it(tree: FakeCgroup, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = tree.fs()
    parent = tree.add_pod(UID)
    built: list[str] = []
    target = fs._target

    def counting(controller: str, parent: str, container_id: str | None, file: str | None) -> str:
        built.append(controller)
        return target(controller, parent, container_id, file)

    monkeypatch.setattr(fs, "_target", counting)
    assert fs.pod_cgroup_exists("cpu", parent)
    assert built == ["cpu"]
    assert fs.exists(parent)
    assert fs.read_if_exists("cpu", "cpu.idle" if fs.has_file("cpu", "cpu.idle", parent) else "cgroup.procs", parent)
    fs.write("cpu", "cgroup.procs", "0", parent)
    assert built == ["cpu"]  # one build and check for the pod cgroup, whatever is read or written


def test_a_path_checked_first_still_gets_the_pod_check(tmp_path: Path) -> None:
    """The other way round is not shared: a path inside the root may still be no pod's."""
    tree = make_fake_cgroup_v1(tmp_path / "cgroup")
    fs = CgroupFS(tree.root)
    tree.mkdir("/kubepods/besteffort")
    assert fs.exists("/kubepods")
    with pytest.raises(CgroupPathError):
        fs.pod_path("cpu", "/kubepods")  # a root itself
