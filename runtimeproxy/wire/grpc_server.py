"""A unary-only gRPC server over HTTP/2 on asyncio, in the event loop's own thread.

Why not grpc.aio: it hands each request through grpc-core's threads and a poller thread to
the asyncio loop, three wake-ups of idle threads per call. Hook calls during a pod start come
tens of milliseconds apart, so each one paid about 0.6 ms for those wake-ups alone on a 2-core
VM (grpc.aio 0.9 ms p50 round trip after 20 ms idle, a one-thread server 0.3 ms). Here the
request is read, handled and answered by the thread that the socket wakes.

It speaks gRPC's HTTP/2 mapping ("PROTOCOL-HTTP2" in the gRPC repository) on the connection
machinery it shares with our client (runtimeproxy.wire.h2_peer):

* streams are the client's (odd ids, each above the last); a request's header block is read
  whole (CONTINUATION included, HPACK with the dynamic table), its DATA collected until
  END_STREAM, then it must be exactly one length-prefixed message (compressed with gzip or
  deflate when grpc-encoding says so); answers use HPACK literals only;
* our windows are opened at once to a whole message of ``max_message_size`` (no round trips
  for a large request); the connection window is credited back as DATA arrives; a stream's
  never needs to be, as a request larger than it is refused anyway: RESOURCE_EXHAUSTED as soon
  as a message prefix announces more than the limit;
* unknown method: UNIMPLEMENTED; a handler raising `RpcError`: that status; raising anything
  else: UNKNOWN, as grpc does ("Unexpected <type>: <text>"), with a log line naming the method;
  a response over the limit: RESOURCE_EXHAUSTED;
* grpc-timeout sets the call's deadline (`CallInfo.deadline`, on the loop's clock): the
  handler is cancelled at it and DEADLINE_EXCEEDED answered; RST_STREAM from the client, or a
  lost connection, cancels the handler silently;
* errors are trailers-only answers; grpc-message is percent-encoded UTF-8, cut to
  `MAX_DETAILS` bytes (grpc-core clients refuse trailers over 8 KiB by default);
* the response is sent within the client's stream and connection windows and its maximum frame
  size; headers, message and trailers go out in one write when they fit;
* protocol errors end the connection with GOAWAY and its code and a log line; other
  connections are not affected. So does a client over one of the limits every HTTP/2 peer is
  held to (wire.peer_limits: floods of PING, SETTINGS, RST_STREAM, empty or CONTINUATION
  frames), with ENHANCE_YOUR_CALM; a client that does not read what it asked for is read no
  more until it does (backpressure).

Each call's handler runs as a task of its own, from the read that completed its request: so
``asyncio.current_task()``, ``asyncio.timeout()`` and cancellation work in it as in any task.
(Running its first step inline, without a task, saved 0.03-0.06 ms a call but left
``asyncio.timeout()`` unusable before a handler's first await.) Except a handler that provably
cannot suspend (an ``async def`` without ``await``, ``async for`` or ``async with``:
runtimeproxy.common.coroutines): it runs to its end in that read, in a copy of the context as a task
would, with no task, timer or loop turn; nothing in it can wait for the deadline or be cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import socket
import struct
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final, NamedTuple

import structlog

from runtimeproxy.common.coroutines import never_suspends
from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import StatusCode
from runtimeproxy.wire.h2_peer import (
    FLOW_CONTROL_ERROR,
    GRPC_OK_TRAILERS,
    GRPC_RESPONSE_HEADERS,
    MAX_LITERAL_BLOCKS,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    STREAM_CLOSED,
    H2Peer,
    PeerStream,
    ProtocolViolation,
    RpcError,
    header_frames,
)
from runtimeproxy.wire.hpack_literal import encode_literal_block
from runtimeproxy.wire.peer_limits import DEFAULT_LIMITS, GRPC_CLIENT, LimitSettings

__all__ = ["MAX_CONCURRENT_STREAMS", "CallInfo", "H2Server", "RpcError", "UnaryHandler"]

log = structlog.get_logger(__name__)

# Streams one connection may have open (announced in SETTINGS); more are refused (REFUSED_STREAM,
# which clients retry). Bounds the requests one connection can make us hold.
MAX_CONCURRENT_STREAMS: Final = 1000
# Longest grpc-message we send, percent-encoded.
MAX_DETAILS: Final = 4096
# Seconds `stop` waits for handlers it cancelled to end (one that ignores cancellation is left).
CANCEL_WAIT: Final = 1.0

# Headers that are not the caller's metadata (PROTOCOL-HTTP2 "Call-Definition"; "grpc-" names
# are reserved for gRPC itself).
_CALL_DEFINITION: Final = frozenset({"te", "content-type", "user-agent"})
_RESPONSE_HEADERS: Final = encode_literal_block(GRPC_RESPONSE_HEADERS)
_OK_TRAILERS: Final = encode_literal_block(GRPC_OK_TRAILERS)
# The HEADERS frames of a call that went well, built with one pack: a frame header's first five
# bytes (length, type, flags) are fixed, the stream id follows. Each block fits one frame of any
# peer (a maximum frame size is at least 16384 bytes), so header_frames would never cut it.
_HEADERS_FRAME_START: Final = struct.Struct(">5sL")
_RESPONSE_START: Final = header_frames(0, _RESPONSE_HEADERS, False, frames.DEFAULT_MAX_FRAME)[:5]
_OK_TRAILERS_START: Final = header_frames(0, _OK_TRAILERS, True, frames.DEFAULT_MAX_FRAME)[:5]
# What a handler may return (a tuple, not a union built at each call).
_BYTES_LIKE: Final = (bytes, bytearray, memoryview)


class CallInfo(NamedTuple):
    """What a handler learns about its call besides the request message. (Immutable; a named
    tuple as it is made for every call: half the cost of a frozen dataclass's.)"""

    method: str  # ":path", e.g. "/runtime.v1alpha1.RuntimeHookService/PreRunPodSandboxHook"
    metadata: tuple[tuple[str, str], ...]  # the caller's custom metadata ("-bin" values stay base64)
    deadline: float | None  # loop.time() at which the caller gives up (grpc-timeout); None: never


UnaryHandler = Callable[[bytes, CallInfo], Awaitable[bytes]]


class _RequestHead:
    """What a request's header list says, kept per connection for the next request with the same
    list (a client sends the same headers call after call): the loop over the fields, the
    timeout's parsing and the method's lookup are done once."""

    __slots__ = ("encoding", "handler", "inline", "metadata", "method", "refusal", "timeout")

    def __init__(self, method: str, metadata: tuple[tuple[str, str], ...], encoding: str) -> None:
        self.method = method
        self.metadata = metadata
        self.encoding = encoding
        self.timeout: float | None = None  # grpc-timeout in seconds
        self.handler: UnaryHandler | None = None
        self.inline = False
        self.refusal: tuple[int, str, str] | None = None  # (status, details, HTTP status)


class _Stream(PeerStream):
    """One call: its request as it arrives, then the handler answering it."""

    __slots__ = ("body", "deadline", "expired", "flow", "gone", "head", "request_ended", "sizer", "task", "timer")

    def __init__(self, send_window: int, head: _RequestHead, deadline: float | None, request_ended: bool) -> None:
        self.send_window = send_window  # PeerStream's, set here: a call less per call
        self.head = head  # what its headers say: method, metadata, handler
        self.deadline = deadline
        self.request_ended = request_ended  # the client's END_STREAM arrived
        self.body = bytearray()
        self.sizer: grpc_framing.MessageSizer | None = None  # made once a request comes in pieces
        self.flow = 0  # bytes received against our stream window
        self.expired = False
        self.gone = False  # answered, reset or dropped: no longer in the connection's streams
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def ended(self) -> bool:
        return self.gone

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


class _Connection(H2Peer[_Stream]):
    """The server side of one HTTP/2 connection."""

    def __init__(self, server: H2Server, name: str) -> None:
        announced = {SETTINGS_MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS}
        super().__init__(
            name, server.max_message_size, server=True, peer=GRPC_CLIENT, settings=announced, limits=server.limits
        )
        self.server = server
        self.last_seen = 0  # highest stream id the client opened
        self.last_accepted = 0  # highest stream id we process (GOAWAY's last stream id)
        self.draining = False  # GOAWAY sent: new streams are refused, the connection closes when idle
        self._heads: dict[tuple[tuple[str, str], ...], _RequestHead] = {}  # bounded as h2_peer's literal blocks

    def _last_stream_id(self) -> int:
        return self.last_accepted

    # -- requests ---------------------------------------------------------------------------------

    def _on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        if not stream_id % 2:
            raise ProtocolViolation(frames.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, an even (server) id")
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers after the request's DATA: they end it
            if stream.request_ended:
                self._refuse(stream_id, STREAM_CLOSED, "HEADERS after the request's END_STREAM")
            elif not end_stream:
                self._refuse(stream_id, frames.PROTOCOL_ERROR, "a second header block that does not end the request")
            else:
                self._request_ended(stream_id, stream)
            return
        if stream_id <= self.last_seen:
            return  # a stream we ended already (decoded for HPACK's sake only)
        self.last_seen = stream_id
        if self.draining or len(self.streams) >= MAX_CONCURRENT_STREAMS:
            if not self.draining:  # the client ignored our SETTINGS_MAX_CONCURRENT_STREAMS
                log.warning("refusing a gRPC stream: too many open", server=self.server.name, peer=self.name,
                            stream=stream_id, limit=MAX_CONCURRENT_STREAMS)
            self.answer(frames.rst_stream(stream_id, frames.REFUSED_STREAM))  # clients retry these
            return
        self.last_accepted = stream_id
        key = tuple(headers)
        head = self._heads.get(key)
        if head is None:
            head = self._read_head(headers)
            if len(self._heads) >= MAX_LITERAL_BLOCKS:
                self._heads.clear()
            self._heads[key] = head
        deadline = None if head.timeout is None else self.loop.time() + head.timeout
        stream = _Stream(self.peer_window, head, deadline, end_stream)
        self.streams[stream_id] = stream
        if head.refusal is not None:
            log.info("gRPC request refused", server=self.server.name, peer=self.name, method=head.method,
                     code=grpc_framing.code_name(head.refusal[0]), reason=head.refusal[1])
            self._answer_error(stream_id, stream, *head.refusal)
        elif end_stream:
            self._request_ended(stream_id, stream)

    def _read_head(self, headers: list[tuple[str, str]]) -> _RequestHead:
        """What the request headers say (see _RequestHead)."""
        fields: dict[str, str] = {}
        metadata = []
        for name, value in headers:
            if name.startswith(":") or name in _CALL_DEFINITION or name.startswith("grpc-"):
                fields[name] = value
            else:
                metadata.append((name, value))
        path = fields.get(":path", "")
        head = _RequestHead(path, tuple(metadata), fields.get("grpc-encoding", "identity"))
        if fields.get(":method") != "POST" or not path.startswith("/"):
            head.refusal = StatusCode.UNIMPLEMENTED, f"not a gRPC call: {fields.get(':method')} {path!r}", "405"
            return head
        if not fields.get("content-type", "").startswith("application/grpc"):
            head.refusal = StatusCode.UNKNOWN, f"content-type {fields.get('content-type', '')!r} is not gRPC", "415"
            return head
        timeout = fields.get("grpc-timeout")
        if timeout is not None:
            head.timeout = grpc_framing.parse_timeout(timeout)
            if head.timeout is None:
                head.refusal = StatusCode.INTERNAL, f"malformed grpc-timeout {timeout!r}", "200"
                return head
        route = self.server.routes.get(path)
        if route is None:
            head.refusal = StatusCode.UNIMPLEMENTED, f"unknown method {path}", "200"
            return head
        head.handler, head.inline = route
        return head

    def _on_data(self, stream_id: int, data: bytes, end_stream: bool, flow_size: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_seen:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, f"DATA on stream {stream_id}, which was never opened")
            return  # a stream we ended: the client may still be sending
        if stream.request_ended:
            self._refuse(stream_id, STREAM_CLOSED, "DATA after the request's END_STREAM")
            return
        stream.flow += flow_size
        if stream.flow > self.window:
            self._refuse(stream_id, FLOW_CONTROL_ERROR, f"over the stream window of {self.window} bytes")
            return
        if end_stream and not stream.body and len(data) >= grpc_framing.PREFIX_LEN:
            # The usual request: one uncompressed message in one DATA frame, within the limit as
            # our stream window (the limit and its prefix) held it. It needs no sizer and no
            # copy (single_request's own first check, here).
            flag, size = grpc_framing.MESSAGE_PREFIX.unpack_from(data)
            if not flag and size == len(data) - grpc_framing.PREFIX_LEN:
                stream.request_ended = True
                self._call(stream_id, stream, data[grpc_framing.PREFIX_LEN :])
                return
        if stream.sizer is None:
            stream.sizer = grpc_framing.MessageSizer(self.limit)
        too_large = stream.sizer.feed(data, 0, len(data))
        if too_large is not None:
            details = f"request message of {too_large} bytes is over the limit of {self.limit} bytes"
            log.info("gRPC request refused", server=self.server.name, method=stream.head.method, reason=details)
            self._answer_error(stream_id, stream, StatusCode.RESOURCE_EXHAUSTED, details)
            return
        stream.body += data
        if end_stream:
            self._request_ended(stream_id, stream)

    def _on_rst_stream(self, stream_id: int, error_code: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_seen:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, f"RST_STREAM on stream {stream_id}, never opened")
            return
        self._forget(stream_id)
        stream.cancel()  # the client gave up: nothing is answered

    def _on_goaway(self, last_stream_id: int, error_code: int) -> None:
        if error_code != frames.NO_ERROR:
            log.info("the client ends the connection with an error", server=self.server.name, peer=self.name,
                     h2_error=error_code)

    def _refuse(self, stream_id: int, h2_code: int, reason: str) -> None:
        """A stream error (RFC 9113 section 5.4.2): RST_STREAM, the handler cancelled, a log line."""
        log.warning("resetting a gRPC stream: the client broke the protocol", server=self.server.name,
                    peer=self.name, stream=stream_id, reason=reason, h2_error=h2_code)
        stream = self._forget(stream_id)
        if stream is not None:
            stream.cancel()
        self.answer(frames.rst_stream(stream_id, h2_code))

    # -- calls --------------------------------------------------------------------------------------

    def _request_ended(self, stream_id: int, stream: _Stream) -> None:
        stream.request_ended = True
        head = stream.head
        try:
            request = grpc_framing.single_request(bytes(stream.body), head.encoding, self.limit)
        except grpc_framing.BadRequest as exc:
            log.info("gRPC request refused", server=self.server.name, method=head.method, reason=str(exc))
            self._answer_error(stream_id, stream, _bad_request_code(head.encoding, bytes(stream.body)), str(exc))
            return
        stream.body = bytearray()
        self._call(stream_id, stream, request)

    def _call(self, stream_id: int, stream: _Stream, request: bytes) -> None:
        """Hand the whole ``request`` to the call's handler, unless its deadline has passed."""
        if stream.deadline is not None and stream.deadline <= self.loop.time():
            self._answer_error(stream_id, stream, StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            return
        head = stream.head
        assert head.handler is not None
        info = CallInfo(head.method, head.metadata, stream.deadline)
        if head.inline:
            self._run_now(stream_id, stream, head.handler, request, info)
        else:
            self._start(stream_id, stream, self._run(stream_id, stream, head.handler, request, info))

    def _start(self, stream_id: int, stream: _Stream, call: Coroutine[Any, Any, None]) -> None:
        """Run ``call`` as a task of its own, under the deadline (see the module doc)."""
        stream.task = self.loop.create_task(call)
        if stream.deadline is not None:
            stream.timer = self.loop.call_at(stream.deadline, self._expire, stream_id, stream)

    def _run_now(self, stream_id: int, stream: _Stream, handler: UnaryHandler, request: bytes, info: CallInfo) -> None:
        """Run a handler that cannot suspend to its end here and answer (see the module doc)."""
        try:
            coro: Coroutine[Any, Any, bytes] = handler(request, info)  # type: ignore[assignment]  # an async def's
            contextvars.copy_context().run(coro.send, None)
        except StopIteration as stop:
            response = stop.value
        except asyncio.CancelledError:  # the handler's own doing: nothing else cancels it here
            self._answer_error(stream_id, stream, StatusCode.CANCELLED, "the handler was cancelled")
            return
        except Exception as exc:
            self._handler_failed(stream_id, stream, info.method, exc)
            return
        else:  # cannot happen for a body without await; never leave it half run
            coro.close()
            log.error("gRPC handler suspended although it cannot", server=self.server.name, method=info.method)
            self._answer_error(stream_id, stream, StatusCode.UNKNOWN, "the handler suspended")
            return
        if not self._respond(stream_id, stream, info.method, response):
            # Waits for the client's windows in a task (cancelled with the stream), past the
            # deadline as a task's answer does: the deadline is the handler's.
            stream.task = self.loop.create_task(self._answer(stream_id, stream, bytes(response)))

    def _expire(self, stream_id: int, stream: _Stream) -> None:
        if self.streams.get(stream_id) is stream and stream.task is not None:
            stream.expired = True
            stream.task.cancel()

    async def _run(
        self, stream_id: int, stream: _Stream, handler: UnaryHandler, request: bytes, info: CallInfo
    ) -> None:
        try:
            response = await handler(request, info)
        except asyncio.CancelledError:
            # Cancelled by us (client reset, connection lost, server stopping): the stream is
            # forgotten already and nothing is answered. Else the deadline, or the handler's own doing.
            if stream.expired:
                self._answer_error(stream_id, stream, StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            else:
                self._answer_error(stream_id, stream, StatusCode.CANCELLED, "the handler was cancelled")
            raise
        except Exception as exc:
            self._handler_failed(stream_id, stream, info.method, exc)
            return
        finally:
            if stream.timer is not None:
                stream.timer.cancel()
        if stream.expired:  # the handler swallowed its cancellation: the caller has given up
            self._answer_error(stream_id, stream, StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        elif not self._respond(stream_id, stream, info.method, response):
            await self._answer(stream_id, stream, bytes(response))

    def _handler_failed(self, stream_id: int, stream: _Stream, method: str, exc: Exception) -> None:
        """Answer a handler's exception: its status if it is an `RpcError`, else UNKNOWN (logged)."""
        if isinstance(exc, RpcError):
            self._answer_error(stream_id, stream, exc.code(), exc.details())
            return
        log.exception("gRPC handler raised", server=self.server.name, method=method,
                      error=f"{type(exc).__name__}: {exc}")
        self._answer_error(stream_id, stream, StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")

    def _respond(self, stream_id: int, stream: _Stream, method: str, response: object) -> bool:
        """Answer what a handler returned when that needs no wait: an error for anything but
        bytes within the limit, else the response if it fits the windows. False when the response
        must wait for a window (`_answer` sends it)."""
        if not isinstance(response, _BYTES_LIKE):
            log.error("gRPC handler returned no bytes", server=self.server.name, method=method,
                      returned=type(response).__name__)
            self._answer_error(stream_id, stream, StatusCode.UNKNOWN, f"the handler returned {type(response).__name__}")
        elif len(response) > self.limit:
            details = f"response message of {len(response)} bytes is over the limit of {self.limit} bytes"
            log.error("gRPC response refused", server=self.server.name, method=method, reason=details)
            self._answer_error(stream_id, stream, StatusCode.RESOURCE_EXHAUSTED, details)
        elif self.streams.get(stream_id) is stream:
            message = response if type(response) is bytes else bytes(response)
            head = _HEADERS_FRAME_START.pack(_RESPONSE_START, stream_id) + _RESPONSE_HEADERS
            tail = _HEADERS_FRAME_START.pack(_OK_TRAILERS_START, stream_id) + _OK_TRAILERS
            if not self.send_message_now(stream_id, stream, head, message, tail):
                return False
            self._forget(stream_id)
        return True

    async def _answer(self, stream_id: int, stream: _Stream, response: bytes) -> None:
        """Send the response as the windows allow."""
        if self.streams.get(stream_id) is not stream:
            return
        head = header_frames(stream_id, _RESPONSE_HEADERS, False, self.peer_max_frame)
        tail = header_frames(stream_id, _OK_TRAILERS, True, self.peer_max_frame)
        if await self.send(stream_id, stream, head, grpc_framing.encode_message(response), tail):
            self._forget(stream_id)

    def _answer_error(self, stream_id: int, stream: _Stream, code: int, details: str, http_status: str = "200") -> None:
        """End the call with a trailers-only answer (and RST_STREAM NO_ERROR when the client is
        still sending: PROTOCOL-HTTP2 "Early Server Closure")."""
        if self.streams.get(stream_id) is not stream:
            return
        fields = [(":status", http_status), ("content-type", "application/grpc"), ("grpc-status", str(code))]
        if details:
            fields.append(("grpc-message", _percent_encoded(details)))
        out = header_frames(stream_id, encode_literal_block(fields), True, self.peer_max_frame)
        if not stream.request_ended:
            out += frames.rst_stream(stream_id, frames.NO_ERROR)
        self.write(out)
        self._forget(stream_id)
        if stream.timer is not None:
            stream.timer.cancel()

    def _forget(self, stream_id: int) -> _Stream | None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            stream.gone = True
            self.stream_over()
            if self.server.stopping:  # only stop() waits for it
                self.server.changed.set()
            if self.draining and not self.streams and self.transport is not None:
                self.transport.close()
        return stream

    # -- the connection ---------------------------------------------------------------------------------

    def drain(self) -> None:
        """GOAWAY: no new streams; the connection closes once those in flight are answered."""
        if self.draining or self.lost is not None:
            return
        self.draining = True
        self.write(frames.goaway(self.last_accepted))
        if not self.streams and self.transport is not None:
            self.transport.close()

    def cancel_all(self) -> list[asyncio.Task[None]]:
        """Cancel every handler and close the connection; the tasks cancelled."""
        streams, self.streams = self.streams, {}
        tasks = [s.task for s in streams.values() if s.task is not None and not s.task.done()]
        for stream in streams.values():
            stream.gone = True
            stream.cancel()
        if self.transport is not None:
            self.transport.close()
        return tasks

    def _closed(self, reason: str) -> None:
        self.cancel_all()
        self.server.connection_ended(self)


def _bad_request_code(encoding: str, body: bytes) -> StatusCode:
    """UNIMPLEMENTED for a message compressed in an encoding we cannot read (as gRPC's
    compression spec asks), INTERNAL for any other body that is not one message."""
    messages = grpc_framing.split_messages(body)
    compressed = messages is not None and len(messages) == 1 and messages[0].compressed
    readable = encoding in grpc_framing.READABLE_ENCODINGS
    return StatusCode.UNIMPLEMENTED if compressed and not readable else StatusCode.INTERNAL


def _percent_encoded(details: str) -> str:
    """grpc-message: UTF-8, percent-encoded, cut to MAX_DETAILS at a character boundary ("…" added)."""
    encoded = _encode(details)
    if len(encoded) <= MAX_DETAILS:
        return encoded
    ellipsis = _encode("…")
    low, high = 0, len(details)  # the longest prefix of details whose encoding fits with the ellipsis
    while low < high:
        mid = (low + high + 1) // 2
        if len(_encode(details[:mid])) + len(ellipsis) <= MAX_DETAILS:
            low = mid
        else:
            high = mid - 1
    return _encode(details[:low]) + ellipsis


def _encode(text: str) -> str:
    return grpc_framing.status_headers(0, text, trailers_only=False)[-1][1] if text else ""


class H2Server:
    """Unary gRPC methods (``handlers``: ":path" to handler) on a listening unix socket.

    A handler gets the serialized request and its `CallInfo` and returns the serialized
    response, or raises `RpcError` to answer a status. Requests and responses are limited to
    ``max_message_size`` bytes. ``name`` names the server in log lines. Clients are held to
    ``limits`` (wire.peer_limits).
    """

    def __init__(
        self,
        handlers: Mapping[str, UnaryHandler],
        *,
        max_message_size: int,
        name: str = "grpc",
        limits: LimitSettings = DEFAULT_LIMITS,
    ) -> None:
        # ":path" to the handler, and whether it runs at once (it cannot suspend; module doc).
        self.routes = {path: (handler, never_suspends(handler)) for path, handler in handlers.items()}
        self.max_message_size = max_message_size
        self.name = name
        self.limits = limits
        self.changed = asyncio.Event()  # set when a call or a connection ends, once stopping
        self.stopping = False
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()
        self._serial = 0

    async def start(self, sock: socket.socket) -> None:
        """Serve on ``sock``, bound and listening (runtimeproxy.common.listener); it is ours to close."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._connection, sock=sock)

    def _connection(self) -> _Connection:
        self._serial += 1
        connection = _Connection(self, f"{self.name}#{self._serial}")
        self._connections.add(connection)
        return connection

    def connection_ended(self, connection: _Connection) -> None:
        self._connections.discard(connection)
        self.changed.set()

    async def stop(self, grace: float | None = None) -> None:
        """Stop: no new connections, GOAWAY on each open one (no new calls), calls in flight get
        ``grace`` seconds (None: as long as they take), then are cancelled; connections closed."""
        server, self._server = self._server, None
        if server is None:
            return
        self.stopping = True
        server.close()
        for connection in list(self._connections):
            connection.drain()
        if grace is None or grace > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    while any(connection.streams for connection in self._connections):
                        self.changed.clear()
                        await self.changed.wait()
        cancelled = [task for connection in list(self._connections) for task in connection.cancel_all()]
        if cancelled:
            await asyncio.wait(cancelled, timeout=CANCEL_WAIT)
        await server.wait_closed()

