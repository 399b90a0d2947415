"""read_extended_resource_spec remembers its answer per annotation text (several plugins read one
pod's in a hook call): each read must give what decoding that text gives, whatever was read before."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.extended_resources import (
    BATCH_CPU,
    EXTENDED_RESOURCE_SPEC_ANNOTATION,
    read_extended_resource_spec,
)

quantity = st.one_of(st.sampled_from(["500", "1", "2k", "-3", "x", "0.5"]), st.integers(-5, 5000).map(str))
spec = st.dictionaries(
    st.sampled_from(["a", "b"]), st.fixed_dictionaries({"limits": st.fixed_dictionaries({BATCH_CPU: quantity})})
).map(lambda containers: json.dumps({"containers": containers}))
text = st.one_of(spec, st.sampled_from(["", "null", "{", "[]", '{"containers": 3}']))


def limits(annotation: str) -> tuple[dict[str, int | None] | None, str]:
    found, problem = read_extended_resource_spec({EXTENDED_RESOURCE_SPEC_ANNOTATION: annotation})
    if found is None:
        return None, problem
    return {name: entry.limit(BATCH_CPU) for name, entry in found.containers.items()}, problem


@given(st.lists(text, min_size=1, max_size=6))
def test_each_read_answers_for_its_own_text(texts: list[str]) -> None:
    first = [limits(annotation) for annotation in texts]
    again = [limits(annotation) for annotation in reversed(texts)]
    assert again == list(reversed(first))
    for annotation, answer in zip(texts, first, strict=True):
        if answer[0] is None:
            assert answer[1].startswith(f"annotation {EXTENDED_RESOURCE_SPEC_ANNOTATION} ignored")
        else:
            assert set(answer[0]) == set((json.loads(annotation) or {}).get("containers") or {})


def test_no_annotation_is_no_spec_and_no_problem() -> None:
    assert read_extended_resource_spec({}) == (None, "")
