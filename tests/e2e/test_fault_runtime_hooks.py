"""runtime-hooks under faults, end to end: its graceful stop, the message size it accepts, and
cgroup parents that are no pod's.

``runtime-hooks serve`` and ``runtime-proxy serve`` run as subprocesses in front of the real
containerd test bed (tests/daemons.py). The hook server runs its built-in plugins and one more,
``e2e-strict`` (failure policy "fail", so the registration says Fail): it refuses any call for
a pod labelled ``e2e/refuse=true``, which ends RunPodSandbox in the proxy before containerd is
called, so what is then found on the node was done by runtime-hooks alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import grpc
import pytest
from daemons import HOOKS_CLI, Daemon, ProxyAndHooks, eventually

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.api.runtime.v1alpha1 import api_pb2_grpc as hook_grpc
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

CGROUP = Path("/sys/fs/cgroup")
REGISTRATION_LATENCY = 5.0  # the proxy rescans its hook config directory every 0.2 s
CALL_TIMEOUT = 60.0
MiB = 1 << 20
REFUSE_LABEL = "e2e/refuse"
SPEC_ANNOTATION = "node.koordinator.sh/extended-resource-spec"
# A BE pod whose batch-cpu limit the cpu plugin turns into a pod quota of 150000 µs.
BATCH_SPEC = json.dumps({"containers": {"app": {"limits": {"kubernetes.io/batch-cpu": "1500"}}}})
# What the plugins write on a cgroup v1 node (cgroups.FILES), in the root cgroup of each hierarchy.
ROOT_KNOBS = {
    "cpu": ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.shares", "cpu.cfs_burst_us", "cpu.idle"),
    "memory": ("memory.limit_in_bytes", "memory.soft_limit_in_bytes"),
    "cpuset": ("cpuset.cpus", "cpuset.mems"),
}

STRICT_PLUGIN = """\
from runtimeproxy.hooks.sdk import HookPoint, Plugin

plugin = Plugin("e2e-strict", version="0.1", order=90, failure_policy="fail", timeout=1.0)


@plugin.on(HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
def strict(*, pod, **kwargs):
    if pod.labels.get("e2e/refuse") == "true":
        raise RuntimeError("e2e-strict: refused by label")
"""


class Node(ProxyAndHooks):
    """The proxy and runtime-hooks (built-in plugins and e2e-strict) in one short directory."""

    def __init__(self, containerd: Containerd) -> None:
        super().__init__(containerd, "rtpxfr-")
        self.plugins = self.workdir / "plugins"
        dist = self.plugins / "rtpx_e2e_strict-0.1.dist-info"
        dist.mkdir(parents=True)
        (self.plugins / "rtpx_e2e_strict.py").write_text(STRICT_PLUGIN)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rtpx-e2e-strict\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text("[runtimeproxy.hooks]\ne2e-strict = rtpx_e2e_strict:plugin\n")

    def start(self, *hooks_options: str) -> tuple[Daemon, Daemon]:
        proxy = self.start_daemon("proxy", self.proxy_args())
        path = os.pathsep.join(filter(None, [str(self.plugins), os.environ.get("PYTHONPATH", "")]))
        args = self.hooks_args(
            HOOKS_CLI, self.workdir / "no-resctrl", "--runtime-endpoint", self.containerd.address, *hooks_options
        )
        hooks = self.start_daemon("hooks", args, {"PYTHONPATH": path})
        proxy.wait_record(
            lambda r: r.get("event") == "hook server added" and r.get("server") == "runtime-hooks.json",
            timeout=REGISTRATION_LATENCY,
        )
        return proxy, hooks

    def sandbox_config(self, parent: str, labels: dict[str, str] | None = None) -> pb.PodSandboxConfig:
        uid = str(uuid.uuid4())
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=f"fault-{uid[:8]}", uid=uid, namespace="e2e-fault"),
            log_directory=str(self.containerd.root_dir / "pod-logs" / uid),
            labels={"koordinator.sh/qosClass": "BE", **(labels or {})},
            annotations={SPEC_ANNOTATION: BATCH_SPEC},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=parent,
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
            ),
        )

    def run_pod(self, cri: CriClient, annotations: dict[str, str] | None = None) -> tuple[str, str]:
        """RunPodSandbox, CreateContainer and StartContainer of a BE pod under the test bed's kubepods."""
        parent = self.containerd.cgroup_parent(str(uuid.uuid4()), "besteffort")
        self.parents.append(parent)
        config = self.sandbox_config(parent)
        pod_id = cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT).pod_sandbox_id
        container = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="app"),
            image=pb.ImageSpec(image=self.containerd.test_image),
            log_path="app.log",
            annotations=annotations or {},
        )
        request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container, sandbox_config=config)
        container_id = cri.runtime.CreateContainer(request, timeout=CALL_TIMEOUT).container_id
        cri.runtime.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=CALL_TIMEOUT)
        return pod_id, container_id


