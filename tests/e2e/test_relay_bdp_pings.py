"""containerd's BDP pings through the relay, on a real containerd.

grpc-go (containerd's gRPC server) sends a connection WINDOW_UPDATE and a BDP ping on the
first DATA it reads while no BDP ping of its is unanswered. Straight to containerd, a client
that answers at once gets both after every request; through the relay, which holds its answer
(``BDP_ANSWER_DELAY``), the requests that follow within that time pass without either, so
neither the relay nor the client is woken for them.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import hpack
from fake_runtime import ProxyUnderTest, grpc_request_headers, short_tempdir, sock

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.testbed import Containerd
from runtimeproxy.wire import frames
from runtimeproxy.wire.grpc_framing import encode_message

VERSION = "/runtime.v1.RuntimeService/Version"
CALLS = 10


async def version_calls(path: str, calls: int) -> tuple[Counter[str], float]:
    """Make ``calls`` Version calls one after another on one raw HTTP/2 connection, answering
    SETTINGS and PINGs at once; count what reached the client: connection WINDOW_UPDATEs and
    PINGs. Also returns the seconds the calls took."""
    reader, writer = await asyncio.open_unix_connection(path)
    encoder, seen = hpack.Encoder(), Counter[str]()
    body = encode_message(pb.VersionRequest(version="v1").SerializeToString())
    began = time.monotonic()
    try:
        writer.write(frames.PREFACE + frames.settings())
        for sid in range(1, 2 * calls, 2):
            block = encoder.encode(grpc_request_headers(VERSION))
            writer.write(frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, block)
                         + frames.frame(frames.DATA, frames.FLAG_END_STREAM, sid, body))
            await read_until_call_ends(reader, writer, sid, seen)
        return seen, time.monotonic() - began
    finally:
        writer.close()


async def read_until_call_ends(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sid: int,
                               seen: Counter[str]) -> None:
    while True:
        head = await asyncio.wait_for(reader.readexactly(frames.HEADER_LEN), 10.0)
        high, low, ftype, flags, stream = frames.FRAME_HEADER.unpack(head)
        payload = await reader.readexactly((high << 8) | low)
        if ftype == frames.SETTINGS and not flags & frames.FLAG_ACK:
            writer.write(frames.settings_ack())
        elif ftype == frames.PING and not flags & frames.FLAG_ACK:
            seen["ping"] += 1
            writer.write(frames.ping_ack(payload))
        elif ftype == frames.WINDOW_UPDATE and stream == 0:
            seen["connection window update"] += 1
        elif ftype == frames.HEADERS and stream == sid and flags & frames.FLAG_END_STREAM:
            return


async def test_requests_after_the_first_cost_containerd_no_bdp_ping(containerd: Containerd) -> None:
    direct, _ = await version_calls(str(containerd.socket), CALLS)
    # The fact the relay relies on: without a held answer, every request brings both.
    assert direct["ping"] >= CALLS - 1
    assert direct["connection window update"] >= CALLS - 1
    with short_tempdir() as directory:
        async with ProxyUnderTest(sock(directory, "proxy.sock"), str(containerd.socket)) as proxy:
            proxied, seconds = await version_calls(proxy.path, CALLS)
    assert proxied["ping"] == 0  # the relay answers pings itself
    # One BDP ping (and the WINDOW_UPDATE before it) per BDP_ANSWER_DELAY at most.
    assert 1 <= proxied["connection window update"] <= 1 + int(seconds)
