"""Unary ttrpc (hooks/nri/rpc.py), the NRI connection (hooks/nri/runtime_link.py) and registration
(hooks/nri/plugin.py) without a runtime: a client and a server wired to each other in memory, and
a fake runtime on a real unix socket (timeouts, closes and refusals while registering, Shutdown)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.nri import rpc
from runtimeproxy.hooks.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, MuxDecoder, encode_chunks
from runtimeproxy.hooks.nri.nri_metrics import NriMetrics
from runtimeproxy.hooks.nri.plugin import NriPlugin, NriSettings
from runtimeproxy.hooks.nri.rpc import Method, RpcError, StatusCode, TtrpcClient, TtrpcServer, after_answer
from runtimeproxy.hooks.nri.runtime_link import NriUnavailable, connect
from runtimeproxy.hooks.nri.service import NriHooks
from runtimeproxy.hooks.nri.ttrpc import HEADER, Frame, FrameDecoder, MessageType, encode_frame
from runtimeproxy.hooks.plugin_runner import PluginRunner
from structlog.testing import capture_logs

from runtimeproxy.api.nri.ttrpc import ttrpc_pb2 as ttrpc_pb
from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb


async def echo(payload: bytes, timeout: float | None) -> bytes:
    return payload + b"|" + (b"none" if timeout is None else b"%.1f" % timeout)


async def refuse(payload: bytes, timeout: float | None) -> bytes:
    raise RpcError(StatusCode.FAILED_PRECONDITION, "not now")


async def crash(payload: bytes, timeout: float | None) -> bytes:
    raise KeyError("bug")


async def hang(payload: bytes, timeout: float | None) -> bytes:
    await asyncio.sleep(3600)
    return b""


METHODS: dict[tuple[str, str], Method] = {("s", "echo"): echo, ("s", "refuse"): refuse, ("s", "crash"): crash}
METHODS[("s", "hang")] = hang


def wired() -> tuple[TtrpcClient, TtrpcServer]:
    """A client whose bytes reach the server and back, one loop turn later (as a socket would)."""
    loop = asyncio.get_running_loop()
    client: TtrpcClient
    server = TtrpcServer(METHODS, lambda data: loop.call_soon(client.feed, data))
    client = TtrpcClient(lambda data: loop.call_soon(server.feed, data))
    return client, server


async def test_a_call_gets_its_answer_and_the_deadline_travels() -> None:
    client, _ = wired()
    assert await client.call("s", "echo", b"hi", timeout=2.0) == b"hi|2.0"
    assert await client.call("s", "echo", b"again", timeout=1.0) == b"again|1.0"


async def test_work_after_the_answer_runs_once_the_answer_is_written_and_the_cpu_given_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order: list[str] = []
    monkeypatch.setattr(rpc, "give_way", lambda: order.append("give way"))

    async def answer_then_report(payload: bytes, timeout: float | None) -> bytes:
        async def hooks() -> None:  # a task the method starts shares its request's list
            after_answer(lambda: order.append("report from a task"))

        await asyncio.get_running_loop().create_task(hooks())
        after_answer(lambda: order.append("report"))
        after_answer(lambda: 1 / 0)  # a failing report is logged; the others still run
        return payload

    def sent(data: bytes) -> None:
        order.append("answer")

    server = TtrpcServer({("s", "m"): answer_then_report}, sent)
    request = ttrpc_pb.Request(service="s", method="m", payload=b"x").SerializeToString()
    with capture_logs() as logged:
        server.feed(encode_frame(1, MessageType.REQUEST, request))
        await asyncio.sleep(0.01)
    assert order == ["answer", "give way", "report from a task", "report"]
    assert [r["event"] for r in logged] == ["reporting on an NRI request failed"]
    after_answer(lambda: order.append("outside a request"))  # at once
    assert order[-1] == "outside a request"


@pytest.mark.parametrize(
    ("method", "code", "text"),
    [
        ("refuse", StatusCode.FAILED_PRECONDITION, "not now"),
        ("crash", StatusCode.INTERNAL, "KeyError"),
        ("nope", StatusCode.UNIMPLEMENTED, "s/nope"),
    ],
)
async def test_failures_answer_with_a_status(method: str, code: int, text: str) -> None:
    client, _ = wired()
    with pytest.raises(RpcError) as info:
        await client.call("s", method, b"", timeout=2.0)
    assert info.value.code == code and text in info.value.message


async def test_a_call_past_its_timeout_fails_and_closing_fails_the_rest() -> None:
    client, server = wired()
    with pytest.raises(RpcError) as info:
        await client.call("s", "hang", b"", timeout=0.05)
    assert info.value.code == StatusCode.DEADLINE_EXCEEDED
    pending = asyncio.ensure_future(client.call("s", "hang", b"", timeout=10))
    await asyncio.sleep(0.01)
    client.close("gone")
    with pytest.raises(RpcError, match="UNAVAILABLE: gone"):
        await pending
    with pytest.raises(RpcError, match="gone"):
        await client.call("s", "echo", b"", timeout=1)
    await server.close()


def answers(sent: list[bytes]) -> list[tuple[int, int, str]]:
    """(stream id, status code, message) of the response frames the server sent."""
    out = []
    for frame in FrameDecoder().feed(b"".join(sent)):
        assert isinstance(frame, Frame)
        response = ttrpc_pb.Response.FromString(frame.payload)
        out.append((frame.stream_id, response.status.code, response.status.message))
    return out


async def test_the_server_refuses_what_ttrpc_refuses() -> None:
    sent: list[bytes] = []
    server = TtrpcServer(METHODS, sent.append)
    request = ttrpc_pb.Request(service="s", method="echo", payload=b"x").SerializeToString()
    server.feed(encode_frame(2, MessageType.REQUEST, request))  # even: not a client stream
    server.feed(encode_frame(3, MessageType.REQUEST, b"\xff\xff"))  # not a Request
    server.feed(encode_frame(5, MessageType.REQUEST, request))
    server.feed(encode_frame(5, MessageType.REQUEST, request))  # reused
    server.feed(encode_frame(7, MessageType.DATA, b""))  # streaming: ignored
    await asyncio.sleep(0.01)
    got = answers(sent)
    by_stream: dict[int, list[int]] = {}
    for stream, code, _ in got:
        by_stream.setdefault(stream, []).append(code)
    assert by_stream == {
        2: [StatusCode.INVALID_ARGUMENT],
        3: [StatusCode.INVALID_ARGUMENT],
        5: [StatusCode.INVALID_ARGUMENT, StatusCode.OK],  # the reuse is refused at once; the first answered after
    }
    assert all(s != 7 for s, _, _ in got)


# -- the connection, against a fake runtime on a unix socket -------------------------------------------


async def test_connection_routes_both_services_and_reports_the_close(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    runtime_done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def runtime(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Calls the plugin's "s/echo" on connection 1 in two chunks, answers the plugin's call on 2.
        request = ttrpc_pb.Request(service="s", method="echo", payload=b"from-runtime").SerializeToString()
        wire = encode_chunks(PLUGIN_SERVICE_CONN, encode_frame(1, MessageType.REQUEST, request))
        writer.write(wire[:5])
        await writer.drain()
        writer.write(wire[5:])
        mux, frames = MuxDecoder(), {PLUGIN_SERVICE_CONN: FrameDecoder(), RUNTIME_SERVICE_CONN: FrameDecoder()}
        got_answer = got_call = False
        while not (got_answer and got_call):
            for conn, chunk in mux.feed(await reader.read(4096)):
                for frame in frames[conn].feed(chunk):
                    assert isinstance(frame, Frame)
                    if conn == PLUGIN_SERVICE_CONN:
                        got_answer = True
                        runtime_done.set_result(ttrpc_pb.Response.FromString(frame.payload).payload)
                    else:
                        got_call = True
                        reply = ttrpc_pb.Response(payload=b"registered").SerializeToString()
                        writer.write(encode_chunks(RUNTIME_SERVICE_CONN, encode_frame(frame.stream_id, 2, reply)))
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(runtime, path)
    async with server:
        connection = await connect(path, METHODS)
        assert await connection.client.call("rt", "Register", b"", timeout=5) == b"registered"
        assert await asyncio.wait_for(runtime_done, 5) == b"from-runtime|none"
        reason = await asyncio.wait_for(connection.closed, 5)
        assert reason == "the runtime closed the connection"
        with pytest.raises(RpcError, match="UNAVAILABLE"):
            await connection.client.call("rt", "x", b"", timeout=1)
        await connection.close()


async def test_a_corrupt_stream_ends_the_connection_with_the_reason(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")

    async def runtime(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\0\0\0\x01\xff\xff\xff\xff")  # a chunk of 4 GiB
        await writer.drain()
        await reader.read()

    server = await asyncio.start_unix_server(runtime, path)
    async with server:
        connection = await connect(path, METHODS)
        reason = await asyncio.wait_for(connection.closed, 5)
        assert reason.startswith("unreadable multiplexed stream")
        await connection.close()


async def test_a_ttrpc_frame_over_the_limit_ends_the_connection_naming_size_and_limit(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    request = ttrpc_pb.Request(service="s", method="echo", payload=b"behind").SerializeToString()
    sent_back: list[bytes] = []

    async def runtime(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        header = HEADER.pack(2**32 - 1, 1, MessageType.REQUEST, 0)  # declares 4 GiB
        writer.write(encode_chunks(PLUGIN_SERVICE_CONN, header + encode_frame(3, MessageType.REQUEST, request)))
        await writer.drain()
        sent_back.append(await reader.read())  # until the plugin closes

    server = await asyncio.start_unix_server(runtime, path)
    async with server:
        connection = await connect(path, METHODS)
        reason = await asyncio.wait_for(connection.closed, 5)
        assert reason == (
            "unreadable ttrpc stream: ttrpc frame on stream 1 declares 4294967295 bytes, over the 4194304-byte limit"
        )
        with pytest.raises(RpcError, match="UNAVAILABLE: unreadable ttrpc stream"):
            await connection.client.call("rt", "x", b"", timeout=1)
        await connection.close()
    assert sent_back == [b""]  # the request behind the header was not read as one, nor answered


async def test_connect_says_why_there_is_no_connection(tmp_path: Path) -> None:
    with pytest.raises(NriUnavailable, match=r"does not exist: .*NRI is disabled.*disable = false"):
        await connect(str(tmp_path / "missing.sock"), METHODS)
    (tmp_path / "file").write_text("")
    with pytest.raises(NriUnavailable, match="is not a socket"):
        await connect(str(tmp_path / "file"), METHODS)
    stale = tmp_path / "stale.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(stale))  # bound, never listening: what a runtime that died leaves
    try:
        with pytest.raises(NriUnavailable, match="nothing accepts connections"):
            await connect(str(stale), METHODS)
    finally:
        sock.close()


# -- registration, against a fake runtime that misbehaves in each way NRI can -----------------------------


class FakeRuntime:
    """NRI's side of the socket, one script per accepted connection (the last one repeats):

    * ``silent``: never answers RegisterPlugin; ``close``: closes instead of answering;
    * ``refuse``: answers RegisterPlugin with INVALID_ARGUMENT, as NRI does for a bad index;
    * ``no-configure``: answers it, then sends nothing; ``close-after-register``: answers, then closes;
    * ``full``: answers, Configure, Synchronize, then stays; ``shutdown``: as full, then Shutdown and close;
    * ``oversized``: as full, then a ttrpc header declaring 4 GiB and a request behind it.
    """

    def __init__(self, scripts: list[str]) -> None:
        self.scripts = scripts
        self.connections = 0
        self.registrations: list[nri_pb.RegisterPluginRequest] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        script = self.scripts[min(self.connections, len(self.scripts) - 1)]
        self.connections += 1
        queues: dict[int, asyncio.Queue[Frame]] = {
            PLUGIN_SERVICE_CONN: asyncio.Queue(),
            RUNTIME_SERVICE_CONN: asyncio.Queue(),
        }
        closed = asyncio.ensure_future(self._demux(reader, queues))
        try:
            await self._play(script, writer, queues, closed)
        finally:
            writer.close()
            closed.cancel()

    @staticmethod
    async def _demux(reader: asyncio.StreamReader, queues: dict[int, asyncio.Queue[Frame]]) -> None:
        mux, frames = MuxDecoder(), {conn: FrameDecoder() for conn in queues}
        while data := await reader.read(4096):
            for conn, chunk in mux.feed(data):
                for frame in frames[conn].feed(chunk):
                    assert isinstance(frame, Frame)
                    queues[conn].put_nowait(frame)

    async def _play(
        self, script: str, writer: asyncio.StreamWriter, queues: dict[int, asyncio.Queue[Frame]], closed: Any
    ) -> None:
        frame = await queues[RUNTIME_SERVICE_CONN].get()
        request = ttrpc_pb.Request.FromString(frame.payload)
        assert (request.service, request.method) == ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin")
        self.registrations.append(nri_pb.RegisterPluginRequest.FromString(request.payload))
        if script == "silent":
            await closed
            return
        if script == "close":
            return
        status = (
            ttrpc_pb.Status(code=StatusCode.INVALID_ARGUMENT, message="invalid plugin index")
            if script == "refuse"
            else None
        )
        reply = ttrpc_pb.Response(payload=nri_pb.Empty().SerializeToString(), status=status)
        writer.write(
            encode_chunks(
                RUNTIME_SERVICE_CONN, encode_frame(frame.stream_id, MessageType.RESPONSE, reply.SerializeToString())
            )
        )
        if script in ("refuse", "no-configure"):
            await closed
            return
        if script == "close-after-register":
            await writer.drain()
            return
        calls = [
            ("Configure", nri_pb.ConfigureRequest(runtime_name="fake")),
            ("Synchronize", nri_pb.SynchronizeRequest()),
        ]
        if script == "shutdown":
            calls.append(("Shutdown", nri_pb.Empty()))
        for stream, (method, message) in enumerate(calls):
            call = ttrpc_pb.Request(
                service="nri.pkg.api.v1alpha1.Plugin", method=method, payload=message.SerializeToString()
            )
            writer.write(
                encode_chunks(
                    PLUGIN_SERVICE_CONN, encode_frame(2 * stream + 1, MessageType.REQUEST, call.SerializeToString())
                )
            )
            answer = await queues[PLUGIN_SERVICE_CONN].get()
            assert ttrpc_pb.Response.FromString(answer.payload).status.code == StatusCode.OK, method
        if script == "oversized":
            request = ttrpc_pb.Request(service="nri.pkg.api.v1alpha1.Plugin", method="Synchronize").SerializeToString()
            header = HEADER.pack(2**32 - 1, 5, MessageType.REQUEST, 0)
            writer.write(encode_chunks(PLUGIN_SERVICE_CONN, header + encode_frame(7, MessageType.REQUEST, request)))
        if script != "shutdown":
            await closed


def nri_plugin(path: str, ready_timeout: float = 2.0) -> tuple[NriPlugin, list[str]]:
    shutdowns: list[str] = []
    hooks = NriHooks(PluginRunner([], registry=CollectorRegistry()), NriMetrics(CollectorRegistry()))
    hooks.on_shutdown = lambda: shutdowns.append("shutdown")
    settings = NriSettings(path, ready_timeout=ready_timeout, reconnect_min=0.05, reconnect_max=0.1)
    return NriPlugin(hooks, settings), shutdowns


@pytest.mark.parametrize(
    ("script", "error", "message"),
    [
        ("silent", TimeoutError, r"sent no answer to RegisterPlugin within 0\.3s"),
        ("close", NriUnavailable, "did not register us: UNAVAILABLE: the runtime closed the connection"),
        ("refuse", NriUnavailable, "did not register us: INVALID_ARGUMENT: invalid plugin index"),
        ("no-configure", TimeoutError, r"sent no Configure within 0\.3s"),
        ("close-after-register", NriUnavailable, "NRI closed the connection while registering us"),
    ],
)
async def test_registration_failures_say_what_went_wrong(
    tmp_path: Path, script: str, error: type[Exception], message: str
) -> None:
    path = str(tmp_path / "nri.sock")
    runtime = FakeRuntime([script])
    server = await asyncio.start_unix_server(runtime, path)
    async with server:
        plugin, _ = nri_plugin(path, ready_timeout=0.3)
        with pytest.raises(error, match=message) as info:
            await plugin.start()
        assert isinstance(info.value, OSError)  # what `serve` turns into "runtime-hooks: <reason>", exit 1
        assert [(r.plugin_name, r.plugin_idx) for r in runtime.registrations] == [("runtime-hooks", "50")]
        assert plugin.connection is None and plugin.hooks.metrics.connected._value.get() == 0
        await plugin.stop()


@pytest.mark.parametrize(
    ("script", "reason", "shutdowns"),
    [
        ("shutdown", "the runtime shut NRI down", ["shutdown"]),
        (  # the connection is ended by the plugin; the request behind the header is never read
            "oversized",
            "unreadable ttrpc stream: ttrpc frame on stream 5 declares 4294967295 bytes, over the 4194304-byte limit",
            [],
        ),
    ],
)
async def test_the_end_of_a_connection_is_logged_with_its_reason_and_the_plugin_registers_again(
    tmp_path: Path, script: str, reason: str, shutdowns: list[str]
) -> None:
    path = str(tmp_path / "nri.sock")
    runtime = FakeRuntime([script, "full"])
    server = await asyncio.start_unix_server(runtime, path)
    async with server:
        plugin, shutdowns_seen = nri_plugin(path)
        with capture_logs() as logs:
            await plugin.start()
            for _ in range(200):
                if plugin.registrations == 2:
                    break
                await asyncio.sleep(0.02)
        # registered again: the new connection's Configure and Synchronize were answered
        assert plugin.registrations == 2 and runtime.connections == 2
        assert shutdowns_seen == shutdowns
        [lost] = [entry for entry in logs if entry["event"] == "NRI connection lost; reconnecting"]
        assert lost["reason"].startswith(reason)
        assert plugin.hooks.metrics.reconnects._value.get() == 1
        await plugin.stop()


async def test_a_runtime_that_stays_away_is_retried_until_it_is_back(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    runtime = FakeRuntime(["full", "refuse", "close", "full"])
    server = await asyncio.start_unix_server(runtime, path)
    async with server:
        plugin, _ = nri_plugin(path)
        await plugin.start()
        assert plugin.connection is not None
        with capture_logs() as logs:
            await plugin.connection.close()  # as if the runtime dropped us
            for _ in range(200):
                if plugin.registrations == 2:
                    break
                await asyncio.sleep(0.02)
        assert plugin.registrations == 2 and runtime.connections == 4
        failures = [entry["error"] for entry in logs if entry["event"] == "NRI reconnection failed"]
        assert len(failures) == 2 and "INVALID_ARGUMENT" in failures[0] and "closed the connection" in failures[1]
        await plugin.stop()
