"""The settings machinery plugins declare their settings with (hooks/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.settings import (
    Invalid,
    SettingsSpec,
    build,
    choice,
    integer,
    parsed_by,
    percent_range,
    plain,
)


@dataclass(frozen=True)
class Inner:
    depth: int = 1


@dataclass(frozen=True)
class Typed:
    """Every kind of field the type hints alone decide."""

    name: str = "x"
    count: int = 0
    ratio: float = 0.5
    on: bool = False
    mode: Literal["fast", "slow"] = "fast"
    pair: tuple[int, int] = (1, 2)
    many: tuple[str, ...] = ()
    maybe: int | None = None
    inner: Inner = field(default_factory=Inner)
    level: int = field(default=5, metadata=parsed_by(integer(0, 10, "a level")))
    span: tuple[int, int] = field(default=(0, 100), metadata=parsed_by(percent_range))


def test_plain_typed_fields_validate_by_their_type_hints() -> None:
    raw = {
        "name": "n",
        "count": 3,
        "ratio": 2,
        "on": True,
        "mode": "slow",
        "pair": [3, 4],
        "many": ["a", "b"],
        "maybe": 7,
        "inner": {"depth": 2},
    }
    built = build(Typed, raw, None, "t")
    assert built == Typed("n", 3, 2.0, True, "slow", (3, 4), ("a", "b"), 7, Inner(2))
    assert build(Typed, plain(built), None, "t") == built  # plain() reads back
    assert build(Typed, None, None, "t") == Typed()  # nothing given: the dataclass's defaults


BAD = [
    ({"name": 3}, "t.name", "must be a string, got 3"),
    ({"count": "3"}, "t.count", "must be an integer, got '3'"),
    ({"count": True}, "t.count", "must be an integer, got true"),
    ({"ratio": ".nan"}, "t.ratio", "finite number"),
    ({"on": "yes"}, "t.on", "must be true or false"),
    ({"mode": "medium"}, "t.mode", "one of fast, slow, got 'medium'"),
    ({"pair": [1]}, "t.pair", "a list of 2 items, got 1"),
    ({"pair": [1, "2"]}, "t.pair[1]", "must be an integer"),
    ({"many": "ab"}, "t.many", "must be a list"),
    ({"inner": {"deep": 1}}, "t.inner.deep", "unknown key 'deep' (valid keys: depth)"),
    ({"level": 11}, "t.level", "must be a level from 0 to 10, got 11"),
    ({"span": [5, 5]}, "t.span", "start (5) must be below end (5)"),
    ({"valu": 1}, "t.valu", "unknown key 'valu'"),
]


@pytest.mark.parametrize(("raw", "path", "reason"), BAD)
def test_errors_name_the_path_and_the_reason(raw: dict[str, Any], path: str, reason: str) -> None:
    with pytest.raises(Invalid) as caught:
        build(Typed, raw, None, "t")
    assert caught.value.path == path
    assert reason in caught.value.reason


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
keys = st.sampled_from(["name", "count", "ratio", "on", "mode", "pair", "many", "maybe", "inner", "level", "span", "x"])


@given(st.dictionaries(keys | st.integers(), yaml_values, max_size=6))
def test_random_mappings_never_crash_and_errors_name_the_path(raw: dict[Any, Any]) -> None:
    try:
        built = build(Typed, raw, None, "stamp.BE")
    except Invalid as exc:
        assert exc.path.startswith("stamp.BE")
        assert exc.reason
        first = exc.path.removeprefix("stamp.BE.").split(".")[0].split("[")[0]
        assert first in {str(key) for key in raw}  # the error is about a key the mapping has
    else:
        assert isinstance(built, Typed)


@given(yaml_values)
def test_a_section_that_is_not_a_mapping_is_an_error_not_a_crash(raw: Any) -> None:
    spec = SettingsSpec("stamp", settings=Inner)
    try:
        section = spec.load(raw, None, "stamp")
    except Invalid as exc:
        assert exc.path.startswith("stamp")
    else:
        assert set(section.entries) == {qos.value for qos in QoSClass}


@dataclass(frozen=True)
class Band:
    rate: int = 10


@dataclass(frozen=True)
class Common:
    interface: str = ""


def test_section_wide_keys_shared_entries_defaults_and_a_whole_section_check() -> None:
    def check(section: Any) -> Any:
        total = sum(entry.rate for entry in section.entries.values())
        if total > 100:
            yield "", f"rates add up to {total}"

    spec = SettingsSpec(
        "net",
        settings=Band,
        section=Common,
        class_entry={"LSE": "LS", "LSR": "LS"},
        defaults={"BE": {"rate": 20}, "interface": "eth0"},
        check=check,
    )
    assert spec.keys() == ("interface", "LS", "BE", "SYSTEM")
    assert spec.defaults.common == Common("eth0")
    assert spec.defaults.for_class(QoSClass.LSE) is spec.defaults.entries["LS"]
    assert spec.defaults.for_class("BE") == Band(20)
    loaded = spec.load({"LS": {"rate": 50}}, spec.defaults, "net")
    assert loaded.for_class("LSR") == Band(50) and loaded.for_class("BE") == Band(20)  # laid over the base
    with pytest.raises(Invalid) as caught:
        spec.load({"LSE": {}}, spec.defaults, "net")
    assert caught.value.path == "net.LSE" and "LSE has no entry of its own: LSE, LSR, LS pods share LS's" in str(
        caught.value.reason
    )
    with pytest.raises(Invalid, match="rates add up to 110"):
        spec.load({"LS": {"rate": 80}}, spec.defaults, "net")


def test_bad_specs_are_refused_when_the_plugin_is_defined() -> None:
    @dataclass(frozen=True)
    class Odd:
        when: complex = 0j

    with pytest.raises(TypeError, match=r"Odd.when: no parser for type"):
        SettingsSpec("p", settings=Odd)

    @dataclass(frozen=True)
    class Required:
        value: str = field(metadata=parsed_by(choice("a", "b")))

    with pytest.raises(Invalid, match="missing"):
        SettingsSpec("p", settings=Required)
    assert SettingsSpec("p", settings=Required, defaults={qos.value: {"value": "a"} for qos in QoSClass})
    with pytest.raises(TypeError, match="fields named like classes"):

        @dataclass(frozen=True)
        class Clash:
            BE: int = 0

        SettingsSpec("p", settings=Inner, section=Clash)
