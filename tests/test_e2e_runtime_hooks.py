"""``runtime-hooks serve`` with its built-in plugins behind ``runtime-proxy serve``, end to end.

Both daemons run as subprocesses in front of the real containerd test bed. Pods are run
through the proxy with the CRI client; what the plugins promise is read back from the REAL
cgroup v1 files of the pod and container cgroups (cpu, memory), from the container processes
(oom_score_adj), from a fake resctrl tree (this machine has no resctrl) and from the hook
server's log and metrics.

**The fake resctrl tree across processes.** ``make_fake_resctrl`` builds the tree here, in the
test process; the kernel behaviour behind it (mkdir populating a group, schemata writes
validated and re-rendered, tasks moved) lives in a :class:`FakeResctrl` object, which a
second process cannot reach. So the runtime-hooks subprocess is started with a tiny module
(``rtpx_e2e_fake_kernel``, written into a temporary PYTHONPATH directory and imported before
``main()``) that calls the test kit's ``attach_fake_resctrl`` with the tree made here and its
options: that process then drives the tree as its resctrl kernel. Nothing else changes: the
server's ResctrlFS, the plugin and the reconciler run unmodified, and this test reads the files
the fake renders, as one reads the kernel's.

**Extra plugins** (a crashing and a hanging one) are not installed: their modules and a
``*.dist-info/entry_points.txt`` (group ``runtimeproxy.hooks``) go into a temporary directory
put on the PYTHONPATH of that one runtime-hooks subprocess.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from daemons import DROP_ENV, Daemon, ProxyAndHooks, eventually
from prometheus_client.parser import text_string_to_metric_families
from runtimeproxy.hooks.testkit.resctrl import make_fake_resctrl

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.cri_client import CriClient
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

# The hook server, with this process's resctrl "kernel" replaced by the fake (see the module doc).
HOOKS = [sys.executable, "-c", "import rtpx_e2e_fake_kernel; from runtimeproxy.hooks.cli import main; main()"]
CGROUP = Path("/sys/fs/cgroup")
STOP_TIMEOUT = 15.0
REGISTRATION_LATENCY = 5.0  # the proxy polls its hook config directory every 0.2 s
CALL_TIMEOUT = 60.0

# A 20-way L3 (so percentages fall on whole ways), two caches, MBA on two domains, 16 CLOSIDs.
FAKE_RESCTRL = {"l3_ids": [0, 1], "cbm_mask": "fffff", "mb_ids": [0, 1], "num_closids": 16}
FULL_L3 = "fffff"  # [0, 100] of 20 ways
BE_L3_DEFAULT = "3f"  # default policy BE [0, 30]: ways 0-5
BE_L3_HALF = "3ff"  # [0, 50]: ways 0-9

# Files not every kernel has: what this one has decides what is asserted (present: the value;
# absent: skipped without a failure). Here (6.x, cgroup v1) there is cpu.cfs_burst_us and
# cpu.idle, but no cpu.bvt_warp_ns and no memory.wmark_* (Alibaba Cloud Linux / Anolis only).
HAS_CFS_BURST = (CGROUP / "cpu" / "cpu.cfs_burst_us").exists()
WMARK_FILES = {"memory.wmark_ratio": 95, "memory.wmark_scale_factor": 20, "memory.wmark_min_adj": -25}  # LS
KERNEL_MAX_SOFT_LIMIT = 9223372036854771712  # memory.soft_limit_in_bytes of a fresh v1 cgroup (PAGE_COUNTER_MAX)

QOS_LABEL = "koordinator.sh/qosClass"
SPEC_ANNOTATION = "node.koordinator.sh/extended-resource-spec"
BATCH_CPU = "kubernetes.io/batch-cpu"
MiB = 1 << 20

FAKE_KERNEL_MODULE = """\
\"\"\"Makes this process's resctrl "kernel" the test kit's fake, over the tree the test made.\"\"\"
import json
import os

if os.environ.get("RTPX_E2E_FAKE_RESCTRL"):
    from runtimeproxy.hooks.testkit import attach_fake_resctrl

    spec = json.loads(os.environ["RTPX_E2E_FAKE_RESCTRL"])
    attach_fake_resctrl(spec["root"], **spec["options"])
