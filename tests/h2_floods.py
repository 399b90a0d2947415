"""HTTP/2 floods as a hostile peer sends them, and a raw socket peer that sends one without
reading: what the flood tests of the relay, our gRPC client and server and the daemons share.

Each flood in `FLOODS` is far past the default limits (wire.peer_limits), in frames no
kubelet, containerd or hook server sends, and names the limit it must trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from runtimeproxy.wire import frames
from runtimeproxy.wire.hpack_literal import encode_literal_block
from runtimeproxy.wire.peer_limits import DEFAULT_LIMITS, LimitSettings, Rate, exceeded_counts

VERSION = "/runtime.v1.RuntimeService/Version"
LIMIT_EVENT = "closing the HTTP/2 connection: the peer went over a limit"
Frame = tuple[int, int, int, bytes]  # type, flags, stream id, payload


def request_block(path: str = VERSION) -> bytes:
    """A gRPC request's header block in HPACK literals (any decoder reads it, no table involved)."""
    return encode_literal_block([
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
        ("content-type", "application/grpc"), ("te", "trailers"),
    ])  # fmt: skip


def ping_flood(count: int = 3 * DEFAULT_LIMITS.pings.burst) -> bytes:
    return frames.frame(frames.PING, 0, 0, b"flooding") * count


def settings_flood(count: int = 3 * DEFAULT_LIMITS.settings.burst) -> bytes:
    return frames.settings() * count


def settings_entries_flood() -> bytes:
    """One SETTINGS frame with more entries than any peer sends (the same setting repeated)."""
    entry = frames.SETTINGS_INITIAL_WINDOW_SIZE.to_bytes(2, "big") + (65_535).to_bytes(4, "big")
    return frames.frame(frames.SETTINGS, 0, 0, entry * (DEFAULT_LIMITS.settings_entries + 1))


def rapid_reset_flood(first_stream: int = 1, count: int = 3 * DEFAULT_LIMITS.resets.burst) -> bytes:
    """Calls opened and reset at once (CVE-2023-44487)."""
    block = request_block()
    return b"".join(
        frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, block) + frames.rst_stream(sid, frames.CANCEL)
        for sid in range(first_stream, first_stream + 2 * count, 2)
    )


def empty_data_flood(first_stream: int = 1, count: int = 3 * DEFAULT_LIMITS.empty_frames.burst) -> bytes:
    """A call opened, then DATA frames that carry nothing and end nothing (CVE-2019-9518)."""
    opening = frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, first_stream, request_block())
    return opening + frames.frame(frames.DATA, 0, first_stream, b"") * count


def empty_headers_flood(first_stream: int = 1, count: int = 3 * DEFAULT_LIMITS.empty_frames.burst) -> bytes:
    """HEADERS frames with an empty header block, one stream each."""
    return b"".join(
        frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, b"")
        for sid in range(first_stream, first_stream + 2 * count, 2)
    )


def continuation_flood(first_stream: int = 1, count: int = 100_000) -> bytes:
    """A header block that never ends: empty CONTINUATION frames after its HEADERS (CVE-2024-27316)."""
    opening = frames.frame(frames.HEADERS, 0, first_stream, request_block())
    return opening + frames.frame(frames.CONTINUATION, 0, first_stream, b"") * count


def continuation_rate_flood(first_stream: int = 1) -> bytes:
    """Header blocks that each end within the per-block limit, but so many CONTINUATIONs in all
    that the per-connection rate is passed."""
    per_block = DEFAULT_LIMITS.continuations_per_block - 1
    blocks = 3 * DEFAULT_LIMITS.continuations.burst // per_block
    block = request_block()
    return b"".join(
        frames.frame(frames.HEADERS, frames.FLAG_END_STREAM, sid, block)
        + frames.frame(frames.CONTINUATION, 0, sid, b"") * (per_block - 1)
        + frames.frame(frames.CONTINUATION, frames.FLAG_END_HEADERS, sid, b"")
        for sid in range(first_stream, first_stream + 2 * blocks, 2)
    )


