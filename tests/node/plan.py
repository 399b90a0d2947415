"""What the node scenario plays, and what the host expects of it.

The pods cover every QoS class: Koordinator's LSR (pinned by a cpuset), LS and BE (with
batch-cpu), and plain Kubernetes Guaranteed, Burstable and BestEffort pods, which
runtime-hooks maps to LSR, LS and BE. Each pod's slice is created first with the
properties kubelet gives it (kubelet is the host here: `kubelet_slice` computes them with
the same helpers `runtime-proxy play` uses).

The guest policy switches on what the defaults leave off, so that every file the checks
read is actually written: memory protection for LS, cpu.idle for BE, the network plugin on
a dummy link, and a short reconcile interval.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml
from runtimeproxy.hooks.cgroups import WeightConversion, expand_slice, shares_to_weight

from runtimeproxy.kubelet_model.cri_resources import milli_cpu_to_quota, milli_cpu_to_shares
from runtimeproxy.kubelet_model.kube_qos import KubeQoSClass
from runtimeproxy.kubelet_model.pod_plan import pod_cgroup_parent
from runtimeproxy.testbed.nodeflavour import TRIXIE_17, NodeFlavour
from runtimeproxy.testbed.noderun import GUEST_DIR

from .daemonset_plan import daemonset_files, daemonset_plan

RECONCILE_INTERVAL_S = 5
NETWORK_INTERFACE = "rtpx0"
PROXY_SOCKET = "/var/run/runtimeproxy/runtimeproxy.sock"
MIB = 1024 * 1024

POLICY = f"""
cpu:
  LS: {{cfs_burst_percent: 1000}}
  BE: {{cpu_idle: true}}
memory:
  LS: {{min_percent: 50, low_percent: 100, throttling_percent: 80}}
network:
  interface: {NETWORK_INTERFACE}
  link_speed_mbit: 1000
reconciler:
  interval_seconds: {RECONCILE_INTERVAL_S}
