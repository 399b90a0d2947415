"""``runtime-hooks serve`` with its built-in plugins behind ``runtime-proxy serve``, end to end.

Both daemons run as subprocesses in front of the real containerd test bed. Pods are run
through the proxy with the CRI client; what the plugins promise is read back from the REAL
cgroup v1 files of the pod and container cgroups (cpu, memory), from the container processes
(oom_score_adj), from a fake resctrl tree (this machine has no resctrl) and from the hook
server's log and metrics.

The daemons, the fake resctrl tree they share and the pods run are in tests/hooks_node.py and
tests/pods.py.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from daemons import eventually
from hooks_node import (
    BE_BATCH,
    LS_MEMORY_REQUEST,
    LS_QUOTA,
    Node,
    policy_text,
    run_be_pod,
    run_ls_pod,
    write_atomically,
)
from pods import CALL_TIMEOUT, CGROUP, MiB, cgroup_dir, has, read_int, threads
from prometheus_client.parser import text_string_to_metric_families

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

FULL_L3 = "fffff"  # [0, 100] of 20 ways
BE_L3_DEFAULT = "3f"  # default policy BE [0, 30]: ways 0-5
BE_L3_HALF = "3ff"  # [0, 50]: ways 0-9

# Files not every kernel has: what this one has decides what is asserted (present: the value;
# absent: skipped without a failure). Here (6.x, cgroup v1) there is cpu.cfs_burst_us and
# cpu.idle, but no cpu.bvt_warp_ns and no memory.wmark_* (Alibaba Cloud Linux / Anolis only).
HAS_CFS_BURST = (CGROUP / "cpu" / "cpu.cfs_burst_us").exists()
WMARK_FILES = {"memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20, "memory.wmark_min_adj": -25}  # LS
KERNEL_MAX_SOFT_LIMIT = 9223372036854771712  # memory.soft_limit_in_bytes of a fresh v1 cgroup (PAGE_COUNTER_MAX)

INVALID_POLICY = textwrap.dedent(
    """\
    reconciler:
      interval_seconds: 0.5
    resctrl:
      BE: {l3_percent_range: [60, 20]}
    """
)


@pytest.fixture
def node(containerd: Containerd) -> Iterator[Node]:
    with closing(Node(containerd)) as made:
        yield made


def plugin_calls(node: Node, plugin: str, hook: str, outcome: str) -> float:
    return node.hooks_metric("runtimeproxy_hooks_plugin_calls_total", plugin=plugin, hook=hook, outcome=outcome)


def settled_plugin_calls(node: Node, plugin: str, hook: str, outcome: str, wanted: Callable[[float], bool]) -> None:
    """Wait until the count of a post-hook's plugin calls is ``wanted``. A post-hook runs after
    the proxy has answered, and the runner counts a call after its plugin has returned: its
    cgroup writes can be seen before the count is (a CI run failed on reading it at once)."""
    eventually(lambda: wanted(plugin_calls(node, plugin, hook, outcome)), 5.0, node.hooks_metrics)


def failed_plugin_calls(node: Node, *plugins: str) -> list[str]:
    """Plugin calls of ``plugins`` whose outcome was not ok, as "plugin hook outcome count"."""
    found = []
    for family in text_string_to_metric_families(node.hooks_metrics()):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "runtimeproxy_hooks_plugin_calls_total"
                and labels.get("plugin") in plugins
                and labels.get("outcome") != "ok"
                and sample.value
            ):
                found.append(f"{labels['plugin']} {labels['hook']} {labels['outcome']} {sample.value:g}")
    return found


def warnings_of(node: Node, *plugins: str) -> list[dict[str, Any]]:
    assert node.hooks is not None
    return [r for r in node.hooks.records() if r.get("level") in ("warning", "error") and r.get("plugin") in plugins]


# -- the tests ------------------------------------------------------------------------------------------


def test_ls_pod_gets_cpu_burst_and_memory_soft_limit(node: Node) -> None:
    node.start(policy_text(interval=0.5))
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        pod = run_ls_pod(node, cri)
    parent, app = pod.parent, pod.containers["app"]

    # cpu, LS: cfs_burst_percent 1000, which the kernel caps at the quota (so burst = quota, pod
    # and container); the quota is kubelet's; cpu_idle false; group identity 2.
    assert read_int("cpu", "cpu.cfs_quota_us", parent) == LS_QUOTA  # kubelet's, untouched
    assert read_int("cpu", "cpu.cfs_quota_us", parent, app) == LS_QUOTA  # the CRI limit, untouched
    assert read_int("cpu", "cpu.shares", parent, app) == 256
    assert has("cpu", "cpu.cfs_burst_us", parent) == HAS_CFS_BURST
    if HAS_CFS_BURST:
        assert read_int("cpu", "cpu.cfs_burst_us", parent) == LS_QUOTA
        # PostStartContainer runs after StartContainer has answered.
        eventually(lambda: read_int("cpu", "cpu.cfs_burst_us", parent, app) == LS_QUOTA, 5.0, node.hooks_log)
    if has("cpu", "cpu.idle", parent):
        assert read_int("cpu", "cpu.idle", parent) == 0
    if has("cpu", "cpu.bvt_warp_ns", parent):
        assert read_int("cpu", "cpu.bvt_warp_ns", parent) == 2

    # memory, v1: soft limit = the memory request (policy LS v1_soft_limit: request), pod and container.
    assert read_int("memory", "memory.soft_limit_in_bytes", parent) == LS_MEMORY_REQUEST
    eventually(
        lambda: read_int("memory", "memory.soft_limit_in_bytes", parent, app) == LS_MEMORY_REQUEST,
        5.0,
        node.hooks_log,
    )
    assert read_int("memory", "memory.limit_in_bytes", parent, app) == 128 * MiB  # the runtime's, untouched
    for name, value in WMARK_FILES.items():
        for container_id in (None, app):
            if has("memory", name, parent, container_id):
                where = (name, parent, container_id)
                eventually(lambda where=where, value=value: read_int("memory", *where) == value, 5.0, node.hooks_log)
    # LS is not BE: the OOM score kubelet asked for stays.
    [pid] = threads(parent, app)
    assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "900"

    # Unsupported files were skipped without a failure or a warning.
    for hook in ("PreRunPodSandbox", "PostStartContainer"):
        for plugin in ("cpu", "memory"):
            settled_plugin_calls(node, plugin, hook, "ok", lambda n: n >= 1)
    assert failed_plugin_calls(node, "cpu", "memory") == []
    assert warnings_of(node, "cpu", "memory") == [], warnings_of(node, "cpu", "memory")


def test_be_pod_gets_batch_cpu_quota_and_shares(node: Node) -> None:
    node.start(policy_text(interval=0.5))
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        pod = run_be_pod(node, cri)
    parent = pod.parent

    # Containers: quota = limit * 100 µs / 1 m, period 100 ms, shares = request * 1024 / 1000.
    for name, (request, limit) in BE_BATCH.items():
        container_id = pod.containers[name]
        assert read_int("cpu", "cpu.cfs_quota_us", parent, container_id) == limit * 100, name
        assert read_int("cpu", "cpu.cfs_period_us", parent, container_id) == 100_000, name
        assert read_int("cpu", "cpu.shares", parent, container_id) == request * 1024 // 1000, name
        if HAS_CFS_BURST:  # BE has cfs_burst_percent 0: no burst
            assert read_int("cpu", "cpu.cfs_burst_us", parent, container_id) == 0, name
        # memory: BE's v1_soft_limit is "unset": the kernel's default stays; oom_score_adj 1000.
        assert read_int("memory", "memory.soft_limit_in_bytes", parent, container_id) == KERNEL_MAX_SOFT_LIMIT
        for pid in threads(parent, container_id):
            assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000", name

    # The pod cgroup (the plugin made it: there is no kubelet) holds the sum of the limits.
    assert read_int("cpu", "cpu.cfs_quota_us", parent) == sum(limit for _, limit in BE_BATCH.values()) * 100
    assert read_int("cpu", "cpu.cfs_period_us", parent) == 100_000
    # and Koordinator's pod shares: MilliCPUToShares(sum of the batch-cpu requests), not kubelet's 2.
    batch_requests = sum(request for request, _ in BE_BATCH.values())
    assert read_int("cpu", "cpu.shares", parent) == max(batch_requests * 1024 // 1000, 2)
    if HAS_CFS_BURST:
        assert read_int("cpu", "cpu.cfs_burst_us", parent) == 0
    assert failed_plugin_calls(node, "cpu", "memory") == []


def test_resctrl_groups_and_container_threads(node: Node) -> None:
    # A long reconcile interval: the threads can only have been moved by PostStartContainer.
    node.start(policy_text(interval=600))
    assert sorted(p.name for p in node.resctrl_root.iterdir() if p.name.startswith("rtpx-")) == [
        "rtpx-BE",
        "rtpx-LS",
        "rtpx-LSR",
    ]
    assert node.group_schemata("rtpx-BE") == {"L3": f"0={BE_L3_DEFAULT};1={BE_L3_DEFAULT}", "MB": "0=100;1=100"}
    for group in ("rtpx-LS", "rtpx-LSR"):
        assert node.group_schemata(group) == {"L3": f"0={FULL_L3};1={FULL_L3}", "MB": "0=100;1=100"}, group
    assert node.hooks is not None
    node.hooks.wait_record(lambda r: r.get("event") == "resctrl groups ready")

    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        pod = run_be_pod(node, cri)
    tids = set()
    for container_id in pod.containers.values():
        tids |= threads(pod.parent, container_id)
    assert tids
    eventually(lambda: tids <= node.group_tasks("rtpx-BE"), 5.0, node.hooks_log)
    assert not tids & (node.group_tasks("rtpx-LS") | node.group_tasks("rtpx-LSR"))
    settled_plugin_calls(node, "resctrl", "PostStartContainer", "ok", lambda n: n == len(BE_BATCH))
    assert plugin_calls(node, "resctrl", "reconcile", "ok") <= 1  # at most the round at start: not the mover
    assert failed_plugin_calls(node, "resctrl") == []

    # A reload that shortens the reconcile interval takes effect at once (not after the 600 s
    # wait in progress): the next round brings the group to the new policy.
    write_atomically(node.policy, policy_text(interval=0.5, be_l3=(0, 50)))
    eventually(lambda: node.group_schemata("rtpx-BE")["L3"] == f"0={BE_L3_HALF};1={BE_L3_HALF}", 2.0, node.hooks_log)


def test_reconciler_repairs_drift(node: Node) -> None:
    interval = 0.5
    node.start(policy_text(interval=interval))
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        pod = run_be_pod(node, cri)
    quota_file = cgroup_dir("cpu", pod.parent) / "cpu.cfs_quota_us"
    wanted = sum(limit for _, limit in BE_BATCH.values()) * 100
    assert int(quota_file.read_text()) == wanted
    # Let the first rounds see the pod settled, then drift the pod quota (above the children's).
    time.sleep(2 * interval)
    before = node.hooks_metric("runtimehooks_reconcile_drift_total", plugin="cpu")
    quota_file.write_text("500000")
    assert int(quota_file.read_text()) == 500_000
    # Repaired within two intervals (and a second for listing the pods on a loaded machine).
    eventually(lambda: int(quota_file.read_text()) == wanted, 2 * interval + 1.0, node.hooks_log)
    after = eventually(
        lambda: v if (v := node.hooks_metric("runtimehooks_reconcile_drift_total", plugin="cpu")) > before else None,
        2.0,
        node.hooks_log,
    )
    assert after >= before + 1
    assert node.hooks is not None
    node.hooks.wait_record(
        lambda r: r.get("event") == "repaired drifted cpu settings" and "quota" in r.get("settings", [])
    )
    # The pod's batch shares: kubelet would reset them to 2 (BestEffort); the reconciler puts them back.
    shares_file = cgroup_dir("cpu", pod.parent) / "cpu.shares"
    wanted_shares = sum(request for request, _ in BE_BATCH.values()) * 1024 // 1000
    assert int(shares_file.read_text()) == wanted_shares
    shares_file.write_text("2")
    eventually(lambda: int(shares_file.read_text()) == wanted_shares, 2 * interval + 1.0, node.hooks_log)

    # The pod's threads PostStartContainer never saw (the sandbox's) were moved into the group.
    sandbox_tids = threads(pod.parent, pod.sandbox_id)
    assert sandbox_tids
    eventually(lambda: sandbox_tids <= node.group_tasks("rtpx-BE"), 2 * interval + 1.0, node.hooks_log)

    # resctrl drift: someone rewrote the BE group's schemata; the next rounds put it back.
    resctrl_before = node.hooks_metric("runtimehooks_reconcile_drift_total", plugin="resctrl")
    (node.resctrl_root / "rtpx-BE" / "schemata").write_text(f"L3:0={FULL_L3};1={FULL_L3}\nMB:0=100;1=100\n")
    eventually(
        lambda: node.group_schemata("rtpx-BE")["L3"] == f"0={BE_L3_DEFAULT};1={BE_L3_DEFAULT}",
        2 * interval + 1.0,
        node.hooks_log,
    )
    eventually(
        lambda: node.hooks_metric("runtimehooks_reconcile_drift_total", plugin="resctrl") > resctrl_before,
        2.0,
        node.hooks_log,
    )


def test_policy_reload_and_invalid_policy(node: Node) -> None:
    node.start(policy_text(interval=0.5))
    assert node.group_schemata("rtpx-BE")["L3"] == f"0={BE_L3_DEFAULT};1={BE_L3_DEFAULT}"
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        ls = run_ls_pod(node, cri)
    parent, app = ls.parent, ls.containers["app"]
    eventually(
        lambda: read_int("memory", "memory.soft_limit_in_bytes", parent, app) == LS_MEMORY_REQUEST, 5.0, node.hooks_log
    )

    new_policy = policy_text(interval=0.5, be_l3=(0, 50), ls_soft_limit="zero", ls_burst_percent=40)
    write_atomically(node.policy, new_policy)
    began = time.monotonic()
    eventually(lambda: node.group_schemata("rtpx-BE")["L3"] == f"0={BE_L3_HALF};1={BE_L3_HALF}", 2.0, node.hooks_log)
    assert time.monotonic() - began <= 2.0
    assert node.group_schemata("rtpx-LS")["L3"] == f"0={FULL_L3};1={FULL_L3}"
    # The reconciler brings the other plugins' values of the running pod to the new policy too:
    # the pod's burst (40 % of its quota) and the v1 soft limits ("zero").
    if HAS_CFS_BURST:
        eventually(lambda: read_int("cpu", "cpu.cfs_burst_us", parent) == LS_QUOTA * 40 // 100, 2.0, node.hooks_log)
    eventually(lambda: read_int("memory", "memory.soft_limit_in_bytes", parent) == 0, 2.0, node.hooks_log)
    eventually(lambda: read_int("memory", "memory.soft_limit_in_bytes", parent, app) == 0, 2.0, node.hooks_log)

    write_atomically(node.policy, INVALID_POLICY)
    assert node.hooks is not None
    invalid = node.hooks.wait_record(lambda r: r.get("event") == "policy file invalid; keeping the current policy")
    assert invalid["level"] == "error"
    assert invalid["path"] == str(node.policy)
    assert invalid["yaml_path"] == "resctrl.BE.l3_percent_range"
    assert "60" in invalid["reason"] and "20" in invalid["reason"], invalid
    time.sleep(1.5)  # three reconcile intervals: the last good policy is still the one applied
    assert node.group_schemata("rtpx-BE") == {"L3": f"0={BE_L3_HALF};1={BE_L3_HALF}", "MB": "0=100;1=100"}
    if HAS_CFS_BURST:
        assert read_int("cpu", "cpu.cfs_burst_us", parent) == LS_QUOTA * 40 // 100
    assert read_int("memory", "memory.soft_limit_in_bytes", parent, app) == 0
    assert node.hooks.alive

    # A valid file again: it is taken up.
    write_atomically(node.policy, policy_text(interval=0.5))
    eventually(
        lambda: node.group_schemata("rtpx-BE")["L3"] == f"0={BE_L3_DEFAULT};1={BE_L3_DEFAULT}", 2.0, node.hooks_log
    )
    eventually(
        lambda: read_int("memory", "memory.soft_limit_in_bytes", parent, app) == LS_MEMORY_REQUEST, 2.0, node.hooks_log
    )
    if HAS_CFS_BURST:
        eventually(lambda: read_int("cpu", "cpu.cfs_burst_us", parent) == LS_QUOTA, 2.0, node.hooks_log)
    assert node.hooks.alive


def test_crashing_and_hanging_plugins_do_not_stop_the_built_in_ones(node: Node) -> None:
    node.start(policy_text(interval=0.5), extra_plugins=True)
    assert node.hooks is not None
    serving = node.hooks.wait_record(lambda r: r.get("event") == "serving runtime hooks")
    assert {"e2e-crash", "e2e-hang", "cpu", "memory", "resctrl"} <= set(serving["plugins"]), serving

    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        began = time.monotonic()
        be = run_be_pod(node, cri)
        ls = run_ls_pod(node, cri)
        took = time.monotonic() - began
        # Neither plugin's changes landed; the container has no E2E_CRASH variable.
        status = cri.runtime.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=be.sandbox_id))
        assert "e2e-hang" not in status.status.annotations
        reply = cri.runtime.ExecSync(
            pb.ExecSyncRequest(container_id=be.containers["app"], cmd=["sh", "-c", "echo ${E2E_CRASH-unset}"]),
            timeout=CALL_TIMEOUT,
        )
        assert reply.stdout == b"unset\n"
    assert took < 20, f"the pods took {took:.1f}s to start"

    # The built-in plugins' values landed anyway.
    for name, (request, limit) in BE_BATCH.items():
        assert read_int("cpu", "cpu.cfs_quota_us", be.parent, be.containers[name]) == limit * 100, name
        assert read_int("cpu", "cpu.shares", be.parent, be.containers[name]) == request * 1024 // 1000, name
    assert read_int("cpu", "cpu.cfs_quota_us", be.parent) == sum(limit for _, limit in BE_BATCH.values()) * 100
    assert read_int("memory", "memory.soft_limit_in_bytes", ls.parent) == LS_MEMORY_REQUEST  # PreRunPodSandbox
    if HAS_CFS_BURST:
        assert read_int("cpu", "cpu.cfs_burst_us", ls.parent) == LS_QUOTA
    tids = threads(be.parent, be.containers["app"])
    eventually(lambda: tids <= node.group_tasks("rtpx-BE"), 5.0, node.hooks_log)

    # The failures were logged and counted as what they were.
    crash = node.hooks.wait_record(
        lambda r: r.get("event") == "plugin failed; its changes are ignored" and r.get("plugin") == "e2e-crash"
    )
    assert crash["outcome"] == "error" and "RuntimeError: e2e-crash: boom in" in crash["reason"], crash
    hang = node.hooks.wait_record(
        lambda r: r.get("event") == "plugin failed; its changes are ignored" and r.get("plugin") == "e2e-hang"
    )
    assert hang["outcome"] == "timeout", hang
    assert plugin_calls(node, "e2e-crash", "PreCreateContainer", "error") == 3  # be: app, side; ls: app
    hung = sum(
        plugin_calls(node, "e2e-hang", hook, outcome)
        for hook in ("PreRunPodSandbox", "PreCreateContainer")
        for outcome in ("timeout", "busy")
    )
    assert hung == 5  # 2 sandboxes + 3 containers: each timed out, or was refused once 4 threads hung
    assert failed_plugin_calls(node, "cpu", "memory", "resctrl") == []

    # runtime-hooks keeps serving: another pod goes through all hook points, then a clean stop.
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        again = run_be_pod(node, cri)
    assert read_int("cpu", "cpu.cfs_quota_us", again.parent, again.containers["app"]) == BE_BATCH["app"][1] * 100
    assert node.hooks.alive
    assert node.hooks.terminate() == 0, node.hooks_log()
