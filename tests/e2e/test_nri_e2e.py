"""runtime-hooks as an NRI plugin of a real containerd (1.7 and 2.x), with no proxy in the path.

The test bed is trixie's containerd 1.7 or sid's 2.x with NRI on (``Containerd(nri=True)``: its socket in
the bed's temporary root). ``runtime-hooks serve --nri-socket`` runs as a subprocess with the
built-in plugins, the example plugin (envstamp) and the fake resctrl tree of
tests/e2e/test_e2e_runtime_hooks.py; pods are created with the CRI client directly on containerd.
Parity: the same pods are then run through ``runtime-proxy serve`` with runtime-hooks in proxy
mode on the same containerd, and every value read back (real cgroup v1 files, the container's
environment, the fake resctrl tree) must be equal, and equal to the values worked out by hand.
Then: a containerd restart (runtime-hooks reconnects and registers again, and the next pod
gets its values), and the errors when the socket is missing or NRI is off. The OOM score the
memory plugin sets: in the CreateContainer adjustment on 2.x (NRI 0.8), written to the started
process on 1.7 (NRI 0.6.1).

Container repair over NRI: a container created while runtime-hooks was not registered gets the
plugins' values from the Synchronize answer; a value changed behind containerd's back is set back
by the reconciler through containerd's CRI UpdateContainerResources; and while pods are being
created, a containerd restart, a kill -9 with an outage or runtime-hooks frozen past NRI's
deadline leaves no BE container without its CFS quota and shares, runtime-hooks registering
again soon after the NRI socket is back.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from conftest import start_testbed
from daemons import eventually
from hooks_node import (
    BE_BATCH,
    BE_VALUES,
    HOOKS,
    LS_QUOTA,
    Node,
    be_values,
    policy_text,
    run_be_pod,
    run_ls_pod,
    write_atomically,
)
from pods import CALL_TIMEOUT, QOS_LABEL, ContainerSpec, Pod, cgroup_dir, read, read_int, threads

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

pytestmark = [pytest.mark.e2e, pytest.mark.containerd_series("1.7", "2.x")]

REPO = Path(__file__).resolve().parents[2]
ENVSTAMP_SRC = REPO / "examples" / "rtpx-plugin-envstamp" / "src" / "rtpx_plugin_envstamp"
ENVSTAMP_DIST = "rtpx_plugin_envstamp-1.0.0.dist-info"
RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
REGISTERED_TIMEOUT = 20.0


@pytest.fixture(scope="module")
def nri_containerd(containerd: Containerd) -> Iterator[Containerd]:
    """A containerd of the shared bed's series with NRI on, for this module only (the shared
    beds have it off)."""
    bed = start_testbed(containerd.build.series, nri=True)
    yield bed
    bed.stop()


class NriNode(Node):
    """Node of tests/e2e/test_e2e_runtime_hooks.py, with the example plugin as the extra plugin and a
    way to start runtime-hooks as an NRI plugin alone (no proxy, no registration directory)."""

    def _write_extra_plugins(self) -> Path:
        directory = self.workdir / "envstamp"
        if directory.exists():  # written for an earlier start
            return directory
        shutil.copytree(ENVSTAMP_SRC, directory / ENVSTAMP_SRC.name)
        dist = directory / ENVSTAMP_DIST
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rtpx-plugin-envstamp\nVersion: 1.0.0\n")
        (dist / "entry_points.txt").write_text("[runtimeproxy.hooks]\nenvstamp = rtpx_plugin_envstamp:plugin\n")
        return directory

    def start_nri(self, policy: str, *extra: str, name: str = "hooks-nri") -> None:
        """runtime-hooks in NRI mode alone, as the daemon ``name`` (another for each start of a test)."""
        write_atomically(self.policy, policy)
        args, env = self.nri_command(*extra)
        self.hooks = self.start_daemon(name, args, env)
        ready = self.hooks.wait_record(lambda r: r.get("event") == "ready")
        self.metrics_url = f"http://{ready['metrics_address']}/metrics"

    def nri_command(self, *extra: str) -> tuple[list[str], dict[str, str]]:
        """``runtime-hooks serve`` in NRI mode alone, and the environment it needs beside ours."""
        args, env = self.hooks_command("--nri-socket", str(self.containerd.nri_socket), *extra, extra_plugins=True)
        at = args.index("--hook-config-dir")
        del args[at : at + 2]  # NRI mode alone
        return args, env


@pytest.fixture
def node(nri_containerd: Containerd) -> Iterator[NriNode]:
    with closing(NriNode(nri_containerd)) as made:
        yield made


# -- pods and what is read back ----------------------------------------------------------------------

LSR_CPU = "1"  # the scheduler's cpuset for the LSR pod (the VM has CPUs 0-1)


def run_lsr_pod(node: Node, cri: CriClient) -> Pod:
    """A Guaranteed pod labelled LSR, pinned to CPU 1 by the scheduler's annotation."""
    resources = pb.LinuxContainerResources(
        cpu_period=100_000, cpu_quota=100_000, cpu_shares=1024, memory_limit_in_bytes=64 << 20
    )
    return node.run_pod(
        cri,
        "lsr",
        qos_parent="guaranteed",
        labels={QOS_LABEL: "LSR"},
        annotations={RESOURCE_STATUS: json.dumps({"cpuset": LSR_CPU})},
        containers=[ContainerSpec("app", resources)],
    )


