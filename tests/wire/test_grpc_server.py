"""runtimeproxy.wire.grpc_server: unary gRPC on our own one-thread HTTP/2 server.

Interop runs real peers against it, under asyncio and under uvloop: grpc.aio and grpc's sync
client (both use the HPACK dynamic table, Huffman coding and their own flow control) and our
H2Channel. Protocol cases drive a raw socket frame by frame; hypothesis feeds random frame
sequences and bytes into a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gzip
import os
import tempfile
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import hpack
import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs
from test_grpc_client import FakeTransport, both_loops

from runtimeproxy.common.listener import open_unix_listener
from runtimeproxy.wire import frames, grpc_framing, grpc_server
from runtimeproxy.wire.grpc_client import H2Channel, RpcError
from runtimeproxy.wire.grpc_framing import StatusCode
from runtimeproxy.wire.grpc_server import MAX_DETAILS, CallInfo, H2Server
from runtimeproxy.wire.h2_peer import COMPRESSION_ERROR, ENHANCE_YOUR_CALM, FRAME_SIZE_ERROR, header_frames
from runtimeproxy.wire.hpack_literal import encode_literal_block

LIMIT = 1 << 20
METHOD = "/test.Echo/Call"
GRPC_OPTIONS = [("grpc.max_send_message_length", 4 * LIMIT), ("grpc.max_receive_message_length", 4 * LIMIT)]


class Calls:
    """The test service: ``/test.Echo/Call`` does what ``behaviour`` says; what handlers saw."""

    def __init__(self) -> None:
        self.behaviour: Callable[[bytes, CallInfo], Awaitable[bytes]] = self.echo
        self.infos: list[CallInfo] = []
        self.cancelled = asyncio.Event()
        self.running = 0
        self.most = 0

    @staticmethod
    async def echo(request: bytes, info: CallInfo) -> bytes:
        return request

    async def call(self, request: bytes, info: CallInfo) -> bytes:
        self.infos.append(info)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            return await self.behaviour(request, info)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        finally:
            self.running -= 1


async def hang(request: bytes, info: CallInfo) -> bytes:
    """A handler that answers only when cancelled (never, in these tests)."""
    await asyncio.sleep(60)
    return b""


def echo_once(release: asyncio.Event) -> Callable[[bytes, CallInfo], Awaitable[bytes]]:
    """A handler that answers its own request once ``release`` is set."""

    async def held(request: bytes, info: CallInfo) -> bytes:
        await release.wait()
        return request

    return held


async def hanging_call(calls: Calls, ours: H2Channel) -> asyncio.Future[bytes]:
    """A call from ``ours`` whose handler hangs, once that handler runs."""
    calls.behaviour = hang
    call = asyncio.ensure_future(ours.unary(METHOD, b"", 30))
    while not calls.running:
        await asyncio.sleep(0.01)
    return call


@contextlib.asynccontextmanager
async def serving(limit: int = LIMIT) -> AsyncIterator[tuple[H2Server, Calls, str]]:
    calls = Calls()
    with tempfile.TemporaryDirectory(prefix="h2s-") as tmp:
        listener = open_unix_listener(os.path.join(tmp, "s.sock"))
        server = H2Server({METHOD: calls.call}, max_message_size=limit, name="test")
        await server.start(listener.sock)
        try:
            yield server, calls, listener.path
        finally:
            await server.stop(0)
            listener.close()


@contextlib.asynccontextmanager
async def channel(path: str) -> AsyncIterator[H2Channel]:
    ours = H2Channel(path, max_message_size=4 * LIMIT)
    try:
        yield ours
    finally:
        await ours.close()


async def grpc_status(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call
    return failed.value.code(), failed.value.details() or ""


async def our_status(call: Awaitable[Any]) -> tuple[StatusCode, str]:
    with pytest.raises(RpcError) as failed:
        await call
    return failed.value.code(), failed.value.details()


# -- helpers ------------------------------------------------------------------------------------------


async def _value(value: Any) -> Any:
    return value


async def _raise(exc: Exception) -> bytes:
    raise exc


def request_frames(
    stream_id: int,
    *,
    message: bytes = b"hello",
    body: bytes | None = None,
    timeout: str | None = None,
    content_type: str = "application/grpc",
    encoding: str | None = None,
    path: str = METHOD,
) -> bytes:
    """One whole request on ``stream_id``: HEADERS (HPACK literals) and DATA, END_STREAM on the last."""
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
              ("content-type", content_type), ("te", "trailers")]
    if timeout is not None:
        fields.append(("grpc-timeout", timeout))
    if encoding is not None:
        fields.append(("grpc-encoding", encoding))
    payload = grpc_framing.encode_message(message) if body is None else body
    return (
        header_frames(stream_id, encode_literal_block(fields), False, frames.DEFAULT_MAX_FRAME)
        + b"".join(frames.data_frames(stream_id, payload, frames.DEFAULT_MAX_FRAME, True))
    )


Frame = tuple[int, int, int, bytes]


class RawClient:
    """A hand-driven HTTP/2 client on the server's socket: bytes out, frames in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self.decoder = hpack.Decoder()
        self.pending: list[Frame] = []

    @classmethod
    async def open(cls, path: str, *, preface: bool = True, client_settings: dict[int, int] | None = None) -> RawClient:
        reader, writer = await asyncio.open_unix_connection(path)
        client = cls(reader, writer)
        if preface:
            client.send(frames.PREFACE + frames.settings(client_settings))
        return client

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def close(self) -> None:
        self.writer.close()

    async def frames(self, until: int | None = None, flags: int = 0) -> list[Frame]:
        """Frames up to the first of type ``until`` (with ``flags``), or all up to the close."""
        out: list[Frame] = []
        async with asyncio.timeout(10):
            while True:
                while self.pending:
                    frame = self.pending.pop(0)
                    out.append(frame)
                    if frame[0] == until and frame[1] & flags == flags:
                        return out
                data = await self.reader.read(65536)
                if not data:
                    return out
                self.buffer += data
                self._split()

    def _split(self) -> None:
        while len(self.buffer) >= frames.HEADER_LEN:
            high, low, ftype, flags, stream_id = frames.FRAME_HEADER.unpack_from(self.buffer)
            end = frames.HEADER_LEN + (high << 8 | low)
            if len(self.buffer) < end:
                return
            self.pending.append((ftype, flags, stream_id, bytes(self.buffer[frames.HEADER_LEN : end])))
            del self.buffer[:end]

    async def answer(self, stream_id: int) -> dict[str, str]:
        """The header fields of ``stream_id``'s last header block (its trailers)."""
        while True:
            received = await self.frames(until=frames.HEADERS, flags=frames.FLAG_END_STREAM)
            assert received and received[-1][0] == frames.HEADERS, received
            fields = {}
            for ftype, _, sid, payload in received:
                if ftype == frames.HEADERS:
                    headers = self.decoder.decode(payload)
                    if sid == stream_id:
                        fields = dict(headers)
            if received[-1][2] == stream_id:
                return fields


