"""A CRI runtime of our own for relay tests: what containerd 1.6 cannot be made to show.

``FakeRuntime`` is a grpc.aio server with the generated RuntimeService and ImageService
servicers plus a generic handler for a method our proto does not know. It records every
call it receives (decoded request, metadata, ``time_remaining()``) and lets a test decide:

* when each message of a server stream is sent (``StreamControl``: a queue per method),
  and see the handler start, finish or get cancelled;
* how a call fails (``Failure``: code, details, trailing metadata, grpc-status-details-bin);
* how big a response is (``ContainerStatus`` with ``container_id="size:<bytes>"``) and how
  many containers ``ListContainers`` returns (``label_selector={"count": "<n>"}``);
* how long a call takes (``ExecSync`` with ``cmd=["sleep", "<seconds>"]``).

``ProxyUnderTest`` runs ``ProxyServer`` in-process in front of one or two fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import grpc
import hpack
from google.protobuf.message import Message
from unix_server import UnixServer

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.api.runtime.v1 import api_pb2_grpc as pb_grpc
from runtimeproxy.proxy.metrics import CallMetrics
from runtimeproxy.proxy.server import DEFAULT_MAX_MESSAGE, ProxyServer, ProxySettings
from runtimeproxy.relay.call_interceptor import CallInterceptor
from runtimeproxy.wire import frames, grpc_framing

MiB = 1024 * 1024
FUTURE_METHOD = "/runtime.v1.RuntimeService/FutureCall"
# What a test's client (and the fake) accept: above the proxy's default limit.
BIG_MESSAGE_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", 64 * MiB),
    ("grpc.max_receive_message_length", 64 * MiB),
    ("grpc.max_metadata_size", MiB),
    ("grpc.absolute_max_metadata_size", MiB),
]
BIG_METADATA_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_metadata_size", MiB),
    ("grpc.absolute_max_metadata_size", MiB),
]
CLIENT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", 16 * MiB),
    ("grpc.max_receive_message_length", 16 * MiB),
]

MetadataList = list[tuple[str, str | bytes]]


# -- google.rpc.Status, hand-encoded (grpcio-status is not installed) --------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def rpc_status_bytes(code: int, message: str, details: Sequence[tuple[str, bytes]] = ()) -> bytes:
    """A serialized google.rpc.Status {code, message, details: [Any{type_url, value}]}."""
    out = bytearray()
    if code:
        out += _varint(1 << 3 | 0) + _varint(code)
    if message:
        out += _len_field(2, message.encode())
    for type_url, value in details:
        out += _len_field(3, _len_field(1, type_url.encode()) + _len_field(2, value))
    return bytes(out)


# -- what the fake records and how tests steer it ---------------------------------------------


@dataclass
class Received:
    """One call as the fake saw it."""

    method: str  # short name: "Version", "FutureCall", ...
    request: Any  # the decoded request message (bytes for the generic method)
    metadata: MetadataList
    time_remaining: float | None

    def meta(self, key: str) -> str | bytes | None:
        return next((v for k, v in self.metadata if k == key), None)


@dataclass(frozen=True)
class Failure:
    """How StopContainer fails."""

    code: grpc.StatusCode = grpc.StatusCode.NOT_FOUND
    details: str = "container \u201cabc\u201d not found: %2F stays, ü too"
    trailing: tuple[tuple[str, str | bytes], ...] = (
        ("x-error-source", "fake-runtime"),
        ("x-error-blob-bin", b"\x00\x01\xfe\xff"),
    )
    status_details: bytes | None = rpc_status_bytes(
        5,
        "container \u201cabc\u201d not found",
        [("type.googleapis.com/google.rpc.ErrorInfo", b"\x0a\x06reason\x12\x04fake")],
    )

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        extra: tuple[tuple[str, str | bytes], ...] = ()
        if self.status_details is not None:
            extra = (("grpc-status-details-bin", self.status_details),)
        return self.trailing + extra


class StreamControl:
    """Feeds one server-streaming method: each message is sent when a test puts it.

    Put a message to send it, a ``Failure`` to end the stream with that status, or None to
    end it OK. The events tell whether the handler started, ended, or was cancelled.
    """

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Message | Failure | None] = asyncio.Queue()
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.finished = asyncio.Event()
        self.sent = 0

    async def run(self, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Message]:
        self.started.set()
        try:
            while True:
                item = await self.queue.get()
                if item is None:
                    return
                if isinstance(item, Failure):
                    await context.abort(item.code, item.details, item.trailing_metadata())
                yield item
                self.sent += 1
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        finally:
            self.finished.set()


# -- the servicers ----------------------------------------------------------------------------


def _metadata(context: grpc.aio.ServicerContext[Any, Any]) -> MetadataList:
    return [(m.key, m.value) for m in (context.invocation_metadata() or ())]


class _Runtime(pb_grpc.RuntimeServiceServicer):  # type: ignore[misc]
    def __init__(self, fake: FakeRuntime) -> None:
        self.fake = fake

    async def Version(self, request: pb.VersionRequest, context: Any) -> pb.VersionResponse:
        metadata = self.fake.record("Version", request, context)
        echoed = [(k, v) for k, v in metadata if k.startswith("x-")]
        context.set_trailing_metadata(tuple((f"echo-{k}", v) for k, v in echoed))
        return pb.VersionResponse(
            version=request.version,
            runtime_name=self.fake.name,
            runtime_version=";".join(f"{k}={v!r}" for k, v in echoed),
            runtime_api_version="v1",
        )

    async def StopContainer(self, request: pb.StopContainerRequest, context: Any) -> pb.StopContainerResponse:
        self.fake.record("StopContainer", request, context)
        failure = self.fake.failure
        await context.abort(failure.code, failure.details, failure.trailing_metadata())
        raise AssertionError("abort returned")

    async def ListContainers(self, request: pb.ListContainersRequest, context: Any) -> pb.ListContainersResponse:
        self.fake.record("ListContainers", request, context)
        count = int(request.filter.label_selector.get("count", "3"))
        return pb.ListContainersResponse(
            containers=[
                pb.Container(
                    id=f"{self.fake.name}-c{i}",
                    pod_sandbox_id=f"pod-{i % 7}",
                    metadata=pb.ContainerMetadata(name=f"c{i}", attempt=i),
                    state=pb.CONTAINER_RUNNING,
                    labels={"index": str(i)},
                )
                for i in range(count)
            ]
        )

    async def ContainerStatus(self, request: pb.ContainerStatusRequest, context: Any) -> pb.ContainerStatusResponse:
        self.fake.record("ContainerStatus", request, context)
        info = {}
        if request.container_id.startswith("size:"):
            info["blob"] = "x" * int(request.container_id.removeprefix("size:"))
        return pb.ContainerStatusResponse(
            status=pb.ContainerStatus(id=request.container_id, state=pb.CONTAINER_RUNNING), info=info
        )

    async def ExecSync(self, request: pb.ExecSyncRequest, context: Any) -> pb.ExecSyncResponse:
        self.fake.record("ExecSync", request, context)
        self.fake.exec_started.set()
        try:
            if len(request.cmd) == 2 and request.cmd[0] == "sleep":
                await asyncio.sleep(float(request.cmd[1]))
        except asyncio.CancelledError:
            self.fake.exec_cancelled.set()
            raise
        return pb.ExecSyncResponse(stdout=" ".join(request.cmd).encode(), exit_code=0)

    async def CreateContainer(self, request: pb.CreateContainerRequest, context: Any) -> pb.CreateContainerResponse:
        self.fake.record("CreateContainer", request, context)
        size = sum(len(k) + len(v) for k, v in request.config.annotations.items())
        return pb.CreateContainerResponse(container_id=f"{request.config.metadata.name}:{size}")

    async def UpdateContainerResources(
        self, request: pb.UpdateContainerResourcesRequest, context: Any
    ) -> pb.UpdateContainerResourcesResponse:
        self.fake.record("UpdateContainerResources", request, context)
        return pb.UpdateContainerResourcesResponse()

    async def StartContainer(self, request: pb.StartContainerRequest, context: Any) -> pb.StartContainerResponse:
        self.fake.record("StartContainer", request, context)
        return pb.StartContainerResponse()

    async def GetContainerEvents(
        self, request: pb.GetEventsRequest, context: Any
    ) -> AsyncIterator[pb.ContainerEventResponse]:
        self.fake.record("GetContainerEvents", request, context)
        async for message in self.fake.stream("GetContainerEvents").run(context):
            yield message

    async def StreamContainers(
        self, request: pb.StreamContainersRequest, context: Any
    ) -> AsyncIterator[pb.StreamContainersResponse]:
        self.fake.record("StreamContainers", request, context)
        async for message in self.fake.stream("StreamContainers").run(context):
            yield message


class _Images(pb_grpc.ImageServiceServicer):  # type: ignore[misc]
    def __init__(self, fake: FakeRuntime) -> None:
        self.fake = fake

    async def ListImages(self, request: pb.ListImagesRequest, context: Any) -> pb.ListImagesResponse:
        self.fake.record("ListImages", request, context)
        return pb.ListImagesResponse(images=[pb.Image(id=f"{self.fake.name}-image", size=42)])

    async def ImageStatus(self, request: pb.ImageStatusRequest, context: Any) -> pb.ImageStatusResponse:
        self.fake.record("ImageStatus", request, context)
        return pb.ImageStatusResponse(image=pb.Image(id=f"{self.fake.name}:{request.image.image}"))


class FakeRuntime:
    """A CRI server on a unix socket; restartable on the same path."""

    def __init__(self, name: str = "fake-runtime", path: str | None = None) -> None:
        self.name = name
        self.path = path
        self.received: list[Received] = []
        self.failure = Failure()
        self.exec_started = asyncio.Event()
        self.exec_cancelled = asyncio.Event()
        self._streams: dict[str, StreamControl] = {}
        self._server: grpc.aio.Server | None = None

    # -- lifecycle

    async def start(self, path: str | None = None) -> FakeRuntime:
        path = path or self.path
        assert path is not None, "no socket path"
        assert len(path) < 100, f"unix socket path too long: {path}"
        self.path = path
        server = grpc.aio.server(options=BIG_MESSAGE_OPTIONS)
        pb_grpc.add_RuntimeServiceServicer_to_server(_Runtime(self), server)
        pb_grpc.add_ImageServiceServicer_to_server(_Images(self), server)
        server.add_generic_rpc_handlers((self._future_handler(),))
        if not server.add_insecure_port(f"unix://{path}"):
            raise RuntimeError(f"cannot listen on {path}")
        await server.start()
        self._server = server
        return self

    async def stop(self, grace: float | None = None) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)

    async def __aenter__(self) -> FakeRuntime:
        if self._server is None:
            await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- steering and observing

    def stream(self, method: str) -> StreamControl:
        """The control of a streaming method; one per method, shared by its calls."""
        control = self._streams.get(method)
        if control is None:
            control = self._streams[method] = StreamControl()
        return control

    def reset_stream(self, method: str) -> StreamControl:
        self._streams.pop(method, None)
        return self.stream(method)

    def record(self, method: str, request: Any, context: Any) -> MetadataList:
        metadata = _metadata(context)
        self.received.append(Received(method, request, metadata, context.time_remaining()))
        return metadata

    def calls(self, method: str) -> list[Received]:
        return [r for r in self.received if r.method == method]

    def _future_handler(self) -> grpc.GenericRpcHandler:
        async def future_call(request: bytes, context: Any) -> bytes:
            self.record("FutureCall", request, context)
            return b"future:" + request

        return grpc.method_handlers_generic_handler(
            "runtime.v1.RuntimeService",
            {"FutureCall": grpc.unary_unary_rpc_method_handler(future_call)},
        )


# -- the proxy in front of it -----------------------------------------------------------------


@contextlib.contextmanager
def short_tempdir() -> Iterator[str]:
    """A directory under /tmp whose socket paths stay far below the 108-byte limit."""
    path = tempfile.mkdtemp(prefix="rp-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class ProxyUnderTest:
    """ProxyServer in this process and event loop, serving ``path``."""

    path: str
    runtime_backend: str
    image_backend: str | None = None
    max_message_size: int = DEFAULT_MAX_MESSAGE
    held_request_budget: int | None = None
    interceptor: CallInterceptor | None = None
    metrics: CallMetrics | None = None
    server: ProxyServer | None = None
    channels: list[grpc.aio.Channel] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"unix://{self.path}"

    async def start(self) -> ProxyUnderTest:
        settings = ProxySettings(
            endpoint=self.path,
            runtime_backend=self.runtime_backend,
            image_backend=self.image_backend,
            max_message_size=self.max_message_size,
            held_request_budget=self.held_request_budget,
        )
        self.server = ProxyServer(settings, interceptor=self.interceptor, metrics=self.metrics)
        await self.server.start()
        return self

    def channel(self, *, own_connection: bool = True, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """A client channel to the proxy; closed by ``stop``.

        ``own_connection`` keeps grpc from sharing one subchannel between channels to the
        same target, so each channel is one client connection (as kubelet's are).
        """
        opts = list(CLIENT_OPTIONS) + list(options)
        if own_connection:
            opts.append(("grpc.use_local_subchannel_pool", 1))
        channel = grpc.aio.insecure_channel(self.target, options=opts)
        self.channels.append(channel)
        return channel

    async def stop(self, grace: float = 0.0) -> None:
        for channel in self.channels:
            await channel.close()
        self.channels.clear()
        if self.server is not None:
            server, self.server = self.server, None
            await server.shutdown(grace)

    async def __aenter__(self) -> ProxyUnderTest:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


@contextlib.asynccontextmanager
async def proxy_before_fake_runtime() -> AsyncIterator[ProxyUnderTest]:
    """The proxy in front of one FakeRuntime, both in a short temporary directory."""
    with short_tempdir() as directory:
        fake = await FakeRuntime("runtime").start(sock(directory, "rt.sock"))
        try:
            assert fake.path is not None
            async with ProxyUnderTest(sock(directory, "proxy.sock"), fake.path) as under_test:
                yield under_test
        finally:
            await fake.stop()


class RawServer(UnixServer):
    """A grpc.aio server on a unix socket whose handlers take and return raw bytes (no
    (de)serializers), for answering what no well-behaved server would."""

    def handlers(self) -> dict[str, dict[str, Any]]:
        """{service: {method: async fn(request bytes, context) -> bytes}}."""
        raise NotImplementedError

    def add_services(self, server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers(
            tuple(
                grpc.method_handlers_generic_handler(
                    service, {name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in methods.items()}
                )
                for service, methods in self.handlers().items()
            )
        )


def grpc_request_headers(path: str, metadata: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """The headers of a gRPC request for `path` as a client sends them (unencoded), `metadata` last."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *metadata,
    ]