def env_of(cri: CriClient, container_id: str, name: str) -> str:
    request = pb.ExecSyncRequest(container_id=container_id, cmd=["sh", "-c", f"echo ${{{name}-unset}}"], timeout=10)
    reply = cri.runtime.ExecSync(request, timeout=CALL_TIMEOUT)
    assert reply.exit_code == 0, reply.stderr
    return str(reply.stdout.decode().strip())


def observe(node: Node, cri: CriClient) -> dict[str, Any]:
    """Run the BE, LS and LSR pods through ``cri`` and read back everything the plugins decide."""
    be, ls, lsr = run_be_pod(node, cri), run_ls_pod(node, cri), run_lsr_pod(node, cri)
    seen: dict[str, Any] = {"be pod quota": read_int("cpu", "cpu.cfs_quota_us", be.parent)}
    for name, container_id in be.containers.items():
        seen[f"be {name}"] = {
            "quota": read_int("cpu", "cpu.cfs_quota_us", be.parent, container_id),
            "period": read_int("cpu", "cpu.cfs_period_us", be.parent, container_id),
            "shares": read_int("cpu", "cpu.shares", be.parent, container_id),
            "env": env_of(cri, container_id, "RTPX_QOS"),
        }
    app = ls.containers["app"]
    seen["ls app"] = {
        "quota": read_int("cpu", "cpu.cfs_quota_us", ls.parent, app),
        "shares": read_int("cpu", "cpu.shares", ls.parent, app),
        "memory limit": read_int("memory", "memory.limit_in_bytes", ls.parent, app),
        "env": env_of(cri, app, "RTPX_QOS"),
    }
    seen["ls pod quota"] = read_int("cpu", "cpu.cfs_quota_us", ls.parent)
    app = lsr.containers["app"]
    seen["lsr app"] = {
        "cpus": read("cpuset", "cpuset.cpus", lsr.parent, app),
        "quota": read_int("cpu", "cpu.cfs_quota_us", lsr.parent, app),
        "env": env_of(cri, app, "RTPX_QOS"),
    }
    # resctrl (fake tree): the BE containers' threads join the BE group at PostStartContainer.
    tids = set().union(*(threads(be.parent, cid) for cid in be.containers.values()))
    eventually(lambda: tids <= node.group_tasks("rtpx-BE"), 5.0, node.hooks_log)
    seen["be threads in rtpx-BE"] = True
    seen["be threads elsewhere"] = sorted(tids & (node.group_tasks("rtpx-LS") | node.group_tasks("rtpx-LSR")))
    return seen


