"""Container repair in NRI mode (hooks/nri/repair.py, hooks/nri/plugin.py): the Synchronize answer
updates the containers that lack the plugins' values, reconcile rounds update through the runtime's CRI,
and a lost connection registers again as soon as the socket is back. Against a fake NRI runtime on a
real unix socket speaking NRI's multiplexed ttrpc (and a fake CRI server), with the built-in cpu plugin
on fake cgroup trees."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fake_runtime import FakeRuntime
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.container_repair import ContainerRepair, RepairMetrics
from runtimeproxy.hooks.extended_resources import BATCH_CPU, EXTENDED_RESOURCE_SPEC_ANNOTATION
from runtimeproxy.hooks.nri.mapping import container_from_nri, pod_from_nri
from runtimeproxy.hooks.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, MuxDecoder, encode_chunks
from runtimeproxy.hooks.nri.nri_metrics import NriMetrics
from runtimeproxy.hooks.nri.plugin import NriPlugin, NriSettings
from runtimeproxy.hooks.nri.repair import LANDING_SECONDS, LANDING_SECONDS_PER_UPDATE, CriUpdates
from runtimeproxy.hooks.nri.rpc import StatusCode
from runtimeproxy.hooks.nri.service import NriHooks
from runtimeproxy.hooks.nri.ttrpc import FrameDecoder, MessageType, encode_frame
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.plugins import cpu
from runtimeproxy.hooks.sdk import HookPoint, Plugin, ServerContext
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1
from structlog.testing import capture_logs

from runtimeproxy.api.nri.ttrpc import ttrpc_pb2 as ttrpc_pb
from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri
from runtimeproxy.api.runtime.v1 import api_pb2 as pb

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
BATCH = {"requests": {BATCH_CPU: "250"}, "limits": {BATCH_CPU: "500"}}  # quota 50000, 256 shares
SPEC = json.dumps({"containers": {"a": BATCH, "b": BATCH}})


# -- pods and containers as NRI reports them -------------------------------------------------------------


def be_pod(tree: FakeCgroup) -> Any:
    pod = nri.PodSandbox(id="sb-be", name="batch", uid="be-1", namespace="ns")
    pod.labels["koordinator.sh/qosClass"] = "BE"
    pod.annotations[EXTENDED_RESOURCE_SPEC_ANNOTATION] = SPEC
    pod.linux.cgroup_parent = tree.add_pod("be-1", "besteffort")
    return pod


def container(name: str, state: int = nri.CONTAINER_RUNNING, *, hooked: bool = False, pod: str = "sb-be") -> Any:
    """A container of ``pod``: kubelet's BestEffort values in its spec, or (``hooked``) the plugins'."""
    made = nri.Container(id=f"c-{name}", pod_sandbox_id=pod, name=name, state=state)
    cpu_resources = made.linux.resources.cpu
    cpu_resources.period.value = 100_000
    cpu_resources.shares.value = 256 if hooked else 2
    if hooked:
        cpu_resources.quota.value = 50_000
    return made


def hooks_for(tree: FakeCgroup, *plugins: Plugin) -> tuple[NriHooks, CollectorRegistry]:
    registry = CollectorRegistry()
    runner = PluginRunner(plugins or [cpu.plugin], context=ServerContext(cgroups=tree.fs()), registry=registry)
    repair = ContainerRepair(runner, RepairMetrics(registry, "nri"))
    return NriHooks(runner, NriMetrics(registry), repair=repair), registry


async def synchronize(hooks: NriHooks, request: Any, timeout: float = 2.0) -> Any:
    method = hooks.methods()[(PLUGIN, "Synchronize")]
    return nri.SynchronizeResponse.FromString(await method(request.SerializeToString(), timeout))


def repaired(registry: CollectorRegistry, reason: str) -> float | None:
    return registry.get_sample_value("runtimeproxy_hooks_containers_repaired_total", {"mode": "nri", "reason": reason})


@pytest.fixture
def tree(tmp_path: Path) -> FakeCgroup:
    return make_fake_cgroup_v1(tmp_path / "cgroup")


# -- Synchronize --------------------------------------------------------------------------------------------


async def test_synchronize_updates_the_live_containers_created_without_the_plugins(tree: FakeCgroup) -> None:
    pod = be_pod(tree)
    containers = [
        container("a"),  # created while not registered: kubelet's values
        container("b", hooked=True),  # created with our answer
        container("a", nri.CONTAINER_STOPPED),  # exited: nothing to update
        container("a", pod="sb-gone"),  # its pod is not listed
    ]
    containers[2].id, containers[3].id = "c-old", "c-orphan"
    hooks, registry = hooks_for(tree)
    with capture_logs() as logs:
        answer = await synchronize(hooks, nri.SynchronizeRequest(pods=[pod], containers=containers))
    [update] = answer.update
    assert update.container_id == "c-a" and not update.ignore_failure
    resources = update.linux.resources
    assert (resources.cpu.quota.value, resources.cpu.shares.value) == (50_000, 256)
    assert not resources.cpu.HasField("period") and not resources.HasField("memory")  # only what differs
    assert repaired(registry, "unhooked") == 1.0 and repaired(registry, "drifted") == 0.0
    [line] = [entry for entry in logs if entry["event"] == "container repaired"]
    assert (line["container"], line["pod"], line["mode"], line["reason"]) == ("a", "ns/batch", "nri", "unhooked")
    assert line["how"] == "Synchronize answer"
    assert line["values"] == ["cpu_quota: -1 -> 50000", "cpu_shares: 2 -> 256"]


async def test_synchronize_updates_a_container_whose_cgroup_lost_the_values(tree: FakeCgroup) -> None:
    pod = be_pod(tree)
    hooked = container("b", hooked=True)
    tree.add_container(pod.linux.cgroup_parent, hooked.id)  # running: the quota of a fresh cgroup, -1
    tree.fs().set_cpu_shares(pod.linux.cgroup_parent, 256, hooked.id)
    hooks, registry = hooks_for(tree)
    answer = await synchronize(hooks, nri.SynchronizeRequest(pods=[pod], containers=[hooked]))
    [update] = answer.update
    assert update.linux.resources.cpu.quota.value == 50_000 and not update.linux.resources.cpu.HasField("shares")
    assert repaired(registry, "drifted") == 1.0 and repaired(registry, "unhooked") == 0.0


async def test_synchronize_answers_within_its_deadline_and_leaves_the_rest(tree: FakeCgroup) -> None:
    slow = Plugin("slow", version="1", timeout=30.0)

    @slow.on(HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
    async def wait(**kwargs: Any) -> None:
        await asyncio.sleep(30)

    hooks, registry = hooks_for(tree, slow)
    request = nri.SynchronizeRequest(pods=[be_pod(tree)], containers=[container("a"), container("b")])
    with capture_logs() as logs:
        answer = await synchronize(hooks, request, timeout=0.2)
    assert list(answer.update) == [] and repaired(registry, "unhooked") == 0.0
    [late] = [entry for entry in logs if entry["event"].startswith("NRI's deadline came before every container")]
    assert (late["checked"], late["left"]) == (0, 2)


# -- a fake NRI runtime: registration, Synchronize, UpdateContainers ------------------------------------------


class Runtime:
    """NRI's side of the socket: registers each plugin that connects, configures and synchronizes
    it with ``sync``, then answers its UpdateContainers calls (recorded in ``updates``), failing
    those naming a container in ``refuse`` as containerd does (an error status)."""

    def __init__(self, sync: Any) -> None:
        self.sync = sync
        self.refuse: set[str] = set()
        self.updates: list[Any] = []
        self.registered = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        mux, frames = MuxDecoder(), {PLUGIN_SERVICE_CONN: FrameDecoder(), RUNTIME_SERVICE_CONN: FrameDecoder()}
        stream, registered = 1, False
        try:
            while data := await reader.read(65536):
                for conn, chunk in mux.feed(data):
                    for frame in frames[conn].feed(chunk):
                        if conn == RUNTIME_SERVICE_CONN:
                            registered |= self._answer(
                                writer, frame.stream_id, ttrpc_pb.Request.FromString(frame.payload)
                            )
                if registered and stream == 1:  # just registered: configure and synchronize it
                    for method, message in (("Configure", nri.ConfigureRequest()), ("Synchronize", self.sync)):
                        call = ttrpc_pb.Request(service=PLUGIN, method=method, payload=message.SerializeToString())
                        self._send(writer, PLUGIN_SERVICE_CONN, stream, MessageType.REQUEST, call)
                        stream += 2
        finally:
            writer.close()

    def _answer(self, writer: asyncio.StreamWriter, stream: int, request: Any) -> bool:
        """Answer a call to the Runtime service; whether it was RegisterPlugin."""
        status = None
        if request.method == "RegisterPlugin":
            self.registered += 1
        else:
            update = nri.UpdateContainersRequest.FromString(request.payload)
            self.updates.append(update)
            if {u.container_id for u in update.update} & self.refuse:
                status = ttrpc_pb.Status(code=StatusCode.UNKNOWN, message="NRI update of some containers failed")
        reply = ttrpc_pb.Response(payload=nri.Empty().SerializeToString(), status=status)
        self._send(writer, RUNTIME_SERVICE_CONN, stream, MessageType.RESPONSE, reply)
        return request.method == "RegisterPlugin"

    @staticmethod
    def _send(writer: asyncio.StreamWriter, conn: int, stream: int, kind: int, message: Any) -> None:
        writer.write(encode_chunks(conn, encode_frame(stream, kind, message.SerializeToString())))

    def drop(self) -> None:
        """Close every plugin connection, as a runtime that goes down does."""
        for writer in self.writers:
            writer.close()


async def registered(plugin: NriPlugin, count: int, within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while plugin.registrations < count:
            await asyncio.sleep(0.01)


def nri_plugin(path: Path, tree: FakeCgroup, **settings: float) -> tuple[NriPlugin, CollectorRegistry]:
    hooks, registry = hooks_for(tree)
    return NriPlugin(hooks, NriSettings(str(path), ready_timeout=5.0, **settings)), registry


async def test_rounds_update_containers_through_the_runtimes_cri(tree: FakeCgroup, tmp_path: Path) -> None:
    """Not NRI's Runtime.UpdateContainers (it can deadlock containerd 1.7 beside a pod start): the
    runtime's CRI update, which runs our NRI hooks like kubelet's resize."""
    pod = be_pod(tree)
    running = container("a", hooked=True)  # ours, but its cgroup lost the quota
    tree.add_container(pod.linux.cgroup_parent, running.id)
    tree.fs().set_cpu_shares(pod.linux.cgroup_parent, 256, running.id)
    pod_info, info = pod_from_nri(pod), container_from_nri(running)
    hooks, registry = hooks_for(tree)
    async with FakeRuntime(path=str(tmp_path / "cri.sock")) as cri:
        assert cri.path is not None
        updates = CriUpdates(cri.path, hooks.synchronized)
        with capture_logs() as logs:
            assert await hooks.repair.reconcile([pod_info], {pod.id: [info]}, updates) == 1
        [call] = cri.calls("UpdateContainerResources")
        expected = pb.LinuxContainerResources(cpu_quota=50_000)  # only what differs
        assert (call.request.container_id, call.request.linux) == ("c-a", expected)
        [line] = [entry for entry in logs if entry["event"] == "container repaired"]
        assert (line["mode"], line["reason"], line["how"]) == ("nri", "drifted", "UpdateContainerResources")
        assert repaired(registry, "drifted") == 1.0  # the CRI status is no record in NRI mode
        await cri.stop()
        with capture_logs() as logs:  # the runtime away: repairs wait, nothing counts as failed
            assert await hooks.repair.reconcile([pod_info], {pod.id: [info]}, updates) == 0
        [deferred] = [entry for entry in logs if entry["event"] == "container repair deferred"]
        assert deferred["reason"].startswith("the runtime is not answering: UNAVAILABLE")
        assert registry.get_sample_value("runtimeproxy_hooks_container_repairs_failed_total", {"mode": "nri"}) == 0.0
        await updates.close()


async def test_a_synchronize_answer_with_updates_makes_the_next_round_wait_for_them(tree: FakeCgroup) -> None:
    hooks, _ = hooks_for(tree)
    request = nri.SynchronizeRequest(pods=[be_pod(tree)], containers=[container("b", hooked=True)])
    await synchronize(hooks, request)
    assert hooks.synchronized.landing() == 0.0  # nothing asked: nothing to wait for
    request.containers.append(container("a"))
    await synchronize(hooks, request)
    assert 0.0 < hooks.synchronized.landing() <= LANDING_SECONDS + LANDING_SECONDS_PER_UPDATE


async def test_registration_follows_the_socket_coming_back_not_the_backoff(tree: FakeCgroup, tmp_path: Path) -> None:
    """With a 30 s backoff, only the watch on the socket's directory can bring the plugin back
    before the test's 10 s are up."""
    path = tmp_path / "nri.sock"
    runtime = Runtime(nri.SynchronizeRequest())
    server = await asyncio.start_unix_server(runtime, str(path))
    plugin, _ = nri_plugin(path, tree, reconnect_min=30.0, reconnect_max=30.0)
    await plugin.start()
    with capture_logs() as logs:
        server.close()
        runtime.drop()
        await server.wait_closed()
        path.unlink()  # the runtime is down: no socket
        async with asyncio.timeout(10):
            while not [entry for entry in logs if entry["event"] == "NRI reconnection failed"]:
                await asyncio.sleep(0.01)
        server = await asyncio.start_unix_server(runtime, str(path))  # back
        async with server:
            await registered(plugin, 2)
            [again] = [entry for entry in logs if entry["event"] == "NRI plugin re-registered"]
            assert again["attempts"] == 2 and runtime.registered == 2
            await plugin.stop()
    [failed] = [entry for entry in logs if entry["event"] == "NRI reconnection failed"]
    assert "does not exist" in failed["error"] and failed["log_level"] == "warning"
