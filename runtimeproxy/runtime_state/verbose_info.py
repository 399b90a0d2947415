"""Go JSON (the cri-api structs as containerd's verbose info renders them) to protobuf.

Go's encoding/json writes snake_case field names, ``omitempty``, enums as numbers and env
values as JSON strings (our ``KeyValue.value`` is ``bytes``: they are UTF-8 encoded);
protojson (lowerCamel names, enum names, 64-bit integers as strings) is accepted too.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from runtimeproxy.hookapi.resource_fields import is_map

M = TypeVar("M", bound=Message)

_INT_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED32,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _scalar(fd: FieldDescriptor, value: Any) -> Any:
    kind = fd.type
    if isinstance(value, bool) and kind != FieldDescriptor.TYPE_BOOL:
        raise TypeError(f"boolean for a {fd.name} field")
    if kind in _INT_TYPES:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int | str):  # protojson writes 64-bit integers as strings
            return int(value)
    elif kind == FieldDescriptor.TYPE_ENUM:
        if isinstance(value, int):  # Go's encoding/json writes the number
            return value
        enum_type = fd.enum_type
        if isinstance(value, str) and enum_type is not None:
            named = enum_type.values_by_name.get(value)
            if named is None:
                raise ValueError(f"unknown {enum_type.name} {value!r}")
            return named.number
    elif kind == FieldDescriptor.TYPE_BOOL:
        if isinstance(value, bool):
            return value
    elif kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        if isinstance(value, int | float):
            return float(value)
    elif kind == FieldDescriptor.TYPE_STRING:
        if isinstance(value, str):
            return value
    elif kind == FieldDescriptor.TYPE_BYTES and isinstance(value, str):
        # Upstream CRI has strings where our proto has bytes (KeyValue.value).
        return value.encode()
    raise TypeError(f"{type(value).__name__} {value!r} for a {fd.name} field")


def _fill(message: Message, data: Any, path: str, problems: list[str]) -> None:
    if not isinstance(data, dict):
        problems.append(f"{path or '.'}: expected an object, got {type(data).__name__}")
        return
    message.SetInParent()
    descriptor = message.DESCRIPTOR
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        fd = cast(
            FieldDescriptor | None, descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        )
        if fd is None:
            problems.append(f"{where}: no such field in {descriptor.full_name}")
            continue
        if value is None:
            continue
        try:
            _fill_field(message, fd, value, where, problems)
        except (TypeError, ValueError) as exc:
            problems.append(f"{where}: {exc}")


def _fill_field(message: Message, fd: FieldDescriptor, value: Any, where: str, problems: list[str]) -> None:
    target = getattr(message, fd.name)
    entry_type = fd.message_type
    if entry_type is not None and is_map(fd):
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {type(value).__name__}")
        key_fd, value_fd = entry_type.fields_by_name["key"], entry_type.fields_by_name["value"]
        for k, v in value.items():
            try:
                map_key = _scalar(key_fd, k)
                if value_fd.message_type is not None:
                    _fill(target[map_key], v, f"{where}[{k}]", problems)
                else:
                    target[map_key] = _scalar(value_fd, v)
            except (TypeError, ValueError) as exc:
                problems.append(f"{where}[{k}]: {exc}")
    elif fd.is_repeated:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        for index, item in enumerate(value):
            if entry_type is not None:
                _fill(target.add(), item, f"{where}[{index}]", problems)
            else:
                try:
                    target.append(_scalar(fd, item))
                except (TypeError, ValueError) as exc:
                    problems.append(f"{where}[{index}]: {exc}")
    elif entry_type is not None:
        _fill(target, value, where, problems)
    else:
        setattr(message, fd.name, _scalar(fd, value))


def message_from_go_json(data: Any, message: M) -> list[str]:
    """Fill `message` from a JSON-decoded Go struct of the same CRI type; return what
    was skipped (unknown fields, wrong types), one "path: reason" each. Accepts Go
    JSON (snake_case names, numeric enums, strings for our bytes fields) and protojson
    (lowerCamel names, enum names, 64-bit integers as strings)."""
    problems: list[str] = []
    _fill(message, data, "", problems)
    return problems
