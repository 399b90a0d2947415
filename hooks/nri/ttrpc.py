"""ttrpc framing: the 10-byte message header and an incremental decoder.

ttrpc (github.com/containerd/ttrpc v1.2.4, channel.go) sends each message as a header then
its payload. The header, big-endian: payload length (uint32), stream id (uint32), message
type (byte: 1 request, 2 response, 3 data), flags (byte: 1 remote closed, 2 remote open, 4 no
data). A unary call is one request frame from the client on a new odd stream id (1, 3, 5...)
and one response frame back on the same id.

**Size limit.** ttrpc's messageLengthMax is 4 MiB. A header declaring more ends the stream:
the decoder raises :class:`FrameTooLarge` and the connection must be closed (the plugin then
reconnects). ttrpc's own receiver discards the declared bytes and answers RESOURCE_EXHAUSTED
instead; with a length read from a corrupt stream that would swallow up to 4 GiB of it, and
every request in them would go unanswered. A genuine message over the limit fails either way
(ttrpc from v1.2.6 refuses to send one; v1.2.4, in containerd 1.7, sends it and a Go
receiver answers RESOURCE_EXHAUSTED); here the runtime sees the connection close instead.

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
    "FrameTooLarge",
    "MessageType",
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


class FrameTooLarge(ValueError):
    """A header declared a payload over the limit: the stream cannot be read on (see the module doc)."""

    def __init__(self, stream_id: int, length: int, limit: int) -> None:
        self.stream_id = stream_id
        self.length = length
        self.limit = limit
        super().__init__(f"ttrpc frame on stream {stream_id} declares {length} bytes, over the {limit}-byte limit")


def encode_frame(stream_id: int, type_: int, payload: bytes, flags: int = 0) -> bytes:
    """One frame on the wire. ValueError for a payload over MAX_MESSAGE_SIZE (the peer would refuse it)."""
    if len(payload) > MAX_MESSAGE_SIZE:
        raise ValueError(f"ttrpc message of {len(payload)} bytes is over the {MAX_MESSAGE_SIZE}-byte limit")
    return HEADER.pack(len(payload), stream_id, type_, flags) + payload


class FrameDecoder:
    """Whole frames out of a byte stream fed in pieces of any size; FrameTooLarge ends it."""

    def __init__(self, max_size: int = MAX_MESSAGE_SIZE) -> None:
        self.max_size = max_size
        self._buffer = bytearray()
        self._broken: FrameTooLarge | None = None

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes. FrameTooLarge at a header over ``max_size``, and on
        every feed after it: the frames before it in the same feed are not handed out, as the
        connection they came on is to be closed."""
        if self._broken is not None:
            raise self._broken
        out: list[Frame] = []
        self._buffer += data
        while len(self._buffer) >= HEADER.size:
            length, stream_id, type_, flags = HEADER.unpack_from(self._buffer)
            if length > self.max_size:
                self._buffer.clear()
                self._broken = FrameTooLarge(stream_id, length, self.max_size)
                raise self._broken
            end = HEADER.size + length
            if len(self._buffer) < end:
                break
            out.append(Frame(stream_id, type_, flags, bytes(self._buffer[HEADER.size : end])))
            del self._buffer[:end]
        return out

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame held: 0 between frames, never more than one header plus ``max_size``."""
        return len(self._buffer)
