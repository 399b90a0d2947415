"""The real-node scenario: runs inside the VM (``python3 -m runtimeproxy.testbed.node_scenario
PLAN.json``) as a oneshot unit once the node is up, then powers the VM off.

It installs ``runtime-proxy.service`` and ``runtime-hooks.service`` with ``runtime-proxy install``
(a stand-in kubelet unit gets the drop-in), plays pods through the proxy as kubelet would (pod slices
created through systemd first, with kubelet's properties), disturbs the services (kill -9,
SIGSTOP, a restart mid-lifecycle, a cgroup value changed behind the reconciler's back) and
reports what it saw as facts on ``/dev/ttyS1`` (`nodeproto`). It judges nothing: the host
test asserts. A step that raises is reported as ``<step>/error`` with its traceback and
the scenario goes on, so one broken step does not hide the others' evidence.

The plan (written by the host, see tests/node/) names the pods and their kubelet slice
properties, the hook server's settings and policy, and the timeouts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import termios
import threading
import time
import traceback
import tty
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from runtimeproxy.testbed.node_daemonset import daemonset_step
from runtimeproxy.testbed.nodeproto import DONE, encode

__all__ = ["CGROUP_FILES", "Scenario", "main"]

CGROUP = Path("/sys/fs/cgroup")
RESULTS_PORT = "/dev/ttyS1"
# Every file the checks look at, in pod slices and container scopes alike.
CGROUP_FILES = ("cpu.max", "cpu.weight", "cpu.max.burst", "cpu.idle", "cpuset.cpus", "cpuset.cpus.effective",
                "memory.min", "memory.low", "memory.high", "memory.max", "cgroup.subtree_control",
                "cgroup.controllers")
# Pod-slice files sampled every 100 ms while a pod starts and while a sibling goes: the
# values runtime-hooks sets there, which systemd re-applies its own unit properties over.
SAMPLED_FILES = ("cpu.max", "cpu.idle", "cpu.max.burst", "memory.min", "memory.low", "memory.high")
_SHOW = ("Type", "ActiveState", "SubState", "MainPID", "NRestarts", "Result", "WatchdogUSec", "NotifyAccess",
         "ExecMainStatus", "ExecMainCode", "ActiveEnterTimestampMonotonic", "InvocationID")
_SLICE_SHOW = ("ActiveState", "ControlGroup", "CPUWeight", "CPUQuotaPerSecUSec", "CPUQuotaPeriodUSec", "MemoryMax")
_JOURNAL_FIELDS = ("MESSAGE", "PRIORITY", "_PID", "SYSLOG_IDENTIFIER", "__MONOTONIC_TIMESTAMP")
_EVIDENCE_CHARS = 6000


def _clip(text: str, limit: int = _EVIDENCE_CHARS) -> str:
    return text if len(text) <= limit else f"...({len(text) - limit} chars cut)...\n" + text[-limit:]


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


class Scenario:
    """One run of the plan; `facts` go to the results port (and are echoed to the console)."""

    def __init__(self, plan: dict[str, Any], port: Any) -> None:
        self.plan = plan
        self.port = port
        self.socket: str = plan["proxy_socket"]
        self.pods: dict[str, dict[str, Any]] = {}

    # -- reporting --

    def fact(self, name: str, data: Any) -> None:
        line = encode(name, data, uptime())
        self.port.write(line)
        self.port.flush()
        print(f"[scenario] {name}: {len(line)} bytes", flush=True)

    def step(self, name: str, action: Callable[[], Any]) -> None:
        """Run one step; its return value is the fact `name`, an exception `name/error`."""
        began = time.monotonic()
        print(f"[scenario] step {name}", flush=True)
        try:
            data = action()
        except Exception as exc:  # reported, and the next steps still run
            self.fact(f"{name}/error", {"error": repr(exc), "traceback": traceback.format_exc()})
            return
        if data is not None:
            if isinstance(data, dict):
                data.setdefault("elapsed_s", round(time.monotonic() - began, 2))
            self.fact(name, data)

    # -- node helpers --

    def run(self, *cmd: str, timeout: float = 120, check: bool = False) -> dict[str, Any]:
        began = time.monotonic()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
            result = {"cmd": shlex.join(cmd), "rc": done.returncode, "out": _clip(done.stdout),
                      "err": _clip(done.stderr), "s": round(time.monotonic() - began, 2)}
        except subprocess.TimeoutExpired:
            result = {"cmd": shlex.join(cmd), "rc": None, "out": "", "err": f"timed out after {timeout}s",
                      "s": round(time.monotonic() - began, 2)}
        if check and result["rc"] != 0:
            raise RuntimeError(f"{result['cmd']} failed: {result}")
        return result

    def show(self, unit: str, props: tuple[str, ...] = _SHOW) -> dict[str, str]:
        out = self.run("systemctl", "show", unit, "-p", ",".join(props))["out"]
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, *args: str, limit: int = 400) -> list[dict[str, Any]]:
        """Journal entries (the last `limit`), each with the fields the checks read."""
        cmd = ["journalctl", "--no-pager", "-o", "json", *args]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False).stdout
        except subprocess.TimeoutExpired:
            return [{"MESSAGE": f"{shlex.join(cmd)} timed out", "PRIORITY": None}]
        entries = []
        for line in out.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            entries.append({k: entry.get(k) for k in _JOURNAL_FIELDS})
        return entries[-limit:]

    def cri_version(self, timeout: float = 10.0) -> dict[str, Any]:
        """One CRI Version call through the proxy's socket, no retries."""
        from runtimeproxy.api.runtime.v1 import api_pb2
        from runtimeproxy.play.cri_client import CriClient

        began = time.monotonic()
        try:
            with CriClient(self.socket, timeout=timeout) as client:
                reply = client.runtime.Version(api_pb2.VersionRequest(), timeout=timeout)
            return {"ok": True, "runtime": f"{reply.runtime_name} {reply.runtime_version}",
                    "s": round(time.monotonic() - began, 2)}
        except Exception as exc:
            return {"ok": False, "error": repr(exc), "s": round(time.monotonic() - began, 2)}

    @staticmethod
    def read_files(directory: Path) -> dict[str, str | None]:
        values: dict[str, str | None] = {}
        for name in CGROUP_FILES:
            try:
                values[name] = (directory / name).read_text().strip()
            except OSError:
                values[name] = None
        return values

    def wait_for(self, what: Callable[[], bool], timeout: float, interval: float = 0.5) -> float | None:
        """Seconds until `what()` held, None if it never did within `timeout`."""
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            if what():
                return round(time.monotonic() - began, 2)
            time.sleep(interval)
        return None

    # -- kubelet's part --

    def start_slice(self, name: str, cgroup: str, props: dict[str, Any]) -> dict[str, Any]:
        """A transient slice with kubelet's properties, as kubelet's systemd cgroup manager
        makes it (runc libcontainer/cgroups/systemd: StartTransientUnit); `cgroup` is where
        systemd puts it, relative to the cgroup root."""
        parent = name.rsplit("-", 1)[0] + ".slice" if "-" in name else "-.slice"
        props_: list[tuple[str, str, list[str]]] = [
            ("Description", "s", [f"kubelet {name}"]), ("DefaultDependencies", "b", ["false"]),
            ("Wants", "as", ["1", parent]), ("CPUAccounting", "b", ["true"]), ("MemoryAccounting", "b", ["true"]),
            ("IOAccounting", "b", ["true"]), ("TasksAccounting", "b", ["true"])]
        if props.get("cpu_weight") is not None:
            props_.append(("CPUWeight", "t", [str(props["cpu_weight"])]))
        if props.get("cpu_quota_per_sec_us") is not None:
            props_.append(("CPUQuotaPerSecUSec", "t", [str(props["cpu_quota_per_sec_us"])]))
            props_.append(("CPUQuotaPeriodUSec", "t", [str(props.get("cpu_period_us", 100000))]))
        if props.get("memory_max") is not None:
            props_.append(("MemoryMax", "t", [str(props["memory_max"])]))
        args = [word for key, sig, values in props_ for word in (key, sig, *values)]
        # "--": "-.slice" (the root slice) is no option.
        call = self.run("busctl", "call", "--", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                        "org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))",
                        name, "replace", str(len(props_)), *args, "0", check=True)
        path = CGROUP / cgroup
        waited = self.wait_for(path.is_dir, 30)
        return {"call": call, "cgroup": str(path), "appeared_s": waited, "show": self.show(name, _SLICE_SHOW),
                "files": self.read_files(path)}

    def play(self, manifest: str, *, delete: bool = False,
             between: Callable[[str], None] | None = None) -> dict[str, Any]:
        """`runtime-proxy play` (or `--delete`) of one manifest through the proxy, in this
        process: a new Python per pod would cost seconds of emulated CPU each. `between` is
        called with each progress line, right after the step it reports."""
        from runtimeproxy.kubelet_model.manifest import load_pod
        from runtimeproxy.kubelet_model.pod_plan import build_plan
        from runtimeproxy.play import runner
        from runtimeproxy.play.cri_client import CriClient

        plan = build_plan(load_pod(manifest), log_dir_base="/var/log/pods", cgroup_driver="systemd")
        said: list[str] = []

        def say(line: str) -> None:
            said.append(line)
            if between is not None:
                between(line)

        began = time.monotonic()
        try:
            with CriClient(self.socket, timeout=120) as client:
                if delete:
                    done = runner.delete(plan, client, grace_period=0, say=say).to_dict()
                else:
                    done = runner.play(plan, client, say=say).to_dict()
        except runner.PlayError as exc:
            return {"ok": False, "error": exc.to_dict(), "say": said, "s": round(time.monotonic() - began, 2)}
        return {"ok": True, "json": done, "say": said, "s": round(time.monotonic() - began, 2)}


