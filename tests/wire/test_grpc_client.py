"""runtimeproxy.wire.grpc_client: unary gRPC over our own HTTP/2 client.

Frame-level cases feed a scripted server's bytes into the client's protocol (in arbitrary
chunks, frame splits, paddings and interleavings: hypothesis); the rest runs against a real
grpc.aio server and the real containerd, under asyncio and under uvloop (the daemon's loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import subprocess
import sys
import tempfile
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import grpc
import grpc.aio
import hpack
import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.testbed import Containerd
from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_client import H2Channel, NotGrpcAnswer, RpcError, _Connection, status_of, timeout_header
from runtimeproxy.wire.grpc_framing import StatusCode
from runtimeproxy.wire.h2_peer import MAX_LITERAL_BLOCKS
from runtimeproxy.wire.hpack_literal import encode_literal_block

LIMIT = 1 << 20
METHOD = "/test.Echo/Call"


# -- a scripted server ------------------------------------------------------------------------


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # it takes everything: the write side never pauses


def parse_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of every frame the client wrote, after the preface."""
    assert data.startswith(frames.PREFACE)
    out, offset = [], len(frames.PREFACE)
    while offset < len(data):
        high, low, ftype, flags, stream_id = frames.FRAME_HEADER.unpack_from(data, offset)
        end = offset + frames.HEADER_LEN + (high << 8 | low)
        out.append((ftype, flags, stream_id, bytes(data[offset + frames.HEADER_LEN : end])))
        offset = end
    return out


def header_frames(stream_id: int, block: bytes, end_stream: bool, cuts: list[int], pad: int) -> bytes:
    """``block`` as HEADERS (padded by ``pad``) plus CONTINUATION frames cut at ``cuts``."""
    points = sorted({c for c in cuts if 0 < c < len(block)})
    pieces = [block[a:b] for a, b in zip([0, *points], [*points, len(block)], strict=True)]
    out = bytearray()
    for n, piece in enumerate(pieces):
        last = n == len(pieces) - 1
        flags = frames.FLAG_END_HEADERS if last else 0
        if n == 0:
            flags |= frames.FLAG_END_STREAM if end_stream else 0
            payload = piece
            if pad:
                flags |= frames.FLAG_PADDED
                payload = bytes([pad]) + piece + b"\0" * pad
            out += frames.frame(frames.HEADERS, flags, stream_id, payload)
        else:
            out += frames.frame(frames.CONTINUATION, flags, stream_id, piece)
    return bytes(out)


def data_frames(stream_id: int, body: bytes, cuts: list[int], pad: int) -> bytes:
    points = sorted({c for c in cuts if 0 < c < len(body)})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    out = bytearray()
    for piece in pieces:
        flags, payload = 0, piece
        if pad:
            flags, payload = frames.FLAG_PADDED, bytes([pad]) + piece + b"\0" * pad
        out += frames.frame(frames.DATA, flags, stream_id, payload)
    return bytes(out)


