"""Do runtime-proxy and runtime-hooks leak? Their RSS and open fds over many pod lifecycles
under load, against a real containerd.

    python bench/leak_bench.py [--pods 1000] [--callers 32] [--max-seconds 1800] [--json FILE]

It starts the test bed's containerd, runtime-hooks with every built-in plugin (as
runtime_hooks_bench.py does: real cgroups, a fake resctrl) and the proxy in front of
containerd calling it, each as its own process. Then, through the proxy, `--callers`
concurrent callers make a mix of unary CRI calls while `--churners` workers run pod
lifecycles as kubelet does (pod cgroup first, RunPodSandbox ... RemovePodSandbox, pod cgroup
removed last) until `--pods` lifecycles are done or `--max-seconds` pass. Every
`--sample-every` lifecycles the load pauses, the callers' connections are closed, and the
VmRSS, open fds and threads of both daemons are read once they are quiet. It ends with a
verdict on growth after the warm-up and a check that nothing is left behind. See
bench/README.md ("Leak benchmark").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import statistics
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from hooks_bench import pod_spec  # bench/ is on sys.path when run as a script
from hooks_client import Cri, remove_pod
from prometheus_client.parser import text_string_to_metric_families
from relay_bench import Proxy, require_root, workdir, write_figures
from runtime_hooks_bench import KINDS, POLICY, HookedProxy, PluginMetrics, RuntimeHooks, fake_resctrl, scratch_dir
from runtime_hooks_client import KUBE_QOS, start_pod

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.testbed import Containerd
from runtimeproxy.testbed.containerd import cgroup_hierarchies
from runtimeproxy.testbed.daemons import open_fds, proc_status_kib
from runtimeproxy.testbed.podcgroups import remove_pod_cgroups

CRI = "/runtime.v1.RuntimeService/"
IMAGES = "/runtime.v1.ImageService/"
CALL_TIMEOUT = 30.0
MAX_MESSAGE = 16 * 1024 * 1024
MIB = 1024.0  # VmRSS is in KiB
UID_LABEL = "io.kubernetes.pod.uid"  # runtime_hooks_client's pods carry it, as kubelet's do
KEPT_ERRORS = 20  # error messages kept for the report; all are counted

# The verdict: after the warm-up, RSS grows by less than RSS_TOLERANCE_MIB and the open fd
# count at the end equals the warm-up's, for the proxy and for runtime-hooks alike.
# Why 2 MiB: RSS moves in whole allocator blocks, not bytes. pymalloc takes 1 MiB arenas
# (CPython obmalloc: ARENA_BITS 20 under USE_LARGE_ARENAS, set on 64-bit) and glibc's
# per-thread malloc arenas grow by pages as threads (gRPC's, the default executor's) first
# touch them, so a daemon that keeps nothing can still gain an arena or two late in a run.
# A leak of what a pod lifecycle brings (the proxy's store entries, a hook request, a log
# line's context: a few KiB each) over the 900 lifecycles after the warm-up is several MiB,
# and shows in the slope too.
# Why fds exactly: the samples are taken with the load paused, every caller connection
# closed and the fd counts steady, so the daemons hold the same sockets and files each
# time; one fd more is one connection, file or watch not released.
RSS_TOLERANCE_MIB = 2.0


# -- what the callers call ----------------------------------------------------------------


def call_mix(pod_id: str, container_id: str, image: str) -> list[tuple[str, bytes]]:
    """Unary CRI calls (full method path, request bytes) as kubelet's pod workers, PLEG and
    stats make them; status and stats calls name the long-lived anchor pod, so none can race
    a removal (a NOT_FOUND would be the bench's doing, not the proxy's)."""
    runtime = {
        "Version": pb.VersionRequest(version="v1"),
        "Status": pb.StatusRequest(verbose=False),
        "ListPodSandbox": pb.ListPodSandboxRequest(),
        "ListContainers": pb.ListContainersRequest(),
        "PodSandboxStatus": pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True),
        "ContainerStatus": pb.ContainerStatusRequest(container_id=container_id, verbose=True),
        "ContainerStats": pb.ContainerStatsRequest(container_id=container_id),
        "ListContainerStats": pb.ListContainerStatsRequest(filter=pb.ContainerStatsFilter(pod_sandbox_id=pod_id)),
    }
    images = {
        "ListImages": pb.ListImagesRequest(),
        "ImageStatus": pb.ImageStatusRequest(image=pb.ImageSpec(image=image)),
        "ImageFsInfo": pb.ImageFsInfoRequest(),
    }
    return [(CRI + name, request.SerializeToString()) for name, request in runtime.items()] + [
        (IMAGES + name, request.SerializeToString()) for name, request in images.items()
    ]


# -- /proc and metrics ------------------------------------------------------------------------


@dataclass
class Usage:
    rss_kib: int
    fds: int
    threads: int


def usage(pid: int) -> Usage:
    # Threads is a count, in the same line format as VmRSS
    return Usage(proc_status_kib(pid, "VmRSS"), open_fds(pid), proc_status_kib(pid, "Threads"))


def metric_samples(url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called `name` in a Prometheus scrape, keyed by its sorted labels."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def sum_by(samples: dict[tuple[tuple[str, str], ...], float], label: str) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for labels, value in samples.items():
        totals[dict(labels)[label]] += int(value)
    return dict(totals)


@dataclass
class Sample:
    lifecycles: int
    seconds: float
    calls: int
    proxy: Usage
    hooks: Usage
    containerd_rss_kib: int
    connections: dict[str, int]  # the proxy's runtimeproxy_connections{side}
    steady_after_s: float  # how long the fd counts took to settle


# -- the load -------------------------------------------------------------------------------------


@dataclass
class Daemons:
    bed: Containerd
    proxy: Proxy
    hooks: RuntimeHooks
    proxy_metrics: str


@dataclass
class Load:
    """The callers and churners, paused at each sample; counts and errors."""

    args: argparse.Namespace
    daemons: Daemons
    mix: list[tuple[str, bytes]] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # set: the load runs
    stopping: bool = False
    in_flight: int = 0
    started: int = 0
    lifecycles: int = 0
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    calls: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    error_count: int = 0
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)

    @property
    def socket(self) -> str:
        return f"unix://{self.daemons.proxy.socket}"

    def error(self, what: str) -> None:
        self.error_count += 1
        if len(self.errors) < KEPT_ERRORS:
            self.errors.append(what)
        print(f"error: {what}", file=sys.stderr)

    def open_channels(self) -> None:
        """The callers' connections: --channels of them, the callers spread over them."""
        options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
        self.channels = [grpc.aio.insecure_channel(self.socket, options=options) for _ in range(self.args.channels)]

    async def close_channels(self) -> None:
        channels, self.channels = self.channels, []
        await asyncio.gather(*(channel.close(None) for channel in channels))

    async def go_on(self) -> bool:
        """Wait while the load is paused; False once it is stopping. The gate is checked again
        after waking: a waiter woken by set() still returns if a pause cleared it meanwhile."""
        while not self.gate.is_set():
            await self.gate.wait()
        return not self.stopping

    async def caller(self, n: int) -> None:
        turn = n  # each caller starts elsewhere in the mix
        while await self.go_on():
            path, request = self.mix[turn % len(self.mix)]
            turn += 1
            call = self.channels[n % len(self.channels)].unary_unary(path, request_serializer=None,
                                                                     response_deserializer=None)
            self.in_flight += 1
            try:
                await call(request, timeout=CALL_TIMEOUT)
            except grpc.aio.AioRpcError as err:
                self.error(f"{path.rsplit('/', 1)[1]}: {err.code().name}: {err.details()}")
            finally:
                self.in_flight -= 1
            self.calls[path.rsplit("/", 1)[1]] += 1

    async def churner(self, cri: Cri) -> None:
        while await self.go_on() and self.started < self.args.pods:
            n, self.started = self.started, self.started + 1
            self.in_flight += 1
            try:
                await self.lifecycle(cri, n)
            finally:
                self.in_flight -= 1
            self.lifecycles += 1
            self.progress.set()

    async def lifecycle(self, cri: Cri, n: int) -> None:
        """One pod as kubelet runs it: pod cgroup, RunPodSandbox, CreateContainer,
        StartContainer, StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox,
        then the pod's cgroup and log directory removed."""
        kind = KINDS[n % len(KINDS)]
        pod = {**pod_spec(self.daemons.bed, self.socket, f"leak-{n}-{kind.lower()}", KUBE_QOS[kind]), "kind": kind}
        try:
            pod_id, container_id, _steps = await start_pod(cri, pod, self.daemons.bed.test_image)
            await remove_pod(cri, pod_id, container_id)
            self.calls["pod lifecycle calls"] += 7
        except grpc.aio.AioRpcError as err:
            self.error(f"pod {pod['name']}: {err.code().name}: {err.details()}")
            await remove_pods_of(cri, pod["uid"])
        except OSError as err:  # the pod cgroup could not be made
            self.error(f"pod {pod['name']}: {err}")
        problem = await remove_pod_cgroup(pod["cgroup_parent"])
        if problem:
            self.error(f"pod {pod['name']}: {problem}")
        shutil.rmtree(pod["log_directory"], ignore_errors=True)

    async def pause_and_sample(self) -> None:
        """Stop the load at a quiet point, close the callers' connections, read both daemons
        once their fd counts hold still, and go on with new connections."""
        self.gate.clear()
        while self.in_flight:
            await asyncio.sleep(0.01)
        await self.close_channels()
        await asyncio.sleep(self.args.settle)
        steady_after = await steady_fds([self.daemons.proxy.pid, self.daemons.hooks.pid])
        self.samples.append(self.sample(steady_after))
        print_sample(self.samples[-1], self.samples[-2] if len(self.samples) > 1 else None, file=sys.stderr)
        self.open_channels()
        self.gate.set()

    def sample(self, steady_after: float) -> Sample:
        d = self.daemons
        assert d.bed.pid is not None
        connections = {dict(labels)["side"]: int(value) for labels, value in
                       metric_samples(d.proxy_metrics, "runtimeproxy_connections").items()}
        return Sample(self.lifecycles, time.monotonic() - self.began, sum(self.calls.values()),
                      usage(d.proxy.pid), usage(d.hooks.pid), proc_status_kib(d.bed.pid, "VmRSS"),
                      connections, steady_after)

    async def run(self, cri: Cri) -> bool:
        """Run until --pods lifecycles are done (True) or --max-seconds pass (False)."""
        deadline = self.began + self.args.max_seconds
        await self.pause_and_sample()  # before any load: the start; it opens the callers' connections
        tasks = [asyncio.create_task(self.caller(n)) for n in range(self.args.callers)]
        tasks += [asyncio.create_task(self.churner(cri)) for _ in range(self.args.churners)]
        for task in tasks:  # a worker that dies of a bug wakes the loop below, which re-raises it
            task.add_done_callback(lambda _task: self.progress.set())
        complete = True
        for threshold in sample_points(self.args.pods, self.args.warmup_pods, self.args.sample_every):
            while self.lifecycles < threshold and time.monotonic() < deadline:
                crashed = [t for t in tasks if t.done() and not t.cancelled() and t.exception()]
                if crashed:
                    await crashed[0]
                self.progress.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.progress.wait(), max(0.0, deadline - time.monotonic()))
            if self.samples[-1].lifecycles >= threshold:  # already passed while the last sample waited
                continue
            if self.lifecycles < threshold:
                complete = False
                print(f"--max-seconds {self.args.max_seconds:g} reached after {self.lifecycles} lifecycles",
                      file=sys.stderr)
                break
            await self.pause_and_sample()
        self.stopping = True
        self.gate.set()
        await asyncio.gather(*tasks)
        if self.samples[-1].lifecycles != self.lifecycles:  # stopped by the time cap
            self.gate.clear()
            await self.pause_and_sample()
        await self.close_channels()
        return complete


