"""Unary gRPC calls over one HTTP/2 connection to a unix socket, without grpc.

The proxy needs a handful of unary calls to containerd (the store rebuild's List and Status
calls). grpc would cost the daemon about 9 MiB and six threads for that, so this client
speaks gRPC's HTTP/2 mapping ("PROTOCOL-HTTP2" in the gRPC repository) on the connection
machinery it shares with our server (runtimeproxy.wire.h2_peer: frames, header blocks, settings,
windows, protocol errors), itself on the frame helpers and HPACK code the relay uses too:

* one connection, opened on the first call and again after it is lost or the peer sent
  GOAWAY; calls are multiplexed on it (odd stream ids, client-initiated);
* a call is HEADERS (literal header fields: our encoder keeps no dynamic table) and the
  length-prefixed request in DATA frames, within the peer's flow-control windows; the
  answer is response HEADERS, DATA and trailers (or trailers only): grpc-status and
  grpc-message, or a status derived from an HTTP status, an RST_STREAM or a lost connection
  as the spec's tables say;
* a deadline travels as grpc-timeout and is enforced locally (RST_STREAM CANCEL, then
  DEADLINE_EXCEEDED); a cancelled caller resets its stream too;
* the usual call (a connection with a stream free, the request within the windows) takes no
  lock and no timeout context: a timer ends its future at the deadline. A hook call comes after
  an idle gap, with cold CPU caches, where every Python call on the path costs;
* responses up to ``max_message_size`` are accepted: our windows are opened that far and
  credited back once half of one is used (so a response of normal size costs no
  WINDOW_UPDATE); a larger one ends the call with RESOURCE_EXHAUSTED;
* the server is held to the HTTP/2 limits every peer is (wire.peer_limits): one over a limit
  is cut off and its calls fail with UNAVAILABLE naming it; a call that times out while the
  server reads nothing of ours leaves that connection to its calls in flight, and the next
  call opens a new one.

Errors are `RpcError` (code and details, as grpc's AioRpcError offers them); `status_of`
reads the code of either kind. Both live in h2_peer and are re-exported here. An HTTP answer
that is no gRPC answer at all is a `NotGrpcAnswer`, an RpcError that also says what came.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from collections.abc import Awaitable
from typing import Final, TypeVar

from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import StatusCode
from runtimeproxy.wire.h2_peer import (
    GRPC_OK_TRAILERS,
    GRPC_RESPONSE_HEADERS,
    H2Peer,
    PeerStream,
    RpcError,
    details_of,
    header_frames,
    status_of,
)
from runtimeproxy.wire.hpack_literal import encode_literal_block
from runtimeproxy.wire.peer_limits import DEFAULT_LIMITS, GRPC_SERVER, LimitSettings

__all__ = ["H2Channel", "NotGrpcAnswer", "RpcError", "details_of", "status_of"]

T = TypeVar("T")

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


class NotGrpcAnswer(RpcError):
    """The server answered with an HTTP response that is no gRPC answer: an HTTP status other than
    200 without grpc-status, or a content-type other than application/grpc. ``code()`` is gRPC's
    mapping of the HTTP status (so HTTP 404 is UNIMPLEMENTED); ``http_status`` and
    ``content_type`` say what came, for callers to whom such an answer is never a gRPC status
    (the hook dispatcher: an HTTP 404 is no hook server saying it lacks a hook)."""

    def __init__(self, code: int, http_status: str, content_type: str) -> None:
        self.http_status = http_status
        self.content_type = content_type
        status = f"HTTP {http_status}" if http_status else "no HTTP status"
        super().__init__(code, f"{status} {content_type or 'without content-type'}, not a gRPC answer")


def timeout_header(seconds: float) -> str:
    """grpc-timeout for ``seconds``, rounded up, in the finest unit that fits 8 digits."""
    return _timeout_text(math.ceil(seconds * 1e3))


def _timeout_text(millis: int) -> str:
    """grpc-timeout for ``millis`` milliseconds (at least 1), in the finest unit that fits."""
    if millis <= _TIMEOUT_DIGITS_MAX:  # the usual case
        return f"{max(1, millis)}m"
    for unit, per in (("S", 1_000), ("M", 60_000), ("H", 3_600_000)):
        value = -(-millis // per)  # rounded up
        if value <= _TIMEOUT_DIGITS_MAX:
            return f"{value}{unit}"
    return f"{_TIMEOUT_DIGITS_MAX}H"


# A channel calls a few methods (the hook points, the store's calls), each mostly with the same
# timeout, rounded up to milliseconds: so most calls find their header block here, by the
# milliseconds left (a hit runs no Python code at all).
@functools.lru_cache(maxsize=256)
def _request_headers(method: str, millis: int) -> bytes:
    """A request's header block (literals: our encoder keeps no dynamic table)."""
    return encode_literal_block([
        (":method", "POST"),
        (":scheme", "http"),
        (":path", method),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", _timeout_text(millis)),
    ])


