"""Client process for runtime_hooks_bench.py: drives the runtime-hooks server, and starts pods.

It reads one JSON job a line on stdin and answers each with one JSON line on stdout, until
stdin closes (the protocol of relay_client.py, so relay_bench.Client drives it). Jobs:

* {"op": "hooks", "socket", "rpc", "requests": [base64 ...], "concurrency", "calls",
  "warmup", "watch": {name: pid}}: one grpc.aio channel to the hook server's socket;
  the first two requests are sent once and their responses decoded (an LS and a BE pod:
  what the plugins answered), then `warmup` untimed and `calls` timed calls of
  RuntimeHookService/<rpc> from `concurrency` callers sharing the channel, the requests
  taken in turn from the list. Requests and responses are raw bytes on the timed path.
  Answers every latency, the wall time, and the CPU time of this process, of the watched
  processes and of the machine during the timed calls (as relay_client does).
* {"op": "pods", ...}: hooks_client.py's pod job (start, then stop and remove, each pod
  through its own socket, timed), with this module's pod shapes: each pod spec also
  carries "kind", "LS" or "BE" (see sandbox_config and container_config).

The pod shapes are also what runtime_hooks_bench.py turns into hook requests, through the
proxy's own request builders, so both parts of the bench see the same pods.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import time
from typing import Any

import grpc
import grpc.aio
import hooks_client  # bench/ is on sys.path when run as a script
from hooks_client import HOOK_SERVICE, Cri
from relay_client import by_op, machine_cpu_seconds, process_cpu_seconds, run_calls, serve_jobs

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook

MAX_MESSAGE = 16 * 1024 * 1024
HOOK_TIMEOUT = 30.0

# Koordinator's names (hooks/qos.py, hooks/plugins/cpu.py, hooks/plugins/memory.py).
QOS_LABEL = "koordinator.sh/qosClass"
EXTENDED_RESOURCE_SPEC = "node.koordinator.sh/extended-resource-spec"
CONTAINER = "app"
GIB = 1 << 30
MIB = 1 << 20

# The two pod shapes, with what kubelet sends for them (cgroup parent QoS segment, pod-level
# resources as kubelet computes them for RunPodSandbox, container resources and oom_score_adj).
#  LS: a Burstable pod labelled LS, 500m request / 2 CPU limit, 512 MiB / 1 GiB memory.
#  BE: a BestEffort pod labelled BE whose requests and limits are Koordinator batch resources
#      (kubelet knows nothing of them: the container gets 2 shares and no limits); its webhook
#      records them in the extended-resource-spec annotation, which the plugins read.
KUBE_QOS = {"LS": "burstable", "BE": "besteffort"}
BATCH_SPEC = json.dumps({"containers": {CONTAINER: {
    "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "512Mi"},
    "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "1Gi"},
}}}, separators=(",", ":"))
RESOURCES = {
    "LS": {"cpu_period": 100_000, "cpu_quota": 200_000, "cpu_shares": 512, "memory_limit_in_bytes": GIB},
    "BE": {"cpu_period": 100_000, "cpu_shares": 2},
}
OOM_SCORE_ADJ = {"LS": 968, "BE": 1000}  # kubelet: Burstable 1000 - 1000 * request / node memory; BestEffort 1000


def sandbox_config(pod: dict[str, str]) -> Any:
    """The PodSandboxConfig kubelet would send for a pod spec ({uid, name, kind, cgroup_parent,
    log_directory}): host network (no CNI on the test bed)."""
    kind = pod["kind"]
    annotations = {"kubernetes.io/config.source": "api", "kubernetes.io/config.seen": "2025-01-01T00:00:00Z"}
    if kind == "BE":
        annotations[EXTENDED_RESOURCE_SPEC] = BATCH_SPEC
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=pod["name"], uid=pod["uid"], namespace="runtime-hooks-bench"),
        hostname="",  # runc may not set a hostname without a private UTS namespace
        log_directory=pod["log_directory"],
        labels={QOS_LABEL: kind, "app": "runtime-hooks-bench", "io.kubernetes.pod.name": pod["name"],
                "io.kubernetes.pod.namespace": "runtime-hooks-bench", "io.kubernetes.pod.uid": pod["uid"]},
        annotations=annotations,
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=pod["cgroup_parent"],
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
            resources=pb.LinuxContainerResources(**RESOURCES[kind]),
        ),
    )


def container_config(pod: dict[str, str], image: str) -> Any:
    """The pod's one container as kubelet would create it (the image's command is a long sleep)."""
    kind = pod["kind"]
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=CONTAINER),
        image=pb.ImageSpec(image=image),
        log_path=f"{CONTAINER}/0.log",
        envs=[pb.KeyValue(key=key, value=value) for key, value in (
            ("KUBERNETES_SERVICE_HOST", b"10.96.0.1"), ("KUBERNETES_SERVICE_PORT", b"443"),
            ("KUBERNETES_PORT", b"tcp://10.96.0.1:443"), ("BENCH_KIND", kind.encode()))],
        labels={"io.kubernetes.container.name": CONTAINER, "io.kubernetes.pod.name": pod["name"],
                "io.kubernetes.pod.namespace": "runtime-hooks-bench", "io.kubernetes.pod.uid": pod["uid"]},
        annotations={"io.kubernetes.container.hash": "6c3f0f5b", "io.kubernetes.container.restartCount": "0",
                     "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                     "io.kubernetes.container.terminationMessagePolicy": "File"},
        linux=pb.LinuxContainerConfig(
            resources=pb.LinuxContainerResources(**RESOURCES[kind], oom_score_adj=OOM_SCORE_ADJ[kind])),
    )


async def start_pod(cri: Cri, pod: dict[str, str], image: str) -> tuple[str, str, list[float]]:
    """RunPodSandbox, CreateContainer, StartContainer of this module's pod shapes: (pod id,
    container id, step seconds). Takes the place of hooks_client.start_pod (same contract)."""
    config = sandbox_config(pod)
    container = container_config(pod, image)
    make_pod_cgroup(config.linux.cgroup_parent)  # as kubelet does before RunPodSandbox, untimed
    return await hooks_client.run_timed(cri, config, container)


def make_pod_cgroup(parent: str, root: str = "/sys/fs/cgroup") -> None:
    """Create the pod cgroup in every cgroup v1 hierarchy, as kubelet's pod container
    manager does before it calls RunPodSandbox; there is no kubelet on the test bed, and
    without this the cpu plugin would create it inside the timed call instead."""
    for entry in os.scandir(root):
        if entry.is_dir(follow_symlinks=False) and os.path.exists(os.path.join(entry.path, "cgroup.procs")):
            os.makedirs(os.path.join(entry.path, parent.lstrip("/")), exist_ok=True)


# hooks_client.run_pods (start each pod, then stop and remove them, CPU around each) looks
# start_pod up in its module when it runs: with this, it starts LS and BE pods.
hooks_client.start_pod = start_pod


# -- hook calls ---------------------------------------------------------------------------


def describe_response(rpc: str, data: bytes) -> str:
    """What a hook response sets, e.g. 'cpu_quota=100000 cpu_shares=512' ('no changes' if nothing)."""
    container = not rpc.startswith(("PreRunPodSandbox", "PostStopPodSandbox", "PreRemovePodSandbox",
                                    "PostRemovePodSandbox", "PreUpdatePodSandboxResources"))
    response = (hook.ContainerResourceHookResponse if container else hook.PodSandboxHookResponse).FromString(data)
    resources = response.container_resources if container else response.resources
    fields = [f"{field.name}={value}" for field, value in resources.ListFields()]
    for field, value in response.ListFields():
        if field.name not in ("container_resources", "resources"):
            fields.append(f"{field.name}={dict(value) if hasattr(value, 'items') else value}")
    return " ".join(fields) or "no changes"


async def run_hooks(job: dict[str, Any]) -> dict[str, Any]:
    requests = [base64.b64decode(text) for text in job["requests"]]
    watch: dict[str, int] = job.get("watch", {})
    options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
    async with grpc.aio.insecure_channel(f"unix://{job['socket']}", options=options) as channel:
        call = channel.unary_unary(HOOK_SERVICE + job["rpc"], request_serializer=None, response_deserializer=None)
        checked = [describe_response(job["rpc"], await call(request, timeout=HOOK_TIMEOUT)) for request in requests[:2]]
        turn = itertools.cycle(requests)

        async def rotating(_request: bytes, timeout: float) -> bytes:  # run_calls' call, the next request each time
            response: bytes = await call(next(turn), timeout=timeout)
            return response

        await run_calls(rotating, b"", job["concurrency"], job["warmup"])
        watched_before = {name: process_cpu_seconds(pid) for name, pid in watch.items()}
        machine_before = machine_cpu_seconds()
        cpu_before = time.process_time()
        latencies, wall = await run_calls(rotating, b"", job["concurrency"], job["calls"])
        client_cpu = time.process_time() - cpu_before
        machine_after = machine_cpu_seconds()
        watched_after = {name: process_cpu_seconds(pid) for name, pid in watch.items()}
    return {
        "latencies": latencies,
        "wall": wall,
        "client_cpu": client_cpu,
        "watched_cpu": {name: [a - b for a, b in zip(watched_after[name], watched_before[name], strict=True)]
                        for name in watch},
        "machine_busy_cpu": machine_after[0] - machine_before[0],
        "machine_total_cpu": machine_after[1] - machine_before[1],
        "checked": checked,
    }


if __name__ == "__main__":
    asyncio.run(serve_jobs(by_op({"hooks": run_hooks, "pods": hooks_client.run_pods})))
