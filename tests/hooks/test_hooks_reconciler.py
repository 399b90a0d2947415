"""The runtime-hooks reconciler: live pods from the runtime, drift repaired and counted, pods that
went away reported, runtime failures retried; against a scripted runtime and a real containerd."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from daemons import HOOKS_CLI, Daemon
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks import policy as policy_mod
from runtimeproxy.hooks.cgroups import CgroupFS, PodRoots
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.reconciler import LivePods, Reconciler, list_live_pods
from runtimeproxy.hooks.sdk import ContainerInfo, Plugin, PodInfo, ServerContext
from runtimeproxy.hooks.testkit.fake_cgroups import make_fake_cgroup_v2
from structlog.testing import capture_logs
from verbose_info import go_json

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.common import trace
from runtimeproxy.kubelet_model.manifest import load_pod
from runtimeproxy.kubelet_model.pod_plan import build_plan
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.play.runner import delete, play
from runtimeproxy.runtime_state import RuntimeLoader
from runtimeproxy.testbed import Containerd

PODS = Path(__file__).parents[1] / "data" / "pods"
GI = 1 << 30


# --- a scripted runtime behind a real RuntimeLoader -------------------------------------------------


def rpc_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


class FakeRuntime:
    """RuntimeService answers from in-memory sandboxes and containers, with their states."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, tuple[pb.PodSandboxConfig, int]] = {}
        self.containers: dict[str, tuple[str, pb.ContainerConfig, int]] = {}
        self.down = False
        self.calls: list[str] = []

    def add_pod(
        self, name: str, cgroup_parent: str, *, state: int = pb.SANDBOX_READY, labels: dict[str, str] | None = None
    ) -> str:
        sandbox_id = f"s-{name}"
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="prod", attempt=0),
            labels=labels or {},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=cgroup_parent, resources=pb.LinuxContainerResources(cpu_shares=512)
            ),
        )
        self.sandboxes[sandbox_id] = (config, state)
        return sandbox_id

    def add_container(self, sandbox_id: str, name: str, *, state: int = pb.CONTAINER_RUNNING) -> str:
        container_id = f"c-{sandbox_id}-{name}"
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name),
            image=pb.ImageSpec(image="busybox"),
            envs=[pb.KeyValue(key="GREETING", value=b"hello=world")],
            linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(cpu_shares=256, cpu_quota=20000)),
        )
        self.containers[container_id] = (sandbox_id, config, state)
        return container_id

    def remove_pod(self, sandbox_id: str) -> None:
        del self.sandboxes[sandbox_id]
        for container_id in [c for c, (s, _, _) in self.containers.items() if s == sandbox_id]:
            del self.containers[container_id]

    def _check(self, call: str) -> None:
        self.calls.append(call)
        if self.down:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")

    async def ListPodSandbox(self, request: Any, timeout: float) -> pb.ListPodSandboxResponse:
        self._check("ListPodSandbox")
        wanted = request.filter.state.state if request.filter.HasField("state") else None
        return pb.ListPodSandboxResponse(
            items=[
                pb.PodSandbox(id=i, metadata=config.metadata, labels=config.labels, state=state)
                for i, (config, state) in self.sandboxes.items()
                if wanted is None or state == wanted
            ]
        )

    async def ListContainers(self, request: Any, timeout: float) -> pb.ListContainersResponse:
        self._check("ListContainers")
        return pb.ListContainersResponse(
            containers=[
                pb.Container(id=i, pod_sandbox_id=sandbox, metadata=config.metadata, state=state)
                for i, (sandbox, config, state) in self.containers.items()
                if not request.filter.id or request.filter.id == i
            ]
        )

    async def PodSandboxStatus(self, request: Any, timeout: float) -> pb.PodSandboxStatusResponse:
        self._check(f"PodSandboxStatus {request.pod_sandbox_id}")
        if request.pod_sandbox_id not in self.sandboxes:
            raise rpc_error(grpc.StatusCode.NOT_FOUND, "no such sandbox")
        config, state = self.sandboxes[request.pod_sandbox_id]
        status = pb.PodSandboxStatus(id=request.pod_sandbox_id, metadata=config.metadata, state=state)
        return pb.PodSandboxStatusResponse(status=status, info={"info": json.dumps({"config": go_json(config)})})

    async def ContainerStatus(self, request: Any, timeout: float) -> pb.ContainerStatusResponse:
        self._check(f"ContainerStatus {request.container_id}")
        if request.container_id not in self.containers:
            raise rpc_error(grpc.StatusCode.NOT_FOUND, "no such container")
        sandbox, config, state = self.containers[request.container_id]
        status = pb.ContainerStatus(id=request.container_id, metadata=config.metadata, state=state)
        info = {"info": json.dumps({"sandboxID": sandbox, "config": go_json(config)})}
        return pb.ContainerStatusResponse(status=status, info=info)