def _deadline_exceeded(timeout: float) -> RpcError:
    return RpcError(StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout:.3f} s")


async def _by_deadline(step: Awaitable[T], deadline: float, timeout: float) -> T:
    """``step`` (connecting, waiting for a stream or a window), DEADLINE_EXCEEDED at ``deadline``."""
    try:
        async with asyncio.timeout_at(deadline):
            return await step
    except TimeoutError:
        raise _deadline_exceeded(timeout) from None


class _Call(PeerStream):
    """One stream: what arrived for it, and the future its caller waits on."""

    __slots__ = ("body", "done", "encoding", "headers", "unacked")

    def __init__(self, send_window: int, done: asyncio.Future[bytes]) -> None:
        self.send_window = send_window  # PeerStream's, set here: a call less per call
        self.done = done
        self.headers: list[tuple[str, str]] | None = None  # response headers, once received
        self.encoding = "identity"  # the response headers' grpc-encoding
        self.body = bytearray()
        self.unacked = 0  # bytes received on the stream and not yet credited back

    def ended(self) -> bool:
        return self.done.done()

    def finish(self, result: bytes | RpcError) -> None:
        if self.done.done():
            return
        if isinstance(result, RpcError):
            self.done.set_exception(result)
        else:
            self.done.set_result(result)

    def expire(self, timeout: float) -> None:
        """The deadline passed (a timer): the caller gets DEADLINE_EXCEEDED and resets the stream."""
        self.finish(_deadline_exceeded(timeout))


