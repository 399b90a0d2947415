"""The log renderers are cheaper than structlog's, never different: every line must be the text
json.dumps / structlog's JSONRenderer and TimeStamper(fmt="iso", utc=True) give, for any event
(structlog's fallback for objects JSON has no type for included)."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
import structlog
from hypothesis import example, given
from hypothesis import strategies as st

from runtimeproxy.common import logs


class Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


def fallback(obj: Any) -> Any:
    return repr(obj)


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.builds(Opaque))
values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(), inner, max_size=4))
)


@given(st.dictionaries(st.text(), values, max_size=6))
def test_a_line_is_json_dumps_text(event: dict[str, Any]) -> None:
    assert logs._dumps(event, default=fallback) == json.dumps(event, default=fallback)


def test_a_rendered_line_keeps_its_priority_prefix_and_fields() -> None:
    line = logs._PriorityJSONRenderer()(None, "info", {"event": "cgroup written", "value": "1", "level": "info"})
    assert line == '<6>{"event": "cgroup written", "value": "1", "level": "info"}'
    assert json.loads(line[3:]) == {"event": "cgroup written", "value": "1", "level": "info"}


levels = st.sampled_from(["debug", "info", "warning", "error", "critical", "fatal", "", "bogus"])


@given(st.dictionaries(st.text(), values, max_size=6), levels)
def test_a_line_is_structlogs_json_renderer_text(event: dict[str, Any], level: str) -> None:
    event["level"] = level
    old = structlog.processors.JSONRenderer()(None, "info", dict(event))
    prefix = logs._PRIORITY_PREFIX.get(level, logs._DEFAULT_PREFIX)
    assert logs._PriorityJSONRenderer()(None, "info", dict(event)) == prefix + str(old)


def test_a_circular_event_fails_as_json_dumps_does() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference detected"):
        logs._dumps({"loop": loop}, default=fallback)
    assert logs._dumps({"fine": [1]}, default=fallback) == '{"fine": [1]}'  # no memo left behind


EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def structlog_stamp(ns: int) -> str:
    """What TimeStamper(fmt="iso", utc=True) writes when the clock reads ``ns``: datetime.now
    floors the clock to microseconds, then isoformat() with "+00:00" replaced by "Z"."""
    return (EPOCH + datetime.timedelta(microseconds=ns // 1000)).isoformat().replace("+00:00", "Z")


@given(st.lists(st.integers(min_value=0, max_value=253402300799_999_999_999), min_size=1, max_size=5))
@example([0, 999, 1000, 1_000_000_000, 1_000_000_999, 1_700_000_000_000_000_000])  # whole seconds drop ".000000"
def test_the_timestamp_is_structlogs_text(clock: list[int]) -> None:
    readings = [*clock, *sorted(clock)]
    stamper = logs._UTCStamper(iter(readings).__next__)  # one stamper over several readings: its per-second cache too
    for ns in readings:
        assert stamper(None, "info", {})["timestamp"] == structlog_stamp(ns)


def test_the_timestamp_is_now() -> None:
    before = datetime.datetime.now(datetime.UTC)
    stamp = logs._UTCStamper()(None, "info", {})["timestamp"]
    after = datetime.datetime.now(datetime.UTC)
    assert stamp.endswith("Z")
    assert before <= datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")) <= after


class _Shown:
    def __structlog__(self) -> str:
        return "shown"


class _Plain:
    def __repr__(self) -> str:
        return "<plain>"


@pytest.mark.parametrize(("value", "text"), [(_Shown(), "shown"), (_Plain(), "<plain>")])
def test_the_own_fallback_renders_unknown_objects_as_structlog_does(value: Any, text: str) -> None:
    # Used when structlog no longer has its private fallback: the same text either way.
    assert logs._own_json_fallback(value) == text
    assert structlog.processors.JSONRenderer()(None, "info", {"v": value}) == json.dumps({"v": text})
