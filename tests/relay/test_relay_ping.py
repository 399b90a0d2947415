"""PING is hop by hop, and each read costs at most one write per peer.

The relay answers every PING from either side itself and forwards neither PINGs nor their
ACKs (RFC 9113 section 6.7); a malformed PING is forwarded so that its receiver ends the
connection as before. Everything bound for one peer while a read is handled goes out in one
transport write, in the order it was produced; writes outside a read go out at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from fake_runtime import ProxyUnderTest, grpc_request_headers, proxy_before_fake_runtime
from relay_pair import VERSION, Pair
from structlog.testing import capture_logs

from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import encode_message

BDP_PING = bytes.fromhex("02 04 10 10 09 0e 07 07")  # grpc-go's BDP ping payload


def ping(payload: bytes, ack: bool = False) -> bytes:
    return frames.frame(frames.PING, frames.FLAG_ACK if ack else 0, 0, payload)


def test_a_client_ping_is_answered_by_the_relay_and_never_reaches_the_backend() -> None:
    pair = Pair()
    call = pair.request(1)
    pair.conn.client_data(ping(b"client-1") + call + ping(BDP_PING))
    assert pair.client.writes == [ping(b"client-1", ack=True) + ping(BDP_PING, ack=True)]
    assert pair.backend.writes == [call]


def test_a_backend_ping_is_answered_by_the_relay_and_never_reaches_the_client() -> None:
    pair = Pair()
    window = frames.window_update(0, 100)
    pair.conn.upstream_data(ping(BDP_PING) + window + ping(b"backend2"))
    assert pair.backend.writes == [ping(BDP_PING, ack=True) + ping(b"backend2", ack=True)]
    assert pair.client.writes == [window]


def test_ping_acks_from_either_side_are_dropped() -> None:
    pair = Pair()
    pair.conn.client_data(ping(BDP_PING, ack=True))
    pair.conn.upstream_data(ping(b"12345678", ack=True))
    assert pair.client.writes == []
    assert pair.backend.writes == []


def test_a_ping_answer_waits_for_the_open_header_block_towards_that_peer() -> None:
    """No frame may come between a HEADERS and its CONTINUATION (RFC 9113 section 6.10)."""
    pair = Pair()
    block = pair.encoder.encode(grpc_request_headers(VERSION))
    first = frames.frame(frames.HEADERS, 0, 1, block[:3])
    rest = frames.frame(frames.CONTINUATION, frames.FLAG_END_HEADERS, 1, block[3:])
    pair.conn.client_data(first)
    pair.conn.upstream_data(ping(BDP_PING))
    assert pair.backend.data == first
    pair.conn.client_data(rest)
    assert pair.backend.writes == [first, rest + ping(BDP_PING, ack=True)]


@pytest.mark.parametrize(
    "bad",
    [
        frames.frame(frames.PING, 0, 0, b"seven.."),
        frames.frame(frames.PING, 0, 0, b"nine....."),
        frames.frame(frames.PING, frames.FLAG_ACK, 0, b""),
        frames.frame(frames.PING, 0, 1, b"stream 1"),
    ],
    ids=["short", "long", "empty-ack", "on-a-stream"],
)
@pytest.mark.parametrize("from_client", [True, False])
def test_a_malformed_ping_is_forwarded_unchanged_and_logged(bad: bytes, from_client: bool) -> None:
    """Its receiver ends the connection (FRAME_SIZE_ERROR or PROTOCOL_ERROR), as before."""
    pair = Pair()
    with capture_logs() as logs:
        if from_client:
            pair.conn.client_data(bad)
        else:
            pair.conn.upstream_data(bad)
    sent, other = (pair.backend, pair.client) if from_client else (pair.client, pair.backend)
    assert sent.writes == [bad]
    assert other.writes == []
    assert [entry["event"] for entry in logs] == ["malformed PING forwarded; its receiver ends the connection"]


def test_one_write_per_peer_per_read_in_frame_order() -> None:
    """Relayed runs, dropped frames, the relay's own frames (a PING answer, a RST_STREAM and an
    error status for a call over the limit, credit for dropped bytes): one write per peer."""
    pair = Pair(max_message_size=10)
    big = pair.request(1, b"x" * 11)
    headers_1 = big[: big.index(frames.frame(frames.DATA, frames.FLAG_END_STREAM, 1, encode_message(b"x" * 11)))]
    call_3 = pair.request(3)
    window = frames.window_update(0, 1000)
    pair.conn.client_data(ping(b"first..!") + big + window + call_3 + ping(b"second!!"))
    status = grpc_framing.status_frame(
        1,
        grpc_framing.RESOURCE_EXHAUSTED,
        f"request message of 11 bytes for {VERSION} is over the proxy's limit of 10",
        trailers_only=True,
    )
    credit = frames.window_update(0, len(encode_message(b"x" * 11)))
    assert pair.backend.writes == [headers_1 + frames.rst_stream(1, frames.CANCEL) + window + call_3]
    assert pair.client.writes == [ping(b"first..!", ack=True) + status + ping(b"second!!", ack=True) + credit]
    assert pair.observed == [(VERSION, grpc_framing.RESOURCE_EXHAUSTED)]


def test_a_read_with_no_whole_frame_writes_nothing() -> None:
    pair = Pair()
    frame = ping(BDP_PING)
    pair.conn.upstream_data(frame[:5])
    assert pair.client.writes == [] and pair.backend.writes == []
    pair.conn.upstream_data(frame[5:])
    assert pair.backend.writes == [ping(BDP_PING, ack=True)]


def test_writes_outside_a_read_go_out_at_once() -> None:
    """A hook task finishing or a shutdown writes between reads: nothing may wait for a read."""
    pair = Pair()
    pair.conn.start_drain()
    assert pair.client.writes == [frames.goaway(frames.MAX_STREAM_ID)]


# -- over real sockets, with a grpc-core backend ---------------------------------------------------


@pytest.fixture
async def proxy() -> AsyncIterator[ProxyUnderTest]:
    async with proxy_before_fake_runtime() as under_test:
        yield under_test


async def read_frames(reader: asyncio.StreamReader, until: int) -> list[tuple[int, int, bytes]]:
    """(type, flags, payload) of each frame read, up to one of type ``until`` or the end."""
    seen: list[tuple[int, int, bytes]] = []
    while True:
        try:
            head = await asyncio.wait_for(reader.readexactly(frames.HEADER_LEN), 5.0)
        except asyncio.IncompleteReadError:
            return seen
        high, low, ftype, flags, _sid = frames.FRAME_HEADER.unpack(head)
        seen.append((ftype, flags, await reader.readexactly((high << 8) | low)))
        if ftype == until:
            return seen


async def test_the_relay_answers_a_ping_over_a_live_connection(proxy: ProxyUnderTest) -> None:
    reader, writer = await asyncio.open_unix_connection(proxy.path)
    try:
        writer.write(frames.PREFACE + frames.settings() + ping(b"live!!!!"))
        seen = await read_frames(reader, until=frames.PING)
        assert seen[-1] == (frames.PING, frames.FLAG_ACK, b"live!!!!")
    finally:
        writer.close()


async def test_a_malformed_ping_still_ends_the_connection(proxy: ProxyUnderTest) -> None:
    """Forwarded as before, the backend refuses it as a connection error (grpc-core closes the
    connection; grpc-go sends GOAWAY FRAME_SIZE_ERROR): the relay tells the client with a GOAWAY
    and closes, exactly as when it forwarded every PING."""
    reader, writer = await asyncio.open_unix_connection(proxy.path)
    try:
        writer.write(frames.PREFACE + frames.settings() + frames.frame(frames.PING, 0, 0, b"seven.."))
        seen = await read_frames(reader, until=-1)  # everything, to the end of the connection
        assert frames.GOAWAY in [ftype for ftype, _flags, _payload in seen]
        assert frames.PING not in [ftype for ftype, _flags, _payload in seen]
        assert reader.at_eof()
    finally:
        writer.close()