# -- interop -----------------------------------------------------------------------------------


@both_loops
async def test_calls_from_grpc_aio_grpc_sync_and_our_client() -> None:
    async with serving() as (_, calls, path), channel(path) as ours:
        assert await ours.unary(METHOD, b"ours", 5) == b"ours"
        async with grpc.aio.insecure_channel("unix://" + path) as aio:
            call = aio.unary_unary(METHOD)
            for n in range(3):  # grpc-core indexes repeated headers: later blocks use its dynamic table
                metadata = (("x-tenant", "a"), ("x-n", str(n)))
                assert await call(b"aio%d" % n, timeout=5, metadata=metadata) == b"aio%d" % n
            assert await call(b"no deadline") == b"no deadline"
        with grpc.insecure_channel("unix://" + path) as sync:  # its own threads, its own HPACK state
            answers = await asyncio.to_thread(lambda: [sync.unary_unary(METHOD)(b"sync", timeout=5) for _ in range(3)])
        assert answers == [b"sync"] * 3
        assert calls.infos[0].metadata == () and calls.infos[0].method == METHOD
        assert [info.metadata for info in calls.infos[1:4]] == [(("x-tenant", "a"), ("x-n", str(n))) for n in range(3)]
        assert calls.infos[4].deadline is None
        loop = asyncio.get_running_loop()
        with_timeout = [info.deadline for info in calls.infos if info.deadline is not None]
        assert len(with_timeout) == len(calls.infos) - 1
        assert all(deadline - loop.time() <= 6 for deadline in with_timeout)  # 5 s, grpc-core rounds up a little


@both_loops
async def test_large_requests_and_responses_within_the_peers_windows() -> None:
    """A request of exactly the limit (far over the 64 KiB default windows) is taken; a response
    of the limit goes out within grpc-core's windows, waiting for its WINDOW_UPDATEs."""
    async with serving() as (_, calls, path), channel(path) as ours:
        big = os.urandom(LIMIT)
        assert await ours.unary(METHOD, big, 10) == big
        async with grpc.aio.insecure_channel("unix://" + path, options=GRPC_OPTIONS) as aio:
            assert await aio.unary_unary(METHOD)(big, timeout=10) == big
            calls.behaviour = lambda request, info: _value(b"r" * LIMIT)
            assert await aio.unary_unary(METHOD)(b"", timeout=10) == b"r" * LIMIT
            answers = await asyncio.gather(*(aio.unary_unary(METHOD)(b"", timeout=10) for _ in range(4)))
            assert answers == [b"r" * LIMIT] * 4
            calls.behaviour = calls.echo
            compressed = await aio.unary_unary(METHOD)(b"z" * LIMIT, timeout=10, compression=grpc.Compression.Gzip)
            assert compressed == b"z" * LIMIT  # the request came gzip-compressed


@both_loops
async def test_messages_over_the_limit_are_resource_exhausted() -> None:
    async with serving() as (_, calls, path), channel(path) as ours:
        async with grpc.aio.insecure_channel("unix://" + path, options=GRPC_OPTIONS) as aio:
            code, details = await grpc_status(aio.unary_unary(METHOD)(b"x" * (LIMIT + 1), timeout=10))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and str(LIMIT + 1) in details
            assert calls.infos == []  # refused before any handler ran
            calls.behaviour = lambda request, info: _value(b"y" * (LIMIT + 1))
            code, details = await grpc_status(aio.unary_unary(METHOD)(b"", timeout=10))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "response" in details
        assert (await our_status(ours.unary(METHOD, b"", 5)))[0] == StatusCode.RESOURCE_EXHAUSTED
        calls.behaviour = calls.echo
        assert await ours.unary(METHOD, b"fine", 5) == b"fine"  # the connection goes on


