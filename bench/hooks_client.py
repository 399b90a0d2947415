"""Client process for hooks_bench.py: starts and removes pods, and probes a hook server.

It reads one JSON job a line on stdin and answers each with one JSON line on stdout,
until stdin closes (the protocol of relay_client.py, so relay_bench.Client drives it).
Jobs:

* {"op": "pods", "image", "pods": [{"socket", "uid", "name", "cgroup_parent",
  "log_directory"}], "watch": {name: pid}}: for each pod in turn, through that pod's
  socket (containerd's or a proxy's), RunPodSandbox + CreateContainer + StartContainer
  (host network), each step timed; then, in the same order and through the same sockets,
  StopContainer + RemoveContainer + StopPodSandbox + RemovePodSandbox, timed as one
  sequence. Answers, per pod, the step times, the sequence time, and the CPU time the
  watched processes used during its start and during its teardown.
* {"op": "probe", "socket", "calls", "warmup", "gap"}: PreCreateContainerHook on a hook
  server, `calls` timed calls one after another (with `gap` seconds of idle between
  them, if given) after `warmup` untimed ones, serialised and decoded as the proxy's
  dispatcher does; answers each call's latency.
* {"op": "spaced", "sockets": {name: path}, "calls", "gap"}: CRI Version through each socket in
  turn, `gap` seconds of idle before each call; answers each call's latency by name.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any

import grpc
import grpc.aio
from hooks_server import PROBE_KEY  # bench/ is on sys.path when run as a script
from relay_client import by_op, process_cpu_seconds, serve_jobs

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook

CRI = "/runtime.v1.RuntimeService/"
HOOK_SERVICE = "/runtime.v1alpha1.RuntimeHookService/"
CRI_TIMEOUT = 120.0  # kubelet's default runtime request timeout: it always sets a deadline
MAX_MESSAGE = 16 * 1024 * 1024


class Cri:
    """The RuntimeService calls the bench makes, with decoded messages."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    async def __call__(self, method: str, request: Any, response_type: Any) -> Any:
        call = self.channel.unary_unary(CRI + method, request_serializer=_serialize,
                                        response_deserializer=response_type.FromString)
        return await call(request, timeout=CRI_TIMEOUT)


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


def sandbox_config(pod: dict[str, str]) -> Any:
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=pod["name"], uid=pod["uid"], namespace="hooks-bench"),
        hostname="",  # runc may not set a hostname without a private UTS namespace
        log_directory=pod["log_directory"],
        labels={"app": "hooks-bench", "io.kubernetes.pod.name": pod["name"]},
        annotations={"kubernetes.io/config.source": "api"},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=pod["cgroup_parent"],
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
        ),
    )


async def start_pod(cri: Cri, pod: dict[str, str], image: str) -> tuple[str, str, list[float]]:
    """RunPodSandbox, CreateContainer, StartContainer: (pod id, container id, step seconds)."""
    config = sandbox_config(pod)
    container = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="sleeper"),
        image=pb.ImageSpec(image=image),  # its default command is a long sleep
        log_path="sleeper.log",
        envs=[pb.KeyValue(key="BENCH", value=b"hooks")],
        annotations={"io.kubernetes.container.name": "sleeper"},
    )
    return await run_timed(cri, config, container)


async def run_timed(cri: Cri, config: Any, container: Any) -> tuple[str, str, list[float]]:
    """The pod `config` with one `container` started, each step timed: (pod id, container id,
    seconds of RunPodSandbox, CreateContainer, StartContainer)."""
    clock = time.perf_counter
    t0 = clock()
    pod_id = (await cri("RunPodSandbox", pb.RunPodSandboxRequest(config=config),
                        pb.RunPodSandboxResponse)).pod_sandbox_id
    t1 = clock()
    request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container, sandbox_config=config)
    container_id = (await cri("CreateContainer", request, pb.CreateContainerResponse)).container_id
    t2 = clock()
    await cri("StartContainer", pb.StartContainerRequest(container_id=container_id), pb.StartContainerResponse)
    t3 = clock()
    return pod_id, container_id, [t1 - t0, t2 - t1, t3 - t2]


