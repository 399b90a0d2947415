"""The gpu plugin (hooks/plugins/gpu.py): the device-allocated annotation read as Go's
encoding/json reads it, and NVIDIA_VISIBLE_DEVICES in the CreateContainer answer, through PluginRunner."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.plugins import gpu
from runtimeproxy.hooks.policy import DEFAULT_POLICY, Policy
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.sdk import ContainerInfo, HookPoint, PodInfo, ServerContext
from runtimeproxy.hooks.testkit import policy_from
from structlog.testing import capture_logs

ANNOTATION = gpu.DEVICE_ALLOCATED_ANNOTATION
CREATE = HookPoint.PRE_CREATE_CONTAINER
ENABLED = "gpu: {" + ", ".join(f"{q.value}: {{enabled: true}}" for q in QoSClass) + "}"
INT32_MAX = (1 << 31) - 1

assert gpu.plugin.settings_spec is not None
SPEC = gpu.plugin.settings_spec


def minors(text: str) -> tuple[tuple[int, ...] | None, str]:
    return gpu.gpu_minors({ANNOTATION: text})


# --- the annotation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        # Koordinator's own cases (gpu_test.go, device_share_test.go).
        ('{"gpu": [{"minor": 0},{"minor": 1}]}', (0, 1)),
        ('{"fpga": [{"minor": 0},{"minor": 1}]}', ()),
        (
            '{"gpu":[{"minor":1,"id": "0000:08.00.0","resources":{"koordinator.sh/gpu-core":"100",'
            '"koordinator.sh/gpu-memory":"16Gi","koordinator.sh/gpu-memory-ratio":"100"}}]}',
            (1,),
        ),
        # Go's decoding rules.
        ("null", ()),
        ('{"gpu": null}', ()),
        ('{"gpu": []}', ()),
        ('{"gpu": [{}]}', (0,)),  # minor absent: 0
        ('{"gpu": [{"MINOR": 3}, {"Minor": 2}]}', (3, 2)),  # field names case-insensitive
        ('{"gpu": [{"minor": 3, "minor": null}]}', (3,)),  # null leaves an int as it was
        ('{"gpu": [{"minor": 3, "minor": 4}]}', (4,)),
        ('{"gpu": [{"minor": 1}], "gpu": [{"minor": 5}]}', (5,)),  # a map key twice: the last wins
        ('{"GPU": [{"minor": 1}]}', ()),  # map keys match exactly
        ('{"gpu": [{"minor": -1, "other": [1, {"x": 2}]}]}', (-1,)),  # unknown keys ignored
        ('{"gpu": [{"minor": 2, "resources": {"koordinator.sh/gpu-core": 100, "x": null}}]}', (2,)),
        ('{"rdma": [null], "gpu": [{"minor": 7}]}', (7,)),  # a null entry elsewhere is fine
        ('{"gpu": [{"minor": 0, "extension": {"vfs": [{"minor": 1, "busID": "0000:1f:00.1"}, null]}}]}', (0,)),
        (f'{{"gpu": [{{"minor": {INT32_MAX}}}]}}', (INT32_MAX,)),
    ],
)
def test_allocations_are_read_as_go_reads_them(text: str, wanted: tuple[int, ...]) -> None:
    assert minors(text) == (wanted, "")


def test_no_annotation_asks_nothing() -> None:
    assert gpu.gpu_minors({}) == (None, "")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not JSON"),
        ("{gpu: [0]}", "not JSON"),
        ('{"gpu": [{"minor": NaN}]}', "NaN is not JSON"),
        ('["gpu"]', "the annotation must be an object, got an array"),
        ('{"gpu": {"minor": 0}}', "gpu must be an array, got an object"),
        ('{"gpu": [0]}', "gpu[0] must be an object, got a number"),
        ('{"gpu": [null]}', "gpu[0] is null"),
        ('{"gpu": [{"minor": 1.0}]}', "gpu[0].minor must be an integer"),
        ('{"gpu": [{"minor": 1e0}]}', "gpu[0].minor must be an integer"),
        ('{"gpu": [{"minor": "1"}]}', "gpu[0].minor must be an integer, got a string"),
        ('{"gpu": [{"minor": true}]}', "gpu[0].minor must be an integer, got a boolean"),
        (f'{{"gpu": [{{"minor": {INT32_MAX + 1}}}]}}', "gpu[0].minor: 2147483648 is out of range"),
        ('{"gpu": [{"minor": 0, "id": 7}]}', "gpu[0].id must be a string"),
        ('{"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "lots"}}]}', "not a quantity"),
        ('{"gpu": [{"minor": 0, "resources": []}]}', "gpu[0].resources must be an object"),
        ('{"gpu": [{"minor": 0, "extension": {"vfs": {}}}]}', "gpu[0].extension.vfs must be an array"),
        ('{"gpu": [{"minor": 0, "extension": {"vfs": [{"busID": 1}]}}]}', "vfs[0].busID must be a string"),
        # An error in another device type drops the whole annotation, as in Go.
        ('{"gpu": [{"minor": 0}], "rdma": [{"minor": "x"}]}', "rdma[0].minor must be an integer"),
        ('{"gpu": [{"minor": 0}], "gpu": 3}', "gpu must be an array"),  # a decoded-then-replaced key still counts
        ("[" * 100_000, ""),  # too deep for Python's parser: refused, not raised
    ],
)
def test_malformed_allocations_are_refused_with_a_reason(text: str, reason: str) -> None:
    found, problem = minors(text)
    assert found is None
    assert problem.startswith(f"annotation {ANNOTATION} ignored: ") and reason in problem


_MINOR = st.integers(-(1 << 31), INT32_MAX)
_QUANTITY = st.sampled_from(["100", "16Gi", "50", "0", "1.5", "500m", "1e3"]) | st.integers(0, 10**6)
_ENTRY = st.fixed_dictionaries(
    {"minor": _MINOR},
    optional={
        "resources": st.dictionaries(st.text(max_size=20), _QUANTITY, max_size=3),
        "id": st.text(max_size=12),
    },
)
_ALLOCATION = st.fixed_dictionaries(
    {"gpu": st.lists(_ENTRY, max_size=6)},
    optional={"rdma": st.lists(_ENTRY | st.none(), max_size=3), "fpga": st.lists(_ENTRY, max_size=2)},
)


@given(_ALLOCATION, st.sampled_from(["minor", "Minor", "MINOR"]))
def test_any_valid_allocation_gives_its_gpu_minors_in_order(allocation: dict[str, Any], field_name: str) -> None:
    for entry in allocation["gpu"]:
        entry[field_name] = entry.pop("minor")
    assert minors(json.dumps(allocation)) == (tuple(entry[field_name] for entry in allocation["gpu"]), "")


# Finite floats only: json.dumps writes an infinite one as Infinity, which is no JSON at all
# (the next test covers that).
_NO_INT32 = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5), st.booleans(), st.lists(st.integers())
)


@given(_ALLOCATION, _NO_INT32)
def test_any_minor_that_is_no_int32_refuses_the_whole_annotation(allocation: dict[str, Any], bad: Any) -> None:
    allocation["gpu"].append({"minor": bad})
    found, problem = minors(json.dumps(allocation))
    assert found is None and f"gpu[{len(allocation['gpu']) - 1}].minor" in problem


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_minor_written_as_infinity_or_nan_is_refused_as_no_json(bad: float) -> None:
    found, problem = minors(json.dumps({"gpu": [{"minor": bad}]}))
    assert found is None and "is not JSON" in problem


@given(st.text(max_size=200))
def test_any_text_gets_minors_or_a_reason(text: str) -> None:
    found, problem = minors(text)
    assert (found is None) == bool(problem)
    assert found is None or all(-(1 << 31) <= minor <= INT32_MAX for minor in found)


# --- the hook ----------------------------------------------------------------------------------


@pytest.fixture
def make_runner(runners: list[PluginRunner]) -> Any:

    def make(policy: str = ENABLED) -> PluginRunner:
        current: Policy = policy_from(policy) if policy else DEFAULT_POLICY
        runner = PluginRunner(
            [gpu.plugin], context=ServerContext(cgroups=None, policy=lambda: current), registry=CollectorRegistry()
        )
        runners.append(runner)
        return runner

    return make


def make_pod(annotation: str | None, qos: str = "LS", labels: dict[str, str] | None = None) -> PodInfo:
    return PodInfo(
        name="trainer",
        namespace="default",
        uid="u-1",
        labels=MappingProxyType({"koordinator.sh/qosClass": qos, **(labels or {})}),
        annotations=MappingProxyType({ANNOTATION: annotation} if annotation is not None else {}),
    )


ALLOCATED = '{"gpu": [{"minor": 2}, {"minor": 0}]}'


@pytest.mark.parametrize("qos", [q.value for q in QoSClass])
async def test_every_container_of_the_pod_gets_the_visible_devices(make_runner: Any, qos: str) -> None:
    runner = make_runner()
    for name in ("app", "sidecar"):
        result = await runner.run(CREATE, pod=make_pod(ALLOCATED, qos), container=ContainerInfo(name=name))
        assert result.failures == [] and result.applied == ["gpu"]
        assert result.response.env.items() == [("NVIDIA_VISIBLE_DEVICES", "2,0")]


def test_the_default_policy_switches_it_off_for_every_class() -> None:
    assert [q for q in QoSClass if DEFAULT_POLICY.section(SPEC).for_class(q).enabled] == []


async def test_switched_off_the_plugin_is_not_called(make_runner: Any) -> None:
    runner = make_runner("gpu: {LS: {enabled: true}}")
    off = await runner.run(CREATE, pod=make_pod(ALLOCATED, "BE"), container=ContainerInfo(name="app"))
    assert off.applied == [] and off.response.is_empty()
    on = await runner.run(CREATE, pod=make_pod(ALLOCATED, "LS"), container=ContainerInfo(name="app"))
    assert on.response.env.items() == [("NVIDIA_VISIBLE_DEVICES", "2,0")]


@pytest.mark.parametrize("annotation", [None, "null", '{"gpu": []}', '{"rdma": [{"minor": 1}]}'])
async def test_no_gpu_allocated_sets_nothing(make_runner: Any, annotation: str | None) -> None:
    with capture_logs() as logs:
        result = await make_runner().run(CREATE, pod=make_pod(annotation), container=ContainerInfo(name="app"))
    assert result.failures == [] and result.response.is_empty()
    assert [entry for entry in logs if entry.get("log_level") == "warning"] == []


async def test_a_malformed_annotation_is_logged_and_the_container_starts(make_runner: Any) -> None:
    with capture_logs() as logs:
        result = await make_runner().run(
            CREATE, pod=make_pod('{"gpu": [{"minor": "0"}]}'), container=ContainerInfo(name="app")
        )
    assert result.failures == [] and result.applied == ["gpu"] and result.response.is_empty()
    [warning] = [entry for entry in logs if entry.get("plugin") == "gpu"]
    assert warning["log_level"] == "warning" and "gpu[0].minor must be an integer" in warning["error"]


async def test_hami_core_pods_get_the_devices_and_a_warning_for_what_is_not_done(make_runner: Any) -> None:
    labels = {gpu.GPU_ISOLATION_PROVIDER_LABEL: "HAMi-core"}
    annotation = '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"16Gi"}}]}'
    with capture_logs() as logs:
        result = await make_runner().run(
            CREATE, pod=make_pod(annotation, labels=labels), container=ContainerInfo(name="app")
        )
    assert result.response.env.items() == [("NVIDIA_VISIBLE_DEVICES", "1")]
    [warning] = [entry for entry in logs if entry.get("plugin") == "gpu"]
    assert "bind mounts" in warning["event"]
