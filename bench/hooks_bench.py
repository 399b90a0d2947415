"""What the hook layer costs a pod start: runtime-proxy with a no-op hook server on every
hook point, against a real containerd.

    python bench/hooks_bench.py [--pods N] [--rounds R] [--probe-calls N] [--json FILE]

It starts the test bed's containerd, a no-op hook server (bench/hooks_server.py, its own
process) registered for every hook point, and the proxy through its real command line.
A separate client process (bench/hooks_client.py) starts pods (RunPodSandbox +
CreateContainer + StartContainer) directly on containerd and through the proxy in
alternating rounds, then stops and removes them; it also times PreCreateContainerHook on
the hook server directly. The hook round trip as the proxy sees it comes from its
Prometheus histogram. See bench/README.md ("Hooks benchmark").
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from relay_bench import (
    Client,
    Proxy,
    Service,
    background_cpus,
    mean_ci95,
    percentile,
    timed_run,
    verdict,
    workdir,
    write_figures,
)
from relay_client import machine_cpu_seconds
from runtimeproxy.hooks.server import write_registration

from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.testbed import Containerd
from runtimeproxy.testbed.daemons import free_port

BENCH_DIR = Path(__file__).resolve().parent
CLIENT_SCRIPT = BENCH_DIR / "hooks_client.py"
SERVER_SCRIPT = BENCH_DIR / "hooks_server.py"
TARGETS = ("direct", "bare", "proxy")
LABELS = {"direct": "direct", "bare": "proxy, no hooks", "proxy": "proxy"}
COMPARISONS = (("proxy_vs_direct", "proxy vs direct"), ("bare_vs_direct", "proxy, no hooks vs direct"),
               ("proxy_vs_bare", "proxy vs proxy, no hooks"))
QOS = ("besteffort", "burstable", "guaranteed")
REGISTRATION = "noop.json"  # the registration file's name is the server's label in the metrics

# Hook points a pod start and a pod teardown go through, in call order.
START_PATH = (HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_CREATE_CONTAINER,
              HookPoint.PRE_START_CONTAINER, HookPoint.POST_START_CONTAINER)
TEARDOWN_PATH = (HookPoint.PRE_STOP_CONTAINER, HookPoint.POST_STOP_CONTAINER, HookPoint.POST_STOP_POD_SANDBOX,
                 HookPoint.PRE_REMOVE_POD_SANDBOX, HookPoint.POST_REMOVE_POD_SANDBOX)
EXERCISED = START_PATH + TEARDOWN_PATH
# Hooks whose round trip the client waits for: the pre-hooks, and post-hooks followed by a call
# on the same object, because the proxy holds the object's key until its post-hooks are done
# (StartContainer waits for PostCreateContainer, RemoveContainer for PostStopContainer,
# RemovePodSandbox for PostStopPodSandbox). PostStartContainer and PostRemovePodSandbox run
# after the client has its answer.
IN_SERIES = {
    "start": (HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_CREATE_CONTAINER,
              HookPoint.PRE_START_CONTAINER),
    "teardown": (HookPoint.PRE_STOP_CONTAINER, HookPoint.POST_STOP_CONTAINER, HookPoint.POST_STOP_POD_SANDBOX,
                 HookPoint.PRE_REMOVE_POD_SANDBOX),
}
STEPS = ("RunPodSandbox", "CreateContainer", "StartContainer")
HISTOGRAM = "runtimeproxy_hook_duration_seconds"
OUTCOMES = "runtimeproxy_hook_calls_total"

# Printed next to the figures; the bench reports, it only asserts that the hooks ran.
TARGET_START_RATIO = 1.03
TARGET_HOOK_P50_MS = 1.0
SPACED_PROBE_CALLS = 300
SPACED_PROBE_GAP = 0.01  # s of idle between spaced probes, as between a pod start's hook calls


# -- processes ------------------------------------------------------------------------------


class HookServer(Service):
    """bench/hooks_server.py; the call counts it prints on stdout are read once it stopped."""

    def __init__(self, work: Path) -> None:
        self.socket = work / "hooks.sock"
        super().__init__(work, "hooks-server", [sys.executable, str(SERVER_SCRIPT), str(self.socket)],
                         split_output=True)

    def counts(self) -> dict[str, dict[str, int]]:
        """The counts it printed on SIGTERM ({} if it printed none, or had to be killed)."""
        if self.daemon is None or self.daemon.proc.returncode != 0:
            return {}
        lines = self.daemon.stdout().strip().splitlines()
        counts: dict[str, dict[str, int]] = json.loads(lines[-1]) if lines else {}
        return counts


def register_hook_server(hook_dir: Path, endpoint: Path) -> None:
    """Register the no-op server for every hook point."""
    config = {"remote-endpoint": str(endpoint), "failure-policy": "Ignore",
              "runtime-hooks": [point.value for point in HookPoint]}
    write_registration(str(hook_dir), REGISTRATION, config)


# -- the proxy's metrics --------------------------------------------------------------------


class HookMetrics:
    """runtimeproxy_hook_duration_seconds and runtimeproxy_hook_calls, by hook point."""

    def __init__(self) -> None:
        self.buckets: dict[str, dict[float, float]] = {}  # hook -> le -> cumulative count
        self.sums: dict[str, float] = {}
        self.counts: dict[str, float] = {}
        self.outcomes: dict[tuple[str, str], float] = {}  # (hook, outcome) -> calls

    @classmethod
    def scrape(cls, url: str) -> HookMetrics:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        metrics = cls()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if labels.get("server", REGISTRATION) != REGISTRATION:
                    continue
                hook = labels.get("hook", "")
                if sample.name == HISTOGRAM + "_bucket":
                    metrics.buckets.setdefault(hook, {})[float(labels["le"])] = sample.value
                elif sample.name == HISTOGRAM + "_sum":
                    metrics.sums[hook] = sample.value
                elif sample.name == HISTOGRAM + "_count":
                    metrics.counts[hook] = sample.value
                elif sample.name == OUTCOMES:
                    metrics.outcomes[hook, labels["outcome"]] = sample.value
        return metrics

    def minus(self, earlier: HookMetrics) -> HookMetrics:
        """What happened between `earlier` and this scrape."""
        diff = HookMetrics()
        for hook, buckets in self.buckets.items():
            before = earlier.buckets.get(hook, {})
            diff.buckets[hook] = {le: n - before.get(le, 0.0) for le, n in buckets.items()}
        diff.sums = {hook: v - earlier.sums.get(hook, 0.0) for hook, v in self.sums.items()}
        diff.counts = {hook: v - earlier.counts.get(hook, 0.0) for hook, v in self.counts.items()}
        diff.outcomes = {key: v - earlier.outcomes.get(key, 0.0) for key, v in self.outcomes.items()}
        return diff

    def calls(self) -> float:
        return sum(self.counts.values())

    def summary(self, hooks: Sequence[str]) -> dict[str, Any]:
        """Calls, exact mean (sum / count) and bucket-interpolated p50 / p99 over `hooks`."""
        buckets: dict[float, float] = {}
        for hook in hooks:
            for le, n in self.buckets.get(hook, {}).items():
                buckets[le] = buckets.get(le, 0.0) + n
        calls = sum(self.counts.get(hook, 0.0) for hook in hooks)
        total = sum(self.sums.get(hook, 0.0) for hook in hooks)
        return {
            "calls": int(calls),
            "mean_ms": total / calls * 1e3 if calls else math.nan,
            "p50_ms": histogram_quantile(buckets, 0.5) * 1e3,
            "p99_ms": histogram_quantile(buckets, 0.99) * 1e3,
            "buckets": {("+Inf" if math.isinf(le) else f"{le:g}"): int(n) for le, n in sorted(buckets.items())},
        }


def histogram_quantile(buckets: dict[float, float], q: float) -> float:
    """Prometheus' histogram_quantile: linear within the bucket holding rank q * count
    (the first bucket starts at 0); the highest finite bound if it falls into +Inf."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return math.nan
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for le, cumulative in ordered:
        if cumulative >= rank:
            if math.isinf(le):
                return lower
            if cumulative == below:
                return le
            return lower + (le - lower) * (rank - below) / (cumulative - below)
        lower, below = le, cumulative
    return lower


