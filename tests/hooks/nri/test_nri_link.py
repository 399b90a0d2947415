"""The NRI connection (hooks/nri/runtime_link.py) on the event loops the daemon may run: uvloop
(what ``serve`` runs) and asyncio's own. A request the runtime sends at once on accepting, even in
the same packet as its close, is answered or the connection reports the close; closing it ourselves
fails the calls in flight and cancels the requests still being answered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop
from runtimeproxy.hooks.nri.mux import PLUGIN_SERVICE_CONN, MuxDecoder, encode_chunks
from runtimeproxy.hooks.nri.rpc import Method, RpcError
from runtimeproxy.hooks.nri.runtime_link import connect
from runtimeproxy.hooks.nri.ttrpc import FrameDecoder, MessageType, encode_frame

from runtimeproxy.api.nri.ttrpc import ttrpc_pb2 as ttrpc_pb

LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {"uvloop": uvloop.run, "asyncio": asyncio.run}


async def _echo(payload: bytes, timeout: float | None) -> bytes:
    return b"echo:" + payload


def _request(stream: int, method: str, payload: bytes) -> bytes:
    request = ttrpc_pb.Request(service="s", method=method, payload=payload).SerializeToString()
    return encode_chunks(PLUGIN_SERVICE_CONN, encode_frame(stream, MessageType.REQUEST, request))


async def _answers(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    mux, frames, out = MuxDecoder(), FrameDecoder(), []
    while len(out) < count:
        data = await reader.read(4096)
        assert data, "the plugin closed the connection before answering"
        for _, chunk in mux.feed(data):
            out += [ttrpc_pb.Response.FromString(frame.payload).payload for frame in frames.feed(chunk)]
    return out


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_requests_sent_on_accepting_are_answered_and_the_close_reported(tmp_path: Path, loop: str) -> None:
    path = str(tmp_path / "nri.sock")
    answers: list[bytes] = []

    async def runtime(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_request(1, "echo", b"a") + _request(3, "echo", b"b"))  # one write, two requests
        answers.extend(await _answers(reader, 2))
        writer.close()

    async def scenario() -> None:
        methods: dict[tuple[str, str], Method] = {("s", "echo"): _echo}
        async with await asyncio.start_unix_server(runtime, path):
            connection = await connect(path, methods)
            reason = await asyncio.wait_for(connection.closed, 5)
            assert reason == "the runtime closed the connection"
            await connection.close()
            assert connection.closed.result() == reason  # the first reason stands

    LOOPS[loop](scenario())
    assert answers == [b"echo:a", b"echo:b"]


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_closing_fails_calls_in_flight_and_cancels_requests_being_answered(tmp_path: Path, loop: str) -> None:
    path = str(tmp_path / "nri.sock")
    cancelled: list[bool] = []

    async def scenario() -> None:
        began = asyncio.Event()

        async def hang(payload: bytes, timeout: float | None) -> bytes:
            began.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return b""

        async def runtime(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(_request(1, "hang", b""))
            await reader.read()  # until the plugin closes
            writer.close()

        async with await asyncio.start_unix_server(runtime, path):
            connection = await connect(path, {("s", "hang"): hang})
            call = asyncio.ensure_future(connection.client.call("rt", "Register", b"", timeout=30))
            await asyncio.wait_for(began.wait(), 5)
            await connection.close()
            assert connection.closed.result() == "closed by runtime-hooks"
            with pytest.raises(RpcError, match="UNAVAILABLE: closed by runtime-hooks"):
                await call

    LOOPS[loop](scenario())
    assert cancelled == [True]
