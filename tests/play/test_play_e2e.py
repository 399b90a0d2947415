"""``runtime-proxy play`` of a DaemonSet against a real containerd: the container really runs with
the capabilities, read-only root, configMap files and memory-backed emptyDir its spec asks for."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.kubelet_model.manifest import parse_input_text
from runtimeproxy.kubelet_model.pod_plan import NodeFacts, build_plan
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.play.runner import delete, play
from runtimeproxy.testbed import Containerd

pytestmark = [pytest.mark.e2e, pytest.mark.containerd_series("1.7")]

# CAP_CHOWN 0, CAP_NET_ADMIN 12 (include/uapi/linux/capability.h)
ADDED = (1 << 0) | (1 << 12)


def _input(image: str, host_dir: Path) -> str:
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "play-e2e"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "hostNetwork": True,
                    "terminationGracePeriodSeconds": 0,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "agent",
                        "image": image,
                        "securityContext": {
                            "runAsUser": 0,
                            "privileged": False,
                            "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "NET_ADMIN"]},
                        },
                        "volumeMounts": [
                            {"name": "config", "mountPath": "/etc/agent"},
                            {"name": "tmp", "mountPath": "/tmp"},
                            {"name": "state", "mountPath": "/var/state"},
                        ],
                    }],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "agent-config"}},
                        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}},
                        {"name": "state", "hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"}},
                    ],
                },
            },
        },
    }
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "agent-config", "namespace": "play-e2e"},
                  "data": {"policy.yaml": "cpu: {}\n"}}
    return yaml.safe_dump_all([daemonset, config_map])


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def _mounts(pid: int) -> dict[str, list[str]]:
    """Mount point -> [options, fstype, super options]."""
    found = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        found[fields[4]] = [fields[5], fields[separator + 1], fields[separator + 3]]
    return found


def test_played_daemonset_pod_runs_as_its_spec_says(containerd: Containerd, tmp_path: Path) -> None:
    host_dir = tmp_path / "host" / "state"
    loaded = parse_input_text(_input(containerd.test_image, host_dir), "agent.yaml", node_name="e2e-node")
    kubelet_root = tmp_path / "kubelet"
    plan = build_plan(loaded.pod, log_dir_base=str(tmp_path / "logs"), machine_memory=8 << 30,
                      cgroup_root="/" + containerd.cgroup_prefix, kubelet_root=str(kubelet_root),
                      node=NodeFacts(node_name="e2e-node", config_maps=loaded.config_maps))
    with CriClient(containerd.address, timeout=60.0) as client:
        started = play(plan, client)
        try:
            [container] = started.containers
            reply = client.runtime.ContainerStatus(
                cri.ContainerStatusRequest(container_id=container.container_id, verbose=True), timeout=30)
            pid = json.loads(reply.info["info"])["pid"]
            status = _status(pid)
            assert int(status["CapEff"], 16) == ADDED and int(status["CapBnd"], 16) == ADDED, status
            assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
            mounts = _mounts(pid)
            assert mounts["/"][0].split(",")[0] == "ro", mounts["/"]
            with pytest.raises(OSError) as refused:
                (Path(f"/proc/{pid}/root") / "new-file").write_text("x")
            assert refused.value.errno == 30  # EROFS
            assert mounts["/etc/agent"][0].split(",")[0] == "ro"
            config = Path(f"/proc/{pid}/root/etc/agent")
            assert (config / "policy.yaml").read_text() == "cpu: {}\n"
            assert os.readlink(config / "policy.yaml") == "..data/policy.yaml"
            assert mounts["/tmp"][1] == "tmpfs" and "size=8192k" in mounts["/tmp"][2], mounts["/tmp"]
            assert host_dir.is_dir() and "/var/state" in mounts
        finally:
            delete(plan, client, grace_period=0)
    assert not (kubelet_root / "pods" / plan.uid).exists()
    assert not any(str(kubelet_root) in line for line in Path("/proc/self/mountinfo").read_text().splitlines())
