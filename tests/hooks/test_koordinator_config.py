"""runtime-hooks policy from-koordinator: Koordinator's slo-controller-config ConfigMap or a NodeSLO
as a runtime-hooks policy and Helm chart values, with every input field mapped or reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtimeproxy.hooks.cli import cli
from runtimeproxy.hooks.discovery import settings_specs
from runtimeproxy.hooks.koordinator_config import (
    UNDECIDED,
    Conversion,
    SLOInputError,
    check_policies,
    convert,
    dump_yaml,
)
from runtimeproxy.hooks.koordinator_slo import SCHEMAS, Opaque, Scalar, leaf_paths
from runtimeproxy.hooks.policy import loads_policy
from runtimeproxy.hooks.sdk import discover_plugins

SPECS = settings_specs(discover_plugins().plugins)
DATA = Path(__file__).resolve().parents[1] / "data" / "koordinator"
SWITCH = "group_identity_enabled" in (SPECS["cpu"].settings.__dataclass_fields__ if SPECS["cpu"].settings else {})


def node_slo(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "n"}, "spec": spec}


def config_map(**keys: Any) -> dict[str, Any]:
    data = {key.replace("_", "-"): json.dumps(value) for key, value in keys.items()}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "slo-controller-config"}, "data": data}


def qos(**classes: Any) -> dict[str, Any]:
    return {"resourceQOSStrategy": classes}


def at(policy: dict[str, Any], path: str) -> Any:
    value: Any = policy
    for part in path.split("."):
        value = value[part]
    return value


def finding(conversion: Conversion, path: str) -> tuple[str, str]:
    found = [(f.status, f.detail) for f in conversion.findings if f.path == path]
    assert len(found) == 1, (path, [f.path for f in conversion.findings])
    return found[0]


def invoke(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["policy", "from-koordinator", *args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


# --- each supported field ----------------------------------------------------------------

ON = {"enable": True}

MAPPED = [
    # (NodeSLO spec, policy path, expected value)
    (qos(lsClass={"memoryQOS": {**ON, "minLimitPercent": 15}}), "memory.LS.min_percent", 15),
    (qos(lsClass={"memoryQOS": {**ON, "lowLimitPercent": 25}}), "memory.LS.low_percent", 25),
    (qos(beClass={"memoryQOS": {**ON, "throttlingPercent": 70}}), "memory.BE.throttling_percent", 70),
    (qos(lsrClass={"memoryQOS": {**ON, "wmarkRatio": 80}}), "memory.LSE.wmark_ratio", 80),
    (qos(lsrClass={"memoryQOS": {**ON, "wmarkRatio": 80}}), "memory.LSR.wmark_ratio", 80),
    (qos(beClass={"memoryQOS": {**ON, "wmarkScalePermill": 40}}), "memory.BE.wmark_scale_permill", 40),
    (qos(beClass={"memoryQOS": {**ON, "wmarkMinAdj": 30}}), "memory.BE.wmark_min_adj", 30),
    (qos(systemClass={"memoryQOS": {"wmarkRatio": 70}}), "memory.SYSTEM.wmark_ratio", 70),
    (
        qos(beClass={"resctrlQOS": {**ON, "catRangeStartPercent": 10, "catRangeEndPercent": 50}}),
        "resctrl.BE.l3_percent_range",
        [10, 50],
    ),
    (qos(lsClass={"resctrlQOS": {**ON, "mbaPercent": 40}}), "resctrl.LS.mb_percent", 40),
    (qos(beClass={"cpuQOS": {**ON, "groupIdentity": -1}}), "cpu.BE.group_identity", -1),
    (qos(lsClass={"cpuQOS": {**ON, "groupIdentity": 1}}), "cpu.LS.group_identity", 1),
    (qos(policies={"cpuPolicy": "coreSched"}, beClass={"cpuQOS": {**ON, "schedIdle": 1}}), "cpu.BE.cpu_idle", True),
    (
        qos(policies={"cpuPolicy": "groupIdentity"}, beClass={"cpuQOS": {**ON, "schedIdle": 1}}),
        "cpu.BE.cpu_idle",
        False,
    ),
    (qos(lsClass={"networkQOS": {**ON, "egressRequest": 45, "egressLimit": 90}}), "network.LS.rate_percent", 45),
    (qos(lsClass={"networkQOS": {**ON, "egressRequest": 45, "egressLimit": 90}}), "network.LS.ceil_percent", 90),
    (qos(beClass={"networkQOS": {**ON, "egressRequest": 10, "egressLimit": 50}}), "network.SYSTEM.rate_percent", 60),
    ({"cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 400}}, "cpu.LS.cfs_burst_percent", 400),
    ({"cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 400}}, "cpu.SYSTEM.cfs_burst_percent", 400),
    ({"cpuBurstStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 400}}, "cpu.BE.cfs_burst_percent", 0),
    ({"cpuBurstStrategy": {"policy": "none", "cpuBurstPercent": 400}}, "cpu.LS.cfs_burst_percent", 0),
    ({"systemStrategy": {"totalNetworkBandwidth": "25k"}}, "network.link_speed_mbit", 25000),
]


@pytest.mark.parametrize(("spec", "path", "expected"), MAPPED, ids=[f"{p}={v}" for _, p, v in MAPPED])
def test_a_supported_field_maps_to_its_policy_value(spec: dict[str, Any], path: str, expected: Any) -> None:
    conversion = convert(node_slo(**spec), SPECS)
    assert at(conversion.policy, path) == expected
    check_policies(conversion, SPECS)


def test_a_disabled_feature_takes_koordinators_values_for_off() -> None:
    """koordlet replaces an LSR/LS/BE feature whose enable is false by its "none" values."""
    spec = qos(
        beClass={
            "memoryQOS": {"enable": False, "wmarkRatio": 80},
            "resctrlQOS": {"catRangeEndPercent": 20},  # enable left out: Koordinator's default is false
            "cpuQOS": {"enable": False, "groupIdentity": -1},
        }
    )
    conversion = convert(node_slo(**spec), SPECS)
    assert at(conversion.policy, "memory.BE.wmark_ratio") == 0
    assert at(conversion.policy, "memory.BE.wmark_scale_permill") == 50
    assert at(conversion.policy, "resctrl.BE.l3_percent_range") == [0, 100]
    status, detail = finding(conversion, "spec.resourceQOSStrategy.beClass.memoryQOS.wmarkRatio")
    assert status == "mapped" and "beClass.memoryQOS.enable is false" in detail
    if SWITCH:
        assert at(conversion.policy, "cpu.BE.group_identity_enabled") is False
    else:
        assert at(conversion.policy, "cpu.BE.group_identity") == 0


def test_without_the_group_identity_switch_a_disabled_class_gets_identity_zero() -> None:
    spec = qos(
        lsClass={"cpuQOS": {"enable": False, "groupIdentity": 2}}, beClass={"cpuQOS": {**ON, "groupIdentity": -1}}
    )
    policy = convert(node_slo(**spec)).policy  # no specs: the cpu plugin's keys are not known
    assert at(policy, "cpu.LS.group_identity") == 0
    assert at(policy, "cpu.BE.group_identity") == -1
    assert "group_identity_enabled" not in policy["cpu"]["LS"]


def test_core_scheduling_switches_group_identity_off() -> None:
    spec = qos(policies={"cpuPolicy": "coreSched"}, lsClass={"cpuQOS": {**ON, "groupIdentity": 2}})
    conversion = convert(node_slo(**spec), SPECS)
    key = "group_identity_enabled" if SWITCH else "group_identity"
    assert at(conversion.policy, f"cpu.LS.{key}") == (False if SWITCH else 0)
    assert finding(conversion, "spec.resourceQOSStrategy.policies.cpuPolicy")[0] == "unsupported"


def test_absent_strategies_are_koordinators_defaults() -> None:
    """A NodeSLO without strategies is what koordlet merges over: every class's QoS off, no burst."""
    conversion = convert(node_slo(), SPECS)
    assert conversion.findings == []
    assert at(conversion.policy, "memory.LS.wmark_ratio") == 0  # memoryQOS disabled by default
    assert at(conversion.policy, "resctrl.BE.l3_percent_range") == [0, 100]
    assert at(conversion.policy, "cpu.LS.cfs_burst_percent") == 0
    assert at(conversion.policy, "network.link_speed_mbit") == 0