@dataclass(frozen=True)
class Flood:
    make: Callable[[int], bytes]  # the frames, from the first stream id the flood may use
    limit: str  # the limit it trips (peer_limits.LIMIT_NAMES)


FLOODS: dict[str, Flood] = {
    "PING": Flood(lambda _sid: ping_flood(), "ping"),
    "SETTINGS": Flood(lambda _sid: settings_flood(), "settings"),
    "SETTINGS entries": Flood(lambda _sid: settings_entries_flood(), "settings_entries"),
    "rapid reset": Flood(rapid_reset_flood, "rst_stream"),
    "empty DATA": Flood(empty_data_flood, "empty_frames"),
    "empty HEADERS": Flood(empty_headers_flood, "empty_frames"),
    "CONTINUATION in one block": Flood(continuation_flood, "continuations_per_block"),
    "CONTINUATION over time": Flood(continuation_rate_flood, "continuation"),
}


def parse(data: bytes) -> list[Frame]:
    """The whole frames in ``data`` (after the client preface, if it starts with one)."""
    out, offset = [], len(frames.PREFACE) if data.startswith(frames.PREFACE) else 0
    while offset + frames.HEADER_LEN <= len(data):
        high, low, ftype, flags, sid = frames.FRAME_HEADER.unpack_from(data, offset)
        end = offset + frames.HEADER_LEN + (high << 8 | low)
        if end > len(data):
            break
        out.append((ftype, flags, sid & frames.MAX_STREAM_ID, bytes(data[offset + frames.HEADER_LEN : end])))
        offset = end
    return out


def goaway_codes(received: list[Frame]) -> list[int]:
    """The error code of every GOAWAY among ``received``."""
    return [int.from_bytes(payload[4:8], "big") for ftype, _, _, payload in received if ftype == frames.GOAWAY]


def exceeded(peer: str, limit: str) -> int:
    """How often peers of kind ``peer`` went over ``limit`` in this process so far."""
    return exceeded_counts().get((peer, limit), 0)