def fake_loader(runtime: FakeRuntime) -> RuntimeLoader:
    loader = RuntimeLoader("unix:///nonexistent.sock")
    loader._stub = runtime  # no channel is opened
    return loader


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


# --- plugins -----------------------------------------------------------------------------------------


class Tuner:
    """A plugin that owns cpu.max.burst of every live container: sets it to 5000 where it drifted,
    keeps per-pod state, and clears it for the pods and containers reported gone."""

    def __init__(self, name: str = "tuner") -> None:
        self.plugin = Plugin(name)
        self.seen: list[dict[str, Any]] = []
        self.state: dict[str, set[str]] = {}  # sandbox id -> container ids it tuned
        self.plugin.reconcile(self.reconcile)

    def reconcile(
        self,
        *,
        pods: list[PodInfo],
        containers: dict[str, tuple[ContainerInfo, ...]],
        gone: tuple[PodInfo, ...],
        gone_containers: dict[str, tuple[ContainerInfo, ...]],
        cgroups: CgroupFS | None,
        dry_run: bool,
        **kwargs: Any,
    ) -> int:
        self.seen.append({"pods": pods, "containers": containers, "gone": gone, "gone_containers": gone_containers})
        assert not dry_run
        for pod in gone:
            self.state.pop(pod.sandbox_id, None)
        for sandbox_id, left in gone_containers.items():
            for container in left:
                self.state.get(sandbox_id, set()).discard(container.id)
        repaired = 0
        for pod in pods:
            for container in containers.get(pod.sandbox_id, ()):
                self.state.setdefault(pod.sandbox_id, set()).add(container.id)
                if cgroups is None or not cgroups.exists(pod.cgroup_parent, container.id):
                    continue
                if cgroups.read("cpu", "cpu.max.burst", pod.cgroup_parent, container.id) != "5000":
                    cgroups.set_cpu_burst(pod.cgroup_parent, 5000, container_id=container.id)
                    repaired += 1
        return repaired


def runner_for(*plugins: Plugin, cgroups: CgroupFS | None = None, **context: Any) -> PluginRunner:
    return PluginRunner(plugins, context=ServerContext(cgroups=cgroups, **context))


# --- listing ------------------------------------------------------------------------------------------


async def test_only_ready_pods_and_created_or_running_containers_are_live() -> None:
    runtime = FakeRuntime()
    web = runtime.add_pod("web", "/kubepods/burstable/podweb", labels={"koordinator.sh/qosClass": "LS"})
    runtime.add_container(web, "app")
    runtime.add_container(web, "starting", state=pb.CONTAINER_CREATED)
    runtime.add_container(web, "done", state=pb.CONTAINER_EXITED)
    old = runtime.add_pod("old", "/kubepods/besteffort/podold", state=pb.SANDBOX_NOTREADY)
    runtime.add_container(old, "app", state=pb.CONTAINER_EXITED)

    live = await list_live_pods(fake_loader(runtime))

    [pod] = live.pods
    assert (pod.name, pod.namespace, pod.uid, pod.sandbox_id) == ("web", "prod", "uid-web", web)
    assert pod.cgroup_parent == "/kubepods/burstable/podweb"
    assert dict(pod.labels) == {"koordinator.sh/qosClass": "LS"}
    assert pod.resources is not None and pod.resources.cpu_shares == 512
    names = sorted(c.name for c in live.containers[web])
    assert names == ["app", "starting"]
    app = next(c for c in live.containers[web] if c.name == "app")
    assert app.id == f"c-{web}-app" and app.env == (("GREETING", "hello=world"),)
    assert app.resources is not None and (app.resources.cpu_shares, app.resources.cpu_quota) == (256, 20000)
    assert not any(call.endswith(old) for call in runtime.calls)  # not even asked about


