"""Merge rules and validation of hook responses."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.hookapi import resource_fields
from runtimeproxy.hookapi.merge_rules import (
    CgroupDriver,
    CgroupForm,
    merge_env,
    merge_map,
    merge_resources,
    parent_form,
    pod_cgroup_driver,
    validate_cgroup_parent,
)

keys = st.text(alphabet="abcdefgh_/.", min_size=1, max_size=6)
values = st.text(alphabet="xyz=/ ", max_size=6)
maps = st.dictionaries(keys, values, max_size=8)
env_keys = st.sampled_from(["A", "B", "C", "PATH", "HOME", "X_1"])
env_values = st.binary(max_size=8) | st.just(b"a=b=c") | st.just(b"=")
envs = st.lists(st.tuples(env_keys, env_values), max_size=8)


# --- merge_map -----------------------------------------------------------------------------


@given(maps, maps)
def test_merge_map_sets_changes_and_keeps_unrelated_keys(target: dict[str, str], changes: dict[str, str]) -> None:
    original = dict(target)
    made = merge_map(target, changes)
    assert target == original | changes
    assert made == {k: (original.get(k), v) for k, v in changes.items() if original.get(k) != v}


@given(maps, maps)
def test_merge_map_is_idempotent(target: dict[str, str], changes: dict[str, str]) -> None:
    merge_map(target, changes)
    once = dict(target)
    assert merge_map(target, changes) == {}
    assert target == once


def test_merge_map_on_a_protobuf_map() -> None:
    config = cri.PodSandboxConfig(labels={"a": "1", "b": "2"})
    made = merge_map(config.labels, {"b": "3", "c": "4", "a": "1"})
    assert dict(config.labels) == {"a": "1", "b": "3", "c": "4"}
    assert made == {"b": ("2", "3"), "c": (None, "4")}


# --- merge_env -----------------------------------------------------------------------------


def test_merge_env_examples() -> None:
    env = [("A", b"1"), ("B", b"x=y"), ("A", b"2"), ("C", b"3")]
    merged, made = merge_env(env, [("D", b"k=v=w"), ("A", b"9"), ("E", b""), ("C", b"3")])
    assert merged == [("A", b"9"), ("B", b"x=y"), ("A", b"9"), ("C", b"3"), ("D", b"k=v=w"), ("E", b"")]
    assert made == {"A": (b"2", b"9"), "D": (None, b"k=v=w"), "E": (None, b"")}


def test_merge_env_repeated_name_in_response_last_wins_at_first_position() -> None:
    merged, made = merge_env([("A", "1")], [("N", "x"), ("B", "y"), ("N", "z")])
    assert merged == [("A", "1"), ("N", "z"), ("B", "y")]
    assert made == {"N": (None, "z"), "B": (None, "y")}


def test_merge_env_unifies_differing_duplicates() -> None:
    # The effective (last) value already matches, but the first occurrence still changes.
    merged, made = merge_env([("A", "1"), ("A", "2")], [("A", "2")])
    assert merged == [("A", "2"), ("A", "2")]
    assert made == {"A": ("2", "2")}


def test_merge_env_accepts_a_mapping_items() -> None:
    merged, _ = merge_env([("A", "1")], {"B": "2", "A": "3"}.items())
    assert merged == [("A", "3"), ("B", "2")]


@given(envs, envs)
def test_merge_env_properties(env: list[tuple[str, bytes]], changes: list[tuple[str, bytes]]) -> None:
    merged, made = merge_env(env, changes)
    final = dict(changes)  # the last value of each changed name
    # Existing entries keep their positions (and so their order); only values change.
    assert [k for k, _ in merged[: len(env)]] == [k for k, _ in env]
    for (key, value), (_, old) in zip(merged, env, strict=False):
        assert value == final.get(key, old)  # untouched values, '=' included, survive as is
    # New names are appended once each, in the response's order.
    existing = {k for k, _ in env}
    new_names = list(dict.fromkeys(k for k, _ in changes if k not in existing))
    assert merged[len(env) :] == [(k, final[k]) for k in new_names]
    # No name is lost.
    assert {k for k, _ in env} <= {k for k, _ in merged}
    assert set(made) <= set(final)
    assert all(new == final[k] for k, (_, new) in made.items())


@given(envs, envs)
def test_merge_env_is_idempotent(env: list[tuple[str, bytes]], changes: list[tuple[str, bytes]]) -> None:
    once, _ = merge_env(env, changes)
    twice, made = merge_env(once, changes)
    assert twice == once
    assert made == {}


# --- merge_resources ---------------------------------------------------------------------------

SCALARS = resource_fields.INTS
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
small_ints = st.sampled_from([0, 0, -1, 2, 1000, 100_000])
cpusets = st.sampled_from(["", "", "0", "0-3", "1,3"])
hugepages = st.lists(
    st.tuples(st.sampled_from(["2MB", "1GB"]), st.integers(min_value=0, max_value=2**64 - 1)), max_size=2
)


@st.composite
def resources(draw: st.DrawFn, message: type = cri.LinuxContainerResources) -> object:
    res = message(
        **{name: draw(small_ints | int64s) for name in SCALARS},
        **{name: draw(cpusets) for name in resource_fields.STRINGS},
        unified=draw(st.dictionaries(st.sampled_from(["memory.high", "cpu.max", "io.weight"]), values, max_size=2)),
    )
    for page_size, limit in draw(hugepages):
        res.hugepage_limits.add(page_size=page_size, limit=limit)
    return res


@given(resources(), resources(hook.LinuxContainerResources))
def test_merge_resources_changes_only_set_fields(target: cri.LinuxContainerResources, changes: object) -> None:
    assert isinstance(changes, hook.LinuxContainerResources)
    before = cri.LinuxContainerResources()
    before.CopyFrom(target)
    made = merge_resources(target, changes)
    for name in resource_fields.SCALARS:
        expected = getattr(changes, name) or getattr(before, name)  # zero / "" leaves the field alone
        assert getattr(target, name) == expected
        assert (name in made) == (getattr(target, name) != getattr(before, name))
    pages = [(h.page_size, h.limit) for h in changes.hugepage_limits] or [
        (h.page_size, h.limit) for h in before.hugepage_limits
    ]
    assert [(h.page_size, h.limit) for h in target.hugepage_limits] == pages
    assert dict(target.unified) == dict(before.unified) | dict(changes.unified)


@given(resources(), resources())
def test_merge_resources_twice_equals_once(target: cri.LinuxContainerResources, changes: object) -> None:
    assert isinstance(changes, cri.LinuxContainerResources)
    merge_resources(target, changes)
    once = target.SerializeToString(deterministic=True)
    assert merge_resources(target, changes) == {}
    assert target.SerializeToString(deterministic=True) == once


@given(resources())
def test_merging_an_empty_answer_changes_nothing(target: cri.LinuxContainerResources) -> None:
    before = target.SerializeToString(deterministic=True)
    assert merge_resources(target, hook.LinuxContainerResources()) == {}
    assert target.SerializeToString(deterministic=True) == before


def test_merge_resources_reports_changes() -> None:
    target = cri.LinuxContainerResources(cpu_shares=2, oom_score_adj=5, unified={"memory.high": "1"})
    target.hugepage_limits.add(page_size="2MB", limit=1)
    changes = hook.LinuxContainerResources(cpu_shares=1024, cpuset_cpus="0-1", unified={"memory.high": "2"})
    changes.hugepage_limits.add(page_size="1GB", limit=2)
    assert merge_resources(target, changes) == {
        "cpu_shares": (2, 1024),
        "cpuset_cpus": ("", "0-1"),
        "hugepage_limits": ([("2MB", 1)], [("1GB", 2)]),
        "unified[memory.high]": ("1", "2"),
    }
    assert target.oom_score_adj == 5  # 0 in the answer: cannot reset it


# --- validate_cgroup_parent -----------------------------------------------------------------------

ROOTS = ["/kubepods"]
DEFAULT_ROOTS = ["/kubepods", "kubepods.slice"]


def check(parent: str, roots: list[str] = ROOTS) -> str | None:
    """The path rules alone: under the driver the parent's own form is written for."""
    return validate_cgroup_parent(parent, roots, parent_form(parent) or "cgroupfs")