@both_loops
async def test_unknown_methods_are_unimplemented() -> None:
    async with serving() as (_, _, path), channel(path) as ours:
        with capture_logs() as logs:
            code, details = await our_status(ours.unary("/test.Echo/Nope", b"", 5))
        assert code == StatusCode.UNIMPLEMENTED and "/test.Echo/Nope" in details
        assert any(e["event"] == "gRPC request refused" and e["method"] == "/test.Echo/Nope" for e in logs)
        async with grpc.aio.insecure_channel("unix://" + path) as aio:
            code, _ = await grpc_status(aio.unary_unary("/other.S/M")(b"", timeout=5))
            assert code == grpc.StatusCode.UNIMPLEMENTED


@both_loops
async def test_rpc_errors_reach_the_caller_with_their_details() -> None:
    details = "naïve 100% wrong ✓ %41 \n tab\t"

    async def fail(request: bytes, info: CallInfo) -> bytes:
        raise RpcError(StatusCode(int(request)), details)

    async with serving() as (_, calls, path), channel(path) as ours:
        calls.behaviour = fail
        assert await our_status(ours.unary(METHOD, b"9", 5)) == (StatusCode.FAILED_PRECONDITION, details)
        async with grpc.aio.insecure_channel("unix://" + path) as aio:
            code, got = await grpc_status(aio.unary_unary(METHOD)(b"5", timeout=5))
            assert (code, got) == (grpc.StatusCode.NOT_FOUND, details)
            long = "é%" * 5000
            calls.behaviour = lambda request, info: _raise(RpcError(StatusCode.ABORTED, long))
            code, got = await grpc_status(aio.unary_unary(METHOD)(b"", timeout=5))
            assert code == grpc.StatusCode.ABORTED and got.endswith("…") and long.startswith(got[:-1])


@settings(max_examples=200)
@given(text=st.text(max_size=3000))
def test_grpc_message_is_cut_to_its_limit_at_a_character(text: str) -> None:
    encoded = grpc_server._percent_encoded(text)
    assert len(encoded) <= MAX_DETAILS and encoded.isascii()
    decoded = urllib.parse.unquote(encoded, errors="strict")
    assert decoded == text or (decoded.endswith("…") and text.startswith(decoded[:-1]))


@both_loops
async def test_a_handler_raising_answers_unknown_and_is_logged() -> None:
    async def broken(request: bytes, info: CallInfo) -> bytes:
        await asyncio.sleep(0)
        raise KeyError("no such thing")

    async with serving() as (_, calls, path), channel(path) as ours:
        calls.behaviour = broken
        with capture_logs() as logs:
            code, details = await our_status(ours.unary(METHOD, b"", 5))
        assert (code, details) == (StatusCode.UNKNOWN, "Unexpected KeyError: 'no such thing'")
        [event] = [e for e in logs if e["event"] == "gRPC handler raised"]
        assert event["method"] == METHOD and "KeyError" in event["error"]
        calls.behaviour = lambda request, info: _value("not bytes")
        with capture_logs() as logs:
            assert (await our_status(ours.unary(METHOD, b"", 5)))[0] == StatusCode.UNKNOWN
        assert any(e["event"] == "gRPC handler returned no bytes" for e in logs)


@both_loops
async def test_the_deadline_cancels_the_handler_and_answers_deadline_exceeded() -> None:
    """grpc-timeout as the server sees it: a raw client that never resets its stream."""

    async with serving() as (_, calls, path):
        calls.behaviour = hang
        raw = await RawClient.open(path)
        raw.send(request_frames(1, timeout="200m"))
        fields = await raw.answer(1)
        assert fields["grpc-status"] == str(StatusCode.DEADLINE_EXCEEDED) and calls.cancelled.is_set()
        wire = request_frames(3, timeout="1n")
        data = frames.frame(frames.DATA, frames.FLAG_END_STREAM, 3, grpc_framing.encode_message(b"hello"))
        raw.send(wire[: -len(data)])  # the deadline passes before the request is whole: no handler runs
        await asyncio.sleep(0.01)
        raw.send(data)
        assert (await raw.answer(3))["grpc-status"] == str(StatusCode.DEADLINE_EXCEEDED)
        assert len(calls.infos) == 1
        raw.close()


@both_loops
async def test_a_client_cancel_cancels_the_handler() -> None:
    async with serving() as (_, calls, path), channel(path) as ours:
        task = await hanging_call(calls, ours)
        task.cancel()
        await asyncio.wait_for(calls.cancelled.wait(), 5)  # our RST_STREAM CANCEL reached it
        calls.cancelled.clear()
        with pytest.raises(RpcError):
            await ours.unary(METHOD, b"", 0.2)  # our client's deadline: RST_STREAM too
        await asyncio.wait_for(calls.cancelled.wait(), 5)
        calls.behaviour = calls.echo
        assert await ours.unary(METHOD, b"after", 5) == b"after"


