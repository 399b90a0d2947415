"""Connection credit for held requests: the client's view of its window stays exact.

A claimed call's request is held while the hooks run. Frames before its last are credited to
the client at once (it may need the credit to send the rest); the last one is credited by the
backend's own credit for the request sent on, which passes through to the client as for any
call, evened out by the relay when the hooks changed the request's size; a call that ends
before its request was sent on is credited by the relay itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from relay_pair import VERSION, CountingTransport, Pair, message

from runtimeproxy.relay import connection
from runtimeproxy.relay.call_interceptor import CallContext, CallOutcome, RejectCall
from runtimeproxy.relay.methods import MethodInfo
from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import encode_message

WINDOW = frames.DEFAULT_WINDOW


class Rewriter:
    """Claims Version calls; the first byte of each request names its plan: a size change, or
    None to refuse the call."""

    def __init__(self, plans: list[int | None]) -> None:
        self.plans = plans

    def intercepts(self, method: MethodInfo) -> bool:
        return method.path == VERSION

    async def before(self, call: CallContext, request: bytes) -> bytes:
        change = self.plans[request[0]]
        if change is None:
            raise RejectCall(grpc_framing.UNAVAILABLE, "refused")
        return request[:1] * max(1, len(request) + change)

    async def after(self, call: CallContext, request: bytes, outcome: CallOutcome) -> None:
        return None


def parse(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame in ``data`` (whole frames only)."""
    out, pos = [], 0
    while pos < len(data):
        high, low, ftype, flags, sid = frames.FRAME_HEADER.unpack_from(data, pos)
        end = pos + frames.HEADER_LEN + ((high << 8) | low)
        out.append((ftype, flags, sid & frames.MAX_STREAM_ID, data[pos + frames.HEADER_LEN : end]))
        pos = end
    return out


def new_frames(transport: CountingTransport, seen: list[int]) -> list[tuple[int, int, int, bytes]]:
    data = transport.data
    fresh, seen[0] = data[seen[0] :], len(data)
    return parse(fresh)


@dataclass
class Call:
    sid: int
    body: bytes  # the gRPC message (5-byte prefix included) still to send
    sent: int = 0
    window: int = WINDOW  # the client's view of this stream's send window
    ended: bool = False  # the client saw its end (status) or cancelled it
    last_frame: int = 0  # the length of the DATA frame that ended the request, once sent


