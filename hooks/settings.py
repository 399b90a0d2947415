"""A plugin's settings: frozen dataclasses checked against their section of the policy file.

A plugin declares the settings of ONE QoS class as a frozen dataclass; its section of the
policy file (keyed by the plugin's name) has one entry per class, laid over the defaults::

    @dataclass(frozen=True)
    class StampSettings:
        value: str = "none"
        ratio: int = field(default=50, metadata=parsed_by(percent))

    # policy file:
    stamp:
      BE: {value: be-stamp}
      LS: {value: ls-stamp, ratio: 20}

**How a value is checked.** A field with ``metadata=parsed_by(parser)`` is checked by that
parser: a function ``(value, path) -> checked value`` raising :class:`Invalid` (the parsers
below: :func:`boolean`, :func:`integer`, :data:`percent`, :func:`choice`,
:func:`percent_range`, :func:`seconds`, :func:`string`, or your own). A field without one is
checked by its type hint: ``bool``, ``int``, ``float``, ``str``, ``Literal[...]`` of strings,
``tuple[X, ...]`` / ``tuple[X, Y]`` of those, or a nested frozen dataclass (a mapping). Any
other type needs a parser; :class:`SettingsSpec` says so when the plugin is defined.

**Checks across fields.** A settings dataclass may define ``problems(self)`` yielding
``(key, reason)`` pairs (key "" for the whole entry); each is an error at that key. A check
across the whole section (entries and section-wide keys) is the plugin's ``check``.

**Errors** name the YAML path and the reason: ``stamp.BE.valu: unknown key 'valu' (valid
keys: value, ratio)``; :class:`policy.PolicyError` adds the file.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, fields, is_dataclass
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal, Union, get_args, get_origin, get_type_hints

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.hookapi.value_bounds import validate_resources

from .qos import QoSClass

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "Invalid",
    "Parser",
    "SectionCheck",
    "SectionSettings",
    "SettingsSpec",
    "boolean",
    "build",
    "choice",
    "feeds",
    "integer",
    "number",
    "parsed_by",
    "parser_for",
    "percent",
    "percent_range",
    "plain",
    "seconds",
    "show",
    "string",
]

#: A parser takes the YAML value and its dotted path and returns the checked value, or raises Invalid.
Parser = Callable[[object, str], Any]
#: A check across a whole section: yields (dotted path inside the section, reason).
SectionCheck = Callable[["SectionSettings"], Iterable[tuple[str, str]]]

_CLASS_NAMES: Final = tuple(qos.value for qos in QoSClass)


class Invalid(Exception):
    """A value that does not pass: where (a dotted YAML path) and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason


def show(value: object) -> str:
    """A YAML value as an error message shows it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:40]) + "…"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


# --- parsers ------------------------------------------------------------------------------------


def parsed_by(parse: Parser) -> Mapping[str, Parser]:
    """A field's metadata saying which parser checks its YAML value: ``field(metadata=parsed_by(...))``."""
    return MappingProxyType({"parse": parse})


def boolean(value: object, path: str) -> bool:
    if isinstance(value, bool):
        return value
    raise Invalid(path, f"must be true or false, got {show(value)}")


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(low: int | None = None, high: int | None = None, what: str = "an integer") -> Parser:
    """An int within [low, high] (either bound may be None: open)."""
    if low is not None and high is not None:
        bounds = f" from {low} to {high}"
    elif low is not None:
        bounds = f" of at least {low}"
    elif high is not None:
        bounds = f" of at most {high}"
    else:
        bounds = ""

    def parse(value: object, path: str) -> int:
        if not _is_integer(value):
            raise Invalid(path, f"must be {what}{bounds}, got {show(value)}")
        assert isinstance(value, int)
        if (low is not None and value < low) or (high is not None and value > high):
            raise Invalid(path, f"must be {what}{bounds}, got {value}")
        return value

    return parse


percent: Final = integer(0, 100, "a percentage")

#: The resources fields a setting may feed (``feeds``): the integer ones the proxy bounds.
FED_FIELDS: Final = (
    "cpu_period",
    "cpu_quota",
    "cpu_shares",
    "oom_score_adj",
    "memory_limit_in_bytes",
    "memory_swap_limit_in_bytes",
)


def feeds(response_field: str) -> Mapping[str, Any]:
    """A field's metadata saying its value becomes ``response.resources.<response_field>``
    (``field(metadata=feeds("cpu_shares"))``): the policy check then refuses what the proxy
    would discard from the response (``cpu_shares 1 is outside 2..262144``), naming the
    plugin, class and field; 0 leaves the response field unset and passes."""
    if response_field not in FED_FIELDS:
        raise TypeError(f"feeds({response_field!r}): a setting may feed one of {', '.join(FED_FIELDS)}")
    return MappingProxyType({"parse": _within_response_bounds(response_field), "feeds": response_field})


