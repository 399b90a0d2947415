"""Settings that feed a response field (``feeds``): ``runtime-hooks policy check`` refuses exactly
the values the proxy would discard from the response, naming plugin, class, field, value and range."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.sdk import Plugin, PluginDefinitionError, feeds
from runtimeproxy.hooks.settings import FED_FIELDS
from runtimeproxy.hooks.testkit import PolicyError, policy_from

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.hookapi.value_bounds import validate_resources


def _plugin_feeding(response_field: str) -> Plugin:
    @dataclass(frozen=True)
    class Fed:
        value: int = field(default=0, metadata=feeds(response_field))

    return Plugin("fed", settings=Fed)


PLUGINS = {name: _plugin_feeding(name) for name in FED_FIELDS}


def _proxy_accepts(response_field: str, value: int) -> bool:
    resources = hook_pb.LinuxContainerResources()
    setattr(resources, response_field, value)
    return not validate_resources(resources)


def _checked(response_field: str, value: Any) -> str:
    """ "" when the policy check passes ``value``, else its message."""
    try:
        policy_from(f"fed: {{BE: {{value: {value}}}}}\n", PLUGINS[response_field])
    except PolicyError as exc:
        return str(exc)
    return ""


# Around every bound the proxy applies, and anywhere in int64.
NEAR_BOUNDS = st.sampled_from([-1001, -1000, -2, -1, 0, 1, 2, 999, 1000, 1001, 262_144, 262_145, 1_000_000, 1_000_001])
VALUES = st.one_of(NEAR_BOUNDS, st.integers(-(2**63), 2**63 - 1), st.integers((6 << 20) - 2, (6 << 20) + 2))


@given(st.sampled_from(FED_FIELDS), VALUES)
def test_the_policy_check_accepts_exactly_what_the_proxy_accepts(response_field: str, value: int) -> None:
    message = _checked(response_field, value)
    assert (message == "") == _proxy_accepts(response_field, value), message


@pytest.mark.parametrize(
    ("response_field", "value", "says"),
    [
        ("cpu_shares", 1, "cpu_shares 1 is outside 2..262144"),
        ("cpu_shares", 262_145, "cpu_shares 262145 is outside 2..262144"),
        ("cpu_period", 999, "cpu_period 999 is outside 1000..1000000"),
        ("oom_score_adj", 1001, "oom_score_adj 1001 is outside -1000..1000"),
        ("memory_limit_in_bytes", 1024, "memory_limit_in_bytes 1024 is outside"),
    ],
)
def test_a_refusal_names_plugin_class_field_value_and_range(response_field: str, value: int, says: str) -> None:
    message = _checked(response_field, value)
    assert "fed.BE.value: the proxy would discard it from the response" in message
    assert says in message


def test_a_value_beyond_64_bits_is_refused() -> None:
    assert "does not fit a 64-bit integer" in _checked("cpu_shares", 2**64)


def test_a_value_that_is_not_an_integer_is_refused() -> None:
    assert "must be an integer (it feeds resources.cpu_shares), got" in _checked("cpu_shares", "lots")
    assert "must be an integer" in _checked("cpu_shares", "true")


def test_only_bounded_response_fields_can_be_fed() -> None:
    with pytest.raises(TypeError, match="a setting may feed one of cpu_period"):
        feeds("cpuset_cpus")


def test_per_class_defaults_outside_the_bounds_are_refused_when_the_plugin_is_defined() -> None:
    @dataclass(frozen=True)
    class Shares:
        shares: int = field(default=0, metadata=feeds("cpu_shares"))

    with pytest.raises(
        PluginDefinitionError, match=r"its defaults: bad\.BE\.shares: .*cpu_shares 1 is outside 2\.\.262144"
    ):
        Plugin("bad", settings=Shares, defaults={"BE": {"shares": 1}})
