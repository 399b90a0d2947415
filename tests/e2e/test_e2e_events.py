"""GetContainerEvents through the proxy (``runtime-proxy serve``) against a real containerd 1.7
and 2.x, with and without hook servers registered.

containerd 1.6 answers GetContainerEvents with UNIMPLEMENTED (tests/e2e/test_e2e_proxy.py checks
the proxy relays that as it is). 1.7 and 2.x stream events, and how each does so shapes what a
client sees:

* 1.7 (``GetContainerEvents``, containerd/containerd#7318): every open stream reads from one
  shared channel, so each event goes to ONE of the open streams (the longest waiting), not to
  all of them; and the handler does not watch its context: a stream whose client cancelled
  ends only when the next event is handed to it. That event is lost: N cancelled streams
  swallow the next N events. Events raised while no stream is open wait in the channel for
  the next one.
* 2.x: each stream subscribes on its own, so every event goes to every open stream, and a
  cancelled stream ends at once, taking no event with it.

On 1.7 the cancel test relies on exactly that: once the client cancel reaches containerd, the
dead stream takes one event and ends, and every later event reaches the live stream. A cancel
that never reached containerd would leave the dead stream taking its share of events for ever.
The same counts hold calling containerd directly, so the proxy adds nothing of its own.

Each test gets a fresh containerd (`fresh_containerd`): events of other tests would otherwise
sit in the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest
from daemons import Daemon, ProxyAndHooks, eventually
from hook_servers import TestHookServer

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.api.runtime.v1 import api_pb2_grpc as pb_grpc
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

# Whether a series hands each event to one open stream (a shared channel whose cancelled
# streams each take one more event) or to every open stream.
SHARED_CHANNEL = {"1.7": True, "2.x": False}

CALL_TIMEOUT = 30.0
EVENTS_PATH = "/runtime.v1.RuntimeService/GetContainerEvents"
CREATED, STARTED = pb.CONTAINER_CREATED_EVENT, pb.CONTAINER_STARTED_EVENT
STOPPED, DELETED = pb.CONTAINER_STOPPED_EVENT, pb.CONTAINER_DELETED_EVENT


def lifecycle_events(sandbox_id: str, container_id: str) -> list[tuple[str, int]]:
    """What containerd emits for `Node.pod_lifecycle`, in order (1.7 and 2.x alike)."""
    s, c = sandbox_id, container_id
    return [
        (s, CREATED),
        (s, STARTED),
        (c, CREATED),
        (c, STARTED),
        (c, STOPPED),
        (c, DELETED),
        (s, STOPPED),
        (s, DELETED),
    ]


class EventStream:
    """One GetContainerEvents call whose events are collected in the background."""

    def __init__(self, stub: Any) -> None:
        self.call = stub.GetContainerEvents(pb.GetEventsRequest())
        self.events: list[pb.ContainerEventResponse] = []
        self.ended: grpc.StatusCode | None = None
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for event in self.call:
                self.events.append(event)
        except grpc.aio.AioRpcError as exc:
            self.ended = exc.code()

    def seen(self, *ids: str) -> list[tuple[str, int]]:
        """(container id, event type) of the events about `ids`, in arrival order."""
        return [(e.container_id, e.container_event_type) for e in self.events if e.container_id in ids]

    async def cancel(self) -> None:
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def wait_for(condition: Any, timeout: float = 10.0) -> None:
    """Poll `condition()` on the event loop (hook servers keep serving meanwhile)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.02)


