"""BE pods get memory limits from ``kubernetes.io/batch-memory``, end to end.

The proxy and ``runtime-hooks`` run as subprocesses in front of the real containerd test bed
(both series, cgroup v1 here): a BE pod whose annotation gives its container a 32 MiB
batch-memory limit gets it as the container's ``memory.limit_in_bytes`` (from the CRI answer at
PreCreateContainer: runc writes it) and as the pod cgroup's (the memory plugin at
PreRunPodSandbox); a container that then allocates 64 MiB of anonymous memory (busybox ``dd``
with a 64 MiB block: one buffer it fills) is OOM-killed by the kernel, and one that stays
within the limit keeps running. The reconciler puts back limits someone raised.

The hog waits for a file the test creates with ExecSync before it allocates, so that the limit
files are read while its cgroup exists (the cgroup goes with the task once it is killed).
This host has no swap, so the anonymous memory cannot go anywhere but the limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import closing

import pytest
from hooks_node import Node, policy_text
from pods import (
    BATCH_CPU,
    CALL_TIMEOUT,
    QOS_LABEL,
    SPEC_ANNOTATION,
    ContainerSpec,
    MiB,
    Pod,
    cgroup_dir,
    extended_resource_spec,
    read_int,
)

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

BATCH_MEMORY = "kubernetes.io/batch-memory"
LIMIT = 32 * MiB
BUSYBOX = "/bin/busybox"
GO_FILE = "/go"
# Waits for GO_FILE, then fills one 64 MiB buffer: twice the limit, all of it anonymous memory.
HOG = (
    BUSYBOX,
    "sh",
    "-c",
    f"until [ -e {GO_FILE} ]; do {BUSYBOX} sleep 0.1; done; exec {BUSYBOX} dd if=/dev/zero of=/dev/null bs=64M count=1",
)
# 8 MiB, a quarter of the limit, then stays.
WITHIN = (BUSYBOX, "sh", "-c", f"{BUSYBOX} dd if=/dev/zero of=/dev/null bs=8M count=1 && exec {BUSYBOX} sleep 3600")
V1_UNLIMITED = "-1"  # what one writes to a v1 memory limit file for "no limit"
WAIT = 30.0


@pytest.fixture
def node(containerd: Containerd) -> Iterator[Node]:
    with closing(Node(containerd)) as made:
        yield made


def run_be_pod(node: Node, cri: CriClient, name: str, command: tuple[str, ...]) -> Pod:
    """A BestEffort pod labelled BE, one container with a 32 MiB batch-memory limit; the CRI
    resources are kubelet's for BestEffort (no memory limit)."""
    spec = {"app": {"requests": {BATCH_CPU: "100", BATCH_MEMORY: "16Mi"}, "limits": {BATCH_MEMORY: "32Mi"}}}
    kubelet = pb.LinuxContainerResources(cpu_period=100_000, cpu_shares=2, oom_score_adj=1000)
    return node.run_pod(
        cri,
        name,
        qos_parent="besteffort",
        labels={QOS_LABEL: "BE"},
        annotations={SPEC_ANNOTATION: extended_resource_spec(spec)},
        containers=[ContainerSpec("app", kubelet, command)],
    )


def status(cri: CriClient, container_id: str) -> pb.ContainerStatus:
    request = pb.ContainerStatusRequest(container_id=container_id)
    return cri.runtime.ContainerStatus(request, timeout=CALL_TIMEOUT).status


def wait_for(what: str, check: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def test_a_be_container_past_its_batch_memory_limit_is_oom_killed(node: Node) -> None:
    node.start(policy_text(interval=0.5))
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        pod = run_be_pod(node, cri, "hog", HOG)
        app = pod.containers["app"]
        assert read_int("memory", "memory.limit_in_bytes", pod.parent, app) == LIMIT  # runc, from the CRI answer
        assert read_int("memory", "memory.limit_in_bytes", pod.parent) == LIMIT  # the plugin: the pod's sum
        assert status(cri, app).state == pb.CONTAINER_RUNNING

        exec_request = pb.ExecSyncRequest(container_id=app, cmd=[BUSYBOX, "touch", GO_FILE], timeout=10)
        assert cri.runtime.ExecSync(exec_request, timeout=CALL_TIMEOUT).exit_code == 0
        wait_for("the hog to exit", lambda: status(cri, app).state == pb.CONTAINER_EXITED)
        final = status(cri, app)
    assert (final.reason, final.exit_code) == ("OOMKilled", 137)
    assert read_int("memory", "memory.limit_in_bytes", pod.parent) == LIMIT  # the pod cgroup stays


def test_a_be_container_within_its_limit_runs_and_the_limits_are_kept(node: Node) -> None:
    node.start(policy_text(interval=0.5))
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        pod = run_be_pod(node, cri, "within", WITHIN)
        app = pod.containers["app"]
        peak = ("memory.max_usage_in_bytes", pod.parent, app)
        wait_for("the 8 MiB buffer", lambda: read_int("memory", *peak) >= 8 * MiB)
        assert status(cri, app).state == pb.CONTAINER_RUNNING
        assert read_int("memory", "memory.limit_in_bytes", pod.parent, app) == LIMIT
        assert read_int("memory", "memory.failcnt", pod.parent, app) == 0

        # Someone lifts both limits (memory + swap first on v1: memory may not exceed it).
        for file in ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes"):
            for container in (app, None):
                target = cgroup_dir("memory", pod.parent, container) / file
                if target.exists():
                    target.write_text(V1_UNLIMITED)
        assert read_int("memory", "memory.limit_in_bytes", pod.parent, app) > LIMIT
        wait_for(
            "the reconciler to put both limits back",
            lambda: (
                read_int("memory", "memory.limit_in_bytes", pod.parent, app) == LIMIT
                and read_int("memory", "memory.limit_in_bytes", pod.parent) == LIMIT
            ),
        )
        assert status(cri, app).state == pb.CONTAINER_RUNNING