# --- unsupported fields -------------------------------------------------------------------

UNSUPPORTED = [
    (
        qos(beClass={"blkioQOS": {**ON, "blocks": [{"name": "/dev/vdb", "type": "device", "ioCfg": {"readIOPS": 9}}]}}),
        "spec.resourceQOSStrategy.beClass.blkioQOS.blocks[0].ioCfg.readIOPS",
    ),
    (
        qos(lsClass={"memoryQOS": {**ON, "pageCacheLimitPercent": 50}}),
        "spec.resourceQOSStrategy.lsClass.memoryQOS.pageCacheLimitPercent",
    ),
    (qos(beClass={"memoryQOS": {**ON, "oomKillGroup": 1}}), "spec.resourceQOSStrategy.beClass.memoryQOS.oomKillGroup"),
    (qos(policies={"netQOSPolicy": "terway-qos"}), "spec.resourceQOSStrategy.policies.netQOSPolicy"),
    (qos(beClass={"resctrlQOS": {**ON, "mbaPercent": 0}}), "spec.resourceQOSStrategy.beClass.resctrlQOS.mbaPercent"),
    (qos(lsClass={"cpuQOS": {**ON, "groupIdentity": 2, "bogus": 1}}), "spec.resourceQOSStrategy.lsClass.cpuQOS.bogus"),
    (
        {"cpuBurstStrategy": {"policy": "auto", "cfsQuotaBurstPercent": 200}},
        "spec.cpuBurstStrategy.cfsQuotaBurstPercent",
    ),
    ({"cpuBurstStrategy": {"policy": "cfsQuotaBurstOnly"}}, "spec.cpuBurstStrategy.policy"),
    ({"systemStrategy": {"minFreeKbytesFactor": 100}}, "spec.systemStrategy.minFreeKbytesFactor"),
    ({"systemStrategy": {"schedFeatures": {"ID_BOOK_CPU": True}}}, "spec.systemStrategy.schedFeatures.ID_BOOK_CPU"),
    (
        {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 60}},
        "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent",
    ),
    (
        {"resourceUsedThresholdWithBE": {"memoryEvictThresholdPercent": 70}},
        "spec.resourceUsedThresholdWithBE.memoryEvictThresholdPercent",
    ),
    ({"hostApplications": [{"name": "nginx", "qos": "LS"}]}, "spec.hostApplications"),
    ({"somethingNew": {"a": 1}}, "spec.somethingNew"),
    (
        qos(policies={"netQOSPolicy": "terway-qos"}, lsClass={"networkQOS": {**ON, "ingressLimit": 50}}),
        "spec.resourceQOSStrategy.lsClass.networkQOS.ingressLimit",
    ),
]


