"""The gpu plugin's NVIDIA_VISIBLE_DEVICES and the cpuset plugin's reconciler, end to end.

``runtime-hooks serve`` behind ``runtime-proxy serve`` in front of the real containerd test bed
(tests/hooks_node.py). No GPU is needed: the variable is read back from the running containers
(ExecSync) and from containerd's verbose ContainerStatus; the cpusets from the real cgroup v1
cpuset files of the containers and the sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing

import pytest
from daemons import eventually
from hooks_node import Node, policy_text
from pods import CALL_TIMEOUT, QOS_LABEL, ContainerSpec, Pod, cgroup_dir, read
from runtimeproxy.hooks.plugins.gpu import DEVICE_ALLOCATED_ANNOTATION
from runtimeproxy.hooks.podview import RESOURCE_STATUS_ANNOTATION

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

GPU_POLICY = "gpu:\n  LS: {enabled: true}\n"
ALLOCATED = json.dumps({"gpu": [{"minor": 1, "resources": {"koordinator.sh/gpu-core": "100"}}, {"minor": 0}]})
PINNED_CPU = "1"  # the VM has CPUs 0-1


@pytest.fixture
def node(containerd: Containerd) -> Iterator[Node]:
    with closing(Node(containerd)) as made:
        yield made


def run_pod(node: Node, cri: CriClient, name: str, qos: str, annotations: dict[str, str]) -> Pod:
    kubelet = pb.LinuxContainerResources(cpu_period=100_000, cpu_quota=100_000, cpu_shares=1024)
    return node.run_pod(
        cri,
        name,
        qos_parent="guaranteed",
        labels={QOS_LABEL: qos},
        annotations=annotations,
        containers=[ContainerSpec("app", kubelet), ContainerSpec("side", kubelet)],
    )


def visible_devices(cri: CriClient, container_id: str) -> tuple[str, list[str]]:
    """The variable as the container's shell sees it, and as containerd stored the config's envs."""
    shell = "echo ${NVIDIA_VISIBLE_DEVICES-unset}"
    reply = cri.runtime.ExecSync(
        pb.ExecSyncRequest(container_id=container_id, cmd=["sh", "-c", shell]), timeout=CALL_TIMEOUT
    )
    status = cri.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=container_id, verbose=True))
    envs = json.loads(status.info["info"])["config"].get("envs", [])
    stored = [env["value"] for env in envs if env["key"] == "NVIDIA_VISIBLE_DEVICES"]
    return reply.stdout.decode().strip(), stored


def test_every_container_of_a_pod_sees_its_allocated_gpus(node: Node) -> None:
    node.start(policy_text(interval=600) + GPU_POLICY)
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        allocated = run_pod(node, cri, "gpu", "LS", {DEVICE_ALLOCATED_ANNOTATION: ALLOCATED})
        malformed = run_pod(node, cri, "bad", "LS", {DEVICE_ALLOCATED_ANNOTATION: '{"gpu": [{"minor": "1"}]}'})
        switched_off = run_pod(node, cri, "be", "BE", {DEVICE_ALLOCATED_ANNOTATION: ALLOCATED})
        for name in ("app", "side"):
            assert visible_devices(cri, allocated.containers[name]) == ("1,0", ["1,0"]), name
            # A malformed allocation: nothing set, the containers run all the same.
            assert visible_devices(cri, malformed.containers[name]) == ("unset", []), name
            assert visible_devices(cri, switched_off.containers[name]) == ("unset", []), name  # gpu.BE off
    assert node.hooks is not None
    warnings = [r for r in node.hooks.records() if r.get("plugin") == "gpu" and r.get("level") == "warning"]
    assert len(warnings) == 2, warnings  # one per container of the malformed pod
    assert all("gpu[0].minor must be an integer, got a string" in r["error"] for r in warnings), warnings


def test_the_reconciler_pins_the_sandbox_and_sets_back_a_drifted_container_cpuset(node: Node) -> None:
    interval = 0.5
    node.start(policy_text(interval=interval))
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        pod = run_pod(node, cri, "lsr", "LSR", {RESOURCE_STATUS_ANNOTATION: json.dumps({"cpuset": PINNED_CPU})})
    cgroups = (pod.sandbox_id, *pod.containers.values())
    # The containers were pinned at creation; the sandbox only by the reconciler.
    for container_id in pod.containers.values():
        assert read("cpuset", "cpuset.cpus", pod.parent, container_id) == PINNED_CPU
    eventually(
        lambda: all(read("cpuset", "cpuset.cpus", pod.parent, cid) == PINNED_CPU for cid in cgroups),
        2 * interval + 1.0,
        node.hooks_log,
    )
    before = node.hooks_metric("runtimehooks_reconcile_drift_total", plugin="cpuset")
    drifted = pod.containers["side"]
    assert read("cpuset", "cpuset.cpus", pod.parent) == "0-1"  # the pod cgroup keeps the node's CPUs
    (cgroup_dir("cpuset", pod.parent, drifted) / "cpuset.cpus").write_text("0-1")
    assert read("cpuset", "cpuset.cpus", pod.parent, drifted) == "0-1"
    eventually(
        lambda: read("cpuset", "cpuset.cpus", pod.parent, drifted) == PINNED_CPU, 2 * interval + 1.0, node.hooks_log
    )
    eventually(
        lambda: node.hooks_metric("runtimehooks_reconcile_drift_total", plugin="cpuset") > before, 2.0, node.hooks_log
    )
