"""One client connection relayed onto one backend connection, frame by frame.

Design (see README, "Data path"): every client connection gets its own backend
connection, and the bytes of both are forwarded unchanged, so the two peers negotiate
settings, flow control and the HPACK tables directly with each other. The relay parses
only frame headers, decodes header blocks (to learn each call's method and status and to
follow the HPACK state), and steps in for just five things:

* calls an interceptor claims: the request DATA is held, passed to the interceptor and
  sent on as changed; the response is copied for ``after``;
* a message over the size limit: the call is ended with RESOURCE_EXHAUSTED;
* flow-control credit for bytes it dropped or rewrote, so neither peer's window leaks;
* PING, which is hop by hop (RFC 9113 section 6.7): the relay answers every PING from either
  side itself and forwards neither PINGs nor their ACKs (it sends no PING of its own), so
  containerd's BDP pings after each request cost no round trip through the client;
* connection ends and graceful shutdown (GOAWAY);
* a peer over one of the limits every HTTP/2 peer is held to (wire.peer_limits: PING,
  SETTINGS, RST_STREAM, empty and CONTINUATION frames, header block sizes): GOAWAY
  ENHANCE_YOUR_CALM to it and both connections closed; when it is the backend, the client's
  calls in flight end with UNAVAILABLE first, naming the cause.

Backpressure: while the write buffer towards either peer is over its high-water mark, the relay
reads from neither, so a peer that does not read gets no more answers and its frames wait in
the socket; each buffer holds at most its mark plus what one read produced.

Everything bound for one peer while a read is being handled (relayed frames and the relay's
own, in order) goes out in one write at the end of that read: one syscall per peer per read.
A read's write that can wait is parked instead (see ``_Direction.park``): a claimed call's
HEADERS, useless to the backend before the hooks release its DATA, the relay's own
flow-control credit, and its answers to the backend's PINGs (grpc-go sends one after each
request). Parked bytes go out in front of the next write that way, or after ``PARK_DELAY``,
so a hooked call costs one write and one backend wake-up less. Answers to the backend's BDP
pings wait ``BDP_ANSWER_DELAY`` whatever else is written: while one is out, grpc-go sends no
other, so most calls cost neither side a PING, a WINDOW_UPDATE before it, nor their wake-ups.

Frames the relay writes itself use only HPACK literals without indexing (never touching
the shared tables). A header block is always forwarded, even for a call the relay ended,
because the receiver must decode it to keep its table in step.

Connection credit for a claimed call's held request: the frames that complete it (END_STREAM)
are credited to the client by the backend's own credit for the request sent on, which passes
through as for any call; the relay only evens out the difference in size (a larger request:
that much of the backend's credit is absorbed; a smaller one: the relay credits the rest) and
credits the held bytes itself when the call ends before they were sent on. Frames before the
last are credited at once, as the client may need the credit to send the rest.

Known limit: what the relay sends on beyond a request's last frame (frames before it, credited
at once, and what the hooks added) takes that much more of the backend's connection window than
the client knows of, until the backend credits it: a client that fills its whole window at that
instant could overrun the backend's. CRI requests are small, mostly one frame, and hooks add
little, so this is documented rather than solved with extra buffering.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import hpack
import structlog

from runtimeproxy.common import trace
from runtimeproxy.relay.call_interceptor import CallContext, CallInterceptor, CallOutcome, RejectCall
from runtimeproxy.relay.methods import MethodInfo, MethodTable
from runtimeproxy.relay.streams import HeldStream, Stream
from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import MessageSizer, status_frame
from runtimeproxy.wire.hpack_cache import CachingDecoder, HeaderList
from runtimeproxy.wire.peer_limits import (
    CLOSE_GRACE,
    CRI_CLIENT,
    DEFAULT_LIMITS,
    OPENING_BYTES,
    RUNTIME,
    LimitSettings,
    PeerLimits,
    PeerOverLimit,
    header_block_over,
    peer_pid,
)

log = structlog.get_logger("runtimeproxy.relay")

# (method, gRPC code, message, seconds, whether the interceptor saw the call and logs it)
CallObserver = Callable[[MethodInfo, int, str, float, bool], None]
# Handles one frame: (connection, the direction it travels, flags, stream id, read buffer, payload
# start, payload end) -> None to forward the frame unchanged, else the bytes to send instead
# (b"": drop it). Plain functions in per-direction tables: one call per frame, no bound
# methods (which would tie each connection into a reference cycle).
FrameHandler = Callable[["RelayConnection", "_Direction", int, int, bytes, int, int], "bytes | None"]
# Frame type (0-255) -> its handler, None for none: indexing a tuple is the cheapest dispatch.
FrameTable = tuple["FrameHandler | None", ...]
# Takes a decoded header block: (connection, stream id, flags of its HEADERS frame, headers).
BlockHandler = Callable[["RelayConnection", int, int, HeaderList], None]
MAX_HEADER_LIST = 1 << 20
# Client bytes the relay keeps before its backend connection is settled (with two backends,
# until the first call's header block is whole): the preface and settings, and a first header
# block of the largest header list.
MAX_OPENING_BYTES = MAX_HEADER_LIST + 64 * 1024
# How long a parked frame may wait for the next write towards its peer. A hook call in a pod
# start takes 1-2 ms, so the held call's HEADERS usually go out with its released DATA and the
# client's credit with the response; a slow hook must not hold the backend's view of the call,
# nor a peer's flow-control credit, longer than this.
PARK_DELAY = 0.005
# How long the answer to a BDP ping waits, whatever else goes to its sender meanwhile.
# grpc-go, server (containerd) and client (kubelet) alike, sends a BDP ping, with a connection
# WINDOW_UPDATE before it, on the first DATA it reads while none of its BDP pings is unanswered
# (http2_server.go / http2_client.go handleData, bdp_estimator.go add). Answered at once, every
# request cost containerd that write and the relay a wake-up and a write to the client, and
# every response the same on the other side. Held this long, a busy connection sends one a
# second. Only the BDP estimator reads the answer (calculate() ignores any other payload and
# takes the time since the ping as an RTT sample): the window still grows when many bytes
# arrive within the second (a large list), not for small calls, which never need it; ordinary
# credit (a WINDOW_UPDATE once a quarter of a window is read) flows as before. Other PINGs keep
# their pace: the backend's (keepalive, whose ACK grpc-go's server awaits Timeout = 20 s by
# default; the GOAWAY ping of a graceful stop) are answered within PARK_DELAY, a client's at
# once (a client may time them).
BDP_ANSWER_DELAY = 1.0
# What _may_wait answers for a write of answers to BDP pings alone: held BDP_ANSWER_DELAY,
# not taken along by the next write (see _Direction.park).
BDP_ANSWERS_ONLY = float("inf")
_BDP_PING = bytes((2, 4, 16, 16, 9, 14, 7, 7))  # grpc-go's bdpPing payload (bdp_estimator.go)
_RST_CODES = {frames.REFUSED_STREAM: grpc_framing.UNAVAILABLE, frames.CANCEL: grpc_framing.CANCELLED}
# Flags tested on every frame of their kind, as plain globals (no module attribute lookups).
_PADDED_OR_PRIORITY = frames.FLAG_PADDED | frames.FLAG_PRIORITY
_END_HEADERS = frames.FLAG_END_HEADERS
_PADDED = frames.FLAG_PADDED
_PREFIX_LEN = grpc_framing.PREFIX_LEN
_message_length = grpc_framing.MESSAGE_PREFIX.unpack_from


class Backends:
    """Where calls go: the runtime backend, and the image backend when it is a different one.

    With two backends, each client connection is routed by the service of its first call
    (kubelet keeps separate connections for the runtime and image services); a call on
    a connection routed to the other backend is refused with a status that says why.
    """

    IMAGE_SERVICE = "runtime.v1.ImageService"

    def __init__(self, runtime: str, image: str | None = None) -> None:
        self.runtime = runtime
        self.image = image or runtime

    @property
    def split(self) -> bool:
        return self.image != self.runtime

    def for_service(self, service: str) -> str:
        return self.image if service == self.IMAGE_SERVICE else self.runtime


class RelayOptions:
    """What every relayed connection shares."""

    def __init__(
        self,
        backends: Backends,
        methods: MethodTable,
        interceptor: CallInterceptor,
        observer: CallObserver,
        max_message_size: int,
        held_budget: int | None = None,
        peer_limits: LimitSettings = DEFAULT_LIMITS,
    ) -> None:
        self.backends = backends
        self.peer_limits = peer_limits  # what either peer may send (wire.peer_limits)
        self.methods = methods
        self.interceptor = interceptor
        self.observer = observer
        self.max_message_size = max_message_size
        self.held = HeldBytes(2 * max_message_size if held_budget is None else held_budget)
        # ``after`` calls owed to the interceptor, across connections: a stopping proxy
        # gives them the drain grace and counts those it cuts off.
        self.after_tasks: set[asyncio.Task[None]] = set()
        self._claims: dict[str, bool] = {}

    def intercepts(self, method: MethodInfo) -> bool:
        claimed = self._claims.get(method.path)
        if claimed is None:
            claimed = method.unary and self.interceptor.intercepts(method)
            self._claims[method.path] = claimed
        return claimed


class HeldBytes:
    """The bytes of intercepted requests held in memory, across connections, under one budget.

    Each held byte costs several more while the hooks work on it (a copy, the decoded
    message, the re-encoded request), so many large requests at once could take the node's
    memory: past the budget, a call is refused with RESOURCE_EXHAUSTED and kubelet retries.
    """

    __slots__ = ("budget", "used")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.budget:
            return False
        self.used += size
        return True

    def give_back(self, size: int) -> None:
        self.used -= size


class _Direction:
    """Parse state of one direction of the pair and the writer towards its receiver."""

    __slots__ = (
        "block",
        "block_flags",
        "block_size",
        "block_stream",
        "decoded",
        "decoder",
        "due",
        "feeding",
        "handlers",
        "late",
        "late_timer",
        "limits",
        "loop",
        "on_block",
        "out",
        "parked",
        "pending",
        "queue",
        "timer",
        "transport",
    )

    def __init__(self, handlers: FrameTable, on_block: BlockHandler, limits: PeerLimits) -> None:
        # Frame types without a handler (PRIORITY, GOAWAY, unknown) pass through untouched.
        self.handlers = handlers
        self.on_block = on_block
        self.limits = limits  # of the peer whose frames this direction reads
        self.transport: asyncio.Transport | None = None
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
        # Frames that can wait (see park): they go first in the next write, or when timer fires.
        self.parked: list[bytes | memoryview] = []
        self.timer: asyncio.TimerHandle | None = None
        self.due = 0.0  # when the timer fires (loop time)
        # Answers to BDP pings: only their own timer sends them (see BDP_ANSWER_DELAY).
        self.late: list[bytes] = []
        self.late_timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # see running_loop

    def running_loop(self) -> asyncio.AbstractEventLoop:
        """asyncio.get_running_loop(), looked up once: each lookup costs a getpid() syscall
        (CPython checks for a fork), and the relay needs the loop per call. RuntimeError
        outside a running loop, as get_running_loop."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        return self.loop

    def write(self, data: bytes | memoryview) -> None:
        if self.out is not None:
            self.out.append(data)
        elif self.transport is not None:
            if self.parked:
                self._send([*self.unpark(), data])
            else:
                self.transport.write(data)

    def write_out(self, park: float | None = None) -> None:
        """End collecting: everything collected during the read in one call, so one syscall
        (uvloop sends several pieces with one writev, without joining them). ``park``: how long
        all of it may wait for the next write (None: not at all)."""
        out, self.out = self.out, None
        if out and self.transport is not None and not (park is not None and self.park(out, park)):
            if self.parked:
                out[:0] = self.unpark()
            if len(out) == 1:  # as _send, inline: this runs per read
                self.transport.write(out[0])
            else:
                self.transport.writelines(out)

    def _send(self, out: list[bytes | memoryview]) -> None:
        assert self.transport is not None
        if len(out) == 1:
            self.transport.write(out[0])
        else:
            self.transport.writelines(out)

    def park(self, out: list[bytes | memoryview], delay: float) -> bool:
        """Keep ``out`` for the next write in this direction, at most ``delay`` seconds; False
        when there is no event loop to bound the wait (then it goes out at once). One timer:
        it fires when the earliest parked piece is due, and takes all of them.
        ``BDP_ANSWERS_ONLY``: held BDP_ANSWER_DELAY, and no other write takes it along."""
        try:
            loop = self.running_loop()
        except RuntimeError:
            return False
        if delay == BDP_ANSWERS_ONLY:
            self.late.append(b"".join(out))
            if self.late_timer is None:
                self.late_timer = loop.call_later(BDP_ANSWER_DELAY, self.flush_late)
            return True
        due = loop.time() + delay
        if self.timer is None or due < self.due:
            if self.timer is not None:
                self.timer.cancel()
            self.timer, self.due = loop.call_at(due, self.flush_parked), due
        # A copy: views would pin the whole read buffer while parked.
        self.parked.append(out[0] if len(out) == 1 and isinstance(out[0], bytes) else b"".join(out))
        return True

    def unpark(self) -> list[bytes | memoryview]:
        """The parked frames, to be written in front of what follows; stops the timer."""
        parked, self.parked = self.parked, []
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return parked

    def flush_parked(self) -> None:
        """The timer's end, or a path that writes nothing else: parked frames go out alone."""
        parked = self.unpark()
        if parked and self.transport is not None and not self.transport.is_closing():
            self._send(parked)

    def flush_late(self) -> None:
        late, self.late, self.late_timer = self.late, [], None
        if late and self.transport is not None and not self.transport.is_closing():
            self._send([*self.unpark(), *late])

    def drop_parked(self) -> None:
        """Forget every parked frame and stop both timers (the connection is going)."""
        self.unpark()
        self.late = []
        if self.late_timer is not None:
            self.late_timer.cancel()
            self.late_timer = None

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


