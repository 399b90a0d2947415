"""Chart values made by `runtime-hooks policy from-koordinator` from a slo-controller-config, rendered
by the real helm: every node runs the policy koordlet would get from the NodeSLO koord-manager
writes for it (each ConfigMap key's first matching node strategy, over its cluster strategy)."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from helm_chart import Labels, of_kind, pod_spec, render, schedules_on, selector_matches
from runtimeproxy.hooks.cli import cli
from runtimeproxy.hooks.discovery import settings_specs
from runtimeproxy.hooks.koordinator_config import convert
from runtimeproxy.hooks.koordinator_slo import CONFIG_KEYS
from runtimeproxy.hooks.sdk import discover_plugins

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "koordinator" / "slo-controller-config.yaml"
SPECS = settings_specs(discover_plugins().plugins)


def layered(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in layer.items():
        out[key] = layered(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


def node_slo_for(config_map: dict[str, Any], labels: Labels) -> dict[str, Any]:
    """The NodeSLO koord-manager writes for a node: per key, the first node strategy whose
    selector matches the node, laid over the cluster strategy; else the cluster strategy."""
    spec = {}
    for key, field in CONFIG_KEYS.items():
        if key not in config_map["data"]:
            continue
        document = json.loads(config_map["data"][key])
        cluster = document.get("clusterStrategy", {})
        strategy = next(
            (
                layered(cluster, {k: v for k, v in node.items() if k not in ("name", "nodeSelector")})
                for node in document.get("nodeStrategies", [])
                if selector_matches(node["nodeSelector"], labels)
            ),
            cluster,
        )
        spec[field] = strategy
    return {"kind": "NodeSLO", "metadata": {"name": "node"}, "spec": spec}


def policy_of(docs: list[dict[str, Any]], daemonset: dict[str, Any]) -> Any:
    (name,) = [v["configMap"]["name"] for v in pod_spec(daemonset)["volumes"] if v["name"] == "policy"]
    (config_map,) = [doc for doc in of_kind(docs, "ConfigMap") if doc["metadata"]["name"] == name]
    return yaml.safe_load(config_map["data"]["policy.yaml"])


def test_each_node_runs_the_policy_of_its_node_slo(tmp_path: Path) -> None:
    values_file = tmp_path / "values.yaml"
    result = CliRunner().invoke(cli, ["policy", "from-koordinator", str(SAMPLE), "--values-out", str(values_file)])
    assert result.exit_code == 0, result.stderr
    values = yaml.safe_load(values_file.read_text())
    docs = render(values)
    daemonsets = of_kind(docs, "DaemonSet")
    assert len(daemonsets) == len(values["groups"]) + 1
    config_map = yaml.safe_load(SAMPLE.read_text())
    for canary, gpu in itertools.product((None, "true", "false"), (None, "")):
        labels = {"kubernetes.io/os": "linux"}
        if canary is not None:
            labels["runtimeproxy.io/canary"] = canary
        if gpu is not None:
            labels["node.example.com/gpu"] = gpu
        (running,) = [ds for ds in daemonsets if schedules_on(ds, labels)]
        expected = convert(node_slo_for(config_map, labels), SPECS).policy
        assert policy_of(docs, running) == expected, labels