def sample_points(pods: int, warmup: int, every: int) -> list[int]:
    """Lifecycle counts to sample at: the end of the warm-up, every `every` from there, the end."""
    points = {min(warmup, pods), pods}
    points |= set(range(min(warmup, pods), pods, every))
    return sorted(point for point in points if point > 0)


async def steady_fds(pids: Sequence[int], interval: float = 0.1, reads: int = 5, timeout: float = 10.0) -> float:
    """Wait until the fd counts of `pids` are unchanged over `reads` reads (a closed client
    connection is released by the proxy, and its backend connection with it, a moment after
    the client goes); the seconds it took."""
    began = time.monotonic()
    same, last = 0, None
    while same < reads and time.monotonic() - began < timeout:
        counts = [open_fds(pid) for pid in pids]
        same = same + 1 if counts == last else 0
        last = counts
        await asyncio.sleep(interval)
    return time.monotonic() - began


async def remove_pods_of(cri: Cri, uid: str) -> None:
    """After a failed lifecycle, stop and remove whatever sandbox the pod got (untimed)."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        listed = await cri("ListPodSandbox", pb.ListPodSandboxRequest(
            filter=pb.PodSandboxFilter(label_selector={UID_LABEL: uid})), pb.ListPodSandboxResponse)
        for item in listed.items:
            await cri("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=item.id), pb.StopPodSandboxResponse)
            await cri("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=item.id),
                      pb.RemovePodSandboxResponse)


async def remove_pod_cgroup(parent: str, timeout: float = 5.0) -> str:
    """Remove the pod cgroup from every hierarchy, as kubelet does once the pod is gone, retried
    while the kernel still counts a dying task in it. Returns "" or what could not be removed."""
    left = await asyncio.to_thread(remove_pod_cgroups, parent, timeout)
    return "pod cgroup not removable: " + "; ".join(left) if left else ""


# -- set-up, checks, report --------------------------------------------------------------------------


async def start_anchor(cri: Cri, bed: Containerd, socket: str) -> tuple[str, str, str]:
    """The long-lived pod the callers' status calls name: (pod id, container id, cgroup parent)."""
    pod = {**pod_spec(bed, socket, "leak-anchor", KUBE_QOS["LS"]), "kind": "LS"}
    pod_id, container_id, _steps = await start_pod(cri, pod, bed.test_image)
    return pod_id, container_id, pod["cgroup_parent"]


