"""Where a pod start's time goes: a per-pod timeline, direct against proxy + runtime-hooks.

    python bench/pod_timeline.py [--pods N] [--rounds N] [--warmup-pods N] [--per-pod] [--json FILE]
    python bench/pod_timeline.py --pool FILE [FILE ...]

It sets up what part 2 of runtime_hooks_bench.py does (the test bed's containerd, runtime-hooks
with all built-in plugins on the real cgroups and a fake resctrl, a proxy in front of
containerd calling it) and, as hooks_bench.py does, a second proxy calling the no-op hook server
on all 13 hook points, with the daemons tracing (RUNTIMEPROXY_TRACE, runtimeproxy/common/trace.py) into
one file. It starts pods one at a time, direct and through each proxy in alternation, LS and BE
in turn, prints each target's pod start against the direct pods' as ratios (against the project's
targets), and for each proxied pod, and averaged, each CRI call as the client saw it split into:
the way to the proxy, waiting for the call's ordering keys, the hook layer's own work, each
hook call (runtime-hooks' time inside, each plugin, and the rest: gRPC and wake-ups on both
sides), the runtime (request sent to answer received, as the proxy sees it), and the way back;
plus each daemon's CPU and run-queue wait during the start (schedstat). The last lines set the
sum of the added parts against the paired difference to the direct neighbour.
One run's 95% interval is about +-2.5% here; ``--pool`` reads the --json files of several runs
and prints their ratios pooled (each pod paired with the direct pod of its own run and group).
Both also print the ratios without the groups a reconcile round of runtime-hooks overlapped.
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

from hooks_bench import CLIENT_SCRIPT as HOOKS_CLIENT_SCRIPT
from hooks_bench import HookServer, interleaved, paired, pod_spec, register_hook_server
from relay_bench import Client, Proxy, background_cpus, percentile, require_root, workdir
from runtime_hooks_bench import CLIENT_SCRIPT, KINDS, POLICY, HookedProxy, fake_resctrl, scratch_dir
from runtime_hooks_client import KUBE_QOS

from runtimeproxy.common.trace import ENV as TRACE_ENV
from runtimeproxy.testbed import Containerd

TARGETS = ("direct", "hooks", "noop")
PROXIED = TARGETS[1:]
LABELS = {"direct": "direct", "hooks": "proxy + runtime-hooks (all built-in plugins)",
          "noop": "proxy + no-op hook server on all 13 points"}
SHORT_LABELS = {"hooks": "runtime-hooks", "noop": "no-op on all 13 points"}
RATIO_TARGETS = {"hooks": 1.03, "noop": 1.02}  # the project's pod-start targets, paired ratio to direct
SPACED_GAP = 0.02  # s of idle before each spaced Version call: as between a pod start's calls
STEPS = ("RunPodSandbox", "CreateContainer", "StartContainer")
# The parts of a proxied call, in the order they happen (ms); a direct call has "to proxy",
# "runtime" and "back" too (to containerd, in it, back), not "keys", "layer" and "hooks".
PARTS = ("to proxy", "keys", "layer", "hooks", "runtime", "back")
NS = 1e-6  # ns -> ms


def run_pods(args: argparse.Namespace, work: Path, scratch: Path, trace: Path) -> dict[str, Any]:
    """Start the pods, in rounds; the client's answers with each pod's target, kind and uid."""
    bed = Containerd(pod_network=False)
    stack: HookedProxy | None = None
    noop: HookServer | None = None
    noop_proxy: Proxy | None = None
    client: Client | None = None
    os.environ[TRACE_ENV] = str(trace)  # the daemons inherit it; the client and bed do not trace
    try:
        bed.start()
        resctrl = fake_resctrl(scratch / "resctrl")
        stack = HookedProxy.make(work, bed, resctrl, work / "policy.yaml", "hooks")
        stack.start()
        noop = HookServer(work)
        noop.start()
        noop_proxy = Proxy(work, bed.address, name="noop")
        noop_proxy.argv += ["--cgroup-parent-root", f"/{bed.cgroup_prefix}"]
        register_hook_server(noop_proxy.hook_dir, noop.socket)
        noop_proxy.start()
        del os.environ[TRACE_ENV]
        client = Client(CLIENT_SCRIPT)
        assert bed.pid is not None
        watch = {"proxy": stack.proxy.pid, "runtime-hooks": stack.hooks.pid, "proxy (no-op)": noop_proxy.pid,
                 "no-op server": noop.pid, "containerd": bed.pid}
        sockets = {"direct": str(bed.socket), "hooks": str(stack.proxy.socket), "noop": str(noop_proxy.socket)}

        def run_groups(groups: list[list[str]], label: str) -> tuple[list[dict[str, str]], dict[str, Any]]:
            assert client is not None
            specs: list[dict[str, str]] = []
            for k, group in enumerate(groups):
                kind = KINDS[k % 2]
                for target in group:
                    spec = pod_spec(bed, sockets[target], f"tl-{label}-{len(specs)}-{target}", KUBE_QOS[kind])
                    specs.append({**spec, "kind": kind, "target": target, "group": f"{label}-{k}"})
            return specs, client.run(op="pods", image=bed.test_image, watch=watch, pods=specs,
                                     settle=args.settle_ms / 1e3)

        run_groups(interleaved(TARGETS, 0, 2 * args.warmup_pods), "warm")
        background = background_cpus(2.0)
        specs: list[dict[str, str]] = []
        answer: dict[str, list[Any]] = defaultdict(list)
        for n in range(args.rounds):  # pods are removed after each round: containerd's load stays flat
            round_specs, round_answer = run_groups(interleaved(TARGETS, 1 + n * args.pods, args.pods), str(n))
            specs += round_specs
            for key in ("steps", "ended", "sched_start"):
                answer[key] += round_answer[key]
        pids = {"hooks": stack.proxy.pid, "noop": noop_proxy.pid, "runtime-hooks": stack.hooks.pid}
        spaced = spaced_calls(args.spaced_calls, sockets)
        return {"specs": specs, "answer": answer, "background_cpus": background, "pids": pids,
                "load_after": os.getloadavg(), "spaced": spaced}
    finally:
        os.environ.pop(TRACE_ENV, None)
        if client is not None:
            client.close()
        for service in (noop_proxy, noop):
            if service is not None:
                service.stop()
        if stack is not None:
            stack.stop()
        bed.stop()


def spaced_calls(calls: int, sockets: dict[str, str]) -> dict[str, list[float]]:
    """Version (relayed, never hooked) after an idle gap, direct and through each proxy in turn: what
    one relayed call costs when the processes have gone idle in between, as in a pod start."""
    if calls < 1:
        return {}
    client = Client(HOOKS_CLIENT_SCRIPT)
    try:
        latencies: dict[str, list[float]] = client.run(op="spaced", sockets=sockets, calls=calls,
                                                       gap=SPACED_GAP)["latencies"]
    finally:
        client.close()
    return latencies


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
    marks: dict[tuple[int, int], dict[str, Any]] = defaultdict(dict)
    for e in events:
        if e["ev"] in ("proxy.held", "proxy.keys", "proxy.sent", "proxy.answered", "proxy.released"):
            mark = marks[e["pid"], e["call"]]  # call serials are per proxy process
            mark.setdefault(e["ev"].removeprefix("proxy."), e["t"])
            mark.update({k: e[k] for k in ("method", "uid") if e.get(k)})
            mark.setdefault("cpu", {})[e["ev"]] = e["cpu"]
    found: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for mark in marks.values():
        if "uid" in mark and "method" in mark and "released" in mark:
            found[mark["uid"]][mark["method"]] = mark
    return found


def hook_calls(events: list[dict[str, Any]], proxy_pids: set[int]) -> list[dict[str, Any]]:
    """Each hook call as a proxy timed it, with runtime-hooks' RPC and plugin events inside it (none
    for the no-op server, which does not trace: its calls are round trips only)."""
    rpcs = [e for e in events if e["ev"] == "hooks.rpc"]
    plugins = [e for e in events if e["ev"] == "hooks.plugin"]
    calls = []
    for e in events:
        if e["ev"] != "proxy.hook" or e["pid"] not in proxy_pids:
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
    """The proxied pod's steps split into PARTS (ms), with the hook calls in each step; the hook
    calls that ran while the client waited for nothing (post-hooks after the start's last answer)
    are listed apart."""
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
    in_steps = {id(h) for s in steps.values() for h in s.get("hook_calls", [])}
    return {"steps": steps, "off_path_hooks": [h for h in hooks if id(h) not in in_steps]}


def build(run: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    answer, specs = run["answer"], run["specs"]
    calls = calls_by_uid(events)
    hooks = hook_calls(events, {run["pids"][t] for t in PROXIED})
    rounds = [(e["began"], e["t"]) for e in events if e["ev"] == "hooks.reconcile"]  # runtime-hooks' reconciler
    pods = []
    for n, spec in enumerate(specs):
        steps = answer["steps"][n]
        end = answer["ended"][n] * 1e9
        bounds, t = [], end - sum(steps) * 1e9
        for seconds in steps:
            bounds.append((t, t + seconds * 1e9))
            t += seconds * 1e9
        pod = {"target": spec["target"], "kind": spec["kind"], "uid": spec["uid"], "group": spec["group"],
               "start_ms": sum(steps) * 1e3, "step_bounds": bounds, "sched": answer["sched_start"][n],
               "reconciled": any(b < bounds[-1][1] and e > bounds[0][0] for b, e in rounds)}
        if spec["target"] != "direct":
            mine = [h for h in hooks if h["uid"] == spec["uid"]]
            pod.update(pod_timeline(pod, calls.get(spec["uid"], {}), mine))
        pods.append(pod)
    return {"pods": pods, "background_cpus": run["background_cpus"], "load_after": run["load_after"],
            "trace_events": len(events), "spaced_ms": {t: percentile(sorted(v), 0.5) * 1e3
                                                       for t, v in run["spaced"].items()}}


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def ratios(pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each proxied target's pod start against the direct pods: pooled mean and p50 ratios, and
    paired with the direct pod of the same group (the pods alternate one by one)."""
    by_group: dict[str, dict[str, float]] = defaultdict(dict)
    for p in pods:
        by_group[p["group"]][p["target"]] = p["start_ms"] / 1e3
    direct = sorted(p["start_ms"] for p in pods if p["target"] == "direct")
    found = {}
    for target in PROXIED:
        mine = sorted(p["start_ms"] for p in pods if p["target"] == target)
        pairs = [(g[target], g["direct"]) for g in by_group.values() if target in g and "direct" in g]
        added = paired([a for a, _ in pairs], [b for _, b in pairs])
        found[target] = {"pods": len(mine), "mean_ms": _mean(mine), "p50_ms": percentile(mine, 0.5),
                         "mean_ratio": _mean(mine) / _mean(direct),
                         "p50_ratio": percentile(mine, 0.5) / percentile(direct, 0.5),
                         "paired": added, "paired_ratio": 1 + added["mean_ms"] / _mean(direct),
                         "paired_ratio_ci": added["ci95_ms"] / _mean(direct), "target": RATIO_TARGETS[target]}
    found["direct"] = {"pods": len(direct), "mean_ms": _mean(direct), "p50_ms": percentile(direct, 0.5)}
    return found


def outside_reconcile(pods: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The pods of the groups none of whose starts a reconcile round of runtime-hooks overlapped,
    and how many groups were left out. A round takes tens of ms of CPU once an interval and slows
    whichever start it meets, direct ones too: a few such starts move a run's ratios by more than
    the targets' margins, either way."""
    hit = {p["group"] for p in pods if p.get("reconciled")}
    return [p for p in pods if p["group"] not in hit], len(hit)


def print_outside_reconcile(pods: list[dict[str, Any]]) -> None:
    clear, left_out = outside_reconcile(pods)
    if not left_out:
        return
    r = ratios(clear)
    print(f"  without the {left_out} groups a reconcile round overlapped: " + ", ".join(
        f"{SHORT_LABELS[t]} {r[t]['paired_ratio']:.3f}x ± {r[t]['paired_ratio_ci']:.3f}" for t in PROXIED))


def aggregate(report: dict[str, Any], target: str) -> dict[str, Any]:
    """The means of one proxied target's pods, by step and part, by hook point, and per daemon."""
    pods = report["pods"]
    proxied = [p for p in pods if p["target"] == target and all(s["traced"] for s in p["steps"].values())]
    direct = [p for p in pods if p["target"] == "direct"]
    by_step: dict[str, dict[str, float]] = {}
    for step in STEPS:
        row = {part: _mean([p["steps"][step]["parts"][part] for p in proxied]) for part in PARTS}
        row["client"] = _mean([p["steps"][step]["client_ms"] for p in proxied])
        n = STEPS.index(step)
        row["direct"] = _mean([(b - a) * NS for p in direct for a, b in [p["step_bounds"][n]]])
        by_step[step] = row
    hooks: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    calls: dict[str, int] = defaultdict(int)
    for p in proxied:
        on_path = [h for step in STEPS for h in p["steps"][step]["hook_calls"]]
        for h in on_path + [{**h, "hook": h["hook"] + " (off the path)"} for h in p["off_path_hooks"]]:
            calls[h["hook"]] += 1
            for key in ("server_ms", "to_server_ms", "from_server_ms"):
                if h[key] is not None:
                    hooks[h["hook"]][key].append(h[key])
            hooks[h["hook"]]["round_trip_ms"].append((h["ended"] - h["began"]) * NS)
            for plugin, ms in h["plugins_ms"].items():
                hooks[h["hook"]][plugin].append(ms)
    # A plugin's mean is over every call of its hook point (0 where it did nothing): what it costs a pod.
    hook_means = {h: {k: sum(v) / calls[h] if k not in ("server_ms", "to_server_ms", "from_server_ms",
                                                         "round_trip_ms") else _mean(v)
                      for k, v in d.items()} for h, d in hooks.items()}
    sched = {name: {t: (_mean([p["sched"][name][0] * NS for p in pods if p["target"] == t]),
                        _mean([p["sched"][name][1] * NS for p in pods if p["target"] == t]))
                    for t in ("direct", target)}
             for name in (pods[0]["sched"] if pods else {})}
    return {"by_step": by_step, "hooks": hook_means, "calls_per_pod": {h: n / max(len(proxied), 1)
                                                                       for h, n in calls.items()},
            "sched": sched, "proxied_pods": len(proxied), "direct_pods": len(direct)}


def print_ratios(report: dict[str, Any]) -> None:
    r = report["ratios"]
    settle = f", {report['settle_ms']:g} ms idle before each" if report.get("settle_ms") else ", back to back"
    print(f"\nPod start, {r['direct']['pods']} pods per target alternating one by one{settle}; background load before: "
          f"{report['background_cpus']:.2f} CPUs busy, load average after "
          + "/".join(f"{x:.2f}" for x in report["load_after"]))
    head = f"{'':<46}{'mean':>9}{'p50':>9}{'mean x':>8}{'p50 x':>7}{'paired added':>20}{'paired x':>16}  target"
    print(head)
    print("-" * len(head))
    d = r["direct"]
    print(f"{LABELS['direct']:<46}{d['mean_ms']:>7.1f}ms{d['p50_ms']:>7.1f}ms")
    for target in PROXIED:
        t, pa = r[target], r[target]["paired"]
        met = "met" if t["paired_ratio"] <= t["target"] else "MISSED"
        print(f"{LABELS[target]:<46}{t['mean_ms']:>7.1f}ms{t['p50_ms']:>7.1f}ms{t['mean_ratio']:>7.3f}x"
              f"{t['p50_ratio']:>6.3f}x{pa['mean_ms']:>+9.2f} ± {pa['ci95_ms']:.2f} ms"
              f"{t['paired_ratio']:>8.3f}x ± {t['paired_ratio_ci']:.3f}  <= {t['target']:.2f}x: {met}")
    print_outside_reconcile(report["pods"])


def pooled_pods(reports: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods of several runs' reports, their groups made distinct per run (pairs stay in a run)."""
    return [{**pod, "group": f"{n}-{pod['group']}"} for n, report in enumerate(reports) for pod in report["pods"]]


def print_pooled(paths: Sequence[Path]) -> None:
    reports = [json.loads(path.read_text()) for path in paths]
    print(f"{'run (paired x, 95% CI)':<40}" + "".join(f"{SHORT_LABELS[t]:>32}" for t in PROXIED))
    for path, report in zip(paths, reports, strict=True):
        r = ratios(report["pods"])
        print(f"{path!s:<40}" + "".join(
            f"{r[t]['paired_ratio']:>22.3f}x ± {r[t]['paired_ratio_ci']:.3f}" for t in PROXIED))
    r = ratios(pooled_pods(reports))
    print(f"\nPooled, {r['direct']['pods']} pods per target over {len(reports)} runs (paired within each run):")
    for target in PROXIED:
        t, pa = r[target], r[target]["paired"]
        met = "met" if t["paired_ratio"] <= t["target"] else "MISSED"
        print(f"  {LABELS[target]:<46}{t['paired_ratio']:.3f}x ± {t['paired_ratio_ci']:.3f} "
              f"({pa['mean_ms']:+.2f} ms, median {pa['median_ms']:+.2f})  <= {t['target']:.2f}x: {met}")
    print_outside_reconcile(pooled_pods(reports))


def print_spaced(report: dict[str, Any]) -> None:
    spaced = report["spaced_ms"]
    if not spaced:
        return
    print(f"\nOne relayed call after {SPACED_GAP * 1e3:.0f} ms idle (Version, p50): " + ", ".join(
        f"{t} {ms:.3f} ms" + (f" ({ms - spaced['direct']:+.3f})" if t != "direct" else "") for t, ms in spaced.items()))


def print_pods(report: dict[str, Any]) -> None:
    print("\nPer proxied pod (ms): step client = to proxy + keys + layer + hooks + runtime + back")
    for p in report["pods"]:
        if p["target"] == "direct":
            continue
        print(f"  {p['uid'][:8]} {p['target']} {p['kind']} start {p['start_ms']:.1f}")
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


def print_target(report: dict[str, Any], target: str) -> None:
    agg = report["aggregate"][target]
    print(f"\n== {LABELS[target]}: {agg['proxied_pods']} pods ==")
    print("Means by step (ms): the proxied call split in its parts, against the direct step")
    head = f"{'step':<17}" + "".join(f"{part:>10}" for part in PARTS) + f"{'client':>9}{'direct':>9}{'added':>8}"
    print(head)
    print("-" * len(head))
    for step, row in agg["by_step"].items():
        added = row["client"] - row["direct"]
        print(f"{step:<17}" + "".join(f"{row[part]:>10.2f}" for part in PARTS)
              + f"{row['client']:>9.2f}{row['direct']:>9.2f}{added:>8.2f}")
    rows = agg["by_step"].values()
    own = {part: sum(row[part] for row in rows) for part in ("hooks", "keys", "layer")}
    rest = sum(row["client"] - row["direct"] for row in rows) - sum(own.values())
    print("Hook calls (ms, means; per pod): round trip as the proxy times it"
          + (" = to runtime-hooks + inside + back; plugins' handlers inside" if target == "hooks" else ""))
    for hook, h in agg["hooks"].items():
        line = f"  {hook:<38}{agg['calls_per_pod'][hook]:4.1f}x {h['round_trip_ms']:7.2f}"
        if "server_ms" in h:
            plugins = ", ".join(f"{k} {v:.2f}" for k, v in h.items()
                                if k not in ("round_trip_ms", "server_ms", "to_server_ms", "from_server_ms"))
            parts = f"{h['to_server_ms']:.2f} + {h['server_ms']:.2f} + {h['from_server_ms']:.2f}"
            line += f" = {parts}   plugins: {plugins}"
        print(line)
    print("Daemons during a pod start (ms, means; schedstat, all threads): on a CPU / runnable, waiting for one")
    for name, s in agg["sched"].items():
        print(f"  {name:<14}" + "   ".join(f"{t}: {cpu:.2f} / {wait:.2f}" for t, (cpu, wait) in s.items()))
    pa = report["ratios"][target]["paired"]
    # What a direct start does not have at all (hooks, keys, layer), and the rest: the relay's extra
    # hop each way and the runtime's own spread between pods (noise, either sign).
    print(f"Added per pod (pooled means): {sum(own.values()) + rest:+.2f} ms = hooks {own['hooks']:.2f} + keys "
          f"{own['keys']:.2f} + layer {own['layer']:.2f} + relay hops and runtime spread {rest:+.2f}; "
          f"paired with the direct neighbours {pa['mean_ms']:+.2f} ± {pa['ci95_ms']:.2f} ms "
          f"(median {pa['median_ms']:+.2f})")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=int, default=10, help="timed pods per target and round (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; pods are removed after each (default 3)")
    parser.add_argument("--warmup-pods", type=int, default=1, help="untimed pods per target and kind (default 1)")
    parser.add_argument("--spaced-calls", type=int, default=200,
                        help="Version calls per target after an idle gap, after the pods (default 200; 0: none)")
    parser.add_argument("--settle-ms", type=float, default=50.0,
                        help="idle time before each pod start, so the previous pod's post-hooks and the "
                             "runtime's after-work are not timed with the next pod (default 50; 0: back to back)")
    parser.add_argument("--per-pod", action="store_true", help="print every proxied pod's timeline too")
    parser.add_argument("--json", type=Path, help="also write the timelines and means to this file")
    parser.add_argument("--pool", type=Path, nargs="+", metavar="FILE",
                        help="run nothing: pool the ratios of earlier runs' --json files")
    args = parser.parse_args(argv)
    if args.pool:
        print_pooled(args.pool)
        return
    if args.pods < 1 or args.rounds < 1 or args.warmup_pods < 0 or args.settle_ms < 0:
        parser.error("--pods and --rounds must be at least 1, --warmup-pods and --settle-ms at least 0")
    require_root("pod_timeline.py")
    began = time.monotonic()
    with workdir() as work, scratch_dir() as scratch:
        (work / "policy.yaml").write_text(POLICY)
        trace = work / "trace.jsonl"
        run = run_pods(args, work, scratch, trace)
        report = build(run, read_trace(trace))
    report["ratios"] = ratios(report["pods"])
    report["settle_ms"] = args.settle_ms
    report["aggregate"] = {target: aggregate(report, target) for target in PROXIED}
    print(f"{report['trace_events']} trace events")
    if args.per_pod:
        print_pods(report)
    for target in PROXIED:
        print_target(report, target)
    print_spaced(report)
    print_ratios(report)
    print(f"\nWall time {time.monotonic() - began:.1f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"Figures written to {args.json}")


if __name__ == "__main__":
    main()
