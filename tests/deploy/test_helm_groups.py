"""Node groups in the Helm chart: every node runs exactly one runtime-hooks DaemonSet, the first
group whose selector matches it (in list order), else the default one. Checked on what the real
helm renders, with node affinity evaluated as Kubernetes does (helm_chart.schedules_on)."""

from __future__ import annotations

import itertools
from typing import Any

from helm_chart import CHART, Labels, of_kind, pod_spec, render, run_helm, schedules_on, selector_matches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KEYS = ("rp.io/a", "rp.io/b", "rp.io/c")
VALUES = ("x", "y")
OS_LABEL = {"kubernetes.io/os": "linux"}  # the chart's nodeSelector: every node here has it


def all_nodes() -> list[dict[str, str]]:
    """Every label set over KEYS, each key absent or one of VALUES: 27 nodes."""
    nodes = []
    for choice in itertools.product((None, *VALUES), repeat=len(KEYS)):
        labels = {key: value for key, value in zip(KEYS, choice, strict=True) if value is not None}
        nodes.append({**OS_LABEL, **labels})
    return nodes


expressions = st.builds(
    lambda key, operator, values: {"key": key, "operator": operator, **({"values": values} if values else {})},
    st.sampled_from(KEYS),
    st.sampled_from(("In", "NotIn", "Exists", "DoesNotExist")),
    st.lists(st.sampled_from(VALUES), min_size=1, max_size=2, unique=True),
).map(lambda e: e if e["operator"] in ("In", "NotIn") else {"key": e["key"], "operator": e["operator"]})

selectors = st.builds(
    lambda labels, exprs: {
        **({"matchLabels": labels} if labels else {}),
        **({"matchExpressions": exprs} if exprs else {}),
    },
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2),
    st.lists(expressions, max_size=2),
).filter(lambda s: bool(s))  # the schema wants at least one requirement


def expected_group(groups: list[dict[str, Any]], labels: Labels) -> str:
    return next((g["name"] for g in groups if selector_matches(g["nodeSelector"], labels)), "default")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(selectors, min_size=1, max_size=4))
def test_each_node_runs_exactly_the_daemonset_of_its_first_matching_group(chosen: list[dict[str, Any]]) -> None:
    groups = [{"name": f"g{i}", "nodeSelector": s} for i, s in enumerate(chosen)]
    daemonsets = of_kind(render({"groups": groups}), "DaemonSet")
    assert len(daemonsets) == len(groups) + 1
    by_group = {ds["metadata"]["labels"]["runtimeproxy.io/group"]: ds for ds in daemonsets}
    for labels in all_nodes():
        running = sorted(name for name, ds in by_group.items() if schedules_on(ds, labels))
        assert running == [expected_group(groups, labels)], (labels, groups)


def test_without_groups_the_default_daemonset_runs_everywhere() -> None:
    (daemonset,) = of_kind(render(), "DaemonSet")
    assert "affinity" not in pod_spec(daemonset)
    assert all(schedules_on(daemonset, labels) for labels in all_nodes())


def test_the_largest_allowed_groups_keep_the_affinity_small() -> None:
    """4 groups of 4 requirements: the default DaemonSet's NOT of all of them is 4^4 terms, no more."""
    selector = {
        "matchLabels": {"rp.io/a": "x", "rp.io/b": "y"},
        "matchExpressions": [
            {"key": "rp.io/c", "operator": "In", "values": ["x"]},
            {"key": "rp.io/d", "operator": "Exists"},
        ],
    }
    groups = [{"name": f"g{i}", "nodeSelector": selector} for i in range(4)]
    daemonsets = of_kind(render({"groups": groups}), "DaemonSet")
    default = next(ds for ds in daemonsets if ds["metadata"]["labels"]["runtimeproxy.io/group"] == "default")
    terms = pod_spec(default)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert len(terms["nodeSelectorTerms"]) == 4**4
    too_many = run_helm("template", "rp", str(CHART), values={"groups": [*groups, {**groups[0], "name": "g4"}]})
    assert too_many.returncode != 0
    assert "at '/groups'" in too_many.stderr
