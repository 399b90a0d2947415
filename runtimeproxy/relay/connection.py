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

This module is the asyncio side of a relayed connection: the protocols and transports, reading
paused and resumed, the writes collected per read, parked frames and their timers, connecting
to the backend, limits and shutdown. What the frames mean is frame_machine.py's (the state
machine, with no I/O); what happens to a claimed call, held_calls.py's. ``RelayConnection``
derives from both rather than calling them: every frame costs one handler call, no more.

May import the standard library, asyncio, hpack, structlog, runtimeproxy.wire and the other
relay modules.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import hpack
import structlog

from runtimeproxy.relay.frame_machine import (
    _CLIENT_FRAMES,
    _UPSTREAM_FRAMES,
    MAX_HEADER_LIST,
    BlockHandler,
    FrameDirection,
    FrameTable,
    first_call_path,
)
from runtimeproxy.relay.held_calls import HeldCalls
from runtimeproxy.relay.options import Backends, RelayOptions
from runtimeproxy.relay.streams import HeldStream
from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import status_frame
from runtimeproxy.wire.hpack_cache import HeaderList
from runtimeproxy.wire.peer_limits import (
    CLOSE_GRACE,
    CRI_CLIENT,
    OPENING_BYTES,
    RUNTIME,
    PeerLimits,
    PeerOverLimit,
    peer_pid,
)

__all__ = [
    "Backends",
    "RelayConnection",
    "RelayOptions",
    "first_call_path",
]

log = structlog.get_logger("runtimeproxy.relay")

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


class _Direction(FrameDirection):
    """One direction's writer towards its receiver: the transport, parked frames and their timers."""

    __slots__ = ("due", "late", "late_timer", "loop", "parked", "timer", "transport")

    def __init__(self, handlers: FrameTable, on_block: BlockHandler, limits: PeerLimits) -> None:
        super().__init__(handlers, on_block, limits)
        self.transport: asyncio.Transport | None = None
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


class RelayConnection(HeldCalls):
    """The pair of connections for one client, and every call on it."""

    c2u: _Direction
    u2c: _Direction

    def __init__(self, options: RelayOptions, on_closed: Callable[[RelayConnection], None]) -> None:
        super().__init__(options)
        self.on_closed = on_closed
        # client -> upstream, written to the upstream socket; upstream -> client likewise.
        limits = options.peer_limits
        self.c2u = _Direction(_CLIENT_FRAMES, RelayConnection._client_headers, PeerLimits(CRI_CLIENT, limits))
        self.u2c = _Direction(_UPSTREAM_FRAMES, RelayConnection._upstream_headers, PeerLimits(RUNTIME, limits))
        self.client_transport: asyncio.Transport | None = None
        self.upstream_transport: asyncio.Transport | None = None
        # Client bytes that came before the backend connection was settled.
        self.early: list[bytes] | None = []
        self.early_size = 0
        self.full_buffers = 0  # write buffers over their high-water mark: 1 towards the client, 2 the backend
        self.degraded: _BackendDown | None = None
        self.routed = False  # with two backends: whether the first call has chosen one

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

    # -- what the state machine and the held calls take from the I/O side ---------------------

    def _loop(self) -> asyncio.AbstractEventLoop:
        return self.c2u.running_loop()

    def _flush_credit_parked(self) -> None:
        u2c = self.u2c
        u2c.out = []
        self._flush_credit()
        u2c.write_out(PARK_DELAY)

    def _close_soon(self) -> None:
        asyncio.get_running_loop().call_soon(self.close)


def _is_ping_answer(high: int, low: int, ftype: int, flags: int, sid: int) -> bool:
    """A well-formed PING ACK: only the relay's own (peers' ACKs are dropped, malformed ones
    forwarded, and those must reach their receiver as they came, at once)."""
    return ftype == frames.PING and flags & frames.FLAG_ACK != 0 and not high and low == 8 and not sid


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
