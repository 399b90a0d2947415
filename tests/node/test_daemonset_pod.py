"""The Helm chart's runtime-hooks DaemonSet pod, as ``helm template`` renders it, run on the node.

The guest (runtimeproxy.testbed.node_daemonset) stops the runtime-hooks unit, plays the
DaemonSet's pod through the proxy from an image of the node's own root, waits for it to
register, plays a BE pod and reads its values, then removes both and starts the unit again.
Expectations come from the rendered chart (daemonset_plan) and the policy it was given.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Evidence, show
from .daemonset_plan import HOOK_SOCKET, NAMESPACE, POLICY, daemonset_documents, daemonset_spec, rendered

pytestmark = [pytest.mark.e2e, pytest.mark.chart_pod]

# Linux capability numbers (include/uapi/linux/capability.h) of the names the chart may add.
CAPABILITY_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "NET_ADMIN": 12, "SYS_ADMIN": 21, "SYS_RESOURCE": 24, "BPF": 39}
# The BE pod's batch-cpu limit (1000m) as its quota; cpu.idle from the policy's BE cpu_idle.
BE_QUOTA = "100000 100000"
BE_SLICE_WEIGHT = "20"


@pytest.fixture(scope="module")
def ds(fact: Evidence) -> dict[str, Any]:
    data: dict[str, Any] = fact("daemonset")
    assert "skipped" not in data, show(data)
    return data


def _container(ds: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = ds.get("container") or {}
    assert container.get("pid"), show({k: ds.get(k) for k in ("play", "import", "registered_after_s", "log")})
    return container


def _security_context() -> dict[str, Any]:
    context: dict[str, Any] = daemonset_spec()["containers"][0]["securityContext"]
    return context


def test_helm_rendered_the_chart() -> None:
    text, error = rendered()
    assert not error and text, error  # a missing helm fails here, never skips
    kinds = sorted(doc["kind"] for doc in daemonset_documents())
    assert kinds == ["ConfigMap", "DaemonSet"]


def test_the_daemonset_pod_runs_from_the_nodes_image(ds: dict[str, Any]) -> None:
    assert ds["import"]["rc"] == 0, show(ds["import"])
    assert ds["play"]["ok"], show(ds["play"])
    assert ds["play"]["derived_from"] == f"DaemonSet {NAMESPACE}/rtpx-runtimeproxy-hooks"
    assert ds["unit_stopped"]["ActiveState"] == "inactive", show(ds["stop_unit"])
    assert ds["registration_after_stop"] is None


def test_it_registers_with_the_proxy(ds: dict[str, Any]) -> None:
    assert ds["registered_after_s"] is not None, show({"registration": ds["registration"], "log": ds.get("log")})
    assert f'"remote-endpoint": "{HOOK_SOCKET}"' in ds["registration"]
    assert ds["proxy_added"], show(ds)


def test_capabilities_are_the_charts(ds: dict[str, Any]) -> None:
    status = _container(ds)["status"]
    caps = _security_context()["capabilities"]
    assert caps["drop"] == ["ALL"]
    expected = sum(1 << CAPABILITY_BITS[name] for name in caps.get("add", []))
    assert int(status["CapEff"], 16) == expected, show(status)
    assert int(status["CapBnd"], 16) == expected and int(status["CapAmb"], 16) == 0, show(status)
    assert status["Uid"].split()[0] == str(_security_context()["runAsUser"])
    assert status["NoNewPrivs"] == "1"  # allowPrivilegeEscalation: false
    assert status["Seccomp"] == "2"  # RuntimeDefault: a filter


def test_root_filesystem_is_read_only(ds: dict[str, Any]) -> None:
    container = _container(ds)
    assert _security_context()["readOnlyRootFilesystem"] is True
    assert container["mounts"]["/"]["options"].split(",")[0] == "ro", show(container["mounts"]["/"])
    assert container["root_write"].startswith("refused"), container["root_write"]


def test_policy_comes_from_the_config_map(ds: dict[str, Any]) -> None:
    import yaml

    container = _container(ds)
    assert yaml.safe_load(container["policy"]) == POLICY
    assert "..data" in container["policy_dir"] and "policy.yaml" in container["policy_dir"]
    assert container["policy_data_link"].startswith("..") and container["policy_data_link"] in container["policy_dir"]


def test_mounts_are_the_charts(ds: dict[str, Any]) -> None:
    mounts = _container(ds)["mounts"]
    spec = daemonset_spec()
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    for mount in spec["containers"][0]["volumeMounts"]:
        point = mounts.get(mount["mountPath"])
        assert point is not None, f"{mount['mountPath']} not mounted: {show(mounts)}"
        volume = volumes[mount["name"]]
        read_only = mount.get("readOnly", False) or "configMap" in volume
        assert point["options"].split(",")[0] == ("ro" if read_only else "rw"), show({**mount, **point})
        if mount.get("mountPropagation") == "HostToContainer":
            assert any(tag.startswith("master:") for tag in point["optional"]), show(point)
        if "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory":
            assert point["fstype"] == "tmpfs" and "size=16384k" in point["super_options"], show(point)
        if mount["mountPath"] == "/host/sys/fs/cgroup":
            assert point["fstype"] == "cgroup2", show(point)


def test_the_be_pod_gets_the_policys_values(ds: dict[str, Any]) -> None:
    be = ds["be"]
    assert be["play"]["ok"], show(be["play"])
    assert be["files"]["cpu.idle"] == "1", show(be["files"])
    assert be["files"]["cpu.max"] == BE_QUOTA, show(be["files"])
    (container,) = be["containers"].values()
    assert container["cpu.max"] == BE_QUOTA, show(container)
    assert be["delete"]["ok"], show(be["delete"])


def test_the_pod_sets_unit_properties_through_systemd(ds: dict[str, Any]) -> None:
    """The chart mounts /run/dbus for the systemd cgroup driver: the pod reaches the system bus and
    sets the BE pod slice's weight as a unit property (its batch-cpu requests, 500m: weight 20)."""
    assert "cannot reach systemd" not in (ds.get("log") or ""), ds.get("log")
    assert ds["be"]["slice_show"]["CPUWeight"] == BE_SLICE_WEIGHT, show(ds["be"]["slice_show"])


def test_everything_is_removed_and_the_unit_is_back(ds: dict[str, Any]) -> None:
    cleanup = ds["cleanup"]
    assert cleanup["delete"]["ok"], show(cleanup["delete"])
    assert cleanup["volumes_left"] is False
    assert cleanup["start_unit"]["rc"] == 0, show(cleanup["start_unit"])
    assert cleanup["unit_registered_after_s"] is not None
