"""The CPU, memory and OOM values kubelet puts in a container's and a pod's CRI
``LinuxContainerResources``.

* CPU shares / CFS quota: ``pkg/kubelet/cm/helpers_linux.go`` (MilliCPUToShares,
  MilliCPUToQuota) and ``pkg/kubelet/kuberuntime/kuberuntime_container_linux.go``
  (calculateLinuxResources).
* oom_score_adj: ``pkg/kubelet/qos/policy.go`` (GetContainerOOMScoreAdjust).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, replace
from decimal import Decimal
from typing import Any

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.kubelet_model.kube_qos import KubeQoSClass, pod_qos_class
from runtimeproxy.kubelet_model.pod_resources import (
    aggregate,
    container_requests,
    int_value,
    is_sidecar,
    milli_value,
    parse_resource_list,
    pod_containers,
    pod_init_containers,
    pod_level_requirements,
    pod_limits,
    pod_requests,
)

__all__ = [
    "BESTEFFORT_OOM_SCORE_ADJ",
    "GUARANTEED_OOM_SCORE_ADJ",
    "MAX_SHARES",
    "MIN_QUOTA",
    "MIN_SHARES",
    "QUOTA_PERIOD",
    "LinuxResources",
    "container_oom_score_adj",
    "container_resources",
    "linux_resources",
    "milli_cpu_to_quota",
    "milli_cpu_to_shares",
    "oom_score_adj_for_request",
    "read_machine_memory",
    "sandbox_overhead",
    "sandbox_resources",
]

# helpers_linux.go: shares are clamped to the kernel's [MinShares, MaxShares];
# the CFS quota is at least 1ms of the 100ms default period.
MIN_SHARES = 2
MAX_SHARES = 262144
SHARES_PER_CPU = 1024
MILLI_CPU_TO_CPU = 1000
QUOTA_PERIOD = 100000
MIN_QUOTA = 1000

# policy.go
GUARANTEED_OOM_SCORE_ADJ = -997
BESTEFFORT_OOM_SCORE_ADJ = 1000

_INT64_MAX = 2**63 - 1


def milli_cpu_to_shares(milli_cpu: int) -> int:
    """CFS shares for a cpu request: milliCPU*1024/1000 clamped to [2, 262144]; 0 -> 2."""
    if milli_cpu <= 0:
        return MIN_SHARES
    shares = (milli_cpu * SHARES_PER_CPU) // MILLI_CPU_TO_CPU
    return max(MIN_SHARES, min(MAX_SHARES, shares))


def milli_cpu_to_quota(milli_cpu: int, period: int = QUOTA_PERIOD) -> int:
    """CFS quota for a cpu limit: milliCPU*period/1000, at least 1000; 0 (unset) without a limit."""
    if milli_cpu <= 0:
        return 0
    quota = (milli_cpu * period) // MILLI_CPU_TO_CPU
    return min(max(quota, MIN_QUOTA), _INT64_MAX)


@dataclass(frozen=True)
class LinuxResources:
    """The resource fields kubelet fills in ``LinuxContainerResources`` (named as there)."""

    cpu_period: int
    cpu_quota: int
    cpu_shares: int
    memory_limit_in_bytes: int
    oom_score_adj: int = 0

    def to_proto(self) -> cri.LinuxContainerResources:
        return cri.LinuxContainerResources(**asdict(self))

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


def linux_resources(
    cpu_request: Decimal | None,
    cpu_limit: Decimal | None,
    memory_limit: Decimal | None,
    *,
    cpu_cfs_quota: bool = True,
    period: int = QUOTA_PERIOD,
) -> LinuxResources:
    """calculateLinuxResources: shares from the request (or the limit when
    no request was given), quota from the limit, memory limit in bytes."""
    if cpu_request is None and cpu_limit:
        shares = milli_cpu_to_shares(milli_value(cpu_limit))
    else:
        shares = milli_cpu_to_shares(milli_value(cpu_request))
    return LinuxResources(
        cpu_period=period if cpu_cfs_quota else 0,
        cpu_quota=milli_cpu_to_quota(milli_value(cpu_limit), period) if cpu_cfs_quota else 0,
        cpu_shares=shares,
        memory_limit_in_bytes=int_value(memory_limit),
    )


def oom_score_adj_for_request(memory_request: int, machine_memory: int) -> int:
    """The Burstable formula: 1000 - 1000*request/capacity, kept in [3, 999].

    1000 + GUARANTEED_OOM_SCORE_ADJ = 3 is the floor so that a Burstable
    container always scores above a Guaranteed one; 999 keeps it below
    BestEffort.
    """
    if machine_memory <= 0:
        raise ValueError("machine memory must be positive")
    adj = 1000 - (1000 * memory_request) // machine_memory
    return _clamp_burstable(adj)


def _clamp_burstable(adj: int) -> int:
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ:
        return 1000 + GUARANTEED_OOM_SCORE_ADJ
    if adj >= BESTEFFORT_OOM_SCORE_ADJ:
        return BESTEFFORT_OOM_SCORE_ADJ - 1
    return adj


def _is_node_critical(pod: Any) -> bool:
    # types.IsNodeCriticalPod: a critical pod whose priority class is
    # system-node-critical.  A pod run by play is a static pod, and static
    # pods are critical, so the class name alone decides here.
    return bool(pod.spec.priority_class_name == "system-node-critical")


def _remaining_pod_memory_per_container(pod: Any) -> int:
    level = pod_level_requirements(pod)
    if level is None or not level[0].get("memory"):
        return 0
    count = len(pod_containers(pod)) + len(pod_init_containers(pod))
    remaining = int_value(level[0]["memory"]) - int_value(aggregate(pod, container_requests).get("memory"))
    return _go_div(remaining, count)


def _go_div(a: int, b: int) -> int:
    """Integer division truncating toward zero, as Go does."""
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient


def container_oom_score_adj(pod: Any, container: Any, machine_memory: int, qos: KubeQoSClass | None = None) -> int:
    """GetContainerOOMScoreAdjust: -997 Guaranteed (and node-critical pods),
    1000 BestEffort, else the Burstable formula on the container's memory
    request (plus its share of unallocated pod-level memory request); a
    sidecar never scores above the regular container with the smallest
    memory request."""
    if _is_node_critical(pod):
        return GUARANTEED_OOM_SCORE_ADJ
    qos = qos or pod_qos_class(pod)
    if qos is KubeQoSClass.GUARANTEED:
        return GUARANTEED_OOM_SCORE_ADJ
    if qos is KubeQoSClass.BEST_EFFORT:
        return BESTEFFORT_OOM_SCORE_ADJ
    if machine_memory <= 0:
        raise ValueError("machine memory must be positive")
    remaining = _remaining_pod_memory_per_container(pod)
    request = int_value(container_requests(container).get("memory")) + remaining
    adj = 1000 - _go_div(1000 * request, machine_memory)
    sidecar = is_sidecar(container) and any(init.name == container.name for init in pod_init_containers(pod))
    if sidecar:
        regular = [int_value(container_requests(c).get("memory")) for c in pod_containers(pod)]
        smallest = (min(regular) if regular else 0) + remaining
        adj = min(adj, 1000 - _go_div(1000 * smallest, machine_memory))
    return _clamp_burstable(adj)


def container_resources(
    pod: Any,
    container: Any,
    machine_memory: int,
    *,
    qos: KubeQoSClass | None = None,
    cpu_cfs_quota: bool = True,
) -> LinuxResources:
    """generateLinuxContainerResources: cpu/memory from the container's own
    requests and limits (a request left out falls back to the limit) and
    oom_score_adj from the pod's QoS."""
    raw = container.resources
    requests = parse_resource_list(raw.requests if raw is not None else None)
    limits = parse_resource_list(raw.limits if raw is not None else None)
    base = linux_resources(requests.get("cpu"), limits.get("cpu"), limits.get("memory"), cpu_cfs_quota=cpu_cfs_quota)
    return replace(base, oom_score_adj=container_oom_score_adj(pod, container, machine_memory, qos))