class Server:
    """Builds a server's bytes; its HPACK encoder keeps a dynamic table across answers."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()

    def block(self, headers: list[tuple[str, str]]) -> bytes:
        return bytes(self.encoder.encode(headers))

    def answer(self, stream_id: int, message: bytes, code: int = 0, text: str = "", **shape: Any) -> bytes:
        head = self.block([(":status", "200"), ("content-type", "application/grpc")])
        trailers = grpc_framing.status_headers(code, text, trailers_only=False)  # grpc-message percent-encoded
        return (
            header_frames(stream_id, head, False, shape.get("head_cuts", []), shape.get("pad", 0))
            + data_frames(
                stream_id, grpc_framing.encode_message(message), shape.get("data_cuts", []), shape.get("pad", 0)
            )
            + header_frames(stream_id, self.block(trailers), True, shape.get("trailer_cuts", []), 0)
        )


async def open_call(conn: _Connection, message: bytes = b"req") -> tuple[int, Any]:
    stream_id, call = conn.open_stream()
    await conn.send_request(stream_id, call, b"", grpc_framing.encode_message(message))
    return stream_id, call


def connected() -> tuple[_Connection, FakeTransport]:
    conn = _Connection("unix:///fake.sock", LIMIT)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def feed(conn: _Connection, data: bytes, cuts: list[int]) -> None:
    points = sorted({c for c in cuts if 0 < c < len(data)})
    for a, b in zip([0, *points], [*points, len(data)], strict=True):
        conn.data_received(data[a:b])


async def outcome(call: Any) -> bytes | tuple[int, str]:
    try:
        return bytes(await asyncio.wait_for(call.done, 1.0))
    except RpcError as exc:
        return int(exc.code()), exc.details()


# -- frame level ------------------------------------------------------------------------------

shapes = st.fixed_dictionaries({
    "head_cuts": st.lists(st.integers(0, 40), max_size=3),
    "data_cuts": st.lists(st.integers(0, 300), max_size=4),
    "trailer_cuts": st.lists(st.integers(0, 40), max_size=3),
    "pad": st.integers(0, 20),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    answers=st.lists(
        st.tuples(st.binary(max_size=300), st.sampled_from([0, 0, 5, 13, 99]), st.text(max_size=20), shapes),
        min_size=1,
        max_size=3,
    ),
    noise=st.lists(st.sampled_from(["ping", "settings", "priority", "unknown", "window"]), max_size=4),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
)
def test_any_framing_of_an_answer_gives_the_same_outcome(
    answers: list[tuple[bytes, int, str, dict[str, Any]]], noise: list[str], cuts: list[int]
) -> None:
    noise_frames = {
        "ping": frames.frame(frames.PING, 0, 0, b"12345678"),
        "settings": frames.settings({frames.SETTINGS_MAX_FRAME_SIZE: 20000}),
        "priority": frames.frame(frames.PRIORITY, 0, 1, b"\0\0\0\0\x10"),
        "unknown": frames.frame(0x42, 0, 3, b"whatever"),
        "window": frames.window_update(0, 1000),
    }

    async def run() -> None:
        conn, transport = connected()
        server = Server()
        wire = bytearray()
        calls = []
        for n, (message, code, text, shape) in enumerate(answers):
            stream_id, call = await open_call(conn)
            calls.append(call)
            wire += server.answer(stream_id, message, code, text, **shape)
            if n < len(noise):
                wire += noise_frames[noise[n]]
        feed(conn, bytes(wire), cuts)
        for (message, code, text, _), call in zip(answers, calls, strict=True):
            expected = message if code == 0 else (code if code in grpc_framing.CODE_NAMES else 2, text)
            assert await outcome(call) == expected
        written = parse_frames(bytes(transport.written))
        pings = sum(1 for ftype, flags, _, payload in written if ftype == frames.PING and flags == frames.FLAG_ACK)
        assert pings == sum(1 for n in noise[: len(answers)] if n == "ping")
        assert not conn.calls and conn.lost is None

    asyncio.run(run())


@settings(max_examples=200, deadline=None)
@given(garbage=st.binary(max_size=200), cuts=st.lists(st.integers(0, 200), max_size=4))
def test_garbage_from_the_server_ends_the_call_with_a_status(garbage: bytes, cuts: list[int]) -> None:
    """Whatever follows the response headers, the call ends with an answer or a status, or
    stays open for more; the client never raises out of the protocol."""

    async def run() -> None:
        conn, _ = connected()
        stream_id, call = await open_call(conn)
        head = Server().block([(":status", "200"), ("content-type", "application/grpc")])
        feed(conn, frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, stream_id, head) + garbage, cuts)
        conn.connection_lost(None)  # a call still open now ends too
        assert call.done.done()
        error = call.done.exception()
        assert error is None or isinstance(error, RpcError)

    asyncio.run(run())


async def test_literal_header_blocks_are_remembered_within_bounds() -> None:
    """Our server's answers are literal blocks, the same on every call: each decodes as at first,
    also after the remembered blocks were dropped for many different ones."""
    conn, _ = connected()
    head = encode_literal_block([(":status", "200"), ("content-type", "application/grpc")])
    for n in range(2 * MAX_LITERAL_BLOCKS + 3):
        stream_id, call = await open_call(conn)
        trailers = encode_literal_block([("grpc-status", "0"), ("x-call", str(n))])  # a new block each time
        feed(conn, header_frames(stream_id, head, False, [], 0) + data_frames(stream_id, grpc_framing.encode_message(
            b"m%d" % n), [], 0) + header_frames(stream_id, trailers, True, [], 0), [])
        assert await outcome(call) == b"m%d" % n
        assert len(conn._literal_blocks) <= MAX_LITERAL_BLOCKS
    assert conn._literal_blocks[head] == [(":status", "200"), ("content-type", "application/grpc")]


def stream_credits(transport: FakeTransport, stream_id: int) -> list[int]:
    return [int.from_bytes(p, "big") for t, _, s, p in parse_frames(bytes(transport.written))
            if t == frames.WINDOW_UPDATE and s == stream_id]


async def test_a_normal_response_costs_no_stream_window_update() -> None:
    """The stream window holds a whole message of the limit: nothing to credit, nothing written."""
    conn, transport = connected()
    stream_id, call = await open_call(conn)
    before = len(transport.written)
    body = b"x" * 5000
    feed(conn, Server().answer(stream_id, body, data_cuts=[1000, 2000], pad=50), [])
    assert await outcome(call) == body
    assert len(transport.written) == before  # not even a connection credit for so little


@settings(max_examples=50, deadline=None)
@given(body=st.binary(max_size=1000), size=st.integers(1, 200), pad=st.integers(100, 255))
def test_a_heavily_padded_response_is_credited_in_time(body: bytes, size: int, pad: int) -> None:
    """Padding counts against the stream window (RFC 9113 section 6.9.1): a server keeping to the
    window can send a response whose padding adds up to several windows, frame by frame."""
    async def run() -> None:
        conn = _Connection("unix:///fake.sock", 1000)  # stream window 1005
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        stream_id, call = await open_call(conn)
        server = Server()
        feed(conn, header_frames(stream_id, server.block([(":status", "200"), ("content-type", "application/grpc")]),
                                 False, [], 0), [])
        message = grpc_framing.encode_message(body)
        sent = 0
        for start in range(0, len(message), size):
            frame = data_frames(stream_id, message[start : start + size], [], pad)
            sent += len(frame) - frames.HEADER_LEN
            assert sent <= conn.window + sum(stream_credits(transport, stream_id)), "the server would stall"
            feed(conn, frame, [])
        feed(conn, header_frames(stream_id, server.block([("grpc-status", "0")]), True, [], 0), [])
        assert await outcome(call) == body

    asyncio.run(run())


async def test_connection_window_is_opened_to_the_message_limit() -> None:
    _, transport = connected()
    written = parse_frames(bytes(transport.written))
    settings_payload = next(p for t, f, _, p in written if t == frames.SETTINGS and not f)
    assert frames.parse_settings(settings_payload)[frames.SETTINGS_INITIAL_WINDOW_SIZE] == LIMIT + 5
    window = next(int.from_bytes(p, "big") for t, _, s, p in written if t == frames.WINDOW_UPDATE and s == 0)
    assert window == LIMIT + 5 - frames.DEFAULT_WINDOW


async def test_a_response_over_the_limit_is_resource_exhausted_and_reset() -> None:
    conn, transport = connected()
    stream_id, call = await open_call(conn)
    cuts = list(range(16_000, LIMIT + 6, 16_000))  # frames within the default maximum size
    feed(conn, Server().answer(stream_id, b"y" * (LIMIT + 1), data_cuts=cuts), [])
    code, details = await outcome(call)  # type: ignore[misc]
    assert code == StatusCode.RESOURCE_EXHAUSTED and str(LIMIT) in details
    resets = [s for t, _, s, p in parse_frames(bytes(transport.written)) if t == frames.RST_STREAM]
    assert resets == [stream_id]


async def test_request_waits_for_the_peers_window() -> None:
    conn, transport = connected()
    feed(conn, frames.settings({frames.SETTINGS_INITIAL_WINDOW_SIZE: 10}), [])
    stream_id, call = conn.open_stream()
    sending = asyncio.create_task(conn.send_request(stream_id, call, b"", b"z" * 25))
    await asyncio.sleep(0)
    sent = lambda: b"".join(p for t, _, s, p in parse_frames(bytes(transport.written)) if t == frames.DATA)  # noqa: E731
    assert sent() == b"z" * 10 and not sending.done()
    feed(conn, frames.window_update(stream_id, 100), [])
    await asyncio.wait_for(sending, 1.0)
    assert sent() == b"z" * 25
    last = [f for t, f, _, _ in parse_frames(bytes(transport.written)) if t == frames.DATA][-1]
    assert last & frames.FLAG_END_STREAM


@pytest.mark.parametrize(
    ("headers", "code", "details"),
    [
        ([(":status", "404"), ("content-type", "text/plain")], StatusCode.UNIMPLEMENTED,
         "HTTP 404 text/plain, not a gRPC answer"),
        ([(":status", "503")], StatusCode.UNAVAILABLE, "HTTP 503 without content-type, not a gRPC answer"),
        ([(":status", "418")], StatusCode.UNKNOWN, "HTTP 418 without content-type, not a gRPC answer"),
        ([(":status", "200"), ("content-type", "text/html")], StatusCode.UNKNOWN,
         "HTTP 200 text/html, not a gRPC answer"),
        ([("content-type", "text/html")], StatusCode.UNKNOWN, "no HTTP status text/html, not a gRPC answer"),
        ([(":status", "200"), ("content-type", "application/grpc")], StatusCode.INTERNAL, None),  # no grpc-status
        ([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "7"), ("grpc-message", "no%20way")],
         StatusCode.PERMISSION_DENIED, None),
        ([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "12")],
         StatusCode.UNIMPLEMENTED, None),
    ],
)
async def test_trailers_only_and_http_answers(
    headers: list[tuple[str, str]], code: StatusCode, details: str | None
) -> None:
    """An HTTP answer that is no gRPC answer is a NotGrpcAnswer saying what came (its code is gRPC's
    mapping of the HTTP status); a gRPC status, UNIMPLEMENTED included, is a plain RpcError."""
    conn, _ = connected()
    stream_id, call = await open_call(conn)
    feed(conn, header_frames(stream_id, Server().block(headers), True, [], 0), [])
    with pytest.raises(RpcError) as failed:
        await asyncio.wait_for(call.done, 1.0)
    assert failed.value.code() == code
    assert isinstance(failed.value, NotGrpcAnswer) is (details is not None)
    if isinstance(failed.value, NotGrpcAnswer):
        fields = dict(headers)
        assert failed.value.details() == details
        assert (failed.value.http_status, failed.value.content_type) == (
            fields.get(":status", ""), fields.get("content-type", "")
        )
    if code == StatusCode.PERMISSION_DENIED:
        assert failed.value.details() == "no way"


async def test_a_non_grpc_answer_with_a_body_ends_the_call_and_resets_the_stream() -> None:
    """HTTP 404 text/plain with a body (no END_STREAM on the headers): the call ends at the
    headers, and its stream is reset so the server stops sending."""
    conn, transport = connected()
    stream_id, call = await open_call(conn)
    block = Server().block([(":status", "404"), ("content-type", "text/plain")])
    feed(conn, header_frames(stream_id, block, False, [], 0), [])
    with pytest.raises(NotGrpcAnswer) as failed:
        await asyncio.wait_for(call.done, 1.0)
    assert failed.value.http_status == "404"
    resets = [s for t, _, s, p in parse_frames(bytes(transport.written)) if t == frames.RST_STREAM]
    assert resets == [stream_id] and stream_id not in conn.streams


@pytest.mark.parametrize(
    ("wire", "code", "usable"),
    [
        (lambda s: frames.rst_stream(s, frames.REFUSED_STREAM), StatusCode.UNAVAILABLE, True),
        (lambda s: frames.rst_stream(s, frames.CANCEL), StatusCode.CANCELLED, True),
        (lambda s: frames.rst_stream(s, frames.PROTOCOL_ERROR), StatusCode.INTERNAL, True),
        (lambda s: frames.frame(frames.DATA, frames.FLAG_END_STREAM, s, b""), StatusCode.INTERNAL, True),  # no headers
        (lambda s: frames.goaway(s - 1), StatusCode.UNAVAILABLE, False),  # never processed
        (lambda s: frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, s, b"\xff\xff\xff"), StatusCode.UNAVAILABLE,
         False),
        (lambda s: frames.frame(frames.PUSH_PROMISE, frames.FLAG_END_HEADERS, s, b"\0\0\0\2"), StatusCode.UNAVAILABLE,
         False),
        (lambda s: frames.frame(frames.CONTINUATION, frames.FLAG_END_HEADERS, s, b""), StatusCode.UNAVAILABLE, False),
    ],
)
async def test_resets_goaway_and_protocol_errors(wire: Callable[[int], bytes], code: StatusCode, usable: bool) -> None:
    conn, transport = connected()
    stream_id, call = await open_call(conn)
    feed(conn, wire(stream_id), [])
    got = await outcome(call)
    assert isinstance(got, tuple) and got[0] == code, got
    assert conn.usable == usable  # after GOAWAY or a broken connection, the next call opens a new one
    if transport.closed:  # a connection error: the peer was told why
        assert any(t == frames.GOAWAY for t, _, _, _ in parse_frames(bytes(transport.written)))


def test_the_daemon_loads_no_grpc() -> None:
    """The point of this client: the proxy daemon (its CLI with the relay, store and hook
    layer) never imports grpc, which costs about 9 MiB and six threads."""
    probe = "import sys, runtimeproxy.proxy.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'grpc'))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_timeout_header_fits_eight_digits() -> None:
    assert timeout_header(2.0) == "2000m"
    assert timeout_header(0.0001) == "1m"
    assert timeout_header(200_000.0) == "200000S"
    assert timeout_header(1e12) == "99999999H"


_UNITS_FINEST_FIRST = "mSMH"
_UNIT_SECONDS = {"m": 1e-3, "S": 1.0, "M": 60.0, "H": 3600.0}
_CLOSE = 1e-9  # relative slack for float products


@given(st.floats(min_value=-1.0, max_value=1e13, allow_nan=False))
def test_timeout_header_rounds_up_in_the_finest_unit_that_fits(seconds: float) -> None:
    text = timeout_header(seconds)
    value, unit = int(text[:-1]), text[-1]
    assert 1 <= value <= 99_999_999 and unit in _UNITS_FINEST_FIRST
    assert grpc_framing.parse_timeout(text) == value * _UNIT_SECONDS[unit]
    if text != "99999999H":  # not capped: never shorter than asked, and less than a unit more
        assert value * _UNIT_SECONDS[unit] >= seconds * (1 - _CLOSE)
        assert value == 1 or (value - 1) * _UNIT_SECONDS[unit] < seconds * (1 + _CLOSE)
    for finer in _UNITS_FINEST_FIRST[: _UNITS_FINEST_FIRST.index(unit)]:  # none would have fit
        assert seconds / _UNIT_SECONDS[finer] > 99_999_999 * (1 - _CLOSE)


def test_status_of_reads_ours_and_grpcs() -> None:
    theirs = grpc.aio.AioRpcError(grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone", None)
    assert status_of(theirs) == status_of(RpcError(5, "gone")) == StatusCode.NOT_FOUND
    assert status_of(ValueError("x")) is None
    assert RpcError(99, "odd").code() == StatusCode.UNKNOWN


# -- against a real grpc.aio server, under asyncio and uvloop ---------------------------------------


def both_loops(test: Callable[..., Coroutine[Any, Any, None]]) -> Any:
    """Run the coroutine test once on asyncio's loop and once on uvloop."""

    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def run(loop: str, *args: Any, **kwargs: Any) -> None:
        (uvloop.run if loop == "uvloop" else asyncio.run)(test(*args, **kwargs))

    run.__name__ = test.__name__
    return run