EXPECTED: dict[str, Any] = {
    # BE: quota = batch-cpu limit * 100 us / 1 m, shares = request * 1024 / 1000; pod: the sum.
    "be pod quota": sum(limit for _, limit in BE_BATCH.values()) * 100,
    **{
        f"be {name}": {"quota": limit * 100, "period": 100_000, "shares": request * 1024 // 1000, "env": "BE"}
        for name, (request, limit) in BE_BATCH.items()
    },
    # LS keeps kubelet's values (container and the pod cgroup kubelet made).
    "ls app": {"quota": LS_QUOTA, "shares": 256, "memory limit": 128 << 20, "env": "LS"},
    "ls pod quota": LS_QUOTA,
    # LSR: pinned to the scheduler's CPU, its CFS quota lifted.
    "lsr app": {"cpus": LSR_CPU, "quota": -1, "env": "LSR"},
    "be threads in rtpx-BE": True,
    "be threads elsewhere": [],
}


def test_nri_pods_get_the_same_values_as_through_the_proxy(node: NriNode) -> None:
    node.start_nri(policy_text(interval=600))  # no reconcile round in between: the hooks did it all
    assert node.hooks is not None
    registered = node.hooks.wait_record(lambda r: r.get("event") == "registered as an NRI plugin")
    assert registered["plugin"] == "50-runtime-hooks"
    assert not list(node.config_dir.glob("*.json")), "NRI mode alone registers nothing for a proxy"
    with CriClient(node.containerd.address, timeout=CALL_TIMEOUT) as cri:  # containerd itself
        over_nri = observe(node, cri)
    assert over_nri == EXPECTED, node.hooks_log()
    handled = [r for r in node.hooks.records() if r.get("event") == "NRI event handled"]
    assert {r["nri_event"] for r in handled} >= {"RunPodSandbox", "CreateContainer", "PostStartContainer"}
    assert all(r["outcome"] == "ok" for r in handled), handled
    assert node.hooks_metric("runtimehooks_nri_connected") == 1
    assert (
        node.hooks_metric(
            "runtimeproxy_hooks_plugin_calls_total", plugin="cpu", hook="PreCreateContainer", outcome="ok"
        )
        >= 4
    )
    assert node.hooks.terminate() == 0, node.hooks_log()
    node.containerd.remove_all_pods()

    # The same pods through the proxy, runtime-hooks in proxy mode (NRI has no plugin now; the
    # fake resctrl tree stays and the new process takes it over).
    node.start(policy_text(interval=600), extra_plugins=True)
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        through_proxy = observe(node, cri)
    assert through_proxy == over_nri


def test_nri_plugin_reconnects_after_a_containerd_restart(node: NriNode) -> None:
    node.start_nri(policy_text(interval=600))
    assert node.hooks is not None
    node.containerd.restart()
    lost = node.hooks.wait_record(lambda r: r.get("event") == "NRI connection lost; reconnecting", REGISTERED_TIMEOUT)
    # containerd 1.7 (NRI 0.6.1) and 2.1 send no Shutdown request when they stop: the connection just ends
    assert lost["reason"] == "the runtime closed the connection", node.hooks_log()
    assert not [r for r in node.hooks.records() if r.get("event") == "the runtime is shutting NRI down"]
    again = node.hooks.wait_record(lambda r: r.get("event") == "NRI plugin re-registered", REGISTERED_TIMEOUT)
    assert again["plugin"] == "50-runtime-hooks"
    assert node.hooks_metric("runtimehooks_nri_reconnects_total") == 1
    assert node.hooks_metric("runtimehooks_nri_connected") == 1
    with CriClient(node.containerd.address, timeout=CALL_TIMEOUT) as cri:
        be = run_be_pod(node, cri)
    name, (request, limit) = next(iter(BE_BATCH.items()))
    assert read_int("cpu", "cpu.cfs_quota_us", be.parent, be.containers[name]) == limit * 100
    assert read_int("cpu", "cpu.shares", be.parent, be.containers[name]) == request * 1024 // 1000
    assert node.hooks.alive


def oom_scores(pod: Pod, name: str) -> set[int]:
    """oom_score_adj of every process in the container's (v1 cpu) cgroup."""
    pids = read("cpu", "cgroup.procs", pod.parent, pod.containers[name]).split()
    return {int((Path("/proc") / pid / "oom_score_adj").read_text()) for pid in pids}


def run_oom_pods(node: NriNode) -> dict[str, Pod]:
    """A BE and an LS pod, each a container with kubelet's OOM score for a Burstable container
    (a pod labelled BE may be Burstable), with runtime-hooks in NRI mode."""
    node.start_nri(policy_text(interval=600))
    burstable = pb.LinuxContainerResources(cpu_period=100_000, cpu_shares=2, oom_score_adj=500)
    with CriClient(node.containerd.address, timeout=CALL_TIMEOUT) as cri:
        return {
            qos: node.run_pod(
                cri,
                f"{qos.lower()}-oom",
                qos_parent="burstable",
                labels={QOS_LABEL: qos},
                annotations={},
                containers=[ContainerSpec("app", burstable)],
            )
            for qos in ("BE", "LS")
        }


def spec_oom_score(node: NriNode, pod: Pod) -> int:
    """The OOM score in the OCI spec containerd created the container with."""
    with CriClient(node.containerd.address, timeout=CALL_TIMEOUT) as cri:
        request = pb.ContainerStatusRequest(container_id=pod.containers["app"], verbose=True)
        status = cri.runtime.ContainerStatus(request)
    return int(json.loads(status.info["info"])["runtimeSpec"]["process"]["oomScoreAdj"])


def nri_configured(node: NriNode) -> dict[str, Any]:
    assert node.hooks is not None
    return node.hooks.wait_record(lambda r: r.get("event") == "NRI configured")


def no_field_refused(node: NriNode) -> bool:
    assert node.hooks is not None
    return not [r for r in node.hooks.records() if r.get("event") == "answer fields NRI cannot apply were not applied"]


@pytest.mark.containerd_series("1.7")
def test_on_nri_0_6_the_oom_score_is_written_to_the_started_process(node: NriNode) -> None:
    """NRI 0.6.1 cannot carry the OOM score the memory plugin answers for BE at PreCreateContainer;
    it is written to the container's process at PostStartContainer, only ever raised."""
    pods = run_oom_pods(node)
    assert node.hooks is not None
    eventually(lambda: oom_scores(pods["BE"], "app") == {1000}, 10.0, node.hooks_log)
    assert oom_scores(pods["LS"], "app") == {500}  # other classes are left to kubelet
    raised = node.hooks.wait_record(lambda r: r.get("event") == "oom_score_adj raised")
    assert (raised["before"], raised["after"], raised["container"]) == (500, 1000, "app")
    assert spec_oom_score(node, pods["BE"]) == 500  # created with kubelet's value
    assert nri_configured(node)["nri"] == "0.6"
    assert no_field_refused(node)


@pytest.mark.containerd_series("2.x")
def test_on_nri_0_8_the_container_is_created_with_the_oom_score(node: NriNode) -> None:
    """containerd 2.x (NRI 0.8) takes the OOM score in the CreateContainer adjustment: the OCI spec
    holds it and the process starts with it; nothing is written after the start."""
    pods = run_oom_pods(node)
    assert node.hooks is not None
    assert spec_oom_score(node, pods["BE"]) == 1000
    assert oom_scores(pods["BE"], "app") == {1000}  # at once: the container was started with it
    assert spec_oom_score(node, pods["LS"]) == 500 and oom_scores(pods["LS"], "app") == {500}
    assert nri_configured(node)["nri"] == "0.7+"
    assert not [r for r in node.hooks.records() if str(r.get("event", "")).startswith("oom_score_adj")]
    assert no_field_refused(node)


def test_a_second_nri_instance_on_the_same_endpoint_refuses_to_start(node: NriNode) -> None:
    """NRI mode alone still binds the hook endpoint: its lock is what keeps a second runtime-hooks
    from registering with NRI as well (which would run every hook twice)."""
    node.start_nri(policy_text(interval=600))
    args, extra_env = node.nri_command()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNTIME_HOOKS_", "NOTIFY_SOCKET"))}
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env | extra_env, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{node.hooks_endpoint} is already being served: another instance holds its lock" in done.stderr
    assert node.hooks is not None and node.hooks.alive
    registered = [r for r in node.hooks.records() if r.get("event") == "registered as an NRI plugin"]
    assert len(registered) == 1


def _serve_once(node: Node, socket: str) -> subprocess.CompletedProcess[str]:
    args = node.hooks_args([*HOOKS[:2], "from runtimeproxy.hooks.cli import main; main()"], node.resctrl_root)
    args += ["--nri-socket", socket, "--runtime-endpoint", ""]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNTIME_HOOKS_", "NOTIFY_SOCKET"))}
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env, check=False)


