"""The frame relay end to end: a grpc.aio client -> ProxyServer -> FakeRuntime, all in-process.

Each test compares what a client sees through the proxy with what the backend did (and,
where it matters, with a direct call to the backend in the same test).
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import grpc
import pytest
from fake_runtime import (
    BIG_METADATA_OPTIONS,
    FUTURE_METHOD,
    Failure,
    FakeRuntime,
    MiB,
    ProxyUnderTest,
    RawH2Client,
    RawH2Server,
    direct_channel,
    rpc_status_bytes,
    short_tempdir,
    sock,
)
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.api.runtime.v1 import api_pb2_grpc as pb_grpc
from runtimeproxy.proxy.metrics import CallMetrics
from runtimeproxy.relay.call_interceptor import CallContext, CallOutcome, RejectCall
from runtimeproxy.relay.methods import MethodInfo
from runtimeproxy.wire import grpc_framing

T = TypeVar("T")
CALL_TIMEOUT = 10.0
VERSION_PATH = "/runtime.v1.RuntimeService/Version"


async def within(awaitable: Awaitable[T], seconds: float = 5.0) -> T:
    """Await with a bound, so a relay that stalls fails the test instead of hanging it."""
    return await asyncio.wait_for(awaitable, seconds)


async def eventually(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def until_not_ready(channel: grpc.aio.Channel, seconds: float = 5.0) -> None:
    """Wait until the channel has noticed that its connection went away."""
    await eventually(lambda: channel.get_state() != grpc.ChannelConnectivity.READY, seconds)


async def rpc_error(awaitable: Awaitable[Any], seconds: float = CALL_TIMEOUT) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await within(awaitable, seconds)
    return info.value


def runtime(channel: grpc.aio.Channel) -> pb_grpc.RuntimeServiceStub:
    return pb_grpc.RuntimeServiceStub(channel)


def images(channel: grpc.aio.Channel) -> pb_grpc.ImageServiceStub:
    return pb_grpc.ImageServiceStub(channel)


def list_request(count: int) -> pb.ListContainersRequest:
    return pb.ListContainersRequest(filter=pb.ContainerFilter(label_selector={"count": str(count)}))


def create_request(name: str, annotation_bytes: int = 0) -> pb.CreateContainerRequest:
    annotations = {"big": "a" * annotation_bytes} if annotation_bytes else {}
    return pb.CreateContainerRequest(
        pod_sandbox_id="pod-1",
        config=pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name), image=pb.ImageSpec(image="busybox"), annotations=annotations
        ),
    )


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def sockdir() -> Iterator[str]:
    with short_tempdir() as directory:
        yield directory


@pytest.fixture
async def fake(sockdir: str) -> AsyncIterator[FakeRuntime]:
    server = await FakeRuntime("runtime").start(sock(sockdir, "rt.sock"))
    yield server
    await server.stop()


@pytest.fixture
async def proxy(sockdir: str, fake: FakeRuntime) -> AsyncIterator[ProxyUnderTest]:
    assert fake.path is not None
    async with ProxyUnderTest(sock(sockdir, "proxy.sock"), fake.path) as under_test:
        yield under_test


@pytest.fixture
async def direct(fake: FakeRuntime) -> AsyncIterator[grpc.aio.Channel]:
    assert fake.path is not None
    channel = direct_channel(fake.path)
    yield channel
    await channel.close()


# -- unary calls --------------------------------------------------------------------------------


async def test_unary_responses_match_direct_calls(proxy: ProxyUnderTest, direct: grpc.aio.Channel) -> None:
    via_proxy, straight = runtime(proxy.channel()), runtime(direct)
    for count in (0, 1, 250):
        a = await straight.ListContainers(list_request(count), timeout=CALL_TIMEOUT)
        b = await via_proxy.ListContainers(list_request(count), timeout=CALL_TIMEOUT)
        assert len(b.containers) == count
        assert b.SerializeToString(deterministic=True) == a.SerializeToString(deterministic=True)
    a = await straight.Version(pb.VersionRequest(version="0.1.0"), timeout=CALL_TIMEOUT)
    b = await via_proxy.Version(pb.VersionRequest(version="0.1.0"), timeout=CALL_TIMEOUT)
    assert b == a and b.runtime_name == "runtime"
    status = pb.ContainerStatusRequest(container_id="size:70000", verbose=True)
    a = await straight.ContainerStatus(status, timeout=CALL_TIMEOUT)
    b = await via_proxy.ContainerStatus(status, timeout=CALL_TIMEOUT)
    assert b == a and len(b.info["blob"]) == 70000


async def test_request_metadata_reaches_backend_unchanged(
    fake: FakeRuntime, proxy: ProxyUnderTest, direct: grpc.aio.Channel
) -> None:
    metadata = (
        ("x-request-id", "req-1"),
        ("x-multi", "first"),
        ("x-multi", "second"),
        ("x-spaces", "a value, with; punctuation=1"),
        ("x-text-bin", b"utf-8 safe binary"),
    )
    await runtime(direct).Version(pb.VersionRequest(version="d"), metadata=metadata, timeout=CALL_TIMEOUT)
    call = runtime(proxy.channel()).Version(pb.VersionRequest(version="p"), metadata=metadata, timeout=CALL_TIMEOUT)
    response = await call
    seen_direct, seen_proxied = fake.calls("Version")
    assert seen_proxied.metadata == seen_direct.metadata
    for key, value in metadata:
        assert (key, value) in seen_proxied.metadata
    # ...and the response's echo of it came back in fields and trailing metadata.
    assert "x-request-id='req-1'" in response.runtime_version
    trailing = await call.trailing_metadata()
    assert ("echo-x-request-id", "req-1") in list(trailing)
    assert ("echo-x-text-bin", b"utf-8 safe binary") in list(trailing)


async def test_binary_request_metadata_does_not_break_the_connection(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    channel = proxy.channel()
    stub = runtime(channel)
    control = fake.stream("GetContainerEvents")
    events = stub.GetContainerEvents(pb.GetEventsRequest())
    await within(control.started.wait())
    blob = bytes(range(256))
    await stub.Version(pb.VersionRequest(version="bin"), metadata=(("x-blob-bin", blob),), timeout=CALL_TIMEOUT)
    assert fake.calls("Version")[-1].meta("x-blob-bin") == blob
    # The event stream opened earlier on the same connection must still be alive.
    control.queue.put_nowait(pb.ContainerEventResponse(container_id="after-binary"))
    message = await within(events.read())
    assert message.container_id == "after-binary"
    events.cancel()


async def test_backend_sees_the_callers_deadline(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    stub = runtime(proxy.channel())
    await stub.Version(pb.VersionRequest(version="deadline"), timeout=7.0)
    remaining = fake.calls("Version")[-1].time_remaining
    assert remaining is not None and 6.0 < remaining <= 7.0 * 1.02  # grpc-core rounds up ~1%
    await stub.Version(pb.VersionRequest(version="no deadline"))
    assert fake.calls("Version")[-1].time_remaining is None
    await stub.Version(pb.VersionRequest(version="short"), timeout=0.5)
    remaining = fake.calls("Version")[-1].time_remaining
    assert remaining is not None and 0.0 < remaining <= 0.5 * 1.02


async def test_error_status_reaches_client_unchanged(
    fake: FakeRuntime, proxy: ProxyUnderTest, direct: grpc.aio.Channel
) -> None:
    request = pb.StopContainerRequest(container_id="abc")
    straight = await rpc_error(runtime(direct).StopContainer(request, timeout=CALL_TIMEOUT))
    proxied = await rpc_error(runtime(proxy.channel()).StopContainer(request, timeout=CALL_TIMEOUT))
    assert proxied.code() == straight.code() == grpc.StatusCode.NOT_FOUND
    assert proxied.details() == straight.details() == fake.failure.details
    assert list(proxied.trailing_metadata()) == list(straight.trailing_metadata())
    assert ("grpc-status-details-bin", fake.failure.status_details) in list(proxied.trailing_metadata())
    assert ("x-error-blob-bin", b"\x00\x01\xfe\xff") in list(proxied.trailing_metadata())
    assert list(proxied.initial_metadata()) == list(straight.initial_metadata())


async def test_error_status_ascii_only_and_odd_details(
    fake: FakeRuntime, proxy: ProxyUnderTest, direct: grpc.aio.Channel
) -> None:
    for details in ("plain", "", "100% done\nnext line\t|", "ünïcödé ✓ " * 100):
        fake.failure = Failure(grpc.StatusCode.FAILED_PRECONDITION, details, (("x-k", "v"),), None)
        request = pb.StopContainerRequest(container_id="abc")
        straight = await rpc_error(runtime(direct).StopContainer(request, timeout=CALL_TIMEOUT))
        proxied = await rpc_error(runtime(proxy.channel()).StopContainer(request, timeout=CALL_TIMEOUT))
        assert (proxied.code(), proxied.details()) == (straight.code(), straight.details())
        assert list(proxied.trailing_metadata()) == list(straight.trailing_metadata())


async def test_unknown_method_is_relayed(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    call = proxy.channel().unary_unary(FUTURE_METHOD)
    payload = bytes(range(256)) * 100
    assert await call(payload, timeout=CALL_TIMEOUT) == b"future:" + payload
    assert await call(b"", timeout=CALL_TIMEOUT) == b"future:"
    assert [r.request for r in fake.calls("FutureCall")] == [payload, b""]


async def test_unimplemented_method_of_the_backend_comes_back_unimplemented(
    proxy: ProxyUnderTest, direct: grpc.aio.Channel
) -> None:
    request = pb.ReopenContainerLogRequest(container_id="c")
    straight = await rpc_error(runtime(direct).ReopenContainerLog(request, timeout=CALL_TIMEOUT))
    proxied = await rpc_error(runtime(proxy.channel()).ReopenContainerLog(request, timeout=CALL_TIMEOUT))
    assert proxied.code() == straight.code() == grpc.StatusCode.UNIMPLEMENTED
    assert proxied.details() == straight.details()


async def test_large_metadata_spans_continuation_frames(
    fake: FakeRuntime, proxy: ProxyUnderTest, direct: grpc.aio.Channel
) -> None:
    """Header blocks over 16 KiB go out as HEADERS + CONTINUATION, in both directions."""
    metadata = tuple((f"x-big-{i}", chr(ord("a") + i) * 9000) for i in range(5))
    channel = proxy.channel(options=BIG_METADATA_OPTIONS)
    for _ in range(3):  # repeated, so HPACK indexes the big fields and refers back to them
        call = runtime(channel).Version(pb.VersionRequest(version="big"), metadata=metadata, timeout=CALL_TIMEOUT)
        assert (await call).version == "big"
        trailing = list(await call.trailing_metadata())
        assert all((f"echo-{k}", v) in trailing for k, v in metadata)
        assert all(pair in fake.calls("Version")[-1].metadata for pair in metadata)
    # And a normal call afterwards, on the same connection.
    assert (await runtime(channel).Version(pb.VersionRequest(version="s"), timeout=CALL_TIMEOUT)).version == "s"


# -- server streaming ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GetContainerEvents", "StreamContainers"])
async def test_server_stream_is_relayed_message_by_message(
    fake: FakeRuntime, proxy: ProxyUnderTest, method: str
) -> None:
    stub = runtime(proxy.channel())
    control = fake.stream(method)

    def message(k: int) -> Any:
        if method == "GetContainerEvents":
            return pb.ContainerEventResponse(container_id=f"c{k}", created_at=k)
        return pb.StreamContainersResponse(containers=[pb.Container(id=f"c{k}-{i}") for i in range(k + 1)])

    call = (
        stub.GetContainerEvents(pb.GetEventsRequest())
        if method == "GetContainerEvents"
        else stub.StreamContainers(pb.StreamContainersRequest())
    )
    await within(control.started.wait())
    for k in range(6):
        # Message k+1 is not even queued until the client has read message k.
        control.queue.put_nowait(message(k))
        received = await within(call.read())
        assert received == message(k)
        assert control.queue.empty()
    control.queue.put_nowait(None)
    assert await within(call.read()) is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    await within(control.finished.wait())
    assert not control.cancelled.is_set()


async def test_server_stream_ending_with_an_error(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    control = fake.stream("GetContainerEvents")
    call = runtime(proxy.channel()).GetContainerEvents(pb.GetEventsRequest())
    control.queue.put_nowait(pb.ContainerEventResponse(container_id="one"))
    assert (await within(call.read())).container_id == "one"
    control.queue.put_nowait(Failure(grpc.StatusCode.ABORTED, "stream aborted", (("x-why", "test"),), None))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await within(call.read())
    assert info.value.code() == grpc.StatusCode.ABORTED
    assert info.value.details() == "stream aborted"
    assert ("x-why", "test") in list(info.value.trailing_metadata())


async def test_cancelling_a_stream_cancels_the_backend_handler(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    channel = proxy.channel()
    control = fake.stream("GetContainerEvents")
    call = runtime(channel).GetContainerEvents(pb.GetEventsRequest())
    control.queue.put_nowait(pb.ContainerEventResponse(container_id="first"))
    assert (await within(call.read())).container_id == "first"
    assert proxy.server is not None and proxy.server.active_calls == 1
    call.cancel()
    await within(control.cancelled.wait())
    await eventually(lambda: proxy.server is not None and proxy.server.active_calls == 0)
    # The connection carries on.
    response = await runtime(channel).Version(pb.VersionRequest(version="after"), timeout=CALL_TIMEOUT)
    assert response.version == "after"


async def test_unary_deadline_expiry_cancels_the_backend(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    channel = proxy.channel()
    error = await rpc_error(runtime(channel).ExecSync(pb.ExecSyncRequest(cmd=["sleep", "30"]), timeout=0.3))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await within(fake.exec_cancelled.wait())
    response = await runtime(channel).Version(pb.VersionRequest(version="next"), timeout=CALL_TIMEOUT)
    assert response.version == "next"


async def test_closing_the_channel_cancels_backend_calls(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    channel = proxy.channel()
    control = fake.stream("GetContainerEvents")
    events = runtime(channel).GetContainerEvents(pb.GetEventsRequest())
    hanging = asyncio.ensure_future(runtime(channel).ExecSync(pb.ExecSyncRequest(cmd=["sleep", "30"])))
    await within(fake.exec_started.wait())
    await within(control.started.wait())
    await channel.close()
    await within(fake.exec_cancelled.wait())
    await within(control.cancelled.wait())
    with pytest.raises((grpc.aio.AioRpcError, asyncio.CancelledError)):
        await within(hanging)
    events.cancel()
    await eventually(lambda: proxy.server is not None and proxy.server.active_calls == 0)


async def test_client_socket_closing_cancels_backend_calls(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    client = await RawH2Client().connect(proxy.path)
    request = pb.ExecSyncRequest(cmd=["sleep", "30"]).SerializeToString()
    client.start_call("/runtime.v1.RuntimeService/ExecSync", request)
    await within(fake.exec_started.wait())
    assert proxy.server is not None and proxy.server.active_calls == 1
    await client.close()  # no RST_STREAM, no GOAWAY: the socket just goes away
    await within(fake.exec_cancelled.wait())
    await eventually(lambda: proxy.server is not None and not proxy.server.connections)


# -- message size -------------------------------------------------------------------------------


async def test_six_mib_response_passes(proxy: ProxyUnderTest) -> None:
    stub = runtime(proxy.channel())
    response = await stub.ContainerStatus(
        pb.ContainerStatusRequest(container_id=f"size:{6 * MiB}"), timeout=CALL_TIMEOUT
    )
    assert len(response.info["blob"]) == 6 * MiB
    created = await stub.CreateContainer(create_request("big", 6 * MiB), timeout=CALL_TIMEOUT)
    assert created.container_id == f"big:{len('big') + 6 * MiB}"


async def test_response_over_the_limit_is_resource_exhausted(fake: FakeRuntime, sockdir: str) -> None:
    assert fake.path is not None
    async with ProxyUnderTest(sock(sockdir, "small.sock"), fake.path, max_message_size=5 * MiB) as small:
        stub = runtime(small.channel())
        for _ in range(2):
            error = await rpc_error(
                stub.ContainerStatus(pb.ContainerStatusRequest(container_id=f"size:{6 * MiB}"), timeout=CALL_TIMEOUT)
            )
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "ContainerStatus" in error.details() and str(5 * MiB) in error.details()
            # The next call on the same channel (and connection) succeeds.
            response = await stub.ContainerStatus(
                pb.ContainerStatusRequest(container_id=f"size:{4 * MiB}"), timeout=CALL_TIMEOUT
            )
            assert len(response.info["blob"]) == 4 * MiB
            assert (await stub.Version(pb.VersionRequest(version="v"), timeout=CALL_TIMEOUT)).version == "v"
        assert small.server is not None
        await eventually(lambda: small.server is not None and small.server.active_calls == 0)


async def test_request_over_the_limit_is_resource_exhausted(fake: FakeRuntime, sockdir: str) -> None:
    assert fake.path is not None
    async with ProxyUnderTest(sock(sockdir, "small.sock"), fake.path, max_message_size=5 * MiB) as small:
        channel = small.channel()
        stub = runtime(channel)
        for i in range(2):
            error = await rpc_error(stub.CreateContainer(create_request(f"huge{i}", 6 * MiB), timeout=CALL_TIMEOUT))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "CreateContainer" in error.details()
            created = await stub.CreateContainer(create_request(f"ok{i}", 4 * MiB), timeout=CALL_TIMEOUT)
            assert created.container_id.startswith(f"ok{i}:")
        # The backend never got the oversize requests; the proxy is healthy for everyone.
        assert [r.request.config.metadata.name for r in fake.calls("CreateContainer")] == ["ok0", "ok1"]
        other = runtime(small.channel())
        assert (await other.Version(pb.VersionRequest(version="w"), timeout=CALL_TIMEOUT)).version == "w"
        await eventually(lambda: small.server is not None and small.server.active_calls == 0)


# -- backend availability -----------------------------------------------------------------------


@pytest.mark.parametrize("stale", [False, True], ids=["no-socket", "stale-socket"])
async def test_backend_down_fails_fast_then_recovers_on_the_same_channel(sockdir: str, stale: bool) -> None:
    backend = sock(sockdir, "later.sock")
    if stale:  # a runtime that died: its socket file is left, nothing listens (ECONNREFUSED)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
            dead.bind(backend)
    async with ProxyUnderTest(sock(sockdir, "proxy.sock"), backend) as proxy:
        channel = proxy.channel()
        stub = runtime(channel)
        started = time.monotonic()
        error = await rpc_error(stub.Version(pb.VersionRequest(version="x"), timeout=CALL_TIMEOUT))
        assert time.monotonic() - started < 5.0
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert backend in error.details()
        # The relay closes that connection; once the channel has seen it (it would, before
        # its next call, but for the race in test_backend_down_goaway_precedes_the_status),
        # its next call reconnects and reaches the backend, started meanwhile.
        await until_not_ready(channel)
        async with FakeRuntime("late", backend):
            response = await stub.Version(pb.VersionRequest(version="y"), timeout=CALL_TIMEOUT)
            assert (response.version, response.runtime_name) == ("y", "late")


async def test_backend_down_goaway_precedes_the_status(sockdir: str) -> None:
    async with ProxyUnderTest(sock(sockdir, "proxy.sock"), sock(sockdir, "absent.sock")) as proxy:
        client = await RawH2Client().connect(proxy.path)
        try:
            answer = await client.call(VERSION_PATH, b"")
            assert answer.status == grpc.StatusCode.UNAVAILABLE.value[0]
            assert answer.goaway_before_end
        finally:
            await client.close()


async def test_backend_restart_while_client_connected(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    channel = proxy.channel()
    stub = runtime(channel)
    assert (await stub.Version(pb.VersionRequest(version="1"), timeout=CALL_TIMEOUT)).version == "1"
    await fake.stop()
    await until_not_ready(channel)  # the relay closed the client connection with the backend's
    await fake.start()
    for i in range(3):
        response = await stub.Version(pb.VersionRequest(version=f"after-{i}"), timeout=CALL_TIMEOUT)
        assert response.version == f"after-{i}"


async def test_backend_stopping_mid_stream_ends_the_stream(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    stub = runtime(proxy.channel())
    control = fake.stream("GetContainerEvents")
    call = stub.GetContainerEvents(pb.GetEventsRequest())
    control.queue.put_nowait(pb.ContainerEventResponse(container_id="one"))
    assert (await within(call.read())).container_id == "one"
    await fake.stop(grace=0)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await within(call.read())
    assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    await fake.start()
    assert (await stub.Version(pb.VersionRequest(version="back"), timeout=CALL_TIMEOUT)).version == "back"


# -- separate image backend ---------------------------------------------------------------------


async def test_separate_image_backend_routes_by_service(fake: FakeRuntime, sockdir: str) -> None:
    assert fake.path is not None
    async with (
        FakeRuntime("images", sock(sockdir, "img.sock")) as image_server,
        ProxyUnderTest(sock(sockdir, "split.sock"), fake.path, image_backend=sock(sockdir, "img.sock")) as split,
    ):
        runtime_channel, image_channel = split.channel(), split.channel()
        version = await runtime(runtime_channel).Version(pb.VersionRequest(version="r"), timeout=3.0)
        assert version.runtime_name == "runtime"
        listed = await images(image_channel).ListImages(pb.ListImagesRequest(), timeout=3.0)
        assert [i.id for i in listed.images] == ["images-image"]
        status = await images(image_channel).ImageStatus(
            pb.ImageStatusRequest(image=pb.ImageSpec(image="busybox")), timeout=CALL_TIMEOUT
        )
        assert status.image.id == "images:busybox"
        # An image call on the runtime connection is refused with a reason, not misrouted.
        error = await rpc_error(images(runtime_channel).ListImages(pb.ListImagesRequest(), timeout=CALL_TIMEOUT))
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "ListImages" in error.details()
        assert image_server.path is not None and image_server.path in error.details()
        assert "separate connections" in error.details()
        # ...and the other way round.
        error = await rpc_error(runtime(image_channel).Version(pb.VersionRequest(), timeout=CALL_TIMEOUT))
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        # Both connections still work; nothing reached the wrong server.
        assert (await runtime(runtime_channel).Version(pb.VersionRequest(version="r2"))).version == "r2"
        assert len((await images(image_channel).ListImages(pb.ListImagesRequest())).images) == 1
        assert fake.calls("ListImages") == []
        assert image_server.calls("Version") == []
        assert [r.method for r in image_server.received] == ["ListImages", "ImageStatus", "ListImages"]


async def test_separate_image_backend_routing_with_an_eager_client(fake: FakeRuntime, sockdir: str) -> None:
    """The routing itself, seen with a client that sends its first request at once."""
    assert fake.path is not None
    image_path = sock(sockdir, "img.sock")
    async with (
        FakeRuntime("images", image_path) as image_server,
        ProxyUnderTest(sock(sockdir, "split.sock"), fake.path, image_backend=image_path) as split,
    ):
        runtime_conn = await RawH2Client().connect(split.path)
        image_conn = await RawH2Client().connect(split.path)
        try:
            version_path = VERSION_PATH
            list_images = "/runtime.v1.ImageService/ListImages"
            # The first call's header block is prioritised and split in three frames.
            answer = await runtime_conn.call(
                version_path,
                pb.VersionRequest(version="r").SerializeToString(),
                priority=True,
                header_chunks=3,
            )
            assert answer.status == 0
            assert pb.VersionResponse.FromString(answer.messages()[0]).runtime_name == "runtime"
            answer = await image_conn.call(list_images, b"")
            assert answer.status == 0
            assert pb.ListImagesResponse.FromString(answer.messages()[0]).images[0].id == "images-image"
            misrouted = await runtime_conn.call(list_images, b"")
            assert misrouted.status == grpc.StatusCode.UNIMPLEMENTED.value[0]
            reason = urllib.parse.unquote(misrouted.header("grpc-message") or "")
            assert image_path in reason and "separate connections" in reason
            misrouted = await image_conn.call(version_path, b"")
            assert misrouted.status == grpc.StatusCode.UNIMPLEMENTED.value[0]
            # Both connections go on working.
            answer = await runtime_conn.call(version_path, pb.VersionRequest(version="r2").SerializeToString())
            assert pb.VersionResponse.FromString(answer.messages()[0]).version == "r2"
            answer = await image_conn.call(list_images, b"")
            assert answer.status == 0
            assert fake.calls("ListImages") == [] and image_server.calls("Version") == []
            assert [r.method for r in image_server.received] == ["ListImages", "ListImages"]
        finally:
            await runtime_conn.close()
            await image_conn.close()


# -- graceful shutdown --------------------------------------------------------------------------


async def test_shutdown_lets_calls_in_flight_finish_and_refuses_new_connections(
    fake: FakeRuntime, proxy: ProxyUnderTest
) -> None:
    assert proxy.server is not None
    stub = runtime(proxy.channel())
    slow = asyncio.ensure_future(stub.ExecSync(pb.ExecSyncRequest(cmd=["sleep", "1.0"]), timeout=CALL_TIMEOUT))
    await within(fake.exec_started.wait())
    shutdown = asyncio.ensure_future(proxy.server.shutdown(grace=5))
    await eventually(lambda: proxy.server is not None and proxy.server.active_calls == 1 and not shutdown.done())
    await asyncio.sleep(0.05)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe, pytest.raises(OSError):
        probe.connect(proxy.path)
    late = grpc.aio.insecure_channel(proxy.target)
    try:
        error = await rpc_error(runtime(late).Version(pb.VersionRequest(), timeout=1.0))
        assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        await late.close()
    response = await within(slow)
    assert response.stdout == b"sleep 1.0"
    await within(shutdown, 5.0)
    assert not fake.exec_cancelled.is_set()


async def test_shutdown_grace_cuts_off_hanging_calls(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    assert proxy.server is not None
    stub = runtime(proxy.channel())
    hanging = asyncio.ensure_future(stub.ExecSync(pb.ExecSyncRequest(cmd=["sleep", "30"]), timeout=CALL_TIMEOUT))
    await within(fake.exec_started.wait())
    started = time.monotonic()
    await within(proxy.server.shutdown(grace=0.2), 5.0)
    assert time.monotonic() - started < 3.0
    error = await rpc_error(hanging, 5.0)
    assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL)
    await within(fake.exec_cancelled.wait())


# -- load -----------------------------------------------------------------------------------------


async def test_many_concurrent_calls(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    stub = runtime(proxy.channel())

    async def worker(task: int) -> list[str]:
        results = []
        for i in range(200 // 16 + 1):
            tag = f"t{task}-{i}"
            response = await stub.Version(
                pb.VersionRequest(version=tag), metadata=(("x-tag", tag),), timeout=CALL_TIMEOUT
            )
            assert response.version == tag
            assert response.runtime_version == f"x-tag={tag!r}"
            results.append(response.version)
        return results

    results = await within(asyncio.gather(*(worker(t) for t in range(16))), 30.0)
    flat = [tag for per_task in results for tag in per_task]
    assert len(flat) == len(set(flat)) == 16 * (200 // 16 + 1)
    assert sorted(r.request.version for r in fake.calls("Version")) == sorted(flat)


async def test_mixed_concurrent_traffic_on_one_connection(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    stub = runtime(proxy.channel())
    control = fake.stream("GetContainerEvents")
    events = stub.GetContainerEvents(pb.GetEventsRequest())

    async def big(i: int) -> None:
        response = await stub.ContainerStatus(
            pb.ContainerStatusRequest(container_id=f"size:{MiB + i}"), timeout=CALL_TIMEOUT
        )
        assert len(response.info["blob"]) == MiB + i

    async def small(i: int) -> None:
        response = await stub.ListContainers(list_request(i), timeout=CALL_TIMEOUT)
        assert len(response.containers) == i

    async def upload(i: int) -> None:
        created = await stub.CreateContainer(create_request(f"u{i}", 512 * 1024 + i), timeout=CALL_TIMEOUT)
        assert created.container_id == f"u{i}:{3 + 512 * 1024 + i}"

    async def stream() -> None:
        for k in range(20):
            control.queue.put_nowait(pb.ContainerEventResponse(container_id=f"e{k}"))
            assert (await events.read()).container_id == f"e{k}"
        control.queue.put_nowait(None)
        assert await events.read() is grpc.aio.EOF

    jobs = [big(i) for i in range(8)] + [small(i) for i in range(40)] + [upload(i) for i in range(8)]
    await within(asyncio.gather(stream(), *jobs), 30.0)


# -- the interceptor seam -----------------------------------------------------------------------


class ScriptedInterceptor:
    """Claims the methods named; ``change`` rewrites (or rejects) the decoded request."""

    def __init__(
        self,
        methods: set[str],
        change: Callable[[CallContext, bytes], Awaitable[bytes]] | None = None,
    ) -> None:
        self.methods = methods
        self.change = change
        self.before_calls: list[tuple[CallContext, bytes]] = []
        self.outcomes: list[tuple[CallContext, bytes, CallOutcome]] = []

    def intercepts(self, method: MethodInfo) -> bool:
        return method.name in self.methods

    async def before(self, call: CallContext, request: bytes) -> bytes:
        self.before_calls.append((call, request))
        return request if self.change is None else await self.change(call, request)

    async def after(self, call: CallContext, request: bytes, outcome: CallOutcome) -> None:
        self.outcomes.append((call, request, outcome))


def update_request(container_id: str, shares: int = 2) -> pb.UpdateContainerResourcesRequest:
    return pb.UpdateContainerResourcesRequest(
        container_id=container_id, linux=pb.LinuxContainerResources(cpu_shares=shares)
    )


async def intercepted_proxy(sockdir: str, fake: FakeRuntime, interceptor: Any, **settings: Any) -> ProxyUnderTest:
    assert fake.path is not None
    return await ProxyUnderTest(sock(sockdir, "hooked.sock"), fake.path, interceptor=interceptor, **settings).start()


async def test_interceptor_changes_the_request(fake: FakeRuntime, sockdir: str) -> None:
    async def double_shares(call: CallContext, request: bytes) -> bytes:
        message = pb.UpdateContainerResourcesRequest.FromString(request)
        message.linux.cpu_shares *= 512
        message.annotations["hooked"] = "yes"
        return message.SerializeToString()

    hooks = ScriptedInterceptor({"UpdateContainerResources"}, double_shares)
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    try:
        stub = runtime(proxy.channel())
        await stub.UpdateContainerResources(
            update_request("c1", 2), metadata=(("x-caller", "kubelet"),), timeout=CALL_TIMEOUT
        )
        (seen,) = fake.calls("UpdateContainerResources")
        assert seen.request.linux.cpu_shares == 1024 and seen.request.annotations["hooked"] == "yes"
        assert seen.meta("x-caller") == "kubelet"
        assert seen.time_remaining is not None and seen.time_remaining > CALL_TIMEOUT - 2
        call, original = hooks.before_calls[0]
        assert pb.UpdateContainerResourcesRequest.FromString(original) == update_request("c1", 2)
        assert call.method.path == "/runtime.v1.RuntimeService/UpdateContainerResources"
        assert ("x-caller", "kubelet") in call.metadata
        loop_now = asyncio.get_running_loop().time()
        # grpc-core rounds grpc-timeout up by about 1% (10 s may go out as "10100m").
        assert call.deadline is not None and CALL_TIMEOUT - 2 < call.deadline - loop_now <= CALL_TIMEOUT * 1.02
        # Methods it does not claim are untouched and never reach the hooks.
        await stub.Version(pb.VersionRequest(version="v"), timeout=CALL_TIMEOUT)
        assert len(hooks.before_calls) == 1
    finally:
        await proxy.stop()


async def test_interceptor_after_sees_response_and_status(fake: FakeRuntime, sockdir: str) -> None:
    hooks = ScriptedInterceptor({"CreateContainer", "StopContainer"})
    fake.failure = Failure(grpc.StatusCode.NOT_FOUND, "no such container", (), None)
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    try:
        stub = runtime(proxy.channel())
        created = await stub.CreateContainer(create_request("after"), timeout=CALL_TIMEOUT)
        error = await rpc_error(stub.StopContainer(pb.StopContainerRequest(container_id="x"), timeout=CALL_TIMEOUT))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        await eventually(lambda: len(hooks.outcomes) == 2)
        (_, request, ok), (_, stop_request, failed) = hooks.outcomes
        assert pb.CreateContainerRequest.FromString(request) == create_request("after")
        assert (ok.code, ok.message) == (0, "")
        assert ok.response is not None and pb.CreateContainerResponse.FromString(ok.response) == created
        assert pb.StopContainerRequest.FromString(stop_request).container_id == "x"
        assert (failed.code, failed.message, failed.response) == (5, "no such container", None)
    finally:
        await proxy.stop()


async def test_interceptor_after_runs_for_a_call_the_client_cancels(fake: FakeRuntime, sockdir: str) -> None:
    hooks = ScriptedInterceptor({"ExecSync"})
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    try:
        call = runtime(proxy.channel()).ExecSync(pb.ExecSyncRequest(cmd=["sleep", "30"]), timeout=CALL_TIMEOUT)
        await within(fake.exec_started.wait())
        call.cancel()
        await within(fake.exec_cancelled.wait())
        await eventually(lambda: len(hooks.outcomes) == 1)
        _, request, outcome = hooks.outcomes[0]
        assert pb.ExecSyncRequest.FromString(request).cmd == ["sleep", "30"]
        assert (outcome.code, outcome.response) == (grpc.StatusCode.CANCELLED.value[0], None)
    finally:
        await proxy.stop()


@pytest.mark.parametrize(
    "lost",
    [
        "client",
        "backend",  # grpc-core ends its calls itself when stopping: not the side_lost path
    ],
)
async def test_interceptor_after_runs_when_the_connection_is_lost(fake: FakeRuntime, sockdir: str, lost: str) -> None:
    hooks = ScriptedInterceptor({"ExecSync"})
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    client = await RawH2Client().connect(proxy.path)
    try:
        request = pb.ExecSyncRequest(cmd=["sleep", "30"]).SerializeToString()
        client.start_call("/runtime.v1.RuntimeService/ExecSync", request)
        await within(fake.exec_started.wait())
        if lost == "client":
            await client.close()  # the socket goes away without RST_STREAM
        else:
            await fake.stop(grace=0)
        await within(fake.exec_cancelled.wait())
        await eventually(lambda: len(hooks.outcomes) == 1, 2.0)
        code = hooks.outcomes[0][2].code
        assert code == (grpc_framing.CANCELLED if lost == "client" else grpc_framing.UNAVAILABLE)
    finally:
        await client.close()
        await proxy.stop()


async def test_interceptor_rejects_the_call(fake: FakeRuntime, sockdir: str) -> None:
    async def reject(call: CallContext, request: bytes) -> bytes:
        if pb.UpdateContainerResourcesRequest.FromString(request).container_id == "forbidden":
            raise RejectCall(grpc.StatusCode.PERMISSION_DENIED.value[0], "denied by policy: 100% ✗")
        return request

    hooks = ScriptedInterceptor({"UpdateContainerResources"}, reject)
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    try:
        stub = runtime(proxy.channel())
        error = await rpc_error(stub.UpdateContainerResources(update_request("forbidden"), timeout=CALL_TIMEOUT))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error.details() == "denied by policy: 100% ✗"
        await stub.UpdateContainerResources(update_request("allowed"), timeout=CALL_TIMEOUT)
        await asyncio.sleep(0.1)
        assert [r.request.container_id for r in fake.calls("UpdateContainerResources")] == ["allowed"]
        assert proxy.server is not None and proxy.server.active_calls == 0
    finally:
        await proxy.stop()


async def test_interceptor_bug_refuses_the_call(fake: FakeRuntime, sockdir: str) -> None:
    """An error escaping the interceptor is a bug in the code that applies the failure
    policies, so nothing says the call may pass unhooked: the relay refuses it."""

    async def broken(call: CallContext, request: bytes) -> bytes:
        raise ValueError("hook bug")

    hooks = ScriptedInterceptor({"UpdateContainerResources"}, broken)
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    try:
        stub = runtime(proxy.channel())
        error = await rpc_error(stub.UpdateContainerResources(update_request("c", 7), timeout=CALL_TIMEOUT))
        assert error.code() == grpc.StatusCode.INTERNAL
        assert "ValueError: hook bug" in (error.details() or "")
        await stub.Version(pb.VersionRequest(), timeout=CALL_TIMEOUT)  # the connection serves on
        assert fake.calls("UpdateContainerResources") == []
        assert hooks.outcomes == []  # never sent on, so there is no after-call
    finally:
        await proxy.stop()


async def test_interceptor_growing_requests_under_concurrent_load(fake: FakeRuntime, sockdir: str) -> None:
    padding = 300 * 1024

    async def grow(call: CallContext, request: bytes) -> bytes:
        message = pb.CreateContainerRequest.FromString(request)
        message.config.annotations["padding"] = "p" * padding
        await asyncio.sleep(0)
        return message.SerializeToString()

    hooks = ScriptedInterceptor({"CreateContainer"}, grow)
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    try:
        stub = runtime(proxy.channel())

        async def create(i: int, own: int) -> None:
            name = f"grown{i}"
            created = await stub.CreateContainer(create_request(name, own), timeout=CALL_TIMEOUT)
            expected = len("padding") + padding + (len("big") + own if own else 0)
            assert created.container_id == f"{name}:{expected}"

        async def version(i: int) -> None:
            response = await stub.Version(pb.VersionRequest(version=f"v{i}"), timeout=CALL_TIMEOUT)
            assert response.version == f"v{i}"

        async def upload(i: int) -> None:
            response = await stub.UpdateContainerResources(
                pb.UpdateContainerResourcesRequest(container_id=f"u{i}", annotations={"x": "y" * 200_000}),
                timeout=CALL_TIMEOUT,
            )
            assert response == pb.UpdateContainerResourcesResponse()

        async def download(i: int) -> None:
            response = await stub.ContainerStatus(
                pb.ContainerStatusRequest(container_id=f"size:{400_000 + i}"), timeout=CALL_TIMEOUT
            )
            assert len(response.info["blob"]) == 400_000 + i

        for _ in range(2):
            jobs = (
                [create(i, 0) for i in range(10)]
                + [create(100 + i, 150_000) for i in range(6)]
                + [version(i) for i in range(40)]
                + [upload(i) for i in range(10)]
                + [download(i) for i in range(6)]
            )
            await within(asyncio.gather(*jobs), 30.0)
        assert len(fake.calls("CreateContainer")) == 32
        assert all(r.request.config.annotations["padding"] == "p" * padding for r in fake.calls("CreateContainer"))
        # After all that, the connection's flow-control windows still let big calls through.
        await within(stub.CreateContainer(create_request("last", 3 * MiB), timeout=CALL_TIMEOUT))
        response = await within(stub.ContainerStatus(pb.ContainerStatusRequest(container_id=f"size:{3 * MiB}")))
        assert len(response.info["blob"]) == 3 * MiB
    finally:
        await proxy.stop()


async def test_slow_before_and_client_cancel_never_reach_backend(fake: FakeRuntime, sockdir: str) -> None:
    entered, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(call: CallContext, request: bytes) -> bytes:
        if pb.UpdateContainerResourcesRequest.FromString(request).container_id != "slow":
            return request
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return request

    hooks = ScriptedInterceptor({"UpdateContainerResources"}, slow)
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    try:
        stub = runtime(proxy.channel())
        call = stub.UpdateContainerResources(update_request("slow"), timeout=CALL_TIMEOUT)
        await within(entered.wait())
        call.cancel()
        await within(cancelled.wait())
        with pytest.raises(asyncio.CancelledError):
            await call
        await stub.UpdateContainerResources(update_request("fast"), timeout=CALL_TIMEOUT)
        await asyncio.sleep(0.1)
        assert [r.request.container_id for r in fake.calls("UpdateContainerResources")] == ["fast"]
        await eventually(lambda: proxy.server is not None and proxy.server.active_calls == 0)
    finally:
        await proxy.stop()


async def test_slow_before_past_the_deadline(fake: FakeRuntime, sockdir: str) -> None:
    async def slow(call: CallContext, request: bytes) -> bytes:
        await asyncio.sleep(1.0)
        return request

    hooks = ScriptedInterceptor({"UpdateContainerResources"}, slow)
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    try:
        stub = runtime(proxy.channel())
        error = await rpc_error(stub.UpdateContainerResources(update_request("late"), timeout=0.2))
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.sleep(1.2)
        assert fake.calls("UpdateContainerResources") == []
        await within(stub.UpdateContainerResources(update_request("next"), timeout=CALL_TIMEOUT))
    finally:
        await proxy.stop()


async def test_gzip_request_is_decompressed_and_hooked(fake: FakeRuntime, sockdir: str) -> None:
    hooks = ScriptedInterceptor({"UpdateContainerResources"}, grow_by(10))
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    try:
        stub = runtime(proxy.channel())
        request = pb.UpdateContainerResourcesRequest(container_id="gz", annotations={"a": "b" * 50_000})
        await stub.UpdateContainerResources(request, compression=grpc.Compression.Gzip, timeout=CALL_TIMEOUT)
        (seen,) = fake.calls("UpdateContainerResources")
        assert seen.request.annotations["a"] == "b" * 50_000
        assert seen.request.annotations["padding"] == "p" * 10  # the hook saw and changed it
        assert [pb.UpdateContainerResourcesRequest.FromString(r) for _, r in hooks.before_calls] == [request]
    finally:
        await proxy.stop()


async def test_intercepted_request_over_the_limit(fake: FakeRuntime, sockdir: str) -> None:
    hooks = ScriptedInterceptor({"CreateContainer"})
    proxy = await intercepted_proxy(sockdir, fake, hooks, max_message_size=1 * MiB)
    try:
        stub = runtime(proxy.channel())
        error = await rpc_error(stub.CreateContainer(create_request("huge", 2 * MiB), timeout=CALL_TIMEOUT))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert hooks.before_calls == []
        created = await stub.CreateContainer(create_request("fits", 512 * 1024), timeout=CALL_TIMEOUT)
        assert created.container_id == f"fits:{3 + 512 * 1024}"
        assert [r.request.config.metadata.name for r in fake.calls("CreateContainer")] == ["fits"]
    finally:
        await proxy.stop()


@pytest.mark.parametrize("hooked", [False, True], ids=["relayed", "intercepted"])
async def test_padded_and_split_frames_from_a_raw_client(fake: FakeRuntime, sockdir: str, hooked: bool) -> None:
    async def mark(call: CallContext, request: bytes) -> bytes:
        message = pb.UpdateContainerResourcesRequest.FromString(request)
        message.annotations["hooked"] = "yes"
        return message.SerializeToString()

    hooks = ScriptedInterceptor({"UpdateContainerResources"} if hooked else set(), mark)
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    client = await RawH2Client().connect(proxy.path)
    try:
        path = "/runtime.v1.RuntimeService/UpdateContainerResources"
        for i, (pad, chunks) in enumerate([(0, 1), (4, 3), (255, 7), (1, 40)]):
            request = pb.UpdateContainerResourcesRequest(
                container_id=f"c{i}", annotations={"payload": "z" * (50_000 * i)}
            )
            answer = await client.call(
                path,
                request.SerializeToString(),
                metadata=[("x-frame-test", str(i))],
                data_pad=pad if hooked else 0,  # grpc-core rejects padding; the relay strips it
                priority=bool(i % 2),
                header_chunks=1 + i,
                data_chunks=chunks,
            )
            assert (answer.status, answer.reset) == (0, None)
            assert answer.messages() == [b""]
            seen = fake.calls("UpdateContainerResources")[-1]
            assert seen.meta("x-frame-test") == str(i)
            assert seen.request.annotations["payload"] == "z" * (50_000 * i)
            assert ("hooked" in seen.request.annotations) == hooked
        assert len(hooks.before_calls) == (4 if hooked else 0)
        assert client.goaway is None
    finally:
        await client.close()
        await proxy.stop()


# -- flow control, frame by frame (bare HTTP/2 client and backend) ---------------------------


UPDATE_PATH = "/runtime.v1.RuntimeService/UpdateContainerResources"


def grow_by(extra: int) -> Callable[[CallContext, bytes], Awaitable[bytes]]:
    async def grow(call: CallContext, request: bytes) -> bytes:
        message = pb.UpdateContainerResourcesRequest.FromString(request)
        message.annotations["padding"] = "p" * extra
        return message.SerializeToString()

    return grow


def update_bytes(container_id: str, size: int = 0) -> bytes:
    annotations = {"own": "o" * size} if size else {}
    return pb.UpdateContainerResourcesRequest(container_id=container_id, annotations=annotations).SerializeToString()


async def raw_pair(
    sockdir: str, backend: RawH2Server, interceptor: Any, **settings: Any
) -> tuple[ProxyUnderTest, RawH2Client]:
    backend_path = sock(sockdir, "raw-backend.sock")
    await backend.start(backend_path)
    proxy = await ProxyUnderTest(
        sock(sockdir, "raw-proxy.sock"), backend_path, interceptor=interceptor, **settings
    ).start()
    return proxy, await RawH2Client().connect(proxy.path)


async def test_connection_credit_comes_back_exactly(sockdir: str) -> None:
    """Every DATA byte the client sends is credited back once: relayed, held, rewritten or dropped."""
    backend = RawH2Server()
    hooks = ScriptedInterceptor({"UpdateContainerResources"}, grow_by(30_000))
    proxy, client = await raw_pair(sockdir, backend, hooks, max_message_size=200_000)
    try:
        answers = [
            await client.call(UPDATE_PATH, update_bytes("hooked", 3000), data_chunks=3, data_pad=17),
            await client.call(VERSION_PATH, pb.VersionRequest(version="v" * 20_000).SerializeToString(), data_chunks=2),
            await client.call(UPDATE_PATH, update_bytes("hooked-big", 90_000), data_chunks=9),
            await client.call(VERSION_PATH, b"x" * 250_000, data_chunks=20),  # over the limit: dropped
            await client.call(FUTURE_METHOD, b"y" * 40_000, data_chunks=4),
        ]
        assert [a.status for a in answers] == [0, 0, 0, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], 0]
        (message,) = grpc_framing.split_messages(bytes(backend.requests[1])) or []
        grown = pb.UpdateContainerResourcesRequest.FromString(message.body)
        assert grown.container_id == "hooked" and len(grown.annotations["padding"]) == 30_000
        assert len(backend.requests[3]) == 5 + len(pb.VersionRequest(version="v" * 20_000).SerializeToString())
        await eventually(lambda: client.conn_credit == client.data_sent, 3.0)
        await asyncio.sleep(0.1)
        assert client.conn_credit == client.data_sent
    finally:
        await client.close()
        await proxy.stop()
        await backend.stop()


async def test_cancelled_rewritten_request_does_not_leak_connection_window(sockdir: str) -> None:
    # Stream windows of 20000 and no stream credit: the relay sends one 16 KiB frame of the
    # grown request, then must wait; the client gives up on the call meanwhile.
    backend = RawH2Server(initial_window=20_000, stream_credit=False)
    hooks = ScriptedInterceptor({"UpdateContainerResources"}, grow_by(40_000))
    proxy, client = await raw_pair(sockdir, backend, hooks)
    try:
        assert (await client.call(FUTURE_METHOD, b"warm-up")).status == 0  # settings exchanged
        stuck = client.start_call(UPDATE_PATH, update_bytes("stuck"))
        await eventually(lambda: backend.data_received >= 16_384)
        client.reset(stuck)
        await eventually(lambda: 3 in backend.resets)
        answer = await client.call(FUTURE_METHOD, b"z" * 500)
        assert answer.status == 0
        await asyncio.sleep(0.2)
        assert client.conn_credit == client.data_sent
    finally:
        await client.close()
        await proxy.stop()
        await backend.stop()


async def test_rewritten_request_fits_a_small_backend_window(sockdir: str) -> None:
    backend = RawH2Server(initial_window=4096)
    hooks = ScriptedInterceptor({"UpdateContainerResources"}, grow_by(10_000))
    proxy, client = await raw_pair(sockdir, backend, hooks)
    try:
        assert (await client.call(FUTURE_METHOD, b"warm-up")).status == 0  # settings exchanged
        answer = await client.call(UPDATE_PATH, update_bytes("small-window"), timeout=3.0)
        assert answer.status == 0
    finally:
        await client.close()
        await proxy.stop()
        await backend.stop()


async def test_message_prefix_split_across_data_frames(fake: FakeRuntime, proxy: ProxyUnderTest) -> None:
    client = await RawH2Client().connect(proxy.path)
    try:
        # First DATA frame: 3 bytes (flag and half the length); the rest follows.
        answer = await client.call(UPDATE_PATH, update_bytes("split-prefix", 100), data_step=3)
        assert answer.status == 0, answer.header("grpc-message")
        assert fake.calls("UpdateContainerResources")[-1].request.container_id == "split-prefix"
    finally:
        await client.close()


# -- metrics --------------------------------------------------------------------------------------


async def test_metrics_count_calls_by_method_and_code(fake: FakeRuntime, sockdir: str) -> None:
    assert fake.path is not None
    registry = CollectorRegistry()
    fake.failure = Failure(grpc.StatusCode.NOT_FOUND, "gone", (("x-k", "v"),), None)
    metrics = CallMetrics(registry)
    async with ProxyUnderTest(sock(sockdir, "m.sock"), fake.path, metrics=metrics, max_message_size=MiB) as proxy:
        stub = runtime(proxy.channel())
        for i in range(5):
            await stub.Version(pb.VersionRequest(version=str(i)), timeout=CALL_TIMEOUT)
        for _ in range(2):
            await rpc_error(stub.StopContainer(pb.StopContainerRequest(container_id="c"), timeout=CALL_TIMEOUT))

        def count(method: str, code: str) -> float | None:
            return registry.get_sample_value(
                "runtimeproxy_cri_calls_total", {"method": f"/runtime.v1.RuntimeService/{method}", "code": code}
            )

        assert count("Version", "OK") == 5
        assert count("StopContainer", "NOT_FOUND") == 2
        assert count("StopContainer", "UNKNOWN") is None
        # Calls the relay ends itself, and calls the client gives up on.
        await rpc_error(stub.ContainerStatus(pb.ContainerStatusRequest(container_id=f"size:{2 * MiB}")))
        assert count("ContainerStatus", "RESOURCE_EXHAUSTED") == 1
        control = fake.stream("GetContainerEvents")
        events = stub.GetContainerEvents(pb.GetEventsRequest())
        await within(control.started.wait())
        events.cancel()
        await within(control.cancelled.wait())
        await eventually(lambda: count("GetContainerEvents", "CANCELLED") == 1)
        durations = registry.get_sample_value("runtimeproxy_cri_call_duration_seconds_count", {"method": VERSION_PATH})
        assert durations == 5
        # Gauges read at scrape time.
        hanging = asyncio.ensure_future(stub.ExecSync(pb.ExecSyncRequest(cmd=["sleep", "30"])))
        await within(fake.exec_started.wait())
        assert registry.get_sample_value("runtimeproxy_cri_calls_in_flight") == 1
        assert registry.get_sample_value("runtimeproxy_connections", {"side": "backend"}) == 1
        hanging.cancel()
        await within(fake.exec_cancelled.wait())
        await eventually(lambda: registry.get_sample_value("runtimeproxy_cri_calls_in_flight") == 0)
        assert registry.get_sample_value("runtimeproxy_connections", {"side": "client"}) == 1


async def test_metrics_count_rich_error_status_under_its_code(fake: FakeRuntime, sockdir: str) -> None:
    assert fake.path is not None
    registry = CollectorRegistry()
    fake.failure = Failure(grpc.StatusCode.NOT_FOUND, "gone", (), rpc_status_bytes(5, "gone", [("t", b"\xff\xfe")]))
    async with ProxyUnderTest(sock(sockdir, "m.sock"), fake.path, metrics=CallMetrics(registry)) as proxy:
        stub = runtime(proxy.channel())
        error = await rpc_error(stub.StopContainer(pb.StopContainerRequest(container_id="c"), timeout=CALL_TIMEOUT))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        labels = {"method": "/runtime.v1.RuntimeService/StopContainer", "code": "NOT_FOUND"}
        assert registry.get_sample_value("runtimeproxy_cri_calls_total", labels) == 1


def _gzip(body: bytes) -> bytes:
    return gzip.compress(body)


@pytest.mark.parametrize(
    ("body", "metadata", "reason"),
    [
        (grpc_framing.encode_message(update_bytes("a")) + grpc_framing.encode_message(update_bytes("b")),
         [], "exactly one message, got 2"),
        (grpc_framing.encode_message(update_bytes("a"))[:-3], [], "not whole length-prefixed"),
        (grpc_framing.encode_message(b"x" * 40, compressed=True), [("grpc-encoding", "snappy")], "'snappy'"),
        (grpc_framing.encode_message(b"not gzip", compressed=True), [("grpc-encoding", "gzip")], "does not decompress"),
        (grpc_framing.encode_message(_gzip(b"\0" * 300_000), compressed=True), [("grpc-encoding", "gzip")],
         "inflates to over"),
    ],
    ids=["two-messages", "truncated", "unknown-encoding", "bad-gzip", "gzip-bomb"],
)
async def test_intercepted_request_that_is_not_one_valid_message_is_refused(
    fake: FakeRuntime, sockdir: str, body: bytes, metadata: list[tuple[str, str]], reason: str
) -> None:
    """The hooks could not see such a request, so it never reaches the runtime around them."""
    hooks = ScriptedInterceptor({"UpdateContainerResources"})
    proxy = await intercepted_proxy(sockdir, fake, hooks, max_message_size=200_000)
    client = await RawH2Client().connect(proxy.path)
    try:
        answer = await client.call(UPDATE_PATH, body, metadata=metadata, framed=True)
        assert answer.status == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert reason in urllib.parse.unquote(answer.header("grpc-message") or "")
        assert hooks.before_calls == []
        assert fake.calls("UpdateContainerResources") == []
        assert (await client.call(UPDATE_PATH, update_bytes("fine"))).status == 0
        assert [c.request.container_id for c in fake.calls("UpdateContainerResources")] == ["fine"]
    finally:
        await client.close()
        await proxy.stop()


async def test_held_request_budget_refuses_past_it_and_gives_back(fake: FakeRuntime, sockdir: str) -> None:
    """Two 150 KB requests held at once fit no 250 KB budget: the second is refused, with a
    message that names the budget, and the budget is whole again once calls have ended."""
    release = asyncio.Event()

    async def wait(call: CallContext, request: bytes) -> bytes:
        await release.wait()
        return request

    hooks = ScriptedInterceptor({"CreateContainer"}, wait)
    proxy = await intercepted_proxy(sockdir, fake, hooks, max_message_size=200_000, held_request_budget=250_000)
    assert proxy.server is not None
    held = proxy.server.options.held
    try:
        stub = runtime(proxy.channel())
        first = asyncio.ensure_future(stub.CreateContainer(create_request("first", 150_000), timeout=CALL_TIMEOUT))
        await eventually(lambda: len(hooks.before_calls) == 1)
        error = await rpc_error(stub.CreateContainer(create_request("second", 150_000), timeout=CALL_TIMEOUT))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "budget of 250000 bytes" in (error.details() or "")
        assert held.used > 150_000
        release.set()
        await within(first)
        await eventually(lambda: held.used == 0)
        await within(stub.CreateContainer(create_request("third", 150_000), timeout=CALL_TIMEOUT))
        assert [r.request.config.metadata.name for r in fake.calls("CreateContainer")] == ["first", "third"]
    finally:
        release.set()
        await proxy.stop()


async def test_request_with_no_message_is_refused_when_intercepted(fake: FakeRuntime, sockdir: str) -> None:
    hooks = ScriptedInterceptor({"UpdateContainerResources"})
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    client = await RawH2Client().connect(proxy.path)
    try:
        answer = await client.call(UPDATE_PATH, b"", framed=True)
        assert answer.status == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "exactly one message" in urllib.parse.unquote(answer.header("grpc-message") or "")
        assert fake.calls("UpdateContainerResources") == [] and hooks.before_calls == []
    finally:
        await client.close()
        await proxy.stop()


async def test_stop_gives_post_call_work_the_grace_and_counts_what_it_cuts(fake: FakeRuntime, sockdir: str) -> None:
    """Post-hooks run after kubelet has its answer: a stopping proxy waits for them too."""
    finished: list[str] = []

    class SlowAfter(ScriptedInterceptor):
        async def after(self, call: CallContext, request: bytes, outcome: CallOutcome) -> None:
            name = pb.UpdateContainerResourcesRequest.FromString(request).container_id
            await asyncio.sleep(0.3 if name == "quick" else 30)
            finished.append(name)

    hooks = SlowAfter({"UpdateContainerResources"})
    proxy = await intercepted_proxy(sockdir, fake, hooks)
    assert proxy.server is not None
    server = proxy.server
    try:
        stub = runtime(proxy.channel())
        await stub.UpdateContainerResources(update_request("quick"), timeout=CALL_TIMEOUT)
        await stub.UpdateContainerResources(update_request("stuck"), timeout=CALL_TIMEOUT)
        assert server.active_calls == 0 and len(server.options.after_tasks) == 2
        with capture_logs() as logs:
            await server.shutdown(1.0)
        assert finished == ["quick"]  # given the grace; the stuck one was cut off
        (stopped,) = [entry for entry in logs if entry["event"] == "stopped"]
        assert (stopped["calls_cut_off"], stopped["post_call_work_cut_off"]) == (0, 1)
        assert stopped["log_level"] == "warning"
        assert not server.options.after_tasks
    finally:
        await proxy.stop()