@dataclass
class Node:
    """A fresh containerd (1.7 or 2.x), the proxy daemon in front of it, and clients of both."""

    bed: Containerd
    layout: ProxyAndHooks
    proxy: Daemon
    direct: Any  # RuntimeServiceStub on containerd's socket
    proxied: Any  # RuntimeServiceStub on the proxy's socket
    hook_servers: list[TestHookServer] = field(default_factory=list)

    @property
    def shared_channel(self) -> bool:
        return SHARED_CHANNEL[self.bed.build.series]

    def stub(self, path: str) -> Any:
        return self.direct if path == "direct" else self.proxied

    async def add_hook_server(self) -> TestHookServer:
        """A hook server on every hook point, answering no changes, except PreRunPodSandbox
        and PreCreateContainer, which add an annotation; registered and loaded by the proxy."""
        server = TestHookServer("events", str(self.layout.workdir / "hooks.sock"))
        server.respond_all()
        server.set(HookPoint.PRE_RUN_POD_SANDBOX, hook.PodSandboxHookResponse(annotations={"hooked": "pod"}))
        server.set(
            HookPoint.PRE_CREATE_CONTAINER,
            hook.ContainerResourceHookResponse(container_annotations={"hooked": "container"}),
        )
        await server.start()
        self.hook_servers.append(server)
        self.layout.config_dir.mkdir(exist_ok=True)
        server.register(self.layout.config_dir, policy="Fail", hooks=list(HookPoint))
        await asyncio.to_thread(
            self.proxy.wait_record,
            lambda r: r.get("event") == "hook server added" and r.get("server") == server.file_name,
        )
        return server

    def pod_config(self, name: str) -> pb.PodSandboxConfig:
        uid = str(uuid.uuid4())
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="events"),
            labels={"app": name},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=self.bed.cgroup_parent(uid),
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
            ),
        )

    async def run_pod(self, stub: Any, config: pb.PodSandboxConfig) -> str:
        reply = await stub.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT)
        return str(reply.pod_sandbox_id)

    async def create(self, stub: Any, sandbox_id: str, config: pb.PodSandboxConfig, name: str) -> str:
        container = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name), image=pb.ImageSpec(image=self.bed.test_image)
        )
        request = pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=container, sandbox_config=config)
        return str((await stub.CreateContainer(request, timeout=CALL_TIMEOUT)).container_id)

    async def pod_lifecycle(self, stub: Any, name: str) -> tuple[str, str]:
        """Run a pod with one container, then stop and remove both; their IDs."""
        config = self.pod_config(name)
        sandbox_id = await self.run_pod(stub, config)
        container_id = await self.create(stub, sandbox_id, config, "app")
        await stub.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=CALL_TIMEOUT)
        await stub.StopContainer(pb.StopContainerRequest(container_id=container_id, timeout=0), timeout=CALL_TIMEOUT)
        await stub.RemoveContainer(pb.RemoveContainerRequest(container_id=container_id), timeout=CALL_TIMEOUT)
        await stub.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
        await stub.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
        return sandbox_id, container_id

    def cancelled_calls(self) -> int:
        """GetContainerEvents calls the proxy has ended as cancelled by their client (it
        forwards the client's RST_STREAM to containerd as it ends the call)."""
        return sum(
            1
            for r in self.proxy.records()
            if r.get("event") == "cri call" and r.get("method") == EVENTS_PATH and r.get("code") == "CANCELLED"
        )


@pytest.fixture(params=list(SHARED_CHANNEL), ids=[f"containerd{s}" for s in SHARED_CHANNEL])
def layout(fresh_containerd: Any, request: pytest.FixtureRequest) -> Iterator[ProxyAndHooks]:
    bed = fresh_containerd(request.param)
    layout = ProxyAndHooks(bed, "rtpxev-")
    try:
        yield layout
    finally:
        layout.kill_daemons()
        shutil.rmtree(layout.workdir, ignore_errors=True)


@pytest.fixture
async def node(layout: ProxyAndHooks) -> AsyncIterator[Node]:
    # Debug level: the proxy then logs every relayed call with its status (cancels included).
    proxy = layout.start_daemon("proxy", [*layout.proxy_args(), "--log-level", "debug"])
    direct = grpc.aio.insecure_channel(layout.containerd.address)
    proxied = grpc.aio.insecure_channel(f"unix://{layout.proxy_endpoint}")
    stubs: Any = pb_grpc  # generated without type hints
    node = Node(layout.containerd, layout, proxy, stubs.RuntimeServiceStub(direct), stubs.RuntimeServiceStub(proxied))
    try:
        yield node
    finally:
        await proxied.close(None)
        await direct.close(None)
        for server in node.hook_servers:
            await server.stop()


@pytest.mark.parametrize("hooks", [False, True], ids=["no-hooks", "hooks"])
async def test_pod_lifecycle_events_arrive_through_the_proxy(node: Node, hooks: bool) -> None:
    server = await node.add_hook_server() if hooks else None
    stream = EventStream(node.proxied)
    try:
        sandbox_id, container_id = await node.pod_lifecycle(node.proxied, "lifecycle")
        expected = lifecycle_events(sandbox_id, container_id)
        await wait_for(lambda: len(stream.seen(sandbox_id, container_id)) >= len(expected))
        assert stream.seen(sandbox_id, container_id) == expected
        assert stream.ended is None  # still open: events keep coming
    finally:
        await stream.cancel()
    started = next(e for e in stream.events if (e.container_id, e.container_event_type) == (container_id, STARTED))
    assert started.pod_sandbox_status.id == sandbox_id
    assert started.pod_sandbox_status.metadata.name == "lifecycle"
    assert dict(started.pod_sandbox_status.labels) == {"app": "lifecycle"}
    assert [status.id for status in started.containers_statuses] == [container_id]
    assert started.containers_statuses[0].state == pb.CONTAINER_RUNNING
    # What hooks changed is what containerd created, and so what its events report.
    hooked = {"hooked": "pod"} if hooks else {}
    assert dict(started.pod_sandbox_status.annotations) == hooked
    container_annotations = dict(started.containers_statuses[0].annotations)
    assert container_annotations.get("hooked") == ("container" if hooks else None)
    if server is not None:
        assert [p for _, p in server.journal][:5] == [
            "PreRunPodSandbox",
            "PreCreateContainer",
            "PostCreateContainer",
            "PreStartContainer",
            "PostStartContainer",
        ]


