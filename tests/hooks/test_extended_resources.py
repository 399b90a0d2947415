"""Koordinator's extended-resource annotation and resource quantities (hooks/extended_resources.py)."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.extended_resources import (
    BATCH_CPU,
    BATCH_MEMORY,
    EXTENDED_RESOURCE_SPEC_ANNOTATION,
    INT64_MAX,
    ContainerResources,
    ExtendedResourceSpec,
    quantity_value,
    read_extended_resource_spec,
)

ANN = EXTENDED_RESOURCE_SPEC_ANNOTATION


def read(value: Any) -> tuple[ExtendedResourceSpec | None, str]:
    text = value if isinstance(value, str) else json.dumps(value)
    return read_extended_resource_spec({ANN: text})


# --- quantities ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("1000", 1000),
        ("1.5", 2),  # Value() rounds up
        ("100m", 1),
        ("2Gi", 2 << 30),
        ("1.5Gi", 3 << 29),
        ("512M", 512_000_000),
        ("1k", 1000),
        ("1E", 10**18),  # exa, not an exponent
        ("1e3", 1000),
        ("1E+3", 1000),
        ("15e-1", 2),
        ("-1.5", -2),  # away from 0
        ("-1", -1),
        ("0", 0),
        ("0.0001", 1),
        ("1e-100", 1),
        ("1.", 1),
        (".5", 1),
        ("007", 7),
        (" \t2Gi\n", 2 << 30),  # Quantity.UnmarshalJSON trims space
        ("+", 0),  # ParseQuantity's degenerate forms are 0
        (".", 0),
        ("Ki", 0),
        ("99999999999999999999", INT64_MAX),  # capped
        ("-99999999999999999999", -INT64_MAX),
        ("1e30", INT64_MAX),
        ("8Ei", INT64_MAX),
        (1024, 1024),  # JSON numbers
        (1.5, 2),
        (Decimal("1.5E+3"), 1500),
    ],
)
def test_quantity_value(raw: object, value: int) -> None:
    assert quantity_value(raw) == value


@pytest.mark.parametrize(
    "raw",
    [
        "",
        " ",
        "abc",
        "1K",
        "1e",
        "1 Gi",
        "1Gi5",
        "1e3.5",
        "--1",
        "+-1",
        "1..5",
        "NaN",
        "inf",
        "0x10",
        "1_000",
        "\u0661",
    ],
)
def test_quantity_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        quantity_value(raw)


@pytest.mark.parametrize("raw", [True, False, None, [], {}, b"1"])
def test_quantity_wrong_type(raw: object) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        quantity_value(raw)


def test_quantity_too_many_digits() -> None:
    with pytest.raises(ValueError, match="too many digits"):
        quantity_value("1" * 5000)


_SUFFIX_SCALE = {
    "": Fraction(1),
    "m": Fraction(1, 1000),
    "k": Fraction(1000),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "Ki": Fraction(1 << 10),
    "Mi": Fraction(1 << 20),
    "Gi": Fraction(1 << 30),
}


@given(
    number=st.integers(min_value=0, max_value=10**15),
    frac=st.text("0123456789", max_size=4),
    suffix=st.sampled_from(sorted(_SUFFIX_SCALE)),
    negative=st.booleans(),
)
def test_quantity_round_trip(number: int, frac: str, suffix: str, negative: bool) -> None:
    """A quantity written from a number reads back as that number rounded up, away from 0."""
    text = f"{'-' if negative else ''}{number}{'.' + frac if frac else ''}{suffix}"
    exact = (Fraction(number) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)) * _SUFFIX_SCALE[suffix]
    expected = min(math.ceil(exact), INT64_MAX)
    assert quantity_value(text) == (-expected if negative else expected)


@given(value=st.integers(min_value=0, max_value=INT64_MAX))
def test_quantity_integers_round_trip(value: int) -> None:
    assert quantity_value(str(value)) == value
    assert quantity_value(value) == value


@given(st.text(max_size=12))
def test_quantity_any_text(text: str) -> None:
    """Any text gives an int within +-INT64_MAX or a ValueError, nothing else."""
    try:
        value = quantity_value(text)
    except ValueError:
        return
    assert -INT64_MAX <= value <= INT64_MAX


# --- the annotation -----------------------------------------------------------------------------


def test_no_annotation() -> None:
    assert read_extended_resource_spec({}) == (None, "")
    assert read_extended_resource_spec({"other": "x"}) == (None, "")


def test_full_annotation() -> None:
    spec, problem = read(
        {
            "containers": {
                "main": {
                    "requests": {BATCH_CPU: "500", BATCH_MEMORY: "1Gi"},
                    "limits": {BATCH_CPU: "1000", BATCH_MEMORY: "2Gi"},
                },
                "side": {"requests": {BATCH_CPU: 250}, "limits": {BATCH_CPU: 500, BATCH_MEMORY: "512Mi"}},
            }
        }
    )
    assert problem == ""
    assert spec is not None
    main = spec.container("main")
    assert main is not None
    assert (main.request(BATCH_CPU), main.limit(BATCH_CPU)) == (500, 1000)
    assert (main.request(BATCH_MEMORY), main.limit(BATCH_MEMORY)) == (1 << 30, 2 << 30)
    assert spec.container("absent") is None
    assert spec.pod_request(BATCH_CPU) == 750
    assert spec.pod_limit(BATCH_CPU) == 1500
    assert spec.pod_request(BATCH_MEMORY) == 1 << 30  # only main asks
    assert spec.pod_limit(BATCH_MEMORY) == (2 << 30) + (512 << 20)
    assert spec.notes == ()


def test_pod_limit_needs_every_container() -> None:
    spec, _ = read({"containers": {"a": {"limits": {BATCH_MEMORY: "1Gi"}}, "b": {"requests": {BATCH_MEMORY: "1Gi"}}}})
    assert spec is not None
    assert spec.pod_limit(BATCH_MEMORY) is None
    assert spec.pod_request(BATCH_MEMORY) == 1 << 30


@pytest.mark.parametrize("value", ["0", "-1", None])
def test_non_positive_counts_as_unset(value: object) -> None:
    spec, problem = read({"containers": {"a": {"limits": {BATCH_CPU: value}, "requests": {BATCH_CPU: value}}}})
    assert problem == ""
    assert spec is not None
    entry = spec.container("a")
    assert entry is not None
    assert entry.limits[BATCH_CPU] == (quantity_value(value) if value is not None else 0)  # kept as read
    assert (entry.limit(BATCH_CPU), entry.request(BATCH_CPU)) == (None, None)
    assert spec.pod_limit(BATCH_CPU) is None
    assert spec.pod_request(BATCH_CPU) is None
    assert len(spec.notes) == 2
    assert any(f"containers[a].limits[{BATCH_CPU}] is" in note for note in spec.notes)
    assert all(note.endswith("not positive, counts as unset") for note in spec.notes)


@pytest.mark.parametrize("text", ["null", "{}", '{"containers": null}', '{"containers": {}}', '{"other": [1]}'])
def test_no_containers(text: str) -> None:
    spec, problem = read(text)
    assert problem == ""
    assert spec == ExtendedResourceSpec()
    assert spec.pod_limit(BATCH_CPU) is None
    assert spec.pod_request(BATCH_CPU) is None


def test_null_container_has_nothing() -> None:
    spec, _ = read({"containers": {"a": None, "b": {"limits": None, "requests": None}}})
    assert spec is not None
    assert spec.container("a") == ContainerResources()
    assert spec.container("b") == ContainerResources()


def test_go_field_matching() -> None:
    """Field names match case-insensitively; a repeated map field merges; a repeated entry: the last wins."""
    text = (
        (
            '{"Containers": {"a": {"LIMITS": {"CPU": "1"}}},'
            ' "containers": {"b": {"limits": {"CPU": "2"}, "Limits": {"MEM": "1Gi"}},'
            ' "c": {}, "c": {"requests": {"CPU": "3"}}}}'
        )
        .replace("CPU", BATCH_CPU)
        .replace("MEM", BATCH_MEMORY)
    )
    spec, problem = read(text)
    assert problem == ""
    assert spec is not None
    assert set(spec.containers) == {"a", "b", "c"}
    a, b, c = (spec.container(name) for name in "abc")
    assert a is not None and b is not None and c is not None
    assert a.limit(BATCH_CPU) == 1
    assert dict(b.limits) == {BATCH_CPU: 2, BATCH_MEMORY: 1 << 30}
    assert c.request(BATCH_CPU) == 3


def test_null_resets_a_map_field() -> None:
    spec, _ = read('{"containers": {"a": {}}, "containers": null}')
    assert spec == ExtendedResourceSpec()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "Expecting value"),
        ("[1]", "must be a JSON object, got an array"),
        ('"x"', "must be a JSON object, got a string"),
        ("3", "must be a JSON object, got a number"),
        ('{"containers": []}', "containers must be an object, got an array"),
        ('{"containers": {"a": 1}}', "containers[a] must be an object, got a number"),
        ('{"containers": {"a": {"limits": "1"}}}', "containers[a].limits must be an object, got a string"),
        ('{"containers": {"a": {"requests": {"memory": "lots"}}}}', "containers[a].requests[memory]: not a quantity"),
        (
            '{"containers": {"a": {"limits": {"CPU": true}}}}'.replace("CPU", BATCH_CPU),
            f"containers[a].limits[{BATCH_CPU}]",
        ),
        ('{"containers": {"a": {"limits": {"CPU": NaN}}}}'.replace("CPU", BATCH_CPU), "NaN is not JSON"),
        ('{"containers": {"a": {"limits": {"CPU": Infinity}}}}'.replace("CPU", BATCH_CPU), "Infinity is not JSON"),
        ("[" * 100_000, "nested too deeply"),
    ],
)
def test_bad_annotation_is_ignored_with_a_reason(text: str, reason: str) -> None:
    spec, problem = read(text)
    assert spec is None
    assert problem.startswith(f"annotation {ANN} ignored: ")
    assert reason in problem


def test_one_bad_quantity_of_any_resource_ignores_all() -> None:
    """As Go's decoder: one bad quantity anywhere, even of a resource nobody reads, drops the spec."""
    spec, problem = read({"containers": {"a": {"limits": {BATCH_CPU: "1"}}, "b": {"limits": {"nvidia.com/gpu": "x"}}}})
    assert spec is None
    assert "containers[b].limits[nvidia.com/gpu]" in problem