@contextmanager
def sampling(path: Path, interval: float = 0.1) -> Iterator[list[tuple[float, str | None]]]:
    """Record every change of one file's content (with the guest's uptime) while inside."""
    samples: list[tuple[float, str | None]] = []
    stop = threading.Event()

    def sample() -> None:
        last: object = object()
        while not stop.is_set():
            try:
                value: str | None = path.read_text().strip()
            except OSError:
                value = None
            if value != last:
                samples.append((round(uptime(), 2), value))
                last = value
            stop.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(5)


@contextmanager
def sampled(directory: Path, names: tuple[str, ...]) -> Iterator[dict[str, list[tuple[float, str | None]]]]:
    """`sampling` of several files of one cgroup at once, by file name."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(sampling(directory / name)) for name in names}


# -- the steps -----------------------------------------------------------------------


def boot_facts(s: Scenario) -> dict[str, Any]:
    state = s.run("systemctl", "is-system-running", "--wait", timeout=120)
    return {"uptime_s": uptime(), "system_state": state["out"].strip(),
            "failed_units": s.run("systemctl", "--failed", "--no-legend", "--plain")["out"],
            "cgroup_controllers": (CGROUP / "cgroup.controllers").read_text().split(),
            "cgroup_fs": s.run("stat", "-f", "-c", "%T", str(CGROUP))["out"].strip(),
            "systemd": s.run("systemctl", "--version")["out"].splitlines()[0],
            "kernel": os.uname().release, "python": sys.version.split()[0],
            "containerd": s.show("containerd.service"), "runc": s.run("runc", "--version")}


# A kubelet stand-in: a unit as kubeadm's (ExecStart=/usr/bin/kubelet ...) whose binary records
# the command line it was started with and sleeps.
KUBELET_ARGS = Path("/run/kubelet-args")
KUBELET_PID = Path("/run/kubelet-pid")
KUBELET_STUB = f"""#!/bin/sh
echo "$@" > {KUBELET_ARGS}
echo $$ > {KUBELET_PID}
exec sleep infinity
"""
KUBELET_UNIT = """[Unit]
Description=kubelet stand-in of the node scenario

