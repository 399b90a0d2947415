"""One HTTP/2 connection end for unary gRPC: what our client (grpc_client) and server (grpc_server) share.

`H2Peer` is an asyncio protocol that reads frames (RFC 9113 section 4) and keeps the
connection state both sides need the same way:

* the frame read loop, with frames over the 16384 bytes we allow (we never raise
  SETTINGS_MAX_FRAME_SIZE) refused; the server side first checks the client preface;
* header blocks: HEADERS plus CONTINUATION assembled (nothing else may come between them),
  padding and priority fields removed, at most `MAX_HEADER_BLOCK` bytes, decoded with the
  relay's CachingDecoder (peers do use the dynamic table, so every block is decoded, also
  one for a stream we no longer follow), or here when it is literals only (what our own
  client and server send; the last few such blocks are remembered);
* SETTINGS (the peer's initial stream window, applied to open streams too; its maximum frame
  size and concurrent streams), PING answered, WINDOW_UPDATE credited to the send windows;
* sending a message body within the peer's stream and connection windows and its maximum
  frame size (`send`): what fits goes out in one write, the rest once WINDOW_UPDATEs open room;
* our receive windows: opened at once to a whole message of the largest size, so a large
  message needs no round trips; the connection's credited back here as DATA arrives (batched
  to half a window), a stream's by the subclass if it needs to;
* protocol errors: GOAWAY with the RFC's error code, connection closed, one log line;
* the limits every peer is held to (wire.peer_limits): PING, SETTINGS, RST_STREAM, empty and
  CONTINUATION frames counted, control answers capped while the peer does not read; a peer
  over one gets GOAWAY ENHANCE_YOUR_CALM. Above its high-water mark the write buffer stops
  the reading (backpressure), and messages wait for it to drain (`send`).

Subclasses get the stream-level events (`_on_headers`, `_on_data`, `_on_rst_stream`,
`_on_goaway`) and the end of the connection (`_closed`, exactly once). Also here: `RpcError`,
the status of a failed call on either side, and the helpers reading one.

A call's frames (unpadded DATA, a header block in one HEADERS frame) are handled by the read
loop itself, and a read of whole frames is parsed in place, without a copy: a hook call comes
after an idle gap, with cold CPU caches, so every Python call and object on its path costs.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Mapping
from typing import Final, Generic, TypeVar, cast

import hpack
import structlog

from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import StatusCode
from runtimeproxy.wire.hpack_cache import CachingDecoder
from runtimeproxy.wire.peer_limits import (
    CLOSE_GRACE,
    DEFAULT_LIMITS,
    LimitSettings,
    PeerLimits,
    PeerOverLimit,
    header_block_over,
    peer_pid,
)

__all__ = [
    "GRPC_OK_TRAILERS",
    "GRPC_RESPONSE_HEADERS",
    "MAX_HEADER_BLOCK",
    "MAX_LITERAL_BLOCKS",
    "SETTINGS_MAX_CONCURRENT_STREAMS",
    "H2Peer",
    "PeerStream",
    "ProtocolViolation",
    "RpcError",
    "decode_literal_block",
    "details_of",
    "header_frames",
    "status_of",
]

log = structlog.get_logger("runtimeproxy.wire.h2_peer")

SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6
# Error codes (RFC 9113 section 7) beyond those in wire.frames.
FLOW_CONTROL_ERROR: Final = 0x3
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = frames.ENHANCE_YOUR_CALM
# Largest header block (and decoded header list) accepted from the peer; grpc-core's default
# hard limit for metadata is 16 KiB, so this leaves room.
MAX_HEADER_BLOCK: Final = 64 * 1024
# Literal-only header blocks remembered per connection (emptied when full): our server sends
# the same response headers and trailers on every call.
MAX_LITERAL_BLOCKS: Final = 64
# What our server answers a call that went well, before and after the message: the client
# recognises these lists (a comparison) instead of reading them field by field.
GRPC_RESPONSE_HEADERS: Final = [(":status", "200"), ("content-type", "application/grpc")]
GRPC_OK_TRAILERS: Final = [("grpc-status", "0")]
# HEADERS flags that send a frame the general way: a block continued, padding, priority.
_PLAIN_HEADERS_MASK: Final = frames.FLAG_END_HEADERS | frames.FLAG_PADDED | frames.FLAG_PRIORITY
# A DATA frame's header and the gRPC message prefix (flag, length) that starts its payload.
_DATA_MESSAGE: Final = struct.Struct(frames.FRAME_HEADER.format + grpc_framing.MESSAGE_PREFIX.format.lstrip(">"))
# The frames module's names that a call's frames read, as this module's (a bytecode less each).
_unpack_frame_header: Final = frames.FRAME_HEADER.unpack_from
_pack_data_message: Final = _DATA_MESSAGE.pack
_HEADER_LEN: Final = frames.HEADER_LEN
_MAX_FRAME: Final = frames.DEFAULT_MAX_FRAME
_MAX_STREAM_ID: Final = frames.MAX_STREAM_ID
_DATA: Final = frames.DATA
_HEADERS: Final = frames.HEADERS
_PADDED: Final = frames.FLAG_PADDED
_END_STREAM: Final = frames.FLAG_END_STREAM
_END_HEADERS: Final = frames.FLAG_END_HEADERS
_PREFIX_LEN: Final = grpc_framing.PREFIX_LEN


class RpcError(Exception):
    """A call that ended with a status other than OK, from the peer or decided here.

    A server handler raises it to answer that status (`code`, `details`)."""

    def __init__(self, code: int, details: str) -> None:
        self._code = StatusCode(code) if code in grpc_framing.CODE_NAMES else StatusCode.UNKNOWN
        self._details = details
        super().__init__(f"{self._code.name}: {details}")

    def code(self) -> StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def status_of(exc: BaseException) -> int | None:
    """The gRPC status code of a failed call, `RpcError` or grpc's AioRpcError (read by its
    ``code()``, so grpc need not be imported); None for any other exception."""
    if isinstance(exc, RpcError):
        return int(exc.code())
    code_method = getattr(exc, "code", None)
    if not callable(code_method) or not callable(getattr(exc, "details", None)):
        return None
    code = code_method()
    value = getattr(code, "value", code)  # grpc.StatusCode's value is (number, text)
    number = value[0] if isinstance(value, tuple) else value
    return number if isinstance(number, int) else None


def details_of(exc: BaseException) -> str:
    """The details text of a failed call (`RpcError` or grpc's), else the exception's text."""
    details = getattr(exc, "details", None)
    return str(details()) if callable(details) else str(exc)


def header_frames(stream_id: int, block: bytes, end_stream: bool, max_frame: int) -> bytes:
    """``block`` as one HEADERS frame, or HEADERS plus CONTINUATION frames when it is longer
    than the peer's maximum frame size (RFC 9113 section 6.10)."""
    size = len(block)
    if size <= max_frame:  # the usual case: one frame (frames.frame, inlined: a call less)
        flags = frames.FLAG_END_HEADERS | (frames.FLAG_END_STREAM if end_stream else 0)
        return frames.FRAME_HEADER.pack(size >> 8, size & 0xFF, frames.HEADERS, flags, stream_id) + block
    pieces = [block[i : i + max_frame] for i in range(0, len(block), max_frame)] or [b""]
    out = bytearray()
    for n, piece in enumerate(pieces):
        flags = frames.FLAG_END_HEADERS if n == len(pieces) - 1 else 0
        if n == 0:
            out += frames.frame(frames.HEADERS, flags | (frames.FLAG_END_STREAM if end_stream else 0), stream_id, piece)
        else:
            out += frames.frame(frames.CONTINUATION, flags, stream_id, piece)
    return bytes(out)


def decode_literal_block(block: bytes) -> list[tuple[str, str]] | None:
    """The header fields of ``block`` when it is made only of literals without indexing or never
    indexed, with literal names and no Huffman coding (what hpack_literal writes: our client's
    requests, our server's answers; RFC 7541 sections 6.2.2, 6.2.3); None for any other block.

    Such fields never touch the dynamic table, so decoding them here keeps the HPACK decoder in
    step, and it is much cheaper: a request's block differs in grpc-timeout from call to call, so
    the CachingDecoder would decode each one in full (about 35 us). Values as latin-1 text, as
    hpack_cache gives them. OversizedHeaderListError past `MAX_HEADER_BLOCK`, as the decoder.
    """
    fields: list[tuple[str, str]] = []
    size = 0
    offset, end = 0, len(block)
    while offset < end:
        if block[offset] & 0xEF:  # 0x00 (without indexing) or 0x10 (never indexed), name index 0
            return None
        name, offset = _literal_string(block, offset + 1, end)
        value, offset = _literal_string(block, offset, end)
        if name is None or value is None:
            return None
        size += len(name) + len(value) + 32  # RFC 7541 section 4.1, as SETTINGS_MAX_HEADER_LIST_SIZE counts
        if size > MAX_HEADER_BLOCK:
            raise hpack.OversizedHeaderListError(f"header list over {MAX_HEADER_BLOCK} bytes")
        fields.append((name, value))
    return fields


def _literal_string(block: bytes, offset: int, end: int) -> tuple[str | None, int]:
    """A string literal without Huffman coding at ``offset`` (RFC 7541 section 5.2), as
    latin-1 text, and the offset after it; None for a Huffman-coded or truncated one."""
    if offset >= end:
        return None, offset
    length = block[offset]
    offset += 1
    if length >= 0x7F:  # Huffman-coded (0x80 set), or the integer continues (section 5.1)
        if length & 0x80:
            return None, offset
        shift = 0
        while True:
            if offset >= end or shift > 28:
                return None, offset
            byte = block[offset]
            offset += 1
            length += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
    stop = offset + length
    if stop > end:
        return None, offset
    return block[offset:stop].decode("latin-1"), stop


class ProtocolViolation(Exception):
    """The peer broke HTTP/2: the connection ends with GOAWAY ``h2_code``."""

    def __init__(self, h2_code: int, reason: str) -> None:
        super().__init__(reason)
        self.h2_code = h2_code


class PeerStream:
    """What the connection tracks of every open stream: our send window on it."""

    __slots__ = ("send_window",)

    def __init__(self, send_window: int) -> None:
        self.send_window = send_window

    def ended(self) -> bool:
        """Whether the stream is over (a sender waiting for a window stops)."""
        raise NotImplementedError


S = TypeVar("S", bound=PeerStream)


class H2Peer(asyncio.Protocol, Generic[S]):
    """The shared half of an HTTP/2 connection end; see the module doc.

    ``streams`` holds the open streams; a subclass adds and removes them and calls
    ``stream_over`` when one is removed, so that waiting senders look again.
    """

    def __init__(
        self,
        name: str,
        max_message_size: int,
        *,
        server: bool,
        peer: str,
        settings: Mapping[int, int] | None = None,
        limits: LimitSettings = DEFAULT_LIMITS,
    ) -> None:
        self.name = name
        self.peer_limits = PeerLimits(peer, limits)  # ``peer``: its kind (peer_limits.PEER_KINDS)
        self.writing_paused = False  # the write buffer is over its high-water mark: senders wait
        self._gone = False  # connection_lost came: nothing left to abort
        self.limit = max_message_size
        # Our receive windows: a whole message of the largest size fits at once.
        self.window = min(max_message_size + grpc_framing.PREFIX_LEN, frames.MAX_WINDOW_INCREMENT)
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, S] = {}
        self.lost: str | None = None  # why the connection ended, once it has
        self.decoder = CachingDecoder(max_header_list_size=MAX_HEADER_BLOCK)
        # Decoded literal-only blocks (they never touch the dynamic table, so a hit is always
        # right); the lists are shared between hits: not to be changed.
        self._literal_blocks: dict[bytes, list[tuple[str, str]]] = {}
        self.peer_window = frames.DEFAULT_WINDOW  # peer's initial stream window
        self.peer_max_frame = frames.DEFAULT_MAX_FRAME
        self.peer_max_streams = frames.MAX_STREAM_ID  # no limit until the peer sets one
        self.send_window = frames.DEFAULT_WINDOW  # connection-level, towards the peer
        self.progress = asyncio.Event()  # set when a window opens or a stream ends
        self._waiting = 0  # coroutines in wait_progress: a stream's end wakes them only
        self.unacked = 0  # connection-level bytes received and not yet credited back
        self.credit_at = self.window // 2  # unacked bytes that are credited back (a WINDOW_UPDATE)
        self._server = server
        self._settings_sent = {
            SETTINGS_ENABLE_PUSH: 0,
            frames.SETTINGS_INITIAL_WINDOW_SIZE: self.window,
            SETTINGS_MAX_HEADER_LIST_SIZE: MAX_HEADER_BLOCK,
            **(settings or {}),
        }
        self._preface_seen = not server  # a server first reads the client's preface
        self._buffer = bytearray()  # the start of a frame that the last read cut
        self._headers_of = 0  # stream whose header block continues in CONTINUATION frames
        self._block = bytearray()
        self._block_flags = 0
        self._continuations = 0  # CONTINUATION frames in the open header block

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        limits = self.peer_limits.values
        transport.set_write_buffer_limits(high=limits.write_buffer_high, low=limits.write_buffer_low)
        transport.write(
            (b"" if self._server else frames.PREFACE)
            + frames.settings(self._settings_sent)
            + frames.window_update(0, self.window - frames.DEFAULT_WINDOW)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone = True
        reason = f": {exc}" if exc else ""
        self._lose(f"connection to {self.name} closed{reason}")

    def data_received(self, data: bytes) -> None:
        if self.lost is not None:
            return
        try:
            if self._buffer:  # the rest of a cut frame first: one copy of it, then parsed in place
                self._buffer += data
                data = bytes(self._buffer)
                self._buffer.clear()
            offset = 0 if self._preface_seen else self._take_preface(data)
            if offset is not None:
                offset = self._parse(data, offset)
                if offset < len(data) and self.lost is None:
                    self._buffer += memoryview(data)[offset:]
        except PeerOverLimit as exc:
            self.peer_limits.report(exc, self.name, peer_pid(self.transport))
            self.abort(ENHANCE_YOUR_CALM, str(exc))
        except ProtocolViolation as exc:
            log.warning(
                "closing the HTTP/2 connection: the peer broke the protocol",
                peer=self.name, reason=str(exc), h2_error=exc.h2_code,
            )
            self.abort(exc.h2_code, str(exc))
        except Exception as exc:  # our bug: this connection ends, the others go on
            log.exception("closing the HTTP/2 connection: internal error", peer=self.name, error=repr(exc))
            self.abort(frames.INTERNAL_ERROR, f"internal error: {type(exc).__name__}")

    def pause_writing(self) -> None:
        """The write buffer went over its high-water mark: read nothing more from a peer that
        does not read what it gets, and let senders wait (backpressure)."""
        self.writing_paused = True
        self.peer_limits.pause(True)
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self.peer_limits.pause(False)
        if self.transport is not None:
            self.transport.resume_reading()
        self.progress.set()  # senders waiting for the buffer to drain

    # -- for subclasses ------------------------------------------------------------------------

    def _on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        raise NotImplementedError

    def _on_data(self, stream_id: int, data: bytes, end_stream: bool, flow_size: int) -> None:
        """A DATA frame on a stream: its data without padding; ``flow_size`` is what it counts
        against our windows (padding included), for the subclass to credit back."""
        raise NotImplementedError

    def _on_rst_stream(self, stream_id: int, error_code: int) -> None:
        raise NotImplementedError

    def _on_goaway(self, last_stream_id: int, error_code: int) -> None:
        raise NotImplementedError

    def _closed(self, reason: str) -> None:
        """The connection ended (``reason`` says how): end what still waits on it."""
        raise NotImplementedError

    def _last_stream_id(self) -> int:
        """The GOAWAY's last stream id: the highest peer-initiated stream we process."""
        return 0

    def stream_over(self) -> None:
        """A stream left ``streams``: senders waiting for a window check theirs again."""
        if self._waiting:
            self.progress.set()

    async def wait_progress(self) -> None:
        """Wait until a window opens, a stream ends or the connection is lost."""
        self.progress.clear()
        self._waiting += 1
        try:
            await self.progress.wait()
        finally:
            self._waiting -= 1

    def write(self, data: bytes) -> None:
        if self.transport is not None and self.lost is None:
            self.transport.write(data)

    def answer(self, data: bytes) -> None:
        """Write a control frame that answers the peer (PING or SETTINGS ACK, RST_STREAM): capped
        while the peer does not read (peer_limits, ``queued_answers``)."""
        self.peer_limits.answered()
        self.write(data)

    def send_message_now(self, stream_id: int, stream: S, head: bytes, message: bytes, tail: bytes) -> bool:
        """`send` of one uncompressed gRPC ``message`` (its 5-byte prefix packed here, with the
        DATA frame's header) when it fits one DATA frame within the windows (the usual case):
        written at once, in one write, and True; else nothing is written and False (also while
        the write buffer is over its mark)."""
        size = len(message)
        take = size + _PREFIX_LEN
        if (
            take <= self.send_window
            and take <= stream.send_window
            and take <= self.peer_max_frame
            and not self.writing_paused
        ):
            self.send_window -= take
            stream.send_window -= take
            self.peer_limits.data_sent()
            data = _pack_data_message(take >> 8, take & 0xFF, _DATA, 0 if tail else _END_STREAM, stream_id, 0, size)
            if self.transport is not None and self.lost is None:  # write(), inlined: a call less
                self.transport.write(head + data + message + tail)
            return True
        return False

    async def send(self, stream_id: int, stream: S, head: bytes, body: bytes, tail: bytes) -> bool:
        """Write ``head`` (frames), the non-empty ``body`` as DATA frames within the peer's
        windows and maximum frame size, then ``tail`` (frames). The last DATA frame carries
        END_STREAM when there is no tail. What fits at once goes out in one write; nothing goes
        while the write buffer is over its mark. False when the stream or the connection ended
        while waiting. (A call's usual message goes by `send_message_now`.)"""
        out = bytearray(head)
        view = memoryview(body)
        while True:
            take = 0 if self.writing_paused else min(self.send_window, stream.send_window, len(view))
            if take > 0:
                chunk, view = view[:take], view[take:]
                self.send_window -= take
                stream.send_window -= take
                out += b"".join(frames.data_frames(stream_id, bytes(chunk), self.peer_max_frame, not view and not tail))
                self.peer_limits.data_sent()
            if not view and not self.writing_paused:
                self.write(bytes(out + tail))
                return True
            if out and not self.writing_paused:
                self.write(bytes(out))
                out.clear()
            await self.wait_progress()
            if stream.ended() or self.lost is not None:
                return False

    def abort(self, h2_code: int, reason: str) -> None:
        """End the connection for a protocol error: GOAWAY ``h2_code``, then close; a peer that
        does not read it is cut off after CLOSE_GRACE seconds."""
        if self.transport is not None and self.lost is None:
            self.transport.write(frames.goaway(self._last_stream_id(), h2_code, reason.encode()[:200]))
            self.transport.close()
            self.loop.call_later(CLOSE_GRACE, self._cut_off)
        self._lose(f"HTTP/2 connection to {self.name} failed: {reason}")

    def _cut_off(self) -> None:
        if not self._gone and self.transport is not None:
            self.transport.abort()

    def _lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            self._closed(reason)
        self.progress.set()  # senders waiting for a window see the connection gone

    # -- frames ----------------------------------------------------------------------------------

    def _take_preface(self, data: bytes) -> int | None:
        """The length of the client preface once it is all in ``data`` (None before: ``data`` is
        kept for the next read); a wrong one is a protocol error."""
        got = data[: len(frames.PREFACE)]
        if not frames.PREFACE.startswith(got):
            raise ProtocolViolation(frames.PROTOCOL_ERROR, "the connection does not start with the HTTP/2 preface")
        if len(got) < len(frames.PREFACE):
            self._buffer += data
            return None
        self._preface_seen = True
        return len(frames.PREFACE)

    def _parse(self, data: bytes, offset: int) -> int:
        """Handle the whole frames in ``data`` from ``offset``; the offset after the last one.
        (The frames module's constants are read through this module's own names: fewer
        bytecodes a frame.)"""
        size = len(data)
        while offset + _HEADER_LEN <= size:
            high, low, ftype, flags, stream_id = _unpack_frame_header(data, offset)
            length = high << 8 | low
            if length > _MAX_FRAME:  # we never raise SETTINGS_MAX_FRAME_SIZE
                raise ProtocolViolation(FRAME_SIZE_ERROR, f"frame of {length} bytes over the 16384 allowed")
            start = offset + _HEADER_LEN
            end = start + length
            if end > size:
                break
            offset = end
            payload = data[start:end]
            stream_id &= _MAX_STREAM_ID
            # A call's frames right here (see the module doc); the rest through _frame.
            if self._headers_of or not stream_id:
                self._frame(ftype, flags, stream_id, payload)
            elif ftype == _DATA and not flags & _PADDED and length:
                unacked = self.unacked + length  # _credit_connection, inlined: a call less
                if unacked >= self.credit_at:
                    self.write(frames.window_update(0, unacked))
                    unacked = 0
                self.unacked = unacked
                self._on_data(stream_id, payload, flags & _END_STREAM != 0, length)
            elif ftype == _HEADERS and flags & _PLAIN_HEADERS_MASK == _END_HEADERS and length:
                headers = self._literal_blocks.get(payload)
                if headers is None:
                    headers = self._decode(payload)
                self._on_headers(stream_id, headers, flags & _END_STREAM != 0)
            else:
                self._frame(ftype, flags, stream_id, payload)
            if self.lost is not None:
                break
        return offset

    def _frame(self, ftype: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._headers_of and ftype != frames.CONTINUATION:
            raise ProtocolViolation(frames.PROTOCOL_ERROR, "header block interrupted before END_HEADERS")
        if ftype == frames.DATA:
            self._data(flags, stream_id, payload)
        elif ftype in (frames.HEADERS, frames.CONTINUATION):
            self._header_fragment(ftype, flags, stream_id, payload)
        elif ftype == frames.RST_STREAM:
            if len(payload) != 4 or not stream_id:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, "malformed RST_STREAM")
            self.peer_limits.reset()
            self._on_rst_stream(stream_id, int.from_bytes(payload, "big"))
        elif ftype == frames.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif ftype == frames.PING:
            if len(payload) != 8 or stream_id:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, "malformed PING")
            self.peer_limits.ping()  # ACKs too: we send no PING, so none answers one of ours
            if not flags & frames.FLAG_ACK:
                self.answer(frames.ping_ack(payload))
        elif ftype == frames.GOAWAY:
            if len(payload) < 8 or stream_id:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, "malformed GOAWAY")
            last = int.from_bytes(payload[:4], "big") & frames.MAX_STREAM_ID
            self._on_goaway(last, int.from_bytes(payload[4:8], "big"))
        elif ftype == frames.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif ftype == frames.PUSH_PROMISE:  # we announce ENABLE_PUSH 0, and clients never push
            raise ProtocolViolation(frames.PROTOCOL_ERROR, "PUSH_PROMISE although push is disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 sections 4.1 and 5.3.2).

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise ProtocolViolation(frames.PROTOCOL_ERROR, "DATA on stream 0")
        if flags & frames.FLAG_PADDED and not payload:
            raise ProtocolViolation(FRAME_SIZE_ERROR, "padded DATA without its pad length")
        if flags & frames.FLAG_PADDED and payload[0] >= len(payload):
            raise ProtocolViolation(frames.PROTOCOL_ERROR, "DATA padding longer than the frame")
        if not payload and not flags & frames.FLAG_END_STREAM:
            self.peer_limits.empty_frame()
        start, end = frames.data_bounds(flags, payload, 0, len(payload))
        self._credit_connection(len(payload))  # padding counts too (RFC 9113 section 6.1)
        self._on_data(stream_id, payload[start:end], bool(flags & frames.FLAG_END_STREAM), len(payload))

    def _header_fragment(self, ftype: int, flags: int, stream_id: int, payload: bytes) -> None:
        if ftype == frames.CONTINUATION:
            if stream_id != self._headers_of or not stream_id:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            self._continuations += 1
            self.peer_limits.continuation(self._continuations)
            self._block += payload
        else:
            if not stream_id:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, "HEADERS on stream 0")
            fixed = (1 if flags & frames.FLAG_PADDED else 0) + (5 if flags & frames.FLAG_PRIORITY else 0)
            if len(payload) < fixed or (flags & frames.FLAG_PADDED and payload[0] > len(payload) - fixed):
                raise ProtocolViolation(frames.PROTOCOL_ERROR, "HEADERS padding longer than the frame")
            self._block = bytearray(frames.header_block_fragment(flags, payload))
            self._block_flags = flags
            self._continuations = 0
            if not self._block and not flags & frames.FLAG_END_STREAM:
                self.peer_limits.empty_frame()
        if len(self._block) > MAX_HEADER_BLOCK:
            raise header_block_over(MAX_HEADER_BLOCK, len(self._block))
        if not flags & frames.FLAG_END_HEADERS:
            self._headers_of = stream_id
            return
        self._headers_of = 0
        block = bytes(self._block)
        headers = self._literal_blocks.get(block)
        if headers is None:
            headers = self._decode(block)
        self._on_headers(stream_id, headers, bool(self._block_flags & frames.FLAG_END_STREAM))

    def _decode(self, block: bytes) -> list[tuple[str, str]]:
        """The header list of a whole ``block`` not among the remembered literal-only ones.

        Every block is decoded, a reset stream's too: it may change the HPACK table. A
        literal-only block is remembered for the next time the same bytes come."""
        try:
            headers = decode_literal_block(block)
            if headers is None:
                return self.decoder.decode(block)
        except hpack.OversizedHeaderListError:
            raise header_block_over(MAX_HEADER_BLOCK) from None
        except hpack.HPACKError as exc:
            raise ProtocolViolation(COMPRESSION_ERROR, f"header block does not decode: {exc}") from None
        if len(self._literal_blocks) >= MAX_LITERAL_BLOCKS:
            self._literal_blocks.clear()  # e.g. requests, whose grpc-timeout differs each time
        self._literal_blocks[block] = headers
        return headers

    def _credit_connection(self, size: int) -> None:
        """Give ``size`` bytes of the connection's receive window back; batched to half a window."""
        self.unacked += size
        if self.unacked >= self.credit_at:
            self.write(frames.window_update(0, self.unacked))
            self.unacked = 0

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id or (flags & frames.FLAG_ACK and payload) or len(payload) % 6:
            raise ProtocolViolation(frames.PROTOCOL_ERROR, "malformed SETTINGS")
        self.peer_limits.settings(len(payload))
        if flags & frames.FLAG_ACK:
            return
        values = frames.parse_settings(payload)
        if values.get(SETTINGS_ENABLE_PUSH, 0) > 1:
            raise ProtocolViolation(frames.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH other than 0 or 1")
        window = values.get(frames.SETTINGS_INITIAL_WINDOW_SIZE)
        if window is not None:
            if window > frames.MAX_WINDOW_INCREMENT:
                raise ProtocolViolation(FLOW_CONTROL_ERROR, "initial window over 2^31-1")
            for stream in self.streams.values():  # RFC 9113 section 6.9.2: open streams follow
                stream.send_window += window - self.peer_window
            self.peer_window = window
        max_frame = values.get(frames.SETTINGS_MAX_FRAME_SIZE)
        if max_frame is not None:
            if not frames.DEFAULT_MAX_FRAME <= max_frame <= 0xFFFFFF:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {max_frame} out of range")
            self.peer_max_frame = max_frame
        self.peer_max_streams = values.get(SETTINGS_MAX_CONCURRENT_STREAMS, self.peer_max_streams)
        self.progress.set()
        self.answer(frames.settings_ack())

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(FRAME_SIZE_ERROR, "malformed WINDOW_UPDATE")
        increment = int.from_bytes(payload, "big") & frames.MAX_WINDOW_INCREMENT
        if not stream_id:
            if not increment:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
            self.send_window += increment
            if self.send_window > frames.MAX_WINDOW_INCREMENT:
                raise ProtocolViolation(FLOW_CONTROL_ERROR, "connection window over 2^31-1")
        elif (stream := self.streams.get(stream_id)) is not None:
            stream.send_window += increment
        self.progress.set()

