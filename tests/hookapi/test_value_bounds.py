"""What hook output may hold (hookapi/value_bounds.py), and that an answer is checked whole before
any of it is applied (hookapi/cri_mapping.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.dispatch.layer import HookLayer, HookSettings
from runtimeproxy.hookapi import cri_mapping, value_bounds
from runtimeproxy.hookapi.value_bounds import (
    ENV_COUNT_MAX,
    ENV_ENTRY_MAX,
    ENV_TOTAL_MAX,
    LABEL_MAX,
    MAX_CPUSET_ID,
    MEMORY_LIMIT_MIN,
    NodeFacts,
    cut,
    env_total_problems,
    format_cpuset,
    growth_problem,
    label_problems,
    parse_cpuset,
    validate_env,
    validate_resources,
)
from runtimeproxy.proxy.cli import cli

QUOTA_MAX = 2**44 - 1  # the kernel's max_cfs_runtime in microseconds
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)


# --- cut -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "limit", "quote", "shown"),
    [
        ("short", 200, True, "'short'"),
        ("abcdef", 3, True, "'abc'...(+3 chars)"),
        ("abcdef", 3, False, "abc...(+3 chars)"),
        (b"\x00\x01zz", 2, True, "b'\\x00\\x01'...(+2 bytes)"),
        ("line\nbreak", 200, False, "line\\nbreak"),
        (None, 200, True, "None"),
        (12345, 3, True, "123...(+2 chars)"),
        ([("2MB", 1)], 200, True, "[('2MB', 1)]"),
    ],
)
def test_cut(value: object, limit: int, quote: bool, shown: str) -> None:
    assert cut(value, limit, quote=quote) == shown


@given(st.text(max_size=400) | st.binary(max_size=400), st.integers(min_value=1, max_value=60), st.booleans())
def test_cut_is_bounded_and_counts_what_it_drops(value: str | bytes, limit: int, quote: bool) -> None:
    shown = cut(value, limit, quote=quote)
    assert "\n" not in shown and "\x00" not in shown  # control characters are escaped
    if len(value) <= limit:
        assert shown == (repr(value) if quote or isinstance(value, bytes) else repr(value)[1:-1])
    else:
        unit = "bytes" if isinstance(value, bytes) else "chars"
        assert shown.endswith(f"...(+{len(value) - limit} {unit})")
        assert len(shown) <= 10 * limit + 40  # a repr escapes one character into at most 10


# --- cpusets -------------------------------------------------------------------------------------

cpu_sets = st.frozensets(st.integers(min_value=0, max_value=MAX_CPUSET_ID), max_size=40) | st.frozensets(
    st.integers(min_value=0, max_value=70), max_size=60
)


@given(cpu_sets)
def test_cpuset_round_trip_and_output_validates(cpus: frozenset[int]) -> None:
    text = format_cpuset(cpus)
    assert parse_cpuset(text) == cpus
    assert validate_resources(hook.LinuxContainerResources(cpuset_cpus=text, cpuset_mems=text)) == []
    assert format_cpuset(parse_cpuset(text)) == text  # canonical


ranges = st.lists(
    st.tuples(st.integers(min_value=0, max_value=300), st.integers(min_value=0, max_value=40)), min_size=1, max_size=8
)


@given(ranges)
def test_parse_cpuset_is_the_union_of_its_items(items: list[tuple[int, int]]) -> None:
    text = ",".join(str(low) if not span else f"{low}-{low + span}" for low, span in items)
    assert parse_cpuset(text) == {cpu for low, span in items for cpu in range(low, low + span + 1)}


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
    ["0,", ",0", "0,,1", " 0", "0 ", "0 - 3", "-1", "3-1", "a", "1-", "0-31:2/8", "٣", "1_0", "+1", "65536",
     "0-65536", "0x1", "1.0"],
)  # fmt: skip
def test_parse_cpuset_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpuset(text)


def test_parse_cpuset_errors_are_short() -> None:
    with pytest.raises(ValueError) as info:
        parse_cpuset("0," * 100_000 + "x")
    assert len(str(info.value)) < 300


def test_cpuset_upper_bound_edge() -> None:
    assert parse_cpuset(str(MAX_CPUSET_ID)) == {MAX_CPUSET_ID}
    with pytest.raises(ValueError):
        format_cpuset([MAX_CPUSET_ID + 1])
    with pytest.raises(ValueError):
        format_cpuset([-1])


# --- the node's CPUs and memory nodes ------------------------------------------------------------


def node_with(tmp: Path, cpus: str | None, mems: str | None) -> NodeFacts:
    facts = NodeFacts(tmp / "cpu-online", tmp / "node-online")
    for path, text in ((facts.cpu_online, cpus), (facts.node_online, mems)):
        if text is not None:
            path.write_text(text + "\n")
    return facts


def test_cpusets_must_be_online(tmp_path: Path) -> None:
    node = node_with(tmp_path, "0-3,8", "0")
    ok = hook.LinuxContainerResources(cpuset_cpus="0-3,8", cpuset_mems="0")
    assert validate_resources(ok, node) == []
    [problem] = validate_resources(hook.LinuxContainerResources(cpuset_cpus="2-5"), node)
    assert problem == "cpuset_cpus: 4-5 not among the node's online CPUs (0-3,8)"
    [problem] = validate_resources(hook.LinuxContainerResources(cpuset_mems="0-1"), node)
    assert problem == "cpuset_mems: 1 not among the node's online memory nodes (0)"
    assert validate_resources(hook.LinuxContainerResources(cpuset_cpus="2-5")) == []  # no node facts: syntax only


def test_a_kernel_without_numa_has_memory_node_0(tmp_path: Path) -> None:
    node = node_with(tmp_path, "0", None)
    assert node.online_mems() == {0}
    assert validate_resources(hook.LinuxContainerResources(cpuset_mems="0"), node) == []
    assert validate_resources(hook.LinuxContainerResources(cpuset_mems="1"), node) != []


def test_unreadable_node_facts_refuse_the_cpuset(tmp_path: Path) -> None:
    [problem] = validate_resources(hook.LinuxContainerResources(cpuset_cpus="0"), node_with(tmp_path, None, "0"))
    assert problem.startswith("cpuset_cpus: cannot read the node's online CPUs")
    [problem] = validate_resources(hook.LinuxContainerResources(cpuset_cpus="0"), node_with(tmp_path, "garbage", "0"))
    assert "cannot read" in problem


def test_this_node_facts() -> None:
    node = NodeFacts()
    assert 0 in node.online_cpus() and 0 in node.online_mems()


@given(st.frozensets(st.integers(0, 80), min_size=1, max_size=20), st.frozensets(st.integers(0, 80), max_size=20))
def test_node_check_refuses_exactly_what_is_offline(online: frozenset[int], wanted: frozenset[int]) -> None:
    node = _FixedNode(online)
    problems = validate_resources(hook.LinuxContainerResources(cpuset_cpus=format_cpuset(wanted)), node)
    assert (problems == []) == (wanted <= online)
    if problems:
        assert cut(format_cpuset(wanted - online), 40, quote=False) in problems[0]


class _FixedNode(NodeFacts):
    def __init__(self, online: frozenset[int]) -> None:
        super().__init__()
        object.__setattr__(self, "_online", online)

    def online_cpus(self) -> frozenset[int]:
        return frozenset(getattr(self, "_online"))  # noqa: B009 (set through the frozen dataclass)


# --- resources -----------------------------------------------------------------------------------


def problems_for(over: Any = None, **fields: Any) -> list[str]:
    return validate_resources(hook.LinuxContainerResources(**fields), None, over)


def test_unset_resources_are_valid() -> None:
    assert validate_resources(hook.LinuxContainerResources()) == []


@pytest.mark.parametrize(
    ("field", "good", "bad"),
    [
        ("cpu_period", [1000, 100_000, 1_000_000], [999, 1_000_001, -1]),
        ("cpu_quota", [-1, 1000, 10**12, QUOTA_MAX], [-2, 1, 999, QUOTA_MAX + 1, 2**62, 2**63 - 1]),
        ("cpu_shares", [2, 1024, 262_144], [1, 262_145, -1]),
        ("oom_score_adj", [-1000, -1, 1, 1000], [-1001, 1001]),
        ("memory_limit_in_bytes", [MEMORY_LIMIT_MIN, 2**63 - 1], [1, MEMORY_LIMIT_MIN - 1, -1, -(2**63)]),
        ("memory_swap_limit_in_bytes", [-1, MEMORY_LIMIT_MIN, 2**63 - 1], [1, MEMORY_LIMIT_MIN - 1, -2, -(2**63)]),
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


BOUNDS = {
    "cpu_period": lambda v: 1000 <= v <= 1_000_000,
    "cpu_quota": lambda v: v == -1 or 1000 <= v <= QUOTA_MAX,
    "cpu_shares": lambda v: 2 <= v <= 262_144,
    "oom_score_adj": lambda v: -1000 <= v <= 1000,
    "memory_limit_in_bytes": lambda v: v >= 6 * 1024 * 1024,
    "memory_swap_limit_in_bytes": lambda v: v == -1 or v >= 6 * 1024 * 1024,
}


@given(st.sampled_from(sorted(BOUNDS)), int64s | st.integers(-2000, 2000) | st.sampled_from([QUOTA_MAX, QUOTA_MAX + 1]))
def test_bounds_property(field: str, value: int) -> None:
    problems = problems_for(**{field: value})
    assert (problems == []) == (value == 0 or BOUNDS[field](value))  # 0 is "not set"


def test_swap_must_not_be_below_memory() -> None:
    mib = 1 << 20
    assert problems_for(memory_limit_in_bytes=100 * mib, memory_swap_limit_in_bytes=100 * mib) == []
    assert problems_for(memory_limit_in_bytes=100 * mib, memory_swap_limit_in_bytes=-1) == []
    [problem] = problems_for(memory_limit_in_bytes=100 * mib, memory_swap_limit_in_bytes=99 * mib)
    assert "below memory_limit_in_bytes" in problem


def test_swap_against_the_request_it_is_merged_over() -> None:
    mib = 1 << 20
    kubelet = cri.LinuxContainerResources(memory_limit_in_bytes=100 * mib, memory_swap_limit_in_bytes=100 * mib)
    # Raising memory above the request's swap (memory + swap) would make runc refuse the container.
    [problem] = problems_for(kubelet, memory_limit_in_bytes=200 * mib)
    assert "memory_swap_limit_in_bytes 104857600 is below memory_limit_in_bytes 209715200" in problem
    assert problems_for(kubelet, memory_limit_in_bytes=200 * mib, memory_swap_limit_in_bytes=-1) == []
    assert problems_for(kubelet, memory_limit_in_bytes=50 * mib) == []
    # The request's own swap is not the answer's to check: only what the answer sets.
    odd = cri.LinuxContainerResources(memory_swap_limit_in_bytes=5)
    assert problems_for(odd, cpu_shares=2) == []


@pytest.mark.parametrize(
    "key", ["memory.high", "cpu.max", "io.weight", "memory.oom.group", "hugetlb.2MB.max", "cpu.uclamp.min", "rdma.max"]
)
def test_unified_keys_accepted(key: str) -> None:
    assert problems_for(unified={key: "1"}) == []


@pytest.mark.parametrize(
    "key",
    ["memory", "", ".high", "memory.", "memory..high", "../memory.high", "memory/high", "a/memory.high",
     "Memory.high", "memory.high ", "cgroup.procs", "cgroup.kill", "memory.hi\nh", "memory." + "h" * 300],
)  # fmt: skip
def test_unified_keys_rejected(key: str) -> None:
    [problem] = problems_for(unified={key: "1"})
    assert cut(key, 40) in problem


def test_unified_values() -> None:
    assert problems_for(unified={"memory.high": "1\0"}) != []
    assert problems_for(unified={"memory.high": "1" * 4096}) == []
    [problem] = problems_for(unified={"memory.high": "1" * 4097})
    assert "unified[memory.high] value is 4097 bytes" in problem


def test_unified_key_count() -> None:
    many = {f"memory.k{i}": "1" for i in range(128)}
    assert problems_for(unified=many) == []
    [problem] = problems_for(unified={**many, "memory.one_more": "1"})
    assert "unified would hold 129 keys" in problem
    # Counted with the request's keys; keys the request has already are not new.
    request = cri.LinuxContainerResources(unified=many)
    assert problems_for(request, unified={"memory.k0": "2"}) == []
    assert problems_for(request, unified={"memory.new": "2"}) != []


@pytest.mark.parametrize("size", ["2MB", "1GB", "64KB", "16GB", "512MB", "1TB"])
def test_hugepage_sizes_accepted(size: str) -> None:
    assert problems_for(hugepage_limits=[hook.HugepageLimit(page_size=size, limit=1)]) == []


@pytest.mark.parametrize("size", ["", "2mb", "2M", "2 MB", "0MB", "3MB", "02MB", "2MiB", "-2MB", "MB"])
def test_hugepage_sizes_rejected(size: str) -> None:
    [problem] = problems_for(hugepage_limits=[hook.HugepageLimit(page_size=size, limit=1)])
    assert "page_size" in problem


def test_hugepage_duplicate_sizes_rejected() -> None:
    pages = [hook.HugepageLimit(page_size="2MB", limit=1), hook.HugepageLimit(page_size="2MB", limit=2)]
    assert problems_for(hugepage_limits=pages) == ["hugepage page_size listed more than once: 2MB"]


def test_all_problems_are_reported() -> None:
    assert len(problems_for(cpu_period=1, cpu_shares=1, cpuset_cpus="x", unified={"a/b": ""})) == 4


# --- environment, labels, totals -----------------------------------------------------------------


def test_validate_env() -> None:
    assert validate_env([("A", b"x=y"), ("B", "")]) == []
    problems = validate_env([("", b""), ("A=B", b""), ("A\0", ""), ("C", b"\0"), ("D", "a\0")])
    assert len(problems) == 5
    assert "env name 'A=B' must be non-empty and contain no '=' or NUL" in problems


def test_env_entry_fits_max_arg_strlen() -> None:
    # "NAME=value" and its NUL: at most 128 KiB.
    assert validate_env([("N", b"v" * (ENV_ENTRY_MAX - 3))]) == []
    [problem] = validate_env([("N", b"v" * (ENV_ENTRY_MAX - 2))])
    assert problem == "env[N] is 131072 bytes as NAME=value, over the kernel's MAX_ARG_STRLEN of 131072 (with its NUL)"


@given(st.binary(min_size=1, max_size=300_000))
def test_env_problems_never_show_values(value: bytes) -> None:
    marker = b"\x00SECRET" + value
    for problem in validate_env([("TOKEN", marker), ("A=B", marker)]):
        assert "SECRET" not in problem


def test_env_totals() -> None:
    small = [(f"E{i}", b"v") for i in range(ENV_COUNT_MAX)]
    assert env_total_problems([], small) == []
    [problem] = env_total_problems([], [*small, ("ONE", b"more")])
    assert problem == f"env would hold {ENV_COUNT_MAX + 1} variables, over the limit of {ENV_COUNT_MAX}"
    big = [("BIG", b"x" * ENV_TOTAL_MAX)]
    [problem] = env_total_problems([], big)
    assert "bytes, over the limit of 524288" in problem
    # kubelet's own environment over a limit is not the answer's fault, as long as it does not grow.
    assert env_total_problems(big, big) == []
    assert env_total_problems(big, [("BIG", b"y" * ENV_TOTAL_MAX)]) == []
    assert env_total_problems(big, [*big, ("A", b"1")]) != []


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.integers(1, 10**7))
def test_growth_rule(before: int, after: int, limit: int) -> None:
    refused = growth_problem("x", before, after, limit, "bytes") is not None
    assert refused == (after > limit and after > before)


def test_labels_fit_containerd() -> None:
    assert label_problems({"k": "v" * (LABEL_MAX - 1)}) == []
    [problem] = label_problems({"key": "v" * LABEL_MAX})
    assert problem.startswith("labels[key]: key and value are 4099 bytes, over containerd's limit of 4096")
    assert len(problem) < 200  # the value is cut


# --- answers are checked whole, then applied -----------------------------------------------------

RULES = cri_mapping.OutputRules(("/kubepods",), "auto", NodeFacts())


def pod_view(parent: str = "/kubepods/besteffort/pod1") -> cri_mapping.PodView:
    config = cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name="p", uid="1", namespace="n"),
        labels={"app": "p"},
        annotations={"a": "1"},
        linux=cri.LinuxPodSandboxConfig(cgroup_parent=parent),
    )
    return cri_mapping.PodView("sb", "", config)


def container_view() -> cri_mapping.ContainerView:
    config = cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name="c"),
        envs=[cri.KeyValue(key="A", value=b"1")],
        annotations={"c": "1"},
        linux=cri.LinuxContainerConfig(resources=cri.LinuxContainerResources(cpu_shares=512)),
    )
    return cri_mapping.ContainerView("", config)


def snapshot(*messages: Any) -> list[bytes]:
    return [m.config.SerializeToString(deterministic=True) for m in messages]


INVALID_CONTAINER = {
    "container_env_list": hook.ContainerResourceHookResponse(container_env_list=[hook.KeyValue(key="A=B", value=b"v")]),
    "container_envs": hook.ContainerResourceHookResponse(container_envs={"": "v"}),
    "pod_cgroup_parent": hook.ContainerResourceHookResponse(pod_cgroup_parent="kubepods-besteffort.slice"),
    "cpu_quota": hook.ContainerResourceHookResponse(container_resources=hook.LinuxContainerResources(cpu_quota=2**62)),
    "memory_limit_in_bytes": hook.ContainerResourceHookResponse(
        container_resources=hook.LinuxContainerResources(memory_limit_in_bytes=1)
    ),
    "cpuset_cpus": hook.ContainerResourceHookResponse(
        container_resources=hook.LinuxContainerResources(cpuset_cpus=str(MAX_CPUSET_ID))
    ),
    "container_annotations": hook.ContainerResourceHookResponse(container_annotations={"big": "x" * (257 << 10)}),
}


@pytest.mark.parametrize("field", sorted(INVALID_CONTAINER))
def test_an_invalid_container_answer_changes_nothing(field: str) -> None:
    pod, container = pod_view(), container_view()
    answer = hook.ContainerResourceHookResponse()
    answer.CopyFrom(INVALID_CONTAINER[field])
    # Valid parts beside the invalid one: none of them may land either.
    answer.container_annotations["valid"] = "yes"
    answer.container_resources.cpu_shares = 1024
    answer.container_envs["VALID"] = "yes"
    before = snapshot(pod, container)
    with pytest.raises(cri_mapping.InvalidHookOutput) as info:
        cri_mapping.apply_container_response(pod, container, answer, RULES)
    assert field in str(info.value)
    assert snapshot(pod, container) == before


def test_invalid_pod_answers_change_nothing() -> None:
    answers = {
        "labels": hook.PodSandboxHookResponse(labels={"big": "x" * 5000}, annotations={"valid": "yes"}),
        "cgroup_parent": hook.PodSandboxHookResponse(cgroup_parent="kubepods-besteffort.slice", labels={"v": "1"}),
        "annotations": hook.PodSandboxHookResponse(annotations={"big": "x" * (257 << 10)}, labels={"v": "1"}),
        "resources": hook.PodSandboxHookResponse(
            resources=hook.LinuxContainerResources(cpu_quota=2**62), labels={"v": "1"}
        ),
    }
    for field, answer in answers.items():
        pod = pod_view()
        before = snapshot(pod)
        with pytest.raises(cri_mapping.InvalidHookOutput) as info:
            cri_mapping.apply_pod_response(pod, answer, RULES)
        assert str(info.value).startswith(field), info.value
        assert snapshot(pod) == before


def test_a_pod_without_a_cgroup_parent_accepts_none_under_auto() -> None:
    answer = hook.PodSandboxHookResponse(cgroup_parent="/kubepods/besteffort/pod1")
    with pytest.raises(cri_mapping.InvalidHookOutput, match="--cgroup-driver"):
        cri_mapping.apply_pod_response(pod_view(parent=""), answer, RULES)
    pod = pod_view(parent="")
    cgroupfs = cri_mapping.OutputRules(("/kubepods",), "cgroupfs")
    assert cri_mapping.apply_pod_response(pod, answer, cgroupfs) == ["cgroup_parent: '' -> '/kubepods/besteffort/pod1'"]


def test_slices_under_the_systemd_driver() -> None:
    pod = pod_view(parent="kubepods-besteffort-pod1.slice")
    answer = hook.PodSandboxHookResponse(cgroup_parent="kubepods-burstable-pod1.slice")
    assert cri_mapping.apply_pod_response(pod, answer, RULES)
    assert pod.config.linux.cgroup_parent == "kubepods-burstable-pod1.slice"
    with pytest.raises(cri_mapping.InvalidHookOutput, match="systemd cgroup driver"):
        cri_mapping.apply_pod_response(pod, hook.PodSandboxHookResponse(cgroup_parent="/kubepods/x"), RULES)


def test_huge_answers_give_short_errors() -> None:
    envs = [hook.KeyValue(key=f"E{i}=", value=b"v") for i in range(100_000)]
    answer = hook.ContainerResourceHookResponse(container_env_list=envs)
    with pytest.raises(cri_mapping.InvalidHookOutput) as info:
        cri_mapping.apply_container_response(pod_view(), container_view(), answer, RULES)
    message = str(info.value)
    assert message.startswith("container_env_list: env name 'E0=' must be")
    assert message.endswith("; and 99999 more") and len(message) < 600  # 100000 names, count and size


def test_change_descriptions_hold_no_env_values_and_cut_the_rest() -> None:
    pod, container = pod_view(), container_view()
    answer = hook.ContainerResourceHookResponse(
        container_env_list=[hook.KeyValue(key="TOKEN", value=b"s3cret"), hook.KeyValue(key="A", value=b"2")],
        container_annotations={"note": "n" * 1000},
    )
    changes = cri_mapping.apply_container_response(pod, container, answer, RULES)
    assert "env[TOKEN] set" in changes and "env[A] set" in changes
    assert not any("s3cret" in change for change in changes)
    [note] = [change for change in changes if change.startswith("annotations[note]")]
    assert note == f"annotations[note]: None -> '{'n' * 200}'...(+800 chars)"


valid_envs = st.lists(
    st.tuples(st.sampled_from(["A", "B", "C", "A=B", ""]), st.binary(max_size=4) | st.just(b"\x00")), max_size=4
)


@given(
    valid_envs,
    st.sampled_from([0, 512, 1, 2**62, 50000]),
    st.sampled_from(["", "0", "0-1", str(MAX_CPUSET_ID)]),
    st.sampled_from(["", "/kubepods/burstable/pod1", "kubepods-burstable.slice", "/etc"]),
    st.dictionaries(st.sampled_from(["x", "y"]), st.sampled_from(["1", "z" * 5000]), max_size=2),
)
def test_an_answer_is_all_or_nothing(
    envs: list[tuple[str, bytes]], quota: int, cpus: str, parent: str, annotations: dict[str, str]
) -> None:
    pod, container = pod_view(), container_view()
    answer = hook.ContainerResourceHookResponse(
        container_env_list=[hook.KeyValue(key=k, value=v) for k, v in envs],
        container_resources=hook.LinuxContainerResources(cpu_quota=quota, cpuset_cpus=cpus),
        pod_cgroup_parent=parent,
        container_annotations=annotations,
    )
    before = snapshot(pod, container)
    node = _FixedNode(frozenset({0, 1}))
    try:
        cri_mapping.apply_container_response(
            pod, container, answer, cri_mapping.OutputRules(("/kubepods",), "auto", node)
        )
    except cri_mapping.InvalidHookOutput:
        assert snapshot(pod, container) == before
        return
    # Applied: every value that landed is one the runtime accepts.
    resources = container.config.linux.resources
    assert resources.cpu_quota in (0, 50000)
    assert parse_cpuset(resources.cpuset_cpus) <= {0, 1}
    assert pod.config.linux.cgroup_parent.startswith("/kubepods/")
    assert validate_env([(e.key, bytes(e.value)) for e in container.config.envs]) == []
    assert value_bounds.map_bytes(dict(container.config.annotations)) <= value_bounds.ANNOTATIONS_TOTAL_MAX


# --- configuration -------------------------------------------------------------------------------


def test_a_malformed_root_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="allowed cgroup root 'kubepods'"):
        cri_mapping.OutputRules(("/kubepods", "kubepods"))


def test_the_cgroup_driver_option_reaches_the_hook_layer(tmp_path: Path) -> None:
    settings = HookSettings(str(tmp_path), str(tmp_path / "none.sock"), cgroup_driver="systemd")
    layer = HookLayer(settings, metrics_registry=CollectorRegistry())
    assert layer.interceptor.output_rules.cgroup_driver == "systemd"
    assert layer.interceptor.output_rules.cgroup_roots == ("/kubepods", "kubepods.slice")


def test_the_cgroup_driver_option_takes_only_known_drivers() -> None:
    result = CliRunner().invoke(cli, ["serve", "--cgroup-driver", "kubepods"])
    assert result.exit_code == 2 and "'kubepods' is not one of 'auto', 'systemd', 'cgroupfs'" in result.output
    help_text = CliRunner().invoke(cli, ["serve", "--help"]).output
    assert "--cgroup-driver [auto|systemd|cgroupfs]" in help_text and "RUNTIME_PROXY_CGROUP_DRIVER" in help_text
