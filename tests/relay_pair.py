"""A RelayConnection between two in-memory transports that count the relay's writes.

Each write() or writelines() call on a real (uvloop) transport is one syscall, and one
wake-up of the peer reading it: tests of how the relay batches and parks its writes count them.
"""

from __future__ import annotations

import hpack
from fake_runtime import grpc_request_headers

from runtimeproxy.relay.call_interceptor import CallInterceptor, PassThrough
from runtimeproxy.relay.connection import Backends, RelayConnection, RelayOptions
from runtimeproxy.relay.methods import MethodInfo, MethodTable
from runtimeproxy.wire import frames
from runtimeproxy.wire.grpc_framing import encode_message

VERSION = "/runtime.v1.RuntimeService/Version"


class CountingTransport:
    """An asyncio transport stand-in that keeps what each write() or writelines() call passed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | memoryview) -> None:
        self.writes.append(bytes(data))

    def writelines(self, pieces: list[bytes | memoryview]) -> None:
        self.writes.append(b"".join(pieces))

    @property
    def data(self) -> bytes:
        return b"".join(self.writes)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default  # no socket behind it


class Pair:
    """A RelayConnection with its backend connection settled and a counting transport each way."""

    def __init__(self, max_message_size: int = 1 << 20, interceptor: CallInterceptor | None = None) -> None:
        self.observed: list[tuple[str, int]] = []
        options = RelayOptions(
            Backends("/unused"), MethodTable(), interceptor or PassThrough(), self._observe, max_message_size
        )
        self.conn = RelayConnection(options, lambda _conn: None)
        self.client, self.backend = CountingTransport(), CountingTransport()
        self.conn.side_made(False, self.backend)  # type: ignore[arg-type]
        self.conn.client_transport = self.conn.u2c.transport = self.client  # type: ignore[assignment]
        self.conn.early = None
        self.conn.client_data(frames.PREFACE)
        self.backend.writes.clear()
        self.encoder = hpack.Encoder()

    def _observe(self, method: MethodInfo, code: int, message: str, seconds: float, hooked: bool) -> None:
        self.observed.append((method.path, code))

    def headers(self, sid: int, path: str = VERSION, *, end_headers: bool = True) -> bytes:
        block = self.encoder.encode(grpc_request_headers(path))
        return frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS if end_headers else 0, sid, block)

    def request(self, sid: int, body: bytes = b"", *, end_headers: bool = True, path: str = VERSION) -> bytes:
        """A unary request (HEADERS and one DATA frame), or HEADERS alone that a CONTINUATION must end."""
        headers = self.headers(sid, path, end_headers=end_headers)
        return headers + message(sid, body) if end_headers else headers


def message(sid: int, body: bytes, end_stream: bool = True) -> bytes:
    """One DATA frame carrying ``body`` as one gRPC message."""
    return frames.frame(frames.DATA, frames.FLAG_END_STREAM if end_stream else 0, sid, encode_message(body))
