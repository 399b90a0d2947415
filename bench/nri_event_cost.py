"""runtime-hooks' own CPU per NRI event, counted in instructions: the plugin host without the machine's noise.

    python bench/nri_event_cost.py [--pods 50]      # needs valgrind; about 8 min

The NRI service (hooks/nri/service.py) with the default plugins, set up as ``runtime-hooks serve
--nri-socket`` sets it up, answering ttrpc frames fed to it in this process (no socket, no
containerd) on a fake cgroup v1 tree (hooks/testkit/fake_cgroups.py: the kernel's file names
and formats, in a temporary directory). Every pod is new: a BestEffort pod with batch resources,
as bench/nri_bench.py starts them, whose pod and container cgroups exist (kubelet makes the
one, the runtime the other, before PostStartContainer), made before the pods' events in every run. Each pod's events are
fed in the order containerd sends them: RunPodSandbox, CreateContainer, PostStartContainer, each
once the one before is answered and its hooks are done.

valgrind's callgrind counts the instructions of the whole process; the bench runs it with few and
with many pods, and with the pods' lives cut after RunPodSandbox, after CreateContainer and after
PostStartContainer, so that the differences give each event's instructions per pod: from the
frame to the answer and the work after it (the event's log line and metrics, the plugins' lines,
and for PostStartContainer, answered on arrival, its hooks and the OOM score; the lines are
rendered and written to /dev/null). Instructions do not depend on what
else the machine does; they are not time: a cold cache costs time too, which only the benchmarks
against a real containerd show (bench/nri_peer_bench.py).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import uvloop
from nri_bench import SPEC  # bench/ is on sys.path when run as a script
from prometheus_client import CollectorRegistry
from relay_replay import callgrind_instructions
from runtimeproxy.hooks.discovery import discover_plugins, settings_specs
from runtimeproxy.hooks.nri.nri_metrics import NriMetrics
from runtimeproxy.hooks.nri.rpc import TtrpcServer
from runtimeproxy.hooks.nri.service import PLUGIN_SERVICE, NriHooks
from runtimeproxy.hooks.nri.ttrpc import FrameDecoder, MessageType, encode_frame
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.policy import default_policy
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1
from runtimeproxy.hooks.views import ServerContext

from runtimeproxy.api.nri.ttrpc import ttrpc_pb2 as ttrpc_pb
from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb
from runtimeproxy.common.logs import configure_logging

EVENTS = ("RunPodSandbox", "CreateContainer", "PostStartContainer")
FEW = 10  # pods of the short run: imports, set-up and the first pods' one-off work cancel out


def hooks_on(tree: FakeCgroup) -> NriHooks:
    """The NRI service with every discovered plugin, on ``tree``, with the default policy."""
    discovery = discover_plugins()
    defaults = default_policy(settings_specs(discovery.plugins))
    context = ServerContext(cgroups=tree.fs(), resctrl=None, policy=lambda: defaults)
    registry = CollectorRegistry()
    return NriHooks(PluginRunner(discovery.plugins, context=context, registry=registry), NriMetrics(registry))


def pod_and_container(tree: FakeCgroup) -> tuple[Any, Any]:
    """A new BE pod (its pod cgroup made, as kubelet makes it) and its container, as NRI describes them."""
    uid = str(uuid.uuid4())
    pod = nri_pb.PodSandbox(id=uuid.uuid4().hex, name=f"cost-{uid[:8]}", uid=uid, namespace="bench")
    pod.labels["koordinator.sh/qosClass"] = "BE"
    pod.annotations["node.koordinator.sh/extended-resource-spec"] = SPEC
    pod.linux.cgroup_parent = tree.add_pod(uid, "besteffort")
    container = nri_pb.Container(id=uuid.uuid4().hex, pod_sandbox_id=pod.id, name="app", env=["PATH=/bin"])
    container.linux.resources.cpu.shares.value = 2
    container.linux.resources.cpu.period.value = 100_000
    container.linux.oom_score_adj.value = 1000
    return pod, container


class Feeder:
    """Feeds one request at a time to the service's ttrpc server and waits for its answer and hooks."""

    def __init__(self, hooks: NriHooks) -> None:
        self.hooks = hooks
        self.answers: list[bytes] = []
        self.server = TtrpcServer(hooks.methods(), self.answers.append)
        self.stream = 1

    async def call(self, method: str, message: Any) -> None:
        request = ttrpc_pb.Request(service=PLUGIN_SERVICE, method=method, payload=message.SerializeToString(),
                                   timeout_nano=2_000_000_000)
        self.stream += 2
        sent = len(self.answers)
        self.server.feed(encode_frame(self.stream, MessageType.REQUEST, request.SerializeToString()))
        while len(self.answers) == sent:
            await asyncio.sleep(0)
        await self.hooks.queues.drain()  # PostStartContainer's hooks, which run after its answer
        [frame] = FrameDecoder().feed(self.answers[-1])
        if ttrpc_pb.Response.FromString(frame.payload).status.code:
            raise SystemExit(f"{method} was answered with an error: {ttrpc_pb.Response.FromString(frame.payload)}")


async def lives(pods: int, made: int, last: str, work: Path) -> None:
    """``pods`` pods' events, each pod's up to ``last`` (one of EVENTS), of ``made`` pods whose
    cgroups are made first (as many in every run: making them is no part of the difference)."""
    tree = make_fake_cgroup_v1(work / "cgroup")
    feeder = Feeder(hooks_on(tree))
    await feeder.call("Configure", nri_pb.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24"))
    ready = [pod_and_container(tree) for _ in range(made)]
    for pod, container in ready:  # the runtime makes it before PostStartContainer; nothing looks earlier
        tree.add_container(pod.linux.cgroup_parent, container.id)
    gc.collect()
    gc.disable()  # collections land at different points in runs of different lengths: noise
    for pod, container in ready[:pods]:
        await feeder.call("StateChange", nri_pb.StateChangeEvent(event=nri_pb.RUN_POD_SANDBOX, pod=pod))
        if last == "RunPodSandbox":
            continue
        await feeder.call("CreateContainer", nri_pb.CreateContainerRequest(pod=pod, container=container))
        if last == "CreateContainer":
            continue
        container.state, container.pid = nri_pb.CONTAINER_RUNNING, 1  # pid 1: its OOM score is left alone
        event = nri_pb.StateChangeEvent(event=nri_pb.POST_START_CONTAINER, pod=pod, container=container)
        await feeder.call("StateChange", event)
    gc.enable()


def run_child(pods: int, made: int, last: str) -> None:
    configure_logging("info", "json")
    with open("/dev/null", "w") as nowhere, tempfile.TemporaryDirectory(prefix="rtpx-cost-") as work:
        sys.stdout = nowhere  # the lines are rendered and written, to nowhere
        uvloop.run(lives(pods, made, last, Path(work)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=50, help="pods of the long run (default 50)")
    parser.add_argument("--child", nargs=3, metavar=("PODS", "MADE", "LAST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(int(args.child[0]), int(args.child[1]), args.child[2])
        return
    totals: dict[str, float] = {}
    for last in EVENTS:
        few = callgrind_instructions([__file__, "--child", str(FEW), str(args.pods), last])
        many = callgrind_instructions([__file__, "--child", str(args.pods), str(args.pods), last])
        totals[last] = (many - few) / (args.pods - FEW)
    print("| event (its answer and the work after it) | instructions per pod |\n|---|---|")
    before = 0.0
    for last in EVENTS:
        print(f"| {last} | {totals[last] - before:,.0f} |")
        before = totals[last]
    print(f"| the three | {before:,.0f} |")


if __name__ == "__main__":
    main()