@pytest.mark.parametrize(
    "parent",
    [
        "/kubepods/burstable",
        "/kubepods/burstable/pod1",
        "kubepods-burstable.slice",
        "kubepods-burstable-pod1_2.slice",
        "/kubepods/a b",
    ],
)
def test_cgroup_parent_accepted(parent: str) -> None:
    assert check(parent) is None


@pytest.mark.parametrize(
    ("parent", "reason"),
    [
        ("", "empty"),
        ("/kubepods", "not under an allowed root"),  # the root itself is no pod's cgroup
        ("kubepods.slice", "not a slice of an allowed root"),
        ("/kubepodsX", "not under an allowed root"),
        ("/kubepodsX/burstable", "not under an allowed root"),
        ("/", "not under an allowed root"),
        ("/system.slice", "not under an allowed root"),
        ("/kubepods/", "not a normalized path"),
        ("/kubepods//pod1", "not a normalized path"),
        ("/kubepods/./pod1", "not a normalized path"),
        ("/kubepods/../etc", "not a normalized path"),
        ("/kubepods/..", "not a normalized path"),
        ("//kubepods", "not a normalized path"),
        ("/kubepods/" + "a" * 256, "longer than 255"),
        ("/kubepods" + "/a" * 2000, "longer than 3840 bytes"),
        ("kubepods", "neither an absolute cgroupfs path nor a systemd slice name"),
        ("kubepods/burstable", "neither"),
        ("../kubepods", "neither"),
        ("kubepods/x.slice", "neither"),
        ("kubepodsX.slice", "not a slice of an allowed root"),
        ("kubepodsX-a.slice", "not a slice of an allowed root"),
        ("system.slice", "not a slice of an allowed root"),
        ("-.slice", "not a valid systemd slice name"),
        ("kubepods-.slice", "not a valid systemd slice name"),
        ("kubepods--a.slice", "not a valid systemd slice name"),
        ("-kubepods.slice", "not a valid systemd slice name"),
        ("kube pods.slice", "not a valid systemd slice name"),
        ("/kubepods/pod\n1", "control characters"),
        ("/kubepods/pod\x001", "control characters"),
        ("kubepods-a\x7f.slice", "control characters"),
    ],
)
def test_cgroup_parent_rejected(parent: str, reason: str) -> None:
    problem = check(parent)
    assert problem is not None
    assert reason in problem