def direct_channel(path: str) -> grpc.aio.Channel:
    """A client channel straight to a backend, with the same options as a proxied one."""
    return grpc.aio.insecure_channel(f"unix://{path}", options=[*CLIENT_OPTIONS, ("grpc.use_local_subchannel_pool", 1)])


def sock(directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    assert len(path) < 100, path
    return path


# -- a bare HTTP/2 client, for what grpc clients never put on the wire ------------------------


@dataclass
class RawResponse:
    """What came back on one stream of a ``RawH2Client``."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    trailers: list[tuple[str, str]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    reset: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # Whether the connection's GOAWAY had arrived when the call ended.
    goaway_before_end: bool = False

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers + self.trailers if k == name), None)

    @property
    def status(self) -> int | None:
        code = self.header("grpc-status")
        return None if code is None else int(code)

    def messages(self) -> list[bytes]:
        split = grpc_framing.split_messages(bytes(self.data))
        assert split is not None, "response DATA does not frame as gRPC messages"
        return [m.body for m in split]


class RawH2Client:
    """A minimal HTTP/2 gRPC client over a unix socket, built from the project's own frame helpers.

    Unlike grpc-core and grpc-go it does not wait for the server's SETTINGS before sending
    its first request, and it can pad frames and split header blocks at will.
    """

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.responses: dict[int, RawResponse] = {}
        self.goaway: bytes | None = None
        self.data_sent = 0  # DATA payload bytes sent (padding included): what flow control counts
        self.conn_credit = 0  # sum of connection-level WINDOW_UPDATE increments received
        self.closed = asyncio.Event()
        self.next_stream = 1
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._block: list[bytes] = []
        self._block_stream = 0
        self._block_flags = 0

    async def connect(self, path: str) -> RawH2Client:
        self._reader, self._writer = await asyncio.open_unix_connection(path)
        self._writer.write(frames.PREFACE + frames.settings({frames.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 24}))
        self._writer.write(frames.window_update(0, (1 << 24) - frames.DEFAULT_WINDOW))
        self._task = asyncio.get_running_loop().create_task(self._read())
        return self

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def write(self, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(data)

    def request_headers(self, path: str, metadata: Sequence[tuple[str, str]] = ()) -> bytes:
        """An encoded header block for a gRPC request (updates this client's HPACK table)."""
        block: bytes = self.encoder.encode(grpc_request_headers(path, metadata))
        return block

    def start_call(
        self,
        path: str,
        message: bytes,
        *,
        metadata: Sequence[tuple[str, str]] = (),
        header_pad: int = 0,
        data_pad: int = 0,
        priority: bool = False,
        header_chunks: int = 1,
        data_chunks: int = 1,
        data_step: int | None = None,
        framed: bool = False,
    ) -> RawResponse:
        """Send one unary request; the ``*_pad`` pad its frames, the ``*_chunks`` split it.

        With ``framed``, ``message`` is sent as the request body as it is (already
        length-prefixed, or deliberately not), to send malformed bodies.

        grpc-core rejects padded frames (grpc/grpc#9779), so padding is for requests that
        the relay itself consumes (intercepted calls), not ones it forwards to a grpc server.
        """
        sid = self.next_stream
        self.next_stream += 2
        response = self.responses[sid] = RawResponse()
        block = self.request_headers(path, metadata)
        step = -(-len(block) // header_chunks)
        pieces = [block[i : i + step] for i in range(0, len(block), step)]
        body = message if framed else grpc_framing.encode_message(message)
        out = bytearray()
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            if i == 0:
                flags, payload = (0 if body else frames.FLAG_END_STREAM), piece  # no body: headers end it
                if priority:
                    flags |= frames.FLAG_PRIORITY
                    payload = (3).to_bytes(4, "big") + bytes([15]) + payload
                if header_pad:
                    flags |= frames.FLAG_PADDED
                    payload = bytes([header_pad]) + payload + b"\0" * header_pad
                out += frames.frame(frames.HEADERS, flags | (frames.FLAG_END_HEADERS if last else 0), sid, payload)
            else:
                out += frames.frame(frames.CONTINUATION, frames.FLAG_END_HEADERS if last else 0, sid, piece)
        step = data_step or max(1, -(-len(body) // data_chunks))
        chunks = [body[i : i + step] for i in range(0, len(body), step)]
        for i, chunk in enumerate(chunks):
            flags = frames.FLAG_END_STREAM if i == len(chunks) - 1 else 0
            payload = chunk
            if data_pad:
                flags |= frames.FLAG_PADDED
                payload = bytes([data_pad]) + chunk + b"\0" * data_pad
            out += frames.frame(frames.DATA, flags, sid, payload)
            self.data_sent += len(payload)
        self.write(bytes(out))
        return response

    def reset(self, response: RawResponse) -> None:
        """Cancel a call (RST_STREAM CANCEL)."""
        sid = next(sid for sid, r in self.responses.items() if r is response)
        self.write(frames.rst_stream(sid, frames.CANCEL))

    async def call(self, path: str, message: bytes, timeout: float = 10.0, **options: Any) -> RawResponse:
        response = self.start_call(path, message, **options)
        await asyncio.wait_for(response.done.wait(), timeout)
        return response

    async def _read(self) -> None:
        assert self._reader is not None
        try:
            while True:
                head = await self._reader.readexactly(frames.HEADER_LEN)
                high, low, ftype, flags, sid = frames.FRAME_HEADER.unpack(head)
                payload = await self._reader.readexactly((high << 8) | low)
                self._frame(ftype, flags, sid & frames.MAX_STREAM_ID, payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.set()
            for response in self.responses.values():
                response.done.set()

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == frames.SETTINGS and not flags & frames.FLAG_ACK:
            self.write(frames.settings_ack())
        elif ftype == frames.PING and not flags & frames.FLAG_ACK:
            self.write(frames.frame(frames.PING, frames.FLAG_ACK, 0, payload))
        elif ftype == frames.GOAWAY:
            self.goaway = payload
        elif ftype == frames.WINDOW_UPDATE and sid == 0:
            self.conn_credit += int.from_bytes(payload, "big") & frames.MAX_WINDOW_INCREMENT
        elif ftype == frames.RST_STREAM and sid in self.responses:
            self.responses[sid].reset = int.from_bytes(payload, "big")
            self.responses[sid].done.set()
        elif ftype == frames.DATA and sid in self.responses:
            lo, hi = frames.data_bounds(flags, payload, 0, len(payload))
            self.responses[sid].data += payload[lo:hi]
            if payload:
                self.write(frames.window_update(0, len(payload)) + frames.window_update(sid, len(payload)))
        elif ftype == frames.HEADERS:
            self._block = [bytes(frames.header_block_fragment(flags, payload))]
            self._block_stream, self._block_flags = sid, flags
            if flags & frames.FLAG_END_HEADERS:
                self._headers_done()
        elif ftype == frames.CONTINUATION:
            self._block.append(payload)
            if flags & frames.FLAG_END_HEADERS:
                self._headers_done()

    def _headers_done(self) -> None:
        headers = list(self.decoder.decode(b"".join(self._block)))
        response = self.responses.get(self._block_stream)
        if response is None:
            return
        # The first block is the response headers (all of it, for a trailers-only response).
        if response.headers:
            response.trailers = headers
        else:
            response.headers = headers
        if self._block_flags & frames.FLAG_END_STREAM:
            response.goaway_before_end = self.goaway is not None
            response.done.set()


class RawH2Server:
    """A bare HTTP/2 gRPC backend whose flow-control windows the test chooses.

    It answers every call (once its request has ended) with ``response`` and status OK,
    returns connection credit for every DATA byte at once, and stream credit only when
    ``stream_credit`` is set. It records each stream's request bytes and resets.
    """

    def __init__(self, initial_window: int = frames.DEFAULT_WINDOW, stream_credit: bool = True) -> None:
        self.initial_window = initial_window
        self.stream_credit = stream_credit
        self.response = b"ok"
        self.requests: dict[int, bytearray] = {}
        self.paths: dict[int, str] = {}
        self.resets: list[int] = []
        self.data_received = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self, path: str) -> RawH2Server:
        self._server = await asyncio.start_unix_server(self._serve, path)
        return self

    async def stop(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        encoder, decoder = hpack.Encoder(), hpack.Decoder()
        block: list[bytes] = []
        block_stream = block_flags = 0
        try:
            await reader.readexactly(len(frames.PREFACE))
            writer.write(frames.settings({frames.SETTINGS_INITIAL_WINDOW_SIZE: self.initial_window}))
            while True:
                head = await reader.readexactly(frames.HEADER_LEN)
                high, low, ftype, flags, sid = frames.FRAME_HEADER.unpack(head)
                payload = await reader.readexactly((high << 8) | low)
                sid &= frames.MAX_STREAM_ID
                ended = False
                if ftype == frames.SETTINGS and not flags & frames.FLAG_ACK:
                    writer.write(frames.settings_ack())
                elif ftype == frames.PING and not flags & frames.FLAG_ACK:
                    writer.write(frames.frame(frames.PING, frames.FLAG_ACK, 0, payload))
                elif ftype in (frames.HEADERS, frames.CONTINUATION):
                    if ftype == frames.HEADERS:
                        block = [bytes(frames.header_block_fragment(flags, payload))]
                        block_stream, block_flags = sid, flags
                    else:
                        block.append(payload)
                    if flags & frames.FLAG_END_HEADERS:
                        headers = dict(decoder.decode(b"".join(block)))
                        self.paths[block_stream] = headers.get(":path", "")
                        self.requests.setdefault(block_stream, bytearray())
                        ended, sid = bool(block_flags & frames.FLAG_END_STREAM), block_stream
                elif ftype == frames.DATA:
                    lo, hi = frames.data_bounds(flags, payload, 0, len(payload))
                    self.requests.setdefault(sid, bytearray()).extend(payload[lo:hi])
                    self.data_received += len(payload)
                    if payload:
                        writer.write(frames.window_update(0, len(payload)))
                        if self.stream_credit and not flags & frames.FLAG_END_STREAM:
                            writer.write(frames.window_update(sid, len(payload)))
                    ended = bool(flags & frames.FLAG_END_STREAM)
                elif ftype == frames.RST_STREAM:
                    self.resets.append(sid)
                if ended:
                    writer.write(self._answer(encoder, sid))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, encoder: hpack.Encoder, sid: int) -> bytes:
        headers = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
        trailers = encoder.encode([("grpc-status", "0")])
        return (
            frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, headers)
            + frames.frame(frames.DATA, 0, sid, grpc_framing.encode_message(self.response))
            + frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS | frames.FLAG_END_STREAM, sid, trailers)
        )