@pytest.fixture
def node(containerd: Containerd) -> Iterator[Node]:
    with closing(Node(containerd)) as made:
        yield made


def lifecycle_calls(proxy: Daemon, method: str, count: int = 1) -> list[dict[str, Any]]:
    """The proxy's log records of ``method`` calls, once there are ``count`` (each is logged as it ends)."""

    def found() -> list[dict[str, Any]] | None:
        calls = [r for r in proxy.records() if r.get("event") == "lifecycle call" and r.get("method") == method]
        return calls if len(calls) >= count else None

    return eventually(found, 10, proxy.log)


def withheld(hooks: Daemon, parent: str) -> list[dict[str, Any]]:
    return [
        r
        for r in hooks.records()
        if r.get("event") == "withheld from the plugins" and repr(parent) in r.get("reason", "")
    ]


# -- (a) SIGTERM -------------------------------------------------------------------------------------


class UpdateLoop(threading.Thread):
    """UpdateContainerResources through the proxy, back to back, until stopped: every call is a
    PreUpdateContainerResources hook call while runtime-hooks is registered (with failure policy
    Fail), so one the proxy could not get answered would refuse the call."""

    def __init__(self, cri: CriClient, container_id: str) -> None:
        super().__init__(daemon=True)
        self.cri = cri
        self.container_id = container_id
        self.halt = threading.Event()
        self.calls = 0
        self.errors: list[str] = []

    def run(self) -> None:
        request = pb.UpdateContainerResourcesRequest(
            container_id=self.container_id, linux=pb.LinuxContainerResources(cpu_shares=2)
        )
        deadline = time.monotonic() + 60  # bounded whatever happens
        while not self.halt.is_set() and time.monotonic() < deadline:
            try:
                self.cri.runtime.UpdateContainerResources(request, timeout=CALL_TIMEOUT)
            except grpc.RpcError as exc:
                self.errors.append(f"{exc.code()}: {exc.details()}")
            self.calls += 1


def hook_request() -> Any:
    return hook_pb.ContainerResourceHookRequest(
        pod_meta=hook_pb.PodSandboxMetadata(name="direct", namespace="e2e-fault", uid="direct"),
        container_meta=hook_pb.ContainerMetadata(name="app"),
        pod_labels={"koordinator.sh/qosClass": "BE"},
    )


def test_sigterm_unregisters_first_answers_through_the_grace_and_the_proxy_lets_pods_through(node: Node) -> None:
    proxy, hooks = node.start("--deregister-grace", "3")
    registration = node.config_dir / "runtime-hooks.json"
    assert json.loads(registration.read_text())["failure-policy"] == "Fail"  # e2e-strict fails calls
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        _, container_id = node.run_pod(cri)
        [create] = lifecycle_calls(proxy, "CreateContainer")
        assert create["hooks"] == ["runtime-hooks.json:ok"], create
        loop = UpdateLoop(cri, container_id)
        loop.start()
        try:
            eventually(lambda: loop.calls >= 5, 30, proxy.log)
            hooks.proc.send_signal(signal.SIGTERM)
            # The registration goes first; the socket is still there and still answers.
            eventually(lambda: not registration.exists(), 3, hooks.log)
            assert hooks.alive and node.hooks_endpoint.exists()
            with grpc.insecure_channel(f"unix://{node.hooks_endpoint}") as channel:
                stub = hook_grpc.RuntimeHookServiceStub(channel)
                stub.PreUpdateContainerResourcesHook(hook_request(), timeout=5)
            assert hooks.alive, "runtime-hooks stopped serving within its grace"
            proxy.wait_record(
                lambda r: r.get("event") == "hook server removed" and r.get("server") == "runtime-hooks.json",
                timeout=REGISTRATION_LATENCY,
            )
            assert hooks.proc.wait(20) == 0, hooks.log()
            calls_at_exit = loop.calls
            eventually(lambda: loop.calls >= calls_at_exit + 5, 30, proxy.log)  # on, without the hook server
        finally:
            loop.halt.set()
            loop.join(70)
        assert loop.errors == [], loop.errors  # no call refused, before, during or after the stop
        # Pre- and PostUpdateContainerResources: each call had both answered, until the proxy
        # dropped the server; then none.
        updates = [r["hooks"] for r in lifecycle_calls(proxy, "UpdateContainerResources", loop.calls)]
        assert updates[0] and updates[-1] == [], updates
        assert all(set(outcomes) <= {"runtime-hooks.json:ok"} for outcomes in updates), updates

        # A pod started now goes through without it: the Fail registration went with the file.
        before = len(lifecycle_calls(proxy, "RunPodSandbox"))
        node.run_pod(cri)
        started = lifecycle_calls(proxy, "RunPodSandbox", before + 1)[before:]
        assert [(r["code"], r["hooks"]) for r in started] == [("OK", [])], started
    events = [r.get("event") for r in hooks.records()]
    assert events.index("unregistered; serving on until the proxy has noticed") < events.index(
        "stopped serving runtime hooks"
    )
    assert not node.hooks_endpoint.exists()