class EchoServer:
    """A grpc.aio server whose one method does what ``behaviour`` says with the request."""

    def __init__(self, path: str, options: list[tuple[str, Any]] | None = None) -> None:
        self.path = path
        self.extra_options = options or []
        self.behaviour: Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[bytes]] = self._echo
        self.cancelled = asyncio.Event()
        self.server: grpc.aio.Server | None = None

    @staticmethod
    async def _echo(request: bytes, context: Any) -> bytes:
        return request

    async def _handle(self, request: bytes, context: Any) -> bytes:
        try:
            return await self.behaviour(request, context)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def start(self) -> None:
        handler = grpc.method_handlers_generic_handler(
            "test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(self._handle)}
        )
        options = [("grpc.max_send_message_length", 8 << 20), ("grpc.max_receive_message_length", 8 << 20),
                   *self.extra_options]
        self.server = grpc.aio.server(options=options)
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port("unix://" + self.path)
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)


@contextlib.asynccontextmanager
async def echo_server(options: list[tuple[str, Any]] | None = None) -> AsyncIterator[tuple[EchoServer, H2Channel]]:
    with tempfile.TemporaryDirectory(prefix="h2c-") as tmp:
        server = EchoServer(os.path.join(tmp, "echo.sock"), options)
        await server.start()
        channel = H2Channel(server.path, max_message_size=4 << 20)
        try:
            yield server, channel
        finally:
            await channel.close()
            await server.stop()