@pytest.mark.parametrize("case", ["nri off", "missing", "not a socket"])
def test_clear_errors_when_nri_is_unreachable(node: NriNode, containerd: Containerd, case: str) -> None:
    if case == "nri off":  # the shared 1.7 bed: NRI not enabled, so no socket where it would be
        socket = containerd.nri_socket
        expected = "does not exist: the runtime is not running, or NRI is disabled"
    elif case == "missing":
        socket = node.workdir / "no-such.sock"
        expected = "does not exist"
    else:
        socket = node.workdir / "plain-file"
        socket.write_text("")
        expected = "is not a socket"
    done = _serve_once(node, str(socket))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"runtime-hooks: NRI socket {socket} {expected}" in done.stderr or (
        f"runtime-hooks: {socket} {expected}" in done.stderr
    ), done.stderr
    assert 'io.containerd.nri.v1.nri"] disable = false' in done.stderr or case == "not a socket"
    assert not (node.hooks_endpoint.exists()), "the hook socket is gone after refusing"


# -- container repair ---------------------------------------------------------------------------------------


def repairs(node: NriNode, how: str) -> list[dict[str, Any]]:
    assert node.hooks is not None
    return [r for r in node.hooks.records() if r.get("event") == "container repaired" and r.get("how") == how]


def test_a_container_created_while_not_registered_is_repaired_at_synchronize(node: NriNode) -> None:
    node.start_nri(policy_text(interval=600))  # the reconciler's round at start only
    assert node.hooks is not None and node.hooks.terminate() == 0  # NRI forgets the plugin
    with CriClient(node.containerd.address, timeout=CALL_TIMEOUT) as cri:
        be = run_be_pod(node, cri)
    assert be_values(be) == {name: (-1, 2) for name in BE_BATCH}  # kubelet's: no quota, 2 shares
    node.start_nri(policy_text(interval=600), name="hooks-nri-again")
    eventually(lambda: be_values(be) == BE_VALUES, 10.0, node.hooks_log)
    found = {r["container"]: r for r in repairs(node, "Synchronize answer")}
    assert set(found) == set(BE_BATCH), node.hooks_log()
    for name, (quota, shares) in BE_VALUES.items():
        assert (found[name]["mode"], found[name]["reason"], found[name]["container_id"]) == (
            "nri",
            "unhooked",
            be.containers[name],
        )
        assert found[name]["values"] == [f"cpu_quota: -1 -> {quota}", f"cpu_shares: 2 -> {shares}"]
    assert repairs(node, "UpdateContainerResources") == []  # not repaired twice by the reconciler's first round
    assert node.hooks_metric("runtimeproxy_hooks_containers_repaired_total", mode="nri", reason="unhooked") == 2