@dataclass
class Peers:
    """The client and the backend of a relayed connection, as flow control sees them."""

    pair: Pair
    calls: list[Call]
    client_window: int = WINDOW  # the client's view of the connection window towards the backend
    client_sent: int = 0  # DATA bytes the client sent (flow-controlled length)
    client_credited: int = 0  # connection credit the client received
    backend_window: int = WINDOW  # the backend's receive window, as it announced it
    backend_unacked: int = 0  # bytes the backend received and has not credited yet
    stream_unacked: dict[int, int] = field(default_factory=dict)
    complete: list[int] = field(default_factory=list)  # streams whose request the backend has whole
    reset: set[int] = field(default_factory=set)
    opened: set[int] = field(default_factory=set)  # calls whose HEADERS the client sent
    seen_client: list[int] = field(default_factory=lambda: [0])
    seen_backend: list[int] = field(default_factory=lambda: [0])
    encoder: hpack.Encoder = field(default_factory=hpack.Encoder)

    def client_sends(self) -> None:
        """Send what the client's windows allow: HEADERS once, then DATA frames."""
        for call in self.calls:
            if call.ended or call.sent == len(call.body):
                continue
            out = b"" if call.sid in self.opened else self.pair.headers(call.sid)
            self.opened.add(call.sid)
            while call.sent < len(call.body):
                size = min(len(call.body) - call.sent, self.client_window, call.window, frames.DEFAULT_MAX_FRAME)
                if size <= 0:
                    break
                last = call.sent + size == len(call.body)
                chunk = call.body[call.sent : call.sent + size]
                out += frames.frame(frames.DATA, frames.FLAG_END_STREAM if last else 0, call.sid, chunk)
                call.sent += size
                call.last_frame = size if last else 0
                call.window -= size
                self.client_window -= size
                self.client_sent += size
            if out:
                self.pair.conn.client_data(out)
            self.client_reads()
            self.backend_reads()

    def client_reads(self) -> None:
        self.pair.conn.u2c.flush_parked()  # what its timer does, at most PARK_DELAY later
        by_sid = {call.sid: call for call in self.calls}
        for ftype, flags, sid, payload in new_frames(self.pair.client, self.seen_client):
            if ftype == frames.WINDOW_UPDATE:
                increment = int.from_bytes(payload, "big")
                if sid == 0:
                    self.client_window += increment
                    self.client_credited += increment
                elif sid in by_sid:
                    by_sid[sid].window += increment
            elif ftype == frames.HEADERS and flags & frames.FLAG_END_STREAM and sid in by_sid:
                by_sid[sid].ended = True

    def backend_reads(self) -> None:
        self.pair.conn.c2u.flush_parked()
        for ftype, flags, sid, payload in new_frames(self.pair.backend, self.seen_backend):
            if ftype == frames.DATA:
                self.backend_window -= len(payload)
                assert self.backend_window >= 0, "the relay overran the backend's connection window"
                self.backend_unacked += len(payload)
                self.stream_unacked[sid] = self.stream_unacked.get(sid, 0) + len(payload)
                if flags & frames.FLAG_END_STREAM:
                    self.complete.append(sid)
            elif ftype == frames.RST_STREAM:
                self.reset.add(sid)

    def backend_credits(self) -> None:
        """The backend credits every byte it received, both levels (streams it still serves)."""
        out = frames.window_update(0, self.backend_unacked) if self.backend_unacked else b""
        self.backend_window += self.backend_unacked
        self.backend_unacked = 0
        for sid, count in self.stream_unacked.items():
            if count and sid not in self.reset:
                out += frames.window_update(sid, count)
        self.stream_unacked.clear()
        if out:
            self.pair.conn.upstream_data(out)
        self.client_reads()

    def backend_answers(self) -> None:
        out = b""
        for sid in self.complete:
            if sid in self.reset:
                continue
            head = self.encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
            trailers = self.encoder.encode([("grpc-status", "0")])
            out += frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, head) + message(sid, b"ok", False)
            out += frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS | frames.FLAG_END_STREAM, sid, trailers)
        self.complete.clear()
        if out:
            self.pair.conn.upstream_data(out)
        self.client_reads()

    def client_cancels(self, index: int) -> None:
        call = self.calls[index % len(self.calls)]
        if call.ended or call.sid not in self.opened:
            return
        call.ended = True
        self.pair.conn.client_data(frames.rst_stream(call.sid, frames.CANCEL))
        self.client_reads()
        self.backend_reads()

    def check(self, plans: list[int | None]) -> None:
        """Never more credit than bytes sent; and the client's view of the connection window is
        never larger than the backend's own but by what the relay sends beyond a request's last
        frame (frames before the last are credited at once; a request the hooks made larger
        takes more): the remaining known limit (see the connection module's doc)."""
        assert self.client_credited <= self.client_sent
        beyond = 0
        for index, call in enumerate(self.calls):
            change = plans[index]
            if call.last_frame and change is not None:
                sent_on = len(encode_message(b"x" * max(1, len(call.body) - 5 + change)))
                beyond += max(0, sent_on - call.last_frame)
        assert self.client_window <= self.backend_window + beyond


async def turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


CALLS = st.lists(
    st.tuples(
        st.sampled_from([1, 10, 300, 16_000, 70_000, 140_000]) | st.integers(1, 3000),
        st.none() | st.sampled_from([0, 0, 1, 40, 2000, 80_000, -1, -7, -2000, -100_000]),
    ),
    min_size=1,
    max_size=5,
)
STEPS = st.lists(
    st.sampled_from(["send", "turn", "credit", "answer"]) | st.tuples(st.just("cancel"), st.integers(0, 4)),
    max_size=25,
)


