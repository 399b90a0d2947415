"""gRPC over HTTP/2 details the relay and our gRPC client and server need: status codes, timeouts,
message framing.

See the gRPC "PROTOCOL-HTTP2" specification: every message is a 1-byte compressed flag and
a 4-byte big-endian length, then the message; the status travels in trailers.
"""

from __future__ import annotations

import enum
import struct
import urllib.parse
import zlib
from dataclasses import dataclass
from typing import Final

from runtimeproxy.wire import frames
from runtimeproxy.wire.hpack_literal import encode_literal_block

MESSAGE_PREFIX: Final = struct.Struct(">BL")
PREFIX_LEN: Final = 5



class StatusCode(enum.IntEnum):
    """gRPC status codes (fixed by the gRPC spec, "statuscodes.md"); names as grpc.StatusCode's.
    Our own table, so that the relay and the store never need to import grpc."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


CODE_NAMES: Final[dict[int, str]] = {code.value: code.name for code in StatusCode}
OK: Final = 0
CANCELLED: Final = 1
UNKNOWN: Final = 2
INVALID_ARGUMENT: Final = 3
DEADLINE_EXCEEDED: Final = 4
RESOURCE_EXHAUSTED: Final = 8
UNIMPLEMENTED: Final = 12
INTERNAL: Final = 13
UNAVAILABLE: Final = 14

_TIMEOUT_UNITS: Final = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# Characters gRPC allows unescaped in grpc-message: printable ASCII except '%'.
_MESSAGE_SAFE: Final = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def parse_status(value: str) -> int:
    """The grpc-status header as a code; UNKNOWN when it is not a plain decimal number."""
    return int(value) if value.isascii() and value.isdigit() else UNKNOWN


def code_name(code: int) -> str:
    return CODE_NAMES.get(code, str(code))


def parse_timeout(value: str) -> float | None:
    """Seconds from a grpc-timeout header value ("119999m"), or None when malformed."""
    digits = value[:-1]
    if len(value) < 2 or value[-1] not in _TIMEOUT_UNITS or not (digits.isascii() and digits.isdigit()):
        return None
    return int(value[:-1]) * _TIMEOUT_UNITS[value[-1]]


def encode_message(message: bytes, compressed: bool = False) -> bytes:
    return MESSAGE_PREFIX.pack(1 if compressed else 0, len(message)) + message


@dataclass(frozen=True, slots=True)
class Message:
    compressed: bool
    body: bytes


def split_messages(payload: bytes) -> list[Message] | None:
    """All length-prefixed messages in ``payload``; None when it does not frame exactly."""
    messages: list[Message] = []
    offset = 0
    while offset < len(payload):
        if len(payload) - offset < PREFIX_LEN:
            return None
        flag, length = MESSAGE_PREFIX.unpack_from(payload, offset)
        end = offset + PREFIX_LEN + length
        if end > len(payload):
            return None
        messages.append(Message(bool(flag), payload[offset + PREFIX_LEN : end]))
        offset = end
    return messages


class BadRequest(ValueError):
    """A request body the proxy cannot take as exactly one message; the text says why."""


# Encodings a gRPC peer may name in grpc-encoding that the proxy can read.
_DECOMPRESSORS: Final = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
READABLE_ENCODINGS: Final = frozenset(_DECOMPRESSORS)


def single_request(payload: bytes, encoding: str, limit: int) -> bytes:
    """The one message of a unary request, decompressed; BadRequest when it is not that."""
    return single_message(payload, encoding, limit, "request")


def single_message(payload: bytes, encoding: str, limit: int, kind: str) -> bytes:
    """The one message of a unary ``kind`` ("request", "response"), decompressed; BadRequest
    (the text names ``kind``) when it is not that."""
    if len(payload) >= PREFIX_LEN:  # the usual case, one uncompressed message: read in place
        flag, length = MESSAGE_PREFIX.unpack_from(payload, 0)
        if not flag and length == len(payload) - PREFIX_LEN:
            return payload[PREFIX_LEN:]
    messages = split_messages(payload)
    if messages is None:
        raise BadRequest(f"{kind} body is not whole length-prefixed gRPC messages")
    if len(messages) != 1:
        raise BadRequest(f"a unary {kind} must carry exactly one message, got {len(messages)}")
    message = messages[0]
    if not message.compressed:
        return message.body
    return _decompress(message.body, encoding, limit)


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    wbits = _DECOMPRESSORS.get(encoding)
    if wbits is None:
        raise BadRequest(f"compressed message with grpc-encoding {encoding!r} (readable: gzip, deflate)")
    inflater = zlib.decompressobj(wbits)
    try:
        plain = inflater.decompress(body, limit + 1)  # bounded: a small bomb cannot take memory
    except zlib.error as exc:
        raise BadRequest(f"{encoding} message does not decompress: {exc}") from None
    if len(plain) > limit:
        raise BadRequest(f"{encoding} message inflates to over the proxy's limit of {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise BadRequest(f"{encoding} message is truncated or has trailing bytes")
    return plain


class MessageSizer:
    """Follows message boundaries through a stream's DATA and flags a message over the limit.

    Only the 5-byte prefixes are looked at, so checking the limit costs a few integer
    operations per DATA frame whatever the message size.
    """

    __slots__ = ("_body_left", "_prefix", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._body_left = 0
        self._prefix = b""

    def feed(self, data: bytes | memoryview, start: int, end: int) -> int | None:
        """Account for ``data[start:end]``; return the length of a message over the limit."""
        # A call's DATA frames that are each one whole message need no sizer at all: the relay
        # makes one only for a call that sends anything else (frame_machine._oversized).
        pos, left = start, self._body_left
        length: int
        while pos < end:
            if left:
                if left >= end - pos:  # the rest of the chunk is message body
                    self._body_left = left - (end - pos)
                    return None
                pos += left
                left = 0
            if self._prefix or end - pos < PREFIX_LEN:
                # A prefix split across chunks: collect it piece by piece.
                take = min(PREFIX_LEN - len(self._prefix), end - pos)
                self._prefix += bytes(data[pos : pos + take])
                pos += take
                if len(self._prefix) < PREFIX_LEN:
                    self._body_left = 0
                    return None
                length = int.from_bytes(self._prefix[1:], "big")
                self._prefix = b""
            else:  # the common case, a whole prefix in the chunk: read in place
                length = MESSAGE_PREFIX.unpack_from(data, pos)[1]
                pos += PREFIX_LEN
            if length > self.limit:
                self._body_left = 0
                return length
            left = length
        self._body_left = left
        return None


def status_headers(code: int, message: str, trailers_only: bool) -> list[tuple[str, str]]:
    """Header fields that end a call with ``code``; a trailers-only response carries more."""
    fields = [("grpc-status", str(code))]
    if message:
        fields.append(("grpc-message", urllib.parse.quote(message, safe=_MESSAGE_SAFE)))
    if trailers_only:
        fields = [(":status", "200"), ("content-type", "application/grpc"), *fields]
    return fields


def status_frame(stream_id: int, code: int, message: str, trailers_only: bool) -> bytes:
    """A HEADERS frame with END_STREAM that ends the call, safe to inject into any connection."""
    block = encode_literal_block(status_headers(code, message, trailers_only))
    flags = frames.FLAG_END_STREAM | frames.FLAG_END_HEADERS
    return frames.frame(frames.HEADERS, flags, stream_id, block)


def decode_grpc_message(value: str) -> str:
    return urllib.parse.unquote(value)