@pytest.mark.parametrize(("spec", "path"), UNSUPPORTED, ids=[p for _, p in UNSUPPORTED])
def test_an_unsupported_field_in_effect_is_reported_by_name(spec: dict[str, Any], path: str) -> None:
    conversion = convert(node_slo(**spec), SPECS)
    status, detail = finding(conversion, path)
    assert status == "unsupported" and detail
    assert f"{path}: not supported (" in [f.line()[: len(path) + 17] for f in conversion.findings]
    check_policies(conversion, SPECS)


INACTIVE = [
    (
        qos(beClass={"memoryQOS": {"enable": False, "oomKillGroup": 1}}),
        "spec.resourceQOSStrategy.beClass.memoryQOS.oomKillGroup",
    ),
    (
        qos(beClass={"blkioQOS": {"enable": False, "blocks": [{"name": "x"}]}}),
        "spec.resourceQOSStrategy.beClass.blkioQOS.blocks[0].name",
    ),
    (
        {"cpuBurstStrategy": {"policy": "cpuBurstOnly", "cfsQuotaBurstPercent": 200}},
        "spec.cpuBurstStrategy.cfsQuotaBurstPercent",
    ),
    (
        {"resourceUsedThresholdWithBE": {"enable": False, "cpuSuppressThresholdPercent": 60}},
        "spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent",
    ),
    (
        qos(lsClass={"networkQOS": {**ON, "ingressLimit": 50, "egressRequest": 30, "egressLimit": 100}}),
        "spec.resourceQOSStrategy.lsClass.networkQOS.ingressLimit",
    ),
]


