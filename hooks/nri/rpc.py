"""Unary ttrpc over one byte stream: a server for the methods we answer, a client for the calls we make.

Both sit on the framing of hooks/nri/ttrpc.py and are fed the stream's bytes as they come
(``feed``); what they send goes to a ``send(bytes)`` callable (a multiplexed connection,
hooks/nri/mux.py). Only unary calls exist in NRI: streaming (data frames) is refused.

**Server.** A request frame holds a ``ttrpc.Request`` (service, method, payload, timeout in
ns). Each runs in its own task and is answered with a response frame on the same stream id
holding a ``ttrpc.Response``: the payload, or a status with a gRPC code and message. What
ttrpc itself refuses is refused the same way: an even or reused stream id, an undecodable
request (INVALID_ARGUMENT), an unknown method (UNIMPLEMENTED). A method that raises RpcError
answers with its code; any other exception answers INTERNAL and is logged: a bug never leaves
the runtime waiting.

**Client.** Each call takes the next odd stream id and waits for its response frame until its
timeout (sent along as ``timeout_nano``, so the peer knows the deadline too). A status other
than OK raises RpcError; a closed connection fails every call in flight with UNAVAILABLE.

**Answer first.** The runtime waits for each answer, so what a method has to say about a request
that does not change the answer (log lines, metrics) waits until the answer is written: the
method hands it to :func:`after_answer`, and the server runs it right after the write, once the
runtime's reader had a chance at the CPU (runtimeproxy/common/give_way.py); log lines collected
meanwhile are written then too (runtimeproxy/common/logs.py ``hold``).

A frame over ttrpc's size limit makes ``feed`` raise FrameTooLarge (hooks/nri/ttrpc.py), on
either side: the stream cannot be read on, and the connection is to be closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from google.protobuf.message import DecodeError

from runtimeproxy.api.nri.ttrpc import ttrpc_pb2 as ttrpc_pb
from runtimeproxy.common import logs
from runtimeproxy.common.give_way import give_way
from runtimeproxy.wire.grpc_framing import CODE_NAMES, StatusCode

from .ttrpc import Frame, FrameDecoder, MessageType, encode_frame

# ttrpc answers with gRPC's status codes (containerd/ttrpc server.go uses google.golang.org/grpc/codes):
# one table, the relay's.
__all__ = ["Method", "RpcError", "StatusCode", "TtrpcClient", "TtrpcServer", "after_answer"]

log = structlog.get_logger("runtimeproxy.hooks.nri.rpc")

#: A served method: the request payload and the seconds left before the caller's deadline
#: (None: it set none) -> the response payload.
Method = Callable[[bytes, float | None], Awaitable[bytes]]


class _AfterAnswer:
    """One request's work waiting for its answer; once answered, work given to it runs at once
    (the hooks of a notification run after its answer, in a task that inherited the request's)."""

    def __init__(self) -> None:
        self.waiting: list[Callable[[], None]] | None = []

    def add(self, work: Callable[[], None]) -> None:
        if self.waiting is None:
            _run_reporting(work)
        else:
            self.waiting.append(work)

    def answered(self) -> None:
        waiting, self.waiting = self.waiting or [], None
        for work in waiting:
            _run_reporting(work)


def _run_reporting(work: Callable[[], None]) -> None:
    try:
        work()
    except Exception:  # a bug in reporting must not hide the other reports
        log.exception("reporting on an NRI request failed")


#: The request being served in this task (and the tasks it starts); None: none.
_request: contextvars.ContextVar[_AfterAnswer | None] = contextvars.ContextVar("ttrpc_request", default=None)


def after_answer(work: Callable[[], None]) -> None:
    """Run ``work`` once the answer to the request being served is written (module doc); at once
    outside a request or after its answer."""
    request = _request.get()
    if request is None:
        work()
    else:
        request.add(work)


class RpcError(Exception):
    """A call answered with (or to be answered with) a status other than OK."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{_code_name(code)}: {message}")


def _code_name(code: int) -> str:
    return CODE_NAMES.get(code, f"code {code}")


class TtrpcServer:
    """Answers unary ttrpc requests with ``methods`` ({(service, method): Method}); see the module doc."""

    def __init__(self, methods: Mapping[tuple[str, str], Method], send: Callable[[bytes], None]) -> None:
        self._methods = dict(methods)
        self._send = send
        self._decoder = FrameDecoder()
        self._last_stream = 0
        self._tasks: set[asyncio.Task[None]] = set()
        # The loop the requests run on, looked up at the first one: each look at the running loop
        # is a getpid(2) on Python 3.11, on the path of every request.
        self._loop: asyncio.AbstractEventLoop | None = None

    def feed(self, data: bytes) -> None:
        for frame in self._decoder.feed(data):
            self._frame(frame)

    def _frame(self, frame: Frame) -> None:
        if frame.type != MessageType.REQUEST:
            log.warning("ttrpc frame other than a request ignored", type=frame.type, stream=frame.stream_id)
            return
        if frame.stream_id % 2 != 1 or frame.stream_id <= self._last_stream:
            self._fail(frame.stream_id, StatusCode.INVALID_ARGUMENT, "stream id must be odd and increasing")
            return
        self._last_stream = frame.stream_id
        try:
            request = ttrpc_pb.Request.FromString(frame.payload)
        except DecodeError as exc:
            self._fail(frame.stream_id, StatusCode.INVALID_ARGUMENT, f"undecodable request: {exc}")
            return
        method = self._methods.get((request.service, request.method))
        if method is None:
            self._fail(frame.stream_id, StatusCode.UNIMPLEMENTED, f"{request.service}/{request.method}")
            return
        timeout = request.timeout_nano / 1e9 if request.timeout_nano > 0 else None
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        task = self._loop.create_task(self._answer(frame.stream_id, request, method, timeout))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, stream_id: int, request: Any, method: Method, timeout: float | None) -> None:
        after = _AfterAnswer()
        _request.set(after)  # this task's own context: the tasks the method starts inherit it
        release = logs.hold()
        try:
            await self._call(stream_id, request, method, timeout)
        finally:
            give_way()  # the runtime reads the answer first (runtimeproxy/common/give_way.py)
            after.answered()
            release()

    async def _call(self, stream_id: int, request: Any, method: Method, timeout: float | None) -> None:
        try:
            payload = await method(bytes(request.payload), timeout)
        except RpcError as exc:
            self._fail(stream_id, exc.code, exc.message)
            return
        except Exception as exc:
            log.exception("ttrpc method failed", service=request.service, method=request.method)
            self._fail(stream_id, StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
            return
        self._respond(stream_id, ttrpc_pb.Response(payload=payload))

    def _fail(self, stream_id: int, code: int, message: str) -> None:
        self._respond(stream_id, ttrpc_pb.Response(status=ttrpc_pb.Status(code=code, message=message)))

    def _respond(self, stream_id: int, response: Any) -> None:
        try:
            frame = encode_frame(stream_id, MessageType.RESPONSE, response.SerializeToString())
        except ValueError as exc:  # an answer over 4 MiB: say so instead
            log.error("ttrpc response too large; answering an error", stream=stream_id, error=str(exc))
            status = ttrpc_pb.Status(code=StatusCode.RESOURCE_EXHAUSTED, message=str(exc))
            frame = encode_frame(stream_id, MessageType.RESPONSE, ttrpc_pb.Response(status=status).SerializeToString())
        self._send(frame)

    async def close(self) -> None:
        """Cancel the requests still being answered (the connection is gone)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class TtrpcClient:
    """Makes unary ttrpc calls; see the module doc."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self._send = send
        self._decoder = FrameDecoder()
        self._next_stream = 1
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._closed: str | None = None

    def feed(self, data: bytes) -> None:
        for frame in self._decoder.feed(data):
            future = self._pending.pop(frame.stream_id, None)
            if future is None or future.done():
                log.warning("ttrpc answer for no call in flight ignored", stream=frame.stream_id)
                continue
            if frame.type != MessageType.RESPONSE:
                future.set_exception(RpcError(StatusCode.INTERNAL, f"answer of ttrpc message type {frame.type}"))
            else:
                try:
                    future.set_result(ttrpc_pb.Response.FromString(frame.payload))
                except DecodeError as exc:
                    future.set_exception(RpcError(StatusCode.INTERNAL, f"undecodable ttrpc response: {exc}"))

    async def call(self, service: str, method: str, payload: bytes, timeout: float) -> bytes:
        """The response payload of ``service/method``; RpcError for a status, the timeout or a closed connection."""
        if self._closed is not None:
            raise RpcError(StatusCode.UNAVAILABLE, self._closed)
        stream_id = self._next_stream
        self._next_stream += 2
        request = ttrpc_pb.Request(service=service, method=method, payload=payload, timeout_nano=int(timeout * 1e9))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = future
        try:
            self._send(encode_frame(stream_id, MessageType.REQUEST, request.SerializeToString()))
            response = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise RpcError(StatusCode.DEADLINE_EXCEEDED, f"{service}/{method}: no answer within {timeout:g}s") from None
        finally:
            self._pending.pop(stream_id, None)
        if response.HasField("status") and response.status.code != StatusCode.OK:
            raise RpcError(response.status.code, response.status.message)
        return bytes(response.payload)

    def close(self, reason: str) -> None:
        """Fail every call in flight, and later ones, with UNAVAILABLE ``reason``."""
        self._closed = reason
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(RpcError(StatusCode.UNAVAILABLE, reason))
