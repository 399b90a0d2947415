"""What the runtime's NRI carries, told at Configure (hooks/nri/runtime_features.py), and what the
plugin does with it: the OOM score in the CreateContainer adjustment from NRI 0.7 on (else written
at PostStartContainer, hooks/nri/oom.py), and a Synchronize in parts (hooks/nri/sync_parts.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.nri.mapping import container_adjustment
from runtimeproxy.hooks.nri.modes import EVENT_POINTS, event_mask
from runtimeproxy.hooks.nri.nri_metrics import NriMetrics
from runtimeproxy.hooks.nri.oom import adjusted_score
from runtimeproxy.hooks.nri.runtime_features import NRI_0_6, RuntimeNri
from runtimeproxy.hooks.nri.service import NriHooks
from runtimeproxy.hooks.nri.sync_parts import SyncParts
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.sdk import HookResponse, Plugin
from test_nri_mapping import call, nri_container, nri_pod

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri
from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint

# ConfigureRequest as each NRI sends it: containerd 1.7.24 (NRI 0.6.1) and containerd 2.1.9
# (NRI 0.8.0, its default registration and request timeouts of 5 s and 2 s in milliseconds).
CONFIGURE_0_6 = nri.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24~ds1")
CONFIGURE_0_8 = nri.ConfigureRequest(
    runtime_name="containerd", runtime_version="2.1.9+unknown", registration_timeout=5000, request_timeout=2000
)
timeouts = st.integers(min_value=0, max_value=2**63 - 1)


# -- the version decision ---------------------------------------------------------------------------------


def test_the_timeouts_on_the_wire_tell_nri_0_7_and_later() -> None:
    # field 4 (registration_timeout) and 5 (request_timeout), varints, as NRI 0.7+ encodes them
    from_0_8 = nri.ConfigureRequest.FromString(b"\x12\x0acontainerd\x20\x88\x27\x28\xd0\x0f")
    assert RuntimeNri.of(from_0_8) == RuntimeNri("containerd", "", nri_0_7=True)
    assert RuntimeNri.of(from_0_8).oom_in_adjustment and RuntimeNri.of(from_0_8).described == "0.7+"
    assert not RuntimeNri.of(CONFIGURE_0_6).oom_in_adjustment and RuntimeNri.of(CONFIGURE_0_6).described == "0.6"
    assert RuntimeNri.of(nri.ConfigureRequest()) == NRI_0_6


@given(st.text(), st.text(), timeouts, timeouts)
def test_only_the_timeouts_decide_never_the_name_or_version(
    name: str, version: str, registration: int, request: int
) -> None:
    message = nri.ConfigureRequest(
        runtime_name=name, runtime_version=version, registration_timeout=registration, request_timeout=request
    )
    runtime = RuntimeNri.of(nri.ConfigureRequest.FromString(message.SerializeToString()))
    assert (runtime.name, runtime.version) == (name, version)
    assert runtime.oom_in_adjustment == (registration > 0 or request > 0)


# -- the OOM score in the adjustment ----------------------------------------------------------------------

scores = st.integers(min_value=-1000, max_value=1000)


@given(st.none() | scores, scores)
def test_the_adjusted_score_only_ever_raises(current: int | None, target: int) -> None:
    value = adjusted_score(current, target)
    if current is None or target > current:
        assert value == target
    else:
        assert value is None


@given(st.integers().filter(lambda v: not -1000 <= v <= 1000), st.none() | scores)
def test_a_score_outside_the_kernels_range_is_refused(target: int, current: int | None) -> None:
    with pytest.raises(ValueError, match=r"outside -1000\.\.1000"):
        adjusted_score(current, target)


def oom_answer(value: int) -> HookResponse:
    response = HookResponse(HookKind.CONTAINER)
    response.resources.oom_score_adj = value
    return response


def created(oom_score_adj: int | None) -> Any:
    container = nri.Container(id="c1", name="app")
    if oom_score_adj is not None:
        container.linux.oom_score_adj.value = oom_score_adj
    return container


@given(st.none() | scores, scores.filter(bool), st.booleans())
def test_the_adjustment_carries_the_score_only_for_nri_0_7_and_only_raised(
    current: int | None, target: int, in_adjustment: bool
) -> None:
    adjust, not_applied = container_adjustment(oom_answer(target), created(current), oom_in_adjustment=in_adjustment)
    carried = adjust.linux.HasField("oom_score_adj")
    assert carried == (in_adjustment and (current is None or target > current))
    if carried:
        assert adjust.linux.oom_score_adj.value == target
    assert not not_applied


def test_an_out_of_range_score_is_not_applied_with_the_reason() -> None:
    adjust, not_applied = container_adjustment(oom_answer(1001), created(0), oom_in_adjustment=True)
    assert not adjust.linux.HasField("oom_score_adj")
    assert not_applied.fields == [("resources.oom_score_adj", "oom_score_adj 1001 is outside -1000..1000")]


def test_the_adjustment_reaches_the_runtime_as_field_4_of_the_linux_adjustment() -> None:
    adjust, _ = container_adjustment(oom_answer(1000), created(500), oom_in_adjustment=True)
    # ContainerAdjustment.linux (6) -> LinuxContainerAdjustment.oom_score_adj (4) -> OptionalInt.value (1)
    assert adjust.SerializeToString() == b"\x32\x05\x22\x03\x08\xe8\x07"


@given(st.sets(st.sampled_from(list(HookPoint))))
def test_with_nri_0_7_post_start_is_subscribed_only_when_a_plugin_runs_there(points: set[HookPoint]) -> None:
    mask = event_mask(points, oom_at_start=False)
    for event, run in EVENT_POINTS.items():
        assert bool(mask & (1 << (event - 1))) == bool(set(run) & points)


# -- the service, configured by each runtime --------------------------------------------------------------


def memory_plugin() -> Plugin:
    plugin = Plugin("oom", version="1", failure_policy="ignore", timeout=5.0)

    @plugin.on(HookPoint.PRE_CREATE_CONTAINER)
    async def raise_score(*, response: HookResponse, **kwargs: Any) -> None:
        response.resources.oom_score_adj = 1000

    return plugin


def create_request(oom_score_adj: int) -> Any:
    container = nri_container()
    container.linux.oom_score_adj.value = oom_score_adj
    return nri.CreateContainerRequest(pod=nri_pod(), container=container)


async def configured(request: Any) -> tuple[NriHooks, int]:
    hooks = NriHooks(PluginRunner([memory_plugin()], registry=CollectorRegistry()), NriMetrics(CollectorRegistry()))
    answer = nri.ConfigureResponse.FromString(await call(hooks, "Configure", request))
    return hooks, answer.events


async def test_on_nri_0_8_the_score_is_in_the_adjustment_and_nothing_waits_for_the_start() -> None:
    hooks, events = await configured(CONFIGURE_0_8)
    assert events == 1 << (nri.CREATE_CONTAINER - 1)  # no PostStartContainer
    answer = nri.CreateContainerResponse.FromString(await call(hooks, "CreateContainer", create_request(500)))
    assert answer.adjust.linux.oom_score_adj.value == 1000
    assert len(hooks.oom) == 0


async def test_on_nri_0_6_the_score_waits_for_the_start_as_before() -> None:
    hooks, events = await configured(CONFIGURE_0_6)
    assert events == (1 << (nri.CREATE_CONTAINER - 1)) | (1 << (nri.POST_START_CONTAINER - 1))
    answer = nri.CreateContainerResponse.FromString(await call(hooks, "CreateContainer", create_request(500)))
    assert not answer.adjust.linux.HasField("oom_score_adj")
    assert hooks.oom.forget("c1") == 1000


async def test_a_score_already_as_high_is_neither_adjusted_nor_remembered() -> None:
    hooks, _ = await configured(CONFIGURE_0_8)
    answer = nri.CreateContainerResponse.FromString(await call(hooks, "CreateContainer", create_request(1000)))
    assert not answer.adjust.linux.HasField("oom_score_adj") and len(hooks.oom) == 0


async def test_a_reconnection_to_an_older_runtime_goes_back_to_the_start_path() -> None:
    hooks, _ = await configured(CONFIGURE_0_8)
    await call(hooks, "Configure", CONFIGURE_0_6)
    answer = nri.CreateContainerResponse.FromString(await call(hooks, "CreateContainer", create_request(500)))
    assert not answer.adjust.linux.HasField("oom_score_adj") and len(hooks.oom) == 1


# -- Synchronize in parts ---------------------------------------------------------------------------------


def pod(n: int) -> Any:
    return nri.PodSandbox(id=f"sb{n}", name=f"p{n}", namespace="ns")


def container(n: int) -> Any:
    return nri.Container(id=f"c{n}", pod_sandbox_id=f"sb{n}", name="app", state=nri.CONTAINER_RUNNING)


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=5))
def test_parts_give_back_the_whole_state_in_order(sizes: list[tuple[int, int]]) -> None:
    parts, pods, containers = SyncParts(), 0, 0
    whole = None
    for i, (more_pods, more_containers) in enumerate(sizes):
        last = i == len(sizes) - 1
        request = nri.SynchronizeRequest(
            pods=[pod(n) for n in range(pods, pods + more_pods)],
            containers=[container(n) for n in range(containers, containers + more_containers)],
            more=not last,
        )
        pods, containers = pods + more_pods, containers + more_containers
        whole = parts.add(request)
        assert (whole is None) != last
    assert whole is not None and len(parts) == 0
    assert [p.id for p in whole.pods] == [f"sb{n}" for n in range(pods)]
    assert [c.id for c in whole.containers] == [f"c{n}" for n in range(containers)]


async def test_a_split_synchronize_is_answered_more_until_its_last_part() -> None:
    got: list[Any] = []
    hooks, _ = await configured(CONFIGURE_0_8)
    hooks.on_synchronize = lambda pods, containers: got.append((pods, containers))
    first = nri.SynchronizeRequest(pods=[pod(1), pod(2)], containers=[container(1)], more=True)
    assert nri.SynchronizeResponse.FromString(await call(hooks, "Synchronize", first)) == nri.SynchronizeResponse(
        more=True
    )
    assert got == []  # nothing handed on before the whole state is in
    last = nri.SynchronizeRequest(containers=[container(2)])
    answer = nri.SynchronizeResponse.FromString(await call(hooks, "Synchronize", last))
    assert not answer.more
    [(pods, containers)] = got
    assert [p.sandbox_id for p in pods] == ["sb1", "sb2"]
    assert {sandbox: [c.id for c in held] for sandbox, held in containers.items()} == {"sb1": ["c1"], "sb2": ["c2"]}


async def test_parts_of_a_connection_that_ended_are_dropped_at_the_next_configure() -> None:
    got: list[Any] = []
    hooks, _ = await configured(CONFIGURE_0_8)
    hooks.on_synchronize = lambda pods, containers: got.append(pods)
    await call(hooks, "Synchronize", nri.SynchronizeRequest(pods=[pod(1)], more=True))
    await call(hooks, "Configure", CONFIGURE_0_8)  # the runtime came back
    await call(hooks, "Synchronize", nri.SynchronizeRequest(pods=[pod(2)]))
    assert [[p.sandbox_id for p in pods] for pods in got] == [["sb2"]]


def test_split_synchronize_without_end_is_refused_not_held() -> None:
    """A runtime sending parts without end cannot grow the plugin's memory past the bound."""
    from runtimeproxy.hooks.nri import sync_parts

    from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb

    parts = sync_parts.SyncParts()
    chunk = [nri_pb.PodSandbox(id=str(i)) for i in range(1000)]
    with pytest.raises(sync_parts.SyncTooLarge, match="refused"):
        for _ in range(sync_parts.MAX_HELD // 1000 + 1):
            parts.add(nri_pb.SynchronizeRequest(pods=chunk, more=True))
    assert len(parts) == 0
