"""The relay holds both of its peers to the HTTP/2 limits (wire.peer_limits).

A client flooding PINGs, SETTINGS, resets, empty or CONTINUATION frames gets GOAWAY
ENHANCE_YOUR_CALM and only its connection (and the backend connection paired with it) is
closed, with one log line and the metric; a backend doing the same ends the client's calls in
flight with UNAVAILABLE naming the cause, then the client gets GOAWAY and reconnects. While the
write buffer towards either peer is over its mark the relay reads from neither, so a peer that
does not read cannot make it buffer answers. Ordinary traffic, a ping after every read of
data included, never trips a limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import grpc
import hpack
import pytest
from fake_runtime import ProxyUnderTest, proxy_before_fake_runtime, short_tempdir, sock
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
    parse,
    ping_flood,
    request_block,
    rss,
    settings_entries_flood,
    settings_flood,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from relay_pair import VERSION, CountingTransport, Pair, message
from structlog.testing import capture_logs

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.api.runtime.v1 import api_pb2_grpc as pb_grpc
from runtimeproxy.relay.call_interceptor import PassThrough
from runtimeproxy.relay.connection import Backends, RelayConnection, RelayOptions, _Side
from runtimeproxy.relay.methods import MethodTable
from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.peer_limits import CRI_CLIENT, DEFAULT_LIMITS, RUNTIME

BDP_PING = bytes.fromhex("02 04 10 10 09 0e 07 07")


def ping(payload: bytes = BDP_PING) -> bytes:
    return frames.frame(frames.PING, 0, 0, payload)


def in_reads(data: bytes, size: int = 256 * 1024) -> Iterator[bytes]:
    """``data`` cut as a socket read would cut it."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


# -- the relay's client side ---------------------------------------------------------------------


@pytest.mark.parametrize("flood", list(FLOODS))
def test_a_client_over_a_limit_gets_goaway_and_its_connection_closes(flood: str) -> None:
    pair = Pair()
    limit = FLOODS[flood].limit
    before = exceeded(CRI_CLIENT, limit)
    with capture_logs() as logs:
        for read in in_reads(FLOODS[flood].make(1)):
            if pair.client.closed:
                break  # a closed transport delivers no more reads
            pair.conn.client_data(read)
    assert goaway_codes(parse(pair.client.data))[-1:] == [frames.ENHANCE_YOUR_CALM]
    assert pair.client.closed and pair.backend.closed
    assert limit_events(logs) == [(CRI_CLIENT, limit)]
    assert exceeded(CRI_CLIENT, limit) == before + 1


def test_a_client_header_block_over_the_size_allowed_is_cut_off() -> None:
    """The relay decodes header lists up to 1 MiB; a block longer than that, in CONTINUATION
    frames each within the per-block count (frames over 16 KiB, as a peer's SETTINGS may allow),
    is refused before it is whole."""
    pair = Pair()
    chunk = frames.frame(frames.CONTINUATION, 0, 1, b"\x00" * 60_000)
    flood = frames.frame(frames.HEADERS, 0, 1, request_block()) + chunk * 20
    with capture_logs() as logs:
        pair.conn.client_data(flood)
    assert limit_events(logs) == [(CRI_CLIENT, "header_block")]
    assert pair.client.closed


def test_what_came_before_the_frame_over_the_limit_is_relayed() -> None:
    pair = Pair()
    call = pair.request(1)
    pair.conn.client_data(call + settings_entries_flood())
    assert pair.backend.data.startswith(call)
    assert frames.frame(frames.SETTINGS, 0, 0, b"") not in pair.backend.data  # the flood itself is not
    assert goaway_codes(parse(pair.backend.data)) == [frames.NO_ERROR]


def test_the_client_flooding_before_its_first_call_is_routed_is_cut_off() -> None:
    """With two backends the relay keeps a client's bytes until its first call's header block
    is whole: a client that sends something else forever is cut off past a bounded amount."""
    pair = Pair()
    pair.conn.early, pair.conn.split_backends = [], True
    with capture_logs() as logs:
        for read in in_reads(frames.PREFACE + ping_flood(120_000)):
            if pair.client.closed:
                break
            pair.conn.client_data(read)
    assert limit_events(logs) == [(CRI_CLIENT, "opening_bytes")]
    assert pair.client.closed and pair.conn.early is None