[Service]
ExecStart=/usr/bin/kubelet --container-runtime-endpoint=unix:///run/containerd/containerd.sock
Restart=always

[Install]
WantedBy=multi-user.target
"""
# Where the host's root is mounted again (rbind) to install through --root, as the installer pod does.
HOST_MOUNT = "/host"
_KUBELET_SHOW = ("ActiveState", "MainPID", "DropInPaths", "ExecStart", "NRestarts")


def kubelet_facts(s: Scenario) -> dict[str, Any]:
    """The stand-in's unit and the command line its running process was started with (once it
    has written it: `systemctl start` returns before the started process runs its first line)."""
    show = s.show("kubelet.service", _KUBELET_SHOW)
    s.wait_for(lambda: (_read(KUBELET_PID) or "").strip() == show.get("MainPID"), 30, interval=0.2)
    return {"show": show, "args": _read(KUBELET_ARGS),
            "drop_in": _read(Path("/etc/systemd/system/kubelet.service.d/10-runtime-proxy.conf"))}


def install_units(s: Scenario) -> dict[str, Any]:
    """`runtime-proxy install` with this node's settings, kubelet's stand-in running first."""
    plan = s.plan
    s.run("ip", "link", "add", plan["network_interface"], "type", "dummy", check=True)
    s.run("ip", "link", "set", plan["network_interface"], "up", check=True)
    Path("/usr/bin/kubelet").write_text(KUBELET_STUB)
    Path("/usr/bin/kubelet").chmod(0o755)
    Path("/etc/systemd/system/kubelet.service").write_text(KUBELET_UNIT)
    s.run("systemctl", "daemon-reload", check=True)
    kubelet_before = {"start": s.run("systemctl", "enable", "--now", "kubelet.service", check=True),
                      **kubelet_facts(s)}
    policy = Path(plan["hooks_env"]["RUNTIME_HOOKS_POLICY"])
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text(plan["policy"])
    checks = [s.run("runtime-hooks", "plugins", check=True),
              s.run("runtime-hooks", "policy", "check", str(policy), check=True)]
    settings = _install_settings(s)
    dry_run = s.run("runtime-proxy", "install", "--dry-run", *settings, timeout=300)
    dry_run["files_after"] = _installed_paths()
    install = s.run("runtime-proxy", "install", *settings, timeout=300)
    return {"checks": checks, "kubelet_before": kubelet_before, "dry_run": dry_run, "install": install,
            "kubelet_after": kubelet_facts(s), "files": _installed_paths()}


def _install_settings(s: Scenario) -> list[str]:
    return [*(f"--hooks-setting={k}={v}" for k, v in s.plan["hooks_env"].items()),
            *(f"--proxy-setting={k}={v}" for k, v in s.plan["proxy_env"].items())]


def _installed_paths() -> dict[str, bool]:
    """Whether each path install writes or makes (or its units make) exists."""
    paths = ("/etc/systemd/system/runtime-proxy.service", "/etc/systemd/system/runtime-hooks.service",
             "/etc/default/runtime-proxy", "/etc/default/runtime-hooks", "/etc/runtime/hookserver.d", "/etc/runtime",
             "/etc/systemd/system/kubelet.service.d/10-runtime-proxy.conf", "/etc/systemd/system/kubelet.service.d",
             "/var/lib/runtimeproxy/install.json", "/var/lib/runtimeproxy", "/run/runtimeproxy", "/run/runtimehooks",
             "/etc/systemd/system/multi-user.target.wants/runtime-proxy.service")
    return {path: os.path.lexists(path) for path in paths}


def _host_mount(s: Scenario) -> dict[str, Any]:
    Path(HOST_MOUNT).mkdir(exist_ok=True)
    if os.path.ismount(HOST_MOUNT):
        return {"mounted": True}
    done = s.run("mount", "--rbind", "/", HOST_MOUNT, check=True)
    # A slave, as a pod's host mount: nothing done under /host (an unmount) reaches / (shared).
    return {"rbind": done, "rslave": s.run("mount", "--make-rslave", HOST_MOUNT, check=True)}


def reinstall(s: Scenario) -> dict[str, Any]:
    """A second install, through the host mounted at /host as the installer pod sees it: nothing
    to change (read-only systemctl calls through the chroot, the readiness call through /host/run)."""
    mount = _host_mount(s)
    return {"mount": mount,
            "install": s.run("runtime-proxy", "install", "--root", HOST_MOUNT, *_install_settings(s), timeout=300),
            "proxy": s.show("runtime-proxy.service")}


def uninstall(s: Scenario) -> dict[str, Any]:
    """`runtime-proxy uninstall --root /host` (systemctl through the chroot), then: what is left."""
    mount = _host_mount(s)
    done = s.run("runtime-proxy", "uninstall", "--root", HOST_MOUNT, timeout=300)
    again = s.run("runtime-proxy", "uninstall", "--root", HOST_MOUNT, timeout=300)
    return {"mount": mount, "uninstall": done, "again": again, "kubelet": kubelet_facts(s),
            "files": _installed_paths(),
            "units": {unit: s.show(unit, ("LoadState", "ActiveState")) for unit in
                      ("runtime-proxy.service", "runtime-hooks.service")},
            "processes": s.run("pgrep", "-a", "-f", "runtime-(proxy|hooks) serve")["out"],
            "containerd": s.show("containerd.service", ("ActiveState",))}


def start_units(s: Scenario) -> dict[str, Any]:
    """The units as install left them: install returns once the proxy answered, so the socket
    must answer the very first call made right after it."""
    facts: dict[str, Any] = {}
    for unit in ("runtime-hooks", "runtime-proxy"):
        facts[unit] = {"show": s.show(f"{unit}.service")}
        if unit == "runtime-proxy":
            facts[unit]["first_call"] = s.cri_version()
    facts["registration"] = _read(Path("/etc/runtime/hookserver.d/runtime-hooks.json"))
    facts["sockets"] = s.run("ls", "-la", "/run/runtimeproxy", "/run/runtimehooks")["out"]
    return facts


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def broken_registration(s: Scenario) -> dict[str, Any]:
    """A malformed registration file: the proxy must log a warning naming it (and go on)."""
    path = Path("/etc/runtime/hookserver.d/zz-broken.json")
    path.write_text("{ not json")
    time.sleep(3)
    path.unlink()
    return {"file": str(path), "after": s.cri_version()}


def import_images(s: Scenario) -> dict[str, Any]:
    result = s.run("ctr", "-n", "k8s.io", "images", "import", "--snapshotter", "native", s.plan["images_tar"],
                   timeout=300, check=True)
    return {"import": result, "list": s.run("ctr", "-n", "k8s.io", "images", "ls", "-q")["out"].split()}


def qos_slices(s: Scenario) -> dict[str, Any]:
    return {name: s.start_slice(name, spec["cgroup"], spec["kubelet"]) for name, spec in s.plan["qos_slices"].items()}


def play_pod(s: Scenario, pod: dict[str, Any]) -> dict[str, Any]:
    name = pod["name"]
    slice_facts = s.start_slice(pod["slice"], pod["cgroup"], pod["kubelet"])
    pod_dir = CGROUP / pod["cgroup"]
    with sampled(pod_dir, SAMPLED_FILES) as samples:
        began = uptime()
        played = s.play(pod["manifest"])
        ended = uptime()
        time.sleep(pod.get("observe_s", 0))
    containers = {}
    for container in (played.get("json") or {}).get("containers", []):
        scope = pod_dir / f"cri-containerd-{container['container_id']}.scope"
        containers[container["name"]] = {"id": container["container_id"], "cgroup": str(scope),
                                         "exists": scope.is_dir(), "files": s.read_files(scope)}
    s.pods[name] = {"dir": pod_dir, "containers": containers, "json": played.get("json")}
    return {"slice": slice_facts, "play": played, "play_began": began, "play_ended": ended,
            "pod_cgroup": str(pod_dir), "files": s.read_files(pod_dir), "containers": containers,
            "samples": samples, "slice_show": s.show(pod["slice"], _SLICE_SHOW),
            "parents": {str(p): s.read_files(p) for p in (pod_dir.parent, pod_dir.parent.parent)},
            "journal_hooks": _messages(s.journal("-u", "runtime-hooks", "--since", f"-{int(ended - began) + 30}s"))}


def _messages(entries: list[dict[str, Any]]) -> list[str]:
    return [f"<{e.get('PRIORITY')}> {e.get('MESSAGE')}" for e in entries][-60:]


def settle(s: Scenario) -> dict[str, Any]:
    """Every pod's files again after a reconcile interval, then right after a daemon-reload
    (systemd re-applies unit properties to every cgroup it manages)."""
    time.sleep(s.plan["reconcile_interval_s"] + 2)
    later = {name: {"pod": s.read_files(pod["dir"]),
                    "containers": {c: s.read_files(Path(info["cgroup"])) for c, info in pod["containers"].items()}}
             for name, pod in s.pods.items()}
    reload = s.run("systemctl", "daemon-reload")
    after_reload = {name: s.read_files(pod["dir"]) for name, pod in s.pods.items()}
    time.sleep(s.plan["reconcile_interval_s"] + 2)
    repaired = {name: s.read_files(pod["dir"]) for name, pod in s.pods.items()}
    return {"after_interval": later, "daemon_reload": reload, "after_daemon_reload": after_reload,
            "after_next_reconcile": repaired}


def sibling_removal(s: Scenario) -> dict[str, Any]:
    """Delete one pod through the proxy and stop its slice as kubelet does, sampling the other
    pods' slice files the whole time and for `observe_s` after: systemd re-applies unit
    properties to sibling slices when one goes. Then: is the deleted pod's slice gone?"""
    spec = s.plan["sibling_removal"]
    gone = next(pod for pod in s.plan["pods"] if pod["name"] == spec["pod"])
    with contextlib.ExitStack() as stack:
        samples = {name: stack.enter_context(sampled(s.pods[name]["dir"], SAMPLED_FILES)) for name in spec["watch"]}
        began = uptime()
        deleted = s.play(gone["manifest"], delete=True)
        stopped = s.run("systemctl", "stop", gone["slice"], timeout=60)
        ended = uptime()
        time.sleep(spec["observe_s"])
    s.pods.pop(spec["pod"], None)
    return {"deleted": deleted, "stopped": stopped, "began": began, "ended": ended, "samples": samples,
            "slice": s.show(gone["slice"], ("LoadState", "ActiveState")),
            "cgroup_left": (CGROUP / gone["cgroup"]).exists(),
            "pod_slices": s.run("systemctl", "list-units", "--all", "--plain", "--no-legend",
                                "kubepods-*pod*.slice")["out"],
            "journal_hooks": _messages(s.journal("-u", "runtime-hooks", "--since", f"-{int(uptime() - began) + 5}s"))}


