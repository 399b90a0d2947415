"""The JSON log renderer builds its encoder once: every line must be the text json.dumps gives,
for any event (structlog's fallback for objects JSON has no type for included)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy import logs


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