async def test_open_streams_get_the_series_share_of_events(node: Node) -> None:
    """Two clients, through the proxy as directly. containerd 1.7 hands each event to one open
    stream (containerd/containerd#7318): each client sees part of the events, together all of
    them, none twice; kubelet, the one reader on a node, sees every event, and a second reader
    (crictl events) takes events away from it. 2.x gives each stream every event."""
    first, second = EventStream(node.proxied), EventStream(node.proxied)
    try:
        # Both streams are open at containerd once each has had an event.
        config = node.pod_config("share")
        sandbox_id = await node.run_pod(node.proxied, config)
        created = [await node.create(node.proxied, sandbox_id, config, f"c{k}") for k in range(4)]
        await wait_for(lambda: first.events and second.events)
        ids = (sandbox_id, *created)
        expected = [(sandbox_id, CREATED), (sandbox_id, STARTED)] + [(cid, CREATED) for cid in created]
        if node.shared_channel:
            await wait_for(lambda: len(first.seen(*ids)) + len(second.seen(*ids)) >= len(expected))
            got_first, got_second = first.seen(*ids), second.seen(*ids)
            assert sorted(got_first + got_second) == sorted(expected)
            assert not set(got_first) & set(got_second)
            assert got_first and got_second
        else:
            # Events raised before a stream opened are not replayed to it: compare from the
            # first container on, which both streams were open for.
            later = expected[2:]
            await wait_for(lambda: min(len(first.seen(*created)), len(second.seen(*created))) >= len(later))
            assert first.seen(*created) == second.seen(*created) == later
    finally:
        await first.cancel()
        await second.cancel()


@pytest.mark.parametrize(
    ("path", "dead", "hooks"),
    [("direct", 1, False), ("proxy", 1, False), ("proxy", 2, False), ("proxy", 1, True)],
    ids=["direct-1", "proxy-1", "proxy-2", "proxy-hooks-1"],
)
async def test_a_client_cancel_reaches_containerd(node: Node, path: str, dead: int, hooks: bool) -> None:
    if hooks:
        await node.add_hook_server()
    stub = node.stub(path)
    # 1. `dead` streams, each known to be open at containerd: it has received an event.
    doomed: list[EventStream] = []
    config = node.pod_config("warmup")
    sandbox_id = await node.run_pod(stub, config)
    for k in range(dead):
        doomed.append(EventStream(stub))
        while not doomed[-1].events:  # earlier streams take their turn first
            await node.create(stub, sandbox_id, config, f"warm{k}-{len(doomed[-1].events)}-{uuid.uuid4().hex[:6]}")
            await asyncio.sleep(0.05)
    # 2. Their clients cancel; through the proxy, wait until it has ended them (and so sent
    # containerd the RST_STREAM).
    for stream in doomed:
        await stream.cancel()
    if path != "direct":
        await asyncio.to_thread(eventually, lambda: node.cancelled_calls() >= dead, 10.0, node.proxy.log)
    # 3. A live stream, then a pod's whole life. 1.7: the first `dead` events go to the dead
    # streams (waiting longest), which end on them; all later events reach the live one.
    # 2.x: the dead streams ended at the cancel and take nothing.
    live = EventStream(stub)
    swallowed = dead if node.shared_channel else 0
    try:
        pod_id, container_id = await node.pod_lifecycle(stub, "after-cancel")
        expected = lifecycle_events(pod_id, container_id)
        await wait_for(lambda: (pod_id, DELETED) in live.seen(pod_id, container_id))
        assert live.seen(pod_id, container_id) == expected[swallowed:]
        # And nothing is lost any more: the dead streams are gone from containerd.
        again = await node.pod_lifecycle(stub, "later")
        await wait_for(lambda: (again[0], DELETED) in live.seen(*again))
        assert live.seen(*again) == lifecycle_events(*again)
    finally:
        await live.cancel()
