"""The Helm chart deploy/helm/runtimeproxy, rendered by the real helm (.ci/helm.sh installs it) over
a matrix of values: it lints, every manifest is valid for Kubernetes 1.30-1.35 (kubernetes-validate,
strict), its custom resources are valid prometheus-operator objects, the schema refuses bad values
naming the field, every policy it renders passes `runtime-hooks policy check`, and the pods get
the mounts, privileges and labels runtime-hooks needs and no more."""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from helm_chart import ALERTS, CHART, RELEASE, Doc, of_kind, pod_spec, render, run_helm
from runtimeproxy.hooks.cli import cli as hooks_cli

from runtimeproxy.proxy.cli import cli as proxy_cli

KUBERNETES_VERSIONS = ("1.30", "1.31", "1.32", "1.33", "1.34", "1.35")
CUSTOM_KINDS = ("PodMonitor", "PrometheusRule")
NETWORK_POLICY = {"network": {"interface": "eth0", "link_speed_mbit": 1000}}
GROUPS = [
    {
        "name": "canary",
        "nodeSelector": {"matchLabels": {"runtimeproxy.io/canary": "true"}},
        "policy": {"reconciler": {"interval_seconds": 5}, **NETWORK_POLICY},
    },
    {
        "name": "batch",
        "nodeSelector": {"matchExpressions": [{"key": "node-role", "operator": "In", "values": ["batch", "mixed"]}]},
        "policy": {"memory": {"BE": {"v1_soft_limit": "zero"}}},
    },
]
MONITORING = {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}

SCENARIOS: dict[str, dict[str, Any]] = {
    "proxy": {},
    "nri": {"mode": "nri"},
    "groups": {"groups": GROUPS, "policy": {"reconciler": {"interval_seconds": 20}}},
    "network": {"policy": NETWORK_POLICY},
    "network-plugin-disabled": {"policy": NETWORK_POLICY, "hooks": {"disable": ["network"]}},
    "host-network-value": {"hooks": {"hostNetwork": True}},
    "monitoring": {"monitoring": MONITORING},
    "installer": {"installer": {"enabled": True, "bundle": "/opt/runtimeproxy-bundle.tar.gz"}},
    "uninstall": {"installer": {"enabled": True, "action": "uninstall", "extraArgs": ["--dry-run"]}},
    "systemd-resctrl": {
        "hooks": {
            "cgroupDriver": "systemd",
            "resctrl": True,
            "cgroupParentRoots": ["/kubelet/kubepods", "kubelet-kubepods.slice"],
            "enable": ["cpu", "memory", "resctrl"],
            "extraCapabilities": ["NET_BIND_SERVICE"],
        }
    },
    "nri-groups-monitoring": {"mode": "nri", "groups": GROUPS, "policy": NETWORK_POLICY, "monitoring": MONITORING},
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {name: render(values) for name, values in SCENARIOS.items()}


def hooks_daemonsets(docs: list[Doc]) -> dict[str, Doc]:
    """The runtime-hooks DaemonSets by group name ("default" for the default one)."""
    return {
        ds["metadata"]["labels"]["runtimeproxy.io/group"]: ds
        for ds in of_kind(docs, "DaemonSet")
        if ds["metadata"]["labels"]["app.kubernetes.io/component"] == "runtime-hooks"
    }


def container(daemonset: Doc, name: str = "runtime-hooks") -> Doc:
    return next(c for c in pod_spec(daemonset)["containers"] if c["name"] == name)


def env(daemonset: Doc) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(daemonset)["env"]}


def mounts(daemonset: Doc) -> dict[str, Doc]:
    """Each volume mount with its volume: {mountPath: {**mount, "volume": volume}}."""
    volumes = {v["name"]: v for v in pod_spec(daemonset)["volumes"]}
    return {m["mountPath"]: {**m, "volume": volumes[m["name"]]} for m in container(daemonset)["volumeMounts"]}


def added_capabilities(daemonset: Doc, name: str = "runtime-hooks") -> set[str]:
    return set(container(daemonset, name)["securityContext"]["capabilities"].get("add", []))


# --- helm itself ------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_chart_lints(scenario: str) -> None:
    done = run_helm("lint", "--strict", str(CHART), values=SCENARIOS[scenario])
    assert done.returncode == 0, done.stdout + done.stderr


