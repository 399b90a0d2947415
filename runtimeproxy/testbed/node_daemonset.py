"""The scenario step that runs the Helm chart's runtime-hooks DaemonSet pod on the node.

The host renders the chart with ``helm template`` (image: the runtime-hooks image built from
the node's own root, `hooks_image`) and puts the manifests in the guest. Here, in the guest:

1. the runtime-hooks systemd unit stops (it deregisters), so the pod's server is the only one;
2. the runtime-hooks image is imported (``ctr images import``, then its tar deleted);
3. the DaemonSet's pod is played through the proxy as kubelet would run it on this node (its
   pod slice first, with kubelet's properties), its policy ConfigMap and emptyDir laid out
   under ``/var/lib/kubelet``;
4. the step waits for the pod's registration file and the proxy's "hook server added";
5. a BE pod is played through the proxy, and its cgroup values are read: the pod's
   runtime-hooks set them;
6. what the pod's container runs with, from ``/proc/<pid>``: capabilities, no_new_privs,
   seccomp, uid, its mounts and the policy file it reads;
7. both pods are deleted (slices stopped) and the unit started again for the later steps.

It reports facts and judges nothing (tests/node/test_daemonset_pod.py asserts).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtimeproxy.testbed.node_scenario import Scenario

__all__ = ["daemonset_step"]

CGROUP = Path("/sys/fs/cgroup")
KUBELET_ROOT = "/var/lib/kubelet"
LOG_ROOT = "/var/log/pods"
_STATUS_FIELDS = ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")


def _play(s: Scenario, manifest: str, node_name: str, *, delete: bool = False) -> dict[str, Any]:
    """``runtime-proxy play`` (or ``--delete``) of a manifest that may hold a DaemonSet and its
    ConfigMaps, in this process (a new Python per pod costs seconds of emulated CPU)."""
    from runtimeproxy.kubelet_model.manifest import load_pod_input
    from runtimeproxy.kubelet_model.pod_plan import NodeFacts, build_plan
    from runtimeproxy.play import runner
    from runtimeproxy.play.cri_client import CriClient

    loaded = load_pod_input(manifest, node_name=node_name)
    plan = build_plan(loaded.pod, log_dir_base=LOG_ROOT, cgroup_driver="systemd", kubelet_root=KUBELET_ROOT,
                      node=NodeFacts(node_name=node_name, config_maps=loaded.config_maps))
    said: list[str] = []
    began = time.monotonic()
    try:
        with CriClient(s.socket, timeout=240) as client:
            if delete:
                done = runner.delete(plan, client, grace_period=5, say=said.append).to_dict()
            else:
                done = runner.play(plan, client, say=said.append).to_dict()
    except runner.PlayError as exc:
        return {"ok": False, "error": exc.to_dict(), "say": said, "s": round(time.monotonic() - began, 2)}
    return {"ok": True, "json": done, "say": said, "derived_from": loaded.derived_from,
            "s": round(time.monotonic() - began, 2)}


def _container_pid(s: Scenario, container_id: str) -> int | None:
    """The container's first process, from the runtime's verbose ContainerStatus."""
    from runtimeproxy.api.runtime.v1 import api_pb2
    from runtimeproxy.play.cri_client import CriClient

    with CriClient(s.socket, timeout=60) as client:
        reply = client.runtime.ContainerStatus(
            api_pb2.ContainerStatusRequest(container_id=container_id, verbose=True), timeout=60)
    pid = json.loads(reply.info.get("info", "{}")).get("pid")
    return int(pid) if pid else None


def _process_facts(pid: int, paths: list[str]) -> dict[str, Any]:
    """Status fields, the mounts at ``paths`` and the root, and the policy the process sees."""
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in _STATUS_FIELDS:
            status[key] = value.strip()
    # The image's /var/run is a symlink to /run: a mount at /var/run/x shows as /run/x.
    wanted = {"/": "/", **{_resolved(path): path for path in paths}}
    mounts = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        point = fields[4]
        if point in wanted:
            mounts[wanted[point]] = {"options": fields[5], "optional": fields[6:separator],
                                     "fstype": fields[separator + 1], "source": fields[separator + 2],
                                     "root": fields[3],
                                     "super_options": fields[separator + 3] if len(fields) > separator + 3 else ""}
    root = Path(f"/proc/{pid}/root")
    policy_dir = root / "etc/runtime-hooks"
    return {"status": status, "mounts": mounts,
            "policy_dir": sorted(os.listdir(policy_dir)) if policy_dir.is_dir() else None,
            "policy_data_link": os.readlink(policy_dir / "..data") if (policy_dir / "..data").is_symlink() else None,
            "policy": _read(policy_dir / "policy.yaml"),
            "root_write": _try_write(root / "rtpx-write-test")}


def _resolved(path: str) -> str:
    return "/run/" + path.removeprefix("/var/run/") if path.startswith("/var/run/") else path


def _try_write(path: Path) -> str:
    """Whether the container's root takes a new file (through /proc/<pid>/root, as root here)."""
    try:
        path.write_text("x")
    except OSError as exc:
        return f"refused: {exc.strerror}"
    path.unlink()
    return "written"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _registered(directory: Path, endpoint: str) -> bool:
    try:
        content = json.loads((directory / "runtime-hooks.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(content, dict) and content.get("remote-endpoint") == endpoint


def _proxy_added(s: Scenario, since: float) -> list[str]:
    since_arg = f"-{int(time.monotonic() - since) + 5}s"
    return [str(e.get("MESSAGE")) for e in s.journal("-u", "runtime-proxy", "--since", since_arg)
            if "hook server added" in str(e.get("MESSAGE"))]


def _container_log(played: dict[str, Any], name: str) -> str | None:
    pod = (played.get("json") or {}).get("pod") or {}
    directory = pod.get("log_directory")
    return None if not directory else _read(Path(directory) / name / "0.log")


def daemonset_step(s: Scenario) -> dict[str, Any]:
    """The step (see the module doc); skipped when the plan has no ``daemonset`` part."""
    spec = s.plan.get("daemonset")
    if spec is None:
        return {"skipped": "the plan has no daemonset part"}
    if spec.get("render_error"):
        raise RuntimeError(f"the host could not render the chart: {spec['render_error']}")
    facts: dict[str, Any] = {"stop_unit": s.run("systemctl", "stop", "runtime-hooks.service", timeout=120),
                             "unit_stopped": s.show("runtime-hooks.service", ("ActiveState",))}
    config_dir = Path(spec["hook_config_dir"])
    facts["registration_after_stop"] = _read(config_dir / "runtime-hooks.json")
    # No --discard-unpacked-layers: containerd 2.x's ctr takes it only with --local.
    facts["import"] = s.run("ctr", "-n", "k8s.io", "images", "import", "--snapshotter", "native",
                            spec["image_tar"], timeout=600)
    Path(spec["image_tar"]).unlink(missing_ok=True)
    pod, be = spec["pod"], spec["be_pod"]
    try:
        facts["pod_slice"] = s.start_slice(pod["slice"], pod["cgroup"], pod["kubelet"])
        began = time.monotonic()
        facts["play"] = played = _play(s, spec["manifest"], spec["node_name"])
        containers = (played.get("json") or {}).get("containers", [])
        facts["registered_after_s"] = s.wait_for(
            lambda: _registered(config_dir, spec["hook_socket"]) and bool(_proxy_added(s, began)),
            spec["register_timeout_s"], interval=2.0)
        facts["registration"] = _read(config_dir / "runtime-hooks.json")
        facts["proxy_added"] = _proxy_added(s, began)
        if containers:
            pid = _container_pid(s, containers[0]["container_id"])
            facts["container"] = {"pid": pid, **(_process_facts(pid, spec["mount_paths"]) if pid else {})}
        facts["be"] = _be_pod(s, be)
        facts["log"] = _container_log(played, spec["container"])
    finally:
        facts["cleanup"] = {
            "delete": _play(s, spec["manifest"], spec["node_name"], delete=True),
            "stop_slice": s.run("systemctl", "stop", pod["slice"], timeout=60),
            "volumes_left": os.path.exists(f"{KUBELET_ROOT}/pods/{pod['uid']}"),
            "start_unit": s.run("systemctl", "start", "runtime-hooks.service", timeout=180),
        }
        facts["cleanup"]["unit_registered_after_s"] = s.wait_for(
            lambda: _registered(config_dir, spec["hook_socket"]), 120)
    return facts


def _be_pod(s: Scenario, be: dict[str, Any]) -> dict[str, Any]:
    """A BE pod played through the proxy while only the DaemonSet pod's server is registered."""
    facts: dict[str, Any] = {"slice": s.start_slice(be["slice"], be["cgroup"], be["kubelet"])}
    facts["play"] = played = s.play(be["manifest"])
    time.sleep(be.get("observe_s", 0))
    pod_dir = CGROUP / be["cgroup"]
    facts["files"] = s.read_files(pod_dir)
    facts["slice_show"] = s.show(be["slice"], ("CPUWeight", "CPUQuotaPerSecUSec", "ActiveState"))
    facts["containers"] = {c["name"]: s.read_files(pod_dir / f"cri-containerd-{c['container_id']}.scope")
                           for c in (played.get("json") or {}).get("containers", [])}
    facts["delete"] = s.play(be["manifest"], delete=True)
    facts["stop_slice"] = s.run("systemctl", "stop", be["slice"], timeout=60)
    return facts