def wait_for_hook_calls(url: str, expected: float, timeout: float = 10.0) -> HookMetrics:
    """Scrape until the proxy has recorded `expected` hook calls (post-hooks run after the
    client got its answer), or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = HookMetrics.scrape(url)
        if metrics.calls() >= expected or time.monotonic() > deadline:
            return metrics
        time.sleep(0.05)


def wait_for_metrics(url: str, service: Service, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            HookMetrics.scrape(url)
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no metrics at {url}: {exc}\n{service.log_tail()}") from None
            time.sleep(0.05)


# -- figures --------------------------------------------------------------------------------


def stats_ms(seconds: Sequence[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "n": len(ordered),
        "p50_ms": percentile(ordered, 0.5) * 1e3,
        "p90_ms": percentile(ordered, 0.9) * 1e3,
        "p99_ms": percentile(ordered, 0.99) * 1e3,
        "mean_ms": statistics.fmean(ordered) * 1e3 if ordered else math.nan,
        "min_ms": ordered[0] * 1e3 if ordered else math.nan,
        "max_ms": ordered[-1] * 1e3 if ordered else math.nan,
    }


def paired(later: Sequence[float], earlier: Sequence[float]) -> dict[str, float]:
    """later[i] - earlier[i] over pods started next to each other: mean with its 95%
    confidence half-width (normal approximation), and median, in ms."""
    diffs = [(a - b) * 1e3 for a, b in zip(later, earlier, strict=True)]
    mean, half = mean_ci95(diffs)
    return {"mean_ms": mean, "ci95_ms": half, "median_ms": statistics.median(diffs)}


class Series:
    """Every timed pod of one target, pooled over the rounds, in start order."""

    def __init__(self) -> None:
        self.steps: list[list[float]] = []
        self.teardown: list[float] = []
        self.round_p50_ms: list[float] = []
        self.cpu_start: dict[str, float] = {}
        self.cpu_teardown: dict[str, float] = {}

    def add(self, steps: list[list[float]], teardown: list[float], cpu_start: list[dict[str, float]],
            cpu_teardown: list[dict[str, float]]) -> None:
        self.steps += steps
        self.teardown += teardown
        self.round_p50_ms.append(percentile(sorted(sum(s) for s in steps), 0.5) * 1e3)
        for mine, theirs in ((self.cpu_start, cpu_start), (self.cpu_teardown, cpu_teardown)):
            for pod in theirs:
                for name, seconds in pod.items():
                    mine[name] = mine.get(name, 0.0) + seconds

    @property
    def starts(self) -> list[float]:
        return [sum(s) for s in self.steps]

    def summary(self) -> dict[str, Any]:
        pods = len(self.steps)
        return {
            "start": stats_ms(self.starts),
            "steps": {name: stats_ms([s[n] for s in self.steps]) for n, name in enumerate(STEPS)},
            "teardown": stats_ms(self.teardown),
            "round_p50_ms": self.round_p50_ms,
            "cpu_ms_per_pod_start": {k: v / pods * 1e3 for k, v in self.cpu_start.items()},
            "cpu_ms_per_pod_teardown": {k: v / pods * 1e3 for k, v in self.cpu_teardown.items()},
        }


def compare(later: Series, earlier: Series) -> dict[str, Any]:
    a, b = later.summary(), earlier.summary()
    return {
        "start_p50_ratio": a["start"]["p50_ms"] / b["start"]["p50_ms"],
        "start_mean_ratio": a["start"]["mean_ms"] / b["start"]["mean_ms"],
        "start_added_p50_ms": a["start"]["p50_ms"] - b["start"]["p50_ms"],
        "start_added_mean_ms": a["start"]["mean_ms"] - b["start"]["mean_ms"],
        "start_paired": paired(later.starts, earlier.starts),
        "step_paired": {name: paired([s[n] for s in later.steps], [s[n] for s in earlier.steps])
                        for n, name in enumerate(STEPS)},
        "step_added_p50_ms": {s: a["steps"][s]["p50_ms"] - b["steps"][s]["p50_ms"] for s in STEPS},
        "teardown_p50_ratio": a["teardown"]["p50_ms"] / b["teardown"]["p50_ms"],
        "teardown_mean_ratio": a["teardown"]["mean_ms"] / b["teardown"]["mean_ms"],
        "teardown_paired": paired(later.teardown, earlier.teardown),
    }


# -- the run --------------------------------------------------------------------------------


def pod_spec(bed: Containerd, socket_path: str, name: str, qos: str) -> dict[str, str]:
    uid = uuid.uuid4().hex
    return {"socket": socket_path, "uid": uid, "name": name, "cgroup_parent": bed.cgroup_parent(uid, qos),
            "log_directory": str(bed.root_dir / "pod-logs" / uid)}


def interleaved(targets: Sequence[str], first: int, count: int) -> list[list[str]]:
    """`count` groups of one pod per target; group k starts with targets[(first + k) % n]."""
    n = len(targets)
    return [[targets[(first + k + i) % n] for i in range(n)] for k in range(count)]


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    began = time.monotonic()
    bed = Containerd(pod_network=False)
    server: HookServer | None = None
    proxy: Proxy | None = None
    bare: Proxy | None = None
    client: Client | None = None
    with workdir() as work:
        try:
            bed.start()
            server = HookServer(work)
            server.start()
            port = free_port()
            proxy = Proxy(work, bed.address)
            register_hook_server(proxy.hook_dir, server.socket)
            bare = Proxy(work, bed.address, name="bare")  # the same, with an empty hook directory
            for each in (proxy, bare):
                each.argv += ["--cgroup-parent-root", f"/{bed.cgroup_prefix}"]
            proxy.argv += ["--metrics-address", f"127.0.0.1:{port}"]
            proxy.start()
            bare.start()
            metrics_url = f"http://127.0.0.1:{port}/metrics"
            wait_for_metrics(metrics_url, proxy)
            client = Client(CLIENT_SCRIPT)
            assert bed.pid is not None
            watch = {"proxy": proxy.pid, "proxy (no hooks)": bare.pid, "hook server": server.pid,
                     "containerd": bed.pid}
            sockets = {"direct": str(bed.socket), "proxy": str(proxy.socket), "bare": str(bare.socket)}
            qos = itertools.cycle(QOS)

            def run_groups(groups: list[list[str]], label: str) -> tuple[list[str], dict[str, Any]]:
                """Start, then stop and remove, one pod per target of each group, in order."""
                assert client is not None
                order = [target for group in groups for target in group]
                specs = [pod_spec(bed, sockets[t], f"hb-{label}-{n}-{t}", next(qos)) for n, t in enumerate(order)]
                return order, client.run(op="pods", image=bed.test_image, watch=watch, pods=specs)

            # Warm-up, untimed: the image's first containers, each proxy's backend channel, the
            # proxy's channel to the hook server.
            run_groups(interleaved(TARGETS, 0, args.warmup_pods), "warm")
            proxied_pods = args.warmup_pods
            metrics_before = wait_for_hook_calls(metrics_url, proxied_pods * len(EXERCISED))
            background = background_cpus(2.0)
            setup_done = time.monotonic()

            series = {target: Series() for target in TARGETS}
            busy_before, total_before = machine_cpu_seconds()
            for n in range(args.rounds):
                order, answer = run_groups(interleaved(TARGETS, n * args.pods, args.pods), str(n))
                for target in TARGETS:
                    mine = [i for i, t in enumerate(order) if t == target]
                    series[target].add([answer["steps"][i] for i in mine], [answer["teardown"][i] for i in mine],
                                       [answer["cpu_start"][i] for i in mine],
                                       [answer["cpu_teardown"][i] for i in mine])
                proxied_pods += args.pods
                print(f"round {n + 1}/{args.rounds} done", file=sys.stderr)
            busy_after, total_after = machine_cpu_seconds()
            load_done = time.monotonic()
            metrics_after = wait_for_hook_calls(metrics_url, proxied_pods * len(EXERCISED))
            hook_metrics = metrics_after.minus(metrics_before)

            probe = client.run(op="probe", socket=str(server.socket), calls=args.probe_calls, warmup=200)
            spaced = client.run(op="probe", socket=str(server.socket), calls=SPACED_PROBE_CALLS, warmup=20,
                                gap=SPACED_PROBE_GAP)
            probe_done = time.monotonic()

            client.close()
            client = None
            argv, proxy_log = proxy.argv, proxy.log_tail(5)
            for each in (proxy, bare):
                each.stop()
            proxy = bare = None
            server.stop()
            counts = server.counts()
            server = None

            per_hook = {point.value: hook_metrics.summary([point.value]) for point in EXERCISED}
            outcomes: dict[str, dict[str, int]] = {}
            for (hook, outcome), value in metrics_after.outcomes.items():
                if value:
                    outcomes.setdefault(hook, {})[outcome] = int(value)
            return {
                "environment": {
                    "cpus": os.cpu_count(),
                    "rounds": args.rounds,
                    "pods_per_round": args.pods,
                    "warmup_pods": args.warmup_pods,
                    "background_cpus": background,
                    "machine_busy": (busy_after - busy_before) / (total_after - total_before),
                    "python": sys.version.split()[0],
                    "proxy_argv": argv,
                    "hook_points_registered": [point.value for point in HookPoint],
                    "proxy_log_tail": proxy_log,
                },
                "targets": {"start_ratio": TARGET_START_RATIO, "hook_p50_ms": TARGET_HOOK_P50_MS},
                "series": {target: series[target].summary() for target in TARGETS},
                "comparison": {
                    "proxy_vs_direct": compare(series["proxy"], series["direct"]),
                    "bare_vs_direct": compare(series["bare"], series["direct"]),
                    "proxy_vs_bare": compare(series["proxy"], series["bare"]),
                    "hooks_in_series": {path: [p.value for p in points] for path, points in IN_SERIES.items()},
                    "hooks_in_series_mean_ms": {path: sum(per_hook[p.value]["mean_ms"] for p in points)
                                                for path, points in IN_SERIES.items()},
                },
                "hook_round_trip": {
                    "proxy_metrics": {
                        "start_path": hook_metrics.summary([p.value for p in START_PATH]),
                        "teardown_path": hook_metrics.summary([p.value for p in TEARDOWN_PATH]),
                        "all": hook_metrics.summary([p.value for p in EXERCISED]),
                        "per_hook": per_hook,
                    },
                    "client_probe": {"rpc": "PreCreateContainerHook", **stats_ms(probe["latencies"])},
                    "client_probe_spaced": {"rpc": "PreCreateContainerHook", "gap_ms": SPACED_PROBE_GAP * 1e3,
                                            **stats_ms(spaced["latencies"])},
                },
                "hook_calls": {
                    "server_counted": counts.get("calls", {}),
                    "server_counted_probes": counts.get("probes", {}),
                    "proxy_outcomes": outcomes,
                    "expected_per_exercised_point": proxied_pods,
                    "exercised": [point.value for point in EXERCISED],
                },
                "timings": {"setup_s": setup_done - began, "pods_s": load_done - setup_done,
                            "probe_s": probe_done - load_done},
            }
        finally:
            if client is not None:
                client.close()
            for leftover in (proxy, bare):
                if leftover is not None:
                    leftover.stop()
            if server is not None:
                server.stop()
            bed.stop()


def check_hook_calls(report: dict[str, Any]) -> list[str]:
    """Hook points the run went through that the hook server never saw (should be none)."""
    counted = report["hook_calls"]["server_counted"]
    return [point for point in report["hook_calls"]["exercised"] if counted.get(point, 0) <= 0]


# -- output ---------------------------------------------------------------------------------


def fmt_paired(p: dict[str, float]) -> str:
    return f"{p['mean_ms']:+.1f} ± {p['ci95_ms']:.1f} ms (median {p['median_ms']:+.1f})"


def print_start_table(series: dict[str, Any], targets: Sequence[str], labels: dict[str, str]) -> None:
    """The pod-start table: one row a target, with the step p50s and each round's p50."""
    width = max(len(labels[t]) for t in targets) + 2
    print("Pod start = RunPodSandbox + CreateContainer + StartContainer, one pod at a time (ms)")
    head = (f"{'target':<{width}}{'pods':>5}{'p50':>8}{'mean':>8}{'p90':>8}{'min':>8}{'max':>8}   "
            f"{'Run p50':>8}{'Create p50':>11}{'Start p50':>10}   p50 per round")
    print(head)
    print("-" * len(head))
    for target in targets:
        s = series[target]
        st, steps = s["start"], s["steps"]
        rounds = " ".join(f"{v:.1f}" for v in s["round_p50_ms"])
        print(f"{labels[target]:<{width}}{st['n']:>5}{st['p50_ms']:>8.1f}{st['mean_ms']:>8.1f}{st['p90_ms']:>8.1f}"
              f"{st['min_ms']:>8.1f}{st['max_ms']:>8.1f}   {steps['RunPodSandbox']['p50_ms']:>8.1f}"
              f"{steps['CreateContainer']['p50_ms']:>11.1f}{steps['StartContainer']['p50_ms']:>10.1f}   {rounds}")