# -- the relay's backend side --------------------------------------------------------------------

BACKEND_FLOODS = {
    "PING": (ping_flood(), "ping"),
    "SETTINGS": (settings_flood(), "settings"),
    "SETTINGS entries": (settings_entries_flood(), "settings_entries"),
    "RST_STREAM": (frames.rst_stream(3, frames.CANCEL) * 3000, "rst_stream"),
    "empty DATA": (frames.frame(frames.DATA, 0, 1, b"") * 3000, "empty_frames"),
}


def trailers(client_bytes: bytes, stream_id: int) -> dict[str, str]:
    """The fields of the last header block the client got on ``stream_id`` (HPACK literals only)."""
    blocks = [p for t, _, sid, p in parse(client_bytes) if t == frames.HEADERS and sid == stream_id]
    assert blocks, parse(client_bytes)
    return dict(hpack.Decoder().decode(blocks[-1]))


@pytest.mark.parametrize("flood", list(BACKEND_FLOODS))
def test_a_backend_over_a_limit_ends_the_calls_with_unavailable(flood: str) -> None:
    pair = Pair()
    wire, limit = BACKEND_FLOODS[flood]
    pair.conn.client_data(pair.request(1))
    before = exceeded(RUNTIME, limit)
    with capture_logs() as logs:
        pair.conn.upstream_data(wire)
    fields = trailers(pair.client.data, 1)
    assert fields["grpc-status"] == str(grpc_framing.UNAVAILABLE)
    assert "over the proxy's limits" in grpc_framing.decode_grpc_message(fields["grpc-message"])
    assert goaway_codes(parse(pair.client.data)) == [frames.NO_ERROR]  # the client did nothing wrong
    assert goaway_codes(parse(pair.backend.data))[-1:] == [frames.ENHANCE_YOUR_CALM]
    assert pair.client.closed and pair.backend.closed
    assert pair.observed == [(VERSION, grpc_framing.UNAVAILABLE)]
    assert limit_events(logs) == [(RUNTIME, limit)]
    assert exceeded(RUNTIME, limit) == before + 1


def test_a_backend_continuation_flood_closes_the_client_connection_too() -> None:
    """The flood's HEADERS went on to the client, so no status can follow it there: the client
    gets GOAWAY and the close, and fails the call itself."""
    pair = Pair()
    pair.conn.client_data(pair.request(1))
    with capture_logs() as logs:
        pair.conn.upstream_data(continuation_flood(1, 1000))
    assert limit_events(logs) == [(RUNTIME, "continuations_per_block")]
    assert pair.client.closed and pair.backend.closed
    assert frames.GOAWAY in [t for t, _, _, _ in parse(pair.client.data)]
    assert pair.observed == [(VERSION, grpc_framing.UNAVAILABLE)]


# -- ordinary traffic --------------------------------------------------------------------------------


def test_thousands_of_calls_with_a_ping_after_each_read_never_trip_a_limit() -> None:
    """grpc-go pings on data it reads while none of its pings is unanswered: a busy client that
    gets each answer at once may ping with every request, a backend with every response."""
    pair = Pair()
    encoder = hpack.Encoder()
    response_headers = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
    ok = encoder.encode([("grpc-status", "0")])
    with capture_logs() as logs:
        pair.conn.client_data(frames.settings({frames.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 20}))
        pair.conn.upstream_data(frames.settings({frames.SETTINGS_MAX_FRAME_SIZE: 16384}) + frames.settings_ack())
        for sid in range(1, 2 * 5000, 2):
            pair.conn.client_data(pair.request(sid) + ping())
            pair.conn.upstream_data(
                frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, response_headers)
                + message(sid, b"v1", end_stream=False)
                + frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS | frames.FLAG_END_STREAM, sid, ok)
                + ping(b"keepaliv")
            )
    assert not limit_events(logs)
    assert not pair.client.closed and not pair.backend.closed
    assert len(pair.observed) == 5000


