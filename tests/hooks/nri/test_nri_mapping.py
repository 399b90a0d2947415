"""NRI data as the plugins see it, their answers as NRI adjustments, the mode table, and the Plugin
service driving the plugin runner (hooks/nri/mapping.py, modes.py, service.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.nri.mapping import (
    container_adjustment,
    container_from_nri,
    pod_from_nri,
    pod_response_not_applied,
    resources_update,
)
from runtimeproxy.hooks.nri.modes import EVENT_POINTS, NOT_IN_NRI, event_mask, events_for, mode_lines, modes_of
from runtimeproxy.hooks.nri.nri_metrics import NriMetrics
from runtimeproxy.hooks.nri.rpc import RpcError, StatusCode
from runtimeproxy.hooks.nri.service import NriHooks
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.sdk import HookResponse, Plugin

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri
from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint

MiB = 1 << 20


def nri_pod(**labels: str) -> Any:
    pod = nri.PodSandbox(id="sb1", name="web", uid="u1", namespace="ns", labels=labels, runtime_handler="runc")
    pod.annotations["a"] = "b"
    pod.linux.cgroup_parent = "/kubepods/besteffort/podu1"
    pod.linux.pod_resources.cpu.shares.value = 2
    pod.linux.pod_resources.memory.limit.value = 64 * MiB
    return pod


def nri_container() -> Any:
    container = nri.Container(id="c1", pod_sandbox_id="sb1", name="app", env=["PATH=/bin", "A=1=2", "NOVALUE"])
    container.annotations["k"] = "v"
    resources = container.linux.resources
    resources.cpu.shares.value = 512
    resources.cpu.quota.value = -1
    resources.cpu.period.value = 100_000
    resources.cpu.cpus = "0-1"
    resources.memory.limit.value = 128 * MiB
    resources.memory.swap.value = 128 * MiB
    resources.hugepage_limits.add(page_size="2MB", limit=4 * MiB)
    resources.unified["memory.high"] = "max"
    container.linux.oom_score_adj.value = 1000
    return container


# -- NRI -> plugin view ----------------------------------------------------------------------------------


def test_pod_and_container_as_the_plugins_see_them() -> None:
    pod = pod_from_nri(nri_pod(app="web"))
    assert (pod.name, pod.namespace, pod.uid, pod.sandbox_id, pod.attempt) == ("web", "ns", "u1", "sb1", 0)
    assert dict(pod.labels) == {"app": "web"} and dict(pod.annotations) == {"a": "b"}
    assert pod.cgroup_parent == "/kubepods/besteffort/podu1" and pod.runtime_handler == "runc"
    assert pod.resources is not None and pod.resources.cpu_shares == 2
    assert pod.resources.memory_limit_in_bytes == 64 * MiB
    assert pod.overhead is None  # not sent: unknown, not zero
    container = container_from_nri(nri_container())
    assert (container.name, container.id, dict(container.annotations)) == ("app", "c1", {"k": "v"})
    assert container.env == (("PATH", "/bin"), ("A", "1=2"), ("NOVALUE", ""))
    res = container.resources
    assert res is not None
    assert (res.cpu_shares, res.cpu_quota, res.cpu_period, res.cpuset_cpus) == (512, -1, 100_000, "0-1")
    assert (res.memory_limit_in_bytes, res.memory_swap_limit_in_bytes, res.oom_score_adj) == (128 * MiB,) * 2 + (1000,)
    assert [(h.page_size, h.limit) for h in res.hugepage_limits] == [("2MB", 4 * MiB)]
    assert dict(res.unified) == {"memory.high": "max"}


def test_new_resources_replace_the_containers_own_at_an_update() -> None:
    new = nri.LinuxResources()
    new.cpu.shares.value = 4
    container = container_from_nri(nri_container(), new)
    assert container.resources is not None
    assert container.resources.cpu_shares == 4 and container.resources.cpu_quota == 0
    assert container.resources.oom_score_adj == 1000
    assert container_from_nri(nri.Container(name="bare")).resources is None


# -- answers -> NRI ----------------------------------------------------------------------------------------


def test_a_create_answer_becomes_an_adjustment_with_only_the_set_fields() -> None:
    response = HookResponse(HookKind.CONTAINER)
    response.env.set("RTPX_QOS", "BE")
    response.annotations["x"] = "y"
    response.resources.cpu_quota = 50_000
    response.resources.cpu_shares = 256
    response.resources.cpuset_cpus = "1"
    response.resources.unified["cpu.idle"] = "1"
    adjust, not_applied = container_adjustment(response)
    assert not not_applied
    assert [(kv.key, kv.value) for kv in adjust.env] == [("RTPX_QOS", "BE")]
    assert dict(adjust.annotations) == {"x": "y"}
    cpu = adjust.linux.resources.cpu
    assert (cpu.quota.value, cpu.shares.value, cpu.cpus) == (50_000, 256, "1")
    assert not cpu.HasField("period") and not adjust.linux.resources.HasField("memory")
    assert dict(adjust.linux.resources.unified) == {"cpu.idle": "1"}
    assert not container_adjustment(HookResponse(HookKind.CONTAINER))[0].HasField("linux")


def test_what_nri_cannot_carry_is_listed_never_dropped_silently() -> None:
    response = HookResponse(HookKind.CONTAINER)
    response.resources.oom_score_adj = 1000
    response.resources.memory_swap_limit_in_bytes = 256 * MiB
    response.env.set("-PATH", "x")  # NRI would remove PATH
    response.env.set("RAW", b"\xff".decode("utf-8", "surrogateescape"))
    response.annotations["-keep"] = "x"
    response.cgroup_parent = "/kubepods/other"
    adjust, not_applied = container_adjustment(response)
    assert sorted(not_applied.names()) == sorted(
        [  # the OOM score is not among them: written to the started process (test_nri_oom.py)
            "resources.memory_swap_limit_in_bytes",
            "env[-PATH]",
            "env[RAW]",
            "annotations[-keep]",
            "cgroup_parent",
        ]
    )
    assert not adjust.env and not adjust.annotations and not adjust.HasField("linux")


def test_an_update_answer_updates_the_container_itself() -> None:
    response = HookResponse(HookKind.CONTAINER)
    response.resources.cpu_quota = 20_000
    response.env.set("A", "1")
    response.resources.oom_score_adj = 1000
    updates, not_applied = resources_update("c1", response)
    assert [(u.container_id, u.linux.resources.cpu.quota.value) for u in updates] == [("c1", 20_000)]
    assert not_applied.names() == ["resources.oom_score_adj", "env[A]"]
    assert resources_update("c1", HookResponse(HookKind.CONTAINER))[0] == []


def test_pod_answers_are_notifications_in_nri() -> None:
    response = HookResponse(HookKind.POD)
    response.labels["l"] = "1"
    response.resources.cpu_shares = 5
    assert pod_response_not_applied(response).names() == ["labels[l]", "resources"]
    assert not pod_response_not_applied(HookResponse(HookKind.POD))


# -- modes -------------------------------------------------------------------------------------------------


def test_every_hook_point_runs_at_one_nri_event_or_is_said_to_never_run() -> None:
    mapped = [point for points in EVENT_POINTS.values() for point in points]
    assert len(mapped) == len(set(mapped))
    assert set(mapped) | set(NOT_IN_NRI) == set(HookPoint)
    assert not set(mapped) & set(NOT_IN_NRI)


@given(st.sets(st.sampled_from(list(HookPoint))))
def test_the_event_mask_subscribes_exactly_the_needed_events(points: set[HookPoint]) -> None:
    mask = event_mask(points)
    assert mask != 0  # 0 would mean every event to NRI
    for event, run in EVENT_POINTS.items():
        # PreCreateContainer's OOM score is written at PostStartContainer
        oom = event == nri.POST_START_CONTAINER and HookPoint.PRE_CREATE_CONTAINER in points
        assert bool(mask & (1 << (event - 1))) == bool(set(run) & points or oom)
    assert mask < 1 << (nri.LAST - 1)  # NRI refuses bits past its events


def test_modes_of_a_plugin() -> None:
    points = {HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_POD_SANDBOX_RESOURCES}
    assert modes_of(points) == {
        "proxy": ["PreUpdatePodSandboxResources", "PreCreateContainer"],
        "nri": ["PreCreateContainer"],
        "not_in_nri": ["PreUpdatePodSandboxResources"],
    }
    assert events_for(points) == [nri.CREATE_CONTAINER, nri.POST_START_CONTAINER]
    [line] = mode_lines([("cpu", points)])
    assert line.startswith("cpu: in NRI mode PreCreateContainer; never PreUpdatePodSandboxResources (NRI up to 0.8")


# -- the Plugin service over a real runner ----------------------------------------------------------------


def make_hooks(*plugins: Plugin) -> tuple[NriHooks, CollectorRegistry]:
    registry = CollectorRegistry()
    runner = PluginRunner(plugins, registry=registry)
    return NriHooks(runner, NriMetrics(registry)), registry


def stamp_plugin(failure_policy: str = "ignore", delay: float = 0.0) -> Plugin:
    plugin = Plugin("stamp", version="1", failure_policy=failure_policy, timeout=5.0)

    @plugin.on(HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
    async def stamp(*, pod: Any, container: Any, qos: Any, response: HookResponse, **kwargs: Any) -> None:
        await asyncio.sleep(delay)
        if failure_policy == "fail":
            raise RuntimeError("boom")
        response.env.set("SEEN", f"{pod.name}/{container.name}/{qos}")
        response.resources.cpu_shares = 300

    @plugin.on(HookPoint.PRE_RUN_POD_SANDBOX)
    async def label(*, response: HookResponse, **kwargs: Any) -> None:
        response.labels["nope"] = "1"

    return plugin


async def call(hooks: NriHooks, name: str, message: Any, timeout: float | None = 2.0) -> bytes:
    method = hooks.methods()[("nri.pkg.api.v1alpha1.Plugin", name)]
    return await method(message.SerializeToString(), timeout)


async def test_configure_subscribes_the_events_of_the_enabled_plugins() -> None:
    hooks, _ = make_hooks(stamp_plugin())
    answer = nri.ConfigureResponse.FromString(await call(hooks, "Configure", nri.ConfigureRequest(runtime_name="x")))
    wanted = {nri.RUN_POD_SANDBOX, nri.CREATE_CONTAINER, nri.UPDATE_CONTAINER, nri.POST_START_CONTAINER}
    assert answer.events == sum(1 << (event - 1) for event in wanted)


async def test_create_container_runs_the_plugins_and_answers_their_adjustment() -> None:
    hooks, registry = make_hooks(stamp_plugin())
    request = nri.CreateContainerRequest(pod=nri_pod(), container=nri_container())
    answer = nri.CreateContainerResponse.FromString(await call(hooks, "CreateContainer", request))
    assert [(kv.key, kv.value) for kv in answer.adjust.env] == [("SEEN", "web/app/BE")]
    assert answer.adjust.linux.resources.cpu.shares.value == 300
    sample = registry.get_sample_value("runtimehooks_nri_events_total", {"event": "CreateContainer", "outcome": "ok"})
    assert sample == 1.0


async def test_update_container_answers_an_update_of_that_container() -> None:
    hooks, _ = make_hooks(stamp_plugin())
    request = nri.UpdateContainerRequest(pod=nri_pod(), container=nri_container())
    request.linux_resources.cpu.shares.value = 2
    answer = nri.UpdateContainerResponse.FromString(await call(hooks, "UpdateContainer", request))
    [update] = answer.update
    assert update.container_id == "c1" and update.linux.resources.cpu.shares.value == 300


async def test_pod_answers_are_counted_as_not_applied() -> None:
    hooks, registry = make_hooks(stamp_plugin())
    event = nri.StateChangeEvent(event=nri.RUN_POD_SANDBOX, pod=nri_pod())
    assert await call(hooks, "StateChange", event) == b""
    assert registry.get_sample_value("runtimehooks_nri_not_applied_total", {"field": "labels"}) == 1.0
    # an event no plugin handles runs nothing and answers at once
    assert await call(hooks, "StateChange", nri.StateChangeEvent(event=nri.REMOVE_CONTAINER, pod=nri_pod())) == b""


async def test_a_failing_fail_plugin_fails_the_runtimes_call() -> None:
    hooks, registry = make_hooks(stamp_plugin(failure_policy="fail"))
    request = nri.CreateContainerRequest(pod=nri_pod(), container=nri_container())
    with pytest.raises(RpcError) as info:
        await call(hooks, "CreateContainer", request)
    assert info.value.code == StatusCode.INTERNAL and "plugin stamp failed" in info.value.message
    labels = {"event": "CreateContainer", "outcome": "failed"}
    assert registry.get_sample_value("runtimehooks_nri_events_total", labels) == 1.0


async def test_plugins_past_nris_deadline_get_an_answer_without_changes() -> None:
    hooks, registry = make_hooks(stamp_plugin(delay=1.0))
    request = nri.CreateContainerRequest(pod=nri_pod(), container=nri_container())
    answer = nri.CreateContainerResponse.FromString(await call(hooks, "CreateContainer", request, timeout=0.2))
    assert not answer.HasField("adjust")
    labels = {"event": "CreateContainer", "outcome": "deadline"}
    assert registry.get_sample_value("runtimehooks_nri_events_total", labels) == 1.0


async def test_undecodable_requests_are_refused() -> None:
    hooks, _ = make_hooks(stamp_plugin())
    method = hooks.methods()[("nri.pkg.api.v1alpha1.Plugin", "CreateContainer")]
    with pytest.raises(RpcError) as info:
        await method(b"\xff\xff\xff", 2.0)
    assert info.value.code == StatusCode.INVALID_ARGUMENT


async def test_synchronize_hands_the_pods_to_the_reconciler_start() -> None:
    got: list[Any] = []
    hooks, _ = make_hooks(stamp_plugin())
    hooks.on_synchronize = lambda pods, containers: got.append((pods, containers))
    request = nri.SynchronizeRequest(pods=[nri_pod()], containers=[nri_container()])
    assert nri.SynchronizeResponse.FromString(await call(hooks, "Synchronize", request)) == nri.SynchronizeResponse()
    [(pods, containers)] = got
    assert [p.sandbox_id for p in pods] == ["sb1"] and [c.id for c in containers["sb1"]] == ["c1"]


def test_the_plugins_command_says_what_each_plugin_gets_in_each_mode() -> None:
    from click.testing import CliRunner
    from runtimeproxy.hooks.cli import cli

    data = json.loads(CliRunner().invoke(cli, ["plugins", "--json", "--enable", "cpu"]).output)
    [cpu] = [p for p in data["plugins"] if p["name"] == "cpu"]
    assert cpu["modes"]["not_in_nri"] == ["PreUpdatePodSandboxResources"]
    assert "PreCreateContainer" in cpu["modes"]["nri"] and cpu["modes"]["proxy"] == cpu["hooks"]
    table = CliRunner().invoke(cli, ["plugins", "--enable", "cpu"]).output
    assert "cpu: in NRI mode PreRunPodSandbox, PreCreateContainer" in table