def test_manifests_are_valid_for_every_supported_kubernetes(rendered: dict[str, list[Doc]]) -> None:
    """kubernetes-validate's strict schemas also refuse fields Kubernetes does not know."""
    unique = {json.dumps(doc, sort_keys=True): doc for docs in rendered.values() for doc in docs}
    core = [doc for doc in unique.values() if doc["kind"] not in CUSTOM_KINDS]
    assert {doc["kind"] for doc in core} == {"ConfigMap", "DaemonSet"}
    for version in KUBERNETES_VERSIONS:
        for doc in core:
            checked = kubernetes_validate.validate(doc, version, strict=True)
            assert checked == version, f"kubernetes-validate has no {version} schema (used {checked})"


def test_strict_validation_refuses_an_unknown_field(rendered: dict[str, list[Doc]]) -> None:
    daemonset = json.loads(json.dumps(of_kind(rendered["proxy"], "DaemonSet")[0]))
    pod_spec(daemonset)["hostPid"] = True  # a typo of hostPID
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSIONS[-1], strict=True)


def custom_resource_problems(doc: Doc) -> str | None:
    """Why ``doc`` is no valid prometheus-operator object, or None. The models (PyPI
    cloudcoil-models-prometheus-operator) are generated from the operator's CRDs and check
    types, enums and patterns; they ignore unknown fields, so a field lost in their round trip is
    one the CRD does not define."""
    from cloudcoil.models.prometheus_operator import v1  # 3 s to import: only here
    from pydantic import ValidationError

    try:
        model = getattr(v1, doc["kind"]).model_validate(doc)
    except ValidationError as exc:
        return str(exc)
    kept = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return None if kept == doc else f"fields the CRD does not define: {json.dumps(doc)} became {json.dumps(kept)}"


def test_custom_resources_are_valid_prometheus_operator_objects(rendered: dict[str, list[Doc]]) -> None:
    found = [doc for docs in rendered.values() for doc in docs if doc["kind"] in CUSTOM_KINDS]
    assert {doc["kind"] for doc in found} == set(CUSTOM_KINDS)
    for doc in found:
        assert custom_resource_problems(doc) is None
    broken = json.loads(json.dumps(of_kind(found, "PodMonitor")[0]))
    broken["spec"]["podMetricsEndpoints"][0]["scrapeEvery"] = "30s"
    assert custom_resource_problems(broken) is not None