def test_the_reconciler_sets_back_a_value_changed_behind_containerds_back(node: NriNode) -> None:
    node.start_nri(policy_text(interval=0.5))
    with CriClient(node.containerd.address, timeout=CALL_TIMEOUT) as cri:
        be = run_be_pod(node, cri)
        assert be_values(be) == BE_VALUES
        app = be.containers["app"]
        quota_file = cgroup_dir("cpu", be.parent, app) / "cpu.cfs_quota_us"
        quota_file.write_text("-1")
        eventually(lambda: be_values(be) == BE_VALUES, 10.0, node.hooks_log)
        # logged once containerd has answered the update
        [line] = eventually(lambda: repairs(node, "UpdateContainerResources") or None, 10.0, node.hooks_log)
        assert (line["container"], line["mode"], line["reason"]) == ("app", "nri", "drifted")
        assert line["values"] == [f"cpu_quota: -1 -> {BE_VALUES['app'][0]}"]
        # containerd made the update itself (its NRI event ran our hooks): its spec holds the value
        status = cri.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=app, verbose=True))
        spec = json.loads(status.info["info"])["runtimeSpec"]
        assert spec["linux"]["resources"]["cpu"]["quota"] == BE_VALUES["app"][0]
    assert node.hooks_metric("runtimeproxy_hooks_containers_repaired_total", mode="nri", reason="drifted") == 1
    assert node.hooks_metric("runtimeproxy_hooks_container_repairs_failed_total", mode="nri") == 0


