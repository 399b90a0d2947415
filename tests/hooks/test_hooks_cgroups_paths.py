"""CgroupFS builds a cgroup's path as a string (not pathlib): the same path as pathlib's join of the
hierarchy, the parent's relative path and the file, for any parent it accepts, whether it is
asked once or again (remembered), and through every accessor."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from fake_trees import TREES, fake_tree
from hypothesis import given, settings
from hypothesis import strategies as st
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupPathError, CgroupVersion, parent_path

SEGMENT = st.text("abcxyz019_.-", min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))
CGROUPFS_PARENT = st.lists(SEGMENT, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
SLICE = st.lists(st.text("abc019_", min_size=1, max_size=6), min_size=1, max_size=3).map(
    lambda parts: "-".join(parts) + ".slice"
)
FILE = st.sampled_from(["cpu.shares", "cpu.max", "memory.min", "cgroup.procs", None])


def expected(fs: CgroupFS, controller: str, parent: str, file: str | None) -> Path:
    base = fs.root / controller if fs.version is CgroupVersion.V1 else fs.root
    relative = parent_path(parent)
    directory = base / relative if relative else base
    return directory / file if file is not None else directory


@settings(max_examples=30, deadline=None)
@given(
    tree=st.sampled_from(TREES),
    parent=st.one_of(CGROUPFS_PARENT, SLICE),
    controller=st.sampled_from(["cpu", "memory"]),
    file=FILE,
)
def test_a_path_is_pathlibs_join_asked_once_or_again(
    tree: tuple[int, str], parent: str, controller: str, file: str | None
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        fs = fake_tree(tree, Path(scratch) / "cgroup").fs()
        want = expected(fs, controller, parent, file)
        assert fs.path(controller, parent, None, file) == want
        assert fs.path(controller, parent, None, file) == want  # remembered
        assert isinstance(fs.path(controller, parent, None, file), Path)


@settings(max_examples=15, deadline=None)
@given(tree=st.sampled_from(TREES), uid=st.text("abcdef0123456789", min_size=1, max_size=16))
def test_pod_paths_reads_and_writes_go_to_the_joined_path(tree: tuple[int, str], uid: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        fake = fake_tree(tree, Path(scratch) / "cgroup")
        parent = fake.add_pod(uid, "besteffort")
        fs = fake.fs()
        file = "cpu.shares" if fs.version is CgroupVersion.V1 else "cpu.weight"
        want = expected(fs, "cpu", parent, file)
        assert fs.pod_path("cpu", parent, None, file) == want
        assert fs.exists(parent) and fs.has_file("cpu", file, parent)
        assert not fs.has_file("cpu", "cpu.no_such_file", parent)
        fs.write("cpu", file, 7, parent)
        assert want.read_text().strip() == "7" == fs.read("cpu", file, parent)


def test_a_bad_parent_is_refused_each_time_it_is_asked(tmp_path: Path) -> None:
    fs = fake_tree(TREES[0], tmp_path / "cgroup").fs()
    for _ in range(2):  # failures are not remembered
        with pytest.raises(CgroupPathError, match=r"'\.\.' segment"):
            fs.path("cpu", "/kubepods/../x")
    with pytest.raises(CgroupPathError, match="must be a string"):
        parent_path(["/kubepods"])  # type: ignore[arg-type]


@settings(max_examples=15, deadline=None)
@given(
    tree=st.sampled_from(TREES),
    uids=st.lists(st.text("abcdef0123456789", min_size=1, max_size=8), min_size=2, max_size=4, unique=True),
)
def test_retaining_the_live_pods_drops_the_others_paths(tree: tuple[int, str], uids: list[str]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        fake = fake_tree(tree, Path(scratch) / "cgroup")
        parents = [fake.add_pod(uid, "besteffort") for uid in uids]
        fs = fake.fs()
        for parent in parents:
            fs.pod_path("cpu", parent)
        gone, *live = parents
        assert fs.retain(live) > 0
        assert {key[2] for key in fs._paths} == set(live)
        # the dropped pod's paths are built and checked again alike
        assert fs.pod_path("cpu", gone) == expected(fs, "cpu", gone, None)
        assert all(fs.pod_path("cpu", parent) == expected(fs, "cpu", parent, None) for parent in live)
