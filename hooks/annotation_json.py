"""Koordinator's pod annotations read as Go's ``encoding/json`` reads them into a struct.

koordlet decodes its annotations (extended-resource-spec, device-allocated...) with Go's
decoder, whose rules differ from Python's ``json``: unknown keys are ignored, field names
match case-insensitively (an exact match first), a field given twice merges its maps,
``null`` resets a map, and NaN/Infinity are refused. :func:`loads` keeps every object as its
key/value pairs in order (:class:`GoObject`) so those rules can be applied field by field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import TypeVar

__all__ = ["GoObject", "json_kind", "loads", "merged_map", "struct_fields"]

_T = TypeVar("_T")


class GoObject(list[tuple[str, object]]):
    """A JSON object as its key/value pairs in order, so that duplicates and case can be handled as Go does."""


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")  # Python's json would take NaN / Infinity; Go refuses them


def struct_fields(obj: GoObject, names: tuple[str, ...]) -> dict[str, list[object]]:
    """Each struct field's values in order: Go picks an exact key match, else a case-insensitive one."""
    found: dict[str, list[object]] = {name: [] for name in names}
    for key, value in obj:
        name = key if key in found else next((n for n in names if n.casefold() == key.casefold()), None)
        if name is not None:
            found[name].append(value)
    return found


def merged_map(values: list[object], where: str, parse: Callable[[object, str], _T]) -> dict[str, _T] | None:
    """A map field: null sets it to nil; each object adds its entries to what is there (Go)."""
    merged: dict[str, _T] | None = None
    for value in values:
        if value is None:
            merged = None
            continue
        if not isinstance(value, GoObject):
            raise ValueError(f"{where} must be an object, got {json_kind(value)}")
        merged = {} if merged is None else merged
        for key, item in value:
            merged[key] = parse(item, f"{where}[{key}]")
    return merged


def json_kind(value: object) -> str:
    if isinstance(value, GoObject):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def loads(text: str) -> object:
    """``text`` decoded with objects as GoObject, numbers with a fraction as Decimal; NaN refused."""
    return json.loads(text, object_pairs_hook=GoObject, parse_float=Decimal, parse_constant=_no_constant)
