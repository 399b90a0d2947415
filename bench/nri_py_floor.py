"""A bare Python NRI plugin on runtime-hooks' NRI transport: the floor of a Python plugin host.

    python bench/nri_py_floor.py --socket /var/run/nri/nri.sock [--index 50] [--cgroup-root /sys/fs/cgroup]

It makes the Go peer's BestEffort adjustments (bench/nri_go_peer/main.go: the pod cgroup's CPU
quota and shares at RunPodSandbox, the container's shares, quota and period at CreateContainer,
oom_score_adj 1000 at PostStartContainer) in a few plain functions, on the connection, framing
and event loop runtime-hooks uses (hooks/nri/runtime_link.py, mux.py, ttrpc.py, rpc.py, uvloop),
with no plugin runner, no views, no logging and no metrics. nri_peer_bench.py runs it beside the
Go peer and runtime-hooks: what it costs over the Go peer is the price of Python and of the
transport; what runtime-hooks costs over it is the plugin host's. Not a product: no checks
beyond what the measurement needs (cgroup v1 only, no Synchronize work, no reconnect).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Sequence
from typing import Any

import uvloop
from runtimeproxy.hooks.kernel_files import read_bytes, write_bytes
from runtimeproxy.hooks.nri.runtime_link import connect

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
NAME = "py-floor"
QOS_LABEL = "koordinator.sh/qosClass"
SPEC_ANNOTATION = "node.koordinator.sh/extended-resource-spec"
BATCH_CPU = "kubernetes.io/batch-cpu"
PERIOD = 100_000
BE_OOM_SCORE = 1000
EVENTS = (nri_pb.RUN_POD_SANDBOX, nri_pb.CREATE_CONTAINER, nri_pb.POST_START_CONTAINER)


def milli(values: dict[str, str]) -> int:
    """The batch-cpu milli-cores of a requests or limits map; 0 when absent or unreadable."""
    try:
        return int(values.get(BATCH_CPU, "0"))
    except ValueError:
        return 0


def shares(milli_cpu: int) -> int:
    """cpu.shares for ``milli_cpu``, clamped as the kernel does (2..262144)."""
    return max(2, min(262144, milli_cpu * 1024 // 1000))


def be_spec(pod: Any) -> dict[str, Any] | None:
    """The extended-resource spec of a BE pod; None for any other pod or an unreadable spec."""
    if pod.labels.get(QOS_LABEL) != "BE" or SPEC_ANNOTATION not in pod.annotations:
        return None
    try:
        spec = json.loads(pod.annotations[SPEC_ANNOTATION])
    except ValueError:
        return None
    return spec if isinstance(spec, dict) else None


def write_file(path: str, value: int) -> None:
    write_bytes(path, str(value).encode())  # one open, one write(2), as runtime-hooks writes


class FloorPlugin:
    """The three events' work, on cgroup v1 under ``cgroup_root``."""

    def __init__(self, cgroup_root: str) -> None:
        self.cpu_root = os.path.join(cgroup_root, "cpu")

    def run_pod(self, pod: Any) -> None:
        spec = be_spec(pod)
        if spec is None:
            return
        containers = spec.get("containers", {}).values()
        requests = sum(milli(c.get("requests", {})) for c in containers)
        limits = sum(milli(c.get("limits", {})) for c in containers)
        directory = os.path.join(self.cpu_root, os.path.normpath("/" + pod.linux.cgroup_parent).lstrip("/"))
        if limits > 0:
            write_file(os.path.join(directory, "cpu.cfs_quota_us"), limits * PERIOD // 1000)
        if requests > 0:
            write_file(os.path.join(directory, "cpu.shares"), shares(requests))

    def create_container(self, pod: Any, container: Any) -> Any:
        answer = nri_pb.CreateContainerResponse()
        spec = be_spec(pod)
        entry = spec.get("containers", {}).get(container.name) if spec is not None else None
        if entry is None:
            return answer
        cpu = answer.adjust.linux.resources.cpu
        if (requests := milli(entry.get("requests", {}))) > 0:
            cpu.shares.value = shares(requests)
        if (limits := milli(entry.get("limits", {}))) > 0:
            cpu.quota.value = limits * PERIOD // 1000
            cpu.period.value = PERIOD
        return answer

    @staticmethod
    def post_start(pod: Any, container: Any) -> None:
        if pod.labels.get(QOS_LABEL) != "BE" or not container.pid:
            return
        path = f"/proc/{container.pid}/oom_score_adj"
        try:
            if int(read_bytes(path, one_record=True)) >= BE_OOM_SCORE:
                return
            write_file(path, BE_OOM_SCORE)
        except (OSError, ValueError):
            return  # the container is gone already

    # -- the ttrpc methods --

    async def configure(self, payload: bytes, timeout: float | None) -> bytes:
        mask = sum(1 << (event - 1) for event in EVENTS)
        return bytes(nri_pb.ConfigureResponse(events=mask).SerializeToString())

    async def synchronize(self, payload: bytes, timeout: float | None) -> bytes:
        return bytes(nri_pb.SynchronizeResponse().SerializeToString())

    async def state_change(self, payload: bytes, timeout: float | None) -> bytes:
        event = nri_pb.StateChangeEvent.FromString(payload)
        if event.event == nri_pb.RUN_POD_SANDBOX:
            self.run_pod(event.pod)
        elif event.event == nri_pb.POST_START_CONTAINER:
            self.post_start(event.pod, event.container)
        return bytes(nri_pb.Empty().SerializeToString())

    async def create(self, payload: bytes, timeout: float | None) -> bytes:
        request = nri_pb.CreateContainerRequest.FromString(payload)
        return bytes(self.create_container(request.pod, request.container).SerializeToString())

    def methods(self) -> dict[tuple[str, str], Any]:
        return {
            (PLUGIN_SERVICE, "Configure"): self.configure,
            (PLUGIN_SERVICE, "Synchronize"): self.synchronize,
            (PLUGIN_SERVICE, "StateChange"): self.state_change,
            (PLUGIN_SERVICE, "CreateContainer"): self.create,
        }


async def serve(socket: str, index: str, cgroup_root: str) -> None:
    """Register, answer events until SIGTERM or the runtime closes the connection."""
    connection = await connect(socket, FloorPlugin(cgroup_root).methods())
    request = nri_pb.RegisterPluginRequest(plugin_name=NAME, plugin_idx=index)
    await connection.client.call(RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString(), 5.0)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([asyncio.ensure_future(connection.closed), stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    with contextlib.suppress(Exception):
        await connection.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default="/var/run/nri/nri.sock", help="the runtime's NRI socket")
    parser.add_argument("--index", default="50", help="plugin index (two digits)")
    parser.add_argument("--cgroup-root", default="/sys/fs/cgroup", help="cgroup v1 mount root")
    args = parser.parse_args(argv)
    uvloop.run(serve(args.socket, args.index, args.cgroup_root))


if __name__ == "__main__":
    main()
