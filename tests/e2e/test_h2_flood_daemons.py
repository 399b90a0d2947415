"""The daemons hold every HTTP/2 peer to its limits: hostile peers against `runtime-proxy
serve` in front of a real containerd and against `runtime-hooks serve`.

A client flooding the proxy's socket, a hook server flooding the proxy's call to it (and never
reading), a client flooding runtime-hooks' endpoint: each is cut off with GOAWAY
ENHANCE_YOUR_CALM, the daemon logs one line naming the peer and the limit and counts it in
``runtimeproxy_h2_peer_limit_exceeded_total``, its memory stays bounded, and the other calls go
on being answered meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from daemons import HOOKS_CLI, Daemon, ProxyAndHooks
from h2_floods import FLOODS, Flooder, flooding_server, goaway_codes, limit_events, ping_flood, rss
from hook_servers import write_registration
from prometheus_client.parser import text_string_to_metric_families

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd
from runtimeproxy.testbed.daemons import free_port
from runtimeproxy.wire import frames
from runtimeproxy.wire.grpc_client import H2Channel, RpcError
from runtimeproxy.wire.grpc_framing import StatusCode

pytestmark = pytest.mark.e2e

MiB = 1 << 20
# What a daemon may grow by while it is flooded: a connection's buffers are bounded far below.
RSS_GROWTH = 64 * MiB
HOOK = "/runtime.v1alpha1.RuntimeHookService/PreRunPodSandboxHook"


class Node(ProxyAndHooks):
    """The proxy and runtime-hooks, each serving metrics."""

    def __init__(self, containerd: Containerd) -> None:
        super().__init__(containerd, "rtpxfl-")
        self.config_dir.mkdir()
        self.proxy_metrics, self.hooks_metrics = free_port(), free_port()
        self.proxy = self.start_daemon(
            "proxy", [*self.proxy_args(), "--metrics-address", f"127.0.0.1:{self.proxy_metrics}"]
        )
        args = self.hooks_args(HOOKS_CLI, self.workdir / "no-resctrl", "--metrics-address",
                               f"127.0.0.1:{self.hooks_metrics}")
        self.hooks = self.start_daemon("hooks", args)


@pytest.fixture(scope="module")
def node(containerd: Containerd) -> Iterator[Node]:
    with closing(Node(containerd)) as made:
        yield made


def exceeded(port: int, peer: str, limit: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "runtimeproxy_h2_peer_limit_exceeded_total" and sample.labels == {
                "peer": peer, "limit": limit,
            }:  # fmt: skip
                return float(sample.value)
    raise AssertionError(f"no runtimeproxy_h2_peer_limit_exceeded_total in\n{text}")


def limit_records(daemon: Daemon) -> list[tuple[Any, Any]]:
    return limit_events(daemon.records())


class Caller:
    """Version calls through the proxy, one after another in a thread, while a flood goes on."""

    def __init__(self, endpoint: Path) -> None:
        self.cri = CriClient(str(endpoint), timeout=10.0)
        self.answered = 0
        self.errors: list[Exception] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.cri.runtime.Version(pb.VersionRequest(), timeout=10)
                self.answered += 1
            except Exception as exc:  # reported by the test
                self.errors.append(exc)

    def __enter__(self) -> Caller:
        self.cri.runtime.Version(pb.VersionRequest(), timeout=10)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cri.close()


@pytest.mark.parametrize("flood", ["PING", "SETTINGS", "CONTINUATION in one block", "rapid reset", "empty DATA"])
async def test_the_proxy_cuts_off_a_client_that_floods_without_reading(node: Node, flood: str) -> None:
    limit = FLOODS[flood].limit
    counted = exceeded(node.proxy_metrics, "cri_client", limit)
    logged = limit_records(node.proxy).count(("cri_client", limit))
    before = rss(node.proxy.pid)
    flooder = await Flooder.connect(str(node.proxy_endpoint))
    try:
        with Caller(node.proxy_endpoint) as caller:
            await flooder.flood(frames.PREFACE + frames.settings() + FLOODS[flood].make(1))
            received = await flooder.read_to_end()
            await asyncio.sleep(0.2)  # calls of the other client after the cut-off too
    finally:
        flooder.close()
    grown = rss(node.proxy.pid) - before
    assert goaway_codes(received)[-1:] == [frames.ENHANCE_YOUR_CALM]
    assert caller.answered > 0 and not caller.errors, caller.errors
    assert exceeded(node.proxy_metrics, "cri_client", limit) == counted + 1
    assert limit_records(node.proxy).count(("cri_client", limit)) == logged + 1
    assert grown < RSS_GROWTH, f"the proxy grew {grown / MiB:.0f} MiB"
    assert node.proxy.alive


async def test_the_proxy_cuts_off_a_hook_server_that_floods_without_reading(node: Node) -> None:
    """The hook call fails at once (the server's policy here: Ignore, so the pod starts), the
    proxy goes on serving, and a new connection is used for the next hook call."""
    counted = exceeded(node.proxy_metrics, "grpc_server", "ping")
    path = str(node.workdir / "flood.sock")
    parent = node.containerd.cgroup_parent(str(uuid.uuid4()), "besteffort")
    node.parents.append(parent)
    before = rss(node.proxy.pid)
    async with flooding_server(path, ping_flood(300_000)) as server:
        write_registration(node.config_dir, "flood.json", path, ["PreRunPodSandbox"], policy="Ignore", timeout=30)
        try:
            node.proxy.wait_record(lambda r: r.get("event") == "hook server added" and r.get("server") == "flood.json")
            with Caller(node.proxy_endpoint) as caller:
                pod = await asyncio.to_thread(run_pod_sandbox, node, parent)
                await asyncio.wait_for(server.done.wait(), 30)
        finally:
            (node.config_dir / "flood.json").unlink()
    assert pod
    assert goaway_codes(server.received)[-1:] == [frames.ENHANCE_YOUR_CALM]
    assert caller.answered > 0 and not caller.errors, caller.errors
    assert exceeded(node.proxy_metrics, "grpc_server", "ping") == counted + 1
    assert ("grpc_server", "ping") in limit_records(node.proxy)
    assert rss(node.proxy.pid) - before < RSS_GROWTH
    assert node.proxy.alive


def run_pod_sandbox(node: Node, parent: str) -> str:
    uid = str(uuid.uuid4())
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"flood-{uid[:8]}", uid=uid, namespace="e2e-flood"),
        log_directory=str(node.containerd.root_dir / "pod-logs" / uid),
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=parent,
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
        ),
    )
    with CriClient(str(node.proxy_endpoint), timeout=60.0) as cri:
        return str(cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id)


@pytest.mark.parametrize("flood", ["PING", "CONTINUATION in one block", "rapid reset"])
async def test_runtime_hooks_cuts_off_a_client_that_floods_without_reading(node: Node, flood: str) -> None:
    limit = FLOODS[flood].limit
    counted = exceeded(node.hooks_metrics, "grpc_client", limit)
    before = rss(node.hooks.pid)
    channel = H2Channel(str(node.hooks_endpoint), max_message_size=1 << 20)
    flooder = await Flooder.connect(str(node.hooks_endpoint))
    try:
        await hook_call(channel)
        await flooder.flood(frames.PREFACE + frames.settings() + FLOODS[flood].make(1))
        await hook_call(channel)  # the other connection is served meanwhile
        received = await flooder.read_to_end()
    finally:
        flooder.close()
        await channel.close()
    assert goaway_codes(received)[-1:] == [frames.ENHANCE_YOUR_CALM]
    assert exceeded(node.hooks_metrics, "grpc_client", limit) == counted + 1
    assert ("grpc_client", limit) in limit_records(node.hooks)
    assert rss(node.hooks.pid) - before < RSS_GROWTH
    assert node.hooks.alive


async def hook_call(channel: H2Channel) -> None:
    """A hook call runtime-hooks answers (its answer to an empty request, or its refusal of it)."""
    try:
        await channel.unary(HOOK, b"", 10)
    except RpcError as error:
        assert error.code() not in (StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED), error