@both_loops
async def test_calls_errors_and_large_answers_against_grpc() -> None:
    async with echo_server() as (server, channel):
        assert await channel.unary(METHOD, b"hello", 5) == b"hello"
        answers = await asyncio.gather(*(channel.unary(METHOD, bytes([n]) * n, 5) for n in range(30)))
        assert answers == [bytes([n]) * n for n in range(30)]
        big = os.urandom(3 << 20)  # far over the default 64 KiB windows, both ways
        assert await channel.unary(METHOD, big, 10) == big

        async def fail(request: bytes, context: Any) -> bytes:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "naïve 100% wrong")
            return b""

        server.behaviour = fail
        with pytest.raises(RpcError) as failed:
            await channel.unary(METHOD, b"x", 5)
        assert (failed.value.code(), failed.value.details()) == (StatusCode.FAILED_PRECONDITION, "naïve 100% wrong")
        with pytest.raises(RpcError) as unknown:
            await channel.unary("/test.Echo/Nope", b"", 5)
        assert unknown.value.code() == StatusCode.UNIMPLEMENTED

        async def too_big(request: bytes, context: Any) -> bytes:
            return b"b" * (5 << 20)

        server.behaviour = too_big
        with pytest.raises(RpcError) as exhausted:
            await channel.unary(METHOD, b"", 5)
        assert exhausted.value.code() == StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(RpcError) as refused:
            await channel.unary(METHOD, b"r" * (5 << 20), 5)
        assert refused.value.code() == StatusCode.RESOURCE_EXHAUSTED
        server.behaviour = server._echo
        assert await channel.unary(METHOD, b"still fine", 5) == b"still fine"