@both_loops
async def test_a_hundred_concurrent_calls_on_one_connection_and_several_connections() -> None:
    all_in = asyncio.Event()

    async def together(request: bytes, info: CallInfo) -> bytes:
        # Each call waits until a hundred run at once (not a fixed sleep: on a loaded machine the
        # first calls could end before the last arrive), so ``most`` proves they overlapped.
        if calls.running >= 100:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 10)
        return request

    async with serving() as (_, calls, path):
        calls.behaviour = together
        async with channel(path) as ours:
            answers = await asyncio.gather(*(ours.unary(METHOD, b"%d" % n, 10) for n in range(100)))
            assert answers == [b"%d" % n for n in range(100)] and calls.most == 100
        channels = [H2Channel(path, max_message_size=LIMIT) for _ in range(5)]
        async with grpc.aio.insecure_channel("unix://" + path) as aio:
            answers = await asyncio.gather(
                *(c.unary(METHOD, b"%d" % n, 10) for n in range(10) for c in channels),
                *(aio.unary_unary(METHOD)(b"aio", timeout=10) for _ in range(20)),
            )
        assert answers == [b"%d" % n for n in range(10) for _ in channels] + [b"aio"] * 20
        for c in channels:
            await c.close()


@both_loops
async def test_stop_lets_calls_in_flight_finish_and_refuses_new_ones() -> None:
    release = asyncio.Event()
    held = echo_once(release)
    async with serving() as (server, calls, path), channel(path) as ours:
        calls.behaviour = held
        in_flight = asyncio.ensure_future(ours.unary(METHOD, b"late", 10))
        raw = await RawClient.open(path)  # a second connection with a call in flight
        raw.send(request_frames(1, message=b"raw"))
        idle = await RawClient.open(path)  # and a third without
        while calls.running < 2:
            await asyncio.sleep(0.01)
        stopping = asyncio.ensure_future(server.stop(None))  # None: wait as long as calls take
        goaway = [p for t, _, _, p in await raw.frames(until=frames.GOAWAY) if t == frames.GOAWAY]
        assert [int.from_bytes(p[:4], "big") for p in goaway] == [1]  # the last stream it processes
        assert any(t == frames.GOAWAY for t, _, _, _ in await idle.frames())  # then closed: nothing in flight
        raw.send(request_frames(3))
        resets = [(s, int.from_bytes(p, "big")) for t, _, s, p in await raw.frames(until=frames.RST_STREAM)
                  if t == frames.RST_STREAM]
        assert resets == [(3, frames.REFUSED_STREAM)]
        assert (await our_status(ours.unary(METHOD, b"new", 5)))[0] == StatusCode.UNAVAILABLE  # no new connection
        assert not stopping.done()
        release.set()
        assert await in_flight == b"late"
        assert (await raw.answer(1))["grpc-status"] == "0"
        await stopping
        assert await raw.frames() == []  # closed once its call was answered
        raw.close()
        idle.close()


@both_loops
async def test_stop_cancels_calls_past_the_grace() -> None:
    async with serving() as (server, calls, path), channel(path) as ours:
        in_flight = await hanging_call(calls, ours)
        await server.stop(0.1)
        assert calls.cancelled.is_set()
        assert (await our_status(in_flight))[0] == StatusCode.UNAVAILABLE


# -- protocol errors --------------------------------------------------------------------------------

VIOLATIONS = {
    "garbage": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", frames.PROTOCOL_ERROR),
    "bad preface": (b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", frames.PROTOCOL_ERROR),
    "DATA on stream 0": (frames.frame(frames.DATA, 0, 0, b"x"), frames.PROTOCOL_ERROR),
    "HEADERS on an even id": (header_frames(2, encode_literal_block([(":path", METHOD)]), True, 16384),
                              frames.PROTOCOL_ERROR),
    "oversized header block": (
        header_frames(1, encode_literal_block([("x-big", "v" * 70_000)]), True, 16384), ENHANCE_YOUR_CALM
    ),
    "frame over 16384": (frames.frame(frames.DATA, 0, 1, b"x" * 16385), FRAME_SIZE_ERROR),
    "CONTINUATION alone": (frames.frame(frames.CONTINUATION, frames.FLAG_END_HEADERS, 1, b""), frames.PROTOCOL_ERROR),
    "HPACK garbage": (frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, 1, b"\xff\xff\xff\xff"), COMPRESSION_ERROR),
    "DATA on an idle stream": (frames.frame(frames.DATA, 0, 5, b"x"), frames.PROTOCOL_ERROR),
    "PUSH_PROMISE": (frames.frame(frames.PUSH_PROMISE, frames.FLAG_END_HEADERS, 1, b"\0\0\0\2"), frames.PROTOCOL_ERROR),
    "WINDOW_UPDATE of 0": (frames.frame(frames.WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), frames.PROTOCOL_ERROR),
    "SETTINGS on a stream": (frames.frame(frames.SETTINGS, 0, 1, b""), frames.PROTOCOL_ERROR),
}


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("case", list(VIOLATIONS))
def test_protocol_violations_end_that_connection_only(case: str, loop: str) -> None:
    (uvloop.run if loop == "uvloop" else asyncio.run)(violation(case))