async def play(calls: list[tuple[int, int | None]], steps: list[str | tuple[str, int]], lose: bool) -> None:
    plans = [change for _size, change in calls]
    pair = Pair(interceptor=Rewriter(plans))
    peers = Peers(pair, [Call(1 + 2 * i, encode_message(bytes([i]) * size)) for i, (size, _c) in enumerate(calls)])
    for step in steps:
        if step == "send":
            peers.client_sends()
        elif step == "turn":
            await turns()
            peers.client_reads()
            peers.backend_reads()
        elif step == "credit":
            peers.backend_credits()
        elif step == "answer":
            peers.backend_answers()
        elif isinstance(step, tuple):
            peers.client_cancels(step[1])
        peers.check(plans)
    if lose:  # the backend goes: every open call ends, nothing is written after the GOAWAY
        pair.backend.closed = True
        pair.conn.side_lost(False, None)
        await turns()
        peers.client_reads()
        assert parse(pair.client.data)[-1][0] == frames.GOAWAY
        assert pair.conn.streams == {}
        return
    for _ in range(200):  # everything settles: no call may be stuck (no deadlock)
        if all(call.ended for call in peers.calls) and not peers.backend_unacked:
            break
        peers.client_sends()
        await turns()
        peers.client_reads()
        peers.backend_reads()
        peers.backend_answers()
        peers.backend_credits()
        peers.check(plans)
    assert all(call.ended for call in peers.calls), "a call is stuck"
    pair.conn.u2c.flush_parked()
    peers.client_reads()
    # As without the relay: once the backend credited all it received, the client's view of
    # its connection window is whole again, and the relay owes and absorbs nothing.
    assert peers.client_credited == peers.client_sent
    assert peers.client_window == WINDOW
    assert pair.conn.client_credit_debt == 0 and pair.conn.client_credit == 0
    assert pair.conn.options.held.used == 0


@settings(max_examples=150, deadline=None)
@given(calls=CALLS, steps=STEPS, lose=st.booleans())
def test_the_clients_connection_window_stays_exact(
    calls: list[tuple[int, int | None]], steps: list[str | tuple[str, int]], lose: bool
) -> None:
    asyncio.run(play(calls, steps, lose))


# -- single cases -------------------------------------------------------------------------------


@pytest.fixture
def long_park(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "PARK_DELAY", 3600.0)
    monkeypatch.setattr(connection, "BDP_ANSWER_DELAY", 3600.0)


@pytest.mark.usefixtures("long_park")
async def test_a_request_sent_on_smaller_is_credited_the_difference_with_the_answer() -> None:
    pair = Pair(interceptor=Rewriter([-3]))
    body = bytes([0]) * 10
    pair.conn.client_data(pair.request(1, body))
    await turns()
    assert pair.backend.data.endswith(message(1, bytes([0]) * 7))
    assert pair.client.writes == []  # the relay's share (3 bytes) waits for the next write
    pair.conn.upstream_data(frames.window_update(0, len(encode_message(bytes([0]) * 7))))
    assert parse(pair.client.data) == [
        (frames.WINDOW_UPDATE, 0, 0, (3).to_bytes(4, "big")),
        (frames.WINDOW_UPDATE, 0, 0, (12).to_bytes(4, "big")),
    ]


@pytest.mark.usefixtures("long_park")
async def test_a_call_cancelled_while_its_hooks_run_is_credited_by_the_relay() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    class Slow(Rewriter):
        async def before(self, call: CallContext, request: bytes) -> bytes:
            await gate
            return request

    pair = Pair(interceptor=Slow([0]))
    pair.conn.client_data(pair.request(1, b"\x00" * 20))
    await turns()
    assert pair.client.writes == []
    pair.conn.client_data(frames.rst_stream(1, frames.CANCEL))
    pair.conn.u2c.flush_parked()
    assert pair.client.data == frames.window_update(0, len(encode_message(b"\x00" * 20)))
    assert pair.observed == [(VERSION, grpc_framing.CANCELLED)]


@pytest.mark.usefixtures("long_park")
async def test_frames_before_the_last_are_credited_at_once_both_levels() -> None:
    """The client may need that credit to send the rest of a large request."""
    pair = Pair(interceptor=Rewriter([0]))
    body = encode_message(b"\x00" * 100)
    first = frames.frame(frames.DATA, 0, 1, body[:60])
    pair.conn.client_data(pair.headers(1) + first)
    pair.conn.u2c.flush_parked()
    assert pair.client.data == frames.window_update(1, 60) + frames.window_update(0, 60)
    pair.conn.client_data(frames.frame(frames.DATA, frames.FLAG_END_STREAM, 1, body[60:]))
    pair.conn.u2c.flush_parked()
    assert pair.client.data == frames.window_update(1, 60) + frames.window_update(0, 60)  # nothing more