@both_loops
async def test_deadline_and_cancellation_reach_the_server() -> None:
    async with echo_server() as (server, channel):

        async def hang(request: bytes, context: Any) -> bytes:
            await asyncio.sleep(30)
            return b""

        server.behaviour = hang
        with pytest.raises(RpcError) as late:
            await channel.unary(METHOD, b"", 0.2)
        assert late.value.code() == StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(server.cancelled.wait(), 5)

        server.cancelled.clear()
        task = asyncio.ensure_future(channel.unary(METHOD, b"", 30))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.cancelled.wait(), 5)
        server.behaviour = server._echo
        assert await channel.unary(METHOD, b"after", 5) == b"after"


@both_loops
async def test_unavailable_while_down_and_reconnects_after() -> None:
    async with echo_server() as (server, channel):
        assert await channel.unary(METHOD, b"1", 5) == b"1"
        await server.stop()
        with pytest.raises(RpcError) as down:
            await channel.unary(METHOD, b"2", 5)
        assert down.value.code() == StatusCode.UNAVAILABLE and server.path in down.value.details()
        await server.start()
        assert await channel.unary(METHOD, b"3", 5) == b"3"


@both_loops
async def test_calls_wait_for_a_stream_when_the_server_limits_them() -> None:
    """Past the server's SETTINGS_MAX_CONCURRENT_STREAMS calls queue, as grpc-core's do,
    instead of being refused."""
    async with echo_server([("grpc.max_concurrent_streams", 2)]) as (server, channel):
        running = 0
        most = 0

        async def slow(request: bytes, context: Any) -> bytes:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.05)
            running -= 1
            return request

        server.behaviour = slow
        assert await channel.unary(METHOD, b"first", 5) == b"first"  # the server's SETTINGS are in
        answers = await asyncio.gather(*(channel.unary(METHOD, bytes([n]), 5) for n in range(8)))
        assert answers == [bytes([n]) for n in range(8)] and most == 2


