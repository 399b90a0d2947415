"""ResourceChanges.problems(): the range checks are remembered by the values checked, and what it
answers never depends on what it answered before: a value of another type that compares equal
(True and 1, 1.0 and 1) is still refused for its type, and values that differ anywhere (a scalar,
a unified entry, a hugepage limit) are checked on their own."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runtimeproxy.hooks import changes as changes_mod
from runtimeproxy.hooks.changes import ResourceChanges
from runtimeproxy.hooks.views import HugepageLimit

from runtimeproxy.hookapi import resource_fields

SCALAR_VALUES = st.one_of(
    st.integers(-(2**64), 2**64),
    st.sampled_from([0, 1, -1, 2, 1.0, True, False, "", "0-1", "x", None]),
)
FIELDS = st.dictionaries(st.sampled_from(list(resource_fields.SCALARS)), SCALAR_VALUES, max_size=4)
UNIFIED_KEYS = st.sampled_from(["memory.high", "cpu.weight", "cgroup.procs", "bad key"])
UNIFIED = st.dictionaries(UNIFIED_KEYS, st.text(max_size=3))
PAGE_SIZES = st.sampled_from(["2MB", "1GB", "3XB"])
HUGEPAGES = st.lists(st.builds(HugepageLimit, PAGE_SIZES, st.integers(0, 2**40)), max_size=2)


def _changes(fields: dict[str, Any], unified: dict[str, str], hugepages: list[HugepageLimit]) -> ResourceChanges:
    changes = ResourceChanges(unified=dict(unified), hugepage_limits=list(hugepages))
    for name, value in fields.items():
        setattr(changes, name, value)
    return changes


def _fresh(changes: ResourceChanges) -> list[str]:
    """What problems() answers with nothing remembered."""
    saved = dict(changes_mod._VALUE_PROBLEMS)
    changes_mod._VALUE_PROBLEMS.clear()
    try:
        return changes.problems()
    finally:
        changes_mod._VALUE_PROBLEMS.clear()
        changes_mod._VALUE_PROBLEMS.update(saved)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(FIELDS, UNIFIED, HUGEPAGES), min_size=2, max_size=6))
def test_problems_answer_as_if_nothing_was_remembered(series: list[tuple[Any, Any, Any]]) -> None:
    made = [_changes(*parts) for parts in series]
    expected = [_fresh(changes) for changes in made]
    for _ in range(2):  # in turn, so each answer may come from another's remembered one
        assert [changes.problems() for changes in made] == expected


@pytest.mark.parametrize("odd", [True, 1.0])
def test_a_value_equal_to_a_checked_int_is_still_refused_for_its_type(odd: Any) -> None:
    assert ResourceChanges(cpu_shares=1024).problems() == []
    refused = ResourceChanges(cpu_shares=odd).problems()
    assert refused == [f"resources.cpu_shares must be an int, got {type(odd).__name__}"]


def test_values_out_of_range_are_refused_each_time_and_the_memory_stays_bounded() -> None:
    for shares in range(changes_mod._VALUE_PROBLEMS_MAX + 50):
        assert ResourceChanges(cpu_shares=shares + 2).problems() == []
    assert len(changes_mod._VALUE_PROBLEMS) <= changes_mod._VALUE_PROBLEMS_MAX + 1
    for _ in range(2):
        assert ResourceChanges(cpu_shares=1).problems() == ["resources: cpu_shares 1 is outside 2..262144"]
        assert ResourceChanges(unified={"cgroup.procs": "1"}).problems() == [
            "resources: unified key 'cgroup.procs': cgroup.* core files are not resource limits"
        ]
