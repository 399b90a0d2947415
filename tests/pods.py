"""Pods the end-to-end tests run on the real test bed, and what is read back from their REAL
cgroup v1 files: the record of a pod run (`Pod`), a container to create (`ContainerSpec`), the
Koordinator label and annotation they carry, and kubelet's part (the pod cgroup it makes first).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runtimeproxy.api.runtime.v1 import api_pb2 as pb

CGROUP = Path("/sys/fs/cgroup")
CALL_TIMEOUT = 60.0

QOS_LABEL = "koordinator.sh/qosClass"
SPEC_ANNOTATION = "node.koordinator.sh/extended-resource-spec"
BATCH_CPU = "kubernetes.io/batch-cpu"
MiB = 1 << 20


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
