"""Latency, throughput, CPU and memory of runtime-proxy against a real containerd.

    python bench/relay_bench.py [--calls N] [--rounds R] [--hop] [--json FILE] [--profile PSTATS]
    python bench/relay_bench.py --pool FILE [FILE ...]

It starts the test bed's containerd, fills it with pods and containers, starts the proxy
through its real command line, then times CRI calls from a separate client process
(bench/relay_client.py) against containerd's socket directly and through the proxy, in
alternating rounds. See bench/README.md for the method and how to read the output.

Throughput moves between runs more than the relay's cost does (on a 2-core VM, short default
runs' ratios at 16 callers spanned 0.80-1.05x, single rounds 0.65-1.41x), so each
round's proxy run is also paired with its direct run: the mean of those per-round ratios
comes with its 95% interval, and ``--pool`` reads the --json files of several runs and prints
the per-round ratios of all of them pooled.

``--hop`` adds a third target: socat copying the bytes of one connection to containerd, with
no parsing and no Python. What it costs is what any process in between costs here (the
kernel's socket work and the wake-ups of one more hop), the floor under the proxy's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import hpack
from relay_client import machine_cpu_seconds  # bench/ is on sys.path when run as a script

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.testbed import Containerd
from runtimeproxy.testbed.daemons import Daemon, proc_status_kib, stop_process
from runtimeproxy.testbed.serve_args import proxy_serve_args

BENCH_DIR = Path(__file__).resolve().parent
CLIENT_SCRIPT = BENCH_DIR / "relay_client.py"
METHODS = ("Version", "ListContainers")
CONCURRENCY = (1, 16)
TARGETS = ("direct", "proxy")
HOP = "hop"  # --hop: a bare byte relay (ByteRelay) as a third target
COMPARISONS = {"proxy": "comparison", HOP: "hop_comparison"}  # a result row's key for each against direct

# The project's targets, printed next to the figures; the bench reports, it does not assert.
TARGET_ADDED_P50_MS = 0.15
TARGET_THROUGHPUT_RATIO_AT_16 = 0.9
TARGET_RSS_MIB = 40.0
PROFILE_ENV = "RELAY_BENCH_PROFILE"
# Run the CLI's own main() under cProfile, timing CPU (not wall) time, until SIGTERM.
PROFILED_MAIN = f"""
import cProfile, os, sys, time
from runtimeproxy.proxy.cli import main
sys.argv[0] = "runtime-proxy"
profile = cProfile.Profile(time.thread_time)
try:
    profile.runcall(main)
except SystemExit:
    pass
finally:
    profile.dump_stats(os.environ["{PROFILE_ENV}"])
"""


# -- processes and /proc ----------------------------------------------------------------


def background_cpus(seconds: float) -> float:
    """CPUs' worth of time the whole machine is busy over `seconds` (before our load)."""
    busy_before, _ = machine_cpu_seconds()
    began = time.monotonic()
    time.sleep(seconds)
    busy_after, _ = machine_cpu_seconds()
    return (busy_after - busy_before) / (time.monotonic() - began)