async def violation(case: str) -> None:
    wire, code = VIOLATIONS[case]
    preface = not case.startswith(("garbage", "bad preface"))
    async with serving() as (_, _, path), channel(path) as ours:
        assert await ours.unary(METHOD, b"before", 5) == b"before"
        raw = await RawClient.open(path, preface=preface)
        with capture_logs() as logs:
            raw.send(wire)
            received = await raw.frames()  # up to the server's close
        goaways = [p for t, _, _, p in received if t == frames.GOAWAY]
        assert goaways and int.from_bytes(goaways[-1][4:8], "big") == code, received
        # A header block over the size allowed is one of the limits peers are held to (peer_limits).
        cause = "went over a limit" if code == ENHANCE_YOUR_CALM else "broke the protocol"
        assert any(e["event"] == f"closing the HTTP/2 connection: the peer {cause}" for e in logs)
        assert await ours.unary(METHOD, b"after", 5) == b"after"  # the other connection goes on


@both_loops
async def test_pings_are_answered_and_data_after_the_end_resets_the_stream() -> None:
    async with serving() as (_, calls, path):
        raw = await RawClient.open(path)
        raw.send(frames.frame(frames.PING, 0, 0, b"12345678"))
        pings = [(f, p) for t, f, _, p in await raw.frames(until=frames.PING) if t == frames.PING]
        assert pings == [(frames.FLAG_ACK, b"12345678")]
        release, started = asyncio.Event(), asyncio.Event()

        async def held(request: bytes, info: CallInfo) -> bytes:
            started.set()
            await release.wait()
            return request

        calls.behaviour = held
        raw.send(request_frames(1))
        await asyncio.wait_for(started.wait(), 5)  # the handler runs; then the client breaks the stream
        with capture_logs() as logs:
            raw.send(frames.frame(frames.DATA, frames.FLAG_END_STREAM, 1, b"more"))
            resets = [(s, int.from_bytes(p, "big")) for t, _, s, p in await raw.frames(until=frames.RST_STREAM)
                      if t == frames.RST_STREAM]
        assert resets == [(1, 0x5)]  # STREAM_CLOSED
        assert any(e["event"] == "resetting a gRPC stream: the client broke the protocol" for e in logs)
        await asyncio.wait_for(calls.cancelled.wait(), 5)
        calls.behaviour = calls.echo
        raw.send(request_frames(3, message=b"ok"))
        assert (await raw.answer(3))["grpc-status"] == "0"
        raw.close()


@both_loops
async def test_bad_requests_get_a_status_and_a_log_line() -> None:
    async with serving() as (_, calls, path):
        raw = await RawClient.open(path)
        cases = [
            (request_frames(1, timeout="soon"), StatusCode.INTERNAL, "malformed grpc-timeout"),
            (request_frames(3, content_type="text/plain"), StatusCode.UNKNOWN, "is not gRPC"),
            (request_frames(5, body=b"\0\0\0"), StatusCode.INTERNAL, "not whole length-prefixed"),
            (request_frames(7, body=grpc_framing.encode_message(b"a") * 2), StatusCode.INTERNAL, "exactly one"),
            (request_frames(9, body=grpc_framing.encode_message(b"zz", compressed=True), encoding="snappy"),
             StatusCode.UNIMPLEMENTED, "snappy"),
            (request_frames(11, body=grpc_framing.encode_message(b"junk", compressed=True), encoding="gzip"),
             StatusCode.INTERNAL, "does not decompress"),
        ]
        for n, (wire, code, text) in enumerate(cases):
            stream_id = 2 * n + 1
            with capture_logs() as logs:
                raw.send(wire)
                fields = await raw.answer(stream_id)
            assert fields["grpc-status"] == str(int(code)), (text, fields)
            assert text in urllib.parse.unquote(fields.get("grpc-message", "")), fields
            assert any(e["event"] == "gRPC request refused" and text in e["reason"] for e in logs), logs
        raw.send(request_frames(13, body=grpc_framing.encode_message(gzip.compress(b"zipped"), True), encoding="gzip"))
        fields = await raw.answer(13)
        assert fields["grpc-status"] == "0" and calls.infos[-1].method == METHOD
        raw.close()


SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


def at_once_and_tasked(
    answer: Callable[[bytes], bytes],
) -> tuple[Callable[[bytes, CallInfo], Awaitable[bytes]], Callable[[bytes, CallInfo], Awaitable[bytes]]]:
    """The same handler twice: one that cannot suspend (no await: run at once, without a task)
    and one that can (an await: a task of its own)."""
    tasks: list[asyncio.Task[Any] | None] = []

    async def at_once(request: bytes, info: CallInfo) -> bytes:
        tasks.append(asyncio.current_task())
        return answer(request)

    async def tasked(request: bytes, info: CallInfo) -> bytes:
        await asyncio.sleep(0)
        return await at_once(request, info)

    at_once.tasks = tasked.tasks = tasks  # type: ignore[attr-defined]
    return at_once, tasked