REFUSALS = [
    ({"mode": "kubelet"}, "/mode"),
    ({"groups": [{"name": "Canary", "nodeSelector": {"matchLabels": {"a": "b"}}}]}, "/groups/0/name"),
    ({"groups": [{"name": "default", "nodeSelector": {"matchLabels": {"a": "b"}}}]}, "/groups/0/name"),
    ({"groups": [{"name": "empty", "nodeSelector": {}}]}, "/groups/0/nodeSelector"),
    ({"groups": [{"name": "g", "nodeSelector": {"matchLabels": {"a": True}}}]}, "/groups/0/nodeSelector/matchLabels/a"),
    (
        {"groups": [{"name": "g", "nodeSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]},
        "/groups/0/nodeSelector/matchExpressions/0",
    ),
    (
        {
            "groups": [
                {"name": "g", "nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}}
            ]
        },
        "/groups/0/nodeSelector/matchExpressions/0/operator",
    ),
    (
        {"groups": [{"name": "g", "nodeSelector": {"matchLabels": {"a": "1", "b": "2", "c": "3"}}}]},
        "/groups/0/nodeSelector/matchLabels",
    ),
    ({"groups": [{"name": f"g{i}", "nodeSelector": {"matchLabels": {"a": str(i)}}} for i in range(5)]}, "/groups"),
    ({"groups": [{"name": "g", "nodeSelector": {"matchLabels": {"a": "b"}}, "polcy": {}}]}, "/groups/0"),
    ({"policy": "network: {interface: eth0}"}, "/policy"),
    ({"hooks": {"maxUnavailable": "0%"}}, "/hooks/maxUnavailable"),
    ({"hooks": {"metricsPort": 80}}, "/hooks/metricsPort"),
    ({"hooks": {"cgroupDriver": "systemd-cgroup"}}, "/hooks/cgroupDriver"),
    ({"hooks": {"cpuWeightConversion": "quadratic"}}, "/hooks/cpuWeightConversion"),
    ({"hooks": {"extraCapabilities": ["CAP_SYS_ADMIN"]}}, "/hooks/extraCapabilities/0"),
    ({"hooks": {"nri": {"pluginIndex": 100}}}, "/hooks/nri/pluginIndex"),
    ({"hooks": {"privileged": True}}, "/hooks"),
    ({"host": {"hookConfigDir": "etc/runtime/hookserver.d"}}, "/host/hookConfigDir"),
    ({"installer": {"action": "upgrade"}}, "/installer/action"),
    ({"monitoring": {"podMonitor": {"interval": "half a minute"}}}, "/monitoring/podMonitor/interval"),
]


@pytest.mark.parametrize(("values", "field"), REFUSALS, ids=[field for _, field in REFUSALS])
def test_schema_refuses_bad_values_naming_the_field(values: dict[str, Any], field: str) -> None:
    done = run_helm("template", RELEASE, str(CHART), values=values)
    assert done.returncode != 0
    assert f"at '{field}'" in done.stderr, done.stderr


def test_duplicate_group_names_are_refused() -> None:
    group = {"name": "canary", "nodeSelector": {"matchLabels": {"a": "b"}}}
    done = run_helm("template", RELEASE, str(CHART), values={"groups": [group, group]})
    assert done.returncode != 0
    assert 'the name "canary" is used twice' in done.stderr


# --- policies ---------------------------------------------------------------------------------


def policy_check(text: str, tmp_path: Path) -> tuple[int, str]:
    """`runtime-hooks policy check` on ``text`` (in process: the same command, without a Python start each)."""
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    result = CliRunner().invoke(hooks_cli, ["policy", "check", str(path)])
    return result.exit_code, result.output


def rendered_policies(rendered: dict[str, list[Doc]]) -> Iterator[tuple[str, str]]:
    for scenario, docs in rendered.items():
        for configmap in of_kind(docs, "ConfigMap"):
            yield f"{scenario}/{configmap['metadata']['name']}", configmap["data"]["policy.yaml"]


def test_every_rendered_policy_passes_policy_check(rendered: dict[str, list[Doc]], tmp_path: Path) -> None:
    policies = dict(rendered_policies(rendered))
    assert len(policies) >= len(SCENARIOS) + 2 * len(GROUPS)
    for name, text in policies.items():
        assert policy_check(text, tmp_path) == (0, "ok\n"), name


def test_a_group_policy_the_daemon_would_refuse_fails_the_check(tmp_path: Path) -> None:
    group = {**GROUPS[0], "policy": {"reconciler": {"interval_seconds": "often"}}}
    (configmap,) = [c for c in of_kind(render({"groups": [group]}), "ConfigMap") if "canary" in c["metadata"]["name"]]
    code, output = policy_check(configmap["data"]["policy.yaml"], tmp_path)
    assert code == 1
    assert "reconciler.interval_seconds" in output


def test_each_group_gets_its_own_policy_and_daemonset(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["groups"]
    daemonsets = hooks_daemonsets(docs)
    assert sorted(daemonsets) == ["batch", "canary", "default"]
    configmaps = {c["metadata"]["name"]: yaml.safe_load(c["data"]["policy.yaml"]) for c in of_kind(docs, "ConfigMap")}
    expected = {"canary": GROUPS[0]["policy"], "batch": GROUPS[1]["policy"], "default": SCENARIOS["groups"]["policy"]}
    for group, daemonset in daemonsets.items():
        policy_volume = mounts(daemonset)["/etc/runtime-hooks"]["volume"]
        assert configmaps[policy_volume["configMap"]["name"]] == expected[group]
    # Distinct selectors: no DaemonSet adopts another's pods.
    selectors = {json.dumps(ds["spec"]["selector"]["matchLabels"], sort_keys=True) for ds in daemonsets.values()}
    assert len(selectors) == len(daemonsets)


def test_policy_is_a_mounted_directory_reloaded_without_restart(rendered: dict[str, list[Doc]]) -> None:
    """kubelet updates a ConfigMap volume by swapping its ..data symlink, which runtime-hooks'
    policy watcher sees (tests/hooks/test_hooks_policy_watch.py); a subPath mount never updates,
    and a checksum annotation would restart every pod on each policy change."""
    for docs in rendered.values():
        for daemonset in of_kind(docs, "DaemonSet"):
            spec = pod_spec(daemonset)
            for c in spec["containers"] + spec.get("initContainers", []):
                assert all("subPath" not in m for m in c.get("volumeMounts", [])), daemonset["metadata"]["name"]
            annotations = daemonset["spec"]["template"]["metadata"].get("annotations", {})
            assert not any("checksum" in key for key in annotations)
        for daemonset in hooks_daemonsets(docs).values():
            policy_file = Path(env(daemonset)["RUNTIME_HOOKS_POLICY"])
            mount = mounts(daemonset)[str(policy_file.parent)]
            assert "configMap" in mount["volume"]
            assert policy_file.name == "policy.yaml"


# --- the pods ---------------------------------------------------------------------------------


def test_proxy_mode_registers_in_the_hosts_hook_config_dir(rendered: dict[str, list[Doc]]) -> None:
    """The registration file names the socket by its path: the pod sees both at the host's paths."""
    (daemonset,) = hooks_daemonsets(rendered["proxy"]).values()
    variables, mounted = env(daemonset), mounts(daemonset)
    config_dir = variables["RUNTIME_HOOKS_HOOK_CONFIG_DIR"]
    assert config_dir == "/etc/runtime/hookserver.d"
    assert mounted[config_dir]["volume"]["hostPath"]["path"] == config_dir
    socket_dir = str(Path(variables["RUNTIME_HOOKS_ENDPOINT"]).parent)
    assert mounted[socket_dir]["volume"]["hostPath"]["path"] == socket_dir
    assert "RUNTIME_HOOKS_NRI_SOCKET" not in variables
    assert variables["RUNTIME_HOOKS_RUNTIME_ENDPOINT"] == "unix:///run/containerd/containerd.sock"
    assert mounted["/run/containerd"]["readOnly"] is True


def test_nri_mode_uses_the_nri_socket_and_registers_nowhere(rendered: dict[str, list[Doc]]) -> None:
    (daemonset,) = hooks_daemonsets(rendered["nri"]).values()
    variables, mounted = env(daemonset), mounts(daemonset)
    assert variables["RUNTIME_HOOKS_NRI_SOCKET"] == "/var/run/nri/nri.sock"
    assert mounted["/var/run/nri"]["volume"]["hostPath"]["path"] == "/var/run/nri"
    assert "RUNTIME_HOOKS_HOOK_CONFIG_DIR" not in variables  # set, it would also serve the proxy
    assert "/etc/runtime/hookserver.d" not in mounted


def test_cgroup_and_resctrl_are_mounted_where_the_daemon_is_told(rendered: dict[str, list[Doc]]) -> None:
    (plain,) = hooks_daemonsets(rendered["proxy"]).values()
    (full,) = hooks_daemonsets(rendered["systemd-resctrl"]).values()
    for daemonset in (plain, full):
        cgroup = mounts(daemonset)[env(daemonset)["RUNTIME_HOOKS_CGROUP_ROOT"]]
        assert cgroup["volume"]["hostPath"]["path"] == "/sys/fs/cgroup"
        assert cgroup["mountPropagation"] == "HostToContainer"  # hierarchies mounted later show up
    assert env(plain)["RUNTIME_HOOKS_RESCTRL_ROOT"] not in mounts(plain)
    resctrl = mounts(full)[env(full)["RUNTIME_HOOKS_RESCTRL_ROOT"]]
    assert resctrl["volume"]["hostPath"]["path"] == "/sys/fs/resctrl"
    assert mounts(full)["/run/dbus"]["readOnly"] is True  # systemd driver: unit properties over D-Bus
    assert "DBUS_SYSTEM_BUS_ADDRESS" not in env(plain)
    # The bus at the mount, not at the image's /var/run (dbus-fast's default path).
    assert env(full)["DBUS_SYSTEM_BUS_ADDRESS"] == "unix:path=/run/dbus/system_bus_socket"
    variables = env(full)
    assert variables["RUNTIME_HOOKS_CGROUP_PARENT_ROOT"] == "/kubelet/kubepods kubelet-kubepods.slice"
    assert variables["RUNTIME_HOOKS_ENABLE"] == "cpu memory resctrl"


def test_cpu_weight_conversion_reaches_the_daemon() -> None:
    """runc 1.3.2+ nodes (containerd 2.x) convert shares to weight differently: the value is passed on."""
    for value in ("linear", "log-quadratic"):
        docs = render({"hooks": {"cpuWeightConversion": value}})
        (daemonset,) = hooks_daemonsets(docs).values()
        assert env(daemonset)["RUNTIME_HOOKS_CPU_WEIGHT_CONVERSION"] == value


def test_least_privilege(rendered: dict[str, list[Doc]]) -> None:
    """No privileged container; capabilities, host PID and host network only where a plugin needs them."""
    for docs in rendered.values():
        for daemonset in of_kind(docs, "DaemonSet"):
            spec = pod_spec(daemonset)
            assert spec["automountServiceAccountToken"] is False
            for c in spec["containers"] + spec.get("initContainers", []):
                context = c["securityContext"]
                assert context.get("privileged", False) is False
                assert context["allowPrivilegeEscalation"] is False
                assert context["readOnlyRootFilesystem"] is True
                assert context["capabilities"]["drop"] == ["ALL"]
    cases = {  # scenario, group: capabilities, hostPID, hostNetwork
        ("proxy", "default"): (set(), False, False),
        ("nri", "default"): ({"DAC_OVERRIDE"}, True, False),  # OOM scores of other users' processes
        ("network", "default"): ({"NET_ADMIN", "BPF", "SYS_ADMIN"}, True, True),  # tc, cls_bpf, setns
        ("network-plugin-disabled", "default"): (set(), False, False),
        ("host-network-value", "default"): (set(), False, True),
        ("groups", "canary"): ({"NET_ADMIN", "BPF", "SYS_ADMIN"}, True, True),
        ("groups", "batch"): (set(), False, False),
        ("groups", "default"): (set(), False, False),
        ("systemd-resctrl", "default"): ({"NET_BIND_SERVICE"}, True, False),  # resctrl moves threads by host PID
        ("nri-groups-monitoring", "batch"): ({"DAC_OVERRIDE"}, True, False),
        ("nri-groups-monitoring", "default"): ({"NET_ADMIN", "BPF", "SYS_ADMIN", "DAC_OVERRIDE"}, True, True),
    }
    for (scenario, group), (capabilities, host_pid, host_network) in cases.items():
        daemonset = hooks_daemonsets(rendered[scenario])[group]
        spec = pod_spec(daemonset)
        assert (added_capabilities(daemonset), spec["hostPID"], spec["hostNetwork"]) == (
            capabilities,
            host_pid,
            host_network,
        ), (scenario, group)
        assert spec["dnsPolicy"] == ("ClusterFirstWithHostNet" if host_network else "ClusterFirst")


def test_every_pod_carries_the_proxys_skip_label(rendered: dict[str, list[Doc]]) -> None:
    """runtime-hooks' own pod must start while no hook server answers (failure policy Fail)."""
    daemonsets = [ds for docs in rendered.values() for ds in of_kind(docs, "DaemonSet")]
    assert {ds["metadata"]["labels"]["app.kubernetes.io/component"] for ds in daemonsets} == {
        "runtime-hooks",
        "installer",
    }
    for daemonset in daemonsets:
        labels = daemonset["spec"]["template"]["metadata"]["labels"]
        assert labels["runtimeproxy.koordinator.sh/skip-hookserver"] == "true"
    assert isinstance(proxy_cli, click.Group)
    skip = next(p for p in proxy_cli.commands["serve"].params if p.name == "skip_hook_label")
    assert skip.default == "runtimeproxy.koordinator.sh/skip-hookserver=true"  # the proxy's own default


def test_node_critical_rolling_update_with_probes_on_the_metrics_port(rendered: dict[str, list[Doc]]) -> None:
    for daemonset in hooks_daemonsets(rendered["groups"]).values():
        spec = pod_spec(daemonset)
        assert spec["priorityClassName"] == "system-node-critical"
        assert {"operator": "Exists"} in spec["tolerations"]
        assert daemonset["spec"]["updateStrategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": "20%"},
        }
        hooks = container(daemonset)
        assert hooks["ports"] == [{"name": "metrics", "containerPort": 9317, "protocol": "TCP"}]
        assert env(daemonset)["RUNTIME_HOOKS_METRICS_ADDRESS"] == ":9317"
        for probe in ("livenessProbe", "readinessProbe"):
            assert hooks[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
        assert hooks["resources"]["limits"]["memory"]


# --- monitoring -------------------------------------------------------------------------------


def test_monitoring_is_off_by_default(rendered: dict[str, list[Doc]]) -> None:
    assert not [doc for doc in rendered["proxy"] if doc["kind"] in CUSTOM_KINDS]


def test_prometheus_rule_holds_the_projects_alert_rules(rendered: dict[str, list[Doc]]) -> None:
    (rule,) = of_kind(rendered["monitoring"], "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_pod_monitor_gives_the_job_labels_the_alerts_select(rendered: dict[str, list[Doc]]) -> None:
    jobs_in_alerts = set(re.findall(r'job="([^"]+)"', ALERTS.read_text()))
    (proxy_mode,) = of_kind(rendered["monitoring"], "PodMonitor")
    (nri_mode,) = of_kind(rendered["nri-groups-monitoring"], "PodMonitor")

    def jobs(monitor: Doc) -> set[str]:
        return {
            r["replacement"]
            for endpoint in monitor["spec"]["podMetricsEndpoints"]
            for r in endpoint["relabelings"]
            if r["targetLabel"] == "job"
        }

    assert jobs(proxy_mode) == {"runtime-hooks", "runtime-proxy"} == jobs_in_alerts
    assert jobs(nri_mode) == {"runtime-hooks"}  # no proxy runs in NRI mode
    proxy_endpoint = proxy_mode["spec"]["podMetricsEndpoints"][1]
    address = next(r for r in proxy_endpoint["relabelings"] if r["targetLabel"] == "__address__")
    assert (address["sourceLabels"], address["replacement"]) == (["__meta_kubernetes_pod_host_ip"], "$1:9316")
    selector = proxy_mode["spec"]["selector"]["matchLabels"]
    pods = [ds["spec"]["template"]["metadata"]["labels"] for ds in hooks_daemonsets(rendered["monitoring"]).values()]
    assert pods and all(selector.items() <= labels.items() for labels in pods)


def test_packaged_chart_carries_the_alert_rules(tmp_path: Path) -> None:
    """files/runtimeproxy-alerts.yaml is a symlink to deploy/prometheus: the package holds the content."""
    assert (CHART / "files" / "runtimeproxy-alerts.yaml").resolve() == ALERTS.resolve()
    done = run_helm("package", str(CHART), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (package,) = tmp_path.glob("runtimeproxy-*.tgz")
    with tarfile.open(package) as tar:
        member = tar.extractfile("runtimeproxy/files/runtimeproxy-alerts.yaml")
        assert member is not None
        assert member.read() == ALERTS.read_bytes()


# --- the installer ----------------------------------------------------------------------------


@pytest.mark.parametrize(("scenario", "action"), [("installer", "install"), ("uninstall", "uninstall")])
def test_installer_runs_the_host_install_command_with_the_host_root(
    rendered: dict[str, list[Doc]], scenario: str, action: str
) -> None:
    (daemonset,) = [
        ds for ds in of_kind(rendered[scenario], "DaemonSet") if ds["metadata"]["name"].endswith("-installer")
    ]
    spec = pod_spec(daemonset)
    (step,) = spec["initContainers"]
    assert step["command"][:4] == ["runtime-proxy", action, "--root", "/host"]
    host = next(m for m in step["volumeMounts"] if m["mountPath"] == "/host")
    assert next(v for v in spec["volumes"] if v["name"] == host["name"])["hostPath"]["path"] == "/"
    assert set(step["securityContext"]["capabilities"]["add"]) == {"SYS_CHROOT"}  # the host's systemctl in a chroot
    (idle,) = spec["containers"]
    assert idle["securityContext"]["runAsNonRoot"] is True
    flags = {
        "installer": ["--no-hooks", "--from", "/opt/runtimeproxy-bundle.tar.gz"],
        "uninstall": ["--dry-run"],
    }[scenario]
    assert step["command"][4:] == flags
    result = CliRunner().invoke(proxy_cli, [action, "--help"])  # the flags the host command really has
    assert result.exit_code == 0, result.output
    assert all(flag in result.output for flag in ["--root", *(flag for flag in flags if flag.startswith("--"))])


def test_installer_is_off_by_default(rendered: dict[str, list[Doc]]) -> None:
    assert all(not ds["metadata"]["name"].endswith("-installer") for ds in of_kind(rendered["proxy"], "DaemonSet"))