@pytest.mark.parametrize(("spec", "path"), INACTIVE, ids=[p for _, p in INACTIVE])
def test_an_unsupported_field_not_in_effect_is_reported_as_such(spec: dict[str, Any], path: str) -> None:
    conversion = convert(node_slo(**spec), SPECS)
    assert finding(conversion, path)[0] == "inactive"
    assert conversion.unsupported() == []


def test_an_unsupported_value_leaves_the_policy_key_to_its_default() -> None:
    spec = qos(lsClass={"memoryQOS": {**ON, "minLimitPercent": 40, "lowLimitPercent": 20}})
    conversion = convert(node_slo(**spec), SPECS)
    assert finding(conversion, "spec.resourceQOSStrategy.lsClass.memoryQOS.lowLimitPercent")[0] == "unsupported"
    assert "low_percent" not in conversion.policy["memory"]["LS"]
    assert at(conversion.policy, "memory.LS.min_percent") == 40
    check_policies(conversion, SPECS)


# --- the ConfigMap and its node strategies -------------------------------------------------


def test_the_sample_config_map_gives_one_group_per_node_strategy_in_order() -> None:
    document = yaml.safe_load((DATA / "slo-controller-config.yaml").read_text())
    conversion = convert(document, SPECS)
    check_policies(conversion, SPECS)
    canary = {"matchLabels": {"runtimeproxy.io/canary": "true"}}
    gpu = {"matchExpressions": [{"key": "node.example.com/gpu", "operator": "Exists"}]}
    # resource-qos-config's strategies (canary, gpu) and cpu-burst-config's (canary): a canary node
    # takes both canary strategies; the resource QoS "gpu" group has its own selector.
    assert [(g.name, g.node_selector) for g in conversion.groups] == [
        ("canary-pool", canary),
        ("gpu-canary-burst", {**canary, **gpu}),
        ("gpu", gpu),
    ]
    canary_group, gpu_canary, gpu_group = (g.policy for g in conversion.groups)
    assert at(canary_group, "resctrl.BE.l3_percent_range") == [0, 20]  # the node strategy's end, the cluster's start
    assert at(canary_group, "resctrl.BE.mb_percent") == 60
    assert at(canary_group, "cpu.LS.cfs_burst_percent") == 300
    assert at(gpu_canary, "cpu.LS.cfs_burst_percent") == 300
    assert at(gpu_group, "cpu.LS.cfs_burst_percent") == 0
    assert at(conversion.policy, "resctrl.BE.l3_percent_range") == [0, 40]
    assert at(conversion.policy, "network.link_speed_mbit") == 10000
    lines = [f.line() for f in conversion.findings if f.status != "mapped"]
    assert "resource-qos-config.clusterStrategy.beClass.memoryQOS.oomKillGroup: not supported (" in "\n".join(lines)
    assert any(line.startswith("colocation-config: not supported, not in effect") for line in lines)


def test_one_key_gives_one_group_per_node_strategy_with_its_selector() -> None:
    strategies = [
        {
            "name": f"pool {i}",
            "nodeSelector": {"matchLabels": {"pool": str(i)}},
            "beClass": {"memoryQOS": {**ON, "wmarkRatio": 50 + i}},
        }
        for i in range(4)
    ]
    conversion = convert(config_map(resource_qos_config={"nodeStrategies": strategies}), SPECS)
    assert [g.name for g in conversion.groups] == ["pool-0", "pool-1", "pool-2", "pool-3"]
    assert [g.node_selector for g in conversion.groups] == [{"matchLabels": {"pool": str(i)}} for i in range(4)]
    assert [at(g.policy, "memory.BE.wmark_ratio") for g in conversion.groups] == [50, 51, 52, 53]
    values = conversion.values()
    assert [g["nodeSelector"] for g in values["groups"]] == [s["nodeSelector"] for s in strategies]
    assert finding(conversion, "resource-qos-config.nodeStrategies[2].nodeSelector")[0] == "mapped"