# -- (b) message size --------------------------------------------------------------------------------


def test_a_create_container_of_8_mib_reaches_runtime_hooks(node: Node) -> None:
    proxy, hooks = node.start()
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        node.run_pod(cri, annotations={"e2e/big": "x" * (8 * MiB)})
    [create] = lifecycle_calls(proxy, "CreateContainer")
    assert (create["code"], create["hooks"]) == ("OK", ["runtime-hooks.json:ok"]), create
    assert not [r for r in hooks.records() if r.get("level") in ("warning", "error")], hooks.log()


# -- (c) cgroup parents that are no pod's -------------------------------------------------------------


def knobs() -> dict[str, str]:
    """The root cgroup's files the plugins write, per hierarchy (those this kernel has)."""
    found = {}
    for hierarchy, names in ROOT_KNOBS.items():
        for name in names:
            path = CGROUP / hierarchy / name
            if path.is_file():
                found[f"{hierarchy}/{name}"] = path.read_text()
    return found


def hierarchies_with(name: str) -> list[Path]:
    return [directory / name for directory in CGROUP.iterdir() if (directory / name).exists()]


def remove_system_slice() -> None:
    """Leave the host as it was (the tests start only where it has no /system.slice): this only
    removes something when a test has failed."""
    for directory in hierarchies_with("system.slice"):
        with contextlib.suppress(OSError):
            directory.rmdir()


@pytest.mark.parametrize("parent", ["/system.slice", "/"])
def test_a_pod_whose_cgroup_is_no_pods_gets_no_cgroup_written(node: Node, parent: str) -> None:
    """The proxy refuses the pod at e2e-strict (after the built-in plugins ran), so containerd
    and runc never see it: whatever changed on the node would be runtime-hooks' doing."""
    assert hierarchies_with("system.slice") == [], "this host already has a /system.slice cgroup"
    proxy, hooks = node.start()
    before = knobs()
    config = node.sandbox_config(parent, labels={REFUSE_LABEL: "true"})
    try:
        with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri, pytest.raises(grpc.RpcError) as refused:
            cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT)
        assert "e2e-strict: refused by label" in (refused.value.details() or "")
        [run] = lifecycle_calls(proxy, "RunPodSandbox")  # refused by the hook server: containerd was never called
        assert run["code"] == "FAILED_PRECONDITION" and run["hooks"] == [
            "runtime-hooks.json:failed (INTERNAL: plugin e2e-strict failed at PreRunPodSandbox: "
            "RuntimeError: e2e-strict: refused by label)"
        ], run
        assert hierarchies_with("system.slice") == []  # no directory made
        assert knobs() == before  # no root file written
        [line] = withheld(hooks, parent)
        assert line["hook"] == "PreRunPodSandbox" and "no cgroup of this pod is written" in line["reason"]
    finally:
        remove_system_slice()


@pytest.mark.parametrize("parent", ["/system.slice", "/"])
def test_a_running_pod_whose_cgroup_is_no_pods_gets_no_cgroup_written(node: Node, parent: str) -> None:
    """The same pods, not refused: they run, and runtime-hooks still writes and creates nothing for
    them. (containerd takes a parent ending in .slice for a systemd slice even with the cgroupfs
    driver: runc then makes ``/system.slice:cri-containerd:<id>`` in the root, never
    ``/system.slice``; only the cpu plugin's pod cgroup creation would make that.)"""
    assert hierarchies_with("system.slice") == [], "this host already has a /system.slice cgroup"
    proxy, hooks = node.start()
    before = knobs()
    config = node.sandbox_config(parent)
    try:
        with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
            reply = cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT)
            assert reply.pod_sandbox_id
        [run] = lifecycle_calls(proxy, "RunPodSandbox")
        assert (run["code"], run["hooks"]) == ("OK", ["runtime-hooks.json:ok"]), run
        assert hierarchies_with("system.slice") == []
        assert knobs() == before
        [line] = withheld(hooks, parent)
        assert line["hook"] == "PreRunPodSandbox"
    finally:
        node.containerd.remove_all_pods()
        remove_system_slice()