def _answer(request: bytes) -> bytes:
    """What the test handlers do for ``request``: echo it, or fail as it says."""
    if SEEN.get() != "unset":
        raise AssertionError("an earlier handler's context change leaked")  # UNKNOWN: the test fails
    SEEN.set("changed")  # a handler's context changes stay its own, as in a task
    outcomes: dict[bytes, Callable[[], Any]] = {
        b"rpc": lambda: _throw(RpcError(StatusCode.ABORTED, "refused")),
        b"bug": lambda: _throw(KeyError("no such thing")),
        b"cancel": lambda: _throw(asyncio.CancelledError()),
        b"text": lambda: "not bytes",
        b"big": lambda: b"y" * (LIMIT + 1),
    }
    return outcomes.get(request, lambda: request)()  # type: ignore[no-any-return]


def _throw(exc: BaseException) -> None:
    raise exc


@both_loops
async def test_a_handler_that_cannot_suspend_runs_at_once_and_answers_as_a_task_would() -> None:
    at_once, tasked = at_once_and_tasked(_answer)
    methods = {"/test.Echo/AtOnce": at_once, "/test.Echo/Tasked": tasked}
    expected = {
        b"echo": b"echo",
        b"rpc": (StatusCode.ABORTED, "refused"),
        b"bug": (StatusCode.UNKNOWN, "Unexpected KeyError: 'no such thing'"),
        b"cancel": (StatusCode.CANCELLED, "the handler was cancelled"),
        b"text": (StatusCode.UNKNOWN, "the handler returned str"),
    }
    with tempfile.TemporaryDirectory(prefix="h2s-") as tmp:
        listener = open_unix_listener(os.path.join(tmp, "s.sock"))
        server = H2Server(methods, max_message_size=LIMIT, name="test")
        await server.start(listener.sock)
        try:
            async with channel(listener.path) as ours:
                for method in methods:
                    for request, outcome in expected.items():
                        if isinstance(outcome, bytes):
                            assert await ours.unary(method, request, 5) == outcome
                        else:
                            assert await our_status(ours.unary(method, request, 5)) == outcome, (method, request)
                    code, details = await our_status(ours.unary(method, b"big", 5))
                    assert code == StatusCode.RESOURCE_EXHAUSTED and "response" in details
            raw = await RawClient.open(listener.path, client_settings={frames.SETTINGS_INITIAL_WINDOW_SIZE: 10})
            message = os.urandom(40_000)  # an echo that waits for the client's windows
            raw.send(request_frames(1, message=message, path="/test.Echo/AtOnce"))
            first = await raw.frames(until=frames.DATA)
            raw.send(frames.window_update(1, 40_000) + frames.window_update(0, 40_000))
            rest = await raw.frames(until=frames.HEADERS, flags=frames.FLAG_END_STREAM)
            body = b"".join(p for t, _, _, p in first + rest if t == frames.DATA)
            assert body == grpc_framing.encode_message(message)
            raw.close()
        finally:
            await server.stop(0)
            listener.close()
    ran = at_once.tasks  # type: ignore[attr-defined]
    calls = len(expected) + 1
    assert len(ran) == 2 * calls + 1
    assert all(task is None for task in [*ran[:calls], ran[-1]])  # AtOnce's: no task
    assert all(task is not None for task in ran[calls:-1])


@both_loops
async def test_responses_wait_for_window_updates_and_respect_the_frame_size() -> None:
    """A client with a 10-byte initial window and a larger frame size: the answer goes out as
    its window opens, in frames no larger than it allows."""
    async with serving() as (_, _, path):
        raw = await RawClient.open(path, client_settings={frames.SETTINGS_INITIAL_WINDOW_SIZE: 10})
        message = os.urandom(40_000)
        raw.send(request_frames(1, message=message))
        first = await raw.frames(until=frames.DATA)
        sent = b"".join(p for t, _, s, p in first if t == frames.DATA)
        assert len(sent) == 10
        raw.send(frames.window_update(1, 40_000) + frames.window_update(0, 40_000))
        rest = await raw.frames(until=frames.HEADERS, flags=frames.FLAG_END_STREAM)
        body = sent + b"".join(p for t, _, s, p in rest if t == frames.DATA)
        assert body == grpc_framing.encode_message(message)
        assert all(len(p) <= frames.DEFAULT_MAX_FRAME for t, _, _, p in first + rest)
        raw.close()


def written_frames(transport: FakeTransport) -> list[Frame]:
    out, data, offset = [], bytes(transport.written), 0
    while offset < len(data):
        high, low, ftype, flags, stream_id = frames.FRAME_HEADER.unpack_from(data, offset)
        end = offset + frames.HEADER_LEN + (high << 8 | low)
        out.append((ftype, flags, stream_id, data[offset + frames.HEADER_LEN : end]))
        offset = end
    return out


def request_head(stream_id: int, end_stream: bool = False) -> bytes:
    fields = [(":method", "POST"), (":path", METHOD), ("content-type", "application/grpc")]
    return header_frames(stream_id, encode_literal_block(fields), end_stream, frames.DEFAULT_MAX_FRAME)


STREAM_ERRORS = {
    "a second header block that does not end the request": (
        request_head(1) + request_head(1), frames.PROTOCOL_ERROR
    ),
    "HEADERS after the request's END_STREAM": (
        request_frames(1) + header_frames(1, encode_literal_block([("x", "y")]), True, 16384), 0x5
    ),
    "over the stream window": (  # padding counts against it, and a limit of 1000 makes it 1005 bytes
        request_head(1) + frames.frame(frames.DATA, frames.FLAG_PADDED, 1, bytes([255]) + bytes(255)) * 4, 0x3
    ),
}