class Service:
    """One of our daemons started through its command line in its own session and waited for
    (READY=1); `argv` may still grow until `start`."""

    def __init__(self, work: Path, name: str, argv: list[str], env: dict[str, str] | None = None, *,
                 split_output: bool = False) -> None:
        self.work, self.name, self.argv, self.env = work, name, argv, env or {}
        self.split_output = split_output
        self.daemon: Daemon | None = None

    @property
    def pid(self) -> int:
        assert self.daemon is not None
        return self.daemon.pid

    def start(self, timeout: float = 20.0) -> None:
        self.daemon = Daemon(self.work, self.name, self.argv, self.env, split_output=self.split_output,
                             stop_timeout=10.0, new_session=True)
        self.daemon.wait_ready(timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; a no-op for one not started."""
        if self.daemon is not None:
            self.daemon.stop()

    def log_tail(self, lines: int = 20) -> str:
        return self.daemon.log_tail(lines) if self.daemon is not None else "(not started)"


class Proxy(Service):
    """runtime-proxy serve, with an empty --hook-config-dir of its own (`hook_dir`)."""

    def __init__(self, work: Path, backend: str, name: str = "proxy", profile: Path | None = None) -> None:
        self.socket = work / name / "proxy.sock"
        self.hook_dir = work / f"{name}-hooks"
        self.hook_dir.mkdir()
        argv = proxy_serve_args(self.socket, backend, self.hook_dir, "--log-level", "info")
        env = {}
        if profile is not None:
            # The same CLI entry point, under cProfile with a CPU clock (the daemon runs in `work`).
            argv[:argv.index("serve")] = [sys.executable, "-c", PROFILED_MAIN]
            env[PROFILE_ENV] = str(profile.resolve())
        super().__init__(work, name, argv, env)


class ByteRelay:
    """socat relaying one connection to the backend byte for byte (reads of up to 64 KiB, so a
    ListContainers answer is not cut into 8 KiB pieces): one extra process hop and nothing else.
    Started afresh for each run, as it serves one connection and exits when it ends."""

    def __init__(self, work: Path, backend: Path) -> None:
        if shutil.which("socat") is None:
            sys.exit("--hop needs socat on PATH (Debian: apt-get install socat)")
        self.socket = work / "hop" / "hop.sock"
        self.socket.parent.mkdir(mode=0o700)
        self.backend = backend

    @contextlib.contextmanager
    def serving(self, timeout: float = 10.0) -> Iterator[int]:
        """A socat listening on `socket` for one connection; yields its pid, waits for its end."""
        self.socket.unlink(missing_ok=True)
        argv = ["socat", "-b", "65536", f"UNIX-LISTEN:{self.socket},mode=600", f"UNIX-CONNECT:{self.backend}"]
        process = subprocess.Popen(argv, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while not self.socket.exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"socat did not listen on {self.socket} (exit {process.poll()})")
                time.sleep(0.005)
            yield process.pid
            process.wait(timeout)  # the client has closed its channel: socat ends with the connection
        finally:
            stop_process(process, timeout)


class Client:
    """A bench client script (bench/relay_client.py by default) as a child process: one JSON job
    in, one JSON answer out."""

    def __init__(self, script: Path = CLIENT_SCRIPT) -> None:
        self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)

    def run(self, **job: Any) -> dict[str, Any]:
        stdin, stdout = self._pipes()
        stdin.write(json.dumps(job) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the client process exited with {self.proc.wait()}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"client job {job} failed: {answer['error']}")
        return answer

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            stop_process(self.proc, 10.0)


# -- filling containerd ---------------------------------------------------------------------


def cri(bed: Containerd, method: str, request: Any, response_type: Any) -> Any:
    return response_type.FromString(bed.call(f"RuntimeService/{method}", request.SerializeToString(), 60.0))


def start_pod(bed: Containerd, containers: int) -> None:
    """One host-network pod sandbox with `containers` started containers."""
    uid = uuid.uuid4().hex
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"bench-{uid[:8]}", uid=uid, namespace="bench"),
        hostname="",  # runc may not set a hostname without a private UTS namespace
        log_directory=str(bed.root_dir / "pod-logs" / uid),
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=bed.cgroup_parent(uid),
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.NODE)),
        ),
    )
    pod_id = cri(bed, "RunPodSandbox", pb.RunPodSandboxRequest(config=config),
                 pb.RunPodSandboxResponse).pod_sandbox_id
    for n in range(containers):
        container = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=f"sleeper-{n}"),
            image=pb.ImageSpec(image=bed.test_image),  # its default command is a long sleep
            log_path=f"sleeper-{n}.log",
        )
        request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container, sandbox_config=config)
        cid = cri(bed, "CreateContainer", request, pb.CreateContainerResponse).container_id
        cri(bed, "StartContainer", pb.StartContainerRequest(container_id=cid), pb.StartContainerResponse)


def fill(bed: Containerd, pods: int, containers_per_pod: int) -> int:
    """Start the pods in parallel; return how many containers ListContainers reports."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        for done in [pool.submit(start_pod, bed, containers_per_pod) for _ in range(pods)]:
            done.result()
    listed = cri(bed, "ListContainers", pb.ListContainersRequest(), pb.ListContainersResponse)
    return len(listed.containers)


# -- figures --------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..1)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(kw_only=True)
class CallTimes:
    """Latencies and client/machine CPU of a client's timed call runs, pooled over the rounds; the
    subclasses add the CPU of the processes they watch."""

    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0
    client_cpu: float = 0.0
    machine_busy_cpu: float = 0.0
    machine_total_cpu: float = 0.0
    round_p50_ms: list[float] = field(default_factory=list)
    round_calls_per_s: list[float] = field(default_factory=list)

    def add_times(self, answer: dict[str, Any]) -> None:
        latencies = answer["latencies"]
        self.latencies += latencies
        self.wall += answer["wall"]
        self.client_cpu += answer["client_cpu"]
        self.machine_busy_cpu += answer["machine_busy_cpu"]
        self.machine_total_cpu += answer["machine_total_cpu"]
        self.round_p50_ms.append(percentile(sorted(latencies), 0.5) * 1e3)
        self.round_calls_per_s.append(len(latencies) / answer["wall"])

    def per_call_us(self) -> float:
        """Multiplier from pooled CPU seconds to microseconds per call."""
        return 1e6 / len(self.latencies) if self.latencies else math.nan

    def times_summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        calls = len(ordered)
        return {
            "calls": calls,
            "p50_ms": percentile(ordered, 0.5) * 1e3,
            "p99_ms": percentile(ordered, 0.99) * 1e3,
            "calls_per_s": calls / self.wall if self.wall else math.nan,
            "client_cpu_us_per_call": self.client_cpu * self.per_call_us(),
            # Share of all CPUs busy during the timed calls.
            "machine_busy": self.machine_busy_cpu / self.machine_total_cpu if self.machine_total_cpu else math.nan,
            "round_p50_ms": self.round_p50_ms,
            "round_calls_per_s": self.round_calls_per_s,
        }


@dataclass
class Series(CallTimes):
    """Every timed run of one (method, callers, target), pooled over the rounds."""

    method: str
    concurrency: int
    target: str
    proxy_cpu: float = 0.0
    proxy_system_cpu: float = 0.0
    containerd_cpu: float = 0.0

    def add(self, answer: dict[str, Any]) -> None:
        self.add_times(answer)
        proxy_user, proxy_system = answer["watched_cpu"]["proxy"]
        self.proxy_cpu += proxy_user + proxy_system
        self.proxy_system_cpu += proxy_system
        self.containerd_cpu += sum(answer["watched_cpu"]["containerd"])

    def summary(self) -> dict[str, Any]:
        per_call_us = self.per_call_us()
        ours = self.client_cpu + self.proxy_cpu + self.containerd_cpu
        return self.times_summary() | {
            "proxy_cpu_us_per_call": self.proxy_cpu * per_call_us,
            "proxy_system_cpu_us_per_call": self.proxy_system_cpu * per_call_us,
            "containerd_cpu_us_per_call": self.containerd_cpu * per_call_us,
            # CPUs' worth used by processes other than the three.
            "other_cpus": max(0.0, self.machine_busy_cpu - ours) / self.wall if self.wall else math.nan,
        }


def total_cpu_us(summary: dict[str, Any]) -> float:
    """CPU per call of the client, the proxy and containerd together."""
    return float(sum(summary[f"{who}_cpu_us_per_call"] for who in ("client", "proxy", "containerd")))


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its 95% confidence half-width (normal approximation; NaN for
    fewer than two values)."""
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return statistics.fmean(values), half


def round_ratios(direct: dict[str, Any], proxy: dict[str, Any]) -> list[float]:
    """Each round's proxy calls/s over the direct run's of the same round (run next to it)."""
    return [p / d for p, d in zip(proxy["round_calls_per_s"], direct["round_calls_per_s"], strict=True)]


def compare(direct: dict[str, Any], proxy: dict[str, Any]) -> dict[str, Any]:
    ratios = round_ratios(direct, proxy)
    mean, half = mean_ci95(ratios)
    return {
        "direct_total_cpu_us_per_call": total_cpu_us(direct),
        "proxy_total_cpu_us_per_call": total_cpu_us(proxy),
        "added_p50_ms": proxy["p50_ms"] - direct["p50_ms"],
        "added_p99_ms": proxy["p99_ms"] - direct["p99_ms"],
        "throughput_ratio": proxy["calls_per_s"] / direct["calls_per_s"],
        "round_throughput_ratios": ratios,
        "paired_throughput_ratio": mean,
        "paired_throughput_ratio_ci95": half,
    }


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def fmt_round_ratios(ratios: Sequence[float]) -> str:
    """'0.91 0.87 0.95 0.93, mean 0.92x +- 0.03'."""
    mean, half = mean_ci95(ratios)
    return " ".join(f"{r:.2f}" for r in ratios) + f", mean {mean:.2f}x ± {half:.2f}"


def print_report(report: dict[str, Any]) -> None:
    env = report["environment"]
    print()
    print(f"runtime-proxy relay bench: {env['runtime']}, {env['containers']} containers listed, "
          f"{env['cpus']} CPUs; {env['rounds']} rounds x {env['calls']} timed calls per run "
          f"(+{env['warmup']} warm-up); the callers of a run share one channel")
    print(f"Background load before the runs (CPUs busy, containerd and proxy idle): {env['background_cpus']:.2f}")
    print()
    head = (f"{'method':<15}{'callers':>7}  {'target':<7}{'p50 ms':>8}{'p99 ms':>8}{'calls/s':>9}"
            f"{'client':>8}{'proxy':>7}{'ctrd':>7}{'busy':>6}{'other':>7}   p50 per round (ms)")
    print(f"{'':<54}{'CPU us per call':^22}{'':6}{'CPUs':>7}")
    print(head)
    print("-" * len(head))
    for row in report["results"]:
        for target in relayed_targets(row, "direct"):
            s = row[target]
            rounds = " ".join(f"{v:.3f}" for v in s["round_p50_ms"])
            print(f"{row['method']:<15}{row['concurrency']:>7}  {target:<7}{s['p50_ms']:>8.3f}{s['p99_ms']:>8.3f}"
                  f"{s['calls_per_s']:>9.0f}{s['client_cpu_us_per_call']:>8.0f}{s['proxy_cpu_us_per_call']:>7.0f}"
                  f"{s['containerd_cpu_us_per_call']:>7.0f}{s['machine_busy']:>6.0%}{s['other_cpus']:>7.2f}"
                  f"   {rounds}")
        for target in relayed_targets(row):
            c = row[COMPARISONS[target]]
            print(f"{'':<24}{target} - direct: p50 {c['added_p50_ms']:+.3f} ms, p99 {c['added_p99_ms']:+.3f} ms; "
                  f"throughput {c['throughput_ratio']:.2f}x; CPU per call, all three: "
                  f"{c['direct_total_cpu_us_per_call']:.0f} -> {c['proxy_total_cpu_us_per_call']:.0f} us")
            print(f"{'':<24}{target} throughput per round: {fmt_round_ratios(c['round_throughput_ratios'])}")
    if any(HOP in row for row in report["results"]):
        print(f"{'':<24}(hop: socat relaying bytes, no parsing; its CPU is in the proxy column)")
    print()
    print("Targets (reported, not asserted):")
    for row in report["results"]:
        c = row["comparison"]
        name = f"{row['method']} x{row['concurrency']}"
        if row["concurrency"] == 1:
            print(f"  added p50 <= {TARGET_ADDED_P50_MS} ms per call   {name:<20}{c['added_p50_ms']:+.3f} ms  "
                  f"{verdict(c['added_p50_ms'] <= TARGET_ADDED_P50_MS)}")
        else:
            ok = c["throughput_ratio"] >= TARGET_THROUGHPUT_RATIO_AT_16
            print(f"  throughput >= {TARGET_THROUGHPUT_RATIO_AT_16}x direct      {name:<20}"
                  f"{c['throughput_ratio']:.2f}x      {verdict(ok)}  (per round "
                  f"{c['paired_throughput_ratio']:.2f}x ± {c['paired_throughput_ratio_ci95']:.2f})")
            if HOP in row:
                h = row[COMPARISONS[HOP]]
                print(f"{'    the floor: a bare byte relay (socat)':<53}{h['throughput_ratio']:.2f}x      {'':<2}  "
                      f"(per round {h['paired_throughput_ratio']:.2f}x ± {h['paired_throughput_ratio_ci95']:.2f})")
    mem = report["proxy_memory"]
    for label, key in (("idle after start", "rss_start_mib"), ("idle after load", "rss_after_load_mib"),
                       ("peak (VmHWM)", "rss_peak_mib")):
        print(f"  proxy RSS <= {TARGET_RSS_MIB:.0f} MiB         {label:<20}{mem[key]:.1f} MiB  "
              f"{verdict(mem[key] <= TARGET_RSS_MIB)}")
    print()
    busy = [row["proxy"] for row in report["results"] if row["concurrency"] >= 16]
    print("Proxy CPU per relayed call at 16 callers: " + ", ".join(
        f"{row['method']} {p['proxy_cpu_us_per_call']:.0f} us (of which kernel {p['proxy_system_cpu_us_per_call']:.0f})"
        for row in report["results"] if row["concurrency"] >= 16 for p in [row["proxy"]])
        + f"; machine {min(b['machine_busy'] for b in busy):.0%}-{max(b['machine_busy'] for b in busy):.0%} busy")
    t = report["timings"]
    print(f"Wall time: set-up {t['setup_s']:.1f} s, load {t['load_s']:.1f} s, total {t['total_s']:.1f} s")


def print_profile(profile: dict[str, Any], unprofiled_us: float) -> None:
    print()
    print(f"cProfile (CPU clock) of a second proxy process, 16 callers x ListContainers, "
          f"{profile['relayed_calls']} calls ({profile['file']}).")
    print(f"The profiler raises the proxy's CPU per call from {unprofiled_us:.0f} us to "
          f"{profile['proxy_cpu_us_per_call_profiled']:.0f} us, most of it in functions called many times,")
    print("so shares are indicative. Self time by part of the code:")
    for group, share in profile["self_share_by_group"].items():
        if share >= 0.005:
            print(f"  {share:6.1%}  {group}")
    print(f"  {'self':>6}  {'n/call':>6}  top functions")
    for item in profile["top_self"]:
        print(f"  {item['share']:6.1%}  {item['calls_per_call']:6.1f}  {item['function']}")
    print(f"Without a profiler, hpack decodes one call's 3 header blocks in "
          f"{profile['hpack_decode_us_per_call_unprofiled']:.0f} us of CPU (synthetic blocks, same library).")


# -- profiling ------------------------------------------------------------------------------


PROFILE_CALLS = 5000


def code_group(filename: str) -> str:
    """Which part of the proxy's code a profiled function belongs to."""
    for marker, group in (("/runtimeproxy/", "relay (runtimeproxy)"), ("/hpack/", "hpack"),
                          ("/logging/", "logging (hpack's debug calls)"), ("/prometheus_client/", "metrics"),
                          ("/structlog/", "structlog"), ("/asyncio/", "asyncio and uvloop")):
        if marker in filename:
            return group
    return "builtins" if filename == "~" else "other"


def top_self_time(stats_file: Path, relayed_calls: int, limit: int = 15) -> tuple[dict[str, float],
                                                                                 list[dict[str, Any]]]:
    """Self (CPU) time shares of a cProfile dump: by part of the code, and the top functions."""
    stats: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    stats = pstats.Stats(str(stats_file)).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in stats.values()) or 1.0
    groups: dict[str, float] = {}
    for (filename, _line, _name), entry in stats.items():
        group = code_group(filename)
        groups[group] = groups.get(group, 0.0) + entry[2] / total
    ranked = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:limit]
    top = []
    for (filename, line, name), (_prim, calls, self_time, _cum, _callers) in ranked:
        where = name if filename == "~" else f"{name} ({Path(filename).name}:{line})"
        top.append({"function": where, "share": self_time / total, "calls_per_call": calls / relayed_calls})
    return dict(sorted(groups.items(), key=lambda item: item[1], reverse=True)), top