async def test_drift_is_repaired_and_counted(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cgroup")
    runtime = FakeRuntime()
    parent = tree.add_pod("web")
    sandbox = runtime.add_pod("web", parent)
    container = runtime.add_container(sandbox, "app")
    tree.add_container(parent, container)
    tuner = Tuner()
    registry = CollectorRegistry()
    reconciler = Reconciler(runner_for(tuner.plugin, cgroups=tree.fs()), fake_loader(runtime), registry=registry)
    drift = "runtimehooks_reconcile_drift_total"
    assert sample(registry, drift, plugin="tuner") == 0  # the series exists before any round

    first = await reconciler.run_once()
    assert first.ok and first.repaired == {"tuner": 1} and (first.pods, first.containers) == (1, 1)
    assert tree.read(parent, "cpu.max.burst", container) == "5000"
    assert (await reconciler.run_once()).repaired == {"tuner": 0}  # nothing drifted: nothing written

    (tree.dir(parent, container) / "cpu.max.burst").write_text("0\n")  # someone changed it behind our back
    assert (await reconciler.run_once()).repaired == {"tuner": 1}
    assert tree.read(parent, "cpu.max.burst", container) == "5000"

    assert sample(registry, drift, plugin="tuner") == 2
    assert sample(registry, "runtimehooks_reconcile_duration_seconds_count") == 3
    assert sample(registry, "runtimehooks_reconcile_rounds_total", result="ok") == 3
    assert sample(registry, "runtimehooks_reconcile_pods") == 1


async def test_pods_and_containers_that_went_away_are_reported_gone() -> None:
    runtime = FakeRuntime()
    web = runtime.add_pod("web", "/kubepods/burstable/podweb")
    app = runtime.add_container(web, "app")
    sidecar = runtime.add_container(web, "sidecar")
    batch = runtime.add_pod("batch", "/kubepods/besteffort/podbatch")
    job = runtime.add_container(batch, "job")
    tuner = Tuner()
    reconciler = Reconciler(runner_for(tuner.plugin), fake_loader(runtime))

    await reconciler.run_once()
    assert tuner.seen[-1]["gone"] == () and dict(tuner.seen[-1]["gone_containers"]) == {}
    assert tuner.state == {web: {app, sidecar}, batch: {job}}

    runtime.remove_pod(batch)
    del runtime.containers[sidecar]
    result = await reconciler.run_once()

    seen = tuner.seen[-1]
    assert [pod.name for pod in seen["gone"]] == ["batch"] and result.gone == 1
    assert {sandbox: [c.name for c in left] for sandbox, left in seen["gone_containers"].items()} == {
        web: ["sidecar"],
        batch: ["job"],
    }
    assert [pod.name for pod in seen["pods"]] == ["web"]
    assert tuner.state == {web: {app}}  # the plugin cleared what it kept for them
    await reconciler.run_once()
    assert tuner.seen[-1]["gone"] == ()  # reported once


async def test_a_failing_runtime_is_logged_and_retried_at_the_next_interval() -> None:
    runtime = FakeRuntime()
    web = runtime.add_pod("web", "/kubepods/burstable/podweb")
    runtime.add_container(web, "app")
    tuner = Tuner()
    registry = CollectorRegistry()
    runtime.down = True
    reconciler = Reconciler(runner_for(tuner.plugin), fake_loader(runtime), registry=registry, interval=lambda: 0.05)
    with capture_logs() as logs:
        reconciler.start()
        try:
            async with asyncio.timeout(10):
                while reconciler.rounds < 3:
                    await asyncio.sleep(0.01)
                assert tuner.seen == []  # no plugin runs on a round without pods
                runtime.down = False
                # Until a round has ended well (its plugins seen is not enough: stopping then
                # could cut the round off before it is counted).
                while reconciler.last is None or not reconciler.last.ok:
                    await asyncio.sleep(0.01)
        finally:
            await reconciler.stop()
    assert not reconciler.running
    failed = [e for e in logs if e["event"] == "cannot list the runtime's pods; reconciling again at the next interval"]
    assert len(failed) >= 3 and "UNAVAILABLE" in failed[0]["error"] and failed[0]["retry_in_s"] == 0.05
    assert sample(registry, "runtimehooks_reconcile_rounds_total", result="runtime_error") >= 3
    assert sample(registry, "runtimehooks_reconcile_rounds_total", result="ok") >= 1
    assert reconciler.last is not None and reconciler.last.ok and reconciler.runtime_failures == 0
    assert [pod.name for pod in tuner.seen[0]["pods"]] == ["web"]


async def test_gone_is_relative_to_the_last_round_that_listed_the_runtime() -> None:
    runtime = FakeRuntime()
    web = runtime.add_pod("web", "/kubepods/burstable/podweb")
    tuner = Tuner()
    reconciler = Reconciler(runner_for(tuner.plugin), fake_loader(runtime))
    await reconciler.run_once()
    runtime.down = True
    assert not (await reconciler.run_once()).ok
    runtime.down = False
    runtime.remove_pod(web)
    await reconciler.run_once()
    assert [pod.name for pod in tuner.seen[-1]["gone"]] == ["web"]


async def test_a_failing_plugin_does_not_stop_the_others_and_is_counted() -> None:
    runtime = FakeRuntime()
    runtime.add_pod("web", "/kubepods/burstable/podweb")
    broken = Plugin("broken", order=1)

    @broken.reconcile
    def explode(**kwargs: Any) -> int:
        raise RuntimeError("cgroup gone")

    odd = Plugin("odd", order=2)

    @odd.reconcile
    def odd_return(**kwargs: Any) -> str:
        return "lots"

    tuner = Tuner()
    registry = CollectorRegistry()
    runner = PluginRunner([broken, odd, tuner.plugin], registry=registry)
    reconciler = Reconciler(runner, fake_loader(runtime), registry=registry)
    with capture_logs() as logs:
        result = await reconciler.run_once()
    assert result.ok and [f.plugin for f in result.failures] == ["broken"]
    assert result.repaired == {"odd": 0, "tuner": 0}
    assert any(e.get("plugin") == "odd" and "should return the number" in e["event"] for e in logs)
    assert sample(registry, "runtimehooks_reconcile_rounds_total", result="plugin_failures") == 1
    assert sample(registry, "runtimeproxy_hooks_plugin_calls_total", plugin="broken", hook="reconcile", outcome="error")
    assert len(tuner.seen) == 1


async def test_the_interval_follows_the_policy_in_force() -> None:
    current = [policy_mod.DEFAULT_POLICY]
    hour = policy_mod.loads_policy("reconciler: {interval_seconds: 3600}")
    fast = policy_mod.loads_policy("reconciler: {interval_seconds: 0.1}")
    current[0] = hour
    calls: list[float] = []

    async def lister() -> LivePods:
        calls.append(asyncio.get_running_loop().time())
        return LivePods()

    plugin = Plugin("p")

    @plugin.reconcile
    def noop(**kwargs: Any) -> None: ...

    reconciler = Reconciler(runner_for(plugin, policy=lambda: current[0]), lister)
    assert reconciler.interval() == 3600
    reconciler.start()
    try:
        async with asyncio.timeout(10):
            while not calls:  # the first round runs at once
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            assert len(calls) == 1  # then it waits an hour...
            current[0] = fast
            reconciler.poke(fast)  # ...until the policy is reloaded (PolicyWatcher's on_change)
            while len(calls) < 3:
                await asyncio.sleep(0.01)
    finally:
        await reconciler.stop()
    assert calls[2] - calls[1] >= 0.09


async def test_each_round_is_traced_from_its_start_to_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    # bench/pod_timeline.py sets apart the pod starts a round overlapped, from these events.
    events: list[dict[str, Any]] = []
    monkeypatch.setattr(trace, "ON", True)
    monkeypatch.setattr(trace, "event", lambda ev, **fields: events.append({"ev": ev, "t": trace.now(), **fields}))
    listed: list[int] = []

    async def lister() -> LivePods:
        listed.append(trace.now())
        return LivePods()

    plugin = Plugin("p")

    @plugin.reconcile
    def noop(**kwargs: Any) -> None: ...

    reconciler = Reconciler(runner_for(plugin), lister)
    reconciler.start()
    try:
        async with asyncio.timeout(10):
            while not any(e["ev"] == "hooks.reconcile" for e in events):
                await asyncio.sleep(0.01)
    finally:
        await reconciler.stop()
    [event] = [e for e in events if e["ev"] == "hooks.reconcile"]
    assert event["began"] <= listed[0] <= event["t"]


async def test_a_policy_watcher_reload_reaches_the_reconciler(tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("reconciler: {interval_seconds: 3600}\n")
    calls: list[float] = []

    async def lister() -> LivePods:
        calls.append(0.0)
        return LivePods()

    plugin = Plugin("p")

    @plugin.reconcile
    def noop(**kwargs: Any) -> None: ...

    listeners: list[Any] = []
    watcher = policy_mod.PolicyWatcher(policy_file, on_change=lambda p: [f(p) for f in listeners], poll_interval=0.05)
    await watcher.start()
    reconciler = Reconciler(runner_for(plugin, policy=lambda: watcher.current), lister)
    listeners.append(reconciler.poke)
    reconciler.start()
    try:
        async with asyncio.timeout(10):
            while not calls:
                await asyncio.sleep(0.01)
            policy_file.write_text("reconciler: {interval_seconds: 0.1}\n")
            while len(calls) < 3:
                await asyncio.sleep(0.01)
    finally:
        await reconciler.stop()
        await watcher.stop()


# --- against a real containerd ------------------------------------------------------------------------


@pytest.fixture
def bed(containerd: Containerd) -> Iterator[Containerd]:
    containerd.start()
    yield containerd
    if not containerd.running:
        containerd.start()
    containerd.remove_all_pods()


class SoftLimit:
    """Owns memory.soft_limit_in_bytes (cgroup v1) of LS containers: 64 MiB."""

    WANT = str(64 << 20)

    def __init__(self) -> None:
        self.plugin = Plugin("softlimit")
        self.seen: list[dict[str, Any]] = []
        self.plugin.reconcile(self.reconcile)

    def reconcile(self, *, pods: list[PodInfo], containers: Any, gone: Any, cgroups: CgroupFS, **kwargs: Any) -> int:
        self.seen.append({"pods": list(pods), "containers": dict(containers), "gone": list(gone)})
        repaired = 0
        for pod in pods:
            for container in containers.get(pod.sandbox_id, ()):
                if cgroups.read("memory", "memory.soft_limit_in_bytes", pod.cgroup_parent, container.id) != self.WANT:
                    cgroups.set_memory_soft_limit(pod.cgroup_parent, int(self.WANT), container_id=container.id)
                    repaired += 1
        return repaired


@pytest.mark.e2e
async def test_reconciles_the_pods_a_real_containerd_runs(bed: Containerd, tmp_path: Path) -> None:
    cgroups = CgroupFS(pod_roots=PodRoots([f"/{bed.cgroup_prefix}/kubepods"]))  # where the test bed's pods are
    if int(cgroups.version) != 1:
        pytest.fail("this test bed host is expected to run cgroup v1 (see /work/shared/NOTES.md)")
    pod = load_pod(PODS / "ls-pod.yaml")
    pod.metadata.uid = str(uuid.uuid4())
    plan = build_plan(
        pod, log_dir_base=str(tmp_path / "logs"), machine_memory=8 * GI, cgroup_root="/" + bed.cgroup_prefix
    )
    softlimit = SoftLimit()
    registry = CollectorRegistry()
    runner = PluginRunner([softlimit.plugin], context=ServerContext(cgroups=cgroups))
    reconciler = Reconciler.for_endpoint(runner, bed.address, registry=registry)
    try:
        with CriClient(bed.address, timeout=60.0) as client:
            started = await asyncio.to_thread(play, plan, client)
        [container] = started.containers

        first = await reconciler.run_once()
        assert first.ok and first.repaired == {"softlimit": 1}, first
        seen = softlimit.seen[-1]
        [live] = seen["pods"]
        assert (live.name, live.namespace, live.uid) == ("ls-pod", "default", plan.uid)
        assert live.sandbox_id == started.pod_sandbox_id and live.cgroup_parent == plan.cgroup_parent
        assert live.labels["koordinator.sh/qosClass"] == "LS"
        [info] = seen["containers"][live.sandbox_id]
        assert (info.name, info.id) == ("app", container.container_id)
        assert ("GREETING", "hello=world") in info.env
        path = cgroups.path("memory", plan.cgroup_parent, container.container_id, "memory.soft_limit_in_bytes")
        assert path.read_text().strip() == SoftLimit.WANT  # the real cgroup file

        assert (await reconciler.run_once()).repaired == {"softlimit": 0}
        path.write_text(str(32 << 20))  # drift
        assert (await reconciler.run_once()).repaired == {"softlimit": 1}
        assert path.read_text().strip() == SoftLimit.WANT
        assert sample(registry, "runtimehooks_reconcile_drift_total", plugin="softlimit") == 2

        with CriClient(bed.address, timeout=60.0) as client:
            await asyncio.to_thread(delete, plan, client, grace_period=0)
        gone = await reconciler.run_once()
        assert gone.ok and gone.pods == 0 and gone.gone == 1
        assert [p.name for p in softlimit.seen[-1]["gone"]] == ["ls-pod"]

        bed.stop_daemon()  # the runtime goes away: logged, retried
        down = await reconciler.run_once()
        assert not down.ok and "UNAVAILABLE" in down.error
        bed.start()
        async with asyncio.timeout(30):
            while not (await reconciler.run_once()).ok:
                await asyncio.sleep(0.2)
    finally:
        await reconciler.stop()
        runner.close()


SERVE_PLUGIN = """
import json, os
from runtimeproxy.hooks.sdk import Plugin

plugin = Plugin("recorder-{tag}")

@plugin.reconcile
def record(*, pods, containers, **kwargs):
    with open(os.environ["RECORDER_OUT"], "a") as out:
        out.write(json.dumps({{p.name: [c.name for c in containers.get(p.sandbox_id, ())] for p in pods}}) + "\\n")
    return 1
"""


@pytest.mark.e2e
def test_serve_runs_the_reconciler_and_stops_it(bed: Containerd, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    site = tmp_path / "site"
    info = site / f"rh_rec_{tag}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rh_rec_{tag}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[runtimeproxy.hooks]\nrecorder = rh_rec_{tag}:plugin\n")
    (site / f"rh_rec_{tag}.py").write_text(SERVE_PLUGIN.format(tag=tag))
    short = Path(tempfile.mkdtemp(prefix="rhr-", dir="/tmp"))
    out = tmp_path / "rounds.jsonl"
    policy = tmp_path / "policy.yaml"
    policy.write_text("reconciler: {interval_seconds: 0.2}\n")
    pod = load_pod(PODS / "be-pod.yaml")
    pod.metadata.uid = str(uuid.uuid4())
    plan = build_plan(
        pod, log_dir_base=str(tmp_path / "logs"), machine_memory=8 * GI, cgroup_root="/" + bed.cgroup_prefix
    )
    env = {  # over this process's environment, less its RUNTIME_HOOKS_* (Daemon's drop_env)
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "RECORDER_OUT": str(out),
        "RUNTIME_HOOKS_ENDPOINT": str(short / "hooks.sock"),
        "RUNTIME_HOOKS_HOOK_CONFIG_DIR": str(short / "hookserver.d"),
        "RUNTIME_HOOKS_RESCTRL_ROOT": str(tmp_path / "no-resctrl"),
        "RUNTIME_HOOKS_POLICY": str(policy),
        "RUNTIME_HOOKS_RUNTIME_ENDPOINT": bed.address,
        "RUNTIME_HOOKS_ENABLE": f"recorder-{tag}",
        "RUNTIME_HOOKS_METRICS_ADDRESS": "127.0.0.1:0",
    }
    daemon = Daemon(short, "runtime-hooks", [*HOOKS_CLI, "serve"], env, split_output=True)
    try:
        with CriClient(bed.address, timeout=60.0) as client:
            play(plan, client)
        # Wait for the round's own line, not for the plugin's output: the plugin writes that
        # mid-round, and a SIGTERM then cancels the round (Reconciler.stop) before it logs.
        reconciled = daemon.wait_record(lambda r: r.get("event") == "reconciled" and r.get("pods") == 1, timeout=30)
        assert daemon.terminate() == 0, daemon.log()
        events = daemon.records()
    finally:
        daemon.kill()
        shutil.rmtree(short, ignore_errors=True)
    assert reconciled["containers"] == 1 and reconciled["repaired"] == {f"recorder-{tag}": 1}, reconciled
    assert {"be-pod": ["app"]} in [json.loads(line) for line in out.read_text().splitlines()]
    started = [e for e in events if e["event"] == "reconciler started"]
    assert started and started[0]["plugins"] == [f"recorder-{tag}"] and started[0]["interval_s"] == 0.2
