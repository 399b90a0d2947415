"""Our gRPC client and server hold their peers to the HTTP/2 limits (wire.peer_limits).

A hook server that floods PINGs or SETTINGS and never reads is cut off (GOAWAY
ENHANCE_YOUR_CALM, the connection closed, one log line, the metric) and the call on it fails
at once with UNAVAILABLE naming the limit, while calls to other servers go on; a client flooding
our server (runtime-hooks' endpoint) with any of the floods is cut off alike and the server's
other connections are served. Backpressure: past its high-water mark the write buffer stops the
reading and holds messages back; a server that reads nothing leaves its connection for a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
import urllib.request
from collections.abc import AsyncIterator, Coroutine
from typing import Any
from unittest import mock

import pytest
import uvloop
from h2_floods import (
    FLOODS,
    TIGHT_LIMITS,
    Flooder,
    continuation_flood,
    exceeded,
    flooding_server,
    goaway_codes,
    hostile_frames,
    limit_events,
    listening,
    parse,
    ping_flood,
    rss,
    settings_flood,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs
from test_grpc_client import both_loops

from runtimeproxy.common.listener import open_unix_listener
from runtimeproxy.wire import frames, grpc_client, grpc_framing, peer_limits
from runtimeproxy.wire.grpc_client import H2Channel, RpcError
from runtimeproxy.wire.grpc_framing import StatusCode
from runtimeproxy.wire.grpc_server import CallInfo, H2Server
from runtimeproxy.wire.h2_peer import header_frames
from runtimeproxy.wire.hpack_literal import encode_literal_block
from runtimeproxy.wire.peer_limit_metrics import start_metrics_server
from runtimeproxy.wire.peer_limits import (
    GRPC_CLIENT,
    GRPC_SERVER,
    LIMIT_NAMES,
    PEER_KINDS,
    Allowance,
    LimitSettings,
    PeerLimits,
    PeerOverLimit,
    Rate,
)

METHOD = "/test.Echo/Call"
LOOPS = ["asyncio", "uvloop"]
REQUEST_BLOCK = encode_literal_block([(":method", "POST"), (":path", METHOD), ("content-type", "application/grpc")])


async def echo(request: bytes, info: CallInfo) -> bytes:
    return request


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[str]:
    """Our server with an echo method, on a fresh socket."""
    with tempfile.TemporaryDirectory(prefix="h2f-") as tmp:
        listener = open_unix_listener(os.path.join(tmp, "s.sock"))
        server = H2Server({METHOD: echo}, max_message_size=1 << 20, name="test")
        await server.start(listener.sock)
        try:
            yield listener.path
        finally:
            await server.stop(0)
            listener.close()


def run_on(loop: str, test: Coroutine[Any, Any, None]) -> None:
    (uvloop.run if loop == "uvloop" else asyncio.run)(test)


# -- our server: a client that floods ---------------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("flood", list(FLOODS))
def test_a_client_flooding_our_server_is_cut_off_and_the_others_served(flood: str, loop: str) -> None:
    run_on(loop, client_flood(flood))


async def client_flood(flood: str) -> None:
    async with serving() as path:
        ours = H2Channel(path, max_message_size=1 << 20)
        try:
            assert await ours.unary(METHOD, b"before", 5) == b"before"
            before = exceeded(GRPC_CLIENT, FLOODS[flood].limit)
            flooder = await Flooder.connect(path)
            try:
                with capture_logs() as logs:
                    await flooder.flood(frames.PREFACE + frames.settings() + FLOODS[flood].make(1))
                    assert await ours.unary(METHOD, b"meanwhile", 5) == b"meanwhile"
                    received = await flooder.read_to_end()
            finally:
                flooder.close()
            assert goaway_codes(received)[-1:] == [frames.ENHANCE_YOUR_CALM]
            assert limit_events(logs) == [(GRPC_CLIENT, FLOODS[flood].limit)]
            assert exceeded(GRPC_CLIENT, FLOODS[flood].limit) == before + 1
            assert await ours.unary(METHOD, b"after", 5) == b"after"
        finally:
            await ours.close()


# -- our client: a hook server that floods ---------------------------------------------------------------


SERVER_FLOODS = {
    "PING": (ping_flood(200_000), "ping", "PING frames over"),
    "SETTINGS": (settings_flood(200_000), "settings", "SETTINGS frames over"),
    "CONTINUATION": (continuation_flood(1, 200_000), "continuations_per_block", "CONTINUATION frames in one header"),
}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("flood", list(SERVER_FLOODS))
def test_a_hook_server_flooding_without_reading_is_cut_off(flood: str, loop: str) -> None:
    """The call on the connection fails at once, naming the limit (its answer's header block,
    for the CONTINUATION flood, never ends)."""
    run_on(loop, server_flood(*SERVER_FLOODS[flood]))


async def server_flood(wire: bytes, limit: str, reason: str) -> None:
    before_rss = rss()
    with tempfile.TemporaryDirectory(prefix="h2f-") as tmp:
        path = os.path.join(tmp, "hook.sock")
        async with flooding_server(path, wire) as server, serving() as good_path:
            flooded = H2Channel(path, max_message_size=1 << 20)
            good = H2Channel(good_path, max_message_size=1 << 20)
            try:
                with capture_logs() as logs:
                    call = asyncio.ensure_future(flooded.unary(METHOD, b"hook request", 30))
                    answered = 0
                    while not call.done():  # other calls go on while the flood lasts
                        assert await good.unary(METHOD, b"other", 5) == b"other"
                        answered += 1
                    with pytest.raises(RpcError) as failed:
                        await call
                    await asyncio.wait_for(server.done.wait(), 10)
            finally:
                await flooded.close()
                await good.close()
    assert failed.value.code() == StatusCode.UNAVAILABLE  # cut off, not left to the call's deadline
    assert reason in failed.value.details()  # names the limit
    assert answered > 0
    assert limit_events(logs) == [(GRPC_SERVER, limit)]
    assert goaway_codes(server.received)[-1:] == [frames.ENHANCE_YOUR_CALM]
    assert rss() - before_rss < 64 << 20


# -- the token bucket -------------------------------------------------------------------------------


@settings(max_examples=300)
@given(
    rate=st.builds(Rate, st.integers(1, 20), st.floats(0.5, 50)),
    steps=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 30), st.integers(0, 3)), max_size=40),
)
def test_an_allowance_refuses_only_what_an_exact_bucket_refuses_and_stays_bounded(
    rate: Rate, steps: list[tuple[float, int, int]]
) -> None:
    """Lazily refilled (the clock read only when empty), it allows at least what a bucket
    refilled continuously allows, and over any time T at most burst + rate * T + what it earned."""
    now = [0.0]
    with mock.patch.object(peer_limits.time, "monotonic", lambda: now[0]):
        ours = Allowance(rate)
        exact, allowed, earned = float(rate.burst), 0, 0
        for elapsed, count, gains in steps:
            now[0] += elapsed
            ours.earned += gains
            earned += gains
            exact = min(float(rate.burst), exact + elapsed * rate.per_second + gains)
            for _ in range(count):
                if not ours.take():
                    assert exact < 1  # refused only when a continuous bucket refuses as well
                    return
                allowed += 1
                exact = max(exact - 1, 0.0)
                assert allowed <= rate.burst + rate.per_second * now[0] + earned + 1e-9


# -- the metric -------------------------------------------------------------------------------------


def test_every_metrics_endpoint_exports_the_peer_limit_counter() -> None:
    """Every peer kind and limit, at 0 until it happens; each cut-off counted once, whichever
    daemon serves the registry (the proxy's global one, runtime-hooks' own)."""
    registry = CollectorRegistry()
    first = start_metrics_server("127.0.0.1:0", registry)
    again = start_metrics_server("127.0.0.1:0", registry)  # a registry exports it once
    try:
        before = scrape(first.address)
        assert before[("cri_client", "opening_bytes")] == exceeded("cri_client", "opening_bytes")
        assert len(before) == len(PEER_KINDS) * len(LIMIT_NAMES)
        PeerLimits(GRPC_CLIENT).report(PeerOverLimit("ping", "a test's flood"), "test peer")
        after = scrape(again.address)
        assert after[(GRPC_CLIENT, "ping")] == before[(GRPC_CLIENT, "ping")] + 1
        assert {key: value for key, value in after.items() if key != (GRPC_CLIENT, "ping")} == {
            key: value for key, value in before.items() if key != (GRPC_CLIENT, "ping")
        }
    finally:
        first.close()
        again.close()


def scrape(address: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (sample.labels["peer"], sample.labels["limit"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "runtimeproxy_h2_peer_limit_exceeded_total"
    }


# -- backpressure --------------------------------------------------------------------------------------

SMALL = LimitSettings(write_buffer_high=1024, write_buffer_low=256, queued_answers=10)


class PausingTransport:
    """A transport whose peer reads nothing: past ``high`` buffered bytes it pauses its
    protocol's writing, as asyncio's do; ``drain`` is the peer reading everything."""

    def __init__(self, high: int) -> None:
        self.high = high
        self.written = bytearray()  # everything, drained or not
        self.buffered = bytearray()
        self.most = 0
        self.reading = True
        self.closed = False
        self.protocol: asyncio.Protocol | None = None
        self._paused = False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        assert high == self.high

    def write(self, data: bytes) -> None:
        self.written += data
        self.buffered += data
        self.most = max(self.most, len(self.buffered))
        if len(self.buffered) > self.high and not self._paused and self.protocol is not None:
            self._paused = True
            self.protocol.pause_writing()

    def drain(self) -> bytes:
        data, self.buffered = bytes(self.buffered), bytearray()
        if self._paused and self.protocol is not None:
            self._paused = False
            self.protocol.resume_writing()
        return data

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


def server_connection(transport: PausingTransport) -> Any:
    server = H2Server({METHOD: echo}, max_message_size=1 << 20, limits=SMALL)
    connection = server._connection()
    transport.protocol = connection
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection


def echo_request(stream_id: int, body: bytes) -> bytes:
    data = frames.frame(frames.DATA, frames.FLAG_END_STREAM, stream_id, grpc_framing.encode_message(body))
    return header_frames(stream_id, REQUEST_BLOCK, False, 16384) + data


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@both_loops
async def test_a_full_write_buffer_stops_the_reading_and_holds_answers_back() -> None:
    transport = PausingTransport(SMALL.write_buffer_high)
    connection = server_connection(transport)
    answer = grpc_framing.encode_message(b"r" * 2000)
    windows = frames.settings({frames.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 20}) + frames.window_update(0, 1 << 20)
    connection.data_received(frames.PREFACE + windows + echo_request(1, b"r" * 2000) + echo_request(3, b"r" * 2000))
    await settle()
    assert bytes(transport.buffered).count(answer) == 1  # the first answer filled the buffer
    assert not transport.reading  # no more reading from the peer
    transport.drain()  # the peer reads: the second answer goes out (and fills the buffer again)
    await settle()
    assert bytes(transport.buffered).count(answer) == 1
    transport.drain()
    assert transport.reading  # under the mark again: the reading goes on


def test_control_answers_to_a_peer_that_does_not_read_are_capped() -> None:
    async def run() -> None:
        transport = PausingTransport(SMALL.write_buffer_high)
        connection = server_connection(transport)
        with capture_logs() as logs:
            connection.data_received(frames.PREFACE + ping_flood(200))  # 200 answers of 17 bytes
        assert limit_events(logs) == [(GRPC_CLIENT, "queued_answers")]
        assert transport.closed
        assert goaway_codes(parse(bytes(transport.buffered)))[-1:] == [frames.ENHANCE_YOUR_CALM]
        assert transport.most <= SMALL.write_buffer_high + 17 * (SMALL.queued_answers + 1) + 200

    asyncio.run(run())


class SilentServer:
    """A server that accepts, announces large windows and never reads: the write buffer fills."""

    def __init__(self) -> None:
        self.connections: list[socket.socket] = []

    async def serve(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            self.connections.append(conn)
            await loop.sock_sendall(conn, frames.settings({frames.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 24})
                                    + frames.window_update(0, 1 << 24))


@both_loops
async def test_a_call_stuck_behind_a_server_that_reads_nothing_leaves_the_connection() -> None:
    """The call ends at its deadline; the next call opens a new connection instead of waiting
    behind the same full buffer."""
    with tempfile.TemporaryDirectory(prefix="h2f-") as tmp:
        path = os.path.join(tmp, "silent.sock")
        listener = listening(path)
        server = SilentServer()
        task = asyncio.get_running_loop().create_task(server.serve(listener))
        channel = H2Channel(path, max_message_size=4 << 20)
        try:
            with pytest.raises(RpcError) as first:
                await channel.unary(METHOD, b"x" * (2 << 20), 0.5)
            with pytest.raises(RpcError):
                await channel.unary(METHOD, b"small", 0.3)
        finally:
            await channel.close()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            for conn in server.connections:
                conn.close()
            listener.close()
    assert first.value.code() == StatusCode.DEADLINE_EXCEEDED
    assert len(server.connections) == 2


# -- hypothesis: a hostile peer ----------------------------------------------------------------------

PROBE = frames.frame(frames.PING, 0, 0, b"probe!!!")


def hostile_connection(side: str, transport: PausingTransport) -> Any:
    """Our server's connection (the peer a client) or our client's (the peer a server, with two
    calls open on it), with the tight limits."""
    if side == "server":
        connection = H2Server({METHOD: echo}, max_message_size=1 << 20, limits=TIGHT_LIMITS)._connection()
    else:
        connection = grpc_client._Connection("hostile server", 1 << 20, TIGHT_LIMITS)
    transport.protocol = connection
    connection.connection_made(transport)
    if side == "client":
        for _ in range(2):
            _, call = connection.open_stream()
            call.done.add_done_callback(lambda done: done.exception())  # retrieved: no warning
    return connection


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    side=st.sampled_from(["server", "client"]),
    sequence=st.lists(hostile_frames(REQUEST_BLOCK), max_size=15),
    cuts=st.lists(st.integers(0, 3000), max_size=8),
    reads=st.lists(st.booleans(), min_size=1, max_size=8),
)
def test_a_hostile_peer_never_breaks_a_connection_nor_makes_it_buffer(
    side: str, sequence: list[bytes], cuts: list[int], reads: list[bool]
) -> None:
    """Whatever frames a peer sends, cut into whatever reads, and whether it reads what it gets
    or not: no internal error; the write buffer holds at most its mark plus what one read
    produced (nothing is read while it is over); and the connection either still answers a PING
    or was closed after a GOAWAY."""

    async def run() -> None:
        transport = PausingTransport(TIGHT_LIMITS.write_buffer_high)
        connection = hostile_connection(side, transport)
        wire = (frames.PREFACE if side == "server" else b"") + b"".join(sequence)
        points = sorted({c for c in cuts if 0 < c < len(wire)})
        chunks = [wire[a:b] for a, b in zip([0, *points], [*points, len(wire)], strict=True)]
        largest = max((len(c) for c in chunks), default=0)
        delivered = 0
        with capture_logs() as logs:
            for i, chunk in enumerate(chunks):
                if not transport.reading:
                    if not reads[i % len(reads)]:
                        break  # the peer reads nothing: the rest stays in the socket
                    transport.drain()
                if transport.closed:
                    break
                connection.data_received(chunk)
                delivered += len(chunk)
                await asyncio.sleep(0)
            most = transport.most
            if not transport.closed:  # the peer reads at last: what stayed in the socket comes, then the probe
                transport.drain()
                connection.data_received(wire[delivered:] + PROBE)
        assert not [e for e in logs if e["event"] == "closing the HTTP/2 connection: internal error"], logs
        assert most <= TIGHT_LIMITS.write_buffer_high + 16 * largest + 512
        written = parse(bytes(transport.written))
        if transport.closed:
            assert written[-1][0] == frames.GOAWAY
        else:
            assert (frames.PING, frames.FLAG_ACK, 0, b"probe!!!") in written

    asyncio.run(run())