@pytest.mark.parametrize("case", list(STREAM_ERRORS))
async def test_stream_errors_reset_that_stream_only(case: str) -> None:
    wire, code = STREAM_ERRORS[case]
    calls = Calls()
    calls.behaviour = lambda request, info: asyncio.Event().wait()  # type: ignore[assignment,return-value]
    server = H2Server({METHOD: calls.call}, max_message_size=1000)
    connection, transport = fresh_connection(server)
    with capture_logs() as logs:
        connection.data_received(frames.PREFACE + frames.settings() + wire)
        await asyncio.sleep(0)
    resets = [(s, int.from_bytes(p, "big")) for t, _, s, p in written_frames(transport) if t == frames.RST_STREAM]
    assert resets == [(1, code)]
    assert any(e["event"] == "resetting a gRPC stream: the client broke the protocol" and case in e["reason"]
               for e in logs), logs
    assert not connection.streams and connection.lost is None
    calls.behaviour = calls.echo
    connection.data_received(request_frames(3, message=b"next"))
    await settle()
    assert grpc_framing.encode_message(b"next") in bytes(transport.written)


async def test_streams_past_the_concurrency_limit_are_refused() -> None:
    calls = Calls()
    calls.behaviour = lambda request, info: asyncio.Event().wait()  # type: ignore[assignment,return-value]
    server = H2Server({METHOD: calls.call}, max_message_size=LIMIT)
    connection, transport = fresh_connection(server)
    announced = frames.parse_settings(written_frames(transport)[0][3])
    assert announced[0x3] == grpc_server.MAX_CONCURRENT_STREAMS  # SETTINGS_MAX_CONCURRENT_STREAMS
    count = grpc_server.MAX_CONCURRENT_STREAMS
    with capture_logs() as logs:
        connection.data_received(frames.PREFACE + b"".join(request_frames(2 * n + 1) for n in range(count + 1)))
    assert [e["stream"] for e in logs if e["event"] == "refusing a gRPC stream: too many open"] == [2 * count + 1]
    resets = [(s, int.from_bytes(p, "big")) for t, _, s, p in written_frames(transport) if t == frames.RST_STREAM]
    assert resets == [(2 * count + 1, frames.REFUSED_STREAM)] and len(connection.streams) == count
    await settle()  # the handlers run, and wait
    connection.connection_lost(None)
    await settle()
    assert calls.cancelled.is_set() and not connection.streams


@both_loops
async def test_a_client_goaway_is_logged_and_calls_in_flight_still_answered() -> None:
    release = asyncio.Event()
    held = echo_once(release)
    async with serving() as (_, calls, path):
        calls.behaviour = held
        raw = await RawClient.open(path)
        with capture_logs() as logs:
            raw.send(request_frames(1, message=b"kept") + frames.goaway(1, frames.INTERNAL_ERROR))
            while not calls.running:
                await asyncio.sleep(0.01)
        assert any(e["event"] == "the client ends the connection with an error" and e["h2_error"] == 2 for e in logs)
        release.set()
        assert (await raw.answer(1))["grpc-status"] == "0"
        raw.close()


# -- hypothesis: anything a peer sends ------------------------------------------------------------------

def frame_strategy() -> st.SearchStrategy[bytes]:
    stream_ids = st.sampled_from([0, 1, 2, 3, 5, 0x7FFFFFFF])
    kinds = st.integers(0, 12)
    raw = st.builds(
        lambda kind, flags, stream_id, payload: frames.frame(kind, flags, stream_id, payload),
        kinds, st.integers(0, 255), stream_ids, st.binary(max_size=40),
    )
    structured = st.sampled_from([
        request_frames(1),
        request_frames(3, message=b"m" * 100),
        frames.frame(frames.DATA, frames.FLAG_END_STREAM, 1, b""),
        frames.settings({frames.SETTINGS_INITIAL_WINDOW_SIZE: 0}),
        frames.window_update(0, 1 << 20),
        frames.window_update(1, 100),
        frames.rst_stream(1),
        frames.goaway(0),
        frames.frame(frames.PING, 0, 0, b"8bytes!!"),
        header_frames(1, encode_literal_block([("grpc-status", "0")]), True, 16384),
    ])
    return st.one_of(raw, structured)


def fresh_connection(server: H2Server) -> tuple[Any, FakeTransport]:
    connection = server._connection()
    transport = FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


async def settle() -> None:
    """A few loop turns: the handlers' tasks start, and those that do not wait answer."""
    for _ in range(3):
        await asyncio.sleep(0)


async def assert_still_serves(server: H2Server) -> None:
    connection, transport = fresh_connection(server)
    connection.data_received(frames.PREFACE + frames.settings() + request_frames(1, message=b"still"))
    await settle()
    written = bytes(transport.written)
    assert grpc_framing.encode_message(b"still") in written and connection.lost is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=st.lists(frame_strategy(), max_size=12), cuts=st.lists(st.integers(0, 600), max_size=5))
