"""Pod start with runtime-hooks over NRI, against containerd directly and through the proxy.

    python bench/nri_bench.py [--pods N] [--rounds R] [--json FILE]

One run on trixie's containerd 1.7 test bed with NRI on: each round starts N BestEffort pods
(labelled BE, with Koordinator batch-cpu: the cpu and memory plugins act at RunPodSandbox and
CreateContainer) three ways, in turn:

* ``direct``: straight to containerd, no NRI plugin connected;
* ``nri``: straight to containerd while ``runtime-hooks serve --nri-socket`` is registered
  (started for this block, stopped after it: it must not see the other blocks' pods);
* ``proxy``: through ``runtime-proxy serve`` with ``runtime-hooks`` in proxy mode.

Pod start is RunPodSandbox + CreateContainer + StartContainer as one CRI client sees it, with
each call's p50 beside it (PostStartContainer's cost, if the plugin made containerd wait for it,
shows in StartContainer). The handling time of each NRI event (arrival to the end of its hooks,
the "NRI event handled" log line; notifications are answered before their hooks run) gives
p50/p99/max per event: NRI drops a plugin that takes over 2 s to answer. Figures are ratios
against ``direct`` in the same run; the machine's noise is in them, so the load average before
and after is printed too (run it again for yours).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import runtimeproxy.hooks
from relay_bench import percentile

import runtimeproxy
from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd
from runtimeproxy.testbed.runtimes import locate

TARGETS = ("direct", "nri", "proxy")
CGROUP = Path("/sys/fs/cgroup")
SPEC = json.dumps({"containers": {"app": {"requests": {"kubernetes.io/batch-cpu": "250"},
                                          "limits": {"kubernetes.io/batch-cpu": "500"}}}})
PYTHON = [sys.executable, "-c"]
HOOKS = [*PYTHON, "from runtimeproxy.hooks.cli import main; main()"]
PROXY = [*PYTHON, "from runtimeproxy.proxy.cli import main; main()"]


def wait_ready(proc: subprocess.Popen[bytes], notify: socket.socket, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    notify.settimeout(0.1)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"daemon exited with {proc.returncode} before READY=1")
        with contextlib.suppress(TimeoutError):
            if b"READY=1" in notify.recv(4096):
                return
    raise SystemExit("daemon not ready in time")


@contextlib.contextmanager
def daemon(work: Path, name: str, args: list[str]) -> Iterator[Path]:
    """``args`` running with its own sd_notify socket until the block ends; yields its log file."""
    notify_path = work / f"{name}.notify"
    with contextlib.suppress(FileNotFoundError):
        notify_path.unlink()
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    log = work / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNTIME_", "WATCHDOG_"))}
    env["NOTIFY_SOCKET"] = str(notify_path)
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work)
    try:
        wait_ready(proc, notify)
        yield log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        notify.close()


def compile_project() -> None:
    """Byte-compile the project's modules, as installing the package does: from a source tree
    (an editable install, PYTHONDONTWRITEBYTECODE set) every daemon start would compile them
    again, some 0.2 s of a start to registered that an installed daemon does not spend."""
    for package in (runtimeproxy, runtimeproxy.hooks):
        compileall.compile_dir(str(Path(package.__file__).parent), quiet=1)


def hooks_args(bed: Containerd, work: Path, *extra: str) -> list[str]:
    return [*HOOKS, "serve", "--endpoint", str(work / "hooks.sock"), "--cgroup-driver", "cgroupfs",
            "--cgroup-parent-root", f"/{bed.cgroup_prefix}/kubepods", "--resctrl-root", str(work / "no-resctrl"),
            "--runtime-endpoint", "", "--log-format", "json", *extra]


CALLS = ("RunPodSandbox", "CreateContainer", "StartContainer")


def start_pod(cri: CriClient, bed: Containerd) -> tuple[list[float], str]:
    """Seconds of RunPodSandbox, CreateContainer and StartContainer of one BE pod; its cgroup parent."""
    uid = str(uuid.uuid4())
    parent = bed.cgroup_parent(uid, "besteffort")
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"bench-{uid[:8]}", uid=uid, namespace="nri-bench"),
        labels={"koordinator.sh/qosClass": "BE"},
        annotations={"node.koordinator.sh/extended-resource-spec": SPEC},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=parent,
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
        ),
    )
    container = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app"),
        image=pb.ImageSpec(image=bed.test_image),
        linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(cpu_shares=2, cpu_period=100_000)),
    )
    marks = [time.perf_counter()]
    sandbox = cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id
    marks.append(time.perf_counter())
    request = pb.CreateContainerRequest(pod_sandbox_id=sandbox, config=container, sandbox_config=config)
    container_id = cri.runtime.CreateContainer(request, timeout=60).container_id
    marks.append(time.perf_counter())
    cri.runtime.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=60)
    marks.append(time.perf_counter())
    return [end - begin for begin, end in itertools.pairwise(marks)], parent


def remove_cgroups(parent: str) -> None:
    for hierarchy in CGROUP.iterdir():
        top = hierarchy / parent.lstrip("/")
        if hierarchy.is_symlink() or not top.is_dir():
            continue
        for directory, _dirs, _files in os.walk(top, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def block(bed: Containerd, endpoint: str, pods: int) -> list[list[float]]:
    """Per pod, the seconds of each of CALLS."""
    times, parents = [], []
    with CriClient(endpoint, timeout=60) as cri:
        for _ in range(pods):
            calls, parent = start_pod(cri, bed)
            times.append(calls)
            parents.append(parent)
    bed.remove_all_pods()
    for parent in parents:
        remove_cgroups(parent)
    return times


def event_times(log: Path) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for line in log.read_text(errors="replace").splitlines():
        start = line.find("{")
        with contextlib.suppress(ValueError):
            record = json.loads(line[start:]) if start >= 0 else {}
            if record.get("event") == "NRI event handled":
                found.setdefault(record["nri_event"], []).append(float(record["seconds"]))
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    bed = Containerd(build=locate("1.7"), nri=True)
    work = Path(tempfile.mkdtemp(prefix="rtpxnb-", dir="/tmp"))
    starts: dict[str, list[list[float]]] = {target: [] for target in TARGETS}
    try:
        bed.start()
        config_dir = work / "hookserver.d"
        proxy_args = [*PROXY, "serve", "--endpoint", f"unix://{work / 'proxy.sock'}", "--remote-runtime-endpoint",
                      bed.address, "--hook-config-dir", str(config_dir), "--cgroup-parent-root",
                      "/" + bed.cgroup_prefix, "--log-format", "json"]
        proxy_hooks = hooks_args(bed, work, "--hook-config-dir", str(config_dir))
        nri_hooks = hooks_args(bed, work, "--nri-socket", str(bed.nri_socket))
        nri_hooks[nri_hooks.index("--endpoint") + 1] = str(work / "hooks-nri.sock")
        with daemon(work, "proxy", proxy_args), daemon(work, "hooks-proxy", proxy_hooks):
            time.sleep(1.0)  # the proxy picks the registration up within 0.2 s
            block(bed, bed.address, 2)  # warm-up: images, page cache
            for _ in range(args.rounds):
                with daemon(work, "hooks-nri", nri_hooks):
                    starts["nri"] += block(bed, bed.address, args.pods)
                starts["direct"] += block(bed, bed.address, args.pods)
                starts["proxy"] += block(bed, f"unix://{work / 'proxy.sock'}", args.pods)
        events = event_times(work / "hooks-nri.log")
    finally:
        with contextlib.suppress(Exception):
            bed.stop()
        shutil.rmtree(work, ignore_errors=True)
    return summarize(starts, events)


def summarize(starts: dict[str, list[list[float]]], events: dict[str, list[float]]) -> dict[str, Any]:
    direct = statistics.mean(sum(calls) for calls in starts["direct"])
    result: dict[str, Any] = {"pod_start": {}, "nri_events": {}}
    for target, pods in starts.items():
        times = [sum(calls) for calls in pods]
        ordered = sorted(times)
        result["pod_start"][target] = {
            "pods": len(times), "p50_ms": percentile(ordered, 0.5) * 1e3, "mean_ms": statistics.mean(times) * 1e3,
            "mean_vs_direct": statistics.mean(times) / direct,
            # each call's p50: PostStartContainer's cost shows in StartContainer alone
            **{f"{call}_p50_ms": percentile(sorted(c[i] for c in pods), 0.5) * 1e3 for i, call in enumerate(CALLS)},
        }
    for event, times in sorted(events.items()):
        ordered = sorted(times)
        result["nri_events"][event] = {"count": len(times), "p50_ms": percentile(ordered, 0.5) * 1e3,
                                       "p99_ms": percentile(ordered, 0.99) * 1e3, "max_ms": ordered[-1] * 1e3}
    return result


def render(result: dict[str, Any]) -> str:
    lines = ["| pod start | pods | p50 | mean | mean vs direct | " + " | ".join(f"{c} p50" for c in CALLS) + " |",
             "|---|---|---|---|---|" + "---|" * len(CALLS)]
    for target, row in result["pod_start"].items():
        calls = " | ".join(f"{row[f'{call}_p50_ms']:.1f} ms" for call in CALLS)
        lines.append(f"| {target} | {row['pods']} | {row['p50_ms']:.1f} ms | {row['mean_ms']:.1f} ms | "
                     f"{row['mean_vs_direct']:.3f}x | {calls} |")
    lines += ["", "| NRI event | handled | p50 | p99 | max |", "|---|---|---|---|---|"]
    for event, row in result["nri_events"].items():
        lines.append(f"| {event} | {row['count']} | {row['p50_ms']:.2f} ms | {row['p99_ms']:.2f} ms | "
                     f"{row['max_ms']:.2f} ms |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10, help="pods per block (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="blocks per target, interleaved (default 3)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    run_and_report(run, render, args)


def run_and_report(
    run: Callable[[argparse.Namespace], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    args: argparse.Namespace,
) -> None:
    """Run a benchmark, print its figures with the load average around it (a noisy machine shows
    there), and write them as JSON to ``args.json`` if given."""
    load_before = os.getloadavg()
    result = run(args)
    result["load_average"] = {"before": load_before, "after": os.getloadavg()}
    print(render(result))
    print(f"\nload average (1, 5, 15 min): before {load_before}, after {result['load_average']['after']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