# Any JSON value, nested a little.
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


@given(_json)
def test_random_json_never_crashes(value: object) -> None:
    spec, problem = read(value)
    assert (spec is None) == bool(problem)
    if spec is not None:
        for entry in spec.containers.values():
            assert all(isinstance(v, int) for v in (*entry.requests.values(), *entry.limits.values()))


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=5),
        st.dictionaries(st.sampled_from([BATCH_CPU, BATCH_MEMORY, "x"]), _json, max_size=3),
        max_size=3,
    )
)
def test_random_resource_lists_never_crash(containers: dict[str, dict[str, object]]) -> None:
    spec, problem = read({"containers": {name: {"limits": entry} for name, entry in containers.items()}})
    assert (spec is None) == bool(problem)


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=5),
        st.tuples(
            st.none() | st.integers(min_value=-(10**12), max_value=10**12),
            st.none() | st.integers(min_value=-(10**12), max_value=10**12),
        ),
        max_size=5,
    )
)
def test_sums(containers: dict[str, tuple[int | None, int | None]]) -> None:
    """Pod request: the sum of the positive requests. Pod limit: the sum when every container has a positive one."""
    annotation = {
        "containers": {
            name: {
                "requests": {} if request is None else {BATCH_CPU: str(request)},
                "limits": {} if limit is None else {BATCH_CPU: f"{limit}"},
            }
            for name, (request, limit) in containers.items()
        }
    }
    spec, problem = read(annotation)
    assert problem == ""
    assert spec is not None
    requests = [r for r, _ in containers.values() if r is not None and r > 0]
    limits = [lim for _, lim in containers.values()]
    assert spec.pod_request(BATCH_CPU) == (sum(requests) if requests else None)
    all_limited = bool(limits) and all(lim is not None and lim > 0 for lim in limits)
    assert spec.pod_limit(BATCH_CPU) == (sum(lim for lim in limits if lim is not None) if all_limited else None)
    unset = sum(1 for r, lim in containers.values() for v in (r, lim) if v is not None and v <= 0)
    assert len(spec.notes) == unset
