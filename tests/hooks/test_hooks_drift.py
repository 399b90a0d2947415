"""The comparison behind container repair (hooks/drift.py): the plugins' answer against what the
runtime's record or the cgroup shows, as properties over any answer and any values."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.cgroups import MAX_SHARES, MIN_SHARES, shares_to_weight
from runtimeproxy.hooks.changes import ResourceChanges
from runtimeproxy.hooks.drift import (
    DEFAULT_CFS_PERIOD_US,
    DEFAULT_SHARES,
    REPAIRED_FIELDS,
    UNLIMITED,
    Drift,
    Seen,
    changes_for,
    drifts,
    seen_in_record,
    wanted_fields,
)
from runtimeproxy.hooks.sdk import Resources

from runtimeproxy.hookapi.value_bounds import format_cpuset

PAGE = 4096
cpusets = st.frozensets(st.integers(0, 63), min_size=1, max_size=8).map(format_cpuset)


@st.composite
def answers(draw: st.DrawFn) -> ResourceChanges:
    """A plugins' answer: any subset of the repaired fields set, the rest left ("0" / "")."""
    return ResourceChanges(
        cpu_quota=draw(st.sampled_from([0, -1]) | st.integers(1000, 10_000_000)),
        cpu_period=draw(st.sampled_from([0]) | st.integers(1000, 1_000_000)),
        cpu_shares=draw(st.sampled_from([0]) | st.integers(MIN_SHARES, MAX_SHARES)),
        cpuset_cpus=draw(st.sampled_from([""]) | cpusets),
        cpuset_mems=draw(st.sampled_from([""]) | cpusets),
        memory_limit_in_bytes=draw(st.sampled_from([0]) | st.integers(1, 1 << 40)),
        oom_score_adj=draw(st.integers(-1000, 1000)),  # never repaired
    )


#: Anything a source may show: each field unknown (None) or any value it could hold.
seen_values = st.builds(
    Seen,
    cpu_quota=st.none() | st.just(UNLIMITED) | st.integers(1000, 10_000_000),
    cpu_period=st.none() | st.integers(1000, 1_000_000),
    cpu_shares=st.none() | st.integers(1, MAX_SHARES),
    cpuset_cpus=st.none() | st.just("") | cpusets,
    cpuset_mems=st.none() | st.just("") | cpusets,
    memory_limit_in_bytes=st.none() | st.just(UNLIMITED) | st.integers(0, 1 << 40),
    weights=st.booleans(),
    page_size=st.sampled_from([1, PAGE]),
)


def written(seen: Seen, changes: ResourceChanges) -> Seen:
    """What the source shows once ``changes`` are set, as the kernel keeps them: shares as a
    weight on cgroup v2, memory limits in whole pages, "no quota" as -1. Unknown fields stay unknown."""
    values = {}
    if changes.cpu_quota and seen.cpu_quota is not None:
        values["cpu_quota"] = changes.cpu_quota if changes.cpu_quota > 0 else UNLIMITED
    if changes.cpu_period and seen.cpu_period is not None:
        values["cpu_period"] = changes.cpu_period
    if changes.cpu_shares and seen.cpu_shares is not None:
        values["cpu_shares"] = shares_to_weight(changes.cpu_shares) if seen.weights else changes.cpu_shares
    for name in ("cpuset_cpus", "cpuset_mems"):
        if getattr(changes, name) and getattr(seen, name) is not None:
            values[name] = getattr(changes, name)
    if changes.memory_limit_in_bytes and seen.memory_limit_in_bytes is not None:
        limit = changes.memory_limit_in_bytes
        values["memory_limit_in_bytes"] = limit - limit % seen.page_size
    return replace(seen, **values)  # type: ignore[arg-type]


@given(answers(), seen_values)
def test_a_repair_leaves_nothing_to_repair(wanted: ResourceChanges, seen: Seen) -> None:
    """Whatever differed, setting the repair's values makes the source show what the plugins set."""
    found = drifts(wanted, seen)
    after = written(seen, changes_for(wanted, found))
    assert drifts(wanted, after) == []