def drift(s: Scenario) -> dict[str, Any]:
    """Change a value the reconciler owns behind its back and time its repair."""
    spec = s.plan["drift"]
    target = s.pods[spec["pod"]]["dir"] / spec["file"]
    before = target.read_text().strip()
    target.write_text(spec["value"])
    written = target.read_text().strip()
    began = uptime()
    repaired = s.wait_for(lambda: target.read_text().strip() == before, spec["timeout_s"])
    return {"file": str(target), "before": before, "written": written, "after": target.read_text().strip(),
            "repaired_after_s": repaired,
            "journal_hooks": _messages(s.journal("-u", "runtime-hooks", "--since", f"-{int(uptime() - began) + 5}s"))}


def network(s: Scenario) -> dict[str, Any]:
    dev = s.plan["network_interface"]
    return {what: s.run("tc", "-d", what, "show", "dev", dev)["out"] for what in ("qdisc", "class", "filter")}


def restart_mid_lifecycle(s: Scenario) -> dict[str, Any]:
    """The proxy restarted between a pod's RunPodSandbox and its CreateContainer: the
    container's hooks must still see the pod (the new instance rebuilds it from containerd),
    and the pod is deleted through the new instance."""
    pod = s.plan["restart_pod"]
    slice_facts = s.start_slice(pod["slice"], pod["cgroup"], pod["kubelet"])
    states: dict[str, Any] = {}

    def restart_after_sandbox(line: str) -> None:
        if line.startswith("sandbox ") and "restart" not in states:
            states["before"] = s.show("runtime-proxy.service")
            states["restart"] = s.run("systemctl", "restart", "runtime-proxy", timeout=120)
            states["after"] = s.show("runtime-proxy.service")

    mark = uptime()
    played = s.play(pod["manifest"], between=restart_after_sandbox)
    # A hook call racing the restart may fail (failure policy Ignore): the reconciler then
    # catches up within one interval, which is what the container must show by then.
    time.sleep(s.plan["reconcile_interval_s"] + 2)
    pod_dir = CGROUP / pod["cgroup"]
    containers = {c["name"]: s.read_files(pod_dir / f"cri-containerd-{c['container_id']}.scope")
                  for c in (played.get("json") or {}).get("containers", [])}
    deleted = s.play(pod["manifest"], delete=True)
    since = f"-{int(uptime() - mark) + 5}s"
    return {"slice": slice_facts, "play": played, **states, "containers": containers, "delete": deleted,
            "journal_proxy": _messages(s.journal("-u", "runtime-proxy", "--since", since))}