async def drive(args: argparse.Namespace, daemons: Daemons) -> dict[str, Any]:
    load = Load(args, daemons)
    channel = grpc.aio.insecure_channel(load.socket, options=[("grpc.max_receive_message_length", MAX_MESSAGE)])
    cri = Cri(channel)  # the churn's connection, kept for the whole run as kubelet keeps its own
    try:
        pod_id, container_id, anchor_parent = await start_anchor(cri, daemons.bed, load.socket)
        load.mix = call_mix(pod_id, container_id, daemons.bed.test_image)
        complete = await load.run(cri)
        wall = time.monotonic() - load.began
        await remove_pod(cri, pod_id, container_id)
        problem = await remove_pod_cgroup(anchor_parent)
        if problem:
            load.error(f"anchor pod: {problem}")
    finally:
        await channel.close(None)
    return {"complete": complete, "wall_s": wall, "lifecycles": load.lifecycles, "calls": dict(load.calls),
            "errors": load.errors, "error_count": load.error_count, "samples": load.samples}


def leftovers(bed: Containerd) -> list[str]:
    """Pods, containers and pod cgroups still there after the run (should be none)."""
    found = []
    pods = pb.ListPodSandboxResponse.FromString(bed.call("RuntimeService/ListPodSandbox")).items
    containers = pb.ListContainersResponse.FromString(bed.call("RuntimeService/ListContainers")).containers
    found += [f"pod sandbox {item.id} ({item.metadata.name})" for item in pods]
    found += [f"CRI container {item.id} ({item.metadata.name})" for item in containers]
    found += [f"containerd container {cid}" for cid in bed.ctr("containers", "ls", "-q").stdout.split()]
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / bed.cgroup_prefix
        if top.is_dir():
            found += [f"pod cgroup {path}" for path in sorted(top.rglob("pod*")) if path.is_dir()]
    return found


