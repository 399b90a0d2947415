"""Merge rules and validation of hook responses."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.dispatch.merge import (
    MAX_CPUSET_ID,
    format_cpuset,
    merge_env,
    merge_map,
    merge_resources,
    parse_cpuset,
    validate_cgroup_parent,
    validate_env,
    validate_resources,
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


def test_validate_env() -> None:
    assert validate_env([("A", b"x=y"), ("B", "")]) == []
    problems = validate_env([("", b""), ("A=B", b""), ("A\0", ""), ("C", b"\0"), ("D", "a\0")])
    assert len(problems) == 5


# --- merge_resources ---------------------------------------------------------------------------

SCALARS = (
    "cpu_period",
    "cpu_quota",
    "cpu_shares",
    "memory_limit_in_bytes",
    "oom_score_adj",
    "memory_swap_limit_in_bytes",
)
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
        cpuset_cpus=draw(cpusets),
        cpuset_mems=draw(cpusets),
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
    for name in (*SCALARS, "cpuset_cpus", "cpuset_mems"):
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


# --- cpusets -----------------------------------------------------------------------------------

cpu_sets = st.frozensets(st.integers(min_value=0, max_value=MAX_CPUSET_ID), max_size=40) | st.frozensets(
    st.integers(min_value=0, max_value=70), max_size=60
)


@given(cpu_sets)
def test_cpuset_round_trip_and_output_validates(cpus: frozenset[int]) -> None:
    text = format_cpuset(cpus)
    assert parse_cpuset(text) == cpus
    assert validate_resources(hook.LinuxContainerResources(cpuset_cpus=text, cpuset_mems=text)) == []
    assert format_cpuset(parse_cpuset(text)) == text  # canonical


@pytest.mark.parametrize(
    ("cpus", "text"),
    [(set(), ""), ({0}, "0"), ({0, 1}, "0-1"), ({0, 1, 2, 5}, "0-2,5"), ({7, 3, 4, 9, 10, 11}, "3-4,7,9-11")],
)
def test_format_cpuset(cpus: set[int], text: str) -> None:
    assert format_cpuset(cpus) == text


@pytest.mark.parametrize(
    ("text", "cpus"), [("0", {0}), ("0-3", {0, 1, 2, 3}), ("3,1-2,2", {1, 2, 3}), ("5-5", {5}), ("007", {7})]
)
def test_parse_cpuset(text: str, cpus: set[int]) -> None:
    assert parse_cpuset(text) == cpus


@pytest.mark.parametrize(
    "text",
    [
        "0,",
        ",0",
        "0,,1",
        " 0",
        "0 ",
        "0 - 3",
        "-1",
        "3-1",
        "a",
        "1-",
        "0-31:2/8",
        "٣",
        "1_0",
        "+1",
        "65536",
        "0-65536",
        "0x1",
        "1.0",
    ],
)
def test_parse_cpuset_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpuset(text)


def test_cpuset_upper_bound_edge() -> None:
    assert parse_cpuset(str(MAX_CPUSET_ID)) == {MAX_CPUSET_ID}
    with pytest.raises(ValueError):
        format_cpuset([MAX_CPUSET_ID + 1])
    with pytest.raises(ValueError):
        format_cpuset([-1])


# --- validate_resources --------------------------------------------------------------------------


def problems_for(**fields: object) -> list[str]:
    return validate_resources(hook.LinuxContainerResources(**fields))  # type: ignore[arg-type]


def test_unset_resources_are_valid() -> None:
    assert validate_resources(hook.LinuxContainerResources()) == []


@pytest.mark.parametrize(
    ("field", "good", "bad"),
    [
        ("cpu_period", [1000, 100_000, 1_000_000], [999, 1_000_001, -1]),
        ("cpu_quota", [-1, 1000, 10**12], [-2, 1, 999]),
        ("cpu_shares", [2, 1024, 262_144], [1, 262_145, -1]),
        ("oom_score_adj", [-1000, -1, 1, 1000], [-1001, 1001]),
        ("memory_limit_in_bytes", [1, 2**63 - 1], [-1, -(2**63)]),
        ("memory_swap_limit_in_bytes", [-1, 1, 2**63 - 1], [-2, -(2**63)]),
        ("cpuset_cpus", ["0", "0-65535", "1,3-4"], ["0-", "a", "65536", "1 ,2"]),
        ("cpuset_mems", ["0", "0-1"], ["1-0", " "]),
    ],
)
def test_validation_bounds(field: str, good: list[object], bad: list[object]) -> None:
    for value in good:
        assert problems_for(**{field: value}) == [], value
    for value in bad:
        [problem] = problems_for(**{field: value})
        assert field in problem, problem


def test_swap_must_not_be_below_memory_when_both_are_set() -> None:
    assert problems_for(memory_limit_in_bytes=100, memory_swap_limit_in_bytes=100) == []
    assert problems_for(memory_limit_in_bytes=100, memory_swap_limit_in_bytes=-1) == []
    [problem] = problems_for(memory_limit_in_bytes=100, memory_swap_limit_in_bytes=99)
    assert "below memory_limit_in_bytes" in problem


@pytest.mark.parametrize(
    "key", ["memory.high", "cpu.max", "io.weight", "memory.oom.group", "hugetlb.2MB.max", "cpu.uclamp.min", "rdma.max"]
)
def test_unified_keys_accepted(key: str) -> None:
    assert problems_for(unified={key: "1"}) == []


@pytest.mark.parametrize(
    "key",
    [
        "memory",
        "",
        ".high",
        "memory.",
        "memory..high",
        "../memory.high",
        "memory/high",
        "a/memory.high",
        "Memory.high",
        "memory.high ",
        "cgroup.procs",
        "cgroup.kill",
        "memory.hi\nh",
    ],
)
def test_unified_keys_rejected(key: str) -> None:
    [problem] = problems_for(unified={key: "1"})
    assert repr(key) in problem


def test_unified_value_nul_rejected() -> None:
    assert problems_for(unified={"memory.high": "1\0"}) != []


@pytest.mark.parametrize("size", ["2MB", "1GB", "64KB", "16GB", "512MB", "1TB"])
def test_hugepage_sizes_accepted(size: str) -> None:
    assert problems_for(hugepage_limits=[hook.HugepageLimit(page_size=size, limit=1)]) == []


@pytest.mark.parametrize("size", ["", "2mb", "2M", "2 MB", "0MB", "3MB", "02MB", "2MiB", "-2MB", "MB"])
def test_hugepage_sizes_rejected(size: str) -> None:
    [problem] = problems_for(hugepage_limits=[hook.HugepageLimit(page_size=size, limit=1)])
    assert "page_size" in problem


def test_hugepage_duplicate_sizes_rejected() -> None:
    limits = [hook.HugepageLimit(page_size="2MB", limit=1), hook.HugepageLimit(page_size="2MB", limit=2)]
    assert problems_for(hugepage_limits=limits) == ["hugepage page_size listed more than once: 2MB"]


def test_all_problems_are_reported() -> None:
    assert len(problems_for(cpu_period=1, cpu_shares=1, cpuset_cpus="x", unified={"a/b": ""})) == 4


# --- validate_cgroup_parent -----------------------------------------------------------------------

ROOTS = ["/kubepods"]


@pytest.mark.parametrize(
    "parent",
    [
        "/kubepods",
        "/kubepods/burstable",
        "/kubepods/burstable/pod1",
        "kubepods.slice",
        "kubepods-burstable.slice",
        "kubepods-burstable-pod1_2.slice",
        "/kubepods/a b",
    ],
)
def test_cgroup_parent_accepted(parent: str) -> None:
    assert validate_cgroup_parent(parent, ROOTS) is None


@pytest.mark.parametrize(
    ("parent", "reason"),
    [
        ("", "empty"),
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
    problem = validate_cgroup_parent(parent, ROOTS)
    assert problem is not None
    assert reason in problem


@pytest.mark.parametrize(
    ("roots", "accepted", "rejected"),
    [
        (
            ["/kubepods/burstable"],
            ["/kubepods/burstable/p", "kubepods-burstable-p.slice"],
            ["/kubepods", "kubepods.slice"],
        ),
        (["kubepods.slice"], ["/kubepods.slice/kubepods-burstable.slice", "kubepods-besteffort.slice"], ["/kubepods"]),
        (
            ["kubepods-burstable.slice"],
            ["/kubepods.slice/kubepods-burstable.slice/x", "kubepods-burstable-pod1.slice"],
            ["/kubepods.slice", "kubepods-besteffort.slice"],
        ),
        (["/kubepods.slice"], ["/kubepods.slice/x", "kubepods-x.slice"], ["/kubepods"]),
        (["/"], ["/", "/anything/at/all", "system.slice"], ["/a/../b"]),
        (["/a", "/b"], ["/a/x", "/b", "a-x.slice", "b.slice"], ["/c", "c.slice"]),
        ([], [], ["/kubepods", "kubepods.slice"]),
    ],
)
def test_cgroup_roots(roots: list[str], accepted: list[str], rejected: list[str]) -> None:
    for parent in accepted:
        assert validate_cgroup_parent(parent, roots) is None, parent
    for parent in rejected:
        assert validate_cgroup_parent(parent, roots) is not None, parent


@pytest.mark.parametrize("root", ["", "kubepods", "relative/path"])
def test_bad_roots_are_configuration_errors(root: str) -> None:
    with pytest.raises(ValueError, match="allowed cgroup root"):
        validate_cgroup_parent("/kubepods", [root])


segments = st.sampled_from(["kubepods", "burstable", "pod1", "..", ".", "", "kubepodsX", "etc", "...", "a..b"])


@given(st.lists(segments, max_size=6), st.booleans())
def test_cgroup_parent_never_escapes_the_root(parts: list[str], absolute: bool) -> None:
    parent = ("/" if absolute else "") + "/".join(parts)
    if validate_cgroup_parent(parent, ROOTS) is not None:
        return
    if parent.endswith(".slice"):
        assert "/" not in parent
        assert parent == "kubepods.slice" or parent.startswith("kubepods-")
    else:
        assert posixpath.normpath(parent) == parent
        assert parent == "/kubepods" or parent.startswith("/kubepods/")


@given(st.text(max_size=30))
def test_cgroup_parent_arbitrary_text_never_escapes(parent: str) -> None:
    if validate_cgroup_parent(parent, ROOTS) is not None:
        return
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in parent)
    if parent.startswith("/"):
        assert posixpath.normpath(parent) == parent
        assert ".." not in parent.split("/")
        assert parent == "/kubepods" or parent.startswith("/kubepods/")
    else:
        assert "/" not in parent
        assert parent.endswith(".slice")