def kill_9(s: Scenario) -> dict[str, Any]:
    before = s.show("runtime-proxy.service")
    pid = int(before["MainPID"])
    os.kill(pid, signal.SIGKILL)
    back = s.wait_for(lambda: _restarted(s, pid), 60)
    return {"before": before, "killed_pid": pid, "back_after_s": back, "after": s.show("runtime-proxy.service"),
            "first_call": s.cri_version()}


def watchdog(s: Scenario) -> dict[str, Any]:
    before = s.show("runtime-proxy.service")
    pid = int(before["MainPID"])
    os.kill(pid, signal.SIGSTOP)
    began = uptime()
    back = s.wait_for(lambda: _restarted(s, pid), s.plan["watchdog_timeout_s"], interval=1.0)
    if back is None:  # leave no frozen daemon behind for the later steps
        os.kill(pid, signal.SIGCONT)
    since = f"-{int(uptime() - began) + 5}s"
    return {"before": before, "stopped_pid": pid, "back_after_s": back, "after": s.show("runtime-proxy.service"),
            "first_call": s.cri_version(),
            "journal_systemd": _messages([e for e in s.journal("-u", "runtime-proxy", "--since", since)
                                          if e.get("_PID") == "1"])}


def _restarted(s: Scenario, old_pid: int) -> bool:
    show = s.show("runtime-proxy.service")
    return show.get("ActiveState") == "active" and show.get("MainPID") not in ("0", str(old_pid))


