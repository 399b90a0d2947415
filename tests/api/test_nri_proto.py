"""Our NRI and ttrpc protos (api/nri/) against the numbers of NRI v0.6.1 to v0.8.0 and ttrpc v1.2.4.

The tables are the wire contract as those versions define it (containerd/nri pkg/api/api.proto at
v0.6.1, Debian trixie's golang-github-containerd-nri-dev 0.6.1-2, and the fields v0.7.0 and
v0.8.0 added, the version containerd v2.1.9's go.mod requires; containerd/ttrpc request.proto
at v1.2.4 with google.rpc.Status): a renamed or renumbered field here breaks the runtime's reading.
"""

from __future__ import annotations

from typing import Any

import pytest

from runtimeproxy.api.nri.ttrpc import ttrpc_pb2 as ttrpc
from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri


def fields(message: Any) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}


NRI_FIELDS: dict[str, dict[str, int]] = {
    "RegisterPluginRequest": {"plugin_name": 1, "plugin_idx": 2},
    "ConfigureRequest": {
        "config": 1, "runtime_name": 2, "runtime_version": 3, "registration_timeout": 4, "request_timeout": 5,
    },
    "ConfigureResponse": {"events": 2},
    "SynchronizeRequest": {"pods": 1, "containers": 2, "more": 3},
    "SynchronizeResponse": {"update": 1, "more": 2},
    "UpdateContainersRequest": {"update": 1, "evict": 2},
    "UpdateContainersResponse": {"failed": 1},
    "CreateContainerRequest": {"pod": 1, "container": 2},
    "CreateContainerResponse": {"adjust": 1, "update": 2, "evict": 3},
    "UpdateContainerRequest": {"pod": 1, "container": 2, "linux_resources": 3},
    "UpdateContainerResponse": {"update": 1, "evict": 2},
    "StopContainerRequest": {"pod": 1, "container": 2},
    "StopContainerResponse": {"update": 1},
    "StateChangeEvent": {"event": 1, "pod": 2, "container": 3},
    "PodSandbox": {
        "id": 1, "name": 2, "uid": 3, "namespace": 4, "labels": 5, "annotations": 6,
        "runtime_handler": 7, "linux": 8, "pid": 9, "ips": 10,
    },
    "LinuxPodSandbox": {
        "pod_overhead": 1, "pod_resources": 2, "cgroup_parent": 3, "cgroups_path": 4, "namespaces": 5,
        "resources": 6,
    },
    "Container": {
        "id": 1, "pod_sandbox_id": 2, "name": 3, "state": 4, "labels": 5, "annotations": 6, "args": 7,
        "env": 8, "mounts": 9, "hooks": 10, "linux": 11, "pid": 12, "rlimits": 13,
    },
    "LinuxContainer": {"namespaces": 1, "devices": 2, "resources": 3, "oom_score_adj": 4, "cgroups_path": 5},
    "LinuxResources": {
        "memory": 1, "cpu": 2, "hugepage_limits": 3, "blockio_class": 4, "rdt_class": 5, "unified": 6,
        "devices": 7, "pids": 8,
    },
    "LinuxPids": {"limit": 1},
    "LinuxMemory": {
        "limit": 1, "reservation": 2, "swap": 3, "kernel": 4, "kernel_tcp": 5, "swappiness": 6,
        "disable_oom_killer": 7, "use_hierarchy": 8,
    },
    "LinuxCPU": {"shares": 1, "quota": 2, "period": 3, "realtime_runtime": 4, "realtime_period": 5, "cpus": 6,
                 "mems": 7},
    "HugepageLimit": {"page_size": 1, "limit": 2},
    "ContainerAdjustment": {
        "annotations": 2, "mounts": 3, "env": 4, "hooks": 5, "linux": 6, "rlimits": 7, "CDI_devices": 8,
    },
    "CDIDevice": {"name": 1},
    "LinuxContainerAdjustment": {"devices": 1, "resources": 2, "cgroups_path": 3, "oom_score_adj": 4},
    "ContainerUpdate": {"container_id": 1, "linux": 2, "ignore_failure": 3},
    "LinuxContainerUpdate": {"resources": 1},
    "ContainerEviction": {"container_id": 1, "reason": 2},
    "KeyValue": {"key": 1, "value": 2},
    "OptionalInt64": {"value": 1},
    "OptionalUInt64": {"value": 1},
    "OptionalInt": {"value": 1},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(NRI_FIELDS))
def test_nri_message_fields_are_those_of_nri_up_to_v0_8_0(name: str) -> None:
    assert fields(getattr(nri, name)) == NRI_FIELDS[name]


def test_nri_package_services_and_events() -> None:
    assert nri.DESCRIPTOR.package == "nri.pkg.api.v1alpha1"
    services = {s.name: [m.name for m in s.methods] for s in nri.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "Runtime": ["RegisterPlugin", "UpdateContainers"],
        "Plugin": [
            "Configure", "Synchronize", "Shutdown", "CreateContainer", "UpdateContainer", "StopContainer",
            "StateChange",
        ],
    }  # fmt: skip
    events = {v.name: v.number for v in nri.Event.DESCRIPTOR.values}
    assert events == {
        "UNKNOWN": 0, "RUN_POD_SANDBOX": 1, "STOP_POD_SANDBOX": 2, "REMOVE_POD_SANDBOX": 3, "CREATE_CONTAINER": 4,
        "POST_CREATE_CONTAINER": 5, "START_CONTAINER": 6, "POST_START_CONTAINER": 7, "UPDATE_CONTAINER": 8,
        "POST_UPDATE_CONTAINER": 9, "STOP_CONTAINER": 10, "REMOVE_CONTAINER": 11, "LAST": 12,
    }  # fmt: skip


def test_ttrpc_envelope_fields_are_v1_2_4s() -> None:
    assert fields(ttrpc.Request) == {"service": 1, "method": 2, "payload": 3, "timeout_nano": 4, "metadata": 5}
    assert fields(ttrpc.Response) == {"status": 1, "payload": 2}
    assert fields(ttrpc.Status) == {"code": 1, "message": 2}  # google.rpc.Status's numbers