def slope_per_100(samples: Sequence[Sample], value: Any) -> float:
    """Least-squares slope of value(sample) per 100 lifecycles."""
    if len(samples) < 2 or len({s.lifecycles for s in samples}) < 2:
        return math.nan
    fit = statistics.linear_regression([s.lifecycles for s in samples], [float(value(s)) for s in samples])
    return fit.slope * 100


def judge(samples: Sequence[Sample], warmup_pods: int) -> dict[str, Any]:
    """Per daemon: RSS, fds and threads at the warm-up sample and the last, the growth and slopes."""
    after = [s for s in samples if s.lifecycles >= min(warmup_pods, samples[-1].lifecycles)]
    warm, end = after[0], after[-1]
    result: dict[str, Any] = {"warmup_lifecycles": warm.lifecycles, "end_lifecycles": end.lifecycles}
    for name in ("proxy", "hooks"):
        w, e = getattr(warm, name), getattr(end, name)
        growth = (e.rss_kib - w.rss_kib) / MIB
        result[name] = {
            "rss_warmup_mib": w.rss_kib / MIB, "rss_end_mib": e.rss_kib / MIB, "rss_growth_mib": growth,
            "rss_slope_mib_per_100": slope_per_100(after, lambda s, n=name: getattr(s, n).rss_kib / MIB),
            "fds_warmup": w.fds, "fds_end": e.fds, "fds_slope_per_100": slope_per_100(after, lambda s, n=name:
                                                                                    getattr(s, n).fds),
            "threads_warmup": w.threads, "threads_end": e.threads,
        }
    return result


