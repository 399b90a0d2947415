"""The relay's frame loop on its own: one RelayConnection between two in-memory transports.

Calls with header blocks split into CONTINUATIONs, padding and priority fields, responses in
several (padded) DATA frames, frames the relay has no handler for (PRIORITY, an unknown
extension type), PINGs and PING ACKs from both sides, every byte stream cut into arbitrary
reads: with no interceptor the relay forwards both directions byte for byte but for PINGs
(which it answers itself and never forwards) and still learns each call's method and status.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import hpack
import pytest
from fake_runtime import grpc_request_headers
from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy.relay.call_interceptor import PassThrough
from runtimeproxy.relay.connection import Backends, RelayConnection, RelayOptions
from runtimeproxy.relay.methods import MethodInfo, MethodTable
from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import encode_message

UNKNOWN_FRAME_TYPE = 0xB  # receivers must ignore extension frames (RFC 9113 section 4.1)
PATHS = ["/runtime.v1.RuntimeService/Version", "/runtime.v1.RuntimeService/ListContainers", "/future.Svc/Call"]


class Sink:
    """Stands in for an asyncio transport: keeps what the relay writes."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes | memoryview) -> None:
        self.data += data

    def writelines(self, pieces: list[bytes | memoryview]) -> None:
        for piece in pieces:
            self.data += piece

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


class Relay:
    """A RelayConnection whose backend connection is settled, with a transport on each side."""

    def __init__(self, max_message_size: int = 1 << 20) -> None:
        self.observed: list[tuple[str, int, str]] = []
        options = RelayOptions(Backends("/unused"), MethodTable(), PassThrough(), self._observe, max_message_size)
        self.conn = RelayConnection(options, lambda _conn: None)
        self.to_client, self.to_backend = Sink(), Sink()
        self.conn.side_made(False, self.to_backend)  # type: ignore[arg-type]
        # What side_made(True) and the backend connection it starts would leave behind.
        self.conn.client_transport = self.conn.u2c.transport = self.to_client  # type: ignore[assignment]
        self.conn.early = None

    def _observe(self, method: MethodInfo, code: int, message: str, seconds: float, hooked: bool) -> None:
        self.observed.append((method.path, code, message))


def header_frames(sid: int, block: bytes, end_stream: bool, cut: int, pad: int | None, priority: bool) -> bytes:
    """``block`` as HEADERS (padded, with a priority field) and a CONTINUATION from ``cut`` on."""
    first, rest = block[:cut], block[cut:]
    flags = frames.FLAG_END_STREAM if end_stream else 0
    payload = first
    if priority:
        flags |= frames.FLAG_PRIORITY
        payload = b"\x00\x00\x00\x00\x10" + payload
    if pad is not None:
        flags |= frames.FLAG_PADDED
        payload = bytes([pad]) + payload + b"\x00" * pad
    if not rest:
        return frames.frame(frames.HEADERS, flags | frames.FLAG_END_HEADERS, sid, payload)
    return frames.frame(frames.HEADERS, flags, sid, payload) + frames.frame(
        frames.CONTINUATION, frames.FLAG_END_HEADERS, sid, rest
    )


