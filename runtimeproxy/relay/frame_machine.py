"""The relay's frame and stream state machine, with no I/O: fed the bytes of a read, it queues
the bytes to send each way.

This is the part of a relayed connection (connection.py) that follows HTTP/2: it splits reads
into frames, decodes header blocks, keeps each call's state (streams.py), the flow-control
windows and the credit the relay owes either peer, and ends calls itself (over the size limit,
misrouted, reset). What it sends goes to its directions (``FrameDirection.write``), which the
asyncio glue in connection.py turns into socket writes, parked or at once; the held-call
orchestration (held_calls.py) supplies what happens to a claimed call's request. It is one class
of a chain (``RelayMachine`` <- ``HeldCalls`` <- ``RelayConnection``) rather than an object the
others call: every frame costs one handler call, and a layer in between would cost another.

May import the standard library, hpack, structlog, runtimeproxy.wire and the relay's streams,
methods, call_interceptor and options modules; never asyncio, sockets or the other relay modules
(the only task it touches is a claimed call's hook task, cancelled through its stream).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import hpack
import structlog

from runtimeproxy.relay.methods import MethodInfo
from runtimeproxy.relay.options import Backends, RelayOptions
from runtimeproxy.relay.streams import HeldStream, Stream
from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import MessageSizer, status_frame
from runtimeproxy.wire.hpack_cache import CachingDecoder, HeaderList
from runtimeproxy.wire.peer_limits import PeerLimits, PeerOverLimit, header_block_over

log = structlog.get_logger("runtimeproxy.relay")

log = structlog.get_logger("runtimeproxy.relay")

# Handles one frame: (connection, the direction it travels, flags, stream id, read buffer, payload
# start, payload end) -> None to forward the frame unchanged, else the bytes to send instead
# (b"": drop it). Plain functions in per-direction tables: one call per frame, no bound
# methods (which would tie each connection into a reference cycle).
FrameHandler = Callable[["RelayMachine", "FrameDirection", int, int, bytes, int, int], "bytes | None"]
# Frame type (0-255) -> its handler, None for none: indexing a tuple is the cheapest dispatch.
FrameTable = tuple["FrameHandler | None", ...]
# Takes a decoded header block: (connection, stream id, flags of its HEADERS frame, headers).
BlockHandler = Callable[["RelayMachine", int, int, HeaderList], None]
MAX_HEADER_LIST = 1 << 20
_RST_CODES = {frames.REFUSED_STREAM: grpc_framing.UNAVAILABLE, frames.CANCEL: grpc_framing.CANCELLED}
# Flags tested on every frame of their kind, as plain globals (no module attribute lookups).
_PADDED_OR_PRIORITY = frames.FLAG_PADDED | frames.FLAG_PRIORITY
_END_HEADERS = frames.FLAG_END_HEADERS
_PADDED = frames.FLAG_PADDED
_PREFIX_LEN = grpc_framing.PREFIX_LEN
_message_length = grpc_framing.MESSAGE_PREFIX.unpack_from


class FrameDirection:
    """Parse state of one direction of the pair, and what is to be sent to its receiver.

    ``write`` and ``write_out`` belong to the I/O side (connection.py's subclass): they take
    the bytes this direction sends, collected per read in ``out`` or written at once.
    """

    __slots__ = (
        "block",
        "block_flags",
        "block_size",
        "block_stream",
        "decoded",
        "decoder",
        "feeding",
        "handlers",
        "limits",
        "on_block",
        "out",
        "pending",
        "queue",
    )

    def __init__(self, handlers: FrameTable, on_block: BlockHandler, limits: PeerLimits) -> None:
        # Frame types without a handler (PRIORITY, GOAWAY, unknown) pass through untouched.
        self.handlers = handlers
        self.on_block = on_block
        self.limits = limits  # of the peer whose frames this direction reads
        self.pending = b""
        self.decoder = CachingDecoder(max_header_list_size=MAX_HEADER_LIST)
        self.decoded = self.decoder.cache  # see _headers_frame
        # Header block being collected across HEADERS and CONTINUATION frames.
        self.block: list[bytes] | None = None
        self.block_stream = 0
        self.block_flags = 0
        self.block_size = 0
        # Frames of the relay's own, held while a header block is open in this direction
        # or while its bytes are being read (they go out after the frame being handled).
        self.queue: list[bytes] = []
        self.feeding = False
        # While the connection handles a read: what goes to this receiver, written once at the
        # end (see RelayConnection.client_data). None: write at once.
        self.out: list[bytes | memoryview] | None = None

    def write(self, data: bytes | memoryview) -> None:
        """Send ``data`` to this direction's receiver (collected in ``out`` during a read)."""
        raise NotImplementedError

    def write_out(self, park: float | None = None) -> None:
        """End collecting: what ``out`` holds goes to the receiver (``park``: it may wait that long)."""
        raise NotImplementedError

    def inject(self, data: bytes) -> None:
        """Write a frame of the relay's own, in order with the frames already relayed."""
        if self.block is not None or self.feeding:
            self.queue.append(data)
        else:
            self.write(data)

    def flush_queue(self) -> None:
        if self.queue and self.block is None:
            queued, self.queue = self.queue, []
            self.write(b"".join(queued))


class RelayMachine:
    """The frames and calls of one client connection and its backend connection, without I/O.

    Its two directions (``c2u``: client to backend, ``u2c``: backend to client) are made by the
    I/O side, which also supplies the held-call steps declared at the end of this class.
    """

    c2u: FrameDirection
    u2c: FrameDirection

    def __init__(self, options: RelayOptions) -> None:
        self.options = options
        self.upstream_path = options.backends.runtime
        self.streams: dict[int, Stream] = {}
        self.ended_by_relay: set[int] = set()
        self.preface_left = len(frames.PREFACE)
        self.last_client_stream = 0
        self.closing = False
        self.route_service_is_image = False
        self.split_backends = options.backends.split
        self.own_settings_acks = 0  # client SETTINGS ACKs that answer the relay's own SETTINGS
        # Flow control towards the backend, for sending changed requests.
        self.up_conn_window = frames.DEFAULT_WINDOW
        self.up_initial_window = frames.DEFAULT_WINDOW
        self.up_max_frame = frames.DEFAULT_MAX_FRAME
        self.client_credit = 0  # connection credit owed to the client, sent once per read
        self.upstream_credit = 0  # likewise, owed to the backend
        self.client_credit_debt = 0  # backend credit the client must not see (see _settle)
        self.sending_calls = 0  # changed requests waiting for backend credit (Stream.sending)
        self.claimed = False  # whether the read being handled opened a call the interceptor claims

    # -- reading -------------------------------------------------------------------------------

    def _pass_preface(self, data: bytes) -> bytes:
        take = min(self.preface_left, len(data))
        self.c2u.write(data[:take])
        self.preface_left -= take
        return data[take:]

    def _feed(self, d: FrameDirection, data: bytes) -> None:
        """Split ``data`` into frames; forward runs of unchanged frames in one write each."""
        if d.pending:
            data = d.pending + data
            d.pending = b""
        size = len(data)
        last = size - frames.HEADER_LEN  # where the last whole frame header can start
        pos = run_start = 0
        unpack = frames.FRAME_HEADER.unpack_from
        handlers = d.handlers
        header_len, stream_mask = frames.HEADER_LEN, frames.MAX_STREAM_ID
        d.feeding = True
        while pos <= last:
            high, low, ftype, flags, stream_id = unpack(data, pos)
            end = pos + header_len + ((high << 8) | low)
            if end > size:
                break
            handler = handlers[ftype]
            # Only a handler queues frames or closes a header block, so a frame without one
            # never leaves the fast path.
            if handler is not None:
                try:
                    replacement = handler(self, d, flags, stream_id & stream_mask, data, pos + header_len, end)
                except PeerOverLimit:
                    if pos > run_start:  # what came before it is relayed
                        d.write(memoryview(data)[run_start:pos])
                    raise
                if replacement is not None or (d.queue and d.block is None):
                    # Out of the fast path: write what came before, this frame's bytes, then
                    # whatever the relay queued while handling it. Views, not copies: the
                    # pass writes them all at once.
                    if pos > run_start:
                        d.write(memoryview(data)[run_start:pos])
                    if replacement is None:
                        d.write(memoryview(data)[pos:end])
                    elif replacement:
                        d.write(replacement)
                    d.feeding = False
                    d.flush_queue()
                    d.feeding = True
                    run_start = end
            pos = end
        d.feeding = False
        if pos > run_start:
            d.write(data if run_start == 0 and pos == size else memoryview(data)[run_start:pos])
        d.flush_queue()
        if pos < size:
            d.pending = data[pos:]

    # -- client -> backend -----------------------------------------------------------------

    def _client_settings(
        self, d: FrameDirection, flags: int, sid: int, data: bytes, start: int, end: int
    ) -> bytes | None:
        d.limits.settings(end - start)
        if flags & frames.FLAG_ACK:
            if self.own_settings_acks:  # answers the relay's own SETTINGS: not the backend's business
                self.own_settings_acks -= 1
                return b""
            return None
        table = frames.parse_settings(data[start:end]).get(frames.SETTINGS_HEADER_TABLE_SIZE)
        if table is not None:
            self.u2c.decoder.max_allowed_table_size = table
        return None

    def _ping_frame(self, d: FrameDirection, flags: int, sid: int, data: bytes, start: int, end: int) -> bytes | None:
        """Answer a PING to the peer that sent it, and drop it and every PING ACK (either way).

        The relay sends no PING of its own, so every ACK answers a PING it answered already.
        A malformed PING is forwarded as before: its receiver ends the connection with a
        connection error (FRAME_SIZE_ERROR or PROTOCOL_ERROR, RFC 9113 section 6.7).
        """
        d.limits.ping()  # ACKs too: the relay sends no PING, so none answers one of its own
        if end - start != 8 or sid:
            log.warning("malformed PING forwarded; its receiver ends the connection", length=end - start, stream=sid)
            return None
        if not flags & frames.FLAG_ACK:
            (self.u2c if d is self.c2u else self.c2u).inject(frames.ping_ack(data[start:end]))
        return b""

    def _client_window_update(
        self, d: FrameDirection, flags: int, sid: int, data: bytes, start: int, end: int
    ) -> bytes | None:
        return b"" if sid in self.ended_by_relay else None

    def _client_data_frame(
        self, d: FrameDirection, flags: int, sid: int, data: bytes, start: int, end: int
    ) -> bytes | None:
        length = end - start
        if not length and not flags & frames.FLAG_END_STREAM:
            d.limits.empty_frame()
        stream = self.streams.get(sid)
        if stream is None:
            if sid in self.ended_by_relay:
                self.client_credit += length
                return b""
            self.up_conn_window -= length
            return None
        if isinstance(stream, HeldStream):
            return self._hold_request(stream, flags, data, start, end)
        too_big = _oversized(stream, False, flags, data, start, end)
        if too_big is not None:
            self.client_credit += length
            self._end_by_relay(stream, grpc_framing.RESOURCE_EXHAUSTED, _too_large("request", too_big, stream))
            return b""
        self.up_conn_window -= length
        return None

    def _client_headers(self, sid: int, flags: int, headers: HeaderList) -> None:
        # Calls are opened in stream id order (_open_stream), so a higher id is a new call.
        stream = self._open_stream(sid, headers) if sid > self.last_client_stream else self.streams.get(sid)
        if isinstance(stream, HeldStream) and stream.before_task is None and flags & frames.FLAG_END_STREAM:
            # No message for the hooks (headers only), or request trailers, which gRPC does not
            # use: the backend would run the call without the hooks having seen a request.
            self._end_by_relay(stream, grpc_framing.INVALID_ARGUMENT, "a unary request must carry exactly one message")

    def _open_stream(self, sid: int, headers: HeaderList) -> Stream:
        self.last_client_stream = sid
        # The block's method and, for a call the interceptor claims, what its hooks are told of
        # its headers, kept with the decoded block: a client sends the same bytes for each call
        # of a method once its table is warm.
        digest: tuple[MethodInfo, _HeldHeaders | None] | None = headers.digest
        if digest is None:
            fields = dict(headers)  # a repeated field: the last one counts
            method = self.options.methods.lookup(fields.get(":path", ""))
            held = _HeldHeaders.of(headers, fields) if self.options.intercepts(method) else None
            digest = headers.digest = (method, held)
        method, held = digest
        stream: Stream
        if held is not None:
            stream = self._open_held(sid, method, held)
        else:
            stream = Stream(sid, method, time.perf_counter(), self.options.max_message_size)
        self.streams[sid] = stream
        if self.split_backends and self._misrouted(method):
            self._end_by_relay(stream, grpc_framing.UNIMPLEMENTED, self._misroute_reason(method))
        return stream

    def _misrouted(self, method: MethodInfo) -> bool:
        return (method.service == Backends.IMAGE_SERVICE) != self.route_service_is_image

    def _misroute_reason(self, method: MethodInfo) -> str:
        backend = self.options.backends.for_service(method.service)
        return (
            f"{method.path} goes to unix://{backend}, but this connection is routed to "
            f"unix://{self.upstream_path}; with a separate image endpoint, use separate "
            "connections for the runtime and image services"
        )

    def _client_reset(self, d: FrameDirection, flags: int, sid: int, data: bytes, start: int, end: int) -> bytes | None:
        d.limits.reset()
        stream = self.streams.get(sid)
        if stream is not None:
            if isinstance(stream, HeldStream) and stream.before_task is not None:
                stream.before_task.cancel()
            self._finish(stream, grpc_framing.CANCELLED, "cancelled by the client")
        return b"" if sid in self.ended_by_relay else None

    # -- intercepted requests --------------------------------------------------------------

    def _settle(self, owed: int) -> None:
        """The client is owed ``owed`` more connection credit than the backend will return for
        what the relay sent it (negative: less). Netted against the backend credit the relay
        absorbs (client_credit_debt); what that cannot cover, the relay credits itself. Exact:
        the debt never exceeds the credit the backend still owes for bytes it received."""
        debt = self.client_credit_debt - owed
        if debt < 0:
            self.client_credit -= debt
            debt = 0
        self.client_credit_debt = debt

    def _send_pending(self, stream: HeldStream) -> None:
        """Send as much of a changed request as the backend's windows allow, ending the stream."""
        while stream.sending:
            size = min(len(stream.pending_out), self.up_conn_window, stream.up_window, self.up_max_frame)
            if size <= 0 and stream.pending_out:
                return  # resumed by the backend's next WINDOW_UPDATE
            chunk, stream.pending_out = stream.pending_out[:size], stream.pending_out[size:]
            self.up_conn_window -= size
            stream.up_window -= size
            end = frames.FLAG_END_STREAM if not stream.pending_out else 0
            self.c2u.inject(frames.frame(frames.DATA, end, stream.id, chunk))
            if end:
                stream.sending = False
                self.sending_calls -= 1

    # -- backend -> client -----------------------------------------------------------------

    def _upstream_reset(
        self, d: FrameDirection, flags: int, sid: int, data: bytes, start: int, end: int
    ) -> bytes | None:
        d.limits.reset()
        stream = self.streams.get(sid)
        if stream is not None:
            code = _RST_CODES.get(int.from_bytes(data[start:end], "big"), grpc_framing.INTERNAL)
            self._finish(stream, code, "reset by the runtime")
        return b"" if sid in self.ended_by_relay else None

    def _upstream_settings_frame(
        self, d: FrameDirection, flags: int, sid: int, data: bytes, start: int, end: int
    ) -> bytes | None:
        d.limits.settings(end - start)
        if not flags & frames.FLAG_ACK:
            self._upstream_settings(frames.parse_settings(data[start:end]))
        return None

    def _upstream_data_frame(
        self, d: FrameDirection, flags: int, sid: int, data: bytes, start: int, end: int
    ) -> bytes | None:
        if end == start and not flags & frames.FLAG_END_STREAM:
            d.limits.empty_frame()
        stream = self.streams.get(sid)
        if stream is None:
            if sid in self.ended_by_relay:
                self.upstream_credit += end - start
                return b""
            return None
        # Offsets into the read buffer: a large response is never copied to be checked.
        too_big = _oversized(stream, True, flags, data, start, end)
        if too_big is not None:
            self.upstream_credit += end - start
            trailers_only = not stream.response_headers_seen
            message = _too_large("response", too_big, stream)
            self._end_stream(stream, grpc_framing.RESOURCE_EXHAUSTED, message)
            return status_frame(sid, grpc_framing.RESOURCE_EXHAUSTED, message, trailers_only)
        if isinstance(stream, HeldStream):
            lo, hi = frames.data_bounds(flags, data, start, end)
            stream.response_body += data[lo:hi]
        return None

    def _upstream_headers(self, sid: int, flags: int, headers: HeaderList) -> None:
        stream = self.streams.get(sid)
        if stream is None:
            return
        if not flags & frames.FLAG_END_STREAM:
            stream.response_headers_seen = True
            return
        # The status, kept with the decoded block: the backend's trailers of one kind of
        # answer are the same bytes call after call.
        status: tuple[int, str] | None = headers.digest
        if status is None:
            status = headers.digest = _call_status(headers)
        code, message = status
        self._finish(stream, code, message)

    def _upstream_window_update(
        self, d: FrameDirection, flags: int, sid: int, data: bytes, start: int, end: int
    ) -> bytes | None:
        increment = int.from_bytes(data[start : start + 4], "big") & frames.MAX_WINDOW_INCREMENT
        if sid == 0:
            self.up_conn_window += increment
            if self.sending_calls:  # one WINDOW_UPDATE per request: no walk over the calls for nothing
                self._resume_pending_sends()
            if self.client_credit_debt:
                absorbed = min(self.client_credit_debt, increment)
                self.client_credit_debt -= absorbed
                increment -= absorbed
                return frames.window_update(0, increment)  # b"" when all absorbed
            return None
        if sid in self.ended_by_relay:
            return b""
        stream = self.streams.get(sid)
        if isinstance(stream, HeldStream):
            stream.up_window += increment
            self._send_pending(stream)
        return None

    def _upstream_settings(self, values: dict[int, int]) -> None:
        window = values.get(frames.SETTINGS_INITIAL_WINDOW_SIZE)
        if window is not None:
            delta = window - self.up_initial_window
            self.up_initial_window = window
            for stream in self.streams.values():
                if isinstance(stream, HeldStream):  # only a changed request is sent by the relay
                    stream.up_window += delta
        self.up_max_frame = values.get(frames.SETTINGS_MAX_FRAME_SIZE, self.up_max_frame)
        table = values.get(frames.SETTINGS_HEADER_TABLE_SIZE)
        if table is not None:
            self.c2u.decoder.max_allowed_table_size = table

    def _resume_pending_sends(self) -> None:
        for stream in self.streams.values():
            if isinstance(stream, HeldStream) and stream.sending:
                self._send_pending(stream)

    def _headers_frame(
        self, d: FrameDirection, flags: int, sid: int, data: bytes, start: int, end: int
    ) -> bytes | None:
        """Start a header block; decode it once complete. Header frames are always forwarded."""
        if flags & _PADDED_OR_PRIORITY:
            fragment = bytes(frames.header_block_fragment(flags, data[start:end]))
        else:
            fragment = data[start:end]
        if not fragment and not flags & frames.FLAG_END_STREAM:
            d.limits.empty_frame()
        if flags & _END_HEADERS:
            # The decoder's cache first, inline: three header blocks per call, nearly all hits.
            headers = d.decoded.get(fragment)
            d.on_block(self, sid, flags, self._decode(d, fragment) if headers is None else headers)
        else:
            d.block, d.block_stream, d.block_flags, d.block_size = [fragment], sid, flags, len(fragment)
        return None

    def _continuation_frame(
        self, d: FrameDirection, flags: int, sid: int, data: bytes, start: int, end: int
    ) -> bytes | None:
        if d.block is None:
            d.limits.continuation(0)
            return None  # a stray CONTINUATION: the receiver will reject it
        d.limits.continuation(len(d.block))
        d.block_size += end - start
        if d.block_size > MAX_HEADER_LIST:
            raise header_block_over(MAX_HEADER_LIST, d.block_size)
        d.block.append(data[start:end])
        if flags & frames.FLAG_END_HEADERS:
            block, d.block = b"".join(d.block), None
            d.on_block(self, d.block_stream, d.block_flags, self._decode(d, block))
        return None

    def _decode(self, d: FrameDirection, block: bytes) -> HeaderList:
        try:
            return d.decoder.decode(block)
        except hpack.HPACKError as exc:
            return self._undecodable(exc)

    def _undecodable(self, exc: hpack.HPACKError) -> HeaderList:
        # The peers' own decoders will fail on this too; the connection cannot go on.
        log.error("undecodable header block; closing connection", error=str(exc))
        self._close_soon()
        return HeaderList()

    # -- ending calls ----------------------------------------------------------------------

    def _end_by_relay(self, stream: Stream, code: int, message: str) -> None:
        """End a call the backend is still working on: error to the client, reset upstream."""
        trailers_only = not stream.response_headers_seen
        self._end_stream(stream, code, message)
        self.u2c.inject(status_frame(stream.id, code, message, trailers_only))

    def _end_stream(self, stream: Stream, code: int, message: str) -> None:
        if isinstance(stream, HeldStream) and stream.before_task is not None:
            stream.before_task.cancel()
        self.ended_by_relay.add(stream.id)
        self.c2u.handlers = _CLIENT_FRAMES_AFTER_END
        if len(self.ended_by_relay) > 4096:
            self.ended_by_relay = {sid for sid in self.ended_by_relay if sid > stream.id - 100_000}
        self.c2u.inject(frames.rst_stream(stream.id, frames.CANCEL))
        self._finish(stream, code, message)

    def _finish(self, stream: Stream, code: int, message: str) -> None:
        if self.streams.pop(stream.id, None) is None:
            return
        if isinstance(stream, HeldStream):
            self._finish_held(stream, code, message)
        else:
            self.options.observer(stream.method, code, message, time.perf_counter() - stream.started, False)

    def _flush_credit(self) -> None:
        if self.client_credit:
            self.u2c.inject(frames.window_update(0, self.client_credit))
            self.client_credit = 0
        if self.upstream_credit:
            self.c2u.inject(frames.window_update(0, self.upstream_credit))
            self.upstream_credit = 0

    @property
    def active_calls(self) -> int:
        return len(self.streams)

    # -- supplied by the held-call orchestration and the I/O side ------------------------------

    def _open_held(self, sid: int, method: MethodInfo, held: _HeldHeaders) -> HeldStream:
        """A claimed call opened: its stream."""
        raise NotImplementedError

    def _hold_request(self, stream: HeldStream, flags: int, data: bytes, start: int, end: int) -> bytes:
        """A DATA frame of a claimed call's request: what to send instead of it."""
        raise NotImplementedError

    def _finish_held(self, stream: HeldStream, code: int, message: str) -> None:
        """A claimed call ended with ``code``: give back what it held, tell the interceptor."""
        raise NotImplementedError

    def _close_soon(self) -> None:
        """Close both connections once the read being handled is done."""
        raise NotImplementedError


class _HeldHeaders(NamedTuple):
    """What a claimed call's hooks are told of its request headers, derived once per block."""

    metadata: tuple[tuple[str, str], ...]  # pseudo-headers left out
    timeout: float | None  # grpc-timeout, seconds
    encoding: str  # grpc-encoding

    @classmethod
    def of(cls, headers: HeaderList, fields: dict[str, str]) -> _HeldHeaders:
        timeout = fields.get("grpc-timeout")
        return cls(
            tuple((name, value) for name, value in headers if not name.startswith(":")),
            grpc_framing.parse_timeout(timeout) if timeout else None,
            fields.get("grpc-encoding", "identity"),
        )


def _table(handlers: dict[int, FrameHandler]) -> FrameTable:
    return tuple(handlers.get(ftype) for ftype in range(256))


# A client's WINDOW_UPDATEs (two per call) pass untouched until the relay has ended a call
# itself: only then may one name a stream the backend no longer knows.
_CLIENT_HANDLERS: dict[int, FrameHandler] = {
    frames.DATA: RelayMachine._client_data_frame,
    frames.HEADERS: RelayMachine._headers_frame,
    frames.CONTINUATION: RelayMachine._continuation_frame,
    frames.RST_STREAM: RelayMachine._client_reset,
    frames.SETTINGS: RelayMachine._client_settings,
    frames.PING: RelayMachine._ping_frame,
}
_CLIENT_FRAMES = _table(_CLIENT_HANDLERS)
_CLIENT_FRAMES_AFTER_END = _table({**_CLIENT_HANDLERS, frames.WINDOW_UPDATE: RelayMachine._client_window_update})
_UPSTREAM_FRAMES = _table(
    {
        frames.DATA: RelayMachine._upstream_data_frame,
        frames.HEADERS: RelayMachine._headers_frame,
        frames.CONTINUATION: RelayMachine._continuation_frame,
        frames.RST_STREAM: RelayMachine._upstream_reset,
        frames.SETTINGS: RelayMachine._upstream_settings_frame,
        frames.WINDOW_UPDATE: RelayMachine._upstream_window_update,
        frames.PING: RelayMachine._ping_frame,
    }
)


def first_call_path(data: bytes) -> str | None:
    """The :path of the first call in the opening bytes of a client connection, if complete."""
    pos = len(frames.PREFACE)
    block = b""
    while len(data) - pos >= frames.HEADER_LEN:
        high, low, ftype, flags, _sid = frames.FRAME_HEADER.unpack_from(data, pos)
        end = pos + frames.HEADER_LEN + ((high << 8) | low)
        if end > len(data):
            return None
        payload = data[pos + frames.HEADER_LEN : end]
        if ftype == frames.HEADERS:
            block = bytes(frames.header_block_fragment(flags, payload))
        elif ftype == frames.CONTINUATION:
            block += payload
        if ftype in (frames.HEADERS, frames.CONTINUATION) and flags & frames.FLAG_END_HEADERS:
            # A fresh decoder is right here: this is the connection's first header block.
            headers = CachingDecoder(max_header_list_size=MAX_HEADER_LIST).decode(block)
            return next((v for k, v in headers if k == ":path"), "")
        pos = end
    return None


def _call_status(trailers: HeaderList) -> tuple[int, str]:
    """The gRPC status code and message a call's trailers carry."""
    fields = dict(trailers)  # a repeated field: the last one counts
    status = fields.get("grpc-status")
    code = grpc_framing.UNKNOWN if status is None else grpc_framing.parse_status(status)
    message = fields.get("grpc-message")
    return code, grpc_framing.decode_grpc_message(message) if message else ""


def _too_large(what: str, size: int, stream: Stream) -> str:
    return f"{what} message of {size} bytes for {stream.method.path} is over the proxy's limit of {stream.limit}"


def _oversized(stream: Stream, response: bool, flags: int, data: bytes, start: int, end: int) -> int | None:
    """The size of a message over the limit in the DATA payload ``data[start:end]`` of ``stream``,
    if one starts there; else None. Checked in place (a large response's frames are most of what
    the relay reads). A frame that is exactly one whole message within the limit leaves the
    call at a message boundary, as it found it (a unary call's only DATA frame, nearly every
    frame): no sizer is made for such calls."""
    if flags & _PADDED:
        start, end = frames.data_bounds(flags, data, start, end)
    sizer = stream.response_sizer if response else stream.request_sizer
    if sizer is None:
        size = end - start - _PREFIX_LEN
        if size >= 0:
            length: int = _message_length(data, start)[1]
            if length == size and length <= stream.limit:
                return None
        sizer = MessageSizer(stream.limit)
        if response:
            stream.response_sizer = sizer
        else:
            stream.request_sizer = sizer
    return sizer.feed(data, start, end)