class Churn:
    """BE pods created one after the other straight on containerd, in a thread, until stopped;
    calls failing while containerd is away are counted and tried again."""

    def __init__(self, node: NriNode) -> None:
        self.node = node
        self.pods = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def __enter__(self) -> Churn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(CALL_TIMEOUT)

    def _run(self) -> None:
        with CriClient(self.node.containerd.address, timeout=10.0) as cri:
            while not self._stop.is_set():
                try:
                    run_be_pod(self.node, cri)
                    self.pods += 1
                except Exception:  # containerd away or just back: its calls fail for a while
                    self.failures += 1
                    time.sleep(0.1)


def wrong_be_containers(node: NriNode) -> list[str]:
    """Every running container of a BE pod whose CFS quota or shares are not the plugins'."""
    wrong = []
    with CriClient(node.containerd.address, timeout=CALL_TIMEOUT) as cri:
        sandboxes = {s.id: s for s in cri.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items}
        running = pb.ContainerFilter(state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING))
        for item in cri.runtime.ListContainers(pb.ListContainersRequest(filter=running)).containers:
            sandbox = sandboxes.get(item.pod_sandbox_id)
            if sandbox is None or sandbox.labels.get(QOS_LABEL) != "BE":
                continue
            parent = node.containerd.cgroup_parent(sandbox.metadata.uid, "besteffort")
            try:
                seen = (
                    read_int("cpu", "cpu.cfs_quota_us", parent, item.id),
                    read_int("cpu", "cpu.shares", parent, item.id),
                )
            except FileNotFoundError:  # exited meanwhile
                continue
            if seen != BE_VALUES[item.metadata.name]:
                wrong.append(f"{sandbox.metadata.name}/{item.metadata.name} {item.id[:12]}: {seen}")
    return wrong


def restart_containerd(node: NriNode) -> float | None:
    """Restart containerd as an operator does; when its NRI socket was back."""
    node.containerd.restart()
    return node.containerd.nri_socket.stat().st_mtime


def kill_containerd(node: NriNode, outage: float = 4.0) -> float | None:
    """kill -9 containerd (its shims and containers live on; its NRI socket stays, stale) and
    start it again after ``outage`` seconds; when its NRI socket was back."""
    bed = node.containerd
    assert bed.pid is not None
    os.kill(bed.pid, signal.SIGKILL)
    bed.stop_daemon()  # reaps it
    time.sleep(outage)
    bed.start()
    return bed.nri_socket.stat().st_mtime


def freeze_runtime_hooks(node: NriNode, frozen: float = 4.0) -> float | None:
    """Stop runtime-hooks' process (a blocked event loop) past NRI's 2 s deadline: containerd
    drops the plugin and creates containers without it until it registers again."""
    assert node.hooks is not None
    os.kill(node.hooks.pid, signal.SIGSTOP)
    try:
        time.sleep(frozen)
    finally:
        os.kill(node.hooks.pid, signal.SIGCONT)
    return None  # the socket stayed


def seconds_of(record: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("disrupt", [restart_containerd, kill_containerd, freeze_runtime_hooks])
def test_no_container_keeps_kubelets_values_after_nri_goes_away_during_pod_churn(
    node: NriNode, disrupt: Callable[[NriNode], float | None]
) -> None:
    node.start_nri(policy_text(interval=1.0))
    assert node.hooks is not None
    with Churn(node) as churn:
        eventually(lambda: churn.pods >= 2, 30.0, node.hooks_log)
        before = churn.pods
        back = disrupt(node)
        node.hooks.wait_record(lambda r: r.get("event") == "NRI plugin re-registered", 20.0)
        eventually(lambda: churn.pods >= before + 3, 60.0, node.hooks_log)  # pods came during and after
    eventually(lambda: wrong_be_containers(node) == [], 20.0, lambda: "\n".join(wrong_be_containers(node)))
    if disrupt is freeze_runtime_hooks:  # containerd dropped the plugin: some were created without it
        assert [r for r in node.hooks.records() if r.get("event") == "container repaired"], node.hooks_log()
    if back is not None:  # registration came soon after containerd's NRI socket was back
        again = [r for r in node.hooks.records() if r.get("event") == "registered as an NRI plugin"][-1]
        assert seconds_of(again) - back < 0.5, (again, back)
    assert node.hooks.alive and node.hooks_metric("runtimehooks_nri_connected") == 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