def journals(s: Scenario) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    for unit in ("runtime-proxy", "runtime-hooks"):
        entries = s.journal("-u", unit, "-b", limit=2000)
        by_priority: dict[str, int] = {}
        for entry in entries:
            by_priority[str(entry.get("PRIORITY"))] = by_priority.get(str(entry.get("PRIORITY")), 0) + 1
        own = [e for e in entries if e.get("SYSLOG_IDENTIFIER") == unit]
        facts[unit] = {
            "priorities": by_priority,
            "sample": [e.get("MESSAGE") for e in own[:5]],
            "warnings_and_worse": [e for e in own if str(e.get("PRIORITY")) in ("0", "1", "2", "3", "4")][-40:],
            "filter_warning": sorted({str(e.get("PRIORITY")) for e in s.journal("-u", unit, "-b", "-p", "warning")}),
        }
    return facts


Step = tuple[str, Callable[[Scenario], dict[str, Any]]]

# The scenario's steps in order, named as the host's test reads their facts; the plan's pods play
# between the two.
BEFORE_PODS: tuple[Step, ...] = (
    ("boot", boot_facts),
    ("install", install_units),
    ("start", start_units),
    ("images", import_images),
    ("broken-registration", broken_registration),
    ("qos-slices", qos_slices),
)
AFTER_PODS: tuple[Step, ...] = (
    ("settle", settle),
    ("sibling-removal", sibling_removal),
    ("drift", drift),
    ("network", network),
    ("restart", restart_mid_lifecycle),
    ("kill-9", kill_9),
    ("watchdog", watchdog),
    ("reinstall", reinstall),
    ("daemonset", daemonset_step),
    ("journal", journals),
    ("uninstall", uninstall),
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    plan = json.loads(Path(args[0]).read_text())
    port = open(RESULTS_PORT, "r+b", buffering=0)  # noqa: SIM115 - open for the whole run
    tty.setraw(port.fileno())  # no newline translation on the way out
    s = Scenario(plan, port)
    try:
        for name, action in BEFORE_PODS:
            s.step(name, functools.partial(action, s))
        for pod in plan["pods"]:
            s.step(f"pod/{pod['name']}", functools.partial(play_pod, s, pod))
        for name, action in AFTER_PODS:
            s.step(name, functools.partial(action, s))
        s.fact(DONE, {"uptime_s": uptime()})
    finally:
        termios.tcdrain(port.fileno())
        port.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