def hpack_decode_us_per_call(calls: int = 5000) -> float:
    """CPU time hpack takes to decode one unary call's three header blocks (request headers,
    response headers, trailers), in steady state with its dynamic tables warm; no profiler."""
    request = [(":scheme", "http"), (":method", "POST"), (":authority", "localhost"),
               (":path", "/runtime.v1.RuntimeService/ListContainers"), ("te", "trailers"),
               ("content-type", "application/grpc"), ("user-agent", "grpc-python-asyncio/1.85.1 grpc-c/52.0.0"),
               ("grpc-accept-encoding", "identity, deflate, gzip")]
    response = [(":status", "200"), ("content-type", "application/grpc")]
    trailers = [("grpc-status", "0"), ("grpc-message", "")]
    up, down = hpack.Encoder(), hpack.Encoder()
    blocks = []
    for n in range(calls):  # grpc-timeout differs from call to call, as the client's deadline does
        blocks.append((0, up.encode([*request, ("grpc-timeout", f"{29_999_000 + n % 1000}u")])))
        blocks += [(1, down.encode(response)), (1, down.encode(trailers))]
    decoders = (hpack.Decoder(), hpack.Decoder())
    began = time.process_time()
    for which, block in blocks:
        decoders[which].decode(block)
    return (time.process_time() - began) / calls * 1e6


