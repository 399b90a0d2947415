"""Objects the runtime has but protobuf cannot decode.

containerd (1.6 and 1.7 checked) stores label, annotation and other string values that
are not UTF-8 (it does not check a RunPodSandbox / CreateContainer from another client),
and Python's protobuf refuses a whole message holding one - a List response because of one
bad item. The loader therefore decodes its responses leniently (`Undecodable`, the bytes
and the error, instead of a message): a List that fails as a whole is decoded item by item
(`first_field`), so only the bad objects are skipped; a Status that fails makes its object
unreadable. Each such object is logged once (`UnreadableObjects`, not again on later loads
or rounds) and counted. For the hook layer an unreadable object is not an unknown one:
`UnreadableObjectError` says so (never None), so hooks are never run with empty data as if
the object were fine.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from runtimeproxy.wire.grpc_client import details_of, status_of
from runtimeproxy.wire.grpc_framing import code_name

log = structlog.get_logger(__package__)

M = TypeVar("M", bound=Message)
T = TypeVar("T")


class UnreadableObjectError(Exception):
    """The runtime has this sandbox or container, but its data cannot be decoded (e.g. a
    label that is not UTF-8): hooks cannot be given its data. Not the same as unknown."""

    def __init__(self, kind: str, object_id: str, reason: str) -> None:
        super().__init__(f"the runtime's {kind} {object_id} cannot be decoded: {reason}")
        self.kind = kind
        self.object_id = object_id
        self.reason = reason


@dataclass(frozen=True)
class Undecodable:
    """A response protobuf refused as a whole: its bytes, to decode part by part."""

    data: bytes
    error: str


def lenient(message_type: type[M]) -> Callable[[bytes], M | Undecodable]:
    def decode(data: bytes) -> M | Undecodable:
        try:
            return message_type.FromString(data)
        except Exception as exc:  # DecodeError, e.g. "String field had bad UTF-8"
            return Undecodable(data, describe_error(exc))

    return decode


def _first_field_type() -> type[Message]:
    """A message whose field 1 is ``repeated bytes``. Any message parses as it: field 1's
    entries come out raw and unchecked (the items of a List response, an object's id), the
    other fields stay unknown, undecoded."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="runtimeproxy/runtime_state/first_field.proto", package="runtimeproxy.runtime_state", syntax="proto3"
    )
    message = proto.message_type.add(name="FirstField")
    message.field.add(
        name="values",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("runtimeproxy.runtime_state.FirstField"))


_FirstField = _first_field_type()


def first_field(data: bytes) -> list[bytes]:
    """Field 1's raw entries: the items of ListPodSandboxResponse / ListContainersResponse, the
    id of a PodSandbox / Container. DecodeError only if ``data`` is not protobuf at all."""
    values: Any = _FirstField.FromString(data)
    return list(values.values)


def raw_id(item: bytes) -> str:
    try:
        ids = first_field(item)
    except Exception:  # not even protobuf framing
        ids = []
    return ids[-1].decode(errors="replace") if ids else "(no id)"


@dataclass(frozen=True)
class Listing(Generic[T]):
    """What a List call gave: the items that decode, and the ids of those that do not."""

    items: list[T]
    unreadable: tuple[str, ...] = ()


class UnreadableObjects:
    """The objects found undecodable so far. Each is logged, and passed to the listeners (a
    metric), once, when first found; `discard` / `retain` forget the ones the runtime no
    longer has, which keeps this as small as the runtime's bad objects."""

    def __init__(self) -> None:
        self._kinds: dict[str, str] = {}  # id -> kind
        self.listeners: list[Callable[[str], None]] = []  # called with the kind

    def __contains__(self, object_id: object) -> bool:
        return object_id in self._kinds

    def __len__(self) -> int:
        return len(self._kinds)

    def report(self, kind: str, object_id: str, reason: str) -> None:
        if object_id in self._kinds:
            return
        self._kinds[object_id] = kind
        log.warning("cannot decode this object from the runtime; skipped", kind=kind, id=object_id, reason=reason)
        for listener in self.listeners:
            listener(kind)

    def discard(self, object_id: str) -> None:
        self._kinds.pop(object_id, None)

    def retain(self, kind: str, listed: AbstractSet[str]) -> None:
        """Forget the objects of ``kind`` that are not in ``listed`` (a complete listing)."""
        for object_id in [i for i, k in self._kinds.items() if k == kind and i not in listed]:
            del self._kinds[object_id]


def describe_error(exc: BaseException) -> str:
    """``CODE: details`` for a failed call (ours or grpc's), else the exception's type and text."""
    code = status_of(exc)
    if code is not None:
        return f"{code_name(code)}: {details_of(exc)}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