def test_a_large_response_with_a_ping_after_every_read_is_no_flood() -> None:
    pair = Pair(max_message_size=32 << 20)
    pair.conn.client_data(pair.request(1))
    body = grpc_framing.encode_message(b"x" * (16 << 20))
    encoder = hpack.Encoder()
    pair.conn.upstream_data(frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, 1, encoder.encode(
        [(":status", "200"), ("content-type", "application/grpc")])))
    with capture_logs() as logs:
        for data in frames.data_frames(1, body, 16384, False):
            pair.conn.upstream_data(data)  # one backend read: one DATA frame
            pair.conn.client_data(ping())  # the client's BDP ping after each read of it
    assert not limit_events(logs)
    assert not pair.client.closed


# -- backpressure ----------------------------------------------------------------------------------


class PausableTransport(CountingTransport):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def pausable_pair() -> tuple[Pair, PausableTransport, PausableTransport]:
    pair = Pair()
    client, backend = PausableTransport(), PausableTransport()
    pair.conn.client_transport = pair.conn.u2c.transport = client  # type: ignore[assignment]
    pair.conn.upstream_transport = pair.conn.c2u.transport = backend  # type: ignore[assignment]
    return pair, client, backend


@pytest.mark.parametrize("towards_client", [True, False])
def test_a_full_write_buffer_either_way_stops_the_reading_from_both_peers(towards_client: bool) -> None:
    pair, client, backend = pausable_pair()
    side = pair.conn.client_protocol() if towards_client else _backend_protocol(pair)
    side.pause_writing()  # type: ignore[attr-defined]
    assert not client.reading and not backend.reading
    side.resume_writing()  # type: ignore[attr-defined]
    assert client.reading and backend.reading


def test_reading_resumes_only_once_both_buffers_drained() -> None:
    pair, client, backend = pausable_pair()
    pair.conn.writes_paused(towards_client=True, paused=True)
    pair.conn.writes_paused(towards_client=False, paused=True)
    pair.conn.writes_paused(towards_client=True, paused=False)
    assert not client.reading and not backend.reading
    pair.conn.writes_paused(towards_client=False, paused=False)
    assert client.reading and backend.reading


def _backend_protocol(pair: Pair) -> asyncio.Protocol:
    return _Side(pair.conn, is_client=False)


# -- over real sockets -----------------------------------------------------------------------------


@pytest.fixture
async def proxy() -> AsyncIterator[ProxyUnderTest]:
    async with proxy_before_fake_runtime() as under_test:
        yield under_test


async def version_calls(stub: pb_grpc.RuntimeServiceStub, stop: asyncio.Event) -> int:
    """Version calls one after another until ``stop``; how many were answered."""
    answered = 0
    while not stop.is_set():
        await stub.Version(pb.VersionRequest(), timeout=5)
        answered += 1
    return answered


@pytest.mark.parametrize("flood", ["PING", "SETTINGS", "CONTINUATION in one block", "rapid reset"])
async def test_a_client_flooding_without_reading_is_cut_off_while_others_are_served(
    proxy: ProxyUnderTest, flood: str
) -> None:
    stub = pb_grpc.RuntimeServiceStub(proxy.channel())
    await stub.Version(pb.VersionRequest(), timeout=5)
    stop = asyncio.Event()
    others = asyncio.create_task(version_calls(stub, stop))
    flooder = await Flooder.connect(proxy.path)
    before = rss()
    try:
        with capture_logs() as logs:
            await flooder.flood(frames.PREFACE + frames.settings() + FLOODS[flood].make(1))
            received = await flooder.read_to_end()
        grown = rss() - before
        stop.set()
        answered = await others
    finally:
        flooder.close()
        stop.set()
    assert goaway_codes(received)[-1:] == [frames.ENHANCE_YOUR_CALM]
    assert limit_events(logs) == [(CRI_CLIENT, FLOODS[flood].limit)]
    assert answered > 0  # the other client's calls went on during the flood
    assert grown < 64 << 20, f"the proxy grew {grown >> 20} MiB during the flood"