def test_node_strategies_of_two_keys_combine_in_first_match_order() -> None:
    conversion = convert(
        config_map(
            resource_qos_config={
                "nodeStrategies": [
                    {"name": "a", "nodeSelector": {"matchLabels": {"a": "1"}}, "lsClass": {"memoryQOS": {**ON}}}
                ]
            },
            cpu_burst_config={
                "nodeStrategies": [
                    {"name": "b", "nodeSelector": {"matchLabels": {"b": "1"}}, "policy": "cpuBurstOnly"},
                    {"name": "c", "nodeSelector": {"matchLabels": {"a": "2"}}, "policy": "cpuBurstOnly"},
                ]
            },
        ),
        SPECS,
    )
    # (a,c) cannot match (a=1 and a=2): left out; (none, b) and (none, c) follow (a, none).
    assert [(g.name, g.node_selector["matchLabels"]) for g in conversion.groups] == [
        ("a-b", {"a": "1", "b": "1"}),
        ("a", {"a": "1"}),
        ("b", {"b": "1"}),
        ("c", {"a": "2"}),
    ]
    assert any("a-c" in note for note in conversion.notes)
    assert [at(g.policy, "cpu.LS.cfs_burst_percent") for g in conversion.groups] == [1000, 0, 1000, 1000]
    assert [at(g.policy, "memory.LS.wmark_ratio") for g in conversion.groups] == [95, 95, 0, 0]


def test_a_node_strategy_without_a_selector_makes_no_group() -> None:
    conversion = convert(
        config_map(resource_qos_config={"nodeStrategies": [{"name": "x", "lsClass": {"memoryQOS": {**ON}}}]}), SPECS
    )
    assert conversion.groups == []
    assert finding(conversion, "resource-qos-config.nodeStrategies[0].lsClass.memoryQOS.enable")[0] == "inactive"


def test_group_names_are_unique_dns_labels_the_chart_takes() -> None:
    strategies = [{"name": "Pool_A!" * 12, "nodeSelector": {"matchLabels": {"n": str(i)}}} for i in range(3)]
    strategies.append({"name": "Default", "nodeSelector": {"matchLabels": {"n": "x"}}})
    names = [g.name for g in convert(config_map(resource_qos_config={"nodeStrategies": strategies})).groups]
    assert len(set(names)) == 4 and "default" not in names  # the chart's own DaemonSet is "default"
    assert all(len(n) <= 20 and n.replace("-", "").isalnum() and n == n.lower() and n[0] != "-" for n in names)


def test_groups_the_chart_cannot_take_are_reported_on_their_node_strategy() -> None:
    strategies = [{"name": f"p{i}", "nodeSelector": {"matchLabels": {"pool": str(i)}}} for i in range(5)]
    strategies.insert(1, {"name": "wide", "nodeSelector": {"matchLabels": {"a": "1", "b": "1", "c": "1"}}})
    strategies.insert(2, {"name": "all", "nodeSelector": {}})
    conversion = convert(config_map(resource_qos_config={"nodeStrategies": strategies}), SPECS)
    assert [g.name for g in conversion.groups] == ["p0", "p1", "p2", "p3"]
    for index, reason in ((1, "1 to 2 matchLabels"), (2, "1 to 2 matchLabels"), (6, "at most 4 groups")):
        status, detail = finding(conversion, f"resource-qos-config.nodeStrategies[{index}].nodeSelector")
        assert status == "unsupported" and reason in detail
    assert finding(conversion, "resource-qos-config.nodeStrategies[0].nodeSelector")[0] == "mapped"


# --- bad input ------------------------------------------------------------------------------

