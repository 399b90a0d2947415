"""runtime-hooks as an NRI plugin against a Go NRI plugin doing the same BE adjustments.

    python bench/nri_peer_bench.py [--pods N] [--rounds R] [--traced N] [--json FILE]

One containerd 1.7 (the test bed's, NRI on) with two probe plugins registered for the whole
run at index 01 and 99 (bench/nri_go_peer in ``-probe`` mode: they note when each event reaches
them). Each round starts N BestEffort pods (labelled and annotated as bench/nri_bench.py's) for
each target in turn, the order rotating from round to round:

* ``none``: no plugin between the probes;
* ``go``: the Go peer (bench/nri_go_peer/main.go, built offline by bench/go_peer.py) at index 50;
* ``nri``: ``runtime-hooks serve --nri-socket`` at index 50;
* ``py-floor``: bench/nri_py_floor.py at index 50, the same adjustments in a few plain Python
  functions on runtime-hooks' NRI transport (connection, framing, uvloop) with no plugin host:
  what it adds over ``go`` is Python's and the transport's share, what ``nri`` adds over it the
  plugin host's;
* ``proxy``: pods started through ``runtime-proxy serve`` calling ``runtime-hooks`` in proxy mode
  (both started once for the run; no NRI plugin between the probes).

The plugin of ``go``, ``nri`` and ``py-floor`` is started for its block and stopped after it. Reported:

* **added time per event**: for each pod and event, the probe at 99 minus the probe at 01 (the
  time containerd spends on the plugins between them), p50 per target, and minus ``none``'s p50;
* **inside the plugin**: in extra ``--traced`` pods per round the plugin runs under
  ``strace -f -ttt -T``; for each event, from the end of the read that completes it on the NRI
  socket to the start of the write of its answer (strace slows every syscall alike in both
  plugins: compare the two, not the absolute figures), and the file calls (opens, stats, mkdirs:
  the cgroupfs and /proc work) the plugin made in between;
* **pod start**: RunPodSandbox + CreateContainer + StartContainer as the CRI client sees them,
  mean ratio to ``none`` and ``proxy`` against ``go``;
* **CPU per pod**: the CPU time the plugin's process spent over its block (all its threads, from
  ``/proc/<pid>/task/*/schedstat``: nanoseconds, not clock ticks), per pod; for ``proxy`` the
  runtime-hooks and runtime-proxy processes of its blocks. Strace does not touch these blocks;
* **RSS** of the plugin at the end of its block and **start to registered**: from spawning the
  plugin to containerd's "synchronizing plugin" log line for it.

Each figure comes with its spread over rounds (the p50 of each round: min..max). The load
average before and after is printed too; the machine's noise is in the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import go_peer
from nri_bench import PROXY, compile_project, daemon, hooks_args, remove_cgroups, run_and_report, start_pod
from relay_bench import percentile

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd
from runtimeproxy.testbed.runtimes import locate

TARGETS = ("none", "go", "nri", "py-floor", "proxy")
PLUGINS = ("go", "nri", "py-floor")
EVENTS = ("RunPodSandbox", "CreateContainer", "PostStartContainer")
PLUGIN_INDEX = "50"
#: The processes whose CPU per pod is reported: each plugin's, both daemons of proxy.
CPU_ROWS = ("go", "nri", "py-floor", "proxy: runtime-hooks", "proxy: runtime-proxy")
PY_FLOOR = Path(__file__).with_name("nri_py_floor.py")
STATE_EVENTS = {nri_pb.RUN_POD_SANDBOX: "RunPodSandbox", nri_pb.POST_START_CONTAINER: "PostStartContainer"}


# -- plugins -----------------------------------------------------------------------------------


@contextlib.contextmanager
def go_plugin(binary: Path, bed: Containerd, work: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """The Go peer (or a probe, with ``-probe``) registered with ``bed`` until the block ends."""
    with plugin_process([str(binary), "-socket", str(bed.nri_socket), *args], work / "go-peer.log") as proc:
        yield proc


@contextlib.contextmanager
def plugin_process(argv: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` running, its output appended to ``log_path``, until the block ends (SIGTERM)."""
    log = log_path.open("ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=log)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def registered_at(bed: Containerd, name: str, after: float, timeout: float = 20.0) -> float:
    """Wall-clock time of containerd's "synchronizing plugin <name>" line logged after ``after``."""
    pattern = re.compile(r'time="([^"]+)".*synchronizing plugin ' + re.escape(name) + r"\b")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in bed.log_path.read_text(errors="replace").splitlines():
            found = pattern.search(line)
            if found:
                stamp = datetime.datetime.fromisoformat(found.group(1).replace("Z", "+00:00")).timestamp()
                if stamp >= after:
                    return stamp
        time.sleep(0.01)
    raise SystemExit(f"plugin {name} did not register within {timeout:g}s")


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` so far, all its threads (schedstat's first field, in ns). A thread that
    ended takes its time along: the plugins here keep theirs for the whole block."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


@contextlib.contextmanager
def cpu_per_pod(pid: int, pods: int, into: list[float]) -> Iterator[None]:
    """Add the CPU milliseconds per pod that ``pid`` spends in the block to ``into``."""
    before = cpu_seconds(pid)
    yield
    into.append((cpu_seconds(pid) - before) * 1e3 / pods)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def plugin_under_test(
    target: str, binary: Path, bed: Containerd, work: Path, record: dict[str, list[float]]
) -> Iterator[int]:
    """The plugin of ``target`` registered at PLUGIN_INDEX; yields its pid. Notes its start to
    registered and (at the end) its RSS in ``record``."""
    spawned = time.time()
    if target in ("go", "py-floor"):
        if target == "go":
            argv = [str(binary), "-socket", str(bed.nri_socket), "-index", PLUGIN_INDEX, "-name", "go-peer"]
            name, log = "go-peer", work / "go-peer.log"
        else:
            argv = [sys.executable, str(PY_FLOOR), "--socket", str(bed.nri_socket), "--index", PLUGIN_INDEX]
            name, log = "py-floor", work / "py-floor.log"
        with plugin_process(argv, log) as proc:
            record["registered_s"].append(registered_at(bed, f"{PLUGIN_INDEX}-{name}", spawned) - spawned)
            yield proc.pid
            record["rss_mib"].append(rss_mib(proc.pid))
        return
    args = hooks_args(bed, work, "--nri-socket", str(bed.nri_socket), "--nri-plugin-index", PLUGIN_INDEX)
    args[args.index("--endpoint") + 1] = str(work / "hooks-nri.sock")
    with daemon(work, "hooks-nri", args):
        pid = _pid_of(work / "hooks-nri.sock")
        record["registered_s"].append(registered_at(bed, f"{PLUGIN_INDEX}-runtime-hooks", spawned) - spawned)
        yield pid
        record["rss_mib"].append(rss_mib(pid))


def _pid_of(endpoint: Path) -> int:
    """The process serving ``endpoint`` (fuser, from psmisc)."""
    pids = subprocess.run(["fuser", str(endpoint)], capture_output=True, text=True, check=False).stdout.split()
    if not pids:
        raise SystemExit(f"no process serves {endpoint} (is fuser installed?)")
    return int(pids[0])


# -- pods --------------------------------------------------------------------------------------


def pods_block(bed: Containerd, endpoint: str, pods: int) -> list[tuple[str, list[float]]]:
    """(pod uid, seconds of each CRI call) of ``pods`` BE pods started one at a time."""
    started, parents = [], []
    with CriClient(endpoint, timeout=60) as cri:
        for _ in range(pods):
            calls, parent = start_pod(cri, bed)
            parents.append(parent)
            started.append((parent.rsplit("/pod", 1)[1], calls))
    bed.remove_all_pods()
    for parent in parents:
        remove_cgroups(parent)
    return started


# -- strace ------------------------------------------------------------------------------------

_SYSCALL = re.compile(r"^(?:\d+\s+)?([\d.]+) (read|write|readv|writev)\((\d+), (.*) = (-?\d+)(?: \S+)*? <([\d.]+)>$")


def _bytes_of(text: str) -> bytes:
    """The first bytes strace printed of a buffer (``-xx``: every byte as \\xNN)."""
    found = re.search(r'"((?:\\x[0-9a-f]{2})*)"', text)
    return bytes.fromhex(found.group(1).replace("\\x", "")) if found else b""


def _event_of(data: bytes) -> str | None:
    """The NRI event a request chunk carries: mux header (8), ttrpc header (10), then the
    ttrpc Request: service, method and payload (for StateChange: its event number)."""
    if b"CreateContainer" in data:
        return "CreateContainer"
    marker = data.find(b"StateChange")
    if marker < 0:
        return None
    rest = data[marker + len(b"StateChange") :]
    # payload field (0x1a, length varint), then StateChangeEvent field 1 (0x08, event)
    at = rest.find(b"\x08", 2)
    return STATE_EVENTS.get(rest[at + 1]) if 0 <= at < len(rest) - 1 else None


#: System calls on a file path or below a directory fd: the plugins' cgroupfs and /proc work (an
#: unfinished call counts at its start; its "resumed" line does not match).
_FILE_CALL = re.compile(
    r"^(?:\d+\s+)?[\d.]+ (?:openat|open|newfstatat|statx|stat|lstat|access|faccessat2?|mkdir|mkdirat|"
    r"readlinkat|readlink|unlinkat|rmdir)\("
)


_UNFINISHED = re.compile(r"^(\d+)\s+(.*) <unfinished \.\.\.>$")
_RESUMED = re.compile(r"^(\d+)\s+[\d.]+ <\.\.\. \w+ resumed>(.*)$")


def _whole_calls(lines: Iterable[str]) -> Iterator[str]:
    """strace -f's lines with each call another thread interrupted joined again: its start
    ("<unfinished ...>", with the time it began) and its end ("<... read resumed>") as one line."""
    started: dict[str, str] = {}
    for line in lines:
        line = line.strip()
        if (unfinished := _UNFINISHED.match(line)) is not None:
            started[unfinished.group(1)] = unfinished.group(2)
        elif (resumed := _RESUMED.match(line)) is not None:
            begun = started.pop(resumed.group(1), None)
            if begun is not None:
                yield f"{resumed.group(1)} {begun}{resumed.group(2)}"
        else:
            yield line


def inside_times(trace: Path) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """:func:`inside_of` the strace output file ``trace``."""
    return inside_of(trace.read_text(errors="replace").splitlines())


def inside_of(lines: Iterable[str]) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Per event: from the end of the read completing it to the start of the answer's write, same
    fd; and how many file calls (_FILE_CALL) the plugin's threads made in between."""
    found: dict[str, list[float]] = {}
    calls: dict[str, list[int]] = {}
    waiting: dict[int, tuple[str, float, list[int]]] = {}
    for line in _whole_calls(lines):
        if waiting and _FILE_CALL.match(line):
            for _, _, count in waiting.values():
                count[0] += 1
            continue
        match = _SYSCALL.match(line)
        if not match:
            continue
        start, call, fd, rest, result, took = match.groups()
        if int(result) <= 0:
            continue
        if call.startswith("read"):
            event = _event_of(_bytes_of(rest))
            if event is not None:
                waiting[int(fd)] = (event, float(start) + float(took), [0])
        elif int(fd) in waiting:
            event, read_end, count = waiting.pop(int(fd))
            found.setdefault(event, []).append(float(start) - read_end)
            calls.setdefault(event, []).append(count[0])
    return found, calls


@contextlib.contextmanager
def traced(pid: int, out: Path) -> Iterator[None]:
    proc = subprocess.Popen(
        [
            "strace",
            "-f",
            "-ttt",
            "-T",
            "-xx",
            "-s",
            "160",
            "-o",
            str(out),
            "-p",
            str(pid),
        ],
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)  # attached to every thread
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)


# -- the run -----------------------------------------------------------------------------------


def probe_times(path: Path) -> dict[tuple[str, str], float]:
    times: dict[tuple[str, str], float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            event, uid, ns = line.split()
            times[(event, uid)] = int(ns) / 1e9
    return times


def run(args: argparse.Namespace) -> dict[str, Any]:
    binary = go_peer.build()
    compile_project()  # start to registered as an installed daemon's, which has its bytecode
    bed = Containerd(build=locate("1.7"), nri=True)
    work = Path(tempfile.mkdtemp(prefix="rtpxpb-", dir="/tmp"))
    pods: dict[str, list[list[tuple[str, list[float]]]]] = {target: [] for target in TARGETS}
    plugin: dict[str, dict[str, list[float]]] = {t: {"registered_s": [], "rss_mib": []} for t in PLUGINS}
    inside: dict[str, list[dict[str, list[float]]]] = {t: [] for t in PLUGINS}
    cpu: dict[str, list[float]] = {t: [] for t in CPU_ROWS}
    inside_calls: dict[str, list[dict[str, list[int]]]] = {t: [] for t in PLUGINS}
    try:
        bed.start()
        config_dir = work / "hookserver.d"
        proxy_args = [
            *PROXY,
            "serve",
            "--endpoint",
            f"unix://{work / 'proxy.sock'}",
            "--remote-runtime-endpoint",
            bed.address,
            "--hook-config-dir",
            str(config_dir),
            "--cgroup-parent-root",
            "/" + bed.cgroup_prefix,
            "--log-format",
            "json",
        ]
        proxy_hooks = hooks_args(bed, work, "--hook-config-dir", str(config_dir))
        first, last = work / "probe-01.txt", work / "probe-99.txt"
        with (
            go_plugin(binary, bed, work, "-index", "01", "-name", "probe", "-probe", str(first)),
            go_plugin(binary, bed, work, "-index", "99", "-name", "probe", "-probe", str(last)),
            daemon(work, "proxy", proxy_args),
            daemon(work, "hooks-proxy", proxy_hooks),
        ):
            time.sleep(1.0)  # the probes register, the proxy picks the hook server's registration up
            hooks_pid, proxy_pid = _pid_of(work / "hooks.sock"), _pid_of(work / "proxy.sock")
            pods_block(bed, bed.address, 2)  # warm-up: images, page cache
            for number in range(args.rounds):
                order = TARGETS[number % len(TARGETS) :] + TARGETS[: number % len(TARGETS)]
                for target in order:
                    if target in PLUGINS:
                        with (
                            plugin_under_test(target, binary, bed, work, plugin[target]) as pid,
                            cpu_per_pod(pid, args.pods, cpu[target]),
                        ):
                            pods[target].append(pods_block(bed, bed.address, args.pods))
                    elif target == "proxy":
                        with (
                            cpu_per_pod(hooks_pid, args.pods, cpu["proxy: runtime-hooks"]),
                            cpu_per_pod(proxy_pid, args.pods, cpu["proxy: runtime-proxy"]),
                        ):
                            pods[target].append(pods_block(bed, f"unix://{work / 'proxy.sock'}", args.pods))
                    else:
                        pods[target].append(pods_block(bed, bed.address, args.pods))
                for target in PLUGINS if args.traced else ():
                    trace = work / f"trace-{target}-{number}.txt"
                    record: dict[str, list[float]] = {"registered_s": [], "rss_mib": []}  # not the traced ones
                    with plugin_under_test(target, binary, bed, work, record) as pid, traced(pid, trace):
                        pods_block(bed, bed.address, args.traced)
                    times, file_calls = inside_times(trace)
                    inside[target].append(times)
                    inside_calls[target].append(file_calls)
        probes = (probe_times(first), probe_times(last))
    finally:
        with contextlib.suppress(Exception):
            bed.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return summarize(pods, probes, plugin, inside, cpu, inside_calls)


def _spread(rounds: list[float]) -> dict[str, float]:
    return {"min": min(rounds), "max": max(rounds)} if rounds else {}


def _p50(values: list[float]) -> float:
    return percentile(sorted(values), 0.5) if values else float("nan")


def summarize(
    pods: dict[str, list[list[tuple[str, list[float]]]]],
    probes: tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]],
    plugin: dict[str, dict[str, list[float]]],
    inside: dict[str, list[dict[str, list[float]]]],
    cpu: dict[str, list[float]] | None = None,
    inside_calls: dict[str, list[dict[str, list[int]]]] | None = None,
) -> dict[str, Any]:
    first, last = probes
    result: dict[str, Any] = {"added_ms": {}, "inside_ms": {}, "pod_start": {}, "plugin": {}, "cpu_ms_per_pod": {}}
    for row_name, blocks in (cpu or {}).items():
        if blocks:
            result["cpu_ms_per_pod"][row_name] = {"mean": statistics.mean(blocks), "rounds": _spread(blocks)}
    between: dict[str, dict[str, list[list[float]]]] = {}
    for target, rounds in pods.items():
        between[target] = {event: [] for event in EVENTS}
        for block in rounds:
            for event in EVENTS:
                times = [
                    last[(event, uid)] - first[(event, uid)]
                    for uid, _ in block
                    if (event, uid) in first and (event, uid) in last
                ]
                between[target][event].append(times)
    for target in TARGETS:
        row = {}
        for event in EVENTS:
            pooled = [t for block in between[target][event] for t in block]
            base = [t for block in between["none"][event] for t in block]
            per_round = [
                (_p50(b) - _p50(n)) * 1e3 for b, n in zip(between[target][event], between["none"][event], strict=True)
            ]
            row[event] = {
                "between_p50": _p50(pooled) * 1e3,
                "added_p50": (_p50(pooled) - _p50(base)) * 1e3,
                "count": len(pooled),
                "rounds": _spread(per_round),
            }
        result["added_ms"][target] = row
    for target in PLUGINS:
        row = {}
        for event in EVENTS:
            per_round = [_p50(r.get(event, [])) * 1e3 for r in inside[target] if r.get(event)]
            pooled = [t for r in inside[target] for t in r.get(event, [])]
            file_calls = [float(n) for r in (inside_calls or {}).get(target, []) for n in r.get(event, [])]
            row[event] = {
                "p50": _p50(pooled) * 1e3,
                "count": len(pooled),
                "rounds": _spread(per_round),
                "file_calls_p50": _p50(file_calls),
            }
        result["inside_ms"][target] = row
    none_mean = statistics.mean(sum(calls) for block in pods["none"] for _, calls in block)
    go_mean = statistics.mean(sum(calls) for block in pods["go"] for _, calls in block)
    for target, rounds in pods.items():
        starts = [sum(calls) for block in rounds for _, calls in block]
        per_round = [
            statistics.mean(sum(c) for _, c in block) / statistics.mean(sum(c) for _, c in base)
            for block, base in zip(rounds, pods["none"], strict=True)
        ]
        result["pod_start"][target] = {
            "pods": len(starts),
            "p50_ms": _p50(starts) * 1e3,
            "mean_ms": statistics.mean(starts) * 1e3,
            "vs_none": statistics.mean(starts) / none_mean,
            "vs_go": statistics.mean(starts) / go_mean,
            "rounds_vs_none": _spread(per_round),
        }
    for target in PLUGINS:
        figures = plugin[target]
        result["plugin"][target] = {
            "rss_mib": statistics.mean(figures["rss_mib"]),
            "rss_spread": _spread(figures["rss_mib"]),
            "registered_s": _p50(figures["registered_s"]),
            "registered_spread": _spread(figures["registered_s"]),
        }
    return result


def render(result: dict[str, Any]) -> str:
    lines = [
        "| added per event, p50 (probes 01..99, minus none) | " + " | ".join(EVENTS) + " |",
        "|---|" + "---|" * len(EVENTS),
    ]
    for target, row in result["added_ms"].items():
        cells = [
            f"{r['added_p50']:+.2f} ms ({r['rounds'].get('min', 0):+.2f}..{r['rounds'].get('max', 0):+.2f})"
            for r in row.values()
        ]
        lines.append(f"| {target} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| inside the plugin, p50 (read to answer's write, under strace; file calls in between) | "
        + " | ".join(EVENTS)
        + " |",
        "|---|" + "---|" * len(EVENTS),
    ]
    for target, row in result["inside_ms"].items():
        cells = [
            f"{r['p50']:.3f} ms ({r['rounds'].get('min', 0):.3f}..{r['rounds'].get('max', 0):.3f}, n={r['count']}); "
            f"{r.get('file_calls_p50', float('nan')):.0f} file calls"
            for r in row.values()
        ]
        lines.append(f"| {target} | " + " | ".join(cells) + " |")
    lines += ["", "| pod start | pods | p50 | mean | vs none (rounds) | vs go |", "|---|---|---|---|---|---|"]
    for target, row in result["pod_start"].items():
        spread = row["rounds_vs_none"]
        lines.append(
            f"| {target} | {row['pods']} | {row['p50_ms']:.1f} ms | {row['mean_ms']:.1f} ms | "
            f"{row['vs_none']:.3f}x ({spread['min']:.3f}..{spread['max']:.3f}) | {row['vs_go']:.3f}x |"
        )
    lines += ["", "| process | CPU per pod (mean of the blocks) |", "|---|---|"]
    for row_name, row in result.get("cpu_ms_per_pod", {}).items():
        spread = row["rounds"]
        lines.append(f"| {row_name} | {row['mean']:.2f} ms ({spread['min']:.2f}..{spread['max']:.2f}) |")
    lines += ["", "| plugin | RSS after its block | start to registered, p50 |", "|---|---|---|"]
    for target, row in result["plugin"].items():
        rss, reg = row["rss_spread"], row["registered_spread"]
        lines.append(
            f"| {target} | {row['rss_mib']:.1f} MiB ({rss['min']:.1f}..{rss['max']:.1f}) | "
            f"{row['registered_s']:.3f} s ({reg['min']:.3f}..{reg['max']:.3f}) |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10, help="pods per block (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all targets (default 3)")
    parser.add_argument(
        "--traced", type=int, default=5, help="pods per round under strace, per plugin (default 5; 0: none)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, traces, probe files)")
    args = parser.parse_args(argv)
    run_and_report(run, render, args)


if __name__ == "__main__":
    main()
