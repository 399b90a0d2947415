"""Objects nobody can decode, and hostile registration files, in the running daemons.

containerd (1.6 and 1.7 alike) stores a label value that is not UTF-8 when a client sends one,
and Python's protobuf then refuses every message holding it: a whole List response for one bad
item, so a store rebuild or a reconcile round that decoded responses as a whole would fail for
ever. Here such objects are made as another client would make them: a normal config serialized,
one raw label entry appended (protobuf merges repeated fields), sent as bytes straight to
containerd's socket (`Containerd.call`). Then

* the proxy (``runtime-proxy serve``, tests/daemons.py) starts after them: its store rebuild
  completes at once, each bad object is logged once and counted, hooks of the other pods get
  their data, and a call on a bad object under a Fail server is refused rather than hooked with
  empty data;
* ``runtime-hooks serve`` reconciles: every round completes, the bad objects are logged once
  and counted, the good pod is worked on;
* a proxy whose hook config directory holds a JSON nesting bomb, an oversize file and a FIFO
  starts, serves and calls the valid hook server next to them.

The first tests drive the loader against a scripted runtime answering hand-encoded bytes on a
real gRPC socket (the loader's own channel and decoding, no containerd).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import closing
from typing import Any

import grpc
import grpc.aio
import pytest
from daemons import Daemon, ProxyAndHooks, eventually
from fake_runtime import RawServer
from google.protobuf.json_format import MessageToDict
from hook_servers import Respond, TestHookServer, write_raw_registration
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.reconciler import Reconciler, list_live_pods
from runtimeproxy.hooks.sdk import Plugin
from structlog.testing import capture_logs

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.api.runtime.v1 import api_pb2_grpc
from runtimeproxy.dispatch.registry import MAX_CONFIG_BYTES
from runtimeproxy.dispatch.store import PodStore, StoreRebuilder
from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.runtime_state import RuntimeLoader, UnreadableObjectError
from runtimeproxy.testbed import Containerd
from runtimeproxy.testbed.containerd import encode_field

P = HookPoint
UNREADABLE = "cannot decode this object from the runtime; skipped"
HOOKS = [sys.executable, "-c", "from runtimeproxy.hooks.cli import main; main()"]
CALL_TIMEOUT = 60.0
STUBS: Any = api_pb2_grpc  # generated without type hints


def with_bad_label(message: Any) -> bytes:
    """``message`` encoded, plus a label whose value is not UTF-8 (containerd keeps it as is)."""
    number = message.DESCRIPTOR.fields_by_name["labels"].number
    return bytes(message.SerializeToString()) + encode_field(
        number, encode_field(1, "bad") + encode_field(2, b"\xff\xfe")
    )


def unreadable_records(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return sorted((r["kind"], r["id"]) for r in records if r.get("event") == UNREADABLE)


def metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


# -- a scripted runtime answering raw bytes ---------------------------------------------------------


def config_info(config: Any, **extra: Any) -> dict[str, str]:
    """containerd's verbose info: the create-time config as Go's encoding/json writes it."""
    return {"info": json.dumps({"config": MessageToDict(config, preserving_proto_field_name=True), **extra})}


class RawRuntime(RawServer):
    """The four RuntimeService calls the loader makes, answered with bytes encoded here (so they
    can hold what protobuf refuses), on a real unix socket."""

    def __init__(self, socket: str) -> None:
        super().__init__(socket)
        self.sandboxes: dict[str, tuple[bytes, bytes]] = {}  # id -> (List item, Status response)
        self.containers: dict[str, tuple[bytes, bytes]] = {}

    def add_sandbox(self, sandbox_id: str, *, bad_item: bool = False, bad_status: bool = False) -> None:
        meta = pb.PodSandboxMetadata(name=f"pod-{sandbox_id}", uid=f"uid-{sandbox_id}", namespace="prod")
        config = pb.PodSandboxConfig(
            metadata=meta, linux=pb.LinuxPodSandboxConfig(cgroup_parent=f"/kubepods/{sandbox_id}")
        )
        item = pb.PodSandbox(id=sandbox_id, metadata=meta)
        status = pb.PodSandboxStatus(id=sandbox_id, metadata=meta)
        info = pb.PodSandboxStatusResponse(info=config_info(config)).SerializeToString()
        self.sandboxes[sandbox_id] = (
            with_bad_label(item) if bad_item else item.SerializeToString(),
            encode_field(1, with_bad_label(status) if bad_status or bad_item else status.SerializeToString()) + info,
        )

    def add_container(self, container_id: str, sandbox_id: str, *, bad: bool = False) -> None:
        meta = pb.ContainerMetadata(name=f"ctr-{container_id}")
        config = pb.ContainerConfig(metadata=meta, image=pb.ImageSpec(image="busybox"))
        item = pb.Container(id=container_id, pod_sandbox_id=sandbox_id, metadata=meta)
        status = pb.ContainerStatus(id=container_id, metadata=meta)
        info = pb.ContainerStatusResponse(info=config_info(config, sandboxID=sandbox_id)).SerializeToString()
        self.containers[container_id] = (
            with_bad_label(item) if bad else item.SerializeToString(),
            encode_field(1, with_bad_label(status) if bad else status.SerializeToString()) + info,
        )

    async def _list(self, objects: dict[str, tuple[bytes, bytes]], wanted: str) -> bytes:
        return b"".join(encode_field(1, item) for oid, (item, _) in objects.items() if not wanted or oid == wanted)

    async def _status(self, objects: dict[str, tuple[bytes, bytes]], oid: str, context: Any) -> bytes:
        if oid not in objects:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{oid} not found")
        return objects[oid][1]

    def handlers(self) -> dict[str, dict[str, Any]]:
        async def list_sandboxes(request: bytes, context: Any) -> bytes:
            return await self._list(self.sandboxes, "")

        async def list_containers(request: bytes, context: Any) -> bytes:
            return await self._list(self.containers, pb.ListContainersRequest.FromString(request).filter.id)

        async def sandbox_status(request: bytes, context: Any) -> bytes:
            return await self._status(
                self.sandboxes, pb.PodSandboxStatusRequest.FromString(request).pod_sandbox_id, context
            )

        async def container_status(request: bytes, context: Any) -> bytes:
            return await self._status(
                self.containers, pb.ContainerStatusRequest.FromString(request).container_id, context
            )

        return {
            "runtime.v1.RuntimeService": {
                "ListPodSandbox": list_sandboxes,
                "ListContainers": list_containers,
                "PodSandboxStatus": sandbox_status,
                "ContainerStatus": container_status,
            }
        }


@pytest.fixture
async def raw_runtime() -> AsyncIterator[RawRuntime]:
    directory = tempfile.mkdtemp(prefix="rtpxraw-", dir="/tmp")
    runtime = await RawRuntime(os.path.join(directory, "cri.sock")).start()
    try:
        yield runtime
    finally:
        await runtime.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def loader(raw_runtime: RawRuntime) -> AsyncIterator[RuntimeLoader]:
    made = RuntimeLoader("unix://" + raw_runtime.socket, timeout=5.0)
    try:
        yield made
    finally:
        await made.close()


def bad_scene(runtime: RawRuntime) -> None:
    """s-good with c-good and c-bad (bad item and status), s-bad (bad List item), s-half (its
    List item decodes, its Status does not) with c-orphan."""
    runtime.add_sandbox("s-good")
    runtime.add_sandbox("s-bad", bad_item=True)
    runtime.add_sandbox("s-half", bad_status=True)
    runtime.add_container("c-good", "s-good")
    runtime.add_container("c-bad", "s-good", bad=True)
    runtime.add_container("c-orphan", "s-half")


async def test_a_list_protobuf_refuses_is_read_item_by_item(raw_runtime: RawRuntime, loader: RuntimeLoader) -> None:
    bad_scene(raw_runtime)
    with pytest.raises(Exception, match="UTF-8"):  # what a whole-message decode does
        pb.ListPodSandboxResponse.FromString(await raw_runtime._list(raw_runtime.sandboxes, ""))
    counted: list[str] = []
    loader.unreadable.listeners.append(counted.append)
    with capture_logs() as logs:
        first = await loader.list_sandboxes()
        again = await loader.list_sandboxes()
        containers = await loader.list_containers()
    assert [item.id for item in first.items] == ["s-good", "s-half"]
    assert first.unreadable == again.unreadable == ("s-bad",)
    assert [item.id for item in containers.items] == ["c-good", "c-orphan"] and containers.unreadable == ("c-bad",)
    assert unreadable_records(logs) == [("container", "c-bad"), ("sandbox", "s-bad")]  # once each, not per call
    assert "UTF-8" in next(r["reason"] for r in logs if r["id"] == "s-bad")
    assert counted == ["sandbox", "container"]


async def test_store_rebuild_skips_unreadable_objects_and_completes(
    raw_runtime: RawRuntime, loader: RuntimeLoader
) -> None:
    bad_scene(raw_runtime)
    store = PodStore()
    rebuilder = StoreRebuilder(store, loader)
    with capture_logs() as logs:
        rebuilder.start()
        await asyncio.wait_for(rebuilder.ready.wait(), 10)
        await rebuilder.stop()
    assert rebuilder.attempts == 1 and rebuilder.failures == 0
    assert rebuilder.result is not None
    assert rebuilder.result.as_dict() == {
        "sandboxes": 1,
        "containers": 2,
        "partial": 0,
        "already_known": 0,
        "vanished": 0,
        "unreadable": 3,
    }
    assert [s.id for s in store.sandboxes()] == ["s-good"]
    assert sorted(c.id for c in store.containers()) == ["c-good", "c-orphan"]
    assert unreadable_records(logs) == [("container", "c-bad"), ("sandbox", "s-bad"), ("sandbox", "s-half")]


async def test_ensure_tells_unreadable_from_unknown(raw_runtime: RawRuntime, loader: RuntimeLoader) -> None:
    bad_scene(raw_runtime)
    rebuilder = StoreRebuilder(PodStore(), loader)
    with capture_logs() as logs:
        for _ in range(2):  # reported once, raised every time: never taken for "unknown"
            with pytest.raises(UnreadableObjectError) as info:
                await rebuilder.ensure_sandbox("s-half")
            assert (info.value.kind, info.value.object_id) == ("sandbox", "s-half") and "UTF-8" in info.value.reason
            with pytest.raises(UnreadableObjectError):
                await rebuilder.ensure_container("c-bad")
        # A readable container in an unreadable sandbox: the container loads, its sandbox raises.
        orphan = await rebuilder.ensure_container("c-orphan")
        assert orphan is not None and orphan.sandbox_id == "s-half"
        with pytest.raises(UnreadableObjectError):
            await rebuilder.ensure_sandbox(orphan.sandbox_id)
        assert await rebuilder.ensure_sandbox("s-none") is None  # unknown: None
    assert unreadable_records(logs) == [("container", "c-bad"), ("sandbox", "s-half")]
    del raw_runtime.sandboxes["s-half"]  # removed: gone, and forgotten
    assert await rebuilder.ensure_sandbox("s-half") is None
    assert "s-half" not in loader.unreadable
    await rebuilder.stop()


async def test_reconciler_skips_unreadable_objects_logs_once_and_counts(
    raw_runtime: RawRuntime, loader: RuntimeLoader
) -> None:
    bad_scene(raw_runtime)
    seen: list[list[str]] = []
    plugin = Plugin("watcher")

    def watch(*, pods: list[Any], **kwargs: Any) -> int:
        seen.append([pod.sandbox_id for pod in pods])
        return 0

    plugin.reconcile(watch)

    registry = CollectorRegistry()
    reconciler = Reconciler(PluginRunner([plugin]), loader, registry=registry)
    with capture_logs() as logs:
        results = [await reconciler.run_once() for _ in range(3)]
    assert all(result.ok and result.unreadable == 3 for result in results), results
    assert seen == [["s-good"]] * 3
    assert unreadable_records(logs) == [("container", "c-bad"), ("sandbox", "s-bad"), ("sandbox", "s-half")]
    for kind, count in (("sandbox", 2), ("container", 1)):
        assert registry.get_sample_value("runtimehooks_reconcile_unreadable_objects_total", {"kind": kind}) == count
    live = await list_live_pods(loader)
    assert [pod.sandbox_id for pod in live.pods] == ["s-good"] and [c.id for c in live.containers["s-good"]] == [
        "c-good"
    ]

    del raw_runtime.sandboxes["s-bad"]  # gone from the runtime: forgotten, the memory stays small
    await reconciler.run_once()
    assert "s-bad" not in loader.unreadable and "s-half" in loader.unreadable


# -- against the real containerd ------------------------------------------------------------------------


class Objects:
    """Pods and containers made directly on the test bed, some of them unreadable."""

    def __init__(self, containerd: Containerd) -> None:
        self.containerd = containerd
        self.cri = CriClient(containerd.address, timeout=CALL_TIMEOUT)

    def pod_config(self, name: str) -> pb.PodSandboxConfig:
        uid = str(uuid.uuid4())
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=f"{name}-{uid[:8]}", uid=uid, namespace="fault"),
            labels={"app": name},
            log_directory=str(self.containerd.root_dir / "pod-logs" / uid),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=self.containerd.cgroup_parent(uid),
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
            ),
        )

    def container_config(self, name: str) -> pb.ContainerConfig:
        return pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name),
            image=pb.ImageSpec(image=self.containerd.test_image),
            log_path=f"{name}.log",
        )

    def run_pod(self, name: str, *, bad: bool = False) -> tuple[str, pb.PodSandboxConfig]:
        config = self.pod_config(name)
        encoded = with_bad_label(config) if bad else config.SerializeToString()
        reply = self.containerd.call("RuntimeService/RunPodSandbox", encode_field(1, encoded), CALL_TIMEOUT)
        return pb.RunPodSandboxResponse.FromString(reply).pod_sandbox_id, config

    def create_container(
        self, sandbox_id: str, sandbox: pb.PodSandboxConfig, name: str, *, bad: bool = False, start: bool = False
    ) -> str:
        config = self.container_config(name)
        request = encode_field(1, sandbox_id) + encode_field(
            2, with_bad_label(config) if bad else config.SerializeToString()
        )
        request += encode_field(3, sandbox.SerializeToString())
        reply = self.containerd.call("RuntimeService/CreateContainer", request, CALL_TIMEOUT)
        container_id = pb.CreateContainerResponse.FromString(reply).container_id
        if start:
            self.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=CALL_TIMEOUT)
        return container_id

    def close(self) -> None:
        try:
            self.containerd.remove_all_pods()
        finally:
            self.cri.close()


@pytest.fixture
def objects(containerd: Containerd) -> Iterator[Objects]:
    with closing(Objects(containerd)) as made:
        yield made


@pytest.fixture
def node(containerd: Containerd) -> Iterator[ProxyAndHooks]:
    made = ProxyAndHooks(containerd, "rtpxfs-")
    made.config_dir.mkdir()
    try:
        yield made
    finally:
        made.kill_daemons()
        shutil.rmtree(made.workdir, ignore_errors=True)


@pytest.mark.e2e
async def test_proxy_starts_after_unreadable_objects_and_hooks_the_others(
    objects: Objects, node: ProxyAndHooks
) -> None:
    bad_pod, _ = objects.run_pod("bad", bad=True)
    good_pod, good_config = objects.run_pod("good")
    bad_container = objects.create_container(good_pod, good_config, "bad", bad=True)
    old_container = objects.create_container(good_pod, good_config, "old")
    server = TestHookServer("guard", str(node.workdir / "guard.sock"))
    points = (
        P.PRE_RUN_POD_SANDBOX, P.PRE_CREATE_CONTAINER, P.PRE_START_CONTAINER, P.PRE_STOP_CONTAINER,
        P.PRE_REMOVE_POD_SANDBOX,
    )
    for point in points:
        server.set(point, Respond())
    await server.start()
    server.register(node.config_dir, policy="Fail", hooks=points)
    try:
        args = [*node.proxy_args(), "--metrics-address", "127.0.0.1:0"]
        proxy = await asyncio.to_thread(node.start_daemon, "proxy", args)
        rebuilt = await asyncio.to_thread(
            proxy.wait_record, lambda r: r.get("event") == "store rebuilt from the runtime"
        )
        assert (rebuilt["attempts"], rebuilt["sandboxes"], rebuilt["containers"], rebuilt["unreadable"]) == (1, 1, 1, 2)
        ready = proxy.wait_record(lambda r: r.get("event") == "ready")

        async with grpc.aio.insecure_channel(f"unix://{node.proxy_endpoint}") as channel:
            rs = STUBS.RuntimeServiceStub(channel)
            # A container of the good pod created before the proxy: hooked with the rebuilt data.
            await rs.StartContainer(pb.StartContainerRequest(container_id=old_container), timeout=CALL_TIMEOUT)
            started = server.last(P.PRE_START_CONTAINER)
            assert started.container_meta.id == old_container and started.pod_meta.name == good_config.metadata.name
            assert dict(started.pod_labels) == {"app": "good"}
            assert started.pod_cgroup_parent == good_config.linux.cgroup_parent
            # A new pod through the proxy: hooked as usual.
            config = objects.pod_config("new")
            sandbox_id = (
                await rs.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT)
            ).pod_sandbox_id
            create = pb.CreateContainerRequest(
                pod_sandbox_id=sandbox_id, config=objects.container_config("app"), sandbox_config=config
            )
            await rs.CreateContainer(create, timeout=CALL_TIMEOUT)
            assert server.last(P.PRE_CREATE_CONTAINER).pod_meta.name == config.metadata.name
            # The unreadable container under a Fail server: refused, never hooked with empty data.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await rs.StartContainer(pb.StartContainerRequest(container_id=bad_container), timeout=CALL_TIMEOUT)
            assert refused.value.code() == grpc.StatusCode.INTERNAL
            assert "cannot be decoded" in str(refused.value.details())
            assert [r.container_meta.id for r in server.calls(P.PRE_START_CONTAINER)] == [old_container]
            # Teardown of unreadable objects goes on even under Fail: refusing it would keep
            # them on the node for ever (they were made around the proxy, never hooked).
            await rs.StopContainer(pb.StopContainerRequest(container_id=bad_container), timeout=CALL_TIMEOUT)
            await rs.RemoveContainer(pb.RemoveContainerRequest(container_id=bad_container), timeout=CALL_TIMEOUT)
            await rs.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=bad_pod), timeout=CALL_TIMEOUT)
            await rs.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=bad_pod), timeout=CALL_TIMEOUT)
            assert server.calls(P.PRE_STOP_CONTAINER) == [] and server.calls(P.PRE_REMOVE_POD_SANDBOX) == []
            left = objects.cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=CALL_TIMEOUT)
            assert bad_pod not in [item.id for item in left.items]

        records = proxy.records()
        assert unreadable_records(records) == sorted([("container", bad_container), ("sandbox", bad_pod)])
        assert not [r for r in records if r.get("event") == "store rebuild from the runtime failed; retrying"]
        text = scrape(ready["metrics_address"])
        for kind in ("sandbox", "container"):
            assert metric(text, "runtimeproxy_store_unreadable_objects_total", kind=kind) == 1
    finally:
        await server.stop()


@pytest.mark.e2e
def test_reconciler_rounds_go_on_past_unreadable_objects(objects: Objects, node: ProxyAndHooks) -> None:
    bad_pod, _ = objects.run_pod("bad", bad=True)
    good_pod, good_config = objects.run_pod("good")
    bad_container = objects.create_container(good_pod, good_config, "bad", bad=True)
    objects.create_container(good_pod, good_config, "app", start=True)
    policy = node.workdir / "policy.yaml"
    policy.write_text('reconciler:\n  interval_seconds: 0.2\nnetwork:\n  interface: ""\n')
    (node.workdir / "no-resctrl").mkdir()
    args = node.hooks_args(
        HOOKS,
        node.workdir / "no-resctrl",
        "--runtime-endpoint",
        objects.containerd.address,
        "--policy",
        str(policy),
        "--metrics-address",
        "127.0.0.1:0",
    )
    hooks = node.start_daemon("hooks", args)
    ready = hooks.wait_record(lambda r: r.get("event") == "ready")

    def rounds(result: str) -> float:
        return metric(scrape(ready["metrics_address"]), "runtimehooks_reconcile_rounds_total", result=result)

    eventually(lambda: rounds("ok") + rounds("plugin_failures") >= 5, 20, hooks.log)
    text = scrape(ready["metrics_address"])
    assert rounds("runtime_error") == 0, hooks.log()
    assert metric(text, "runtimehooks_reconcile_pods") == 1  # the good pod, every round
    for kind in ("sandbox", "container"):
        assert metric(text, "runtimehooks_reconcile_unreadable_objects_total", kind=kind) == 1
    assert unreadable_records(hooks.records()) == sorted([("container", bad_container), ("sandbox", bad_pod)])


@pytest.mark.e2e
async def test_proxy_with_hostile_registration_files_starts_and_serves(objects: Objects, node: ProxyAndHooks) -> None:
    write_raw_registration(node.config_dir, "bomb.json", "[" * 1000 + "]" * 1000)
    (node.config_dir / "huge.json").write_text(" " * (MAX_CONFIG_BYTES + 1))
    os.mkfifo(node.config_dir / "pipe.json")
    server = TestHookServer("valid", str(node.workdir / "valid.sock")).set(P.PRE_RUN_POD_SANDBOX, Respond())
    await server.start()
    server.register(node.config_dir, policy="Fail")
    try:
        proxy: Daemon = await asyncio.to_thread(node.start_daemon, "proxy", node.proxy_args())
        await asyncio.to_thread(
            proxy.wait_record, lambda r: r.get("event") == "hook server added" and r.get("server") == "valid.json"
        )
        async with grpc.aio.insecure_channel(f"unix://{node.proxy_endpoint}") as channel:
            rs = STUBS.RuntimeServiceStub(channel)
            assert (await rs.Version(pb.VersionRequest(), timeout=CALL_TIMEOUT)).runtime_name == "containerd"
            config = objects.pod_config("served")
            await rs.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT)
        assert server.last(P.PRE_RUN_POD_SANDBOX).pod_meta.name == config.metadata.name
        await asyncio.sleep(1.0)  # five more polls: still one line per file
        skipped = {r["file"]: r["reason"] for r in proxy.records() if r.get("event") == "hook config skipped"}
        assert skipped.keys() == {"bomb.json", "huge.json", "pipe.json"}
        assert "nested too deeply" in skipped["bomb.json"] and str(MAX_CONFIG_BYTES + 1) in skipped["huge.json"]
        assert len([r for r in proxy.records() if r.get("event") == "hook config skipped"]) == 3
        assert not [r for r in proxy.records() if r.get("event") == "hook config scan failed"]
        assert proxy.alive
    finally:
        await server.stop()
