"""``runtime-proxy demo``: the whole data path on one machine, with nothing to set up.

It starts a private containerd in a temporary root (the same test bed the end-to-end
tests use), the runtime-hooks server with its built-in QoS plugins, the proxy daemon in
front of containerd calling that server, and plays a pod through the proxy with
``runtime-proxy play``: every lifecycle CRI call and every hook shows in the logs.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import click

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.kubelet_model.manifest import load_pod
from runtimeproxy.kubelet_model.pod_plan import POD_UID_LABEL, build_plan
from runtimeproxy.testbed import Containerd

REQUIRED_TOOLS = ("containerd", "ctr", "runc", "containerd-shim-runc-v2")
CLI = [sys.executable, "-c", "from runtimeproxy.proxy.cli import main; main()"]
HOOKS_CLI = [sys.executable, "-c", "from runtimeproxy.hooks.cli import main; main()"]


def missing_tools() -> list[str]:
    return [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]


def demo_manifest() -> Path:
    return Path(str(resources.files("runtimeproxy") / "data" / "demo-pod.yaml"))


def run_demo(manifest: Path, keep_seconds: float) -> int:
    if os.geteuid() != 0:
        raise click.ClickException("the demo starts containerd and containers: run it as root")
    if missing := missing_tools():
        raise click.ClickException(
            f"missing {', '.join(missing)}: install Debian's containerd and runc "
            "(`bash .ci/system-deps.sh`, or `tox -e demo`, does it)"
        )
    workdir = Path(tempfile.mkdtemp(prefix="rtpx-demo-", dir="/tmp"))
    hook_dir = workdir / "hookserver.d"
    with Containerd() as bed:
        _say(f"containerd {bed.snapshotter} test bed serving on {bed.address}")
        _say("what the QoS plugins will do for this pod (runtime-hooks explain, writes nothing):")
        _run([*HOOKS_CLI, "explain", str(manifest), "--cgroup-root", "/sys/fs/cgroup"])
        daemons: list[subprocess.Popen[bytes]] = []
        try:
            hooks_socket = workdir / "hooks.sock"
            daemons.append(_start_hooks(hooks_socket, hook_dir, bed.address, f"/{bed.cgroup_prefix}/kubepods"))
            _wait_for(daemons[-1], hook_dir / "runtime-hooks.json", "runtime-hooks")
            proxy_socket = workdir / "proxy.sock"
            daemons.append(_start_proxy(proxy_socket, bed.address, hook_dir, "/" + bed.cgroup_prefix))
            _wait_for(daemons[-1], proxy_socket, "runtime-proxy")
            _say(f"runtime-proxy serving on unix://{proxy_socket} with runtime-hooks; playing {manifest}")
            play = [*CLI, "play", str(manifest), "--endpoint", str(proxy_socket), "--cgroup-root", bed.cgroup_prefix]
            play += ["--log-dir", str(workdir / "pods")]  # removed with the workdir, never left behind
            _run(play)
            _say("cgroup values before the hooks (runc's from the CRI request) and after, read from the node:")
            click.echo(_cgroup_table(bed, manifest))
            if keep_seconds:
                _say(f"pod is running; deleting it in {keep_seconds:g} s")
                time.sleep(keep_seconds)
            _run([*play, "--delete"])
        finally:
            codes = [_stop(daemon) for daemon in reversed(daemons)]
            shutil.rmtree(workdir, ignore_errors=True)
    _say(f"proxy and hooks server drained and exited with {codes}; containerd stopped and its root removed")
    return max(codes, default=0)


def _cgroup_table(bed: Containerd, manifest: Path) -> str:
    """The demo pod's cgroup tables: the pod's, then each running container's (ids from CRI)."""
    # mypy checks runtimeproxy.hooks as the top-level package ``hooks``: a static import from
    # here would not resolve for it, so the table module is loaded at run time.
    table = importlib.import_module("runtimeproxy.hooks.demo_table")
    cgroups = importlib.import_module("runtimeproxy.hooks.cgroups")
    read_table = table.read_table
    plan = build_plan(load_pod(manifest), log_dir_base="/var/log/pods", cgroup_root=bed.cgroup_prefix)
    fs = cgroups.CgroupFS(cgroups.CGROUP_ROOT)
    request = cri.ListContainersRequest(filter=cri.ContainerFilter(label_selector={POD_UID_LABEL: plan.uid}))
    answer = bed.call("RuntimeService/ListContainers", request.SerializeToString())
    listed = cri.ListContainersResponse.FromString(answer)
    ids = {container.metadata.name: container.id for container in listed.containers}
    # No kubelet here: nobody writes the pod cgroup's kubelet values (the cpu plugin creates it
    # and runc adds it in the other hierarchies), so its "before" is a new cgroup's.
    tables = [read_table(fs, "pod", plan.cgroup_parent, None, None)]
    for container in plan.containers:
        if container.name in ids:
            resources = container.request.config.linux.resources
            tables.append(read_table(fs, container.name, plan.cgroup_parent, ids[container.name], resources))
    return str(table.format_tables(tables))


def _start_proxy(socket: Path, backend: str, hook_dir: Path, cgroup_root: str) -> subprocess.Popen[bytes]:
    args = [*CLI, "serve", "--endpoint", str(socket), "--remote-runtime-endpoint", backend]
    args += ["--hook-config-dir", str(hook_dir), "--cgroup-parent-root", cgroup_root]
    # info shows each lifecycle call with its hooks; debug would add every relayed call.
    return subprocess.Popen([*args, "--log-level", "info", "--log-format", "console"], cwd=socket.parent)


def _start_hooks(socket: Path, hook_dir: Path, runtime: str, pod_root: str) -> subprocess.Popen[bytes]:
    args = [*HOOKS_CLI, "serve", "--endpoint", str(socket), "--hook-config-dir", str(hook_dir)]
    args += ["--runtime-endpoint", runtime, "--cgroup-root", "/sys/fs/cgroup", "--cgroup-parent-root", pod_root]
    return subprocess.Popen([*args, "--log-format", "console"], cwd=socket.parent)


def _wait_for(daemon: subprocess.Popen[bytes], path: Path, name: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if daemon.poll() is not None:
            raise click.ClickException(f"{name} exited with {daemon.returncode} before serving")
        if time.monotonic() > deadline:
            raise click.ClickException(f"{name} did not create {path} within {timeout:g} s")
        time.sleep(0.05)


def _stop(daemon: subprocess.Popen[bytes]) -> int:
    daemon.send_signal(signal.SIGTERM)
    return daemon.wait(timeout=30)


def _run(args: list[str]) -> None:
    # Not from the current directory: in a source checkout that would import the source tree.
    done = subprocess.run(args, check=False, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise click.ClickException(f"{' '.join(args[3:])} exited with {done.returncode}")


def _say(message: str) -> None:
    click.secho(f"==> {message}", fg="cyan", err=True)


@click.command("demo")
@click.argument("manifest", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--keep", "keep_seconds", type=float, default=0.0, help="Seconds to leave the pod running.")
def demo_command(manifest: Path | None, keep_seconds: float) -> None:
    """Run the proxy in front of a private containerd and play a pod through it.

    Needs root and Debian's containerd and runc. MANIFEST defaults to a small
    two-container pod shipped with the package.
    """
    sys.exit(run_demo(manifest or demo_manifest(), keep_seconds))
