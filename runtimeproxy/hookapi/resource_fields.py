"""The fields of a container's resources (CRI ``LinuxContainerResources``), in one place.

Read from the compiled descriptor rather than spelled out, so that a field added to the
proto reaches every user of these lists (merge rules, the store's view of updates, plugin
test builders) instead of being silently left out of one of them. The hook API's
``LinuxContainerResources`` carries the same fields under the same numbers (cri_mapping.py
converts between the two by re-encoding; tests/hookapi/test_resource_fields.py checks it).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from runtimeproxy.api.runtime.v1 import api_pb2 as cri

__all__ = ["FIELDS", "INTS", "SCALARS", "SCALAR_VALUES", "STRINGS", "fill", "is_map"]

M = TypeVar("M", bound=Message)

_DESCRIPTOR: Final = cast(Descriptor, cri.LinuxContainerResources.DESCRIPTOR)


def is_map(fd: Any) -> bool:
    """Whether the FieldDescriptor ``fd`` (pure-Python or upb) is a protobuf map (a repeated
    entry message marked map_entry)."""
    entry = fd.message_type
    return entry is not None and entry.GetOptions().map_entry


def _names(keep: Callable[[FieldDescriptor], bool]) -> tuple[str, ...]:
    return tuple(fd.name for fd in sorted(_DESCRIPTOR.fields, key=lambda fd: fd.number) if keep(fd))


#: Every field, in field-number order.
FIELDS: Final = _names(lambda fd: True)
#: The single-valued fields (numbers and strings), where 0 / "" is proto3's "not set".
SCALARS: Final = _names(lambda fd: not fd.is_repeated and fd.message_type is None)
#: SCALAR_VALUES(x): the SCALARS' values of ``x`` (a message or a plain object) as a tuple, read in C.
SCALAR_VALUES: Final = operator.attrgetter(*SCALARS)
#: The numeric ones among SCALARS.
INTS: Final = _names(lambda fd: not fd.is_repeated and fd.cpp_type == FieldDescriptor.CPPTYPE_INT64)
#: The string ones among SCALARS.
STRINGS: Final = _names(lambda fd: not fd.is_repeated and fd.type == FieldDescriptor.TYPE_STRING)


# How fill sets a field: plainly, a map, a list of messages (by its items' field names), a list.
_SCALAR, _MAP, _MESSAGES, _LIST = range(4)


@functools.cache
def _layout(descriptor: Any) -> tuple[tuple[str, int, tuple[str, ...]], ...]:
    """(name, how fill sets it, item field names) of each field of the message type ``descriptor``;
    read once per type, not per call (is_map alone reads the field's options)."""
    layout = []
    for fd in descriptor.fields:
        if is_map(fd):
            layout.append((fd.name, _MAP, ()))
        elif fd.is_repeated and fd.message_type is not None:
            layout.append((fd.name, _MESSAGES, tuple(sub.name for sub in fd.message_type.fields)))
        else:
            layout.append((fd.name, _LIST if fd.is_repeated else _SCALAR, ()))
    return tuple(layout)


def fill(message: M, source: Any) -> M:
    """Set every resource field of ``message`` (CRI's or the hook API's LinuxContainerResources)
    from the attributes of the same names on ``source`` (e.g. the plugin SDK's ``Resources``);
    list items (``hugepage_limits``) are read by their fields' names too. Returns ``message``."""
    for name, how, item_fields in _layout(message.DESCRIPTOR):
        value = getattr(source, name)
        if how == _SCALAR:
            setattr(message, name, value)
        elif how == _MAP:
            target = getattr(message, name)
            for key in value:  # what update() does with a mapping, without its Python-level frames
                target[key] = value[key]
        elif how == _MESSAGES:
            target = getattr(message, name)
            for item in value:
                target.add(**{sub: getattr(item, sub) for sub in item_fields})
        else:
            getattr(message, name).extend(value)
    return message
