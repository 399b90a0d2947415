"""What CgroupFS remembers to spare syscalls on a pod start, and where it must look again: a
container's cgroup once found (not before), the pod roots' answer per parent, and files that are
never resolved (a link is no cgroup file)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
from fake_trees import TREES, fake_tree, tree_id
from hypothesis import given, settings
from hypothesis import strategies as st
from runtimeproxy.hooks.cgroups import CgroupVersion, PodRoots
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup

CID = "c" * 64


@pytest.fixture(params=TREES, ids=tree_id)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    return fake_tree(request.param, tmp_path / "cgroup")


def shares_file(tree: FakeCgroup) -> str:
    return "cpu.shares" if tree.version is CgroupVersion.V1 else "cpu.weight"


def test_a_container_cgroup_made_after_a_first_look_is_found(tree: FakeCgroup) -> None:
    parent = tree.add_pod("p1", "besteffort")
    fs = tree.fs()
    assert not fs.exists(parent, CID)  # not there yet: the driver's naming, not remembered
    assert not fs.has_file("cpu", shares_file(tree), parent, CID)
    # CRI-O's naming, the driver's second choice: a remembered first answer would miss it
    made = tree.add_container(parent, CID, "crio")
    assert fs.exists(parent, CID)
    assert fs.path("cpu", parent, CID).name == made[0].name == tree.container_dir_name(CID, "crio")
    assert fs.has_file("cpu", shares_file(tree), parent, CID)


def test_a_found_container_cgroup_that_goes_is_missing_not_stale(tree: FakeCgroup) -> None:
    parent = tree.add_pod("p2", "besteffort")
    tree.add_container(parent, CID)
    fs = tree.fs()
    directory = fs.path("cpu", parent, CID)
    assert fs.exists(parent, CID)
    assert fs.read("cpu", "cgroup.procs", parent, CID) == ""
    for made in sorted(Path(tree.root).rglob(tree.container_dir_name(CID))):  # every hierarchy's copy
        if made.is_symlink() or not made.exists():  # v1: reached again through cpu -> cpu,cpuacct
            continue
        for file in made.iterdir():
            file.unlink()
        made.rmdir()
    assert not fs.exists(parent, CID)
    assert not fs.has_file("cpu", shares_file(tree), parent, CID)
    with pytest.raises(FileNotFoundError):
        fs.read("cpu", "cgroup.procs", parent, CID)
    assert fs.path("cpu", parent, CID) == directory


def test_retaining_the_live_pods_drops_the_gone_pods_containers(tree: FakeCgroup) -> None:
    gone, live = tree.add_pod("gone", "besteffort"), tree.add_pod("live", "besteffort")
    for parent in (gone, live):
        tree.add_container(parent, CID)
    fs = tree.fs()
    for parent in (gone, live):
        assert fs.exists(parent, CID)
    fs.retain([live])
    assert {key[1] for key in fs._container_dirs} == {live}
    assert {key[2] for key in fs._paths} == {live}
    assert fs.exists(gone, CID) and fs.exists(live, CID)  # looked up again alike


def test_a_file_that_is_a_link_is_no_cgroup_file(tree: FakeCgroup, tmp_path: Path) -> None:
    parent = tree.add_pod("p3", "besteffort")
    fs = tree.fs()
    directory = fs.path("cpu", parent)
    outside = tmp_path / "outside"
    outside.write_text("secret\n")
    (directory / "cpu.linked").symlink_to(outside)
    assert not fs.has_file("cpu", "cpu.linked", parent)
    with pytest.raises(OSError) as raised:
        fs.read("cpu", "cpu.linked", parent)
    assert raised.value.errno == errno.ELOOP
    assert fs.has_file("cpu", shares_file(tree), parent)


def test_a_missing_file_is_missing_each_time(tree: FakeCgroup) -> None:
    parent = tree.add_pod("p4", "besteffort")
    fs = tree.fs()
    assert not fs.has_file("cpu", "cpu.later", parent)
    (fs.path("cpu", parent) / "cpu.later").write_text("1\n")
    assert fs.has_file("cpu", "cpu.later", parent)
    assert fs.read("cpu", "cpu.later", parent) == "1"


ROOTS = st.sampled_from([("/kubepods",), ("kubepods.slice",), ("/kubepods", "kubepods.slice"), ("/custom/kubepods",)])
SEGMENTS = st.sampled_from(["kubepods", "burstable", "besteffort", "pod1", "custom", "..", ".", "", "kubepods.slice"])
PARENTS = st.one_of(
    st.lists(SEGMENTS, max_size=4).map("/".join),
    st.sampled_from(["kubepods-burstable.slice", "kubepods-burstable-pod1.slice", "kubepods-besteffort.slice"]),
    st.text(max_size=20),
)


@settings(max_examples=200, deadline=None)
@given(roots=ROOTS, parents=st.lists(PARENTS, min_size=1, max_size=6))
def test_the_pod_roots_answer_a_parent_alike_asked_once_or_again(roots: tuple[str, ...], parents: list[str]) -> None:
    remembering = PodRoots(roots)
    for parent in parents + parents:
        assert remembering.problem(parent) == PodRoots(roots).problem(parent)


def test_the_pod_roots_answer_a_non_string_parent_without_remembering_it() -> None:
    roots = PodRoots()
    assert roots.problem(["/kubepods"]) is not None  # type: ignore[arg-type]
    assert roots._answers == {}


@settings(max_examples=20, deadline=None)
@given(tree=st.sampled_from(TREES), runtime=st.sampled_from(["containerd", "crio", "docker"]))
def test_a_container_path_is_the_same_asked_once_or_again(tree: tuple[int, str], runtime: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        fake = fake_tree(tree, Path(scratch) / "cgroup")
        parent = fake.add_pod("p5", "burstable")
        fake.add_container(parent, CID, runtime)  # type: ignore[arg-type]
        fs = fake.fs()
        first = [fs.path("cpu", parent, CID, file) for file in (None, "cgroup.procs")]
        again = [fs.path("cpu", parent, CID, file) for file in (None, "cgroup.procs")]
        name = fake.container_dir_name(CID, runtime)  # type: ignore[arg-type]
        assert first == again == [fs.path("cpu", parent) / name, fs.path("cpu", parent) / name / "cgroup.procs"]
        assert os.path.isdir(first[0])