def data_frames(sid: int, body: bytes, pieces: int, pad: int | None, end_stream: bool) -> bytes:
    step = max(1, -(-len(body) // pieces))
    chunks = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    out = b""
    for i, chunk in enumerate(chunks):
        flags = frames.FLAG_END_STREAM if end_stream and i == len(chunks) - 1 else 0
        if pad is not None:
            flags |= frames.FLAG_PADDED
            chunk = bytes([pad]) + chunk + b"\x00" * pad
        out += frames.frame(frames.DATA, flags, sid, chunk)
    return out


def reads(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@dataclass(frozen=True)
class Call:
    path: str
    request: bytes
    response: bytes
    pieces: int  # DATA frames the response comes in
    code: int
    message: str
    status: str  # grpc-status in the trailers: "sent", "missing" or "repeated"
    cut: int  # where the request's header block continues in a CONTINUATION
    pad: int | None  # padding of the request's HEADERS and of every DATA frame
    priority: bool
    extras: bool  # frames without a handler around the call, WINDOW_UPDATEs and PINGs

    def trailers(self) -> tuple[list[tuple[str, str]], int, str]:
        """The trailers the backend sends, and the (code, message) the relay must learn."""
        fields = grpc_framing.status_headers(self.code, self.message, trailers_only=False)
        if self.status == "missing":
            return [f for f in fields if f[0] != "grpc-status"], grpc_framing.UNKNOWN, self.message
        if self.status == "repeated":  # the last one counts
            return [("grpc-status", "3"), *fields], self.code, self.message
        return fields, self.code, self.message


calls = st.lists(
    st.builds(
        Call,
        path=st.sampled_from(PATHS),
        request=st.binary(max_size=300),
        response=st.binary(max_size=3000),
        pieces=st.integers(1, 4),
        code=st.sampled_from([0, 5, 13, 14]),
        message=st.sampled_from(["", "gone", "50% done", "naïve\nline", "%"]),
        status=st.sampled_from(["sent", "missing", "repeated"]),
        cut=st.integers(0, 200),
        pad=st.none() | st.integers(0, 30),
        priority=st.booleans(),
        extras=st.booleans(),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(calls=calls, client_cuts=st.lists(st.integers(0, 1 << 16)), backend_cuts=st.lists(st.integers(0, 1 << 16)))
def test_relays_every_byte_unchanged_and_learns_each_status(
    calls: list[Call], client_cuts: list[int], backend_cuts: list[int]
) -> None:
    client_enc, backend_enc = hpack.Encoder(), hpack.Encoder()
    upward = bytearray(frames.PREFACE + frames.settings({frames.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 20}))
    downward = bytearray(frames.settings() + frames.settings_ack())
    # What each peer gets: the other's bytes without PINGs, and the relay's answers to its own.
    to_backend, to_client = bytearray(upward), bytearray(downward)
    acks_to_client, acks_to_backend = bytearray(), bytearray()
    expected = []
    for n, call in enumerate(calls):
        sid = 2 * n + 1
        block = client_enc.encode(grpc_request_headers(call.path, [("grpc-timeout", "119999m")]))
        request = header_frames(sid, block, False, call.cut % (len(block) + 1), call.pad, call.priority)
        request += data_frames(sid, encode_message(call.request), 1, call.pad, end_stream=True)
        upward += request
        to_backend += request
        if call.extras:
            ping = f"client{n:02d}".encode()
            upward += frames.frame(frames.PING, 0, 0, ping) + frames.frame(frames.PING, frames.FLAG_ACK, 0, b"ack ping")
            acks_to_client += frames.ping_ack(ping)
            extra = frames.window_update(sid, 100) + frames.frame(frames.PRIORITY, 0, sid, b"\x00\x00\x00\x00\x10")
            upward += extra
            to_backend += extra
            extra = frames.frame(UNKNOWN_FRAME_TYPE, 0xFF, sid, b"ignored") + frames.window_update(0, 100)
            downward += extra
            to_client += extra
            ping = f"backe{n:03d}".encode()
            downward += frames.frame(frames.PING, frames.FLAG_ACK, 0, b"ack ping")
            downward += frames.frame(frames.PING, 0, 0, ping)
            acks_to_backend += frames.ping_ack(ping)
        fields, code, message = call.trailers()
        response = backend_enc.encode([(":status", "200"), ("content-type", "application/grpc")])
        response_frames = frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, response)
        response_frames += data_frames(sid, encode_message(call.response), call.pieces, call.pad, end_stream=False)
        response_frames += header_frames(sid, backend_enc.encode(fields), True, 3, None, False)
        downward += response_frames
        to_client += response_frames
        expected.append((call.path, code, message))
    relay = Relay()
    for chunk in reads(bytes(upward), client_cuts):
        relay.conn.client_data(chunk)
    for chunk in reads(bytes(downward), backend_cuts):
        relay.conn.upstream_data(chunk)
    # All client reads come first, so the answers to its PINGs reach it before any response.
    assert relay.to_backend.data == to_backend + acks_to_backend
    assert relay.to_client.data == acks_to_client + to_client
    assert relay.observed == expected
    assert relay.conn.active_calls == 0


@given(
    body=st.binary(max_size=300),
    pad=st.none() | st.integers(0, 255),
    before=st.binary(max_size=20),
    after=st.binary(max_size=20),
)
def test_data_bounds_work_in_place_inside_a_larger_read(
    body: bytes, pad: int | None, before: bytes, after: bytes
) -> None:
    flags, payload = 0, body
    if pad is not None:
        flags, payload = frames.FLAG_PADDED, bytes([pad]) + body + b"\x00" * pad
    buffer = before + payload + after
    start = len(before)
    lo, hi = frames.data_bounds(flags, buffer, start, start + len(payload))
    assert buffer[lo:hi] == body


@pytest.mark.parametrize("payload", [b"", b"\x01", b"\x05abc", b"\xff" + bytes(10)])
def test_malformed_padding_carries_no_data(payload: bytes) -> None:
    buffer = b"xx" + payload + b"\x05next frame"
    assert frames.data_bounds(frames.FLAG_PADDED, buffer, 2, 2 + len(payload)) == (2 + len(payload),) * 2


@pytest.mark.parametrize("payload", [b"", b"\x09short"])
def test_a_malformed_padded_data_frame_is_forwarded_unchanged_and_the_relay_goes_on(payload: bytes) -> None:
    """The receiver refuses such a frame (RFC 9113 section 6.1); the relay neither fails nor
    miscounts: the call's other frames and the next call pass as usual."""
    relay = Relay()
    path = PATHS[0]
    block = hpack.Encoder().encode(grpc_request_headers(path))
    bad = frames.frame(frames.DATA, frames.FLAG_PADDED, 1, payload)
    wire = (frames.PREFACE + frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, 1, block) + bad
            + frames.frame(frames.DATA, frames.FLAG_END_STREAM, 1, encode_message(b"")))
    relay.conn.client_data(wire)
    assert bytes(relay.to_backend.data).endswith(wire[len(frames.PREFACE):])