@both_loops
async def test_close_with_grace_lets_calls_in_flight_finish() -> None:
    async with echo_server() as (server, channel):

        async def slow(request: bytes, context: Any) -> bytes:
            await asyncio.sleep(0.2)
            return request

        server.behaviour = slow
        in_flight = asyncio.ensure_future(channel.unary(METHOD, b"late", 5))
        await asyncio.sleep(0.05)
        await channel.close(grace=5)
        assert await in_flight == b"late"
        cut = asyncio.ensure_future(channel.unary(METHOD, b"cut", 5))
        await asyncio.sleep(0.05)
        await channel.close()  # no grace: the call ends now
        with pytest.raises(RpcError) as closed:
            await cut
        assert closed.value.code() == StatusCode.UNAVAILABLE


# -- against the real containerd ------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("loop", ["uvloop"])
def test_containerd_answers_the_client(containerd: Containerd, loop: str) -> None:
    async def run() -> None:
        channel = H2Channel(str(containerd.socket), max_message_size=16 << 20)
        try:
            raw = await channel.unary("/runtime.v1.RuntimeService/Version", pb.VersionRequest().SerializeToString(), 5)
            assert pb.VersionResponse.FromString(raw).runtime_name == "containerd"
            request = pb.PodSandboxStatusRequest(pod_sandbox_id="f" * 64).SerializeToString()
            with pytest.raises(RpcError) as missing:
                await channel.unary("/runtime.v1.RuntimeService/PodSandboxStatus", request, 5)
            assert missing.value.code() == StatusCode.NOT_FOUND
            listed = await asyncio.gather(
                *(channel.unary("/runtime.v1.RuntimeService/ListContainers", b"", 5) for _ in range(16))
            )
            assert len({bytes(x) for x in listed}) == 1
        finally:
            await channel.close()

    uvloop.run(run())


@pytest.mark.parametrize(("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)])
async def test_a_compressed_response_is_read_by_its_headers_grpc_encoding(
    encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    """grpc-encoding comes in the response headers (PROTOCOL-HTTP2 "Responses"), not the trailers."""
    conn, _ = connected()
    stream_id, call = await open_call(conn)
    server = Server()
    head = server.block([(":status", "200"), ("content-type", "application/grpc"), ("grpc-encoding", encoding)])
    feed(conn, header_frames(stream_id, head, False, [], 0)
         + data_frames(stream_id, grpc_framing.encode_message(compress(b"squeezed"), compressed=True), [], 0)
         + header_frames(stream_id, server.block([("grpc-status", "0")]), True, [], 0), [])
    assert await outcome(call) == b"squeezed"