def _within_response_bounds(response_field: str) -> Parser:
    """The proxy's own check of the field (hookapi/value_bounds.py), so the two never disagree."""

    def parse(value: object, path: str) -> int:
        if not _is_integer(value):
            raise Invalid(path, f"must be an integer (it feeds resources.{response_field}), got {show(value)}")
        assert isinstance(value, int)
        resources = hook_pb.LinuxContainerResources()
        try:
            setattr(resources, response_field, value)
        except ValueError:  # outside int64: protobuf refuses it
            problems = [f"{response_field} {value} does not fit a 64-bit integer"]
        else:
            problems = validate_resources(resources)
        if problems:
            raise Invalid(path, f"the proxy would discard it from the response: {'; '.join(problems)}")
        return value

    return parse


def number(value: object, path: str) -> float:
    """Any finite number (int or float), as a float."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise Invalid(path, f"must be a finite number, got {show(value)}")
    return float(value)


def string(value: object, path: str) -> str:
    if isinstance(value, str):
        return value
    raise Invalid(path, f"must be a string, got {show(value)}")


def choice(*options: str) -> Parser:
    def parse(value: object, path: str) -> str:
        if isinstance(value, str) and value in options:
            return value
        raise Invalid(path, f"must be one of {', '.join(options)}, got {show(value)}")

    return parse


def percent_range(value: object, path: str) -> tuple[int, int]:
    """``[start, end]``: two percentages, start below end."""
    if not isinstance(value, list | tuple) or len(value) != 2 or not all(_is_integer(item) for item in value):
        raise Invalid(path, f"must be [start, end], two integer percentages, got {show(value)}")
    start, end = value
    for name, item in (("start", start), ("end", end)):
        if not 0 <= item <= 100:
            raise Invalid(path, f"{name} must be a percentage from 0 to 100, got {item}")
    if start >= end:
        raise Invalid(path, f"start ({start}) must be below end ({end})")
    return (start, end)


def seconds(low: float, high: float) -> Parser:
    def parse(value: object, path: str) -> float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise Invalid(path, f"must be a number of seconds from {low:g} to {high:g}, got {show(value)}")
        if not (math.isfinite(value) and low <= value <= high):
            raise Invalid(path, f"must be a number of seconds from {low:g} to {high:g}, got {value!r}")
        return float(value)

    return parse


def _tuple_of(items: tuple[Parser, ...] | None, item: Parser) -> Parser:
    """A YAML list as a tuple: fixed ``items`` (one parser per position) or any length of ``item``."""

    def parse(value: object, path: str) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise Invalid(path, f"must be a list, got {show(value)}")
        if items is not None and len(value) != len(items):
            raise Invalid(path, f"must be a list of {len(items)} items, got {len(value)}")
        parsers = items if items is not None else (item,) * len(value)
        return tuple(
            parse_item(entry, f"{path}[{index}]")
            for index, (parse_item, entry) in enumerate(zip(parsers, value, strict=True))
        )

    return parse


def _optional(inner: Parser) -> Parser:
    def parse(value: object, path: str) -> Any:
        return None if value is None else inner(value, path)

    return parse


def _nested(cls: type[DataclassInstance]) -> Parser:
    def parse(value: object, path: str) -> Any:
        return build(cls, value, None, path)

    return parse


_SIMPLE: Final[Mapping[object, Parser]] = {bool: boolean, int: integer(), float: number, str: string}


def _parser_for_type(kind: Any, where: str) -> Parser:
    if kind in _SIMPLE:
        return _SIMPLE[kind]
    if isinstance(kind, type) and is_dataclass(kind):
        return _nested(kind)
    origin, args = get_origin(kind), get_args(kind)
    if origin is Literal and args and all(isinstance(arg, str) for arg in args):
        return choice(*args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _tuple_of(None, _parser_for_type(args[0], where))
    if origin is tuple and args and Ellipsis not in args:
        return _tuple_of(tuple(_parser_for_type(arg, where) for arg in args), string)
    if origin in (Union, types.UnionType) and type(None) in args and len(args) == 2:
        return _optional(_parser_for_type(next(arg for arg in args if arg is not type(None)), where))
    raise TypeError(
        f"{where}: no parser for type {kind!r}; use bool, int, float, str, Literal of strings, tuple, "
        "a frozen dataclass, or give one: field(metadata=parsed_by(parser))"
    )


@cache
def _types(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def parser_for(cls: type[DataclassInstance], name: str) -> Parser:
    """The parser of field ``name`` of ``cls``: its ``parsed_by`` metadata, else from its type hint.
    TypeError (naming the field) when there is neither."""
    return _parser_for(cls, name)


@cache
def _parser_for(cls: Any, name: str) -> Parser:
    item = next(f for f in fields(cls) if f.name == name)
    given = item.metadata.get("parse")
    if given is not None:
        if not callable(given):
            raise TypeError(f"{cls.__name__}.{name}: metadata 'parse' must be a parser function, got {given!r}")
        parse: Parser = given
        return parse
    return _parser_for_type(_types(cls)[name], f"{cls.__name__}.{name}")


def check_schema(cls: type[Any], what: str) -> None:
    """TypeError unless ``cls`` is a frozen dataclass whose every field has a parser."""
    if not (isinstance(cls, type) and is_dataclass(cls)):
        raise TypeError(f"{what} must be a dataclass type, got {cls!r}")
    if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"{what} {cls.__name__} must be frozen: @dataclass(frozen=True)")
    try:
        hints = _types(cls)
    except Exception as exc:  # a hint that does not resolve
        raise TypeError(f"{what} {cls.__name__}: cannot read its type hints ({exc})") from None
    for item in fields(cls):
        if item.name not in hints:
            raise TypeError(f"{what} {cls.__name__}.{item.name} has no type hint")
        parser_for(cls, item.name)


# --- building -------------------------------------------------------------------------------------


def _names(cls: type[DataclassInstance]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def unknown_key(valid: Iterable[str], key: object, hints: Mapping[str, str] | None = None) -> str:
    """Why ``key`` is refused where ``valid`` are the keys, with a hint for a mistyped class name."""
    names = tuple(valid)
    listed = f"valid keys: {', '.join(names)}"
    if isinstance(key, str):
        if hints and key in hints:
            return f"{hints[key]} ({listed})"
        if any(name in _CLASS_NAMES for name in names):
            if key.upper() in names and key.upper() in _CLASS_NAMES:
                hint = f"class names are upper case, did you mean {key.upper()!r}?"
                return f"unknown QoS class {key!r}: {hint} ({listed})"
            if key.isupper():
                return f"unknown QoS class {key!r} ({listed})"
    return f"unknown key {show(key)} ({listed})"


def mapping(raw: object, path: str, keys: Iterable[str]) -> dict[Any, Any]:
    """``raw`` as a mapping (None: empty); Invalid naming the keys it may have otherwise."""
    if raw is None:  # "cpu:" with nothing under it
        return {}
    if not isinstance(raw, dict):
        what = "must be a mapping" if path else "the policy must be a mapping"
        raise Invalid(path, f"{what} with keys {', '.join(keys)}, got {show(raw)}")
    return raw


def _field_value(item: Any, base: object | None, where: str) -> Any:
    if base is not None:
        return getattr(base, item.name)
    if item.default is not MISSING:
        return item.default
    if item.default_factory is not MISSING:
        return item.default_factory()
    raise Invalid(where, "missing (it has no default)")


def build(cls: type[Any], raw: object, base: Any | None, path: str, *, extra: Iterable[str] = ()) -> Any:
    """``cls`` from its YAML mapping; keys it leaves out come from ``base``, else from the field's
    default (Invalid "missing" when neither). ``extra``: keys allowed beside the fields (left for
    the caller). Then the instance's ``problems()``, if it has them."""
    names = _names(cls)
    allowed = (*names, *extra)
    data = mapping(raw, path, allowed)
    for key in data:
        if key not in allowed:
            raise Invalid(join(path, key), unknown_key(allowed, key))
    values: dict[str, Any] = {}
    for item in fields(cls):
        where = join(path, item.name)
        if item.name in data:
            values[item.name] = parser_for(cls, item.name)(data[item.name], where)
        else:
            values[item.name] = _field_value(item, base, where)
    built = cls(**values)
    problems: Callable[[], Iterable[tuple[str, str]]] | None = getattr(built, "problems", None)
    for key, reason in problems() if callable(problems) else ():
        raise Invalid(join(path, key) if key else path, reason)
    return built