def limit_events(records: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    """(peer kind, limit) of each log record of a peer cut off for a limit."""
    return [(r.get("peer_kind"), r.get("limit")) for r in records if r.get("event") == LIMIT_EVENT]


def rss(pid: int | None = None) -> int:
    """The resident memory of process ``pid`` (this one by default), in bytes."""
    with open(f"/proc/{pid or os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def listening(path: str) -> socket.socket:
    """A non-blocking unix socket listening at ``path`` (mode 0600), bound before it returns."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen()
    listener.setblocking(False)
    return listener


class Flooder:
    """A raw peer on a unix socket that floods without reading, with the smallest receive
    buffer the kernel allows, and reads what it got only afterwards."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.received = bytearray()

    @classmethod
    async def connect(cls, path: str) -> Flooder:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, path)
        return cls(sock)

    @classmethod
    def of(cls, sock: socket.socket) -> Flooder:
        """A flooder on an accepted socket (a server that floods its client)."""
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        sock.setblocking(False)
        return cls(sock)

    async def flood(self, data: bytes, stall: float = 0.5) -> int:
        """Send ``data`` as fast as the socket takes it, never reading; stop when the other end
        closes or has taken nothing for ``stall`` seconds. The bytes sent."""
        view, sent, waited = memoryview(data), 0, 0.0
        while sent < len(data) and waited < stall:
            try:
                count = self.sock.send(view[sent : sent + 65536])
            except BlockingIOError:
                await asyncio.sleep(0.01)
                waited += 0.01
                continue
            except OSError:  # closed on us (EPIPE, ECONNRESET)
                break
            sent += count
            waited = 0.0
            await asyncio.sleep(0)
        return sent

    async def read_to_end(self, timeout: float = 10.0) -> list[Frame]:
        """Everything the other end sends until it closes, as frames."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while True:
                try:
                    chunk = await loop.sock_recv(self.sock, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                self.received += chunk
        return parse(bytes(self.received))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


# -- what a hostile peer may send, for property tests ----------------------------------------------

# Small limits, so that a short random sequence reaches them; no refill worth speaking of.
TIGHT_LIMITS = LimitSettings(
    pings=Rate(40, 0.001),
    settings=Rate(5, 0.001),
    settings_entries=4,
    resets=Rate(10, 0.001),
    empty_frames=Rate(10, 0.001),
    continuations=Rate(20, 0.001),
    continuations_per_block=5,
    queued_answers=10,
    write_buffer_high=256,
    write_buffer_low=64,
)
STREAM_IDS = (0, 1, 2, 3, 5, 7)


def hostile_frames(request: bytes) -> st.SearchStrategy[bytes]:
    """One frame, or a run of the same frame: random ones, and the frames floods are made of
    (``request``: a header block the receiver decodes)."""
    streams = st.sampled_from(STREAM_IDS)
    raw = st.builds(frames.frame, st.integers(0, 12), st.integers(0, 255), streams, st.binary(max_size=40))
    settings_entries = st.binary(min_size=6, max_size=6).map(lambda e: e[:1] + b"\x04" + e[2:])  # window sizes
    shaped = st.one_of(
        st.builds(lambda p, ack: frames.frame(frames.PING, frames.FLAG_ACK if ack else 0, 0, p),
                  st.binary(min_size=8, max_size=8), st.booleans()),
        st.just(frames.settings()),
        st.just(frames.settings_ack()),
        st.lists(settings_entries, max_size=8).map(lambda es: frames.frame(frames.SETTINGS, 0, 0, b"".join(es))),
        st.builds(frames.rst_stream, streams.filter(bool), st.sampled_from([frames.CANCEL, frames.NO_ERROR])),
        st.builds(lambda sid, end: frames.frame(frames.DATA, frames.FLAG_END_STREAM if end else 0, sid, b""),
                  streams, st.booleans()),
        st.builds(lambda sid, body: frames.frame(frames.DATA, frames.FLAG_END_STREAM, sid, body),
                  streams, st.binary(max_size=30)),
        st.builds(lambda sid, flags: frames.frame(frames.HEADERS, flags, sid, request), streams,
                  st.sampled_from([0, frames.FLAG_END_HEADERS, frames.FLAG_END_HEADERS | frames.FLAG_END_STREAM])),
        st.builds(lambda sid: frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, b""), streams),
        st.builds(lambda sid, end: frames.frame(frames.CONTINUATION, frames.FLAG_END_HEADERS if end else 0, sid, b""),
                  streams, st.booleans()),
        st.builds(frames.window_update, streams, st.integers(1, 1 << 20)),
        st.builds(lambda sid: frames.frame(frames.PRIORITY, 0, sid, b"\x00\x00\x00\x00\x10"), streams),
    )
    return st.tuples(st.one_of(raw, shaped), st.integers(1, 50)).map(lambda run: run[0] * run[1])


class FloodingServer:
    """A gRPC server (a hook server, a runtime) that reads the first call's request, then sends
    ``flood`` and never reads again; afterwards it reads what came back, to the close."""

    def __init__(self, path: str, flood: bytes) -> None:
        self.listener = listening(path)
        self.flood = flood
        self.received: list[Frame] = []
        self.done = asyncio.Event()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        with self.listener:
            conn, _ = await loop.sock_accept(self.listener)
        conn.setblocking(False)
        await loop.sock_sendall(conn, frames.settings())
        data = b""
        while not any(t == frames.DATA and f & frames.FLAG_END_STREAM for t, f, _, _ in parse(data)):
            data += await loop.sock_recv(conn, 65536)  # up to the end of the call's request
        flooder = Flooder.of(conn)
        try:
            await flooder.flood(self.flood)
            self.received = await flooder.read_to_end()
        finally:
            flooder.close()
            self.done.set()


@contextlib.asynccontextmanager
async def flooding_server(path: str, flood: bytes) -> AsyncIterator[FloodingServer]:
    """A `FloodingServer` serving at ``path`` for the duration of the block."""
    server = FloodingServer(path, flood)
    task = asyncio.get_running_loop().create_task(server.serve())
    try:
        yield server
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        server.listener.close()