def print_sample(s: Sample, previous: Sample | None, file: Any = sys.stdout) -> None:
    rate = ((s.lifecycles - previous.lifecycles) / (s.seconds - previous.seconds)
            if previous and s.seconds > previous.seconds else math.nan)
    conns = f"{s.connections.get('client', 0)}/{s.connections.get('backend', 0)}"
    print(f"{s.lifecycles:>6}{s.seconds:>8.0f}{s.calls:>10}{rate:>8.2f}"
          f"{s.proxy.rss_kib / MIB:>10.2f}{s.proxy.fds:>6}{s.proxy.threads:>5}{conns:>7}"
          f"{s.hooks.rss_kib / MIB:>10.2f}{s.hooks.fds:>6}{s.hooks.threads:>5}"
          f"{s.containerd_rss_kib / MIB:>10.1f}{s.steady_after_s:>7.1f}", file=file)


SAMPLE_HEAD = (f"{'pods':>6}{'s':>8}{'calls':>10}{'pods/s':>8}{'proxy MiB':>10}{'fds':>6}{'thr':>5}{'conns':>7}"
               f"{'hooks MiB':>10}{'fds':>6}{'thr':>5}{'ctrd MiB':>10}{'quiet':>7}")


def print_report(report: dict[str, Any]) -> None:
    run, verdict = report["run"], report["verdict"]
    env = report["environment"]
    print()
    print(f"leak bench: {env['cpus']} CPUs; {env['callers']} callers on {env['channels']} connections (new ones "
          f"after each sample), {env['churners']} pod churners, all through the proxy; runtime-hooks with "
          f"{', '.join(env['plugins'])}")
    print("Samples (load paused, caller connections closed; RSS in MiB, fds open, threads; conns: the proxy's "
          "client/backend connections; quiet: s until fd counts held still)")
    print(SAMPLE_HEAD)
    print("-" * len(SAMPLE_HEAD))
    previous = None
    for sample in run["samples"]:
        print_sample(sample, previous)
        previous = sample
    print()
    calls = run["calls"]
    unary = sum(v for k, v in calls.items() if k != "pod lifecycle calls")
    wall = run["wall_s"]
    print(f"Calls done: {unary + calls.get('pod lifecycle calls', 0)} ({unary} unary mix, "
          f"{unary / wall:.0f}/s: " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())
                                                 if k != "pod lifecycle calls")
          + f"; {calls.get('pod lifecycle calls', 0)} lifecycle calls)")
    print(f"Pod lifecycles: {run['lifecycles']} of {env['pods']} in {wall:.0f} s, {run['lifecycles'] / wall:.2f}/s"
          + ("" if run["complete"] else f" (STOPPED by --max-seconds {env['max_seconds']:g})"))
    checks = report["checks"]
    print(f"Errors: {report['error_total']} (calls and lifecycles {run['error_count']}, proxy hook calls not ok "
          f"{sum(checks['hook_calls_not_ok'].values())}, runtime-hooks plugin calls not ok "
          f"{sum(checks['plugin_calls_not_ok'].values())})")
    for text in run["errors"]:
        print(f"  {text}")
    for what, found in (("proxy hook calls not ok", checks["hook_calls_not_ok"]),
                        ("plugin calls not ok", checks["plugin_calls_not_ok"])):
        if found:
            print(f"  {what}: {found}")
    print(f"Proxy's own count of relayed calls by code: {checks['proxy_calls_by_code']}")
    print(f"Proxy hook calls: {int(checks['hook_calls'])}; leftovers after the run: "
          f"{'; '.join(checks['leftovers']) or 'none'}")
    print()
    print(f"Growth after the warm-up ({verdict['warmup_lifecycles']} lifecycles) to the end "
          f"({verdict['end_lifecycles']}):")
    for name, label in (("proxy", "runtime-proxy"), ("hooks", "runtime-hooks")):
        v = verdict[name]
        print(f"  {label:<14} RSS {v['rss_warmup_mib']:.2f} -> {v['rss_end_mib']:.2f} MiB ({v['rss_growth_mib']:+.2f}, "
              f"slope {v['rss_slope_mib_per_100']:+.3f} MiB per 100 lifecycles; peak {report['peak_rss_mib'][name]:.1f}"
              f"); fds {v['fds_warmup']} -> {v['fds_end']} (slope {v['fds_slope_per_100']:+.2f} per 100); "
              f"threads {v['threads_warmup']} -> {v['threads_end']}")
    failed = report["failures"]
    print(f"Verdict: {'FAIL (' + '; '.join(failed) + ')' if failed else 'PASS'}: RSS and fds do not grow "
          f"(after the warm-up, for both daemons: RSS growth < {RSS_TOLERANCE_MIB:g} MiB, fd count unchanged; "
          f"and every lifecycle done, no errors, nothing left behind)")
    print(f"Wall time: set-up {report['timings']['setup_s']:.1f} s, load {wall:.1f} s, "
          f"total {report['timings']['total_s']:.1f} s")