"""

CRASH_PLUGIN = """\
from runtimeproxy.hooks.sdk import HookPoint, Plugin

plugin = Plugin("e2e-crash", version="0.1", order=25, failure_policy="ignore", timeout=1.0)


@plugin.on(HookPoint.PRE_CREATE_CONTAINER)
def crash(*, container, response, **kwargs):
    response.env.set("E2E_CRASH", "must-not-land")
    raise RuntimeError(f"e2e-crash: boom in {container.name}")
"""

HANG_PLUGIN = """\
import time

from runtimeproxy.hooks.sdk import HookPoint, Plugin

plugin = Plugin("e2e-hang", version="0.1", order=10, failure_policy="ignore", timeout=0.3)


@plugin.on(HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER)
def hang(*, response, **kwargs):
    response.annotations["e2e-hang"] = "must-not-land"
    while True:
        time.sleep(3600)
"""

EXTRA_PLUGINS_DIST = "rtpx_e2e_extra_plugins-0.1.dist-info"
EXTRA_PLUGINS_ENTRY_POINTS = """\
[runtimeproxy.hooks]
e2e-crash = rtpx_e2e_crash:plugin
e2e-hang = rtpx_e2e_hang:plugin
"""


# -- policies ---------------------------------------------------------------------------------------


def policy_text(
    *,
    interval: float = 0.5,
    be_l3: tuple[int, int] = (0, 30),
    ls_soft_limit: str = "request",
    ls_burst_percent: int = 1000,
) -> str:
    """The policy the tests run with: the defaults, except the reconcile interval, LS's v1 soft
    limit (by default its memory request), LS's burst and BE's L3 range. Network QoS stays off
    (interface "")."""
    return textwrap.dedent(
        f"""\
        reconciler:
          interval_seconds: {interval}
        cpu:
          LS: {{cfs_burst_percent: {ls_burst_percent}}}
        memory:
          LS: {{v1_soft_limit: {ls_soft_limit}}}
        resctrl:
          BE: {{l3_percent_range: [{be_l3[0]}, {be_l3[1]}]}}
        network:
          interface: ""
        """
    )


INVALID_POLICY = textwrap.dedent(
    """\
    reconciler:
      interval_seconds: 0.5
    resctrl:
      BE: {l3_percent_range: [60, 20]}
    """
)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` as the policy doc asks (a temporary file renamed over it)."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    temporary.write_text(text)
    os.replace(temporary, path)


# -- the daemons ----------------------------------------------------------------------------------


def metric(text: str, name: str, **labels: str) -> float | None:
    """A sample's value in Prometheus exposition text (None when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


@dataclass
class Pod:
    uid: str
    sandbox_id: str
    parent: str
    containers: dict[str, str] = field(default_factory=dict)  # name -> id


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    resources: pb.LinuxContainerResources
    command: tuple[str, ...] = ()  # the image's default (sleep) when empty