class _Side(asyncio.Protocol):
    """asyncio protocol for one socket; it hands everything to the connection."""

    def __init__(self, conn: RelayConnection, is_client: bool) -> None:
        self.conn = conn
        self.is_client = is_client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limits = self.conn.options.peer_limits
        transport.set_write_buffer_limits(high=limits.write_buffer_high, low=limits.write_buffer_low)  # type: ignore[attr-defined]
        self.conn.side_made(self.is_client, transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        if self.is_client:
            self.conn.client_data(data)
        else:
            self.conn.upstream_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.side_lost(self.is_client, exc)

    def pause_writing(self) -> None:
        self.conn.writes_paused(towards_client=self.is_client, paused=True)

    def resume_writing(self) -> None:
        self.conn.writes_paused(towards_client=self.is_client, paused=False)


class RelayConnection:
    """The pair of connections for one client, and every call on it."""

    def __init__(self, options: RelayOptions, on_closed: Callable[[RelayConnection], None]) -> None:
        self.options = options
        self.upstream_path = options.backends.runtime
        self.on_closed = on_closed
        # client -> upstream, written to the upstream socket; upstream -> client likewise.
        limits = options.peer_limits
        self.c2u = _Direction(_CLIENT_FRAMES, RelayConnection._client_headers, PeerLimits(CRI_CLIENT, limits))
        self.u2c = _Direction(_UPSTREAM_FRAMES, RelayConnection._upstream_headers, PeerLimits(RUNTIME, limits))
        self.client_transport: asyncio.Transport | None = None
        self.upstream_transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.ended_by_relay: set[int] = set()
        self.tasks: set[asyncio.Task[None]] = set()  # cancelled when the connection goes
        self.preface_left = len(frames.PREFACE)
        # Client bytes that came before the backend connection was settled.
        self.early: list[bytes] | None = []
        self.early_size = 0
        self.full_buffers = 0  # write buffers over their high-water mark: 1 towards the client, 2 the backend
        self.degraded: _BackendDown | None = None
        self.last_client_stream = 0
        self.closing = False
        self.route_service_is_image = False
        self.routed = False  # with two backends: whether the first call has chosen one
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

    # -- protocol factory and socket events -------------------------------------------------

    def client_protocol(self) -> asyncio.Protocol:
        return _Side(self, is_client=True)

    def side_made(self, is_client: bool, transport: asyncio.Transport) -> None:
        if is_client:
            self.client_transport = self.u2c.transport = transport
            if not self.split_backends:
                self._keep(asyncio.get_running_loop().create_task(self._connect_upstream()))
            else:
                # Clients wait for the server's SETTINGS before their first call, and the
                # backend is chosen by that call: speak first with SETTINGS that change
                # nothing, and keep the client's ACK of it from the backend.
                transport.write(frames.settings())
                self.own_settings_acks = 1
        else:
            self.upstream_transport = self.c2u.transport = transport

    async def _connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_unix_connection(lambda: _Side(self, is_client=False), self.upstream_path)
        except OSError as exc:
            reason = f"runtime backend unix://{self.upstream_path} unavailable: {exc.strerror or exc}"
            log.warning("backend unreachable", backend=self.upstream_path, error=str(exc))
            self.degraded = _BackendDown(self, reason)
        if self.closing and self.upstream_transport is not None:
            self.upstream_transport.close()  # the client left while we were connecting
            return
        early, self.early = self.early or [], None
        for chunk in early:
            self.client_data(chunk)

    def side_lost(self, is_client: bool, exc: Exception | None) -> None:
        other = self.upstream_transport if is_client else self.client_transport
        if not is_client and not self.closing and self.client_transport is not None:
            # Tell the client this connection is done, so it reconnects instead of waiting.
            self.u2c.queue.clear()
            self.u2c.block = None
            self.u2c.write(frames.goaway(self.last_client_stream))  # after any parked credit
        self.closing = True
        self._drop_parked()
        code = grpc_framing.CANCELLED if is_client else grpc_framing.UNAVAILABLE
        for stream in list(self.streams.values()):
            self._finish(stream, code, "connection closed")
        for task in list(self.tasks):
            task.cancel()
        if other is not None:
            other.close()
        if is_client:
            self.on_closed(self)

    def writes_paused(self, towards_client: bool, paused: bool) -> None:
        """The write buffer towards one peer went over its high-water mark, or back under its low
        one. While either is over, the relay reads from neither peer: not from the other, whose
        frames would only add to it, nor from this one, whose frames the relay may answer (a
        peer that does not read gets no further answers)."""
        bit = 1 if towards_client else 2
        was = self.full_buffers
        self.full_buffers = was | bit if paused else was & ~bit
        if bool(was) == bool(self.full_buffers):
            return
        for transport in (self.client_transport, self.upstream_transport):
            if transport is not None:
                if self.full_buffers:
                    transport.pause_reading()
                else:
                    transport.resume_reading()

    # -- shutdown ------------------------------------------------------------------------------

    def start_drain(self) -> None:
        """Ask the client to open no more calls (RFC 9113 section 6.8, graceful shutdown)."""
        self.u2c.inject(frames.goaway(frames.MAX_STREAM_ID))

    def close(self) -> None:
        if self.client_transport is not None and not self.client_transport.is_closing():
            self.u2c.inject(frames.goaway(self.last_client_stream))
            self.client_transport.close()
        if self.upstream_transport is not None:
            self.upstream_transport.close()
        self._drop_parked()

    def _drop_parked(self) -> None:
        """The connection is going: what is still parked (credit, the HEADERS of calls that will
        never be sent on) is of no use to a peer, and no timer may write after the close."""
        self.c2u.drop_parked()
        self.u2c.drop_parked()

    # -- reading -------------------------------------------------------------------------------

    def client_data(self, data: bytes) -> None:
        if self.early is not None:
            self._keep_early(data)
            return
        if self.degraded is not None:
            try:
                self.degraded.feed(data)
            except PeerOverLimit as exc:
                self._over_limit(self.c2u, exc)
            return
        # Each read is one pass: every write of it, both ways, is collected and goes out at the
        # end, one syscall (and one wake-up of the peer) per peer instead of one per run of
        # frames, injected frame and credit update. Inline, not a helper: this runs per read.
        c2u, u2c = self.c2u, self.u2c
        c2u.out, u2c.out = [], []
        u2c.limits.data_sent()  # what this read relays: the backend may ping once more
        try:
            if self.preface_left:
                data = self._pass_preface(data)
            self._feed(c2u, data)
            self._flush_credit()
        except PeerOverLimit as exc:
            self._over_limit(c2u, exc)
        finally:
            # Parking saves a write only when nothing else goes that way: a claimed call's
            # HEADERS wait for its DATA (the hooks hold it), the relay's credit for anything.
            # Checked only when something could be parked: this runs per read.
            if self.claimed:
                self.claimed = False
                c2u.write_out(self._may_wait(c2u.out, True, True))
            else:
                c2u.write_out()
            u2c.write_out(self._may_wait(u2c.out, False, False) if u2c.out else None)

    def upstream_data(self, data: bytes) -> None:
        c2u, u2c = self.c2u, self.u2c  # one pass, as in client_data
        c2u.out, u2c.out = [], []
        c2u.limits.data_sent()  # likewise, the client
        try:
            self._feed(u2c, data)
            self._flush_credit()
        except PeerOverLimit as exc:
            self._over_limit(u2c, exc)
        finally:
            # The response first: the backend's share of a read (credit, PING answers) can wait.
            u2c.write_out()
            c2u.write_out(self._may_wait(c2u.out, True, False) if c2u.out else None)

    def _may_wait(self, out: list[bytes | memoryview], to_backend: bool, held_calls: bool) -> float | None:
        """How long every frame of ``out`` may be parked (None: not at all): WINDOW_UPDATEs;
        the relay's answers to grpc-go's BDP pings, either way (BDP_ANSWERS_ONLY when there is
        nothing else); towards the backend, its answers to other PINGs, so that answering one
        costs no write of its own and no wake-up of the backend; with ``held_calls``, header
        frames of claimed calls whose request the hooks still hold. Each piece of ``out`` is
        whole frames (the connection preface is not, and fails the check: it goes at once)."""
        streams, unpack = self.streams, frames.FRAME_HEADER.unpack_from
        delay = BDP_ANSWERS_ONLY
        for piece in out:
            pos, size = 0, len(piece)
            while pos < size:
                if size - pos < frames.HEADER_LEN:
                    return None
                high, low, ftype, flags, sid = unpack(piece, pos)
                if _is_ping_answer(high, low, ftype, flags, sid):
                    start = pos + frames.HEADER_LEN
                    if piece[start : start + 8] != _BDP_PING:
                        if not to_backend:  # a client's other PINGs are answered at once
                            return None
                        delay = PARK_DELAY
                elif ftype == frames.WINDOW_UPDATE:
                    delay = PARK_DELAY
                else:
                    if not held_calls or ftype not in (frames.HEADERS, frames.CONTINUATION):
                        return None
                    stream = streams.get(sid & frames.MAX_STREAM_ID)
                    if not isinstance(stream, HeldStream) or stream.after_due:
                        return None
                    delay = PARK_DELAY
                pos += frames.HEADER_LEN + ((high << 8) | low)
            if pos != size:
                return None
        return delay

    def _keep_early(self, data: bytes) -> None:
        """Keep client bytes until the backend connection is settled (a bounded amount)."""
        assert self.early is not None
        self.early.append(data)
        self.early_size += len(data)
        if self.early_size > MAX_OPENING_BYTES:
            reason = f"over {MAX_OPENING_BYTES} bytes before its first call's header block was whole"
            self._over_limit(self.c2u, PeerOverLimit(OPENING_BYTES, reason))
        elif self.split_backends and not self.routed:
            self._route_by_first_call()

    def _over_limit(self, d: _Direction, exc: PeerOverLimit) -> None:
        """The peer whose frames ``d`` reads went over a limit (wire.peer_limits): one log line
        and the metric, GOAWAY ENHANCE_YOUR_CALM to it, both connections closed (aborted after
        CLOSE_GRACE if they do not drain). What the read relayed before the frame that broke the
        limit goes out first; when the backend broke it, the client's calls in flight end with
        UNAVAILABLE naming the cause, then the client gets GOAWAY too and reconnects."""
        if self.closing:
            return
        from_client = d is self.c2u
        transport = self.client_transport if from_client else self.upstream_transport
        d.limits.report(exc, "client" if from_client else f"unix://{self.upstream_path}", peer_pid(transport))
        self.closing = True
        self.early = None
        self.claimed = False
        c2u, u2c = self.c2u, self.u2c
        c2u.feeding = u2c.feeding = False
        c2u.write_out()
        u2c.write_out()
        debug = str(exc).encode()[:200]
        if from_client:
            u2c.write(frames.goaway(self.last_client_stream, frames.ENHANCE_YOUR_CALM, debug))
            c2u.write(frames.goaway(0))
        else:
            c2u.write(frames.goaway(0, frames.ENHANCE_YOUR_CALM, debug))
            message = f"the runtime's HTTP/2 connection went over the proxy's limits and was closed: {exc}"
            for stream in list(self.streams.values()):
                self._end_by_relay(stream, grpc_framing.UNAVAILABLE, message)
            u2c.write(frames.goaway(self.last_client_stream))
        for side in (self.client_transport, self.upstream_transport):
            if side is not None:
                side.close()
                with contextlib.suppress(RuntimeError):  # no event loop: no socket to abort either
                    c2u.running_loop().call_later(CLOSE_GRACE, side.abort)
        self._drop_parked()

    def _route_by_first_call(self) -> None:
        assert self.early is not None
        path = first_call_path(b"".join(self.early))
        if path is None:
            return
        service = self.options.methods.lookup(path).service
        self.routed = True  # decided once, by the connection's first call
        self.upstream_path = self.options.backends.for_service(service)
        self.route_service_is_image = service == Backends.IMAGE_SERVICE
        self._keep(asyncio.get_running_loop().create_task(self._connect_upstream()))

    def _pass_preface(self, data: bytes) -> bytes:
        take = min(self.preface_left, len(data))
        self.c2u.write(data[:take])
        self.preface_left -= take
        return data[take:]

    def _feed(self, d: _Direction, data: bytes) -> None:
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

    def _client_settings(self, d: _Direction, flags: int, sid: int, data: bytes, start: int, end: int) -> bytes | None:
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

    def _ping_frame(self, d: _Direction, flags: int, sid: int, data: bytes, start: int, end: int) -> bytes | None:
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
        self, d: _Direction, flags: int, sid: int, data: bytes, start: int, end: int
    ) -> bytes | None:
        return b"" if sid in self.ended_by_relay else None

    def _client_data_frame(
        self, d: _Direction, flags: int, sid: int, data: bytes, start: int, end: int
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

    def _open_held(self, sid: int, method: MethodInfo, held: _HeldHeaders) -> HeldStream:
        seconds = held.timeout
        deadline = None if seconds is None else self.c2u.running_loop().time() + seconds
        call = CallContext(method, held.metadata, deadline, held.encoding)
        self.claimed = True
        stream = HeldStream(sid, method, time.perf_counter(), self.options.max_message_size, call)
        stream.up_window = self.up_initial_window
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

    def _client_reset(self, d: _Direction, flags: int, sid: int, data: bytes, start: int, end: int) -> bytes | None:
        d.limits.reset()
        stream = self.streams.get(sid)
        if stream is not None:
            if isinstance(stream, HeldStream) and stream.before_task is not None:
                stream.before_task.cancel()
            self._finish(stream, grpc_framing.CANCELLED, "cancelled by the client")
        return b"" if sid in self.ended_by_relay else None

    # -- intercepted requests --------------------------------------------------------------

    def _hold_request(self, stream: HeldStream, flags: int, data: bytes, start: int, end: int) -> bytes:
        length = end - start
        if stream.before_task is not None:
            # DATA after END_STREAM: forwarding it could hand the backend a request the hooks
            # never saw, so the call ends here.
            self.client_credit += length
            self._end_by_relay(stream, grpc_framing.INVALID_ARGUMENT, "DATA after the end of the request")
            return b""
        too_big = _oversized(stream, False, flags, data, start, end)
        if too_big is not None:
            self.client_credit += length
            self._end_by_relay(stream, grpc_framing.RESOURCE_EXHAUSTED, _too_large("request", too_big, stream))
            return b""
        lo, hi = frames.data_bounds(flags, data, start, end)
        if not self._hold(stream, hi - lo):
            self.client_credit += length
            return b""
        stream.held_request += data[lo:hi]
        if flags & frames.FLAG_END_STREAM:
            # The client waits for the answer now, not for credit: the backend's credit for
            # the request sent on pays for these bytes (see _send_request), or _finish does.
            stream.client_owed = length
            self._start_before(stream)
        elif length:
            # The client may still be waiting for credit to send the rest: now, both levels.
            self.client_credit += length
            self.u2c.inject(frames.window_update(stream.id, length))
        return b""

    def _hold(self, stream: HeldStream, size: int) -> bool:
        """Count ``size`` more held bytes against the budget, or refuse the call."""
        held = self.options.held
        if held.take(size):
            stream.held_bytes += size
            return True
        used, budget = held.used, held.budget
        log.warning("held-request budget exhausted; call refused", method=stream.method.path, held=used, budget=budget)
        self._end_by_relay(
            stream,
            grpc_framing.RESOURCE_EXHAUSTED,
            f"the proxy already holds {used} bytes of requests for its hooks, and this one would "
            f"exceed its budget of {budget} bytes (--held-request-budget); try again",
        )
        return False

    def _start_before(self, stream: HeldStream) -> None:
        task = self.c2u.running_loop().create_task(self._run_before(stream))
        stream.before_task = task
        self._keep(task)

    async def _run_before(self, stream: HeldStream) -> None:
        assert stream.call is not None
        try:
            request = self._held_message(stream)
            request = await self.options.interceptor.before(stream.call, request)
        except grpc_framing.BadRequest as bad:
            # The hooks could not see such a request, so it must not reach the runtime past them.
            log.warning("request refused", method=stream.method.path, reason=str(bad))
            self._refuse_open(stream, grpc_framing.INVALID_ARGUMENT, f"{stream.method.path}: {bad}")
            return
        except RejectCall as reject:
            self._refuse_open(stream, reject.code, reject.message)
            return
        except Exception as exc:
            # The interceptor applies the failure policies itself; an error escaping it (or
            # this code) is a bug in that very code, so nothing can say the call may pass
            # unhooked: refuse it.
            log.exception("interceptor failed; call refused", method=stream.method.path)
            self._refuse_open(stream, grpc_framing.INTERNAL, f"proxy hook layer failed: {type(exc).__name__}: {exc}")
            return
        if stream.id in self.streams:
            stream.request = request
            stream.after_due = True
            if trace.ON:
                trace.event("proxy.sent", call=stream.call.serial)
            self._send_request(stream, grpc_framing.encode_message(request))

    def _held_message(self, stream: HeldStream) -> bytes:
        """The held request's one message (BadRequest if it is not one). The held copy goes at
        once: large requests are budgeted, and the hooks must not hold two copies."""
        assert stream.call is not None
        received = bytes(stream.held_request)
        stream.held_request.clear()
        return grpc_framing.single_request(received, stream.call.encoding, self.options.max_message_size)

    def _refuse_open(self, stream: Stream, code: int, message: str) -> None:
        if stream.id in self.streams:  # not ended meanwhile (by the client, or the connection)
            self._refuse(stream, code, message)

    def _refuse(self, stream: Stream, code: int, message: str) -> None:
        """End a held call from its hook task (between reads): the status and the credit for
        the held bytes go to the client in one write."""
        u2c = self.u2c
        u2c.out = []
        try:
            self._end_by_relay(stream, code, message)
            self._flush_credit()
        finally:
            u2c.write_out()

    def _send_request(self, stream: HeldStream, body: bytes) -> None:
        stream.pending_out = body
        stream.sending = True
        self.sending_calls += 1
        # The backend credits ``body`` as it reads it; the client is owed what it sent.
        self._settle(stream.client_owed - len(body))
        stream.client_owed = 0
        if self.client_credit:  # sent on smaller: the relay's share can wait for the answer
            u2c = self.u2c
            u2c.out = []
            self._flush_credit()
            u2c.write_out(PARK_DELAY)
        self._send_pending(stream)

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

    def _upstream_reset(self, d: _Direction, flags: int, sid: int, data: bytes, start: int, end: int) -> bytes | None:
        d.limits.reset()
        stream = self.streams.get(sid)
        if stream is not None:
            code = _RST_CODES.get(int.from_bytes(data[start:end], "big"), grpc_framing.INTERNAL)
            self._finish(stream, code, "reset by the runtime")
        return b"" if sid in self.ended_by_relay else None

    def _upstream_settings_frame(
        self, d: _Direction, flags: int, sid: int, data: bytes, start: int, end: int
    ) -> bytes | None:
        d.limits.settings(end - start)
        if not flags & frames.FLAG_ACK:
            self._upstream_settings(frames.parse_settings(data[start:end]))
        return None

    def _upstream_data_frame(
        self, d: _Direction, flags: int, sid: int, data: bytes, start: int, end: int
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
        self, d: _Direction, flags: int, sid: int, data: bytes, start: int, end: int
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

    def _start_after(self, stream: HeldStream, code: int, message: str) -> None:
        assert stream.call is not None
        response = None
        if stream.response_body:
            messages = grpc_framing.split_messages(bytes(stream.response_body))
            if messages and not messages[0].compressed:
                response = messages[0].body
        outcome = CallOutcome(code=code, message=message, response=response)
        if trace.ON:
            trace.event("proxy.answered", call=stream.call.serial, code=code)
        coro = self.options.interceptor.after(stream.call, stream.request, outcome)
        task = self.c2u.running_loop().create_task(_guarded(coro, stream.method.path))
        self.options.after_tasks.add(task)
        task.add_done_callback(self.options.after_tasks.discard)

    # -- header blocks -----------------------------------------------------------------------

    def _headers_frame(self, d: _Direction, flags: int, sid: int, data: bytes, start: int, end: int) -> bytes | None:
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
        self, d: _Direction, flags: int, sid: int, data: bytes, start: int, end: int
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

    def _decode(self, d: _Direction, block: bytes) -> HeaderList:
        try:
            return d.decoder.decode(block)
        except hpack.HPACKError as exc:
            return self._undecodable(exc)

    def _undecodable(self, exc: hpack.HPACKError) -> HeaderList:
        # The peers' own decoders will fail on this too; the connection cannot go on.
        log.error("undecodable header block; closing connection", error=str(exc))
        asyncio.get_running_loop().call_soon(self.close)
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

    def _finish_held(self, stream: HeldStream, code: int, message: str) -> None:
        if stream.held_bytes:
            self.options.held.give_back(stream.held_bytes)
            stream.held_bytes = 0
        if stream.client_owed:  # held and never sent on: the relay pays for it
            self._settle(stream.client_owed)
            stream.client_owed = 0
        if stream.sending:
            # Never sent, so the backend will never credit these bytes back.
            self._settle(len(stream.pending_out))
            stream.pending_out = b""
            stream.sending = False
            self.sending_calls -= 1
        seconds = time.perf_counter() - stream.started
        self.options.observer(stream.method, code, message, seconds, stream.before_task is not None)
        if stream.after_due:
            stream.after_due = False
            self._start_after(stream, code, message)

    def _flush_credit(self) -> None:
        if self.client_credit:
            self.u2c.inject(frames.window_update(0, self.client_credit))
            self.client_credit = 0
        if self.upstream_credit:
            self.c2u.inject(frames.window_update(0, self.upstream_credit))
            self.upstream_credit = 0

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @property
    def active_calls(self) -> int:
        return len(self.streams)


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
    frames.DATA: RelayConnection._client_data_frame,
    frames.HEADERS: RelayConnection._headers_frame,
    frames.CONTINUATION: RelayConnection._continuation_frame,
    frames.RST_STREAM: RelayConnection._client_reset,
    frames.SETTINGS: RelayConnection._client_settings,
    frames.PING: RelayConnection._ping_frame,
}
_CLIENT_FRAMES = _table(_CLIENT_HANDLERS)
_CLIENT_FRAMES_AFTER_END = _table({**_CLIENT_HANDLERS, frames.WINDOW_UPDATE: RelayConnection._client_window_update})
_UPSTREAM_FRAMES = _table({
    frames.DATA: RelayConnection._upstream_data_frame,
    frames.HEADERS: RelayConnection._headers_frame,
    frames.CONTINUATION: RelayConnection._continuation_frame,
    frames.RST_STREAM: RelayConnection._upstream_reset,
    frames.SETTINGS: RelayConnection._upstream_settings_frame,
    frames.WINDOW_UPDATE: RelayConnection._upstream_window_update,
    frames.PING: RelayConnection._ping_frame,
})


def _is_ping_answer(high: int, low: int, ftype: int, flags: int, sid: int) -> bool:
    """A well-formed PING ACK: only the relay's own (peers' ACKs are dropped, malformed ones
    forwarded, and those must reach their receiver as they came, at once)."""
    return ftype == frames.PING and flags & frames.FLAG_ACK != 0 and not high and low == 8 and not sid


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


async def _guarded(coro: Any, method: str) -> None:
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("interceptor after-call failed", method=method)


class _BackendDown:
    """Answers a client's calls with UNAVAILABLE while the backend cannot be reached.

    It speaks just enough HTTP/2 to end each call with a status that names the cause, then
    closes with GOAWAY so the client's next call reconnects (and the relay tries the backend
    again) at once.
    """

    def __init__(self, conn: RelayConnection, reason: str) -> None:
        self.conn = conn
        self.reason = reason
        self.preface_left = len(frames.PREFACE)
        self.pending = b""
        self.answered: list[int] = []
        if not conn.own_settings_acks:  # in split mode the relay has sent SETTINGS already
            conn.u2c.write(frames.settings())

    def feed(self, data: bytes) -> None:
        take = min(self.preface_left, len(data))
        self.preface_left -= take
        data = self.pending + data[take:]
        pos = 0
        while len(data) - pos >= frames.HEADER_LEN:
            high, low, ftype, flags, sid = frames.FRAME_HEADER.unpack_from(data, pos)
            end = pos + frames.HEADER_LEN + ((high << 8) | low)
            if end > len(data):
                break
            self._frame(ftype, flags, sid & frames.MAX_STREAM_ID, data[pos + frames.HEADER_LEN : end])
            pos = end
        self.pending = data[pos:]
        if self.answered:
            # GOAWAY first, so the client opens no further call on this connection before
            # it sees the statuses; its next call reconnects and the backend is tried again.
            out = [frames.goaway(max(self.answered))]
            out += [
                status_frame(sid, grpc_framing.UNAVAILABLE, self.reason, trailers_only=True) for sid in self.answered
            ]
            self.conn.u2c.write(b"".join(out))
            self.conn.closing = True
            if self.conn.client_transport is not None:
                self.conn.client_transport.close()

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        out, limits = self.conn.u2c, self.conn.c2u.limits
        if ftype == frames.SETTINGS:
            limits.settings(len(payload))
            if not flags & frames.FLAG_ACK:
                out.write(frames.settings_ack())
        elif ftype == frames.PING:
            limits.ping()
            if not flags & frames.FLAG_ACK:
                out.write(frames.ping_ack(payload))
        elif ftype == frames.HEADERS and sid > self.conn.last_client_stream:
            self.conn.last_client_stream = sid
            self.answered.append(sid)
            self._observe(flags, payload)

    def _observe(self, flags: int, payload: bytes) -> None:
        """Count and log the call like any other: it failed, and the operator must see it."""
        block = bytes(frames.header_block_fragment(flags, payload))
        try:
            headers = self.conn.c2u.decoder.decode(block)
        except hpack.HPACKError:
            headers = HeaderList()
        path = next((value for name, value in headers if name == ":path"), "")
        method = self.conn.options.methods.lookup(path)
        self.conn.options.observer(method, grpc_framing.UNAVAILABLE, self.reason, 0.0, False)