def plain(value: object) -> Any:
    """A settings value as plain YAML data (dataclasses as mappings, tuples as lists)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {item.name: plain(getattr(value, item.name)) for item in fields(value)}
    if isinstance(value, tuple):
        return [plain(item) for item in value]
    return value


# --- a plugin's section ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SectionSettings:
    """A plugin's section of the policy in force: one settings object per entry (by class name)
    and the section-wide settings (``common``; None when the plugin has none)."""

    entries: Mapping[str, Any]
    common: Any
    class_entry: Mapping[QoSClass, str]

    def for_class(self, qos: QoSClass | str) -> Any:
        """The settings for pods of class ``qos`` (the entry the class uses); None without per-class settings."""
        if not self.entries:
            return None
        # A class (a StrEnum) or its name finds its entry without an enum call (twice per plugin per
        # hook call); anything else goes through QoSClass(), which refuses it with ValueError.
        entry = self.class_entry.get(qos) if isinstance(qos, str) else None  # type: ignore[call-overload]
        return self.entries[entry if entry is not None else self.class_entry[QoSClass(qos)]]

    def plain(self) -> dict[str, Any]:
        """The section as YAML data: the section-wide keys first, then one mapping per entry."""
        out: dict[str, Any] = dict(plain(self.common)) if self.common is not None else {}
        names = dict.fromkeys(self.class_entry.values())  # in class order, whatever order the entries came in
        out.update({name: plain(self.entries[name]) for name in names if name in self.entries})
        return out


class SettingsSpec:
    """What a plugin's section of the policy file may hold, and its defaults.

    * ``settings``: the frozen dataclass of one class's settings (None: no entries);
    * ``section``: the frozen dataclass of the section-wide keys (None: none);
    * ``class_entry``: classes that use another class's entry (``{"LSE": "LS"}``); every other
      class has an entry of its own;
    * ``defaults``: a mapping shaped like the section in a policy file, laid over the dataclasses'
      own defaults (per-class defaults); it must leave no field without a value;
    * ``check``: a check across the whole section (e.g. rates adding up to at most 100 %).

    TypeError for a spec that cannot work; Invalid (path inside the section) for bad defaults.
    """

    def __init__(
        self,
        name: str,
        *,
        settings: type[Any] | None = None,
        section: type[Any] | None = None,
        class_entry: Mapping[str, str] | None = None,
        defaults: Mapping[str, Any] | None = None,
        check: SectionCheck | None = None,
    ) -> None:
        if settings is not None:
            check_schema(settings, "settings")
        if section is not None:
            check_schema(section, "section")
        if check is not None and not callable(check):
            raise TypeError(f"check must be a function, got {check!r}")
        self.name = name
        self.settings = settings
        self.section = section
        self.check = check
        self.class_entry: Mapping[QoSClass, str] = MappingProxyType(_class_entries(class_entry or {}))
        self.entry_names: tuple[str, ...] = tuple(dict.fromkeys(self.class_entry.values())) if settings else ()
        if section is not None and set(self.entry_names) & set(_names(section)):
            clash = sorted(set(self.entry_names) & set(_names(section)))
            raise TypeError(f"section {section.__name__} has fields named like classes: {', '.join(clash)}")
        self.defaults: SectionSettings = self.load(dict(defaults or {}), None, "")

    @property
    def switchable(self) -> bool:
        """Whether the settings have the bool field ``enabled`` that switches the plugin off per class."""
        return self.settings is not None and "enabled" in _names(self.settings)

    def keys(self) -> tuple[str, ...]:
        common = _names(self.section) if self.section is not None else ()
        return (*common, *self.entry_names)

    def _hints(self) -> dict[str, str]:
        """Why a class that shares another's entry has none of its own."""
        hints: dict[str, str] = {}
        for qos, entry in self.class_entry.items():
            if qos.value != entry:
                sharing = [q.value for q, e in self.class_entry.items() if e == entry]
                hints[qos.value] = f"{qos.value} has no entry of its own: {', '.join(sharing)} pods share {entry}'s"
        return hints

    def load(self, raw: object, base: SectionSettings | None, path: str) -> SectionSettings:
        """The section from its YAML mapping laid over ``base`` (None: the dataclasses' defaults)."""
        data = mapping(raw, path, self.keys())
        for key in data:
            if key not in self.keys():
                raise Invalid(join(path, key), unknown_key(self.keys(), key, self._hints()))
        common = None
        if self.section is not None:
            own = {key: value for key, value in data.items() if key not in self.entry_names}
            common = build(self.section, own, base.common if base else None, path)
        entries = {
            name: build(self.settings, data.get(name), base.entries[name] if base else None, join(path, name))
            for name in self.entry_names
            if self.settings is not None
        }
        loaded = SectionSettings(MappingProxyType(entries), common, self.class_entry)
        for where, reason in self.check(loaded) if self.check is not None else ():
            raise Invalid(join(path, where) if where else path, reason)
        return loaded


def _class_entries(given: Mapping[str, str]) -> dict[QoSClass, str]:
    out = {qos: qos.value for qos in QoSClass}
    for source, target in given.items():
        try:
            qos, entry = QoSClass(source), QoSClass(target)
        except ValueError:
            names = ", ".join(_CLASS_NAMES)
            raise TypeError(f"class_entry maps QoS classes ({names}), got {source!r}: {target!r}") from None
        out[qos] = entry.value
    for qos, used in out.items():
        if out[QoSClass(used)] != used:
            raise TypeError(f"class_entry: {qos.value} uses {used}, which uses {out[QoSClass(used)]} itself")
    return out