def sandbox_resources(pod: Any, *, cpu_cfs_quota: bool = True) -> LinuxResources:
    """calculateSandboxResources: the pod-level sums (overhead excluded)."""
    requests = pod_requests(pod)
    limits = pod_limits(pod)
    return linux_resources(requests.get("cpu"), limits.get("cpu"), limits.get("memory"), cpu_cfs_quota=cpu_cfs_quota)


def sandbox_overhead(pod: Any, *, cpu_cfs_quota: bool = True) -> LinuxResources:
    """convertOverheadToLinuxResources: spec.overhead taken as request == limit."""
    overhead = parse_resource_list(pod.spec.overhead)
    if not overhead:
        return LinuxResources(0, 0, 0, 0)
    cpu = overhead.get("cpu", Decimal(0))
    return linux_resources(cpu, cpu, overhead.get("memory"), cpu_cfs_quota=cpu_cfs_quota)


def read_machine_memory(meminfo_path: str = "/proc/meminfo") -> int:
    """MemTotal from /proc/meminfo in bytes (what cAdvisor reports as capacity)."""
    with open(meminfo_path, encoding="ascii") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key.strip() == "MemTotal":
                fields = rest.split()
                amount = int(fields[0])
                unit = fields[1].lower() if len(fields) > 1 else ""
                return amount * 1024 if unit == "kb" else amount
    raise ValueError(f"{meminfo_path}: no MemTotal line")
