"""ttrpc framing: the 10-byte message header and an incremental decoder.

ttrpc (github.com/containerd/ttrpc v1.2.4, channel.go) sends each message as a header then
its payload. The header, big-endian: payload length (uint32), stream id (uint32), message
type (byte: 1 request, 2 response, 3 data), flags (byte: 1 remote closed, 2 remote open, 4 no
data). A unary call is one request frame from the client on a new odd stream id (1, 3, 5...)
and one response frame back on the same id. A payload over 4 MiB is refused: the receiver
skips it and answers RESOURCE_EXHAUSTED (ttrpc does the same).

The decoder is fed whatever the byte stream delivers, split anywhere, and hands back whole
frames; it never raises on content (an unknown type is still a frame, for the endpoint to
judge), only holds at most one header plus one payload.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

__all__ = [
    "FLAG_NO_DATA",
    "FLAG_REMOTE_CLOSED",
    "FLAG_REMOTE_OPEN",
    "HEADER",
    "MAX_MESSAGE_SIZE",
    "Frame",
    "FrameDecoder",
    "MessageType",
    "Oversized",
    "encode_frame",
]

HEADER: Final = struct.Struct(">IIBB")
MAX_MESSAGE_SIZE: Final = 4 << 20  # ttrpc's messageLengthMax
FLAG_REMOTE_CLOSED: Final = 0x1
FLAG_REMOTE_OPEN: Final = 0x2
FLAG_NO_DATA: Final = 0x4


class MessageType(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


@dataclass(frozen=True, slots=True)
class Frame:
    stream_id: int
    type: int  # a MessageType value, or whatever the peer sent
    flags: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Oversized:
    """A frame whose payload was over MAX_MESSAGE_SIZE: skipped, to be answered with an error."""

    stream_id: int
    type: int
    length: int


def encode_frame(stream_id: int, type_: int, payload: bytes, flags: int = 0) -> bytes:
    """One frame on the wire. ValueError for a payload over MAX_MESSAGE_SIZE (the peer would refuse it)."""
    if len(payload) > MAX_MESSAGE_SIZE:
        raise ValueError(f"ttrpc message of {len(payload)} bytes is over the {MAX_MESSAGE_SIZE}-byte limit")
    return HEADER.pack(len(payload), stream_id, type_, flags) + payload


class FrameDecoder:
    """Whole frames out of a byte stream fed in pieces of any size."""

    def __init__(self, max_size: int = MAX_MESSAGE_SIZE) -> None:
        self.max_size = max_size
        self._buffer = bytearray()
        self._skip = 0  # bytes of an oversized payload still to drop

    def feed(self, data: bytes) -> list[Frame | Oversized]:
        out: list[Frame | Oversized] = []
        self._buffer += data
        while True:
            if self._skip:
                dropped = min(self._skip, len(self._buffer))
                del self._buffer[:dropped]
                self._skip -= dropped
                if self._skip:
                    return out
            if len(self._buffer) < HEADER.size:
                return out
            length, stream_id, type_, flags = HEADER.unpack_from(self._buffer)
            if length > self.max_size:
                del self._buffer[: HEADER.size]
                self._skip = length
                out.append(Oversized(stream_id, type_, length))
                continue
            end = HEADER.size + length
            if len(self._buffer) < end:
                return out
            out.append(Frame(stream_id, type_, flags, bytes(self._buffer[HEADER.size : end])))
            del self._buffer[:end]

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame, held or still to skip (0 between frames)."""
        return len(self._buffer) + self._skip

    @property
    def held(self) -> int:
        """Bytes kept in memory: after a feed, never more than one header plus ``max_size``."""
        return len(self._buffer)
