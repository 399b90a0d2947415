"""Cgroup membership of a process (hooks/nri/membership.py): any ids and any /proc/<pid>/cgroup
content, and a process counts as the container's only when a line shows the container's own cgroup."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from runtimeproxy.hooks.cgroups import CONTAINER_DIR_FORMATS
from runtimeproxy.hooks.nri.membership import ContainerCgroup, cgroup_paths

# Names as cgroup directories and container ids have them, short so that collisions happen.
names = st.text(st.sampled_from("abc19-_.:"), min_size=1, max_size=6).filter(lambda n: n not in (".", ".."))
ids = st.one_of(names, st.sampled_from(["cpu", "memory", "pids", "kubepods", "system.slice", "c0ffee" * 10]))
paths = st.lists(st.one_of(names, ids), max_size=5)


def line(index: int, components: list[str], controllers: str = "cpu,cpuacct") -> str:
    return f"{index}:{controllers}:/" + "/".join(components)


@st.composite
def proc_files(draw: st.DrawFn, extra: list[list[str]] | None = None) -> tuple[str, list[list[str]]]:
    """A /proc/<pid>/cgroup file of random v1 and v2 lines (and ``extra`` paths); its paths' components."""
    shown = draw(st.lists(paths, max_size=4)) + (extra or [])
    shown = draw(st.permutations(shown))
    lines = [line(i if i % 2 else 0, p, "" if i % 2 == 0 else "memory") for i, p in enumerate(shown)]
    return "\n".join(lines) + "\n", shown


@st.composite
def containers(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    """(container id, cgroups path as the runtime gives it, the components of the cgroup it names),
    in the cgroupfs and the systemd form; the expected path is built here, apart from the code."""
    container_id = draw(ids)
    if draw(st.booleans()):
        own = [*draw(paths), container_id]
        return container_id, "/" + "/".join(own), own
    assume(not container_id.endswith(".slice") and ":" not in container_id)
    slice_parts = draw(st.lists(st.text(st.sampled_from("ab1_"), min_size=1, max_size=4), min_size=1, max_size=3))
    prefix = draw(st.sampled_from(["cri-containerd", "crio"]))
    nested = ["-".join(slice_parts[: i + 1]) + ".slice" for i in range(len(slice_parts))]
    return container_id, f"{nested[-1]}:{prefix}:{container_id}", [*nested, f"{prefix}-{container_id}.scope"]


@given(containers(), st.data())
def test_a_container_holds_exactly_the_processes_shown_in_its_cgroup(
    container: tuple[str, str, list[str]], data: st.DataObject
) -> None:
    container_id, cgroups_path, own = container
    cgroup = ContainerCgroup.of(container_id, cgroups_path)
    text, shown = data.draw(proc_files())
    assert cgroup.holds(text) == (own in shown)
    # and with the container's own line among any others, always
    text, _ = data.draw(proc_files(extra=[own]))
    assert cgroup.holds(text)


@given(containers(), paths, st.data())
def test_the_id_anywhere_but_as_the_container_path_never_matches(
    container: tuple[str, str, list[str]], elsewhere: list[str], data: st.DataObject
) -> None:
    container_id, cgroups_path, own = container
    cgroup = ContainerCgroup.of(container_id, cgroups_path)
    leaf = own[-1]
    decoys = [
        [*elsewhere, leaf, *data.draw(paths)],  # the container's directory name somewhere else
        [*elsewhere, container_id],
        [*own[:-1], leaf + data.draw(names)],  # inside a longer name
        [*own[:-1], data.draw(names) + leaf],
        [*own, data.draw(names)],  # below the container's cgroup
        own[:-1],  # its pod's
    ]
    decoys = [d for d in decoys if d != own]
    text = "\n".join(line(i, d) for i, d in enumerate(decoys)) + "\n" + container_id + "\n"
    assert not cgroup.holds(text)


@given(ids, st.data())
def test_without_a_cgroups_path_only_the_runtimes_names_for_the_container_match(
    container_id: str, data: st.DataObject
) -> None:
    cgroup = ContainerCgroup.of(container_id, "")
    text, shown = data.draw(proc_files())
    leaves = {fmt.format(id=container_id) for fmts in CONTAINER_DIR_FORMATS.values() for fmt in fmts}
    assert cgroup.holds(text) == any(p and p[-1] in leaves for p in shown)


@given(st.text(max_size=300), ids, st.sampled_from(["", "/kubepods/x", "rel/x", "-.slice:p:x"]))
def test_any_file_content_gives_an_answer(text: str, container_id: str, cgroups_path: str) -> None:
    assert ContainerCgroup.of(container_id, cgroups_path).holds(text) in (True, False)
    assert all(path.startswith("/") for path in cgroup_paths(text))


def test_a_namespaced_view_shows_the_tail_of_the_path() -> None:
    cgroup = ContainerCgroup.of("c1", "/kubepods/besteffort/pod1/c1")
    assert cgroup.holds("0::/../../besteffort/pod1/c1\n")
    assert cgroup.holds("0::/../c1\n")
    assert not cgroup.holds("0::/../../burstable/pod1/c1\n")  # a tail, but not this container's
    assert not cgroup.holds("0::/../..\n")


def test_a_relative_cgroups_path_is_below_some_parent() -> None:
    cgroup = ContainerCgroup.of("c1", "pods/c1")
    assert cgroup.holds("0::/system.slice/containerd.service/pods/c1\n")
    assert cgroup.holds("0::/pods/c1\n")
    assert not cgroup.holds("0::/system.slice/c1\n") and not cgroup.holds("0::/pods/c1/sub\n")


@pytest.mark.parametrize("bad", ["a.slice:b", "a.slice:p:", "a/b.slice:p:x", "a--b.slice:p:x", "a.slice:p:x/y"])
def test_a_systemd_path_runc_would_refuse_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"cgroups path"):
        ContainerCgroup.of("x", bad)
