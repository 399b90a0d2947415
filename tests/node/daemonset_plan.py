"""The chart's runtime-hooks DaemonSet for the node scenario (runtimeproxy.testbed.node_daemonset).

The host renders deploy/helm/runtimeproxy with the real ``helm template`` (.ci/helm.sh installs
it): the image is the runtime-hooks image built from the node's root (noderun), the cgroup
driver systemd, proxy mode with the hook socket and registration directory the guest's proxy
uses, host network (the guest has no CNI), and a policy whose BE values show on a BE pod. A
helm that is missing or refuses is no skip: the plan carries the error, the guest step
reports it and the tests fail with it.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml
from runtimeproxy.hooks.cgroups import shares_to_weight

from runtimeproxy.kubelet_model.manifest import parse_input_text
from runtimeproxy.kubelet_model.pod_plan import NodeFacts, PodPlan, build_plan
from runtimeproxy.testbed.hooks_image import HOOKS_IMAGE_REF
from runtimeproxy.testbed.noderun import GUEST_DIR

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "runtimeproxy"
HELM = Path(os.environ.get("RUNTIMEPROXY_HELM_DIR", "/var/cache/runtimeproxy-testbed/helm")) / "bin" / "helm"
RELEASE = "rtpx"
NAMESPACE = "runtimeproxy"
NODE_NAME = "rtpx-node"  # the guest's /etc/hostname (noderun)
MANIFEST = f"{GUEST_DIR}/daemonset/runtime-hooks.yaml"
HOOK_SOCKET = "/var/run/runtimehooks/hooks.sock"
HOOK_CONFIG_DIR = "/etc/runtime/hookserver.d"
# BE pods idle (cpu.idle 1) and their batch-cpu limit as the quota; a short reconcile interval.
POLICY = {"cpu": {"BE": {"cpu_idle": True}}, "reconciler": {"interval_seconds": 5}}
VALUES = {
    "image": {"repository": HOOKS_IMAGE_REF.rsplit(":", 1)[0], "tag": HOOKS_IMAGE_REF.rsplit(":", 1)[1]},
    "mode": "proxy",
    "policy": POLICY,
    "host": {"hookSocket": HOOK_SOCKET, "hookConfigDir": HOOK_CONFIG_DIR,
             "runtimeSocket": "/run/containerd/containerd.sock", "cgroupRoot": "/sys/fs/cgroup"},
    "hooks": {"cgroupDriver": "systemd", "hostNetwork": True, "logFormat": "console"},
}


@functools.cache
def rendered() -> tuple[str, str]:
    """(the manifests ``helm template`` renders, "") or ("", why there are none)."""
    if not os.access(HELM, os.X_OK):
        return "", f"helm is not installed at {HELM}: run .ci/helm.sh"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values:
        yaml.safe_dump(VALUES, values)
        values.flush()
        done = subprocess.run([str(HELM), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", values.name],
                              capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        return "", f"helm template failed: {done.stderr.strip()}"
    return done.stdout, ""


def daemonset_documents() -> list[dict[str, Any]]:
    """The DaemonSet and the ConfigMap of the default group: what the guest plays."""
    text, _ = rendered()
    return [doc for doc in yaml.safe_load_all(text) if doc and doc.get("kind") in ("DaemonSet", "ConfigMap")]


def pod_plan() -> PodPlan:
    """What play makes of the rendered DaemonSet on the guest's node (as the guest computes it)."""
    loaded = parse_input_text(yaml.safe_dump_all(daemonset_documents()), "chart", node_name=NODE_NAME)
    return build_plan(loaded.pod, log_dir_base="/var/log/pods", machine_memory=2 << 30, cgroup_driver="systemd",
                      node=NodeFacts(node_name=NODE_NAME, config_maps=loaded.config_maps))


def daemonset_spec() -> dict[str, Any]:
    """The DaemonSet's pod template (for the tests' expectations)."""
    return next(doc for doc in daemonset_documents() if doc["kind"] == "DaemonSet")["spec"]["template"]["spec"]


def daemonset_plan(be_pod: dict[str, Any], slice_cgroup: Any) -> dict[str, Any]:
    """The plan's ``daemonset`` part; ``be_pod`` is the BE pod's plan entry."""
    _, error = rendered()
    if error:
        return {"render_error": error}
    plan = pod_plan()
    resources = plan.sandbox_config.linux.resources
    slice_name = plan.cgroup_parent.rsplit("/", 1)[1]
    container = daemonset_spec()["containers"][0]
    return {
        "manifest": MANIFEST,
        "image_tar": f"{GUEST_DIR}/hooks-image.tar",
        "node_name": NODE_NAME,
        "hook_socket": HOOK_SOCKET,
        "hook_config_dir": HOOK_CONFIG_DIR,
        "container": container["name"],
        "mount_paths": [mount["mountPath"] for mount in container.get("volumeMounts", [])],
        # The runtime-hooks process in a container, under TCG: imports take tens of seconds.
        "register_timeout_s": 300,
        "pod": {"uid": plan.uid, "slice": slice_name, "cgroup": slice_cgroup(slice_name),
                "kubelet": {"cpu_weight": shares_to_weight(resources.cpu_shares),
                            "memory_max": resources.memory_limit_in_bytes or None}},
        "be_pod": be_pod,
    }


def daemonset_files() -> dict[str, str]:
    """The rendered DaemonSet and ConfigMap, by their path in the guest (none if helm failed)."""
    return {} if rendered()[1] else {MANIFEST: yaml.safe_dump_all(daemonset_documents())}