async def remove_pod(cri: Cri, pod_id: str, container_id: str) -> float:
    """StopContainer (SIGKILL at once), RemoveContainer, StopPodSandbox, RemovePodSandbox, as
    kubelet orders them; returns the seconds of the sequence."""
    began = time.perf_counter()
    await cri("StopContainer", pb.StopContainerRequest(container_id=container_id, timeout=0),
              pb.StopContainerResponse)
    await cri("RemoveContainer", pb.RemoveContainerRequest(container_id=container_id), pb.RemoveContainerResponse)
    await cri("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), pb.StopPodSandboxResponse)
    await cri("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), pb.RemovePodSandboxResponse)
    return time.perf_counter() - began


def cpu_snapshot(watch: dict[str, int]) -> dict[str, float]:
    return {name: sum(process_cpu_seconds(pid)) for name, pid in watch.items()}


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in before}


def sched_snapshot(watch: dict[str, int]) -> dict[str, list[int]]:
    """Per watched process, summed over its threads: [ns on a CPU, ns runnable but waiting for
    one] (/proc/PID/task/TID/schedstat, whose third field is the number of time slices)."""
    found: dict[str, list[int]] = {}
    for name, pid in watch.items():
        run = wait = 0
        for task in os.scandir(f"/proc/{pid}/task"):
            try:
                with open(os.path.join(task.path, "schedstat")) as stat:
                    fields = stat.read().split()
            except OSError:  # the thread ended meanwhile
                continue
            run, wait = run + int(fields[0]), wait + int(fields[1])
        found[name] = [run, wait]
    return found


async def run_pods(job: dict[str, Any]) -> dict[str, Any]:
    """Start every pod of the job in its order, each through its own socket, then stop and
    remove them in the same order through the same sockets. With ``settle`` (seconds), each
    start waits that long first, so what the previous pod left running (its post-hooks, the
    runtime's own after-work) is done before the next is timed."""
    watch: dict[str, int] = job.get("watch", {})
    settle: float = job.get("settle", 0.0)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
    channels = {path: grpc.aio.insecure_channel(f"unix://{path}", options=options)
                for path in {pod["socket"] for pod in job["pods"]}}
    clients = {path: Cri(channel) for path, channel in channels.items()}
    started: list[tuple[Cri, str, str]] = []
    steps: list[list[float]] = []
    cpu_start: list[dict[str, float]] = []
    teardown: list[float] = []
    cpu_teardown: list[dict[str, float]] = []
    ended: list[float] = []  # time.monotonic() when each start ended (perf_counter's clock on Linux)
    sched: list[dict[str, list[int]]] = []  # sched_snapshot deltas around each start
    gc.disable()  # this client's own collections (1-2 ms each) must not land inside a timed start
    try:
        for cri in clients.values():
            await cri("Version", pb.VersionRequest(version="v1"), pb.VersionResponse)  # connect first
        gc.freeze()  # what lives on (channels, modules) is not walked again at each collection below
        for pod in job["pods"]:
            cri = clients[pod["socket"]]
            gc.collect()  # between starts, before the idle gap: the client's garbage of the last pod
            if settle:
                await asyncio.sleep(settle)
            before, sched_before = cpu_snapshot(watch), sched_snapshot(watch)
            pod_id, container_id, times = await start_pod(cri, pod, job["image"])
            ended.append(time.monotonic())
            sched_after = sched_snapshot(watch)
            sched.append({n: [a - b for a, b in zip(sched_after[n], sched_before[n], strict=True)] for n in watch})
            cpu_start.append(cpu_used(before, cpu_snapshot(watch)))
            started.append((cri, pod_id, container_id))
            steps.append(times)
        while started:
            before = cpu_snapshot(watch)
            teardown.append(await remove_pod(*started[0]))
            cpu_teardown.append(cpu_used(before, cpu_snapshot(watch)))
            started.pop(0)
    finally:
        for cri, pod_id, _ in started:  # after an error: leave nothing running (untimed)
            try:
                await cri("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), pb.StopPodSandboxResponse)
                await cri("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id),
                          pb.RemovePodSandboxResponse)
            except grpc.RpcError:
                pass  # the test bed's own clean-up removes whatever is left
        for channel in channels.values():
            await channel.close(None)
        gc.unfreeze()
        gc.enable()
    return {"steps": steps, "teardown": teardown, "cpu_start": cpu_start, "cpu_teardown": cpu_teardown,
            "ended": ended, "sched_start": sched}


def probe_request() -> Any:
    """A PreCreateContainerHook request shaped like the proxy's for the bench's pods."""
    return hook.ContainerResourceHookRequest(
        pod_meta=hook.PodSandboxMetadata(name="hooks-bench-probe", uid="0" * 32, namespace="hooks-bench"),
        container_meta=hook.ContainerMetadata(name="sleeper"),
        container_annotations={"io.kubernetes.container.name": "sleeper"},
        pod_annotations={"kubernetes.io/config.source": "api"},
        pod_labels={"app": "hooks-bench", "io.kubernetes.pod.name": "hooks-bench-probe"},
        pod_cgroup_parent="/kubepods/besteffort/pod" + "0" * 32,
        container_envs={"BENCH": "hooks"},
        container_env_list=[hook.KeyValue(key="BENCH", value=b"hooks")],
        pod_sandbox_id="f" * 64,
    )


async def run_probe(job: dict[str, Any]) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(f"unix://{job['socket']}") as channel:
        call = channel.unary_unary(HOOK_SERVICE + "PreCreateContainerHook", request_serializer=_serialize,
                                   response_deserializer=hook.ContainerResourceHookResponse.FromString)
        request = probe_request()
        metadata = ((PROBE_KEY, "1"),)
        clock = time.perf_counter
        latencies = []
        for n in range(job["warmup"] + job["calls"]):
            began = clock()
            await call(request, timeout=2.0, metadata=metadata)  # 2 s: the proxy's default hook timeout
            if n >= job["warmup"]:
                latencies.append(clock() - began)
                if job.get("gap"):
                    await asyncio.sleep(job["gap"])
    return {"latencies": latencies}


async def run_spaced(job: dict[str, Any]) -> dict[str, Any]:
    """CRI Version through each named socket in turn, `gap` seconds of idle before each call (as
    between a pod start's calls), after one untimed call each; each call's latency by name."""
    options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
    channels = {name: grpc.aio.insecure_channel(f"unix://{path}", options=options)
                for name, path in job["sockets"].items()}
    latencies: dict[str, list[float]] = {name: [] for name in channels}
    request, clock = pb.VersionRequest(version="v1"), time.perf_counter
    try:
        clients = {name: Cri(channel) for name, channel in channels.items()}
        for cri in clients.values():
            await cri("Version", request, pb.VersionResponse)
        for _ in range(job["calls"]):
            for name, cri in clients.items():
                await asyncio.sleep(job["gap"])
                began = clock()
                await cri("Version", request, pb.VersionResponse)
                latencies[name].append(clock() - began)
    finally:
        for channel in channels.values():
            await channel.close(None)
    return {"latencies": latencies}


if __name__ == "__main__":
    asyncio.run(serve_jobs(by_op({"pods": run_pods, "probe": run_probe, "spaced": run_spaced})))