class _Connection(H2Peer[_Call]):
    """The HTTP/2 client side of one connection: calls on odd stream ids (h2_peer does the frames)."""

    def __init__(self, name: str, max_message_size: int, limits: LimitSettings = DEFAULT_LIMITS) -> None:
        super().__init__(name, max_message_size, server=False, peer=GRPC_SERVER, limits=limits)
        self.next_id = 1
        self.usable = True  # False after GOAWAY, a connection error or the last stream id
        self.retired = False  # replaced by a new connection: closed once its calls ended

    @property
    def calls(self) -> dict[int, _Call]:
        return self.streams

    # -- calls ---------------------------------------------------------------------------------

    async def stream_slot(self) -> bool:
        """Wait while the peer's SETTINGS_MAX_CONCURRENT_STREAMS are all in use (as grpc-core
        queues such calls); False if the connection can no longer take calls."""
        while self.usable and len(self.streams) >= self.peer_max_streams:
            await self.wait_progress()
        return self.usable

    def _pop(self, stream_id: int) -> _Call | None:
        call = self.streams.pop(stream_id, None)
        if call is not None:
            self.stream_over()
        return call

    def open_stream(self) -> tuple[int, _Call]:
        stream_id = self.next_id
        self.next_id += 2
        if self.next_id > frames.MAX_STREAM_ID:
            self.usable = False  # this is the last stream of the connection
        call = _Call(self.peer_window, self.loop.create_future())
        self.streams[stream_id] = call
        return stream_id, call

    async def send_request(self, stream_id: int, call: _Call, headers: bytes, message: bytes) -> None:
        head = header_frames(stream_id, headers, False, self.peer_max_frame)
        await self.send(stream_id, call, head, message, b"")

    def reset(self, stream_id: int) -> None:
        """Forget a stream the caller gave up on, and tell the peer (RST_STREAM CANCEL)."""
        if self._pop(stream_id) is not None:
            self.write(frames.rst_stream(stream_id, frames.CANCEL))

    def close(self) -> None:
        self.usable = False
        if self.transport is not None and self.lost is None:
            self.transport.write(frames.goaway(0))
            self.transport.close()

    # -- what the peer sends ---------------------------------------------------------------------

    def _on_data(self, stream_id: int, data: bytes, end_stream: bool, flow_size: int) -> None:
        call = self.streams.get(stream_id)
        if call is None:
            return  # a stream we reset: its data is dropped, the connection window credited
        if call.headers is None:
            self._end(stream_id, StatusCode.INTERNAL, "DATA before the response headers")
            return
        call.body += data
        if len(call.body) > self.limit + grpc_framing.PREFIX_LEN:
            self._end(
                stream_id,
                StatusCode.RESOURCE_EXHAUSTED,
                f"response larger than the limit of {self.limit} bytes",
            )
            return
        if end_stream:
            reason = "the server ended the stream without trailers (no grpc-status)"
            self._end(stream_id, StatusCode.INTERNAL, reason, peer_done=True)
            return
        # The stream window already holds a whole message of the limit, so a response needs no
        # credit; only padding (which counts, RFC 9113 section 6.9.1) can use up more. Crediting
        # at half the window, as for the connection, spares a write here and a wake-up in the
        # server per call.
        call.unacked += flow_size
        if call.unacked >= self.credit_at:
            self.write(frames.window_update(stream_id, call.unacked))
            call.unacked = 0

    def _on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        call = self.streams.get(stream_id)
        if call is None:
            return
        if call.headers is None:  # the response headers (or trailers only)
            call.headers = headers
            if headers == GRPC_RESPONSE_HEADERS and not end_stream:
                return  # grpc_server's: nothing to check
            fields = dict(headers)
            call.encoding = fields.get("grpc-encoding", "identity")
            http_status, content_type = fields.get(":status", ""), fields.get("content-type", "")
            code: StatusCode | None = None
            if http_status != "200" and "grpc-status" not in fields:
                code = _HTTP_CODES.get(http_status, StatusCode.UNKNOWN)
            elif not content_type.startswith("application/grpc"):
                code = StatusCode.UNKNOWN
            if code is not None:
                error = NotGrpcAnswer(code, http_status, content_type)
                call.finish(error)  # _end then forgets or resets the stream; the call has this error
                self._end(stream_id, code, error.details(), end_stream)
                return
            if not end_stream:
                return
        elif not end_stream:
            self._end(stream_id, StatusCode.INTERNAL, "a second header block without END_STREAM")
            return
        elif headers == GRPC_OK_TRAILERS:  # grpc_server's: the status is OK
            self._succeed(stream_id, call)
            return
        else:
            fields = dict(headers)
        self._trailers(stream_id, call, fields)

    def _trailers(self, stream_id: int, call: _Call, fields: dict[str, str]) -> None:
        status = fields.get("grpc-status")
        if status is None:
            self._end(stream_id, StatusCode.INTERNAL, "trailers without grpc-status", peer_done=True)
            return
        code = grpc_framing.parse_status(status)
        if code != grpc_framing.OK:
            # Header values arrive as latin-1 text (hpack_cache); grpc-message is UTF-8, percent-encoded.
            raw = fields.get("grpc-message", "").encode("latin-1").decode("utf-8", "replace")
            self._end(stream_id, code, grpc_framing.decode_grpc_message(raw), peer_done=True)
            return
        self._succeed(stream_id, call)

    def _succeed(self, stream_id: int, call: _Call) -> None:
        """The call ended with status OK: its answer is the one message of its body."""
        try:
            message = grpc_framing.single_message(bytes(call.body), call.encoding, self.limit, "response")
        except grpc_framing.BadRequest as exc:
            self._end(stream_id, StatusCode.INTERNAL, str(exc), peer_done=True)
            return
        self._pop(stream_id)
        if not call.done.done():  # call.finish, inlined: the deadline's timer may have ended it
            call.done.set_result(message)

    def _end(self, stream_id: int, code: int, details: str, peer_done: bool = False) -> None:
        """End a call with an error; the stream is reset unless the peer already ended it."""
        call = self.streams.get(stream_id)
        if call is None:
            return
        if peer_done:
            self._pop(stream_id)
        else:
            self.reset(stream_id)
        call.finish(RpcError(code, details))

    def _on_rst_stream(self, stream_id: int, error_code: int) -> None:
        call = self._pop(stream_id)
        if call is not None:
            details = f"the server reset the stream (HTTP/2 error {error_code:#x})"
            if error_code == frames.REFUSED_STREAM:
                call.finish(_Unprocessed(StatusCode.UNAVAILABLE, details))
            else:
                call.finish(RpcError(_RST_CODES.get(error_code, StatusCode.INTERNAL), details))

    def _on_goaway(self, last_stream_id: int, error_code: int) -> None:
        self.usable = False  # new calls open a new connection
        for stream_id in [s for s in self.streams if s > last_stream_id]:  # never processed: safe to retry
            self.streams[stream_id].finish(_Unprocessed(StatusCode.UNAVAILABLE, f"{self.name} is going away (GOAWAY)"))
            self._pop(stream_id)

    def _closed(self, reason: str) -> None:
        self.usable = False
        calls, self.streams = self.streams, {}
        for call in calls.values():
            call.finish(RpcError(StatusCode.UNAVAILABLE, reason))