def print_report(report: dict[str, Any]) -> None:
    env, comparison, series = report["environment"], report["comparison"], report["series"]
    print()
    print(f"runtime-proxy hooks bench: {env['cpus']} CPUs; {env['rounds']} rounds x {env['pods_per_round']} pods "
          f"per target, interleaved pod by pod (+{env['warmup_pods']} warm-up pods each); one no-op hook server "
          f"registered for all {len(env['hook_points_registered'])} hook points")
    print("Targets: direct = containerd's socket; proxy = runtime-proxy with the hook server; proxy, no hooks = "
          "a second runtime-proxy with an empty --hook-config-dir")
    print(f"Background load before the runs: {env['background_cpus']:.2f} CPUs busy; during them the machine "
          f"was {env['machine_busy']:.0%} busy")
    print()
    print_start_table(series, TARGETS, LABELS)
    print()
    print("Added time, paired (each pod against its neighbour of the other target; mean ± 95% CI):")
    for key, label in COMPARISONS:
        c = comparison[key]
        print(f"  {label:<27} p50 {c['start_p50_ratio']:.3f}x, mean {c['start_mean_ratio']:.3f}x; "
              f"pod start {fmt_paired(c['start_paired'])}")
        print(f"  {'':<27} by step: " + "; ".join(
            f"{step} {c['step_paired'][step]['mean_ms']:+.2f} ± {c['step_paired'][step]['ci95_ms']:.2f}"
            for step in STEPS))
    print()
    print("Stop + remove = StopContainer + RemoveContainer + StopPodSandbox + RemovePodSandbox (ms, secondary)")
    for target in TARGETS:
        t = series[target]["teardown"]
        print(f"{LABELS[target]:<17}{t['n']:>5}{t['p50_ms']:>8.1f}{t['mean_ms']:>8.1f}{t['p90_ms']:>8.1f}"
              f"{t['min_ms']:>8.1f}{t['max_ms']:>8.1f}")
    for key, label in COMPARISONS:
        c = comparison[key]
        print(f"  {label:<27} p50 {c['teardown_p50_ratio']:.3f}x, mean {c['teardown_mean_ratio']:.3f}x; "
              f"paired {fmt_paired(c['teardown_paired'])}")
    print()
    print("CPU per pod, ms: start | stop + remove (from /proc around each pod, 10 ms ticks)")
    names = list(series["direct"]["cpu_ms_per_pod_start"])
    print(f"{'target':<17}" + "".join(f"{name:>20}" for name in names))
    for target in TARGETS:
        s = series[target]
        print(f"{LABELS[target]:<17}" + "".join(
            f"{s['cpu_ms_per_pod_start'][n]:>11.1f} |{s['cpu_ms_per_pod_teardown'][n]:>6.1f} " for n in names))
    print()
    rt = report["hook_round_trip"]
    pm = rt["proxy_metrics"]
    print("Hook round trip as the proxy times it (runtimeproxy_hook_duration_seconds, timed pods only;")
    print("mean = sum / count; p50 and p99 interpolated within the buckets 0.5, 1, 2.5, 5, 10, 25 ms ...)")
    print(f"  {'hook':<28}{'calls':>6}{'mean ms':>9}{'p50 ms':>8}{'p99 ms':>8}")
    for hook, s in pm["per_hook"].items():
        print(f"  {hook:<28}{s['calls']:>6}{s['mean_ms']:>9.3f}{s['p50_ms']:>8.3f}{s['p99_ms']:>8.3f}")
    for label, key in (("start path (5 hooks)", "start_path"), ("teardown path (5 hooks)", "teardown_path"),
                       ("all", "all")):
        s = pm[key]
        print(f"  {label:<28}{s['calls']:>6}{s['mean_ms']:>9.3f}{s['p50_ms']:>8.3f}{s['p99_ms']:>8.3f}")
    print(f"  cumulative buckets, all (s: calls): {pm['all']['buckets']}")
    print("Hook round trip measured from the client process, straight to the hook server (ms):")
    for key, label in (("client_probe", "back to back"), ("client_probe_spaced", "10 ms idle between calls")):
        p = rt[key]
        print(f"  {p['rpc']}, {label:<25} {p['n']:>5} calls: p50 {p['p50_ms']:.3f}, mean {p['mean_ms']:.3f}, "
              f"p90 {p['p90_ms']:.3f}, p99 {p['p99_ms']:.3f}, max {p['max_ms']:.3f}")
    print()
    hc = report["hook_calls"]
    print(f"Hook calls the hook server counted (expected {hc['expected_per_exercised_point']} on each point this "
          f"run goes through: every proxied pod, warm-up included) and the proxy's outcomes (runtimeproxy_hook_calls)")
    for point in HookPoint:
        counted = hc["server_counted"].get(point.value, 0)
        note = "" if point.value in hc["exercised"] else "   (not on this run's path)"
        outcome = ", ".join(f"{k} {v}" for k, v in sorted(hc["proxy_outcomes"].get(point.value, {}).items()))
        print(f"  {point.value:<30}{counted:>5}   {outcome}{note}")
    print(f"  direct probes from the client, counted apart: {hc['server_counted_probes']}")
    print()
    print("Targets (reported, not asserted):")
    c = comparison["proxy_vs_direct"]
    rows = (
        (f"pod start p50 proxy/direct <= {TARGET_START_RATIO}x", c["start_p50_ratio"], "x", TARGET_START_RATIO),
        (f"pod start mean proxy/direct <= {TARGET_START_RATIO}x", c["start_mean_ratio"], "x", TARGET_START_RATIO),
        (f"hook round trip p50 <= {TARGET_HOOK_P50_MS} ms (client)", rt["client_probe"]["p50_ms"], " ms",
         TARGET_HOOK_P50_MS),
        (f"hook round trip p50 <= {TARGET_HOOK_P50_MS} ms (proxy)", pm["all"]["p50_ms"], " ms", TARGET_HOOK_P50_MS),
    )
    for label, value, unit, goal in rows:
        print(f"  {label:<45}{value:.3f}{unit:<4}{verdict(value <= goal)}")
    print()
    series_ms = comparison["hooks_in_series_mean_ms"]
    bare = comparison["proxy_vs_bare"]
    print("Hooks the client waits for, and their mean round trips in the proxy added up, against the paired "
          "added time (proxy vs proxy, no hooks):")
    print(f"  pod start:    {', '.join(comparison['hooks_in_series']['start'])}: {series_ms['start']:.2f} ms; "
          f"measured {fmt_paired(bare['start_paired'])}")
    print(f"  stop+remove:  {', '.join(comparison['hooks_in_series']['teardown'])}: {series_ms['teardown']:.2f} ms; "
          f"measured {fmt_paired(bare['teardown_paired'])}")
    t = report["timings"]
    print(f"Wall time: set-up and warm-up {t['setup_s']:.1f} s, pods {t['pods_s']:.1f} s, probes {t['probe_s']:.1f} s, "
          f"total {t['total_s']:.1f} s")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=10, help="timed pods per round and target (default 10)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (default 6)")
    parser.add_argument("--warmup-pods", type=int, default=2, help="untimed pods per target first (default 2)")
    parser.add_argument("--probe-calls", type=int, default=2000,
                        help="timed back-to-back PreCreateContainerHook calls from the client (default 2000)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.pods < 1 or args.rounds < 1 or args.warmup_pods < 1 or args.probe_calls < 1:
        parser.error("--pods, --rounds, --warmup-pods and --probe-calls must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    report = timed_run("hooks_bench.py", run_bench, args)
    print_report(report)
    write_figures(args.json, report)
    missing = check_hook_calls(report)
    if missing:
        sys.exit(f"the hook server was never called for: {', '.join(missing)}")


if __name__ == "__main__":
    main()