def test_random_frame_sequences_never_break_the_server(sequence: list[bytes], cuts: list[int]) -> None:
    async def run() -> None:
        server = H2Server({METHOD: Calls().call}, max_message_size=LIMIT)
        connection, _ = fresh_connection(server)
        wire = frames.PREFACE + b"".join(sequence)
        points = sorted({c for c in cuts if 0 < c < len(wire)})
        with capture_logs() as logs:
            for a, b in zip([0, *points], [*points, len(wire)], strict=True):
                connection.data_received(wire[a:b])
            await asyncio.sleep(0)
        assert not any(e["event"] == "closing the HTTP/2 connection: internal error" for e in logs), logs
        await assert_still_serves(server)

    asyncio.run(run())


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=300))
def test_random_bytes_after_the_preface_never_break_the_server(garbage: bytes) -> None:
    async def run() -> None:
        server = H2Server({METHOD: Calls().call}, max_message_size=LIMIT)
        connection, _ = fresh_connection(server)
        with capture_logs() as logs:
            connection.data_received(frames.PREFACE + garbage)
            connection.connection_lost(None)
        assert not any(e["event"] == "closing the HTTP/2 connection: internal error" for e in logs), logs
        assert not connection.streams
        await assert_still_serves(server)

    asyncio.run(run())




def answers(written: bytes) -> dict[int, tuple[dict[str, str], bytes]]:
    """Per stream, what the server wrote: the fields of its header blocks and its DATA."""
    decoder, out, offset = hpack.Decoder(), {}, 0
    while offset < len(written):
        high, low, ftype, _, stream_id = frames.FRAME_HEADER.unpack_from(written, offset)
        end = offset + frames.HEADER_LEN + (high << 8 | low)
        payload = written[offset + frames.HEADER_LEN : end]
        offset = end
        fields, data = out.setdefault(stream_id, ({}, b""))
        if ftype == frames.HEADERS:
            fields.update(decoder.decode(payload))
        elif ftype == frames.DATA:
            out[stream_id] = (fields, data + payload)
    return out


SMALL_LIMIT = 24
# Bodies within our stream window (the limit and a prefix): a longer one is a flow-control error.
message_bodies = st.one_of(
    st.binary(max_size=SMALL_LIMIT + grpc_framing.PREFIX_LEN),  # anything, mostly not one message
    st.builds(  # a message prefix (compressed or not, announcing about the limit) and some bytes
        lambda flag, length, rest: grpc_framing.MESSAGE_PREFIX.pack(flag, length) + rest,
        st.sampled_from([0, 1]), st.integers(0, SMALL_LIMIT + 3), st.binary(max_size=SMALL_LIMIT),
    ),
)


@settings(max_examples=300, deadline=None)
@given(body=message_bodies, cuts=st.lists(st.integers(1, 40), min_size=1, max_size=4))
def test_a_request_in_one_data_frame_is_answered_as_one_cut_in_pieces(body: bytes, cuts: list[int]) -> None:
    """A request whose body comes in one DATA frame takes a shorter way (no sizer, no copy): its
    answer is the one the same body cut into several DATA frames gets (status, details, message)."""

    async def echo(request: bytes, info: CallInfo) -> bytes:
        return request

    async def run() -> None:
        server = H2Server({METHOD: echo}, max_message_size=SMALL_LIMIT)
        connection, transport = fresh_connection(server)
        fields = [(":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", "x"),
                  ("content-type", "application/grpc"), ("grpc-encoding", "gzip")]
        head = lambda sid: header_frames(sid, encode_literal_block(fields), False, 16384)  # noqa: E731
        points = sorted({c for c in cuts if c < len(body)})
        pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
        cut = b"".join(frames.frame(frames.DATA, 0, 3, piece) for piece in pieces[:-1])
        wire = (head(1) + frames.frame(frames.DATA, frames.FLAG_END_STREAM, 1, body)
                + head(3) + cut + frames.frame(frames.DATA, frames.FLAG_END_STREAM, 3, pieces[-1]))
        with capture_logs():
            connection.data_received(frames.PREFACE + frames.settings() + wire)
        got = answers(bytes(transport.written))
        assert got[1] == got[3] and "grpc-status" in got[1][0]
        whole = grpc_framing.split_messages(body)
        if whole is not None and len(whole) == 1 and len(whole[0].body) <= SMALL_LIMIT and not whole[0].compressed:
            assert got[1] == ({":status": "200", "content-type": "application/grpc", "grpc-status": "0"}, body)
        elif whole is not None and any(len(m.body) > SMALL_LIMIT for m in whole):
            assert got[1][0]["grpc-status"] == str(int(StatusCode.RESOURCE_EXHAUSTED))

    asyncio.run(run())


async def test_a_request_at_the_limit_in_one_frame_is_served_and_one_byte_more_is_refused() -> None:
    async with serving(limit=100) as (_, calls, path), channel(path) as ours:
        assert await ours.unary(METHOD, b"a" * 100, 5) == b"a" * 100
        code, details = await our_status(ours.unary(METHOD, b"a" * 101, 5))
        assert code == StatusCode.RESOURCE_EXHAUSTED and "101 bytes" in details
        assert len(calls.infos) == 1  # refused before any handler ran