class _Unprocessed(RpcError):
    """UNAVAILABLE for a call the server did not process (RFC 9113 section 8.7): it may be sent again."""


class H2Channel:
    """Unary gRPC calls to the server on the unix socket ``path``.

    `unary` sends one serialized request to a method ("/package.Service/Method") and returns
    the serialized response, or raises `RpcError`: the server's status, UNAVAILABLE when the
    socket cannot be reached or the connection is lost, DEADLINE_EXCEEDED after ``timeout``,
    RESOURCE_EXHAUSTED for a message over ``max_message_size``, INTERNAL for an answer that
    is no valid gRPC response. The server is held to ``limits`` (wire.peer_limits).
    """

    def __init__(self, path: str, *, max_message_size: int, limits: LimitSettings = DEFAULT_LIMITS) -> None:
        self.path = path
        self.max_message_size = max_message_size
        self.limits = limits
        self._connection: _Connection | None = None
        self._connecting: asyncio.Lock | None = None

    async def unary(self, method: str, request: bytes, timeout: float) -> bytes:
        if len(request) > self.max_message_size:
            raise RpcError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"request of {len(request)} bytes over the limit of {self.max_message_size} bytes",
            )
        connection = self._connection
        loop = connection.loop if connection is not None and connection.usable else asyncio.get_running_loop()
        deadline = loop.time() + timeout
        retries = 0
        while True:  # each attempt here, not in a coroutine of its own: a hook call's path is short
            # Unless a call can open a stream on it now, without waiting:
            if connection is None or not connection.usable or len(connection.streams) >= connection.peer_max_streams:
                connection = await _by_deadline(self._slot(), deadline, timeout)
            headers = _request_headers(method, math.ceil((deadline - loop.time()) * 1e3))
            stream_id, call = connection.open_stream()
            timer = loop.call_at(deadline, call.expire, timeout)
            try:
                head = header_frames(stream_id, headers, False, connection.peer_max_frame)
                if not connection.send_message_now(stream_id, call, head, request, b""):
                    sending = connection.send(stream_id, call, head, grpc_framing.encode_message(request), b"")
                    await _by_deadline(sending, deadline, timeout)  # waits for the server's windows
                return await call.done
            except _Unprocessed:
                # The server never saw it (REFUSED_STREAM, or past a GOAWAY's last stream):
                # safe to send again, as gRPC's transparent retry does; a few times at most.
                retries += 1
                if retries > TRANSPARENT_RETRIES:
                    raise
            finally:  # a stream still open (deadline, cancellation) is reset: the server stops too
                timer.cancel()
                if stream_id in connection.streams:
                    connection.reset(stream_id)
                    if connection.writing_paused:  # the server reads nothing: later calls get a new connection
                        connection.usable = False
                if connection.retired and not connection.streams:
                    connection.close()
            connection = self._connection

    async def _slot(self) -> _Connection:
        """A connection (a new one if need be) with a stream free for a call."""
        connection = await self._connected()
        while not await connection.stream_slot():
            connection = await self._connected()
        return connection

    async def _connected(self) -> _Connection:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:  # concurrent first calls share one new connection
            connection = self._connection
            if connection is not None and connection.usable:
                return connection
            if connection is not None:  # its calls in flight may still finish (GOAWAY)
                connection.retired = True
                if not connection.streams:
                    connection.close()
            made = _Connection(f"unix://{self.path}", self.max_message_size, self.limits)
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
                    while connection.streams:
                        await connection.wait_progress()
        connection.close()
        await asyncio.sleep(0)  # let the transport act on the close