def not_ok(samples: dict[tuple[tuple[str, str], ...], float], fine: tuple[str, ...]) -> dict[str, int]:
    """Outcome counters whose outcome is not one of `fine`, as 'label=value ...: count'."""
    return {" ".join(f"{v}" for k, v in labels if k != "outcome") + f" {dict(labels)['outcome']}": int(n)
            for labels, n in samples.items() if dict(labels)["outcome"] not in fine and n}


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    began = time.monotonic()
    bed = Containerd(pod_network=False)
    stack: HookedProxy | None = None
    with workdir() as work, scratch_dir() as scratch:
        policy = work / "policy.yaml"
        policy.write_text(POLICY)
        try:
            bed.start()
            resctrl = fake_resctrl(scratch / "resctrl")
            stack = HookedProxy.make(work, bed, resctrl, policy, "hooks")
            stack.start()
            proxy, hooks, proxy_metrics = stack.proxy, stack.hooks, stack.metrics_url
            setup_s = time.monotonic() - began
            print(SAMPLE_HEAD, file=sys.stderr)
            run = asyncio.run(drive(args, Daemons(bed, proxy, hooks, proxy_metrics)))
            time.sleep(args.settle)  # post-hooks of the anchor's removal
            hook_outcomes = metric_samples(proxy_metrics, "runtimeproxy_hook_calls_total")
            checks: dict[str, Any] = {
                "hook_calls": sum(hook_outcomes.values()),
                "hook_calls_not_ok": not_ok(hook_outcomes, ("ok", "unimplemented")),
                "plugin_calls_not_ok": PluginMetrics.scrape(hooks.metrics_url).failures(),
                "proxy_calls_by_code": sum_by(metric_samples(proxy_metrics, "runtimeproxy_cri_calls_total"), "code"),
                "leftovers": leftovers(bed),
            }
            peak = {name: proc_status_kib(daemon.pid, "VmHWM") / MIB for name, daemon in (("proxy", proxy),
                                                                                           ("hooks", hooks))}
            plugins = [arg.split("=", 1)[1] for arg in hooks.argv if arg.startswith("--enable=")]
        finally:
            if stack is not None:
                stack.stop()
            bed.stop()  # raises if the test bed could not remove something
    verdict = judge(run["samples"], args.warmup_pods)
    error_total = (run["error_count"] + sum(checks["hook_calls_not_ok"].values())
                   + sum(checks["plugin_calls_not_ok"].values()))
    return {
        "environment": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "pods": args.pods,
                        "callers": args.callers, "channels": args.channels, "churners": args.churners,
                        "max_seconds": args.max_seconds, "plugins": plugins, "proxy_argv": proxy.argv,
                        "hooks_argv": hooks.argv, "rss_tolerance_mib": RSS_TOLERANCE_MIB},
        "run": run,
        "checks": checks,
        "peak_rss_mib": peak,
        "verdict": verdict,
        "error_total": error_total,
        "failures": failures(run, verdict, error_total, checks["leftovers"], args.pods),
        "timings": {"setup_s": setup_s, "total_s": time.monotonic() - began},
    }


