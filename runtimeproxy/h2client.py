"""Unary gRPC calls over one HTTP/2 connection to a unix socket, without grpc.

The proxy needs a handful of unary calls to containerd (the store rebuild's List and Status
calls). grpc would cost the daemon about 9 MiB and six threads for that, so this client
speaks gRPC's HTTP/2 mapping ("PROTOCOL-HTTP2" in the gRPC repository) with the relay's
frame helpers and HPACK code:

* one connection, opened on the first call and again after it is lost or the peer sent
  GOAWAY; calls are multiplexed on it (odd stream ids, client-initiated);
* a call is HEADERS (literal header fields: our encoder keeps no dynamic table) and the
  length-prefixed request in DATA frames, within the peer's flow-control windows; the
  answer is response HEADERS, DATA and trailers (or trailers only): grpc-status and
  grpc-message, or a status derived from an HTTP status, an RST_STREAM or a lost connection
  as the spec's tables say;
* a deadline travels as grpc-timeout and is enforced locally (RST_STREAM CANCEL, then
  DEADLINE_EXCEEDED); a cancelled caller resets its stream too;
* responses up to ``max_message_size`` are accepted: our windows are opened that far and
  credited back as DATA arrives; a larger one ends the call with RESOURCE_EXHAUSTED.

Errors are `RpcError` (code and details, as grpc's AioRpcError offers them); `status_of`
reads the code of either kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Final, cast

import hpack
import structlog

from runtimeproxy.relay import frames, grpc_wire
from runtimeproxy.relay.grpc_wire import StatusCode
from runtimeproxy.relay.hpack_cache import CachingDecoder
from runtimeproxy.relay.hpack_literal import encode_literal_block

__all__ = ["H2Channel", "RpcError", "details_of", "status_of"]

log = structlog.get_logger(__name__)

SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
# Largest header block (and header list) accepted from the peer; grpc-core's default hard limit
# for metadata is 16 KiB, so this leaves room.
MAX_HEADER_BLOCK: Final = 64 * 1024
# Times a call the server refused unprocessed is sent again before its UNAVAILABLE stands.
TRANSPARENT_RETRIES: Final = 3
# grpc-timeout allows at most 8 digits (PROTOCOL-HTTP2, "Timeout").
_TIMEOUT_DIGITS_MAX: Final = 99_999_999

# RST_STREAM error code to gRPC status (PROTOCOL-HTTP2, "Errors"); any other: INTERNAL.
_RST_CODES: Final[dict[int, StatusCode]] = {
    frames.REFUSED_STREAM: StatusCode.UNAVAILABLE,
    frames.CANCEL: StatusCode.CANCELLED,
    0xB: StatusCode.RESOURCE_EXHAUSTED,  # ENHANCE_YOUR_CALM
    0xC: StatusCode.PERMISSION_DENIED,  # INADEQUATE_SECURITY
}
# HTTP status of a response that is no gRPC answer, to gRPC status ("http-grpc-status-mapping.md").
_HTTP_CODES: Final[dict[str, StatusCode]] = {
    "400": StatusCode.INTERNAL,
    "401": StatusCode.UNAUTHENTICATED,
    "403": StatusCode.PERMISSION_DENIED,
    "404": StatusCode.UNIMPLEMENTED,
    "429": StatusCode.UNAVAILABLE,
    "502": StatusCode.UNAVAILABLE,
    "503": StatusCode.UNAVAILABLE,
    "504": StatusCode.UNAVAILABLE,
}


class RpcError(Exception):
    """A call that ended with a status other than OK, from the peer or decided here."""

    def __init__(self, code: int, details: str) -> None:
        self._code = StatusCode(code) if code in grpc_wire.CODE_NAMES else StatusCode.UNKNOWN
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


def timeout_header(seconds: float) -> str:
    """grpc-timeout for ``seconds``, rounded up, in the finest unit that fits 8 digits."""
    for unit, scale in (("m", 1e3), ("S", 1.0), ("M", 1 / 60), ("H", 1 / 3600)):
        value = max(1, math.ceil(seconds * scale))
        if value <= _TIMEOUT_DIGITS_MAX:
            return f"{value}{unit}"
    return f"{_TIMEOUT_DIGITS_MAX}H"


class _Call:
    """One stream: what arrived for it, and the future its caller waits on."""

    __slots__ = ("body", "done", "headers", "send_window")

    def __init__(self, send_window: int) -> None:
        self.done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.headers: list[tuple[str, str]] | None = None  # response headers, once received
        self.body = bytearray()
        self.send_window = send_window

    def finish(self, result: bytes | RpcError) -> None:
        if self.done.done():
            return
        if isinstance(result, RpcError):
            self.done.set_exception(result)
        else:
            self.done.set_result(result)


class _Connection(asyncio.Protocol):
    """The HTTP/2 client side of one connection: frame parsing and per-stream state."""

    def __init__(self, name: str, max_message_size: int) -> None:
        self.name = name
        self.limit = max_message_size
        # Our receive windows: a whole message of the largest size fits at once.
        self.window = min(max_message_size + grpc_wire.PREFIX_LEN, frames.MAX_WINDOW_INCREMENT)
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, _Call] = {}
        self.next_id = 1
        self.usable = True  # False after GOAWAY, a connection error or the last stream id
        self.retired = False  # replaced by a new connection: closed once its calls ended
        self.lost: RpcError | None = None
        self.decoder = CachingDecoder(max_header_list_size=MAX_HEADER_BLOCK)
        self.peer_window = frames.DEFAULT_WINDOW  # peer's initial stream window
        self.peer_max_frame = frames.DEFAULT_MAX_FRAME
        self.peer_max_streams = frames.MAX_STREAM_ID  # no limit until the peer sets one
        self.send_window = frames.DEFAULT_WINDOW  # connection-level, towards the peer
        self.progress = asyncio.Event()  # set when a window opens or a stream ends
        self.unacked = 0  # connection-level bytes received and not yet credited back
        self._buffer = bytearray()
        self._headers_of = 0  # stream whose header block continues in CONTINUATION frames
        self._block = bytearray()
        self._block_flags = 0

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        ours = {SETTINGS_ENABLE_PUSH: 0, frames.SETTINGS_INITIAL_WINDOW_SIZE: self.window}
        transport.write(
            frames.PREFACE
            + frames.settings(ours)
            + frames.window_update(0, self.window - frames.DEFAULT_WINDOW)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc else ""
        self._fail_all(RpcError(StatusCode.UNAVAILABLE, f"connection to {self.name} closed{reason}"))

    def data_received(self, data: bytes) -> None:
        if self.lost is not None:
            return
        self._buffer += data
        try:
            self._parse()
        except _ConnectionError as exc:
            log.warning("closing the HTTP/2 connection: the peer broke the protocol", peer=self.name, reason=str(exc))
            self._abort(exc.h2_code, str(exc))

    # -- calls ---------------------------------------------------------------------------------

    async def stream_slot(self) -> bool:
        """Wait while the peer's SETTINGS_MAX_CONCURRENT_STREAMS are all in use (as grpc-core
        queues such calls); False if the connection can no longer take calls."""
        while self.usable and len(self.calls) >= self.peer_max_streams:
            self.progress.clear()
            await self.progress.wait()
        return self.usable

    def _pop(self, stream_id: int) -> _Call | None:
        call = self.calls.pop(stream_id, None)
        if call is not None:
            self.progress.set()
        return call

    def open_stream(self) -> tuple[int, _Call]:
        stream_id = self.next_id
        self.next_id += 2
        if self.next_id > frames.MAX_STREAM_ID:
            self.usable = False  # this is the last stream of the connection
        call = _Call(self.peer_window)
        self.calls[stream_id] = call
        return stream_id, call

    async def send_request(self, stream_id: int, call: _Call, headers: bytes, message: bytes) -> None:
        assert self.transport is not None
        if len(headers) > self.peer_max_frame:
            raise RpcError(StatusCode.INTERNAL, f"request headers of {len(headers)} bytes do not fit one frame")
        self.transport.write(frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, stream_id, headers))
        view = memoryview(message)
        while True:
            allowed = min(self.send_window, call.send_window, self.peer_max_frame)
            if allowed <= 0 and view:
                self.progress.clear()
                await self.progress.wait()
                if call.done.done():
                    return  # ended meanwhile (reset, connection lost)
                continue
            chunk, view = view[:allowed], view[allowed:]
            self.send_window -= len(chunk)
            call.send_window -= len(chunk)
            flags = 0 if view else frames.FLAG_END_STREAM
            self.transport.write(frames.frame(frames.DATA, flags, stream_id, bytes(chunk)))
            if not view:
                return

    def reset(self, stream_id: int) -> None:
        """Forget a stream the caller gave up on, and tell the peer (RST_STREAM CANCEL)."""
        if self._pop(stream_id) is not None and self.transport is not None and self.lost is None:
            self.transport.write(frames.rst_stream(stream_id, frames.CANCEL))

    def close(self) -> None:
        self.usable = False
        if self.transport is not None and self.lost is None:
            self.transport.write(frames.goaway(0))
            self.transport.close()

    # -- frames ----------------------------------------------------------------------------------

    def _parse(self) -> None:
        buffer = self._buffer
        offset = 0
        while len(buffer) - offset >= frames.HEADER_LEN:
            high, low, ftype, flags, stream_id = frames.FRAME_HEADER.unpack_from(buffer, offset)
            length = high << 8 | low
            if length > frames.DEFAULT_MAX_FRAME:  # we never raise SETTINGS_MAX_FRAME_SIZE
                raise _ConnectionError(0x6, f"frame of {length} bytes over the 16384 allowed")  # FRAME_SIZE_ERROR
            end = offset + frames.HEADER_LEN + length
            if end > len(buffer):
                break
            payload = bytes(buffer[offset + frames.HEADER_LEN : end])
            offset = end
            self._frame(ftype, flags, stream_id & frames.MAX_STREAM_ID, payload)
            if self.lost is not None:
                return
        del buffer[:offset]

    def _frame(self, ftype: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._headers_of and ftype != frames.CONTINUATION:
            raise _ConnectionError(frames.PROTOCOL_ERROR, "header block interrupted before END_HEADERS")
        if ftype == frames.DATA:
            self._data(flags, stream_id, payload)
        elif ftype in (frames.HEADERS, frames.CONTINUATION):
            self._header_fragment(ftype, flags, stream_id, payload)
        elif ftype == frames.RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif ftype == frames.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif ftype == frames.PING:
            if len(payload) != 8 or stream_id:
                raise _ConnectionError(frames.PROTOCOL_ERROR, "malformed PING")
            if not flags & frames.FLAG_ACK and self.transport is not None:
                self.transport.write(frames.frame(frames.PING, frames.FLAG_ACK, 0, payload))
        elif ftype == frames.GOAWAY:
            self._goaway(payload)
        elif ftype == frames.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif ftype == frames.PUSH_PROMISE:
            raise _ConnectionError(frames.PROTOCOL_ERROR, "PUSH_PROMISE although push is disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 section 4.1).

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise _ConnectionError(frames.PROTOCOL_ERROR, "DATA on stream 0")
        self._credit_connection(len(payload))  # padding counts too (RFC 9113 section 6.1)
        call = self.calls.get(stream_id)
        if call is None:
            return  # a stream we reset: its data is dropped, the connection window credited
        if call.headers is None:
            self._end(stream_id, StatusCode.INTERNAL, "DATA before the response headers")
            return
        start, end = frames.data_payload_length(flags, payload)
        if start > end:
            raise _ConnectionError(frames.PROTOCOL_ERROR, "DATA padding longer than the frame")
        call.body += payload[start:end]
        if len(call.body) > self.limit + grpc_wire.PREFIX_LEN:
            self._end(
                stream_id,
                StatusCode.RESOURCE_EXHAUSTED,
                f"response larger than the limit of {self.limit} bytes",
            )
            return
        if flags & frames.FLAG_END_STREAM:
            reason = "the server ended the stream without trailers (no grpc-status)"
            self._end(stream_id, StatusCode.INTERNAL, reason, peer_done=True)
        elif payload and self.transport is not None:
            self.transport.write(frames.window_update(stream_id, len(payload)))

    def _credit_connection(self, size: int) -> None:
        self.unacked += size
        if self.unacked >= self.window // 2 and self.transport is not None:
            self.transport.write(frames.window_update(0, self.unacked))
            self.unacked = 0

    def _header_fragment(self, ftype: int, flags: int, stream_id: int, payload: bytes) -> None:
        if ftype == frames.CONTINUATION:
            if stream_id != self._headers_of or not stream_id:
                raise _ConnectionError(frames.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            self._block += payload
        else:
            if not stream_id:
                raise _ConnectionError(frames.PROTOCOL_ERROR, "HEADERS on stream 0")
            if flags & frames.FLAG_PADDED and (not payload or payload[0] > len(payload) - 1):
                raise _ConnectionError(frames.PROTOCOL_ERROR, "HEADERS padding longer than the frame")
            self._block = bytearray(frames.header_block_fragment(flags, payload))
            self._block_flags = flags
        if len(self._block) > MAX_HEADER_BLOCK:
            raise _ConnectionError(0xB, f"header block over {MAX_HEADER_BLOCK} bytes")  # ENHANCE_YOUR_CALM
        if not flags & frames.FLAG_END_HEADERS:
            self._headers_of = stream_id
            return
        self._headers_of = 0
        try:  # every block is decoded, a reset stream's too: it may change the HPACK table
            headers = self.decoder.decode(bytes(self._block))
        except hpack.HPACKError as exc:
            raise _ConnectionError(0x9, f"header block does not decode: {exc}") from None  # COMPRESSION_ERROR
        self._headers(stream_id, headers, bool(self._block_flags & frames.FLAG_END_STREAM))

    def _headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        call = self.calls.get(stream_id)
        if call is None:
            return
        fields = dict(headers)
        if call.headers is None:  # the response headers (or trailers only)
            call.headers = headers
            http_status = fields.get(":status", "")
            if http_status != "200" and "grpc-status" not in fields:
                code = _HTTP_CODES.get(http_status, StatusCode.UNKNOWN)
                self._end(stream_id, code, f"the server answered HTTP status {http_status or '(none)'}", end_stream)
                return
            if not fields.get("content-type", "").startswith("application/grpc"):
                reason = f"content-type {fields.get('content-type', '')!r} is not gRPC"
                self._end(stream_id, StatusCode.UNKNOWN, reason, end_stream)
                return
            if not end_stream:
                return
        elif not end_stream:
            self._end(stream_id, StatusCode.INTERNAL, "a second header block without END_STREAM")
            return
        self._trailers(stream_id, call, fields)

    def _trailers(self, stream_id: int, call: _Call, fields: dict[str, str]) -> None:
        status = fields.get("grpc-status")
        if status is None:
            self._end(stream_id, StatusCode.INTERNAL, "trailers without grpc-status", peer_done=True)
            return
        code = grpc_wire.parse_status(status)
        if code != grpc_wire.OK:
            # Header values arrive as latin-1 text (hpack_cache); grpc-message is UTF-8, percent-encoded.
            raw = fields.get("grpc-message", "").encode("latin-1").decode("utf-8", "replace")
            self._end(stream_id, code, grpc_wire.decode_grpc_message(raw), peer_done=True)
            return
        try:
            message = grpc_wire.single_message(
                bytes(call.body), fields.get("grpc-encoding", "identity"), self.limit, "response"
            )
        except grpc_wire.BadRequest as exc:
            self._end(stream_id, StatusCode.INTERNAL, str(exc), peer_done=True)
            return
        self._pop(stream_id)
        call.finish(message)

    def _end(self, stream_id: int, code: int, details: str, peer_done: bool = False) -> None:
        """End a call with an error; the stream is reset unless the peer already ended it."""
        call = self.calls.get(stream_id)
        if call is None:
            return
        if peer_done:
            self._pop(stream_id)
        else:
            self.reset(stream_id)
        call.finish(RpcError(code, details))

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4 or not stream_id:
            raise _ConnectionError(frames.PROTOCOL_ERROR, "malformed RST_STREAM")
        call = self._pop(stream_id)
        if call is not None:
            error = int.from_bytes(payload, "big")
            details = f"the server reset the stream (HTTP/2 error {error:#x})"
            if error == frames.REFUSED_STREAM:
                call.finish(_Unprocessed(StatusCode.UNAVAILABLE, details))
            else:
                call.finish(RpcError(_RST_CODES.get(error, StatusCode.INTERNAL), details))

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id or (flags & frames.FLAG_ACK and payload) or len(payload) % 6:
            raise _ConnectionError(frames.PROTOCOL_ERROR, "malformed SETTINGS")
        if flags & frames.FLAG_ACK:
            return
        values = frames.parse_settings(payload)
        window = values.get(frames.SETTINGS_INITIAL_WINDOW_SIZE)
        if window is not None:
            if window > frames.MAX_WINDOW_INCREMENT:
                raise _ConnectionError(0x3, "initial window over 2^31-1")  # FLOW_CONTROL_ERROR
            for call in self.calls.values():  # RFC 9113 section 6.9.2: open streams follow
                call.send_window += window - self.peer_window
            self.peer_window = window
            self.progress.set()
        self.peer_max_streams = values.get(SETTINGS_MAX_CONCURRENT_STREAMS, self.peer_max_streams)
        self.progress.set()
        max_frame = values.get(frames.SETTINGS_MAX_FRAME_SIZE)
        if max_frame is not None:
            if not frames.DEFAULT_MAX_FRAME <= max_frame <= 0xFFFFFF:
                raise _ConnectionError(frames.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {max_frame} out of range")
            self.peer_max_frame = max_frame
        if self.transport is not None:
            self.transport.write(frames.settings_ack())

    def _goaway(self, payload: bytes) -> None:
        if len(payload) < 8:
            raise _ConnectionError(frames.PROTOCOL_ERROR, "malformed GOAWAY")
        self.usable = False  # new calls open a new connection
        last = int.from_bytes(payload[:4], "big") & frames.MAX_STREAM_ID
        for stream_id in [s for s in self.calls if s > last]:  # never processed: safe to retry
            self.calls[stream_id].finish(_Unprocessed(StatusCode.UNAVAILABLE, f"{self.name} is going away (GOAWAY)"))
            self._pop(stream_id)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(0x6, "malformed WINDOW_UPDATE")  # FRAME_SIZE_ERROR
        increment = int.from_bytes(payload, "big") & frames.MAX_WINDOW_INCREMENT
        if not stream_id:
            self.send_window += increment
        elif (call := self.calls.get(stream_id)) is not None:
            call.send_window += increment
        self.progress.set()

    def _fail_all(self, error: RpcError) -> None:
        self.usable = False
        if self.lost is None:
            self.lost = error
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.finish(error)
        self.progress.set()  # senders waiting for a window see their call ended

    def _abort(self, h2_code: int, reason: str) -> None:
        if self.transport is not None and self.lost is None:
            self.transport.write(frames.goaway(0, h2_code, reason.encode()[:200]))
            self.transport.close()
        self._fail_all(RpcError(StatusCode.UNAVAILABLE, f"HTTP/2 connection to {self.name} failed: {reason}"))


class _Unprocessed(RpcError):
    """UNAVAILABLE for a call the server did not process (RFC 9113 section 8.7): it may be sent again."""


class _ConnectionError(Exception):
    """The peer broke HTTP/2: the connection ends with GOAWAY ``h2_code``."""

    def __init__(self, h2_code: int, reason: str) -> None:
        super().__init__(reason)
        self.h2_code = h2_code


class H2Channel:
    """Unary gRPC calls to the server on the unix socket ``path``.

    `unary` sends one serialized request to a method ("/package.Service/Method") and returns
    the serialized response, or raises `RpcError`: the server's status, UNAVAILABLE when the
    socket cannot be reached or the connection is lost, DEADLINE_EXCEEDED after ``timeout``,
    RESOURCE_EXHAUSTED for a message over ``max_message_size``, INTERNAL for an answer that
    is no valid gRPC response.
    """

    def __init__(self, path: str, *, max_message_size: int) -> None:
        self.path = path
        self.max_message_size = max_message_size
        self._connection: _Connection | None = None
        self._connecting: asyncio.Lock | None = None

    async def unary(self, method: str, request: bytes, timeout: float) -> bytes:
        if len(request) > self.max_message_size:
            raise RpcError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"request of {len(request)} bytes over the limit of {self.max_message_size} bytes",
            )
        message = grpc_wire.encode_message(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        retries = 0
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    try:
                        return await self._attempt(method, message, deadline - loop.time())
                    except _Unprocessed:
                        # The server never saw it (REFUSED_STREAM, or past a GOAWAY's last stream):
                        # safe to send again, as gRPC's transparent retry does; a few times at most.
                        retries += 1
                        if retries > TRANSPARENT_RETRIES:
                            raise
        except TimeoutError:
            raise RpcError(StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout:.3f} s") from None

    async def _attempt(self, method: str, message: bytes, timeout: float) -> bytes:
        headers = encode_literal_block([
            (":method", "POST"),
            (":scheme", "http"),
            (":path", method),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", timeout_header(timeout)),
        ])
        connection = await self._connected()
        while not await connection.stream_slot():
            connection = await self._connected()
        stream_id, call = connection.open_stream()
        try:
            await connection.send_request(stream_id, call, headers, message)
            return await call.done
        finally:  # a stream still open (deadline, cancellation) is reset: the server stops too
            connection.reset(stream_id)
            if connection.retired and not connection.calls:
                connection.close()

    async def _connected(self) -> _Connection:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:  # concurrent first calls share one new connection
            connection = self._connection
            if connection is not None and connection.usable:
                return connection
            if connection is not None:  # its calls in flight may still finish (GOAWAY)
                connection.retired = True
                if not connection.calls:
                    connection.close()
            made = _Connection(f"unix://{self.path}", self.max_message_size)
            try:
                await asyncio.get_running_loop().create_unix_connection(lambda: made, self.path)
            except OSError as exc:
                raise RpcError(StatusCode.UNAVAILABLE, f"cannot connect to unix://{self.path}: {exc}") from None
            self._connection = made
            return made

    async def close(self, grace: float | None = None) -> None:
        """Close the connection: at once, or once its calls ended but after ``grace`` seconds
        at most. A later call opens a new connection."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        connection.usable = False
        if grace:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    while connection.calls:
                        connection.progress.clear()
                        await connection.progress.wait()
        connection.close()
        await asyncio.sleep(0)  # let the transport act on the close