def test_long_parents_are_cut_in_messages() -> None:
    problem = check("/elsewhere/" + "x" * 5000)
    assert problem is not None and len(problem) < 300 and "...(+4951 chars)" in problem


# -- the node's cgroup driver --


@pytest.mark.parametrize(
    ("parent", "form"),
    [
        ("/kubepods/burstable/pod1", "cgroupfs"),
        ("/", "cgroupfs"),
        ("kubepods-burstable-pod1.slice", "systemd"),
        ("kubepods", None),
        ("kubepods/x.slice", None),
        ("", None),
    ],
)
def test_parent_form(parent: str, form: str | None) -> None:
    assert parent_form(parent) == form


@pytest.mark.parametrize(
    ("driver", "pod_parent", "wanted"),
    [
        ("auto", "/kubepods/besteffort/pod1", "cgroupfs"),
        ("auto", "kubepods-besteffort-pod1.slice", "systemd"),
        ("auto", "", None),  # no parent from kubelet: unknown
        ("auto", "weird", None),
        ("systemd", "/kubepods/besteffort/pod1", "systemd"),  # the configured driver wins
        ("cgroupfs", "", "cgroupfs"),
    ],
)
def test_pod_cgroup_driver(driver: CgroupDriver, pod_parent: str, wanted: str | None) -> None:
    assert pod_cgroup_driver(driver, pod_parent) == wanted


def test_the_other_form_is_refused() -> None:
    # An escape to guard against: a slice answered on a cgroupfs node landed outside /kubepods.
    problem = validate_cgroup_parent("kubepods-besteffort.slice", DEFAULT_ROOTS, "cgroupfs")
    assert problem is not None and "systemd slice" in problem and "cgroupfs cgroup driver" in problem
    problem = validate_cgroup_parent("/kubepods/besteffort", DEFAULT_ROOTS, "systemd")
    assert problem is not None and "cgroupfs path" in problem and "systemd cgroup driver" in problem
    assert validate_cgroup_parent("/kubepods/besteffort", DEFAULT_ROOTS, "cgroupfs") is None
    assert validate_cgroup_parent("kubepods-besteffort.slice", DEFAULT_ROOTS, "systemd") is None


def test_unknown_driver_refuses_every_parent() -> None:
    for parent in ("/kubepods/besteffort", "kubepods-besteffort.slice"):
        problem = validate_cgroup_parent(parent, DEFAULT_ROOTS, None)
        assert problem is not None and "--cgroup-driver" in problem


def test_systemd_path_of_the_default_slice_root_is_not_a_cgroupfs_parent() -> None:
    # kubepods.slice names kubelet's /kubepods; /kubepods.slice/... is outside it on a cgroupfs node.
    problem = validate_cgroup_parent("/kubepods.slice/kubepods-besteffort.slice", DEFAULT_ROOTS, "cgroupfs")
    assert problem is not None and "not under an allowed root" in problem