@given(answers(), seen_values)
def test_only_fields_the_answer_sets_and_the_source_shows_can_differ(wanted: ResourceChanges, seen: Seen) -> None:
    set_fields = set(wanted_fields(wanted))
    for drift in drifts(wanted, seen):
        name = "cpu_shares" if drift.field == "cpu_weight" else drift.field
        assert name in set_fields
        assert getattr(seen, name) is not None
        assert drift.have != drift.want
    repair = changes_for(wanted, drifts(wanted, seen))
    assert repair.oom_score_adj == 0 and not repair.unified and not repair.hugepage_limits
    for name in REPAIRED_FIELDS:  # the repair holds the answer's values, of the drifted fields only
        assert getattr(repair, name) in (getattr(wanted, name), 0, "")


@given(answers())
def test_a_source_that_shows_nothing_never_differs(wanted: ResourceChanges) -> None:
    assert drifts(wanted, Seen()) == []
    assert drifts(ResourceChanges(), seen_in_record(Resources(cpu_quota=5000, cpu_shares=3))) == []


@given(answers(), st.integers(0, 10_000))
def test_a_record_holding_the_answer_shows_no_drift(wanted: ResourceChanges, kubelet_shares: int) -> None:
    """The runtime records the hooked request: the answer laid over kubelet's values."""
    kubelet = Resources(cpu_period=100_000, cpu_shares=kubelet_shares, memory_limit_in_bytes=64 << 20)
    recorded = Resources(
        **{
            name: getattr(wanted, name) or getattr(kubelet, name)
            for name in ("cpu_quota", "cpu_period", "cpu_shares", "cpuset_cpus", "cpuset_mems", "memory_limit_in_bytes")
        }
    )
    assert drifts(wanted, seen_in_record(recorded)) == []


def test_unset_record_fields_are_what_a_new_cgroup_has() -> None:
    """kubelet's BestEffort request (2 shares, no quota) recorded without the plugins' answer."""
    record = seen_in_record(Resources(cpu_period=100_000, cpu_shares=2))
    assert record == Seen(UNLIMITED, DEFAULT_CFS_PERIOD_US, 2, "", "", UNLIMITED)
    wanted = ResourceChanges(cpu_quota=50_000, cpu_period=100_000, cpu_shares=256, cpuset_cpus="1")
    assert drifts(wanted, record) == [
        Drift("cpu_quota", UNLIMITED, 50_000),
        Drift("cpu_shares", 2, 256),
        Drift("cpuset_cpus", "", "1"),
    ]
    # unset shares are the kernel's 1024; "no quota" answered as -1 or any value <= 0 is -1
    assert drifts(ResourceChanges(cpu_shares=DEFAULT_SHARES, cpu_quota=-5), seen_in_record(Resources())) == []
    assert seen_in_record(None) == Seen()


@given(st.integers(MIN_SHARES, MAX_SHARES), st.integers(MIN_SHARES, MAX_SHARES))
def test_cgroup_v2_compares_shares_as_the_weight_it_keeps(want: int, have: int) -> None:
    seen = Seen(cpu_shares=shares_to_weight(have), weights=True)
    differs = bool(drifts(ResourceChanges(cpu_shares=want), seen))
    assert differs == (shares_to_weight(want) != shares_to_weight(have))
    assert bool(drifts(ResourceChanges(cpu_shares=want), Seen(cpu_shares=have))) == (want != have)


@given(st.integers(1, 1 << 40), st.integers(1, 1 << 40))
def test_memory_limits_are_only_lowered_and_compare_in_whole_pages(limit: int, have: int) -> None:
    wanted = ResourceChanges(memory_limit_in_bytes=limit)
    in_pages = Seen(memory_limit_in_bytes=limit - limit % PAGE, page_size=PAGE)
    assert drifts(wanted, in_pages) == []
    assert bool(drifts(wanted, Seen(memory_limit_in_bytes=have))) == (have > limit)  # a tighter one stays
    assert drifts(wanted, Seen(memory_limit_in_bytes=UNLIMITED)) == [Drift("memory_limit_in_bytes", UNLIMITED, limit)]


def test_cpusets_compare_as_sets_and_drifts_read_plainly() -> None:
    assert drifts(ResourceChanges(cpuset_cpus="0,1,2"), Seen(cpuset_cpus="0-2")) == []
    [drift] = drifts(ResourceChanges(cpuset_cpus="1"), Seen(cpuset_cpus="0-1"))
    assert str(drift) == "cpuset_cpus: '0-1' -> '1'"
    assert str(Drift("cpu_quota", -1, 50_000)) == "cpu_quota: -1 -> 50000"
    # a list the kernel would not print compares as text
    assert drifts(ResourceChanges(cpuset_cpus="0-3:2"), Seen(cpuset_cpus="0-3:2")) == []