def profile_proxy(client: Client, work: Path, bed: Containerd, out: Path) -> dict[str, Any]:
    """cProfile (CPU clock) a second proxy process while 16 callers send ListContainers
    through it. Not part of the figures: the profiler slows the proxy several times over."""
    proxy = Proxy(work, bed.address, name="profiled", profile=out)
    try:
        proxy.start()
        warmup = 200
        answer = client.run(socket=str(proxy.socket), method="ListContainers", concurrency=16,
                            calls=PROFILE_CALLS, warmup=warmup, watch={"proxy": proxy.pid})
    finally:
        proxy.stop()  # SIGTERM: the proxy exits through main() and the stats are written
    if not out.exists():
        raise RuntimeError(f"the profiled proxy wrote no {out}:\n{proxy.log_tail()}")
    relayed = PROFILE_CALLS + warmup + 1
    groups, top = top_self_time(out, relayed)
    return {
        "file": str(out),
        "relayed_calls": relayed,
        "proxy_cpu_us_per_call_profiled": sum(answer["watched_cpu"]["proxy"]) / PROFILE_CALLS * 1e6,
        "self_share_by_group": groups,
        "top_self": top,
        "hpack_decode_us_per_call_unprofiled": hpack_decode_us_per_call(),
    }


# -- the run --------------------------------------------------------------------------------


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    # Short path: a unix socket path must fit in 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="rtpx-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    began = time.monotonic()
    bed = Containerd(pod_network=False)
    proxy: Proxy | None = None
    client: Client | None = None
    with workdir() as work:
        try:
            bed.start()
            containers = fill(bed, args.pods, args.containers_per_pod)
            if containers < 50:
                raise RuntimeError(f"ListContainers lists {containers} containers; the bench needs at least 50")
            proxy = Proxy(work, bed.address)
            proxy.start()
            hop = ByteRelay(work, bed.socket) if args.hop else None
            targets = TARGETS if hop is None else (*TARGETS, HOP)
            time.sleep(1.0)  # let start-up settle before the idle reading
            rss_start = proc_status_kib(proxy.pid, "VmRSS")
            background = background_cpus(2.0)
            client = Client()
            assert bed.pid is not None
            watch = {"proxy": proxy.pid, "containerd": bed.pid}
            sockets = {"direct": str(bed.socket), "proxy": str(proxy.socket)}
            setup_done = time.monotonic()
            series = {(m, c, t): Series(m, c, t) for m in METHODS for c in CONCURRENCY for t in targets}
            checked: dict[str, str] = {}
            for n in range(args.rounds):
                order = targets[n % len(targets):] + targets[:n % len(targets)]  # who goes first rotates
                for method in METHODS:
                    for concurrency in CONCURRENCY:
                        for target in order:
                            job = {"method": method, "concurrency": concurrency, "calls": args.calls,
                                   "warmup": args.warmup}
                            if target == HOP:
                                assert hop is not None
                                with hop.serving() as hop_pid:  # in the proxy's columns: the relay in between
                                    answer = client.run(socket=str(hop.socket), **job,
                                                        watch={"proxy": hop_pid, "containerd": bed.pid})
                            else:
                                answer = client.run(socket=sockets[target], **job, watch=watch)
                            series[method, concurrency, target].add(answer)
                            checked[f"{method} {target}"] = answer["checked"]
                    print(f"round {n + 1}/{args.rounds}: {method} done", file=sys.stderr)
            load_done = time.monotonic()
            time.sleep(1.0)
            rss_after = proc_status_kib(proxy.pid, "VmRSS")
            rss_peak = proc_status_kib(proxy.pid, "VmHWM")

            results = []
            for method in METHODS:
                for concurrency in CONCURRENCY:
                    direct = series[method, concurrency, "direct"].summary()
                    relayed = series[method, concurrency, "proxy"].summary()
                    row = {"method": method, "concurrency": concurrency, "direct": direct,
                           "proxy": relayed, "comparison": compare(direct, relayed)}
                    if hop is not None:
                        row[HOP] = series[method, concurrency, HOP].summary()
                        row["hop_comparison"] = compare(direct, row[HOP])
                    results.append(row)
            report: dict[str, Any] = {
                "environment": {
                    "runtime": checked.get("Version direct", "?"),
                    "background_cpus": background,
                    "containers": containers,
                    "cpus": os.cpu_count(),
                    "rounds": args.rounds,
                    "calls": args.calls,
                    "warmup": args.warmup,
                    "python": sys.version.split()[0],
                    "proxy_argv": proxy.argv,
                    "responses_checked": checked,
                },
                "proxy_memory": {
                    "rss_start_mib": rss_start / 1024,
                    "rss_after_load_mib": rss_after / 1024,
                    "rss_peak_mib": rss_peak / 1024,
                },
                "targets": {
                    "added_p50_ms": TARGET_ADDED_P50_MS,
                    "throughput_ratio_at_16": TARGET_THROUGHPUT_RATIO_AT_16,
                    "rss_mib": TARGET_RSS_MIB,
                },
                "results": results,
                "timings": {"setup_s": setup_done - began, "load_s": load_done - setup_done},
            }
            if args.profile is not None:
                proxy.stop()  # one proxy at a time
                report["profile"] = profile_proxy(client, work, bed, args.profile)
            return report
        finally:
            if client is not None:
                client.close()
            if proxy is not None:
                proxy.stop()
            bed.stop()