@pytest.mark.parametrize(
    ("roots", "accepted", "rejected"),
    [
        (
            ["/kubepods/burstable"],
            ["/kubepods/burstable/p", "kubepods-burstable-p.slice"],
            ["/kubepods", "kubepods.slice"],
        ),
        (
            ["kubepods.slice"],
            ["/kubepods/besteffort", "kubepods-besteffort.slice"],
            ["/kubepods", "kubepods.slice", "/kubepods.slice/kubepods-burstable.slice", "/kubepodsX"],
        ),
        (
            ["kubepods-burstable.slice"],
            ["/kubepods/burstable/x", "kubepods-burstable-pod1.slice"],
            ["/kubepods", "kubepods-besteffort.slice", "/kubepods.slice/kubepods-burstable.slice"],
        ),
        (["/kubepods.slice"], ["/kubepods.slice/x", "kubepods-x.slice"], ["/kubepods"]),
        (
            ["/kubepods.slice/kubepods-burstable.slice"],
            ["/kubepods.slice/kubepods-burstable.slice/x", "kubepods-burstable-x.slice"],
            ["/kubepods/burstable", "kubepods-besteffort.slice"],
        ),
        # kubelet's escaping: a '-' inside a path segment is '_' in the slice name, and back.
        (["/kube-pods"], ["/kube-pods/x", "kube_pods-x.slice"], ["kube-pods-x.slice", "/kube"]),
        (["kube_pods.slice"], ["/kube-pods/x", "kube_pods-x.slice"], ["/kube_pods", "kube-pods.slice"]),
        (["/"], ["/anything/at/all", "system.slice"], ["/", "/a/../b"]),
        (["/a", "/b"], ["/a/x", "/b/y", "a-x.slice", "b-y.slice"], ["/b", "b.slice", "/c", "c.slice"]),
        ([], [], ["/kubepods", "kubepods.slice"]),
    ],
)
def test_cgroup_roots(roots: list[str], accepted: list[str], rejected: list[str]) -> None:
    for parent in accepted:
        assert check(parent, roots) is None, parent
    for parent in rejected:
        assert check(parent, roots) is not None, parent


@pytest.mark.parametrize("root", ["", "kubepods", "relative/path", "/kubepods/../etc", "/./kubepods"])
def test_bad_roots_are_configuration_errors(root: str) -> None:
    with pytest.raises(ValueError, match="allowed cgroup root"):
        validate_cgroup_parent("/kubepods", [root], "cgroupfs")


# -- properties: an accepted parent never leaves its root --

names = st.sampled_from(["kubepods", "burstable", "pod1", "kube-pods", "kube_pods", "a", "kubepodsX"])
segments = st.sampled_from(["kubepods", "burstable", "pod1", "..", ".", "", "kubepodsX", "etc", "...", "a..b"])


@st.composite
def roots(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A root, written as a path or as a slice, with the kubelet cgroup name it denotes."""
    name = draw(st.lists(names, min_size=1, max_size=3))
    if draw(st.booleans()):
        return "/" + "/".join(name), name
    # A slice name cannot tell "_" from "-": kubelet reads every "_" back as "-".
    return "-".join(part.replace("-", "_") for part in name) + ".slice", [part.replace("_", "-") for part in name]


def slice_path(slice_name: str) -> list[str]:
    """Where systemd puts a slice: a-b-c.slice -> [a.slice, a-b.slice, a-b-c.slice]."""
    parts = slice_name.removesuffix(".slice").split("-")
    return ["-".join(parts[: i + 1]) + ".slice" for i in range(len(parts))]


@given(roots(), st.booleans(), st.lists(segments | names, max_size=5))
def test_cgroupfs_parent_stays_under_its_root(root: tuple[str, list[str]], under: bool, parts: list[str]) -> None:
    text, name = root
    parent = "/" + "/".join([*name, *parts] if under else parts)  # often under the root, then anything
    if validate_cgroup_parent(parent, [text], "cgroupfs") is not None:
        return
    mount = "/sys/fs/cgroup/cpu"
    where = posixpath.normpath(posixpath.join(mount, parent.lstrip("/")))
    assert posixpath.normpath(parent) == parent
    assert (where + "/").startswith(posixpath.join(mount, *name) + "/")


@given(roots(), st.booleans(), st.lists(names | st.sampled_from(["", "x", "..", "a.b"]), min_size=1, max_size=4))
def test_slice_parent_stays_under_its_root(root: tuple[str, list[str]], under: bool, parts: list[str]) -> None:
    text, name = root
    stem = [part.replace("-", "_") for part in name]
    parent = "-".join([*stem, *parts] if under else parts) + ".slice"
    if validate_cgroup_parent(parent, [text], "systemd") is not None:
        return
    wanted = slice_path("-".join(stem) + ".slice")
    assert slice_path(parent)[: len(wanted)] == wanted


@given(st.text(max_size=30), st.sampled_from(["cgroupfs", "systemd"]))
def test_arbitrary_text_never_escapes(parent: str, driver: CgroupForm) -> None:
    if validate_cgroup_parent(parent, ROOTS, driver) is not None:
        return
    assert parent_form(parent) == driver  # never the other driver's form
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in parent)
    if driver == "cgroupfs":
        assert posixpath.normpath(parent) == parent
        assert ".." not in parent.split("/")
        assert parent == "/kubepods" or parent.startswith("/kubepods/")
    else:
        assert "/" not in parent
        assert parent == "kubepods.slice" or parent.startswith("kubepods-")
