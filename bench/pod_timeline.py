"""Where a pod start's time goes: a per-pod timeline, direct against proxy + runtime-hooks.

    python bench/pod_timeline.py [--pods N] [--warmup-pods N] [--json FILE]

It sets up what part 2 of runtime_hooks_bench.py does (the test bed's containerd, runtime-hooks
with all built-in plugins on the real cgroups and a fake resctrl, the proxy in front of
containerd calling it) with both daemons tracing (RUNTIMEPROXY_TRACE, runtimeproxy/trace.py)
into one file, starts pods one at a time, direct and proxied in alternation, LS and BE in turn,
and prints for each proxied pod, and averaged, each CRI call as the client saw it split into:
the way to the proxy, waiting for the call's ordering keys, the hook layer's own work, each
hook call (runtime-hooks' time inside, each plugin, and the rest: gRPC and wake-ups on both
sides), the runtime (request sent to answer received, as the proxy sees it), and the way back;
plus each daemon's CPU and run-queue wait during the start (schedstat). The last lines set the
sum of the added parts against the paired difference to the direct neighbour.
See bench/README.md ("Pod-start timeline").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hooks_bench import interleaved, paired, pod_spec
from relay_bench import Client, background_cpus, workdir
from runtime_hooks_bench import CLIENT_SCRIPT, KINDS, POLICY, HookedProxy, fake_resctrl, scratch_dir
from runtime_hooks_client import KUBE_QOS

from runtimeproxy.testbed import Containerd
from runtimeproxy.trace import ENV as TRACE_ENV

TARGETS = ("direct", "proxy")
STEPS = ("RunPodSandbox", "CreateContainer", "StartContainer")
# The parts of a proxied call, in the order they happen (ms); "runtime" is not added time.
PARTS = ("to proxy", "keys", "layer", "hooks", "runtime", "back")
ADDED = ("to proxy", "keys", "layer", "hooks", "back")
NS = 1e-6  # ns -> ms


def run_pods(args: argparse.Namespace, work: Path, scratch: Path, trace: Path) -> dict[str, Any]:
    """Start the pods; the client's answer per pod, with its target and uid."""
    bed = Containerd(pod_network=False)
    stack: HookedProxy | None = None
    client: Client | None = None
    os.environ[TRACE_ENV] = str(trace)  # both daemons inherit it; the client and bed do not trace
    try:
        bed.start()
        (work / "built-in.yaml").write_text("")  # the resctrl section is the built-in one either way
        resctrl = fake_resctrl(scratch / "resctrl", work / "built-in.yaml")
        stack = HookedProxy.make(work, bed, resctrl, work / "policy.yaml", "hooks")
        stack.start()
        proxy, server = stack.proxy, stack.hooks
        del os.environ[TRACE_ENV]
        client = Client(CLIENT_SCRIPT)
        assert bed.pid is not None
        watch = {"proxy": proxy.pid, "runtime-hooks": server.pid, "containerd": bed.pid}
        sockets = {"direct": str(bed.socket), "proxy": str(proxy.socket)}

        def run_groups(groups: list[list[str]], label: str) -> tuple[list[dict[str, str]], dict[str, Any]]:
            assert client is not None
            specs = []
            for k, group in enumerate(groups):
                kind = KINDS[k % 2]
                for target in group:
                    spec = pod_spec(bed, sockets[target], f"tl-{label}-{len(specs)}-{target}", KUBE_QOS[kind])
                    specs.append({**spec, "kind": kind, "target": target})
            return specs, client.run(op="pods", image=bed.test_image, watch=watch, pods=specs)

        run_groups(interleaved(TARGETS, 0, 2 * args.warmup_pods), "warm")
        background = background_cpus(2.0)
        specs, answer = run_groups(interleaved(TARGETS, 1, args.pods), "timed")
        pids = {"proxy": proxy.pid, "runtime-hooks": server.pid}
        return {"specs": specs, "answer": answer, "background_cpus": background, "pids": pids}
    finally:
        os.environ.pop(TRACE_ENV, None)
        if client is not None:
            client.close()
        if stack is not None:
            stack.stop()
        bed.stop()