class Node(ProxyAndHooks):
    """The proxy and runtime-hooks in one short temporary directory (socket paths are limited)."""

    def __init__(self, containerd: Containerd) -> None:
        super().__init__(containerd, "rtpxrh-", drop_env=(*DROP_ENV, "RTPX_E2E_"), stop_timeout=STOP_TIMEOUT)
        self.policy = self.workdir / "policy.yaml"
        self.resctrl_root = self.workdir / "resctrl"
        self.resctrl = make_fake_resctrl(self.resctrl_root, **FAKE_RESCTRL)
        self.kernel_dir = self.workdir / "kernel"
        self.kernel_dir.mkdir()
        (self.kernel_dir / "rtpx_e2e_fake_kernel.py").write_text(FAKE_KERNEL_MODULE)
        self.proxy: Daemon | None = None
        self.hooks: Daemon | None = None
        self.metrics_url = ""

    # -- starting --

    def start(self, policy: str, *, extra_plugins: bool = False) -> None:
        write_atomically(self.policy, policy)
        self.proxy = self.start_daemon("proxy", self.proxy_args(), {})
        path = [str(self.kernel_dir)]
        if extra_plugins:
            path.append(str(self._write_extra_plugins()))
        if os.environ.get("PYTHONPATH"):
            path.append(os.environ["PYTHONPATH"])
        self.hooks = self.start_daemon(
            "hooks",
            self.hooks_args(
                HOOKS,
                self.resctrl_root,
                "--runtime-endpoint",
                self.containerd.address,
                "--policy",
                str(self.policy),
                "--metrics-address",
                "127.0.0.1:0",
            ),
            {
                "PYTHONPATH": os.pathsep.join(path),
                "RTPX_E2E_FAKE_RESCTRL": json.dumps({"root": str(self.resctrl_root), "options": FAKE_RESCTRL}),
            },
        )
        ready = self.hooks.wait_record(lambda r: r.get("event") == "ready")
        self.metrics_url = f"http://{ready['metrics_address']}/metrics"
        self.proxy.wait_record(
            lambda r: r.get("event") == "hook server added" and r.get("server") == "runtime-hooks.json",
            timeout=REGISTRATION_LATENCY,
        )

    def _write_extra_plugins(self) -> Path:
        directory = self.workdir / "extra-plugins"
        dist = directory / EXTRA_PLUGINS_DIST
        dist.mkdir(parents=True)
        (directory / "rtpx_e2e_crash.py").write_text(CRASH_PLUGIN)
        (directory / "rtpx_e2e_hang.py").write_text(HANG_PLUGIN)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rtpx-e2e-extra-plugins\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(EXTRA_PLUGINS_ENTRY_POINTS)
        return directory

    # -- reading --

    def hooks_metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as reply:
            return str(reply.read().decode())

    def hooks_metric(self, name: str, **labels: str) -> float:
        return metric(self.hooks_metrics(), name, **labels) or 0.0

    def hooks_log(self) -> str:
        assert self.hooks is not None
        return self.hooks.log()

    def group_schemata(self, group: str) -> dict[str, str]:
        """The fake resctrl group's schemata as rendered: {resource: "id=value;..."}."""
        lines = (self.resctrl_root / group / "schemata").read_text().splitlines()
        return {name.strip(): values for name, _, values in (line.partition(":") for line in lines if line.strip())}

    def group_tasks(self, group: str) -> set[int]:
        return {int(word) for word in (self.resctrl_root / group / "tasks").read_text().split()}

    # -- pods --

    def run_pod(
        self,
        cri: CriClient,
        name: str,
        *,
        qos_parent: str,
        labels: dict[str, str],
        annotations: dict[str, str],
        containers: list[ContainerSpec],
        pod_resources: pb.LinuxContainerResources | None = None,
        before: Callable[[str], None] | None = None,
    ) -> Pod:
        """RunPodSandbox, then CreateContainer + StartContainer per container, through ``cri``.
        ``before(parent)`` runs first (e.g. to create the pod cgroup as kubelet does)."""
        uid = str(uuid.uuid4())
        parent = self.containerd.cgroup_parent(uid, qos_parent)
        self.parents.append(parent)
        if before is not None:
            before(parent)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=f"{name}-{uid[:8]}", uid=uid, namespace="e2e-hooks"),
            log_directory=str(self.containerd.root_dir / "pod-logs" / uid),
            labels=labels,
            annotations=annotations,
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=parent,
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
            ),
        )
        if pod_resources is not None:
            config.linux.resources.CopyFrom(pod_resources)
        sandbox_id = cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT)
        pod = Pod(uid, sandbox_id.pod_sandbox_id, parent)
        for spec in containers:
            container = pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name=spec.name),
                image=pb.ImageSpec(image=self.containerd.test_image),
                command=list(spec.command),
                log_path=f"{spec.name}.log",
                linux=pb.LinuxContainerConfig(resources=spec.resources),
            )
            request = pb.CreateContainerRequest(pod_sandbox_id=pod.sandbox_id, config=container, sandbox_config=config)
            container_id = cri.runtime.CreateContainer(request, timeout=CALL_TIMEOUT).container_id
            cri.runtime.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=CALL_TIMEOUT)
            pod.containers[spec.name] = container_id
        return pod


@pytest.fixture
def node(containerd: Containerd) -> Iterator[Node]:
    made = Node(containerd)
    try:
        yield made
    finally:
        made.close()


# -- cgroup files ------------------------------------------------------------------------------------