async def test_empty_continuations_end_the_connection_and_the_call_fast(proxy: ProxyUnderTest) -> None:
    """CVE-2024-27316: a header block that never ends is cut off after the per-block count,
    not at the call's deadline; the relay is free for other calls at once."""
    flooder = await Flooder.connect(proxy.path)
    try:
        await flooder.flood(frames.PREFACE + frames.settings() + continuation_flood(1, 200_000))
        received = await flooder.read_to_end()
    finally:
        flooder.close()
    assert goaway_codes(received)[-1:] == [frames.ENHANCE_YOUR_CALM]
    assert len(flooder.received) < 1 << 20  # cut off long before the flood was all sent
    stub = pb_grpc.RuntimeServiceStub(proxy.channel())
    assert (await stub.Version(pb.VersionRequest(), timeout=5)).runtime_name


async def test_a_client_that_does_not_read_has_its_reading_paused_and_resumed(proxy: ProxyUnderTest) -> None:
    """Backpressure without any limit broken: a client asks for 4 MB of answers (windows opened
    that far) and reads nothing. The relay stops reading from it (and from its backend
    connection) once the write buffer is full, holds no more than its mark and one read, serves
    other clients meanwhile, and goes on once the client reads: every answer arrives whole."""
    status = "/runtime.v1.RuntimeService/ContainerStatus"
    request = grpc_framing.encode_message(pb.ContainerStatusRequest(container_id="size:200000").SerializeToString())
    calls = range(1, 41, 2)
    wire = frames.PREFACE + frames.settings({frames.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 24})
    wire += frames.window_update(0, (1 << 24) - frames.DEFAULT_WINDOW)
    for sid in calls:
        wire += frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, request_block(status))
        wire += frames.frame(frames.DATA, frames.FLAG_END_STREAM, sid, request)
    stub = pb_grpc.RuntimeServiceStub(proxy.channel())
    await stub.Version(pb.VersionRequest(), timeout=5)
    assert proxy.server is not None
    known = set(proxy.server.connections)
    flooder = await Flooder.connect(proxy.path)
    try:
        await flooder.flood(wire)
        conn = await _new_connection(proxy, known)
        buffered, paused = 0, False
        stop = asyncio.Event()
        others = asyncio.create_task(version_calls(stub, stop))
        for _ in range(100):  # one second
            await asyncio.sleep(0.01)
            assert conn.client_transport is not None
            buffered = max(buffered, conn.client_transport.get_write_buffer_size())
            paused = paused or (conn.full_buffers != 0 and not conn.client_transport.is_reading())
        stop.set()
        answered = await others
        received = await _read_until_ended(flooder, len(calls))
    finally:
        flooder.close()
    assert paused
    limits = DEFAULT_LIMITS
    assert buffered <= limits.write_buffer_high + 256 * 1024 + 64 * 1024, buffered
    assert answered > 10
    ended = [sid for t, f, sid, _ in received if t == frames.HEADERS and f & frames.FLAG_END_STREAM]
    assert sorted(ended) == list(calls)


async def _new_connection(proxy: ProxyUnderTest, known: set[RelayConnection]) -> RelayConnection:
    assert proxy.server is not None
    async with asyncio.timeout(5):
        while not (new := set(proxy.server.connections) - known):
            await asyncio.sleep(0.01)
    return new.pop()