"""

RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
EXTENDED_SPEC = "node.koordinator.sh/extended-resource-spec"
QOS_LABEL = "koordinator.sh/qosClass"


@dataclass(frozen=True)
class Pod:
    """One pod of the scenario: its manifest inputs and its Kubernetes QoS class."""

    name: str
    uid: str
    qos: KubeQoSClass
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    # Seconds the scenario keeps sampling the pod slice's cpu.max after the pod started.
    observe_s: float = 0

    @property
    def manifest_path(self) -> str:
        return f"{GUEST_DIR}/pods/{self.name}.yaml"

    @property
    def cgroup_parent(self) -> str:
        return pod_cgroup_parent(self.qos, self.uid, "systemd")

    @property
    def slice(self) -> str:
        return self.cgroup_parent.rsplit("/", 1)[1]

    def manifest(self) -> str:
        resources: dict[str, Any] = {}
        if self.requests:
            resources["requests"] = self.requests
        if self.limits:
            resources["limits"] = self.limits
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"node-{self.name}", "namespace": "node-tier", "uid": self.uid,
                         "labels": self.labels, "annotations": self.annotations},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "localhost/runtimeproxy-testbed/busybox:1",
                                     "resources": resources}]},
        }
        return yaml.safe_dump(pod, sort_keys=False)


def _milli(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(quantity) * 1000


def _bytes(quantity: str) -> int:
    return int(quantity[:-2]) * MIB if quantity.endswith("Mi") else int(quantity)


def kubelet_shares(pod: Pod) -> int:
    """The cpu shares kubelet gives the pod and its one container: from the cpu request (the
    limit when only that is given), BestEffort 2."""
    return milli_cpu_to_shares(_milli(pod.requests.get("cpu", pod.limits.get("cpu", "0"))))


def conversion_of(flavour: NodeFlavour) -> WeightConversion:
    """The shares->weight conversion of the flavour's runc (kubelet's cgroup manager is runc's
    library: its slices follow the same one)."""
    return WeightConversion(flavour.weight_conversion)


def kubelet_slice(pod: Pod, conversion: WeightConversion = WeightConversion.LINEAR) -> dict[str, int | None]:
    """The pod slice kubelet makes (pkg/kubelet/cm ResourceConfigForPod with one container):
    cpu.weight from the cpu request (BestEffort: shares 2), a quota only with a cpu limit,
    MemoryMax only with a memory limit. Weight is the node runc's shares->weight `conversion`."""
    quota = milli_cpu_to_quota(_milli(pod.limits["cpu"])) if "cpu" in pod.limits else None
    return {
        "cpu_weight": shares_to_weight(kubelet_shares(pod), conversion),
        "cpu_quota_us": quota,
        # systemd takes the quota per second (runc: quota * 1e6 / period, rounded up to 10 ms).
        "cpu_quota_per_sec_us": None if quota is None else -(-quota * 10 // 10000) * 10000,
        "cpu_period_us": 100000,
        "memory_max": _bytes(pod.limits["memory"]) if "memory" in pod.limits else None,
    }


def _extended(requests: dict[str, str], limits: dict[str, str]) -> str:
    return json.dumps({"containers": {"main": {"requests": requests, "limits": limits}}})


PODS = (
    Pod("lsr", "00000000-0000-4000-8000-00000000a001", KubeQoSClass.GUARANTEED,
        requests={"cpu": "1", "memory": "64Mi"}, limits={"cpu": "1", "memory": "64Mi"},
        labels={QOS_LABEL: "LSR"}, annotations={RESOURCE_STATUS: json.dumps({"cpuset": "1"})}),
    Pod("ls", "00000000-0000-4000-8000-00000000a002", KubeQoSClass.BURSTABLE,
        requests={"cpu": "200m", "memory": "64Mi"}, limits={"cpu": "500m", "memory": "128Mi"},
        labels={QOS_LABEL: "LS"},
        annotations={EXTENDED_SPEC: _extended({"memory": "64Mi"}, {"memory": "128Mi"})},
        observe_s=6),
    Pod("be", "00000000-0000-4000-8000-00000000a003", KubeQoSClass.BEST_EFFORT,
        labels={QOS_LABEL: "BE"},
        annotations={EXTENDED_SPEC: _extended({"kubernetes.io/batch-cpu": "500"},
                                              {"kubernetes.io/batch-cpu": "1000"})},
        observe_s=12),
    Pod("guaranteed", "00000000-0000-4000-8000-00000000a004", KubeQoSClass.GUARANTEED,
        requests={"cpu": "500m", "memory": "64Mi"}, limits={"cpu": "500m", "memory": "64Mi"}),
    Pod("burstable", "00000000-0000-4000-8000-00000000a005", KubeQoSClass.BURSTABLE,
        requests={"cpu": "100m", "memory": "32Mi"}, limits={"memory": "64Mi"}),
    Pod("besteffort", "00000000-0000-4000-8000-00000000a006", KubeQoSClass.BEST_EFFORT),
)
RESTART_POD = Pod("restart", "00000000-0000-4000-8000-00000000a007", KubeQoSClass.BURSTABLE,
                  requests={"cpu": "100m"}, limits={"cpu": "200m"}, labels={QOS_LABEL: "LS"})
# Played while only the chart's runtime-hooks pod serves the hooks (daemonset_plan).
DAEMONSET_BE_POD = Pod("ds-be", "00000000-0000-4000-8000-00000000a008", KubeQoSClass.BEST_EFFORT,
                       labels={QOS_LABEL: "BE"},
                       annotations={EXTENDED_SPEC: _extended({"kubernetes.io/batch-cpu": "500"},
                                                             {"kubernetes.io/batch-cpu": "1000"})},
                       observe_s=8)
# A BE sibling deleted (through the proxy) and its slice stopped, as kubelet does,
# while the other pods' slice files are sampled, and for 5 s after.
SIBLING_REMOVAL = {"pod": "besteffort", "watch": ["be", "ls"], "observe_s": 5}
DRIFT = {"pod": "ls", "file": "cpu.max.burst", "value": "0", "timeout_s": 4 * RECONCILE_INTERVAL_S}


def qos_slices(conversion: WeightConversion) -> dict[str, dict[str, int]]:
    """kubelet's QoS-level slices (kubepods.slice's weight stands for the node's allocatable CPU)."""
    return {
        "kubepods.slice": {"cpu_weight": shares_to_weight(milli_cpu_to_shares(2000), conversion)},
        "kubepods-burstable.slice": {"cpu_weight": 1},
        "kubepods-besteffort.slice": {"cpu_weight": 1},
    }


def slice_cgroup(name: str) -> str:
    """Where systemd puts a slice, relative to the cgroup root: a-b.slice is a.slice/a-b.slice."""
    return "/".join(expand_slice(name))


def _pod_plan(pod: Pod, conversion: WeightConversion = WeightConversion.LINEAR) -> dict[str, Any]:
    return {"name": pod.name, "manifest": pod.manifest_path, "slice": pod.slice, "cgroup": slice_cgroup(pod.slice),
            "kubelet": kubelet_slice(pod, conversion), "observe_s": pod.observe_s}


def scenario_plan(flavour: NodeFlavour = TRIXIE_17) -> dict[str, Any]:
    """The plan the guest runs (`runtimeproxy.testbed.node_scenario`) on a node of `flavour`."""
    conversion = conversion_of(flavour)
    return {
        "proxy_socket": PROXY_SOCKET,
        "images_tar": f"{GUEST_DIR}/images.tar",
        "network_interface": NETWORK_INTERFACE,
        "policy": POLICY,
        "hooks_env": {"RUNTIME_HOOKS_CGROUP_DRIVER": "systemd",
                      "RUNTIME_HOOKS_POLICY": "/etc/runtime-hooks/policy.yaml",
                      "RUNTIME_HOOKS_RUNTIME_ENDPOINT": "unix:///run/containerd/containerd.sock",
                      "RUNTIME_HOOKS_CPU_WEIGHT_CONVERSION": conversion.value},
        "proxy_env": {},
        "qos_slices": {name: {"cgroup": slice_cgroup(name), "kubelet": props}
                       for name, props in qos_slices(conversion).items()},
        "pods": [_pod_plan(pod, conversion) for pod in PODS],
        "restart_pod": _pod_plan(RESTART_POD, conversion),
        "drift": DRIFT,
        "sibling_removal": SIBLING_REMOVAL,
        "reconcile_interval_s": RECONCILE_INTERVAL_S,
        # WatchdogSec=30s of the shipped unit, then the abort and restart.
        "watchdog_timeout_s": 120,
    } | ({"daemonset": daemonset_plan(_pod_plan(DAEMONSET_BE_POD, conversion), slice_cgroup)}
         if flavour.plays_chart else {})


def guest_files() -> dict[str, str]:
    """The pod manifests, by their path in the guest."""
    return {pod.manifest_path: pod.manifest() for pod in (*PODS, RESTART_POD, DAEMONSET_BE_POD)} | daemonset_files()