BAD = [
    ([1, 2], "expected a Kubernetes object"),
    ({"kind": "Pod"}, "kind: expected ConfigMap"),
    ({"kind": "ConfigMap", "data": {"resource-qos-config": "{not json"}}, "resource-qos-config: not valid JSON"),
    ({"kind": "ConfigMap", "data": {"cpu-burst-config": "[1]"}}, "cpu-burst-config: must hold a JSON object"),
    (
        node_slo(**qos(lsClass={"cpuQOS": {"groupIdentity": "2"}})),
        "spec.resourceQOSStrategy.lsClass.cpuQOS.groupIdentity: must be an integer",
    ),
    (
        node_slo(**qos(lsClass={"cpuQOS": {"groupIdentity": 3}})),
        "spec.resourceQOSStrategy.lsClass.cpuQOS.groupIdentity: must be within -1..2",
    ),
    (node_slo(**qos(lsClass={"cpuQOS": {"enable": 1}})), "lsClass.cpuQOS.enable: must be true or false"),
    (node_slo(**qos(policies={"cpuPolicy": "fast"})), "policies.cpuPolicy: must be one of groupIdentity, coreSched"),
    (
        node_slo(**qos(beClass={"resctrlQOS": {**ON, "catRangeStartPercent": 50, "catRangeEndPercent": 50}})),
        "catRangeStartPercent (50) must be below catRangeEndPercent (50)",
    ),
    (
        node_slo(systemStrategy={"totalNetworkBandwidth": "fast"}),
        "systemStrategy.totalNetworkBandwidth: not a quantity",
    ),
    (
        config_map(
            resource_qos_config={
                "nodeStrategies": [{"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}]
            }
        ),
        "resource-qos-config.nodeStrategies[0].nodeSelector.matchExpressions[0].operator: must be one of In",
    ),
    (
        config_map(resource_qos_config={"nodeStrategies": [{"nodeSelector": {"matchLabels": {"a b": "1"}}}]}),
        "nodeSelector.matchLabels: not a valid label key: 'a b'",
    ),
    (
        config_map(resource_qos_config={"nodeStrategies": [{"nodeSelector": {"matchLabels": {"a": 1}}}]}),
        "nodeSelector.matchLabels: must map label keys to string values",
    ),
    (
        node_slo(
            **qos(
                lsClass={"networkQOS": {**ON, "egressRequest": 60, "egressLimit": 100}},
                beClass={"networkQOS": {**ON, "egressRequest": 40, "egressLimit": 100}},
            )
        ),
        "the SYSTEM band would get nothing",
    ),
]


@pytest.mark.parametrize(("document", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_refused_naming_where(document: object, message: str) -> None:
    with pytest.raises(SLOInputError) as caught:
        convert(document, SPECS)
    assert message in str(caught.value)


def test_the_command_exits_1_on_bad_input_with_the_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(node_slo(**qos(lsClass={"cpuQOS": {"groupIdentity": 9}}))))
    code, out, err = invoke(str(bad))
    assert code == 1 and out == ""
    assert f"{bad}: spec.resourceQOSStrategy.lsClass.cpuQOS.groupIdentity: must be within -1..2, got 9" in err
    code, _, err = invoke(str(tmp_path / "missing.yaml"))
    assert code == 1 and "cannot read the file" in err
    code, _, err = invoke("-", stdin="kind: [unclosed")
    assert code == 1 and "not valid YAML or JSON" in err


# --- the command ----------------------------------------------------------------------------


def test_the_command_writes_values_and_policy_that_pass_the_policy_check(tmp_path: Path) -> None:
    values, policy = tmp_path / "values.yaml", tmp_path / "policy.yaml"
    sample = DATA / "slo-controller-config.yaml"
    code, out, err = invoke(str(sample), "--values-out", str(values), "--policy-out", str(policy))
    assert code == 0, err
    assert out == ""
    assert "resource-qos-config.clusterStrategy.beClass.memoryQOS.oomKillGroup: not supported (" in err
    assert "mapped:" not in err  # only with -v
    result = CliRunner().invoke(cli, ["policy", "check", str(policy)])
    assert result.exit_code == 0 and result.stdout == "ok\n", result.stderr
    loaded = yaml.safe_load(values.read_text())
    assert set(loaded) == {"policy", "groups"}
    assert yaml.safe_load(policy.read_text()) == loaded["policy"]
    for group in loaded["groups"]:
        loads_policy(dump_yaml(group["policy"]), group["name"], specs=SPECS)
    assert [g["name"] for g in loaded["groups"]] == ["canary-pool", "gpu-canary-burst", "gpu"]
    code, out, err = invoke("-v", str(sample))
    assert code == 0 and yaml.safe_load(out) == loaded  # stdout: the values
    assert "resource-qos-config.clusterStrategy.lsClass.memoryQOS.wmarkRatio: mapped: memory.LS.wmark_ratio = 90" in err


def test_a_node_slo_prints_its_policy(tmp_path: Path) -> None:
    code, out, err = invoke(str(DATA / "nodeslo.yaml"))
    assert code == 0, err
    policy = yaml.safe_load(out)
    assert at(policy, "network.LS.rate_percent") == 50 and at(policy, "network.SYSTEM.rate_percent") == 30
    assert at(policy, "cpu.LS.cfs_burst_percent") == 500
    assert "spec.cpuBurstStrategy.cfsQuotaBurstPercent: not supported (" in err
    as_json = tmp_path / "nodeslo.json"  # JSON input too
    as_json.write_text(json.dumps(yaml.safe_load((DATA / "nodeslo.yaml").read_text())))
    assert invoke(str(as_json))[1] == out.replace("nodeslo.yaml", "nodeslo.json")


def test_strict_fails_on_fields_in_effect_and_writes_nothing(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    code, _, err = invoke(str(DATA / "slo-controller-config.yaml"), "--strict", "--values-out", str(values))
    assert code == 1 and "1 field(s) in effect are not supported (--strict)" in err
    assert not values.exists()
    clean = tmp_path / "clean.yaml"
    clean.write_text(yaml.safe_dump(node_slo(**qos(beClass={"memoryQOS": {"enable": False, "oomKillGroup": 1}}))))
    code, _, err = invoke(str(clean), "--strict", "--values-out", str(values))
    assert code == 0, err
    assert values.exists()


# --- properties -----------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    start=st.integers(0, 99),
    width=st.integers(1, 100),
    mba=st.integers(1, 100),
    cls=st.sampled_from([("lsrClass", "LSR"), ("lsClass", "LS"), ("beClass", "BE"), ("systemClass", "SYSTEM")]),
)
def test_resctrl_ranges_and_percentages_carry_over(start: int, width: int, mba: int, cls: tuple[str, str]) -> None:
    end = min(100, start + width)
    spec = qos(
        **{cls[0]: {"resctrlQOS": {**ON, "catRangeStartPercent": start, "catRangeEndPercent": end, "mbaPercent": mba}}}
    )
    conversion = convert(node_slo(**spec), SPECS)
    assert at(conversion.policy, f"resctrl.{cls[1]}") == {"l3_percent_range": [start, end], "mb_percent": mba}
    check_policies(conversion, SPECS)


@settings(max_examples=50, deadline=None)
@given(
    values=st.fixed_dictionaries(
        {
            "minLimitPercent": st.integers(0, 100),
            "lowLimitPercent": st.integers(0, 100),
            "throttlingPercent": st.integers(0, 100),
            "wmarkRatio": st.integers(0, 100),
            "wmarkScalePermill": st.integers(1, 1000),
            "wmarkMinAdj": st.integers(-25, 50),
        }
    )
)
def test_memory_percentages_carry_over_or_are_reported(values: dict[str, int]) -> None:
    conversion = convert(node_slo(**qos(lsClass={"memoryQOS": {**ON, **values}})), SPECS)
    memory = conversion.policy["memory"]["LS"]
    low_ok = values["lowLimitPercent"] == 0 or values["lowLimitPercent"] >= values["minLimitPercent"]
    assert memory.get("low_percent") == (values["lowLimitPercent"] if low_ok else None)
    assert (memory["min_percent"], memory["wmark_ratio"], memory["wmark_min_adj"]) == (
        values["minLimitPercent"],
        values["wmarkRatio"],
        values["wmarkMinAdj"],
    )
    status = finding(conversion, "spec.resourceQOSStrategy.lsClass.memoryQOS.lowLimitPercent")[0]
    assert status == ("mapped" if low_ok else "unsupported")
    check_policies(conversion, SPECS)


@settings(max_examples=50, deadline=None)
@given(
    request=st.tuples(st.integers(0, 100), st.integers(0, 100)),
    limit=st.tuples(st.integers(0, 100), st.integers(0, 100)),
)
def test_egress_percentages_become_bands_or_are_reported(request: tuple[int, int], limit: tuple[int, int]) -> None:
    spec = qos(
        lsClass={"networkQOS": {**ON, "egressRequest": request[0], "egressLimit": limit[0]}},
        beClass={"networkQOS": {**ON, "egressRequest": request[1], "egressLimit": limit[1]}},
    )
    try:
        conversion = convert(node_slo(**spec), SPECS)
    except SLOInputError as exc:
        assert "SYSTEM band would get nothing" in str(exc)
        return
    check_policies(conversion, SPECS)
    network = conversion.policy.get("network", {})
    for band, req, lim in (("LS", request[0], limit[0]), ("BE", request[1], limit[1])):
        valid = 1 <= req <= lim <= 100
        assert (network.get(band) or {}).get("rate_percent") == (req if valid else None)
        status = finding(conversion, f"spec.resourceQOSStrategy.{band.lower()}Class.networkQOS.egressRequest")[0]
        assert status == ("mapped" if valid else "unsupported")


def decided(conversion: Conversion) -> bool:
    """Every finding comes from a rule for that field, none from the catch-all for fields no rule covers."""
    return all(f.detail != UNDECIDED for f in conversion.findings)


def covered(leaf: str, reported: set[str]) -> bool:
    """A finding names the leaf, or an object holding it that is reported whole (blocks, a selector)."""
    return any(leaf == path or leaf.startswith((f"{path}.", f"{path}[")) for path in reported)


def _values(spec: Any) -> st.SearchStrategy[Any]:
    """Values Koordinator accepts for a field of ``SCHEMAS``, with the occasional unknown field."""
    if isinstance(spec, Opaque):
        return st.one_of(
            st.just([]),
            st.dictionaries(st.sampled_from(["a", "b"]), st.integers(), max_size=2),
            st.lists(st.fixed_dictionaries({"name": st.text(max_size=3)}), max_size=2),
        )
    if isinstance(spec, Scalar):
        if spec.kind == "bool":
            return st.booleans()
        if spec.kind == "int":
            return st.integers(
                spec.low if spec.low is not None else -(2**40), spec.high if spec.high is not None else 2**40
            )
        if spec.kind == "enum":
            return st.sampled_from(spec.choices)
        if spec.kind == "quantity":
            return st.sampled_from(["0", "100", "1k", "2.5k", "10G"])
        return st.one_of(st.integers(0, 100), st.sampled_from(["50M", "1G"]))
    known = {key: _values(value) for key, value in spec.items()}
    return st.fixed_dictionaries({}, optional={**known, "unknownField": st.integers()})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.fixed_dictionaries({}, optional={name: _values(schema) for name, schema in SCHEMAS.items()}))
def test_every_leaf_of_a_node_slo_is_mapped_or_reported(spec: dict[str, Any]) -> None:
    try:
        conversion = convert(node_slo(**spec), SPECS)
    except SLOInputError as exc:  # only for what Koordinator's validation refuses too, named
        assert "catRangeStartPercent" in str(exc) or "SYSTEM band" in str(exc), exc
        return
    reported = {f.path for f in conversion.findings}
    for leaf in leaf_paths(spec, "spec") if spec else ():
        assert covered(leaf, reported), leaf
    assert decided(conversion), [f.line() for f in conversion.findings if f.detail == UNDECIDED]
    check_policies(conversion, SPECS)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster=_values(SCHEMAS["resourceQOSStrategy"]), nodes=st.lists(_values(SCHEMAS["resourceQOSStrategy"]), max_size=3)
)
def test_every_leaf_of_a_config_map_is_mapped_or_reported(cluster: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
    strategies = [
        {"name": f"n{i}", "nodeSelector": {"matchLabels": {"n": str(i)}}, **node} for i, node in enumerate(nodes)
    ]
    document = {"clusterStrategy": cluster, "nodeStrategies": strategies}
    try:
        conversion = convert(config_map(resource_qos_config=document), SPECS)
    except SLOInputError as exc:
        assert "catRangeStartPercent" in str(exc) or "SYSTEM band" in str(exc), exc
        return
    reported = {f.path for f in conversion.findings}
    for leaf in leaf_paths(document, "resource-qos-config"):
        assert covered(leaf, reported), leaf
    assert decided(conversion), [f.line() for f in conversion.findings if f.detail == UNDECIDED]
    assert len(conversion.groups) == len(nodes)
    check_policies(conversion, SPECS)