def relayed_targets(row: dict[str, Any], *first: str) -> tuple[str, ...]:
    """The targets a result row holds after ``first``: the proxy, and the hop when it ran."""
    return (*first, "proxy", *((HOP,) if HOP in row else ()))


def pooled_round_ratios(reports: Sequence[dict[str, Any]]) -> dict[tuple[str, int, str], list[float]]:
    """Every run's per-round throughput ratios over direct, by (method, callers, target), in run
    order; the hop's only from the runs that had one, and for those also the proxy's over the
    hop's (target "proxy/hop": how far the proxy is from the floor of any relay)."""
    pooled: dict[tuple[str, int, str], list[float]] = {}
    for report in reports:
        for row in report["results"]:
            key = row["method"], row["concurrency"]
            for target in relayed_targets(row):
                pooled.setdefault((*key, target), []).extend(round_ratios(row["direct"], row[target]))
            if HOP in row:
                pooled.setdefault((*key, "proxy/hop"), []).extend(round_ratios(row[HOP], row["proxy"]))
    return pooled


def print_pool(paths: Sequence[Path]) -> None:
    """--pool: each run's per-round throughput ratios, then all of them pooled."""
    reports = []
    for path in paths:
        report = json.loads(path.read_text())
        if any("round_calls_per_s" not in row["direct"] for row in report["results"]):
            sys.exit(f"{path}: no per-round calls/s (written by an older relay_bench.py); run it again")
        reports.append(report)
    for path, report in zip(paths, reports, strict=True):
        print(f"{path}:")
        for (method, callers, target), ratios in pooled_round_ratios([report]).items():
            print(f"  {f'{method} x{callers} {target}':<30}{fmt_round_ratios(ratios)}")
    print(f"Pooled, {len(reports)} runs:")
    for (method, callers, target), ratios in pooled_round_ratios(reports).items():
        mean, half = mean_ci95(ratios)
        line = f"  {f'{method} x{callers} {target}':<30}{len(ratios)} rounds, throughput {mean:.3f}x ± {half:.3f}"
        if callers >= 16 and target == "proxy":
            line += f"  >= {TARGET_THROUGHPUT_RATIO_AT_16}x: {verdict(mean >= TARGET_THROUGHPUT_RATIO_AT_16)}"
        print(line)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=3000, help="timed calls per run (default 3000)")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls before each run (default 200)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating direct/proxy rounds (default 4)")
    parser.add_argument("--pods", type=int, default=10, help="host-network pod sandboxes (default 10)")
    parser.add_argument("--containers-per-pod", type=int, default=5, help="started containers per pod (default 5)")
    parser.add_argument("--hop", action="store_true",
                        help="also time a bare byte relay (socat) in between: the floor of any extra hop")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--profile", type=Path,
                        help="afterwards, cProfile (CPU clock) a second proxy process under 16-caller "
                             "ListContainers load and write its pstats to this file")
    parser.add_argument("--pool", type=Path, nargs="+", metavar="FILE",
                        help="run nothing: pool the per-round throughput ratios of earlier runs' --json files")
    return parser.parse_args(argv)


def require_root(script: str) -> None:
    """Every bench starts its own containerd, which needs root."""
    if os.geteuid() != 0:
        sys.exit(f"{script} runs containerd and must run as root")


def timed_run(script: str, run: Callable[[argparse.Namespace], dict[str, Any]],
              args: argparse.Namespace) -> dict[str, Any]:
    """`run(args)`'s report, its "timings" completed with the total wall time."""
    require_root(script)
    began = time.monotonic()
    report = run(args)
    report["timings"]["total_s"] = time.monotonic() - began
    return report


def write_figures(path: Path | None, report: dict[str, Any]) -> None:
    """--json: the report as JSON, when asked for."""
    if path is not None:
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nFigures written to {path}")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.pool:
        print_pool(args.pool)
        return
    report = timed_run("relay_bench.py", run_bench, args)
    print_report(report)
    if "profile" in report:
        row = next(r for r in report["results"] if r["method"] == "ListContainers" and r["concurrency"] == 16)
        print_profile(report["profile"], row["proxy"]["proxy_cpu_us_per_call"])
    write_figures(args.json, report)


if __name__ == "__main__":
    main()