def cgroup_dir(controller: str, parent: str, container_id: str | None = None) -> Path:
    path = CGROUP / controller / parent.lstrip("/")
    return path / container_id if container_id else path


def read(controller: str, name: str, parent: str, container_id: str | None = None) -> str:
    return (cgroup_dir(controller, parent, container_id) / name).read_text().strip()


def read_int(controller: str, name: str, parent: str, container_id: str | None = None) -> int:
    return int(read(controller, name, parent, container_id))


def has(controller: str, name: str, parent: str, container_id: str | None = None) -> bool:
    return (cgroup_dir(controller, parent, container_id) / name).exists()


def threads(parent: str, container_id: str) -> set[int]:
    """The container's thread ids, from its real v1 cgroup's ``tasks``."""
    return {int(word) for word in read("cpu", "tasks", parent, container_id).split()}


def kubelet_creates_pod_cgroup(cpu_quota: int) -> Callable[[str], None]:
    """What kubelet does before RunPodSandbox for a Burstable pod with a cpu limit: the pod cgroup
    exists in the cpu and memory hierarchies, with the pod's CFS quota."""

    def create(parent: str) -> None:
        for controller in ("cpu", "memory"):
            cgroup_dir(controller, parent).mkdir(parents=True)
        (cgroup_dir("cpu", parent) / "cpu.cfs_quota_us").write_text(str(cpu_quota))

    return create


def extended_resource_spec(containers: dict[str, dict[str, dict[str, str]]]) -> str:
    return json.dumps({"containers": containers})


# -- pods the tests run --------------------------------------------------------------------------------

LS_QUOTA = 50_000  # a 500m cpu limit with a 100 ms period
LS_MEMORY_REQUEST = 64 * MiB


def run_ls_pod(node: Node, cri: CriClient) -> Pod:
    """A Burstable pod labelled LS: one container with a 500m cpu limit and a 64Mi memory request."""
    resources = pb.LinuxContainerResources(
        cpu_period=100_000, cpu_quota=LS_QUOTA, cpu_shares=256, memory_limit_in_bytes=128 * MiB, oom_score_adj=900
    )
    pod_resources = pb.LinuxContainerResources(
        cpu_period=100_000, cpu_quota=LS_QUOTA, cpu_shares=256, memory_limit_in_bytes=128 * MiB
    )
    return node.run_pod(
        cri,
        "ls",
        qos_parent="burstable",
        labels={QOS_LABEL: "LS"},
        annotations={SPEC_ANNOTATION: extended_resource_spec({"app": {"requests": {"memory": "64Mi"}}})},
        containers=[ContainerSpec("app", resources)],
        pod_resources=pod_resources,
        before=kubelet_creates_pod_cgroup(LS_QUOTA),
    )


# Batch cpu in milli-cores (Koordinator's kubernetes.io/batch-cpu quantities count milli-cores).
BE_BATCH = {"app": (250, 500), "side": (100, 300)}  # name -> (request, limit)


def run_be_pod(node: Node, cri: CriClient) -> Pod:
    """A BestEffort pod labelled BE with two containers, their batch cpu in the Koordinator annotation.
    The CRI resources are what kubelet sends for BestEffort: 2 shares, no quota, oom_score_adj 1000."""
    spec = {
        name: {"requests": {BATCH_CPU: str(request)}, "limits": {BATCH_CPU: str(limit)}}
        for name, (request, limit) in BE_BATCH.items()
    }
    kubelet = pb.LinuxContainerResources(cpu_period=100_000, cpu_shares=2, oom_score_adj=1000)
    return node.run_pod(
        cri,
        "be",
        qos_parent="besteffort",
        labels={QOS_LABEL: "BE"},
        annotations={SPEC_ANNOTATION: extended_resource_spec(spec)},
        containers=[ContainerSpec(name, kubelet) for name in BE_BATCH],
    )


def plugin_calls(node: Node, plugin: str, hook: str, outcome: str) -> float:
    return node.hooks_metric("runtimeproxy_hooks_plugin_calls_total", plugin=plugin, hook=hook, outcome=outcome)


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
            assert plugin_calls(node, plugin, hook, "ok") >= 1, (plugin, hook)
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
    assert plugin_calls(node, "resctrl", "PostStartContainer", "ok") == len(BE_BATCH)
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