def read_trace(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            print(f"pod_timeline: unreadable trace line skipped: {line[:80]!r}", file=sys.stderr)
    return sorted(events, key=lambda e: e["t"])


def calls_by_uid(events: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The proxy's marks of each intercepted call (t of held, keys, sent, answered, released) by
    pod uid and method, with its hook calls."""
    marks: dict[int, dict[str, Any]] = defaultdict(dict)
    for e in events:
        if e["ev"] in ("proxy.held", "proxy.keys", "proxy.sent", "proxy.answered", "proxy.released"):
            mark = marks[e["call"]]
            mark.setdefault(e["ev"].removeprefix("proxy."), e["t"])
            mark.update({k: e[k] for k in ("method", "uid") if e.get(k)})
            mark.setdefault("cpu", {})[e["ev"]] = e["cpu"]
    found: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for mark in marks.values():
        if "uid" in mark and "method" in mark and "released" in mark:
            found[mark["uid"]][mark["method"]] = mark
    return found


def hook_calls(events: list[dict[str, Any]], proxy_pid: int) -> list[dict[str, Any]]:
    """Each hook call as the proxy timed it, with runtime-hooks' RPC and plugin events inside it."""
    rpcs = [e for e in events if e["ev"] == "hooks.rpc"]
    plugins = [e for e in events if e["ev"] == "hooks.plugin"]
    calls = []
    for e in events:
        if e["ev"] != "proxy.hook" or e["pid"] != proxy_pid:
            continue
        begin, end = e["began"], e["t"]
        inside = [r for r in rpcs if r["hook"] == e["hook"] and r["uid"] == e["uid"] and begin <= r["began"] <= end]
        rpc = inside[0] if inside else None
        mine = [p for p in plugins if rpc is not None and rpc["began"] <= p["t"] <= rpc["t"]]
        calls.append({"hook": e["hook"], "uid": e["uid"], "began": begin, "ended": end,
                      "server_ms": (rpc["t"] - rpc["began"]) * NS if rpc else None,
                      "to_server_ms": (rpc["began"] - begin) * NS if rpc else None,
                      "from_server_ms": (end - rpc["t"]) * NS if rpc else None,
                      "plugins_ms": {p["plugin"]: p["seconds"] * 1e3 for p in mine}})
    return calls


def pod_timeline(pod: dict[str, Any], calls: dict[str, dict[str, Any]], hooks: list[dict[str, Any]]) -> dict[str, Any]:
    """The proxied pod's steps split into PARTS (ms), with the hook calls in each step."""
    steps = {}
    for n, step in enumerate(STEPS):
        began, ended = pod["step_bounds"][n]
        mark = calls.get(step)
        if mark is None or not {"held", "keys", "sent", "answered"} <= mark.keys():
            steps[step] = {"client_ms": (ended - began) * NS, "traced": False}
            continue
        in_call = [h for h in hooks if mark["keys"] <= h["began"] <= mark["sent"]]
        hooks_ms = sum((h["ended"] - h["began"]) * NS for h in in_call)
        parts = {
            "to proxy": (mark["held"] - began) * NS,
            "keys": (mark["keys"] - mark["held"]) * NS,
            "layer": (mark["sent"] - mark["keys"]) * NS - hooks_ms,
            "hooks": hooks_ms,
            "runtime": (mark["answered"] - mark["sent"]) * NS,
            "back": (ended - mark["answered"]) * NS,
        }
        steps[step] = {"client_ms": (ended - began) * NS, "traced": True, "parts": parts, "hook_calls": in_call,
                       "proxy_cpu_ms": (mark["cpu"].get("proxy.answered", 0) - mark["cpu"].get("proxy.held", 0)) * NS}
    after = [h for h in hooks if h["began"] > pod["step_bounds"][-1][1] - 1]  # post-hooks after the start
    return {"steps": steps, "post_hooks_after": after}


def build(run: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    answer, specs = run["answer"], run["specs"]
    calls = calls_by_uid(events)
    hooks = hook_calls(events, run["pids"]["proxy"])
    pods = []
    for n, spec in enumerate(specs):
        steps = answer["steps"][n]
        end = answer["ended"][n] * 1e9
        bounds, t = [], end - sum(steps) * 1e9
        for seconds in steps:
            bounds.append((t, t + seconds * 1e9))
            t += seconds * 1e9
        pod = {"target": spec["target"], "kind": spec["kind"], "uid": spec["uid"], "start_ms": sum(steps) * 1e3,
               "step_bounds": bounds, "sched": answer["sched_start"][n]}
        if spec["target"] == "proxy":
            mine = [h for h in hooks if h["uid"] == spec["uid"]]
            pod.update(pod_timeline(pod, calls.get(spec["uid"], {}), mine))
        pods.append(pod)
    return {"pods": pods, "background_cpus": run["background_cpus"], "trace_events": len(events)}


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def aggregate(report: dict[str, Any]) -> dict[str, Any]:
    pods = report["pods"]
    proxied = [p for p in pods if p["target"] == "proxy" and all(s["traced"] for s in p["steps"].values())]
    direct = [p for p in pods if p["target"] == "direct"]
    # Each proxied pod against its direct neighbour in the run (the pods alternate).
    pairs = [(pods[i], pods[i - 1] if i % 2 else pods[i + 1]) for i in range(len(pods) - len(pods) % 2)
             if pods[i]["target"] == "proxy"]
    by_step: dict[str, dict[str, float]] = {}
    for step in STEPS:
        row = {part: _mean([p["steps"][step]["parts"][part] for p in proxied]) for part in PARTS}
        row["client"] = _mean([p["steps"][step]["client_ms"] for p in proxied])
        n = STEPS.index(step)
        row["direct"] = _mean([(b - a) * NS for p in direct for a, b in [p["step_bounds"][n]]])
        by_step[step] = row
    hooks: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in proxied:
        for step in STEPS:
            for h in p["steps"][step]["hook_calls"]:
                for key in ("server_ms", "to_server_ms", "from_server_ms"):
                    if h[key] is not None:
                        hooks[h["hook"]][key].append(h[key])
                hooks[h["hook"]]["round_trip_ms"].append((h["ended"] - h["began"]) * NS)
                for plugin, ms in h["plugins_ms"].items():
                    hooks[h["hook"]][plugin].append(ms)
    sched = {name: {"cpu_ms": {t: _mean([p["sched"][name][0] * NS for p in pods if p["target"] == t])
                               for t in TARGETS},
                    "runqueue_ms": {t: _mean([p["sched"][name][1] * NS for p in pods if p["target"] == t])
                                    for t in TARGETS}}
             for name in (pods[0]["sched"] if pods else {})}
    added = paired([a["start_ms"] / 1e3 for a, _ in pairs], [b["start_ms"] / 1e3 for _, b in pairs])
    return {"by_step": by_step, "hooks": {h: {k: _mean(v) for k, v in d.items()} for h, d in hooks.items()},
            "sched": sched, "paired_added": added, "proxied_pods": len(proxied), "direct_pods": len(direct),
            "direct_mean_ms": _mean([p["start_ms"] for p in direct]),
            "proxy_mean_ms": _mean([p["start_ms"] for p in proxied])}


def print_report(report: dict[str, Any], per_pod: bool) -> None:
    agg = report["aggregate"]
    print(f"\nPod-start timeline: {agg['proxied_pods']} proxied and {agg['direct_pods']} direct pods, alternating; "
          f"background load before: {report['background_cpus']:.2f} CPUs busy; {report['trace_events']} trace events")
    if per_pod:
        print("\nPer proxied pod (ms): step client = to proxy + keys + layer + hooks + runtime + back")
        for p in report["pods"]:
            if p["target"] != "proxy":
                continue
            print(f"  {p['uid'][:8]} {p['kind']} start {p['start_ms']:.1f}")
            for step, s in p["steps"].items():
                if not s["traced"]:
                    print(f"    {step:<16}{s['client_ms']:8.2f}  (no trace)")
                    continue
                parts = "  ".join(f"{k} {v:.2f}" for k, v in s["parts"].items())
                hooks = "; ".join(f"{h['hook']} {(h['ended'] - h['began']) * NS:.2f} (in runtime-hooks "
                                  f"{h['server_ms'] or 0:.2f}: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                                             h["plugins_ms"].items()) + ")"
                                  for h in s["hook_calls"])
                print(f"    {step:<16}{s['client_ms']:8.2f}  {parts}" + (f"\n{'':22}{hooks}" if hooks else ""))
    print("\nMeans by step (ms): the proxied call split in its parts, against the direct step")
    head = f"{'step':<17}" + "".join(f"{part:>10}" for part in PARTS) + f"{'client':>9}{'direct':>9}{'added':>8}"
    print(head)
    print("-" * len(head))
    total_added = 0.0
    for step, row in agg["by_step"].items():
        added = sum(row[part] for part in ADDED)
        total_added += added
        print(f"{step:<17}" + "".join(f"{row[part]:>10.2f}" for part in PARTS)
              + f"{row['client']:>9.2f}{row['direct']:>9.2f}{added:>8.2f}")
    runtime_gap = sum(row["runtime"] - row["direct"] for row in agg["by_step"].values())
    print("\nHook calls (ms, means): round trip as the proxy times it = to runtime-hooks + inside + back; plugins "
          "inside")
    for hook, h in agg["hooks"].items():
        plugins = ", ".join(f"{k} {v:.2f}" for k, v in h.items()
                            if k not in ("round_trip_ms", "server_ms", "to_server_ms", "from_server_ms"))
        print(f"  {hook:<22}{h['round_trip_ms']:7.2f} = {h.get('to_server_ms', 0):.2f} + {h.get('server_ms', 0):.2f}"
              f" + {h.get('from_server_ms', 0):.2f}   plugins: {plugins}")
    print("\nDaemons during a pod start (ms, means; schedstat, all threads): on a CPU / runnable, waiting for one")
    for name, s in agg["sched"].items():
        print(f"  {name:<14}" + "   ".join(f"{t}: {s['cpu_ms'][t]:.2f} / {s['runqueue_ms'][t]:.2f}" for t in TARGETS))
    pa = agg["paired_added"]
    print(f"\nStart: direct {agg['direct_mean_ms']:.1f} ms, proxied {agg['proxy_mean_ms']:.1f} ms; paired added "
          f"{pa['mean_ms']:+.2f} ± {pa['ci95_ms']:.2f} ms (median {pa['median_ms']:+.2f})")
    print(f"Explained: added parts {total_added:.2f} ms + runtime slower through the proxy than direct "
          f"{runtime_gap:+.2f} ms = {total_added + runtime_gap:.2f} ms")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=10, help="timed pods per target (default 10)")
    parser.add_argument("--warmup-pods", type=int, default=1, help="untimed pods per target and kind (default 1)")
    parser.add_argument("--per-pod", action="store_true", help="print every proxied pod's timeline too")
    parser.add_argument("--json", type=Path, help="also write the timelines and means to this file")
    args = parser.parse_args(argv)
    if args.pods < 1 or args.warmup_pods < 0:
        parser.error("--pods must be at least 1, --warmup-pods at least 0")
    if os.geteuid() != 0:
        sys.exit("pod_timeline.py runs containerd and must run as root")
    began = time.monotonic()
    with workdir() as work, scratch_dir() as scratch:
        (work / "policy.yaml").write_text(POLICY)
        trace = work / "trace.jsonl"
        run = run_pods(args, work, scratch, trace)
        report = build(run, read_trace(trace))
    report["aggregate"] = aggregate(report)
    print_report(report, args.per_pod)
    print(f"\nWall time {time.monotonic() - began:.1f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"Figures written to {args.json}")


if __name__ == "__main__":
    main()
