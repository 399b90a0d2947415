"""What the runtime-hooks server costs with all its built-in plugins: hook calls per second,
and the pod start through the proxy with it, against a real containerd.

    python bench/runtime_hooks_bench.py [--json FILE]

Part 1 starts `runtime-hooks serve` (cpu, cpuset, memory, resctrl and network plugins) on a
fake cgroup v1 tree and a fake resctrl tree, and times the hook points of a pod start
(PreRunPodSandbox, PreCreateContainer, PostStartContainer) from a separate client process
(bench/runtime_hooks_client.py) with 1 and 16 concurrent callers. Part 2 starts the test
bed's containerd, runtime-hooks on the real /sys/fs/cgroup (and a fake resctrl) and the
proxy, and starts pods directly and through the proxy in alternation. See bench/README.md
("runtime-hooks benchmark").
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import inspect
import json
import math
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hooks_bench  # bench/ is on sys.path when run as a script
from hooks_bench import HookServer, Series, compare, fmt_paired, interleaved, pod_spec, wait_for_metrics
from prometheus_client.parser import text_string_to_metric_families
from relay_bench import (
    CallTimes,
    Client,
    Proxy,
    Service,
    background_cpus,
    percentile,
    timed_run,
    verdict,
    workdir,
    write_figures,
)
from relay_client import machine_cpu_seconds
from runtime_hooks_client import KUBE_QOS, container_config, sandbox_config
from runtimeproxy.hooks.cgroups import CgroupFS
from runtimeproxy.hooks.definition import Handler, Plugin
from runtimeproxy.hooks.discovery import discover_plugins
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.plugins.resctrl import LAYOUTS
from runtimeproxy.hooks.policy import Specs, load_policy
from runtimeproxy.hooks.server import (
    REGISTRATION_FILE,
    container_from_request,
    container_response,
    pod_from_container_request,
    pod_from_request,
    pod_response,
)
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1
from runtimeproxy.hooks.testkit.fake_resctrl import make_fake_resctrl
from runtimeproxy.hooks.views import ServerContext

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.common.logs import configure_logging
from runtimeproxy.hookapi import cri_mapping
from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint
from runtimeproxy.testbed import Containerd
from runtimeproxy.testbed.daemons import free_port, proc_status_kib
from runtimeproxy.testbed.serve_args import hooks_serve_args

BENCH_DIR = Path(__file__).resolve().parent
CLIENT_SCRIPT = BENCH_DIR / "runtime_hooks_client.py"
PLUGINS = ("cpu", "cpuset", "memory", "resctrl", "network")
POINTS = (HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER)
CONCURRENCY = (1, 16)
HOOK_TARGETS = ("runtime-hooks", "no-op")  # the no-op one: bench/hooks_server.py, gRPC and decoding only
KINDS = ("LS", "BE")
TARGETS = ("direct", "proxy")
LABELS = {"direct": "direct", "proxy": "proxy + runtime-hooks"}
STEPS = hooks_bench.STEPS
# Laid over the built-in policy: network shaping off (its handlers' when= filter skips them).
POLICY = 'network:\n  interface: ""\n'
PLUGIN_HISTOGRAM = "runtimeproxy_hooks_plugin_call_duration_seconds"
PLUGIN_CALLS = "runtimeproxy_hooks_plugin_calls_total"
# Hook points a proxied pod goes through (of those the plugins handle), and those its start waits for.
PROXIED_POINTS = (HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER,
                  HookPoint.POST_STOP_POD_SANDBOX)
IN_SERIES = (HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER)
IMAGE = "docker.io/library/busybox:1.36"  # part 1's requests name it; nothing pulls it
THREAD_BASE = 3_000_000  # fake thread ids of the fake containers (no such task: the fake kernel says ESRCH)
BE_BATCH_QUOTA = "100000"  # the BE pods' batch-cpu limit, 1000m, as the cpu plugin writes it per 100 ms

# Printed next to the figures; the bench reports, it does not assert.
TARGET_START_RATIO = 1.05

# The fake resctrl mount runtime-hooks gets: 2 L3 caches of 11 ways, MBA on 2 domains, 16 CLOSIDs.
FAKE_RESCTRL: dict[str, Any] = {"l3_ids": [0, 1], "cbm_mask": "7ff", "mb_ids": [0, 1], "num_closids": 16}
FAKE_KERNEL_ENV = "RTPX_BENCH_FAKE_RESCTRL"  # {"root": ..., "options": FAKE_RESCTRL}
# runtime-hooks' CLI with the test kit's fake kernel attached first to the tree the bench made: its
# mkdir, rmdir and writes there then behave as on a kernel (hooks/testkit/attach.py). The fake keeps
# every write it receives: a short deque instead, or the list would grow like a leak (leak_bench).
ON_FAKE_KERNEL = f"""
import collections, json, os, sys
from runtimeproxy.hooks.testkit import attach_fake_resctrl
spec = json.loads(os.environ["{FAKE_KERNEL_ENV}"])
attach_fake_resctrl(spec["root"], **spec["options"]).writes = collections.deque(maxlen=16)
sys.argv[0] = "runtime-hooks"
from runtimeproxy.hooks.cli import main
main()
"""


# -- processes ----------------------------------------------------------------------------


class RuntimeHooks(Service):
    """`runtime-hooks serve` with the built-in plugins (all of them, and only them), writing its
    registration into `hook_dir`, on the fake resctrl at `resctrl_root` (made by `fake_resctrl`)
    driven as a kernel by the process itself."""

    def __init__(self, work: Path, name: str, *, hook_dir: Path, cgroup_root: str, resctrl_root: Path,
                 policy: Path, runtime_endpoint: str = "", pod_root: str = "/kubepods") -> None:
        self.socket = work / name / "hooks.sock"
        self.registration = hook_dir / REGISTRATION_FILE
        port = free_port()
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        argv = [
            *hooks_serve_args([sys.executable, "-c", ON_FAKE_KERNEL], self.socket, hook_dir, cgroup_root, pod_root,
                              resctrl_root),
            "--policy", str(policy),
            "--runtime-endpoint", runtime_endpoint,  # "": no reconciler
            "--metrics-address", f"127.0.0.1:{port}",
            "--log-level", "info",
            *(f"--enable={name}" for name in PLUGINS),
        ]
        super().__init__(work, name, argv, {FAKE_KERNEL_ENV: json.dumps({"root": str(resctrl_root),
                                                                         "options": FAKE_RESCTRL})})

    def start(self, timeout: float = 30.0) -> None:
        super().start(timeout)  # READY=1 comes once it serves, registered, with its metrics
        if self.daemon is not None and "resctrl groups ready" not in self.daemon.stdout():
            raise RuntimeError(f"the resctrl plugin did not set up its groups:\n{self.log_tail()}")

    def registered_points(self) -> list[str]:
        points: list[str] = json.loads(self.registration.read_text())["runtime-hooks"]
        return points


@dataclass
class HookedProxy:
    """The proxy in front of the test bed calling runtime-hooks (all built-in plugins on the real
    cgroups of the test bed's pods, a fake resctrl), each its own process."""

    proxy: Proxy
    hooks: RuntimeHooks
    metrics_url: str

    @classmethod
    def make(cls, work: Path, bed: Containerd, resctrl: Path, policy: Path, hooks_name: str) -> HookedProxy:
        proxy = Proxy(work, bed.address)
        port = free_port()
        proxy.argv += ["--cgroup-parent-root", f"/{bed.cgroup_prefix}", "--metrics-address", f"127.0.0.1:{port}"]
        hooks = RuntimeHooks(work, hooks_name, hook_dir=proxy.hook_dir, cgroup_root="/sys/fs/cgroup",
                             resctrl_root=resctrl, policy=policy, runtime_endpoint=bed.address,
                             pod_root=f"/{bed.cgroup_prefix}/kubepods")
        return cls(proxy, hooks, f"http://127.0.0.1:{port}/metrics")

    def start(self) -> None:
        self.hooks.start()  # registers before the proxy starts: the proxy finds it on its first scan
        self.proxy.start()
        wait_for_metrics(self.metrics_url, self.proxy)

    def stop(self) -> None:
        self.proxy.stop()
        self.hooks.stop()


# -- fake node trees ------------------------------------------------------------------------


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """A directory for the fake trees: tmpfs (/dev/shm) when there is one, like the kernel's
    in-memory cgroupfs and resctrl; writes there are as cheap as they get."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = Path(tempfile.mkdtemp(prefix="rtpx-hooks-bench-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def installed_specs() -> Specs:
    """The policy sections of the installed plugins, as `runtime-hooks serve` reads its policy with."""
    return {p.settings_spec.name: p.settings_spec for p in discover_plugins().plugins if p.settings_spec is not None}


def fake_resctrl(root: Path) -> Path:
    """A fake resctrl mount (`FAKE_RESCTRL`) at `root`, as after boot: the root group only.
    `RuntimeHooks` attaches the test kit's fake kernel to it in its own process, so the resctrl
    plugin makes its groups, writes their schemata and moves tasks there as on a kernel (tasks
    listed, schemata validated and re-rendered); the bench reads the files the fake renders."""
    make_fake_resctrl(root, **FAKE_RESCTRL)
    return root


def fake_pods(tree: FakeCgroup, count: int) -> list[dict[str, str]]:
    """`count` pods (LS and BE in turn) in the fake tree, with what kubelet and runc leave
    before the hooks run: the pod and container cgroups, kubelet's shares and quota, and the
    container's one thread."""
    fs = tree.fs()
    pods = []
    for n in range(count):
        kind = KINDS[n % 2]
        uid = str(uuid.uuid4())
        parent = tree.add_pod(uid, KUBE_QOS[kind])  # type: ignore[arg-type]
        container_id = secrets.token_hex(32)
        tree.add_container(parent, container_id)
        for cid in (None, container_id):
            if kind == "LS":
                fs.set_cpu_quota(parent, 200_000, container_id=cid)
                fs.set_cpu_shares(parent, 512, container_id=cid)
            else:
                fs.set_cpu_shares(parent, 2, container_id=cid)
        fs.write("cpu", "tasks", f"{THREAD_BASE + n}\n", parent, container_id)
        pods.append({"uid": uid, "name": f"rhb-{n}-{kind.lower()}", "kind": kind, "cgroup_parent": parent,
                     "log_directory": f"/var/log/pods/{uid}", "container_id": container_id})
    return pods


def hook_requests(pods: Sequence[dict[str, str]], image: str) -> dict[HookPoint, list[str]]:
    """Per hook point, one request per pod (base64), built by the proxy's own request builders
    from the CRI configs kubelet would send: PreRunPodSandbox before the sandbox has an id,
    PreCreateContainer before the container has one, PostStartContainer with both. (The proxy
    sends PostStartContainer the container's config as created, PreCreateContainer's changes
    merged; here it is as kubelet sent it: the handlers there read the cgroups, not these fields.)"""
    requests: dict[HookPoint, list[str]] = {point: [] for point in POINTS}
    for pod in pods:
        config, container = sandbox_config(pod), container_config(pod, image)
        sandbox = cri_mapping.PodView(secrets.token_hex(32), "", config)
        built = {
            HookPoint.PRE_RUN_POD_SANDBOX: cri_mapping.pod_hook_request(cri_mapping.PodView("", "", config)),
            HookPoint.PRE_CREATE_CONTAINER: cri_mapping.container_hook_request(
                sandbox, cri_mapping.ContainerView("", container)),
            HookPoint.POST_START_CONTAINER: cri_mapping.container_hook_request(
                sandbox, cri_mapping.ContainerView(pod["container_id"], container)),
        }
        for point, message in built.items():
            requests[point].append(base64.b64encode(message.SerializeToString()).decode())
    return requests


# -- runtime-hooks' own metrics ---------------------------------------------------------------


@dataclass
class PluginMetrics:
    """runtimeproxy_hooks_plugin_call_duration_seconds (sum, count) and the calls' outcomes,
    by (plugin, hook point)."""

    seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    counts: dict[tuple[str, str], float] = field(default_factory=dict)
    outcomes: dict[tuple[str, str, str], float] = field(default_factory=dict)

    @classmethod
    def scrape(cls, url: str) -> PluginMetrics:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        metrics = cls()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if sample.name == PLUGIN_HISTOGRAM + "_sum":
                    metrics.seconds[labels["plugin"], labels["hook"]] = sample.value
                elif sample.name == PLUGIN_HISTOGRAM + "_count":
                    metrics.counts[labels["plugin"], labels["hook"]] = sample.value
                elif sample.name == PLUGIN_CALLS:
                    metrics.outcomes[labels["plugin"], labels["hook"], labels["outcome"]] = sample.value
        return metrics

    def minus(self, earlier: PluginMetrics) -> PluginMetrics:
        return PluginMetrics(
            {k: v - earlier.seconds.get(k, 0.0) for k, v in self.seconds.items()},
            {k: v - earlier.counts.get(k, 0.0) for k, v in self.counts.items()},
            {k: v - earlier.outcomes.get(k, 0.0) for k, v in self.outcomes.items()},
        )

    def add(self, other: PluginMetrics) -> None:
        for key, value in other.seconds.items():
            self.seconds[key] = self.seconds.get(key, 0.0) + value
        for key, value in other.counts.items():
            self.counts[key] = self.counts.get(key, 0.0) + value
        for outcome, value in other.outcomes.items():
            self.outcomes[outcome] = self.outcomes.get(outcome, 0.0) + value

    def mean_ms(self, hook: str) -> dict[str, float]:
        """Mean handler time per call (ms) of each plugin that ran at `hook`."""
        return {plugin: self.seconds[plugin, h] / n * 1e3 for (plugin, h), n in self.counts.items()
                if h == hook and n > 0}

    def failures(self) -> dict[str, int]:
        return {f"{plugin} {hook} {outcome}": int(n) for (plugin, hook, outcome), n in self.outcomes.items()
                if outcome != "ok" and n > 0}


# -- part 1: hook calls per second --------------------------------------------------------------


@dataclass
class HookSeries(CallTimes):
    """Every timed run of one (hook point, callers), pooled over the rounds."""

    server_cpu: float = 0.0
    server_system_cpu: float = 0.0
    plugins: PluginMetrics = field(default_factory=PluginMetrics)
    checked: list[str] = field(default_factory=list)

    def add(self, answer: dict[str, Any], plugins: PluginMetrics | None) -> None:
        self.add_times(answer)
        user, system = answer["watched_cpu"]["server"]
        self.server_cpu += user + system
        self.server_system_cpu += system
        if plugins is not None:
            self.plugins.add(plugins)
        self.checked = answer["checked"]

    def summary(self, hook: str) -> dict[str, Any]:
        per_call_us = self.per_call_us()
        plugin_ms = self.plugins.mean_ms(hook)
        return self.times_summary() | {
            "mean_ms": statistics.fmean(self.latencies) * 1e3 if self.latencies else math.nan,
            "server_cpu_us_per_call": self.server_cpu * per_call_us,
            "server_system_cpu_us_per_call": self.server_system_cpu * per_call_us,
            "plugin_mean_ms": plugin_ms,
            "plugins_sum_ms": sum(plugin_ms.values()),
            "plugin_failures": self.plugins.failures(),
            "answers": {"LS": self.checked[0], "BE": self.checked[1]} if len(self.checked) == 2 else {},
        }


def run_hook_calls(args: argparse.Namespace, client: Client, work: Path, scratch: Path) -> dict[str, Any]:
    tree = make_fake_cgroup_v1(scratch / "cgroup", driver="cgroupfs")
    resctrl = fake_resctrl(scratch / "resctrl")
    pods = fake_pods(tree, args.pool)
    requests = hook_requests(pods, IMAGE)
    server = RuntimeHooks(work, "hooks-calls", hook_dir=work / "hooks-calls.d", cgroup_root=str(tree.root),
                          resctrl_root=resctrl, policy=work / "policy.yaml")
    noop = HookServer(work)
    counted: dict[str, dict[str, int]] = {}
    try:
        server.start()
        noop.start()
        registered = server.registered_points()
        targets = {"runtime-hooks": (server.socket, server.pid), "no-op": (noop.socket, noop.pid)}
        series = {(t, point, n): HookSeries() for t in HOOK_TARGETS for point in POINTS for n in CONCURRENCY}
        for round_no in range(args.hook_rounds):
            order = HOOK_TARGETS if round_no % 2 == 0 else HOOK_TARGETS[::-1]  # who goes first alternates
            for point in POINTS:
                for concurrency in CONCURRENCY:
                    for target in order:
                        socket_path, pid = targets[target]
                        before = PluginMetrics.scrape(server.metrics_url) if target == "runtime-hooks" else None
                        answer = client.run(op="hooks", socket=str(socket_path), rpc=point.rpc,
                                            requests=requests[point], concurrency=concurrency, calls=args.calls,
                                            warmup=args.warmup, watch={"server": pid})
                        plugins = PluginMetrics.scrape(server.metrics_url).minus(before) if before else None
                        series[target, point, concurrency].add(answer, plugins)
            print(f"hook calls: round {round_no + 1}/{args.hook_rounds} done", file=sys.stderr)
        rss_peak_kib = proc_status_kib(server.pid, "VmHWM")
    finally:
        server.stop()
        noop.stop()
        counted = noop.counts()
    if not all(counted.get("calls", {}).get(point.value) for point in POINTS):
        raise RuntimeError(f"the no-op hook server was not called on every hook point: {counted}")
    return {
        "cgroup_root": f"fake cgroup v1 tree (hooks/testkit/fake_cgroups.py, cgroupfs driver) at {tree.root}",
        "resctrl_root": f"fake resctrl (hooks/testkit/fake_resctrl.py) at {resctrl}",
        "pool_pods": len(pods),
        "calls_per_run": args.calls,
        "warmup_per_run": args.warmup,
        "rounds": args.hook_rounds,
        "registered_hook_points": registered,
        "server_argv": server.argv,
        "server_rss_peak_mib": rss_peak_kib / 1024,
        "results": [{"target": t, "hook": point.value, "concurrency": n, **series[t, point, n].summary(point.value)}
                    for point in POINTS for n in CONCURRENCY for t in HOOK_TARGETS],
    }


# -- where a call's time goes, in-process ---------------------------------------------------------


@dataclass
class Clock:
    """Seconds spent, by what; counting only while `on`."""

    on: bool = False
    spent: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.record(name, time.perf_counter() - began)
        return run

    def record(self, name: str, seconds: float) -> None:
        if self.on:
            self.spent[name] = self.spent.get(name, 0.0) + seconds
            self.calls[name] = self.calls.get(name, 0) + 1


def inline_copy(plugin: Plugin, clock: Clock) -> Plugin:
    """The plugin with each handler wrapped in an async function that calls it inline (on the
    event loop, no thread) and clocks it under the plugin's name; same name, order and policy."""
    copy = Plugin(plugin.name, version=plugin.version, order=plugin.order, failure_policy=plugin.failure_policy,
                  timeout=plugin.timeout, state=plugin.state_factory, needs=plugin.needs)
    copy.settings_spec = plugin.settings_spec  # the same settings, defaults and all

    def inline(handler: Handler, name: str) -> Callable[..., Any]:
        async def call(**kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                result = handler.fn(**kwargs)
                return await result if inspect.isawaitable(result) else result  # built-ins are async def
            finally:
                clock.record(name, time.perf_counter() - began)
        return call

    for point, handler in plugin.handlers.items():
        copy.on(point)(inline(handler, plugin.name))
    if plugin.start_handler is not None:
        copy.on_start(inline(plugin.start_handler, "start"))
    return copy


def serve_call(point: HookPoint, data: bytes) -> Callable[[PluginRunner], Any]:
    """What RuntimeHooksServer does for one RPC after gRPC has the bytes: decode, convert,
    run the plugins, build the response, encode."""
    async def call(runner: PluginRunner) -> bytes:
        if point.kind is HookKind.POD:
            pod = pod_from_request(hook_pb.PodSandboxHookRequest.FromString(data))
            result = await runner.run(point, pod=pod)
            return bytes(pod_response(result.response).SerializeToString())
        request = hook_pb.ContainerResourceHookRequest.FromString(data)
        result = await runner.run(point, pod=pod_from_container_request(request),
                                  container=container_from_request(request))
        return bytes(container_response(result.response).SerializeToString())
    return call


async def _breakdown(args: argparse.Namespace, scratch: Path, policy_path: Path) -> dict[str, Any]:
    configure_logging("warning", "json")  # as quiet as the server's per-call logging (its debug lines are off)
    tree = make_fake_cgroup_v1(scratch / "cgroup-inproc", driver="cgroupfs")
    pods = fake_pods(tree, args.pool)
    requests = hook_requests(pods, IMAGE)
    policy = load_policy(policy_path, specs=installed_specs())
    clock = Clock()
    # Here the fake kernel is this process's own (the fake's fs()), as runtime-hooks' is its own.
    cgroups, resctrl = CgroupFS(str(tree.root), "cgroupfs"), make_fake_resctrl(scratch / "resctrl-inproc",
                                                                             **FAKE_RESCTRL).fs()
    # Path checks: every cgroup and resctrl path is resolved (os.path.realpath) and checked to
    # lie under its root. Clocked on these two objects only.
    # Every cgroup path a plugin uses is built and checked by these two (CgroupFS.path too).
    cgroups._path_text = clock.timed("path checks", cgroups._path_text)  # type: ignore[method-assign]
    cgroups._pod_path_text = clock.timed("path checks", cgroups._pod_path_text)  # type: ignore[method-assign]
    resctrl.group_path = clock.timed("path checks", resctrl.group_path)  # type: ignore[method-assign]
    context = ServerContext(cgroups=cgroups, resctrl=resctrl, policy=lambda: policy)
    plugins = [p for p in discover_plugins().plugins if p.name in PLUGINS]
    runners = {"threads": PluginRunner(plugins, context=context),
               "inline": PluginRunner([inline_copy(p, clock) for p in plugins], context=context)}
    for runner in runners.values():
        await runner.start()
    results: dict[str, Any] = {}
    clocked = time.perf_counter
    try:
        for point in POINTS:
            calls = [serve_call(point, base64.b64decode(text)) for text in requests[point]]
            for call in calls:  # first pass: the values the plugins set get written
                await call(runners["threads"])
            times: dict[str, list[float]] = {"threads": [], "inline": []}
            clock.spent.clear()
            clock.calls.clear()
            for n in range(2 * args.inproc_passes):
                mode = ("threads", "inline")[n % 2]
                clock.on = mode == "inline"
                for call in calls:
                    began = clocked()
                    await call(runners[mode])
                    times[mode].append(clocked() - began)
                clock.on = False
            inline_calls = len(times["inline"])
            results[point.value] = {
                "calls": inline_calls,
                "threads_p50_ms": percentile(sorted(times["threads"]), 0.5) * 1e3,
                "inline_p50_ms": percentile(sorted(times["inline"]), 0.5) * 1e3,
                "threads_mean_ms": statistics.fmean(times["threads"]) * 1e3,
                "inline_mean_ms": statistics.fmean(times["inline"]) * 1e3,
                "handler_mean_ms": {name: clock.spent[name] / inline_calls * 1e3 for name in PLUGINS
                                    if name in clock.spent},
                "path_checks_mean_ms": clock.spent.get("path checks", 0.0) / inline_calls * 1e3,
                "path_checks_per_call": clock.calls.get("path checks", 0) / inline_calls,
            }
    finally:
        for runner in runners.values():
            await runner.stop()
    return results


def in_process_breakdown(args: argparse.Namespace, scratch: Path, policy_path: Path) -> dict[str, Any]:
    """Per hook point, one call at a time in this process on its own fake trees: the server's
    work for a call without gRPC, with the plugins' sync handlers in threads as the server runs
    them, and inline; the handlers' own time; and the path checks inside them."""
    return asyncio.run(_breakdown(args, scratch, policy_path))


# -- part 2: pod start through the proxy and runtime-hooks ---------------------------------------


def read_quota(parent: str) -> str | None:
    with contextlib.suppress(OSError):
        return Path("/sys/fs/cgroup/cpu", parent.lstrip("/"), "cpu.cfs_quota_us").read_text().strip()
    return None


def run_pod_starts(args: argparse.Namespace, client: Client, work: Path, scratch: Path) -> dict[str, Any]:
    bed = Containerd(pod_network=False)
    stack: HookedProxy | None = None
    began = time.monotonic()
    try:
        bed.start()
        resctrl = fake_resctrl(scratch / "resctrl-pods")
        stack = HookedProxy.make(work, bed, resctrl, work / "policy.yaml", "hooks-pods")
        stack.start()
        proxy, server, proxy_url = stack.proxy, stack.hooks, stack.metrics_url
        # The proxy labels its hook metrics with the registration file's name.
        hooks_bench.REGISTRATION = REGISTRATION_FILE
        assert bed.pid is not None
        watch = {"proxy": proxy.pid, "runtime-hooks": server.pid, "containerd": bed.pid}
        sockets = {"direct": str(bed.socket), "proxy": str(proxy.socket)}
        started: list[dict[str, str]] = []

        def run_groups(groups: list[list[str]], label: str) -> tuple[list[str], dict[str, Any]]:
            """One pod per target of each group (an LS group, then a BE group...), in order."""
            order: list[str] = []
            specs: list[dict[str, str]] = []
            for k, group in enumerate(groups):
                kind = KINDS[k % 2]
                for target in group:
                    spec = pod_spec(bed, sockets[target], f"rhb-{label}-{len(specs)}-{target}", KUBE_QOS[kind])
                    specs.append({**spec, "kind": kind, "target": target})
                    order.append(target)
            started.extend(specs)
            return order, client.run(op="pods", image=bed.test_image, watch=watch, pods=specs)

        run_groups(interleaved(TARGETS, 0, 2 * args.warmup_pods), "warm")
        proxied = 2 * args.warmup_pods
        proxy_before = hooks_bench.wait_for_hook_calls(proxy_url, proxied * len(PROXIED_POINTS))
        plugins_before = PluginMetrics.scrape(server.metrics_url)
        background = background_cpus(2.0)
        setup_s = time.monotonic() - began

        series = {target: Series() for target in TARGETS}
        busy_before, total_before = machine_cpu_seconds()
        for n in range(args.rounds):
            order, answer = run_groups(interleaved(TARGETS, n, args.pods), str(n))
            for target in TARGETS:
                mine = [i for i, t in enumerate(order) if t == target]
                series[target].add([answer["steps"][i] for i in mine], [answer["teardown"][i] for i in mine],
                                   [answer["cpu_start"][i] for i in mine], [answer["cpu_teardown"][i] for i in mine])
            proxied += args.pods
            print(f"pod starts: round {n + 1}/{args.rounds} done", file=sys.stderr)
        busy_after, total_after = machine_cpu_seconds()
        pods_s = time.monotonic() - began - setup_s
        proxy_hooks = hooks_bench.wait_for_hook_calls(proxy_url, proxied * len(PROXIED_POINTS)).minus(proxy_before)
        plugins = PluginMetrics.scrape(server.metrics_url).minus(plugins_before)

        # Did the plugins act on the real cgroups? The cpu plugin gives a BE pod's cgroup the
        # batch quota at PreRunPodSandbox; the pod cgroup outlives the pod (runc leaves parents).
        be_pods = [pod for pod in started if pod["kind"] == "BE"]
        quotas = {t: [read_quota(pod["cgroup_parent"]) for pod in be_pods if pod["target"] == t] for t in TARGETS}
        # The resctrl plugin writes each started container's threads into its class's group (the fake
        # kernel lists them).
        joined = [name for name, _ in LAYOUTS[3] if (resctrl / name / "tasks").read_text().split()]
        per_hook = {point.value: proxy_hooks.summary([point.value]) for point in PROXIED_POINTS}
        return {
            "background_cpus": background,
            "machine_busy": (busy_after - busy_before) / (total_after - total_before),
            "rounds": args.rounds,
            "pods_per_round": args.pods,
            "warmup_pods": 2 * args.warmup_pods,
            "registered_hook_points": server.registered_points(),
            "server_argv": server.argv,
            "proxy_argv": proxy.argv,
            "series": {target: series[target].summary() for target in TARGETS},
            "comparison": compare(series["proxy"], series["direct"]),
            "proxy_hook_round_trip": per_hook,
            "in_series_mean_ms": sum(per_hook[p.value]["mean_ms"] for p in IN_SERIES),
            "plugin_mean_ms": {point.value: plugins.mean_ms(point.value) for point in PROXIED_POINTS},
            "plugin_failures": plugins.failures(),
            "proxy_hook_outcomes": {f"{hook} {outcome}": int(n) for (hook, outcome), n in proxy_hooks.outcomes.items()
                                    if n},
            "checks": {
                "be_pod_quota_written": {t: sum(q == BE_BATCH_QUOTA for q in quotas[t]) for t in TARGETS},
                "be_pods": {t: len(quotas[t]) for t in TARGETS},
                "resctrl_groups_written": joined,
            },
            "timings": {"setup_s": setup_s, "pods_s": pods_s},
        }
    finally:
        if stack is not None:
            stack.stop()
        bed.stop()


# -- output ---------------------------------------------------------------------------------


def print_hook_calls(part: dict[str, Any]) -> None:
    print()
    print("Part 1 -- hook calls per second: runtime-hooks serve, all built-in plugins (cpu, cpuset, memory, "
          "resctrl, network;")
    print("  network shaping off: policy network.interface \"\", so its handlers are filtered out (when=))")
    print(f"  cgroup root: {part['cgroup_root']}; {part['pool_pods']} pods, LS and BE in turn, one request "
          "per pod and hook point, sent in turn")
    print(f"  resctrl: {part['resctrl_root']}; no reconciler (--runtime-endpoint \"\")")
    print(f"  registered hook points: {', '.join(part['registered_hook_points'])}")
    print(f"  {part['rounds']} rounds x {part['calls_per_run']} timed calls per run (+{part['warmup_per_run']} "
          "warm-up); no-op = bench/hooks_server.py on the same requests (gRPC, decoding, an empty answer)")
    print()
    head = (f"{'hook point':<20}{'callers':>7}  {'server':<14}{'calls/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'client':>8}"
            f"{'server':>8}{'(sys)':>7}{'busy':>6}   p50 per round (ms)")
    print(f"{'':<67}{'CPU us per call':^23}")
    print(head)
    print("-" * len(head))
    for row in part["results"]:
        rounds = " ".join(f"{v:.2f}" for v in row["round_p50_ms"])
        print(f"{row['hook']:<20}{row['concurrency']:>7}  {row['target']:<14}{row['calls_per_s']:>8.0f}"
              f"{row['p50_ms']:>8.2f}{row['p99_ms']:>8.2f}{row['client_cpu_us_per_call']:>8.0f}"
              f"{row['server_cpu_us_per_call']:>8.0f}{row['server_system_cpu_us_per_call']:>7.0f}"
              f"{row['machine_busy']:>6.0%}   {rounds}")
    print()
    print("Inside runtime-hooks: each plugin's handler time per call as the runner times it (thread started,")
    print("handler run, result back on the event loop: runtimeproxy_hooks_plugin_call_duration_seconds, means")
    print("over the runs' calls), their sum, and the client's mean latency (ms)")
    head = f"{'hook point':<20}{'callers':>7}" + "".join(f"{p:>9}" for p in PLUGINS) + f"{'sum':>8}{'call mean':>11}"
    print(head)
    print("-" * len(head))
    rows = [row for row in part["results"] if row["target"] == "runtime-hooks"]
    for row in rows:
        cells = "".join(f"{row['plugin_mean_ms'][p]:>9.3f}" if p in row["plugin_mean_ms"] else f"{'-':>9}"
                        for p in PLUGINS)
        print(f"{row['hook']:<20}{row['concurrency']:>7}{cells}{row['plugins_sum_ms']:>8.3f}{row['mean_ms']:>11.3f}")
    failures = {k: v for row in rows for k, v in row["plugin_failures"].items()}
    print(f"Plugin calls not ok: {failures or 'none'}")
    print("What the plugins answered (first LS and BE request of each hook point; their cgroup and resctrl")
    print("writes are not in the answer):")
    for row in rows:
        if row["concurrency"] == CONCURRENCY[0]:
            for kind, text in row["answers"].items():
                print(f"  {row['hook']:<20} {kind}: {text}")
    print(f"runtime-hooks peak RSS: {part['server_rss_peak_mib']:.1f} MiB")


def print_breakdown(breakdown: dict[str, Any], part: dict[str, Any] | None) -> None:
    print()
    print("Where one call's time goes (one caller; in-process rows: this process, one call at a time, on its own")
    print("fake trees, alternating passes; ms). rpc / no-op: p50 through runtime-hooks / the no-op server (part 1);")
    print("server work: decode + plugins + answer without gRPC, sync handlers in threads as the server runs them;")
    print("inline: the same with every handler called on the event loop; handlers: their own time (mean); path")
    print("checks: of that, CgroupFS path building and checks / ResctrlFS.group_path (resolution + root check),"
          " mean and calls per call")
    head = (f"{'hook point':<20}{'rpc p50':>8}{'no-op':>7}{'server work':>12}{'inline':>8}{'handlers':>9}"
            f"{'path checks':>12}{'n':>4}   handlers by plugin")
    print(head)
    print("-" * len(head))
    rpc = {row["hook"]: row["p50_ms"] for row in (part or {}).get("results", [])
           if row["concurrency"] == 1 and row["target"] == "runtime-hooks"}
    noop = {row["hook"]: row["p50_ms"] for row in (part or {}).get("results", [])
            if row["concurrency"] == 1 and row["target"] == "no-op"}
    for hook, b in breakdown.items():
        handlers = b["handler_mean_ms"]
        by_plugin = ", ".join(f"{name} {ms:.3f}" for name, ms in handlers.items())
        print(f"{hook:<20}{rpc.get(hook, math.nan):>8.2f}{noop.get(hook, math.nan):>7.2f}{b['threads_p50_ms']:>12.3f}"
              f"{b['inline_p50_ms']:>8.3f}{sum(handlers.values()):>9.3f}{b['path_checks_mean_ms']:>12.3f}"
              f"{b['path_checks_per_call']:>4.0f}   {by_plugin}")


def print_pod_starts(part: dict[str, Any]) -> None:
    series, c = part["series"], part["comparison"]
    print()
    print(f"Part 2 -- pod start through the proxy with runtime-hooks (all built-in plugins; cgroup root "
          f"/sys/fs/cgroup, fake resctrl; reconciler on): {part['rounds']} rounds x {part['pods_per_round']} pods "
          f"per target, direct and proxied in alternation, LS and BE pods in turn (+{part['warmup_pods']} warm-up "
          f"pods each)")
    print(f"  registered hook points: {', '.join(part['registered_hook_points'])}")
    print(f"  background load before the runs: {part['background_cpus']:.2f} CPUs busy; during them the machine was "
          f"{part['machine_busy']:.0%} busy")
    print()
    hooks_bench.print_start_table(series, TARGETS, LABELS)
    print()
    print(f"proxy vs direct: p50 {c['start_p50_ratio']:.3f}x, mean {c['start_mean_ratio']:.3f}x; "
          f"paired (each pod against its direct neighbour, mean ± 95% CI): {fmt_paired(c['start_paired'])}")
    print("  by step: " + "; ".join(f"{step} {c['step_paired'][step]['mean_ms']:+.2f} ± "
                                    f"{c['step_paired'][step]['ci95_ms']:.2f} ms" for step in STEPS))
    print(f"  stop + remove (secondary): p50 {c['teardown_p50_ratio']:.3f}x, paired {fmt_paired(c['teardown_paired'])}")
    print()
    print("CPU per pod start, ms (from /proc around each pod, 10 ms ticks)")
    names = list(series["direct"]["cpu_ms_per_pod_start"])
    print(f"{'target':<23}" + "".join(f"{name:>15}" for name in names))
    for target in TARGETS:
        s = series[target]["cpu_ms_per_pod_start"]
        print(f"{LABELS[target]:<23}" + "".join(f"{s[name]:>15.1f}" for name in names))
    print()
    print("Hook round trips as the proxy times them (runtimeproxy_hook_duration_seconds, timed pods), and the")
    print("plugins' handler time inside runtime-hooks for the same calls (ms, means)")
    print(f"  {'hook point':<22}{'calls':>6}{'proxy mean':>11}{'p50':>8}{'plugins':>9}   by plugin")
    for hook, s in part["proxy_hook_round_trip"].items():
        plugins = part["plugin_mean_ms"].get(hook, {})
        where = ", ".join(f"{p} {v:.2f}" for p, v in plugins.items())
        print(f"  {hook:<22}{s['calls']:>6}{s['mean_ms']:>11.2f}{s['p50_ms']:>8.2f}{sum(plugins.values()):>9.2f}"
              f"   {where}")
    print(f"  the start waits for {' + '.join(p.value for p in IN_SERIES)}: {part['in_series_mean_ms']:.2f} ms "
          f"(PostStartContainer runs after StartContainer has answered)")
    print(f"  proxy's hook outcomes: {part['proxy_hook_outcomes']}; plugin calls not ok: "
          f"{part['plugin_failures'] or 'none'}")
    ch = part["checks"]
    print(f"  checks: BE pod cgroups with the batch quota {BE_BATCH_QUOTA} written by the cpu plugin: "
          + ", ".join(f"{t} {ch['be_pod_quota_written'][t]}/{ch['be_pods'][t]}" for t in TARGETS)
          + f"; fake resctrl groups given threads: {', '.join(ch['resctrl_groups_written']) or 'none'}")
    print()
    print("Target (reported, not asserted):")
    for label, key in (("p50", "start_p50_ratio"), ("mean", "start_mean_ratio")):
        value = c[key]
        print(f"  pod start {label} proxy/direct <= {TARGET_START_RATIO}x   {value:.3f}x   "
              f"{verdict(value <= TARGET_START_RATIO)}")
    paired = c["start_paired"]
    direct_mean = series["direct"]["start"]["mean_ms"]
    ratio = 1 + paired["mean_ms"] / direct_mean
    low, high = (1 + (paired["mean_ms"] + sign * paired["ci95_ms"]) / direct_mean for sign in (-1, 1))
    print(f"  paired: 1 + added / direct mean = {ratio:.3f}x (95% CI {low:.3f}x..{high:.3f}x)   "
          f"{verdict(ratio <= TARGET_START_RATIO)}")


# -- the run --------------------------------------------------------------------------------


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    began = time.monotonic()
    report: dict[str, Any] = {"environment": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                              "policy_overlay": POLICY}}
    client: Client | None = None
    with workdir() as work, scratch_dir() as scratch:
        (work / "policy.yaml").write_text(POLICY)
        try:
            report["environment"]["background_cpus"] = background_cpus(2.0)
            client = Client(CLIENT_SCRIPT)
            if not args.skip_calls:
                report["hook_calls"] = run_hook_calls(args, client, work, scratch)
                report["breakdown"] = in_process_breakdown(args, scratch, work / "policy.yaml")
            calls_done = time.monotonic()
            if not args.skip_pods:
                report["pod_starts"] = run_pod_starts(args, client, work, scratch)
            report["timings"] = {"hook_calls_s": calls_done - began, "pod_starts_s": time.monotonic() - calls_done}
        finally:
            if client is not None:
                client.close()
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=600, help="timed hook calls per run (default 600)")
    parser.add_argument("--warmup", type=int, default=64, help="untimed hook calls before each run (default 64)")
    parser.add_argument("--hook-rounds", type=int, default=2, help="rounds of hook-call runs (default 2)")
    parser.add_argument("--pool", type=int, default=64, help="fake pods the hook requests are for (default 64)")
    parser.add_argument("--inproc-passes", type=int, default=4,
                        help="in-process passes over the pool per hook point and mode (default 4)")
    parser.add_argument("--pods", type=int, default=10, help="timed pods per round and target (default 10)")
    parser.add_argument("--rounds", type=int, default=6, help="pod-start rounds (default 6)")
    parser.add_argument("--warmup-pods", type=int, default=1,
                        help="untimed pods per target and kind (LS, BE) first (default 1)")
    parser.add_argument("--skip-calls", action="store_true", help="leave out part 1 (hook calls per second)")
    parser.add_argument("--skip-pods", action="store_true", help="leave out part 2 (pod start)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    counts = (args.calls, args.hook_rounds, args.pods, args.rounds, args.warmup_pods, args.inproc_passes)
    if min(counts) < 1 or args.pool < 2:
        parser.error("counts must be at least 1 (--pool at least 2)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    report = timed_run("runtime_hooks_bench.py", run_bench, args)
    print(f"\nruntime-hooks bench: {report['environment']['cpus']} CPUs, Python {report['environment']['python']}; "
          f"background load before the runs: {report['environment']['background_cpus']:.2f} CPUs busy")
    if "hook_calls" in report:
        print_hook_calls(report["hook_calls"])
        print_breakdown(report["breakdown"], report["hook_calls"])
    if "pod_starts" in report:
        print_pod_starts(report["pod_starts"])
    t = report["timings"]
    print(f"\nWall time: hook calls {t['hook_calls_s']:.1f} s, pod starts {t['pod_starts_s']:.1f} s, "
          f"total {t['total_s']:.1f} s")
    write_figures(args.json, report)


if __name__ == "__main__":
    main()