async def _read_until_ended(flooder: Flooder, calls: int) -> list[tuple[int, int, int, bytes]]:
    """Read (without closing) until ``calls`` responses have ended."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(10):
        while True:
            received = parse(bytes(flooder.received))
            if sum(1 for t, f, _, _ in received if t == frames.HEADERS and f & frames.FLAG_END_STREAM) >= calls:
                return received
            flooder.received += await loop.sock_recv(flooder.sock, 65536)


# -- a backend that floods ---------------------------------------------------------------------------


@pytest.mark.parametrize("flood", ["PING", "SETTINGS"])
async def test_a_backend_flooding_without_reading_fails_the_call_with_unavailable(flood: str) -> None:
    wire = (ping_flood if flood == "PING" else settings_flood)(30_000)
    with short_tempdir() as directory:
        async with (
            flooding_server(sock(directory, "rt.sock"), wire) as backend,
            ProxyUnderTest(sock(directory, "proxy.sock"), sock(directory, "rt.sock")) as proxy,
        ):
            stub = pb_grpc.RuntimeServiceStub(proxy.channel())
            with capture_logs() as logs, pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.Version(pb.VersionRequest(), timeout=10)
            await asyncio.wait_for(backend.done.wait(), 10)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "over the proxy's limits" in (failed.value.details() or "")
    assert limit_events(logs) == [(RUNTIME, FLOODS[flood].limit)]
    assert goaway_codes(backend.received)[-1:] == [frames.ENHANCE_YOUR_CALM]



# -- hypothesis: hostile peers on both sides ---------------------------------------------------------


class RelayTransport(PausableTransport):
    """A transport whose peer reads only when told to: past the mark it pauses its protocol's
    writing, as asyncio's do; ``drain`` is the peer reading everything."""

    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.buffered = 0
        self.most = 0
        self.paused = False

    def write(self, data: bytes | memoryview) -> None:
        super().write(data)
        self.buffered += len(data)
        self.most = max(self.most, self.buffered)
        if self.buffered > TIGHT_LIMITS.write_buffer_high and not self.paused:
            self.paused = True
            self.protocol.pause_writing()  # type: ignore[attr-defined]

    def writelines(self, pieces: list[bytes | memoryview]) -> None:
        self.write(b"".join(pieces))

    def drain(self) -> None:
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.protocol.resume_writing()  # type: ignore[attr-defined]

    def abort(self) -> None:
        self.closed = True


def parked(conn: RelayConnection) -> int:
    """Bytes the relay holds back in either direction (parked, BDP answers held)."""
    return sum(len(piece) for d in (conn.c2u, conn.u2c) for piece in [*d.parked, *d.late])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(st.tuples(st.booleans(), hostile_frames(request_block())), max_size=15),
    reads=st.lists(st.booleans(), min_size=1, max_size=8),
)
def test_hostile_peers_never_break_the_relay_nor_make_it_buffer(
    steps: list[tuple[bool, bytes]], reads: list[bool]
) -> None:
    """Random frames from the client and from the backend, each peer reading what it gets or
    not: nothing escapes the frame loop, each write buffer holds at most its mark plus what
    one read produced (the relay reads from neither peer while either is over), and the relay
    either still answers a client's PING or closed the client's connection after a GOAWAY."""

    async def run() -> None:
        options = RelayOptions(
            Backends("/unused"), MethodTable(), PassThrough(), lambda *_: None, 1 << 20, peer_limits=TIGHT_LIMITS
        )
        conn = RelayConnection(options, lambda _conn: None)
        client = RelayTransport(conn.client_protocol())
        backend = RelayTransport(_backend_protocol_of(conn))
        conn.side_made(False, backend)  # type: ignore[arg-type]
        conn.client_transport = conn.u2c.transport = client  # type: ignore[assignment]
        conn.early = None
        conn.client_data(frames.PREFACE)
        largest, delivered = 0, 0
        for i, (from_client, chunk) in enumerate(steps):
            if client.closed or backend.closed:
                break
            if not (client.reading and backend.reading):
                if not reads[i % len(reads)]:
                    break  # neither peer reads: nothing more is delivered
                client.drain()
                backend.drain()
            largest = max(largest, len(chunk))
            if from_client:
                conn.client_data(chunk)
            else:
                conn.upstream_data(chunk)
            delivered += 1
            await asyncio.sleep(0)
        bound = TIGHT_LIMITS.write_buffer_high + 16 * largest + 1024
        assert client.most <= bound and backend.most <= bound
        assert parked(conn) <= 16 * 1024
        if not (client.closed or backend.closed):  # the peers read at last
            client.drain()
            backend.drain()
            rest = b"".join(chunk for from_client, chunk in steps[delivered:] if from_client)
            conn.client_data(rest + ping(b"probe!!!"))  # what stayed in the client's socket, then the probe
        to_client = parse(client.data)
        if client.closed:
            assert to_client[-1][0] == frames.GOAWAY
        elif conn.u2c.block is None:  # (an answer waits while the backend's header block is open)
            assert (frames.PING, frames.FLAG_ACK, 0, b"probe!!!") in to_client

    asyncio.run(run())


def _backend_protocol_of(conn: RelayConnection) -> asyncio.Protocol:
    return _Side(conn, is_client=False)
