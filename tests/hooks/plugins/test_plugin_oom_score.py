"""oom_score_adj from Koordinator's pod annotations (hooks/plugins/oom_score.py) and the memory
plugin's use of it at PreCreateContainer (switch ``memory.<class>.pod_oom_score_adj``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.plugins import memory
from runtimeproxy.hooks.plugins.oom_score import (
    OOM_SCORE_ADJ_ANNOTATION as POD_WIDE,
)
from runtimeproxy.hooks.plugins.oom_score import (
    OOM_SCORE_ADJ_SPEC_ANNOTATION as SPEC,
)
from runtimeproxy.hooks.plugins.oom_score import (
    oom_score_adj_for,
)
from runtimeproxy.hooks.sdk import HookPoint, Resources
from runtimeproxy.hooks.testkit import container, pod, run_plugin
from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1
from structlog.testing import capture_logs

CREATE = HookPoint.PRE_CREATE_CONTAINER
ON = "memory:\n  LS: {pod_oom_score_adj: true}\n  BE: {pod_oom_score_adj: true}\n"

# --- reading the annotations (pure) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, None),
        ({SPEC: '{"app": -500}'}, -500),
        ({SPEC: '{"other": 3}', POD_WIDE: "7"}, 7),  # not in the spec: the pod-wide value
        ({SPEC: '{"app": 3}', POD_WIDE: "7"}, 3),  # the spec wins
        ({SPEC: '{"app": 1, "app": 2}'}, 2),  # Go: the last duplicate wins
        ({SPEC: '{"APP": 1}', POD_WIDE: "4"}, 4),  # map keys are case-sensitive
        ({SPEC: '{"app": null}'}, 0),  # Go decodes null into a new int64 element as 0
        ({SPEC: "null", POD_WIDE: "9"}, 9),  # null: an empty map
        ({SPEC: "", POD_WIDE: "+12"}, 12),  # empty counts as absent; ParseInt takes a sign
        ({POD_WIDE: ""}, None),
        ({POD_WIDE: "-1000"}, -1000),
        ({POD_WIDE: "1000"}, 1000),
    ],
)
def test_koordinators_rules(annotations: dict[str, str], expected: int | None) -> None:
    assert oom_score_adj_for(annotations, "app") == (expected, "")


@pytest.mark.parametrize(
    ("annotations", "reason"),
    [
        ({SPEC: "{", POD_WIDE: "5"}, f"annotation {SPEC} ignored: not JSON"),  # no fallback to the pod-wide value
        ({SPEC: "[1]"}, "must be a JSON object"),
        ({SPEC: '{"app": 1.0}'}, "1.0 is not an integer"),
        ({SPEC: '{"app": 1e3}'}, "1e3 is not an integer"),
        ({SPEC: '{"app": "5"}'}, "'app' must map to an integer"),
        ({SPEC: '{"other": true}'}, "'other' must map to an integer"),  # any bad entry refuses the whole map
        ({SPEC: '{"app": NaN}'}, "NaN is not JSON"),
        ({SPEC: '{"app": 9223372036854775808}'}, "out of the int64 range"),
        ({POD_WIDE: " 5"}, f"annotation {POD_WIDE} ignored"),
        ({POD_WIDE: "5.0"}, "is not an integer"),
        ({POD_WIDE: "1_000"}, "is not an integer"),
        ({POD_WIDE: "0x10"}, "is not an integer"),
        ({POD_WIDE: "1001"}, "oom_score_adj 1001 is out of range [-1000, 1000]: skipped"),
        ({SPEC: '{"app": -1001}'}, "oom_score_adj -1001 is out of range"),
    ],
)
def test_refused_annotations_say_why(annotations: dict[str, str], reason: str) -> None:
    value, problem = oom_score_adj_for(annotations, "app")
    assert value is None
    assert reason in problem


@given(st.dictionaries(st.text(max_size=8), st.integers(-(2**63), 2**63 - 1), max_size=4), st.text(max_size=8))
def test_any_valid_spec_gives_the_containers_entry(spec: dict[str, int], name: str) -> None:
    value, problem = oom_score_adj_for({SPEC: json.dumps(spec)}, name)
    wanted = spec.get(name)
    if wanted is None or -1000 <= wanted <= 1000:
        assert (value, problem) == (wanted, "")
    else:
        assert value is None and "out of range" in problem


@given(st.text(max_size=30))
def test_any_text_has_a_defined_outcome(text: str) -> None:
    for given_annotations in ({SPEC: text}, {POD_WIDE: text}):
        value, problem = oom_score_adj_for(given_annotations, "app")  # never raises
        assert problem == "" or value is None  # refused: no value
        assert value is None or -1000 <= value <= 1000


# --- the memory plugin ---------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> FakeCgroup:
    """The memory plugin needs a cgroup handle: a fake v1 tree."""
    return make_fake_cgroup_v1(tmp_path / "cgroup")


async def create(tree: FakeCgroup, qos: str, annotations: dict[str, str], current: int, policy: str = ON) -> int:
    result = await run_plugin(
        memory.plugin,
        CREATE,
        pod=pod(qos=qos, annotations=annotations),
        container=container("app", resources=Resources(oom_score_adj=current)),
        cgroups=tree,
        policy=policy,
    )
    assert result.failures == [] and result.applied == ["memory"]
    return result.response.resources.oom_score_adj


async def test_off_by_default_as_koordlets_gate(tree: FakeCgroup) -> None:
    assert await create(tree, "LS", {POD_WIDE: "-500"}, 900, policy="") == 0  # kubelet's 900 stays
    assert await create(tree, "BE", {POD_WIDE: "-500"}, 500, policy="") == 1000  # only BE's own rule


@pytest.mark.parametrize("qos", ["LS", "BE"])
async def test_the_annotation_wins_over_kubelet_and_bes_rule(tree: FakeCgroup, qos: str) -> None:
    assert await create(tree, qos, {SPEC: '{"app": -300}'}, 900) == -300
    assert await create(tree, qos, {POD_WIDE: "250"}, 900) == 250


async def test_same_value_as_kubelets_is_not_answered(tree: FakeCgroup) -> None:
    assert await create(tree, "LS", {POD_WIDE: "900"}, 900) == 0


async def test_without_an_annotation_bes_rule_applies(tree: FakeCgroup) -> None:
    assert await create(tree, "BE", {}, 500) == 1000
    assert await create(tree, "LS", {}, 500) == 0


@pytest.mark.parametrize(
    ("annotations", "event", "reason"),
    [
        ({POD_WIDE: "abc"}, "oom_score_adj annotation not used", "is not an integer"),
        ({POD_WIDE: "-2000"}, "oom_score_adj annotation not used", "out of range"),
    ],
)
async def test_a_refused_annotation_is_logged_and_bes_rule_applies(
    tree: FakeCgroup, annotations: dict[str, str], event: str, reason: str
) -> None:
    with capture_logs() as logs:
        assert await create(tree, "BE", annotations, 500) == 1000
        assert await create(tree, "LS", annotations, 500) == 0
    warnings = [r for r in logs if r["event"] == event]
    assert len(warnings) == 2 and all(reason in r["reason"] for r in warnings)


async def test_zero_cannot_be_answered_and_is_logged(tree: FakeCgroup) -> None:
    with capture_logs() as logs:
        assert await create(tree, "LS", {POD_WIDE: "0"}, 900) == 0
    assert [r["kept"] for r in logs if r["event"].startswith("oom_score_adj 0 cannot be set")] == [900]


async def test_only_at_creation(tree: FakeCgroup) -> None:
    result = await run_plugin(
        memory.plugin,
        HookPoint.PRE_UPDATE_CONTAINER_RESOURCES,
        pod=pod(qos="LS", annotations={POD_WIDE: "5"}),
        container=container("app", id="c1", resources=Resources(oom_score_adj=900)),
        cgroups=tree,
        policy=ON,
    )
    assert result.applied == ["memory"]
    assert result.response.resources.oom_score_adj == 0
