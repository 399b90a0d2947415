"""``runtime-hooks serve`` with its built-in plugins behind ``runtime-proxy serve``, as
subprocesses in front of the real containerd test bed (`Node`), and the pods the end-to-end
tests run through them.

**The fake resctrl tree across processes.** ``make_fake_resctrl`` builds the tree here, in the
test process; the kernel behaviour behind it (mkdir populating a group, schemata writes
validated and re-rendered, tasks moved) lives in a :class:`FakeResctrl` object, which a
second process cannot reach. So the runtime-hooks subprocess is started with a tiny module
(``rtpx_e2e_fake_kernel``, written into a temporary PYTHONPATH directory and imported before
``main()``) that calls the test kit's ``attach_fake_resctrl`` with the tree made here and its
options: that process then drives the tree as its resctrl kernel. Nothing else changes: the
server's ResctrlFS, the plugin and the reconciler run unmodified, and the tests read the files
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
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from daemons import DROP_ENV, Daemon, ProxyAndHooks
from pods import (
    BATCH_CPU,
    CALL_TIMEOUT,
    QOS_LABEL,
    SPEC_ANNOTATION,
    ContainerSpec,
    MiB,
    Pod,
    extended_resource_spec,
    kubelet_creates_pod_cgroup,
    read_int,
)
from prometheus_client.parser import text_string_to_metric_families
from runtimeproxy.hooks.testkit.fake_resctrl import make_fake_resctrl

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

# The hook server, with this process's resctrl "kernel" replaced by the fake (see the module doc).
HOOKS = [sys.executable, "-c", "import rtpx_e2e_fake_kernel; from runtimeproxy.hooks.cli import main; main()"]
STOP_TIMEOUT = 15.0
REGISTRATION_LATENCY = 5.0  # the proxy polls its hook config directory every 0.2 s

# A 20-way L3 (so percentages fall on whole ways), two caches, MBA on two domains, 16 CLOSIDs.
FAKE_RESCTRL = {"l3_ids": [0, 1], "cbm_mask": "fffff", "mb_ids": [0, 1], "num_closids": 16}

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
        args, env = self.hooks_command(extra_plugins=extra_plugins)
        self.hooks = self.start_daemon("hooks", args, env)
        ready = self.hooks.wait_record(lambda r: r.get("event") == "ready")
        self.metrics_url = f"http://{ready['metrics_address']}/metrics"
        self.proxy.wait_record(
            lambda r: r.get("event") == "hook server added" and r.get("server") == "runtime-hooks.json",
            timeout=REGISTRATION_LATENCY,
        )

    def hooks_command(self, *extra: str, extra_plugins: bool = False) -> tuple[list[str], dict[str, str]]:
        """``runtime-hooks serve`` on the fake resctrl kernel and the test bed, with the policy
        file, metrics on a free port, then ``extra``; and the environment it needs beside ours
        (``extra_plugins``: their directory on its PYTHONPATH too)."""
        args = self.hooks_args(
            HOOKS,
            self.resctrl_root,
            "--runtime-endpoint",
            self.containerd.address,
            "--policy",
            str(self.policy),
            "--metrics-address",
            "127.0.0.1:0",
            *extra,
        )
        path = [str(self.kernel_dir)]
        if extra_plugins:
            path.append(str(self._write_extra_plugins()))
        path.append(os.environ.get("PYTHONPATH", ""))
        return args, {
            "PYTHONPATH": os.pathsep.join(p for p in path if p),
            "RTPX_E2E_FAKE_RESCTRL": json.dumps({"root": str(self.resctrl_root), "options": FAKE_RESCTRL}),
        }

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
#: What the plugins set for run_be_pod's containers: (cpu.cfs_quota_us, cpu.shares) by name,
#: quota = batch-cpu limit * 100 µs per milli-core, shares = request * 1024 / 1000.
BE_VALUES = {name: (limit * 100, request * 1024 // 1000) for name, (request, limit) in BE_BATCH.items()}


def be_values(pod: Pod) -> dict[str, tuple[int, int]]:
    """(cpu.cfs_quota_us, cpu.shares) of each container of a run_be_pod pod, by name."""
    return {
        name: (read_int("cpu", "cpu.cfs_quota_us", pod.parent, cid), read_int("cpu", "cpu.shares", pod.parent, cid))
        for name, cid in pod.containers.items()
    }


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
