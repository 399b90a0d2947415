"""HTTP/2 frame layout (RFC 9113 section 4) and builders for the frames our HTTP/2 ends write.

The relay forwards almost every frame byte for byte; it only builds frames of its own to
answer a call it ended (an error), to give flow-control credit back, to answer PINGs, and to
shut down.
"""

from __future__ import annotations

import struct
from typing import Final

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_LEN: Final = 9
# length is 24 bits: read as 16 + 8, then type, flags and the stream id with its reserved bit.
FRAME_HEADER: Final = struct.Struct(">HBBBL")

DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

FLAG_END_STREAM: Final = 0x1
FLAG_ACK: Final = 0x1
FLAG_END_HEADERS: Final = 0x4
FLAG_PADDED: Final = 0x8
FLAG_PRIORITY: Final = 0x20

# Error codes (RFC 9113 section 7).
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
ENHANCE_YOUR_CALM: Final = 0xB  # the peer went over a limit (wire.peer_limits)

# SETTINGS identifiers the relay cares about.
SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5

DEFAULT_WINDOW: Final = 65_535
DEFAULT_MAX_FRAME: Final = 16_384
MAX_STREAM_ID: Final = 0x7FFF_FFFF
MAX_WINDOW_INCREMENT: Final = 0x7FFF_FFFF


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: 9-byte header and payload."""
    length = len(payload)
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, ftype, flags, stream_id) + payload


def window_update(stream_id: int, increment: int) -> bytes:
    """WINDOW_UPDATE frames for ``increment`` bytes, split when over the 31-bit maximum."""
    out = bytearray()
    while increment > 0:
        step = min(increment, MAX_WINDOW_INCREMENT)
        out += frame(WINDOW_UPDATE, 0, stream_id, step.to_bytes(4, "big"))
        increment -= step
    return bytes(out)


def rst_stream(stream_id: int, error_code: int = CANCEL) -> bytes:
    return frame(RST_STREAM, 0, stream_id, error_code.to_bytes(4, "big"))


def goaway(last_stream_id: int, error_code: int = NO_ERROR, debug: bytes = b"") -> bytes:
    payload = last_stream_id.to_bytes(4, "big") + error_code.to_bytes(4, "big") + debug
    return frame(GOAWAY, 0, 0, payload)


def settings(values: dict[int, int] | None = None) -> bytes:
    payload = b"".join(
        ident.to_bytes(2, "big") + value.to_bytes(4, "big")
        for ident, value in (values or {}).items()
    )
    return frame(SETTINGS, 0, 0, payload)


def settings_ack() -> bytes:
    return frame(SETTINGS, FLAG_ACK, 0)


_PING_ACK_HEADER: Final = FRAME_HEADER.pack(0, 8, PING, FLAG_ACK, 0)


def ping_ack(payload: bytes | memoryview) -> bytes:
    """The answer to a PING: the same opaque data, with ACK (RFC 9113 section 6.7)."""
    if len(payload) == 8:  # every well-formed PING: a header built once (the relay answers one per call)
        return _PING_ACK_HEADER + payload
    return frame(PING, FLAG_ACK, 0, bytes(payload))


def parse_settings(payload: bytes | memoryview) -> dict[int, int]:
    """Identifier to value; later entries win, as RFC 9113 section 6.5.3 asks."""
    values: dict[int, int] = {}
    for offset in range(0, len(payload) - len(payload) % 6, 6):
        ident = int.from_bytes(payload[offset : offset + 2], "big")
        values[ident] = int.from_bytes(payload[offset + 2 : offset + 6], "big")
    return values


def data_frames(stream_id: int, body: bytes, max_frame: int, end_stream: bool) -> list[bytes]:
    """``body`` as DATA frames of at most ``max_frame`` bytes; END_STREAM on the last one."""
    chunks = [body[i : i + max_frame] for i in range(0, len(body), max_frame)] or [b""]
    last = len(chunks) - 1
    return [
        frame(DATA, FLAG_END_STREAM if end_stream and i == last else 0, stream_id, chunk)
        for i, chunk in enumerate(chunks)
    ]


def header_block_fragment(flags: int, payload: bytes | memoryview) -> bytes | memoryview:
    """The header block fragment of a HEADERS payload, without padding and priority fields;
    empty when the padding or priority fields do not fit (the receiver refuses such a frame as
    a connection error, RFC 9113 section 6.2; the relay, which forwards it, must not fail on it)."""
    start, end = 0, len(payload)
    if flags & FLAG_PADDED:
        if not payload:
            return payload[0:0]
        start = 1
        end -= payload[0]
    if flags & FLAG_PRIORITY:
        start += 5
    return payload[start : max(start, end)]


def data_bounds(flags: int, data: bytes | memoryview, start: int, end: int) -> tuple[int, int]:
    """(start, end) of the application data of the DATA payload ``data[start:end]``: padding
    removed, found in place, without copying the payload out of the read buffer (a large
    response's DATA frame is most of what the relay reads). A PADDED frame
    with no pad length, or padding as long as its payload or longer, carries no data: (end,
    end). The relay forwards such a frame unchanged and its receiver refuses it as a connection
    error (RFC 9113 section 6.1); the relay itself must not fail on it.
    """
    if flags & FLAG_PADDED:
        if start >= end or data[start] >= end - start:
            return end, end
        return start + 1, end - data[start]
    return start, end