def failures(run: dict[str, Any], verdict: dict[str, Any], errors: int, left: list[str], pods: int) -> list[str]:
    """Why the run fails the verdict ([] when it passes)."""
    found = []
    for name, label in (("proxy", "runtime-proxy"), ("hooks", "runtime-hooks")):
        v = verdict[name]
        if v["rss_growth_mib"] >= RSS_TOLERANCE_MIB:
            found.append(f"{label} RSS grew {v['rss_growth_mib']:+.2f} MiB")
        if v["fds_end"] != v["fds_warmup"]:
            found.append(f"{label} fds {v['fds_warmup']} -> {v['fds_end']}")
    if errors:
        found.append(f"{errors} errors")
    if left:
        found.append(f"{len(left)} leftovers")
    if not run["complete"]:
        found.append(f"only {run['lifecycles']} of {pods} lifecycles done")
    return found


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=1000, help="pod lifecycles to run (default 1000)")
    parser.add_argument("--callers", type=int, default=32, help="concurrent unary CRI callers (default 32)")
    parser.add_argument("--channels", type=int, default=4,
                        help="connections the callers share, reopened after each sample (default 4)")
    parser.add_argument("--churners", type=int, default=4, help="concurrent pod lifecycle workers (default 4)")
    parser.add_argument("--warmup-pods", type=int, default=100,
                        help="lifecycles before the warm-up sample the growth is measured from (default 100)")
    parser.add_argument("--sample-every", type=int, default=50, help="lifecycles between samples (default 50)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds of quiet before each sample, after the load pauses (default 1)")
    parser.add_argument("--max-seconds", type=float, default=1800.0,
                        help="stop the load after this long even if not all lifecycles are done (default 1800)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if min(args.pods, args.callers, args.channels, args.churners, args.sample_every) < 1 or args.warmup_pods < 0:
        parser.error("counts must be at least 1 (--warmup-pods at least 0)")
    if args.max_seconds <= 0 or args.settle < 0:
        parser.error("--max-seconds must be positive and --settle not negative")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    require_root("leak_bench.py")
    report = run_bench(args)
    print_report(report)
    report["run"]["samples"] = [asdict(s) for s in report["run"]["samples"]]
    write_figures(args.json, report)
    sys.exit(1 if report["failures"] else 0)


if __name__ == "__main__":
    main()
