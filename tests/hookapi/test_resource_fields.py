"""The one list of container resource fields (hookapi/resource_fields.py): derived from the
compiled CRI descriptor, shared with the hook API, and what `fill` builds from it."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.hookapi import cri_mapping, resource_fields
from runtimeproxy.hookapi.value_bounds import validate_resources

PROTO = Path(__file__).resolve().parents[2] / "api" / "runtime" / "v1" / "api.proto"
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)
texts = st.text(max_size=8)
page_sizes = st.sampled_from(["2MB", "1GB", "bad"])


@st.composite
def resources(draw: st.DrawFn, message: type = cri.LinuxContainerResources) -> Any:
    """Any LinuxContainerResources, every field drawn by its kind (so new fields are drawn too)."""
    res = message(
        **{name: draw(int64s) for name in resource_fields.INTS},
        **{name: draw(texts) for name in resource_fields.STRINGS},
        unified=draw(st.dictionaries(texts, texts, max_size=3)),
    )
    for page_size, limit in draw(st.lists(st.tuples(page_sizes, st.integers(0, 2**64 - 1)), max_size=3)):
        res.hugepage_limits.add(page_size=page_size, limit=limit)
    return res


def as_plain(message: Any) -> SimpleNamespace:
    """The message as plain attributes, the way the plugin SDK's Resources holds them."""
    values = {name: getattr(message, name) for name in resource_fields.SCALARS}
    hugepages = [SimpleNamespace(page_size=h.page_size, limit=h.limit) for h in message.hugepage_limits]
    return SimpleNamespace(**values, hugepage_limits=tuple(hugepages), unified=dict(message.unified))


def proto_fields(message: str) -> list[tuple[int, str]]:
    """(number, name) of each field of ``message`` as our CRI .proto declares it."""
    text = PROTO.read_text()
    body = re.search(rf"^message {message} {{\n(.*?)^}}", text, re.M | re.S)
    assert body is not None, message
    declared = re.findall(r"^\s*(?:repeated\s+)?(?:map<[^>]*>|[\w.]+)\s+(\w+)\s*=\s*(\d+);", body.group(1), re.M)
    return sorted((int(number), name) for name, number in declared)


def test_the_lists_are_the_fields_the_proto_declares_in_number_order() -> None:
    assert tuple(name for _, name in proto_fields("LinuxContainerResources")) == resource_fields.FIELDS
    assert set(resource_fields.FIELDS) - set(resource_fields.SCALARS) == {"hugepage_limits", "unified"}
    assert resource_fields.STRINGS == ("cpuset_cpus", "cpuset_mems")
    assert (
        tuple(name for name in resource_fields.SCALARS if name not in resource_fields.STRINGS) == resource_fields.INTS
    )


def test_the_hook_api_carries_the_same_fields_under_the_same_numbers() -> None:
    """cri_mapping.copy_resources converts by re-encoding: that needs identical fields."""
    ours, theirs = cri.LinuxContainerResources.DESCRIPTOR, hook.LinuxContainerResources.DESCRIPTOR
    assert [f.name for f in theirs.fields] == [f.name for f in ours.fields]
    for mine in ours.fields:
        other = theirs.fields_by_name[mine.name]
        assert (other.number, other.type, other.is_repeated) == (mine.number, mine.type, mine.is_repeated)


def test_is_map() -> None:
    fields = cri.LinuxContainerResources.DESCRIPTOR.fields_by_name
    assert resource_fields.is_map(fields["unified"])
    assert not resource_fields.is_map(fields["hugepage_limits"])
    assert not resource_fields.is_map(fields["cpu_period"])


@given(resources())
def test_fill_from_plain_values_rebuilds_the_message(message: Any) -> None:
    rebuilt = resource_fields.fill(cri.LinuxContainerResources(), as_plain(message))
    assert rebuilt == message


@given(resources())
def test_fill_a_hook_message_equals_the_re_encoded_one(message: Any) -> None:
    filled = resource_fields.fill(hook.LinuxContainerResources(), as_plain(message))
    copied = hook.LinuxContainerResources()
    cri_mapping.copy_resources(copied, message)
    assert filled == copied


def test_fill_without_a_field_fails_naming_it() -> None:
    partial = as_plain(cri.LinuxContainerResources())
    del partial.memory_swap_limit_in_bytes
    with pytest.raises(AttributeError, match="memory_swap_limit_in_bytes"):
        resource_fields.fill(cri.LinuxContainerResources(), partial)


# A value for every field that no node accepts: the hook layer must check each field it merges.
_BAD_SCALARS = {"int": -2000, "str": "not-a-cpuset"}


@pytest.mark.parametrize("name", resource_fields.FIELDS)
def test_every_field_has_a_validation_rule(name: str) -> None:
    res = cri.LinuxContainerResources()
    if name in resource_fields.INTS:
        setattr(res, name, _BAD_SCALARS["int"])
    elif name in resource_fields.STRINGS:
        setattr(res, name, _BAD_SCALARS["str"])
    elif name == "hugepage_limits":
        res.hugepage_limits.add(page_size="3MB", limit=1)
    elif name == "unified":
        res.unified["cgroup.procs"] = "1"
    else:  # a field added to the proto: give it a rule in value_bounds.py and a bad value here
        pytest.fail(f"no bad value known for the new field {name}")
    assert validate_resources(res) != []
