"""The runtime-hooks plugin API (hooks/sdk.py): registration, the kwargs contract, ordering,
failure policies, timeouts of sync and async handlers, metrics and entry point discovery."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import pytest
from fake_dists import make_distribution
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks import overwrites
from runtimeproxy.hooks import policy as policy_mod
from runtimeproxy.hooks.discovery import settings_specs
from runtimeproxy.hooks.plugin_runner import HookCallFailed, PluginRunner
from runtimeproxy.hooks.qos import QoSClass, QoSResolution
from runtimeproxy.hooks.sdk import (
    HANDLER_KWARGS,
    LIFECYCLE_KWARGS,
    ContainerInfo,
    HookResponse,
    HugepageLimit,
    Plugin,
    PluginDefinitionError,
    PodInfo,
    ResourceChanges,
    Resources,
    ServerContext,
    discover_plugins,
)
from runtimeproxy.hooks.testkit import container as container_info
from runtimeproxy.hooks.testkit import plugin_runner, run_plugin
from runtimeproxy.hooks.testkit import pod as pod_info
from structlog.testing import capture_logs

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.hookapi import resource_fields
from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint

POD = PodInfo(
    name="web",
    namespace="default",
    uid="1234-5678",
    sandbox_id="sb1",
    labels=MappingProxyType({"app": "web"}),
    cgroup_parent="/kubepods/burstable/pod1234-5678",
    resources=Resources(cpu_shares=512, cpu_quota=50000, cpu_period=100000),
)
BE_POD = PodInfo(
    name="batch",
    namespace="jobs",
    uid="u-be",
    labels=MappingProxyType({"koordinator.sh/qosClass": "BE"}),
    cgroup_parent="/kubepods/besteffort/podu-be",
)


@dataclass(frozen=True)
class Knob:
    """A plugin's settings of one class: plain typed fields, no parser given."""

    level: int = 1
    mode: Literal["a", "b"] = "a"


@dataclass(frozen=True)
class KnobSection:
    scope: str = "node"


@dataclass
class Unfrozen:
    level: int = 1


CONTAINER = ContainerInfo(
    name="app", id="", attempt=0, resources=Resources(cpu_shares=512), env=(("A", "1"), ("B", "2"), ("A", "3"))
)
CREATE = HookPoint.PRE_CREATE_CONTAINER
RUN = HookPoint.PRE_RUN_POD_SANDBOX


@pytest.fixture
def make_runner(runners: list[PluginRunner]) -> Any:
    def make(*plugins: Plugin, **options: Any) -> PluginRunner:
        options.setdefault("registry", CollectorRegistry())
        runner = PluginRunner(plugins, **options)
        runners.append(runner)
        return runner

    return make


def sample(runner: PluginRunner, plugin: str, hook: str, outcome: str) -> float:
    value = runner.metrics.registry.get_sample_value(
        "runtimeproxy_hooks_plugin_calls_total", {"plugin": plugin, "hook": hook, "outcome": outcome}
    )
    return value or 0.0


# --- registration ----------------------------------------------------------------------------


def test_hook_points_follow_from_the_handlers() -> None:
    plugin = Plugin("p")

    @plugin.on(HookPoint.PRE_CREATE_CONTAINER, "PreUpdateContainerResources")
    def handler(**kwargs: Any) -> None: ...

    @plugin.on("PostStopPodSandboxHook")  # the RPC name works too
    async def other(**kwargs: Any) -> None: ...

    assert plugin.hook_points == {
        HookPoint.PRE_CREATE_CONTAINER,
        HookPoint.PRE_UPDATE_CONTAINER_RESOURCES,
        HookPoint.POST_STOP_POD_SANDBOX,
    }
    assert plugin.hook_points_ordered == [
        HookPoint.POST_STOP_POD_SANDBOX,
        HookPoint.PRE_CREATE_CONTAINER,
        HookPoint.PRE_UPDATE_CONTAINER_RESOURCES,
    ]
    create = plugin.handler(HookPoint.PRE_CREATE_CONTAINER)
    stop = plugin.handler(HookPoint.POST_STOP_POD_SANDBOX)
    assert create is not None and not create.is_async and create.fn is handler
    assert stop is not None and stop.is_async


async def test_a_handler_without_kwargs_gets_only_the_arguments_it_names() -> None:
    plugin = Plugin("p")
    seen: list[dict[str, Any]] = []

    @plugin.on(CREATE)
    def named(pod: Any, *, qos: Any, response: HookResponse) -> None:
        seen.append({"pod": pod, "qos": qos})
        response.env.set("CLASS", str(qos))

    created = plugin.handler(CREATE)
    assert created is not None and created.takes == ("pod", "qos", "response")
    result = await run_plugin(plugin, CREATE, pod=pod_info(qos="BE"), container=container_info())
    assert result.failures == [] and result.response.env.items() == [("CLASS", "BE")]
    assert [entry["qos"] for entry in seen] == ["BE"]


async def test_a_handler_with_kwargs_gets_every_argument() -> None:
    plugin = Plugin("p")
    seen: list[set[str]] = []

    @plugin.on(CREATE)
    async def everything(**kwargs: Any) -> None:
        seen.append(set(kwargs))

    created = plugin.handler(CREATE)
    assert created is not None and created.takes is None
    await run_plugin(plugin, CREATE, pod=pod_info(), container=container_info())
    assert seen == [set(HANDLER_KWARGS)]


async def test_lifecycle_and_reconcile_handlers_may_omit_kwargs() -> None:
    plugin = Plugin("p", state=list)

    @plugin.on_start
    def start(*, server: Any, state: list[str]) -> None:
        state.append("started")

    @plugin.reconcile
    async def repair(*, pods: Any, state: list[str]) -> int:
        state.append(f"reconciled {len(pods)}")
        return 0

    async with plugin_runner(plugin) as runner:
        assert await runner.start() == []
        report = await runner.reconcile_report(pods=[pod_info()])
        assert report.failures == [] and report.repaired == {"p": 0}
        assert runner.state_of("p") == ["started", "reconciled 1"]


def test_a_handler_naming_an_unknown_argument_is_refused_at_registration() -> None:
    plugin = Plugin("p")
    with pytest.raises(PluginDefinitionError, match="parameter 'podd' is not an argument it is called with"):

        @plugin.on(CREATE)
        def handler(*, podd: Any, response: Any) -> None: ...

    assert plugin.hook_points == frozenset()
    with pytest.raises(PluginDefinitionError, match="parameter 'pods' is not an argument"):

        @plugin.on_start
        def start(*, pods: Any) -> None: ...


def test_a_handler_may_name_known_arguments_and_defaults_but_nothing_unknown() -> None:
    plugin = Plugin("p")

    @plugin.on(CREATE)
    def fine(pod: Any, *, response: Any, future_thing: int = 3, **kwargs: Any) -> None: ...

    with pytest.raises(PluginDefinitionError, match="'podd' is not an argument"):

        @plugin.on(RUN)
        def typo(*, podd: Any, **kwargs: Any) -> None: ...

    with pytest.raises(PluginDefinitionError, match="positional-only"):

        @plugin.on(RUN)
        def positional(pod: Any, /, **kwargs: Any) -> None: ...


def test_registration_errors_are_clear() -> None:
    plugin = Plugin("p")
    with pytest.raises(PluginDefinitionError, match="unknown runtime hook 'PreFly'"):
        plugin.on("PreFly")
    with pytest.raises(PluginDefinitionError, match="at least one hook point"):
        plugin.on()
    with pytest.raises(PluginDefinitionError, match="parentheses"):
        plugin.on(lambda **kwargs: None)  # type: ignore[arg-type]

    @plugin.on(CREATE)
    def first(**kwargs: Any) -> None: ...

    with pytest.raises(PluginDefinitionError, match="already has handler"):

        @plugin.on(CREATE)
        def second(**kwargs: Any) -> None: ...


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"name": "bad name"}, "invalid plugin name"),
        ({"name": "p", "failure_policy": "maybe"}, "failure_policy"),
        ({"name": "p", "timeout": 0}, "timeout"),
        ({"name": "p", "timeout": float("nan")}, "timeout"),
        ({"name": "p", "order": "1"}, "order"),
        ({"name": "p", "settings": dict}, "settings must be a dataclass type"),
        ({"name": "p", "settings": Unfrozen}, "must be frozen"),
        ({"name": "p", "section": Knob, "settings": Knob, "defaults": {"BE": {"level": "x"}}}, r"p\.BE\.level"),
        ({"name": "p", "defaults": {"BE": {}}}, "need settings= or section="),
        ({"name": "p", "settings": Knob, "class_entry": {"LSE": "GOLD"}}, "class_entry maps QoS classes"),
        ({"name": "p", "needs": ("gpu",)}, "the node handles are cgroups, resctrl"),
        ({"name": "p", "state": 3}, "state must be a factory"),
        ({"name": "trust", "settings": Knob}, "server section"),
    ],
)
def test_plugin_settings_are_checked(args: dict[str, Any], match: str) -> None:
    with pytest.raises(PluginDefinitionError, match=match):
        Plugin(**args)


def test_failure_policy_accepts_the_registration_file_spelling() -> None:
    assert Plugin("p", failure_policy="Fail").failure_policy == "fail"
    assert Plugin("mine").settings_spec is None  # no settings: no section in the policy file


# --- the kwargs contract -------------------------------------------------------------------------


async def test_a_handler_gets_exactly_the_documented_arguments(make_runner: Any) -> None:
    plugin = Plugin("knob", settings=Knob, section=KnobSection, defaults={"BE": {"level": 3}}, state=list)
    seen: dict[str, Any] = {}

    @plugin.on(CREATE)
    def handler(**kwargs: Any) -> None:
        seen.update(kwargs)

    context = ServerContext(cgroups=None, resctrl=None)
    runner = make_runner(plugin, context=context)
    await runner.run(CREATE, pod=BE_POD, container=CONTAINER)
    assert set(seen) == set(HANDLER_KWARGS)
    assert seen["hook"] is CREATE
    assert seen["pod"] is BE_POD and seen["container"] is CONTAINER
    assert seen["qos"] is QoSClass.BE
    assert isinstance(seen["qos_resolution"], QoSResolution) and seen["qos_resolution"].source == "koordinator-label"
    assert seen["settings"] == Knob(level=3)  # the pod's class: BE, with the plugin's per-class default
    assert seen["section"] == KnobSection()
    assert seen["settings_for"]("LS") == Knob() and seen["settings_for"](QoSClass.BE) == Knob(level=3)
    assert seen["state"] == [] and seen["state"] is runner.state_of("knob")
    assert isinstance(seen["response"], HookResponse) and seen["response"].kind is HookKind.CONTAINER
    assert seen["plugin"] is plugin
    assert seen["cgroups"] is None and seen["resctrl"] is None
    assert seen["log"] is not None


async def test_named_arguments_and_async_handlers(make_runner: Any) -> None:
    plugin = Plugin("mine")
    got: list[Any] = []

    @plugin.on(RUN)
    async def handler(pod: PodInfo, *, container: Any, qos: QoSClass, settings: Any, **kwargs: Any) -> None:
        got.extend([pod.name, container, qos, settings, sorted(kwargs)])

    await make_runner(plugin).run(RUN, pod=POD)
    assert got[:4] == ["web", None, QoSClass.LS, None]  # burstable cgroup parent -> LS; no settings
    assert set(got[4]) == set(HANDLER_KWARGS) - {"pod", "container", "qos", "settings"}


async def test_settings_follow_the_current_policy(make_runner: Any) -> None:
    plugin = Plugin("knob", settings=Knob)
    seen: list[Any] = []

    @plugin.on(RUN)
    def handler(settings: Knob, **kwargs: Any) -> None:
        seen.append(settings)

    custom = policy_mod.loads_policy("knob:\n  BE: {level: 10, mode: b}\n", specs=settings_specs([plugin]))
    current = [policy_mod.DEFAULT_POLICY]  # no section for the plugin: its own defaults
    runner = make_runner(plugin, context=ServerContext(policy=lambda: current[0]))
    await runner.run(RUN, pod=BE_POD)
    current[0] = custom
    await runner.run(RUN, pod=BE_POD)
    assert seen == [Knob(), Knob(level=10, mode="b")]


# --- state --------------------------------------------------------------------------------------


async def test_state_is_one_object_per_runner_shared_by_every_handler_of_the_plugin(make_runner: Any) -> None:
    made: list[dict[str, Any]] = []

    def factory() -> dict[str, Any]:
        made.append({})
        return made[-1]

    counter = Plugin("counter", state=factory)
    other = Plugin("other", state=factory)
    seen: list[tuple[str, int]] = []

    @counter.on_start
    def start(*, state: dict[str, Any], **kwargs: Any) -> None:
        state["started"] = True

    @counter.on(RUN, CREATE)
    async def count(*, state: dict[str, Any], hook: HookPoint, **kwargs: Any) -> None:
        state[hook.value] = state.get(hook.value, 0) + 1

    @counter.reconcile
    def reconcile(*, state: dict[str, Any], **kwargs: Any) -> None:
        seen.append(("counter", id(state)))

    @other.on(RUN)
    def mark(*, state: dict[str, Any], **kwargs: Any) -> None:
        state["other"] = True

    runner = make_runner(counter, other)
    assert len(made) == 2  # one per plugin, made when the runner is
    await runner.start()
    await runner.run(RUN, pod=POD)
    await runner.run(RUN, pod=BE_POD)
    await runner.run(CREATE, pod=POD, container=CONTAINER)
    await runner.reconcile(pods=[POD])
    assert runner.state_of("counter") == {"started": True, "PreRunPodSandbox": 2, "PreCreateContainer": 1}
    assert runner.state_of("other") == {"other": True}  # separate per plugin
    assert seen == [("counter", id(runner.state_of("counter")))]
    assert len(made) == 2  # never made again
    second = make_runner(counter)
    assert second.state_of("counter") == {} and len(made) == 3  # a new runner: a new state
    assert make_runner(Plugin("stateless")).state_of("stateless") is None


async def test_a_failing_state_factory_disables_the_plugin_or_stops_the_server(make_runner: Any) -> None:
    def broken() -> None:
        raise OSError("no state")

    ignoring = Plugin("ignoring", state=broken)
    ignoring.on(RUN)(lambda **kwargs: None)
    with capture_logs() as logs:
        runner = make_runner(ignoring)
    assert runner.plugins == () and logs[0]["reason"] == "state factory: OSError: no state"
    [failure] = await runner.start()
    assert (failure.plugin, failure.hook, failure.outcome) == ("ignoring", "start", "error")
    strict = Plugin("strict", state=broken, failure_policy="fail")
    strict.on(RUN)(lambda **kwargs: None)
    with pytest.raises(HookCallFailed, match="state factory: OSError: no state"):
        await make_runner(strict).start()


# --- when a plugin is not called -----------------------------------------------------------------


@dataclass(frozen=True)
class Switch:
    enabled: bool = True
    level: int = 0


async def test_a_class_whose_settings_say_enabled_false_is_not_called(make_runner: Any) -> None:
    plugin = Plugin("switch", settings=Switch, defaults={"BE": {"enabled": False}})
    calls: list[str] = []

    @plugin.on(RUN)
    def handler(*, pod: PodInfo, settings: Switch, **kwargs: Any) -> None:
        assert settings.enabled
        calls.append(pod.name)

    @plugin.reconcile
    def reconcile(*, pods: list[PodInfo], **kwargs: Any) -> None:
        calls.append("reconcile:" + ",".join(pod.name for pod in pods))

    runner = make_runner(plugin)
    off = await runner.run(RUN, pod=BE_POD)
    on = await runner.run(RUN, pod=POD)
    assert (off.applied, off.skipped) == ([], {"switch": "switch.BE.enabled is false"})
    assert (on.applied, on.skipped) == (["switch"], {})
    await runner.reconcile(pods=[POD, BE_POD])
    assert calls == ["web", "reconcile:web"]  # BE's pod is not given to reconcile either
    assert plugin.settings_spec is not None and plugin.settings_spec.switchable


async def test_a_plugin_needing_a_node_handle_the_node_lacks_is_never_called(make_runner: Any) -> None:
    plugin = Plugin("needy", needs=("cgroups", "resctrl"))
    calls: list[str] = []
    plugin.on(RUN)(lambda **kwargs: calls.append("hook"))
    plugin.on_start(lambda **kwargs: calls.append("start"))
    plugin.reconcile(lambda **kwargs: calls.append("reconcile"))
    runner = make_runner(plugin, context=ServerContext(cgroups=None, resctrl=None))
    assert await runner.start() == []
    result = await runner.run(RUN, pod=POD)
    assert await runner.reconcile(pods=[POD]) == []
    assert calls == []
    assert result.skipped == {"needy": "needs cgroups and resctrl, which this node lacks"}
    assert plugin.describe()["needs"] == ["cgroups", "resctrl"]


# --- ordering and merging ------------------------------------------------------------------------


async def test_plugins_run_in_order_then_name_and_later_changes_win(make_runner: Any) -> None:
    calls: list[str] = []

    def plugin(name: str, order: int, quota: int) -> Plugin:
        p = Plugin(name, order=order)

        @p.on(CREATE)
        def handler(response: HookResponse, **kwargs: Any) -> None:
            calls.append(name)
            response.resources.cpu_quota = quota
            response.annotations[name] = "ran"
            response.annotations["last"] = name
            response.env.set("WHO", name)

        return p

    runner = make_runner(plugin("zeta", 1, 10000), plugin("alpha", 5, 20000), plugin("beta", 5, 30000))
    result = await runner.run(CREATE, pod=POD, container=CONTAINER)
    assert calls == ["zeta", "alpha", "beta"]
    assert [p.name for p in runner.plugins_for(CREATE)] == ["zeta", "alpha", "beta"]
    assert result.applied == ["zeta", "alpha", "beta"]
    assert result.response.resources.cpu_quota == 30000
    assert result.response.annotations == {"zeta": "ran", "alpha": "ran", "beta": "ran", "last": "beta"}
    assert result.response.env.items() == [("WHO", "beta")]


def test_response_merge_rules() -> None:
    base = HookResponse(HookKind.CONTAINER)
    base.resources.unified["memory.high"] = "1G"
    base.resources.cpu_shares = 100
    base.env.set("A", "1")
    base.cgroup_parent = "/kubepods/x"
    later = HookResponse(HookKind.CONTAINER)
    later.resources.unified["memory.low"] = "1M"
    later.resources.hugepage_limits = [HugepageLimit("2MB", 1 << 21)]
    later.env.update({"B": "2", "A": "3"})
    base.merge(later)
    assert base.resources.cpu_shares == 100  # zero in `later` means "unchanged"
    assert base.resources.unified == {"memory.high": "1G", "memory.low": "1M"}
    assert base.resources.hugepage_limits == [HugepageLimit("2MB", 1 << 21)]
    assert base.env.items() == [("A", "3"), ("B", "2")]  # first position, last value
    assert base.cgroup_parent == "/kubepods/x"
    assert not base.is_empty() and HookResponse(HookKind.POD).is_empty()


def _overwrites(runner: PluginRunner, kind: str) -> float:
    value = runner.metrics.registry.get_sample_value("runtimeproxy_hooks_plugin_overwrites_total", {"field": kind})
    return value or 0.0


async def test_an_overwrite_is_logged_once_naming_both_plugins_and_counted_by_field(make_runner: Any) -> None:
    first, second, third = Plugin("first", order=1), Plugin("second", order=2), Plugin("third", order=3)

    @first.on(CREATE)
    def one(response: HookResponse, **kwargs: Any) -> None:
        response.resources.cpu_quota = 10000
        response.annotations["team"] = "a" * 200
        response.env.set("TOKEN", "secret-one")
        response.resources.cpu_shares = 2

    @second.on(CREATE)
    def two(response: HookResponse, **kwargs: Any) -> None:
        response.resources.cpu_quota = 20000
        response.annotations["team"] = "b" * 200
        response.env.set("TOKEN", "secret-two")
        response.resources.cpu_shares = 2  # the same value: no conflict

    @third.on(CREATE)
    def three(response: HookResponse, **kwargs: Any) -> None:
        response.resources.cpu_quota = 30000

    runner = make_runner(first, second, third)
    with capture_logs() as logs:
        result = await runner.run(CREATE, pod=POD, container=CONTAINER)
    assert result.response.resources.cpu_quota == 30000  # the later plugin still wins
    assert result.response.env.items() == [("TOKEN", "secret-two")]
    said = [e for e in logs if e["event"] == "plugin overwrote another plugin's value"]
    assert [(e["field"], e["earlier"], e["later"]) for e in said] == [
        ("resources.cpu_quota", "first", "second"),
        ("annotations[team]", "first", "second"),
        ("env[TOKEN]", "first", "second"),
        ("resources.cpu_quota", "second", "third"),
    ]
    assert all(e["hook"] == CREATE.value and e["log_level"] == "warning" for e in said)
    assert (said[0]["old"], said[0]["new"]) == ("10000", "20000")
    assert len(said[1]["new"]) == overwrites.VALUE_CHARS and said[1]["new"].startswith("bbb")
    assert "old" not in said[2] and "new" not in said[2]
    assert "secret" not in repr(logs)  # env values never reach the log
    assert _overwrites(runner, "resources.cpu_quota") == 2
    assert _overwrites(runner, "annotations") == 1 and _overwrites(runner, "env") == 1
    assert _overwrites(runner, "resources.cpu_shares") == 0


async def test_a_failed_plugins_discarded_changes_overwrite_nothing(make_runner: Any) -> None:
    broken = Plugin("broken", order=2)

    @broken.on(CREATE)
    def crash(response: HookResponse, **kwargs: Any) -> None:
        response.annotations["first"] = "changed"
        raise RuntimeError("boom")

    runner = make_runner(_setter("first", 1), broken, _setter("other", 3))
    with capture_logs() as logs:
        await runner.run(CREATE, pod=POD, container=CONTAINER)
    assert not [e for e in logs if e["event"] == "plugin overwrote another plugin's value"]
    assert _overwrites(runner, "annotations") == 0


def test_set_fields_names_every_kind_of_change() -> None:
    response = HookResponse(HookKind.CONTAINER)
    assert list(response.set_fields()) == []
    response.resources.cpuset_cpus = "0-1"
    response.resources.hugepage_limits = [HugepageLimit("2MB", 1 << 21)]
    response.resources.unified["memory.high"] = "1G"
    response.labels["l"] = "v"
    response.env.set("E", "x")
    response.cgroup_parent = "/kubepods/x"
    assert [(name, kind) for name, kind, _ in response.set_fields()] == [
        ("resources.cpuset_cpus", "resources.cpuset_cpus"),
        ("resources.hugepage_limits", "resources.hugepage_limits"),
        ("resources.unified[memory.high]", "resources.unified"),
        ("labels[l]", "labels"),
        ("env[E]", "env"),
        ("cgroup_parent", "cgroup_parent"),
    ]


# --- failures ------------------------------------------------------------------------------------


def _setter(name: str, order: int = 100, **options: Any) -> Plugin:
    plugin = Plugin(name, order=order, **options)

    @plugin.on(CREATE, RUN)
    def handler(response: HookResponse, **kwargs: Any) -> None:
        response.annotations[name] = "ok"

    return plugin


async def test_a_crashing_ignore_plugin_is_skipped_and_its_partial_changes_dropped(make_runner: Any) -> None:
    crash = Plugin("crash", order=50)

    @crash.on(CREATE)
    def handler(response: HookResponse, **kwargs: Any) -> None:
        response.annotations["crash"] = "half-done"
        response.resources.cpu_quota = 1000
        raise RuntimeError("boom")

    runner = make_runner(_setter("before", 10), crash, _setter("after", 90))
    result = await runner.run(CREATE, pod=POD, container=CONTAINER)
    assert result.response.annotations == {"before": "ok", "after": "ok"}
    assert result.response.resources.cpu_quota == 0
    assert result.applied == ["before", "after"]
    [failure] = result.failures
    assert (failure.plugin, failure.outcome, failure.reason) == ("crash", "error", "RuntimeError: boom")
    assert sample(runner, "crash", "PreCreateContainer", "error") == 1
    assert sample(runner, "after", "PreCreateContainer", "ok") == 1


async def test_a_failing_fail_plugin_fails_the_call_and_stops_the_rest(make_runner: Any) -> None:
    strict = Plugin("strict", order=50, failure_policy="fail")

    @strict.on(CREATE)
    async def handler(**kwargs: Any) -> None:
        raise ValueError("no cpuset left")

    after = _setter("after", 90)
    runner = make_runner(_setter("before", 10), strict, after)
    with pytest.raises(HookCallFailed, match="plugin strict failed at PreCreateContainer: ValueError: no cpuset left"):
        await runner.run(CREATE, pod=POD, container=CONTAINER)
    assert sample(runner, "after", "PreCreateContainer", "ok") == 0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda r: setattr(r.resources, "cpu_shares", 1), "cpu_shares"),
        (lambda r: setattr(r.resources, "cpu_quota", "50000"), "cpu_quota must be an int"),
        (lambda r: setattr(r.resources, "cpuset_cpus", "3-1"), "cpuset_cpus"),
        (lambda r: r.resources.unified.update({"cgroup.procs": "1"}), "unified"),
        (lambda r: r.labels.update({"a": "b"}), "container hooks cannot change pod labels"),
        (lambda r: r.env.set("BAD=NAME", "x"), "env"),
        (lambda r: r.annotations.update({"a": 1}), "annotations must be a dict of str to str"),
        (lambda r: setattr(r.resources, "memory_limit_in_bytes", 1 << 70), "resources"),
    ],
)
async def test_changes_the_proxy_would_refuse_are_the_plugins_failure(
    make_runner: Any, change: Any, reason: str
) -> None:
    bad = Plugin("bad")

    @bad.on(CREATE)
    def handler(response: HookResponse, **kwargs: Any) -> None:
        change(response)

    runner = make_runner(bad, _setter("good"))
    result = await runner.run(CREATE, pod=POD, container=CONTAINER)
    assert result.response.annotations == {"good": "ok"}
    assert result.response.resources.is_empty() and not result.response.labels
    [failure] = result.failures
    assert failure.outcome == "invalid" and reason in failure.reason


async def test_env_is_refused_in_pod_hooks(make_runner: Any) -> None:
    bad = Plugin("bad")

    @bad.on(RUN)
    def handler(response: HookResponse, **kwargs: Any) -> None:
        response.env.set("A", "1")

    result = await make_runner(bad).run(RUN, pod=POD)
    assert "pod hooks cannot change a container's environment" in result.failures[0].reason


async def test_a_hanging_sync_handler_times_out_without_blocking_the_loop(make_runner: Any) -> None:
    release = threading.Event()
    hang = Plugin("hang", order=1, timeout=0.2)

    @hang.on(CREATE)
    def handler(response: HookResponse, **kwargs: Any) -> None:
        response.annotations["hang"] = "late"
        release.wait(30)

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    runner = make_runner(hang, _setter("after", 2))
    tick_task = asyncio.create_task(ticker())
    try:
        started = time.monotonic()
        result = await runner.run(CREATE, pod=POD, container=CONTAINER)
        elapsed = time.monotonic() - started
    finally:
        tick_task.cancel()
        release.set()
    assert 0.2 <= elapsed < 2.0
    assert ticks >= 5  # the loop kept running while the handler hung in its thread
    assert result.response.annotations == {"after": "ok"}
    assert [(f.plugin, f.outcome) for f in result.failures] == [("hang", "timeout")]
    assert sample(runner, "hang", "PreCreateContainer", "timeout") == 1


async def test_concurrent_sync_calls_within_their_timeout_are_never_refused(make_runner: Any) -> None:
    # Only calls past their timeout count against max_hung: a busy node starting many pods at
    # once must not lose a slow-but-timely plugin's changes.
    slow = Plugin("slow", timeout=2.0)

    @slow.on(CREATE)
    def handler(*, response: Any, **kwargs: Any) -> None:
        time.sleep(0.2)
        response.annotations["slow"] = "done"

    runner = make_runner(slow, max_hung=2)
    results = await asyncio.gather(*(runner.run(CREATE, pod=POD, container=CONTAINER) for _ in range(6)))
    assert [r.failures for r in results] == [[]] * 6
    assert all(r.response.annotations == {"slow": "done"} for r in results)


async def test_a_plugin_with_too_many_hung_sync_calls_is_not_called_again(make_runner: Any) -> None:
    release = threading.Event()
    calls = 0
    hang = Plugin("hang", timeout=0.05)

    @hang.on(CREATE)
    def handler(**kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        release.wait(30)

    runner = make_runner(hang, max_hung=2)
    try:
        outcomes = [(await runner.run(CREATE, pod=POD, container=CONTAINER)).failures[0].outcome for _ in range(3)]
    finally:
        release.set()
    assert outcomes == ["timeout", "timeout", "busy"]
    assert calls == 2
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the threads end once released; the plugin runs again
        result = await runner.run(CREATE, pod=POD, container=CONTAINER)
        if not result.failures:
            break
        await asyncio.sleep(0.02)
    assert not result.failures


async def test_a_hanging_async_handler_times_out_even_if_it_ignores_cancellation(make_runner: Any) -> None:
    stubborn = Plugin("stubborn", order=1, timeout=0.1)
    finished = asyncio.Event()

    @stubborn.on(CREATE)
    async def handler(**kwargs: Any) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)  # keeps going after the cancel, as a badly written plugin might
            finished.set()

    sleepy = Plugin("sleepy", order=2, timeout=0.1)

    @sleepy.on(CREATE)
    async def handler2(**kwargs: Any) -> None:
        await asyncio.sleep(30)

    runner = make_runner(stubborn, sleepy, _setter("after", 3))
    started = time.monotonic()
    result = await runner.run(CREATE, pod=POD, container=CONTAINER)
    assert time.monotonic() - started < 0.29  # did not wait for the stubborn one to give up
    assert [(f.plugin, f.outcome) for f in result.failures] == [("stubborn", "timeout"), ("sleepy", "timeout")]
    assert result.response.annotations == {"after": "ok"}
    await asyncio.wait_for(finished.wait(), 2)


async def test_async_handlers_run_on_the_loop_and_sync_ones_in_a_thread(make_runner: Any) -> None:
    seen: dict[str, int] = {}
    on_loop, in_thread = Plugin("on-loop", order=1), Plugin("in-thread", order=2)

    @on_loop.on(CREATE)
    async def quick(**kwargs: Any) -> None:
        seen["async"] = threading.get_ident()

    @in_thread.on(CREATE)
    def slow(**kwargs: Any) -> None:
        seen["sync"] = threading.get_ident()

    await make_runner(on_loop, in_thread).run(CREATE, pod=POD, container=CONTAINER)
    assert seen["async"] == threading.get_ident()
    assert seen["sync"] != threading.get_ident()


def test_blocking_is_no_longer_a_plugin_setting() -> None:
    with pytest.raises(TypeError, match="blocking"):
        Plugin("p", blocking=False)  # type: ignore[call-arg]


async def test_an_async_handler_past_its_timeout_is_cancelled_and_counted(make_runner: Any) -> None:
    plugin = Plugin("slow", timeout=0.05)
    cancelled = asyncio.Event()

    @plugin.on(CREATE)
    async def handler(**kwargs: Any) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    runner = make_runner(plugin)
    result = await runner.run(CREATE, pod=POD, container=CONTAINER)
    assert [(f.plugin, f.outcome) for f in result.failures] == [("slow", "timeout")]
    await asyncio.wait_for(cancelled.wait(), 2)
    assert sample(runner, "slow", CREATE.value, "timeout") == 1


def test_built_in_plugins_that_only_touch_files_are_async() -> None:
    from runtimeproxy.hooks.plugins import cpu, cpuset, gpu, memory, resctrl

    for module in (cpu, cpuset, memory, resctrl, gpu):
        plugin = module.plugin
        handlers = [*plugin.handlers.values(), plugin.reconcile_handler, plugin.start_handler, plugin.stop_handler]
        assert all(h.is_async for h in handlers if h is not None), plugin.name


async def test_a_sync_handler_returning_a_coroutine_is_an_error(make_runner: Any) -> None:
    plugin = Plugin("p")

    async def work() -> None: ...

    @plugin.on(CREATE)
    def handler(**kwargs: Any) -> Any:
        return work()

    result = await make_runner(plugin).run(CREATE, pod=POD, container=CONTAINER)
    assert "declare it async def" in result.failures[0].reason


# --- enabling ------------------------------------------------------------------------------------


def test_enable_and_disable(make_runner: Any) -> None:
    only_run = Plugin("pods")

    @only_run.on(RUN)
    def handler(**kwargs: Any) -> None: ...

    runner = make_runner(_setter("a"), _setter("b"), only_run, disable=["b", "not-installed"])
    assert [p.name for p in runner.plugins] == ["a", "pods"]
    assert runner.hook_points == {CREATE, RUN}
    runner = make_runner(_setter("a"), only_run, enable=["pods"])
    assert runner.hook_points == {RUN}
    with pytest.raises(ValueError, match="cannot enable nope: no such plugin"):
        make_runner(_setter("a"), enable=["nope"])
    with pytest.raises(ValueError, match="two plugins are named 'a'"):
        make_runner(_setter("a"), _setter("a"))


# --- lifecycle and reconcile -----------------------------------------------------------------------


async def test_start_stop_and_reconcile_handlers(make_runner: Any) -> None:
    plugin = Plugin("memory", settings=Knob)
    events: list[tuple[str, Any]] = []

    @plugin.on(CREATE)
    def handler(**kwargs: Any) -> None: ...

    @plugin.on_start
    def start(server: ServerContext, **kwargs: Any) -> None:
        events.append(("start", sorted([*kwargs, "server"])))

    @plugin.on_stop
    async def stop(**kwargs: Any) -> None:
        events.append(("stop", None))

    @plugin.reconcile
    def reconcile(pods: list[PodInfo], settings_for: Any, node: str = "", **kwargs: Any) -> None:
        events.append(("reconcile", ([p.name for p in pods], settings_for(QoSClass.BE), node)))

    runner = make_runner(plugin)
    assert await runner.start() == []
    assert await runner.reconcile(pods=[POD, BE_POD], node="n1") == []
    assert await runner.stop() == []
    assert events[0] == ("start", sorted(LIFECYCLE_KWARGS))
    assert events[1] == ("reconcile", (["web", "batch"], Knob(), "n1"))
    assert events[2] == ("stop", None)


async def test_on_stop_waits_for_the_thread_of_a_cancelled_reconcile_round(make_runner: Any) -> None:
    # A stop cancels the round in progress, but a sync handler's thread runs on: on_stop must not
    # run beside it (it could undo, or close, what the round is still doing).
    plugin = Plugin("p", timeout=5.0)
    entered = threading.Event()
    events: list[str] = []

    @plugin.reconcile
    def reconcile(**kwargs: Any) -> None:
        entered.set()
        time.sleep(0.3)
        events.append("reconcile ended")

    @plugin.on_stop
    def stop(**kwargs: Any) -> None:
        events.append("on_stop")

    runner = make_runner(plugin)
    round_in_progress = asyncio.create_task(runner.reconcile(pods=[]))
    assert await asyncio.to_thread(entered.wait, 5)
    round_in_progress.cancel()
    with pytest.raises(asyncio.CancelledError):
        await round_in_progress
    with capture_logs() as logs:
        assert await runner.stop() == []
    assert events == ["reconcile ended", "on_stop"]
    assert not [e for e in logs if e["log_level"] == "warning"], logs


async def test_on_stop_waits_for_handler_threads_no_longer_than_the_plugins_timeout(make_runner: Any) -> None:
    release = threading.Event()
    plugin = Plugin("p", timeout=0.2)

    @plugin.on(CREATE)
    def handler(**kwargs: Any) -> None:
        release.wait(30)

    stopped: list[float] = []

    @plugin.on_stop
    async def stop(**kwargs: Any) -> None:
        stopped.append(time.monotonic())

    runner = make_runner(plugin)
    try:
        result = await runner.run(CREATE, pod=POD, container=CONTAINER)
        assert [f.outcome for f in result.failures] == ["timeout"]  # its thread runs on
        began = time.monotonic()
        with capture_logs() as logs:
            assert await runner.stop() == []
    finally:
        release.set()
    assert stopped and 0.2 <= stopped[0] - began < 25  # its timeout, not the 30 s the thread would take
    [warning] = [e for e in logs if e["event"] == "handler calls still run in threads; calling on_stop anyway"]
    assert (warning["plugin"], warning["threads"], warning["waited_s"]) == ("p", 1, 0.2)


async def test_a_plugin_without_on_stop_does_not_delay_the_stop(make_runner: Any) -> None:
    release, entered = threading.Event(), threading.Event()
    plugin = Plugin("p", timeout=60.0)

    @plugin.on(CREATE)
    def handler(**kwargs: Any) -> None:
        entered.set()
        release.wait(60)

    runner = make_runner(plugin)
    try:
        call = asyncio.create_task(runner.run(CREATE, pod=POD, container=CONTAINER))
        assert await asyncio.to_thread(entered.wait, 5)
        call.cancel()  # as a shutdown would: the thread runs on, nothing waits for it
        with pytest.raises(asyncio.CancelledError):
            await call
        began = time.monotonic()
        assert await runner.stop() == []
        assert time.monotonic() - began < 30  # not the plugin's 60 s
    finally:
        release.set()


async def test_a_plugin_that_cannot_start_is_disabled_or_stops_the_server(make_runner: Any) -> None:
    def failing(name: str, policy: str) -> Plugin:
        plugin = _setter(name, failure_policy=policy)

        @plugin.on_start
        def start(**kwargs: Any) -> None:
            raise OSError("no cgroup")

        return plugin

    runner = make_runner(failing("soft", "ignore"), _setter("fine"))
    failures = await runner.start()
    assert [(f.plugin, f.reason) for f in failures] == [("soft", "OSError: no cgroup")]
    assert [p.name for p in runner.plugins] == ["fine"]
    runner = make_runner(failing("hard", "fail"), _setter("fine"))
    with pytest.raises(HookCallFailed, match="plugin hard failed at start"):
        await runner.start()


async def test_a_failing_reconcile_is_reported_not_raised(make_runner: Any) -> None:
    plugin = Plugin("p", failure_policy="fail")

    @plugin.reconcile
    def reconcile(**kwargs: Any) -> None:
        raise RuntimeError("cgroup gone")

    runner = make_runner(plugin)
    [failure] = await runner.reconcile(pods=[])
    assert (failure.hook, failure.reason) == ("reconcile", "RuntimeError: cgroup gone")
    assert sample(runner, "p", "reconcile", "error") == 1


# --- resources ------------------------------------------------------------------------------------


def test_resource_changes_round_trip_through_the_wire_message() -> None:
    from runtimeproxy.hooks.convert import resources_from_proto, resources_to_proto

    changes = ResourceChanges(
        cpu_quota=50000,
        cpu_period=100000,
        cpuset_cpus="0-3",
        unified={"memory.high": "max"},
        hugepage_limits=[HugepageLimit("2MB", 4 << 20)],
    )
    back = resources_from_proto(resources_to_proto(changes))
    assert (back.cpu_quota, back.cpu_period, back.cpuset_cpus) == (50000, 100000, "0-3")
    assert dict(back.unified) == {"memory.high": "max"}
    assert back.hugepage_limits == (HugepageLimit("2MB", 4 << 20),)
    assert changes.problems() == []


def test_the_sdk_resource_types_have_exactly_the_wire_fields() -> None:
    """Resources and ResourceChanges stay typed dataclasses, but their fields are the CRI
    descriptor's (runtimeproxy/hookapi/resource_fields.py): a field added to the proto fails here."""
    assert tuple(f.name for f in dataclasses.fields(Resources)) == resource_fields.FIELDS
    assert tuple(f.name for f in dataclasses.fields(ResourceChanges)) == resource_fields.FIELDS
    assert tuple(f.name for f in dataclasses.fields(HugepageLimit)) == tuple(
        fd.name for fd in hook_pb.HugepageLimit.DESCRIPTOR.fields
    )


_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(
    ints=st.fixed_dictionaries({name: _INT64 for name in resource_fields.INTS}),
    strings=st.fixed_dictionaries({name: st.text(max_size=8) for name in resource_fields.STRINGS}),
    unified=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3),
    hugepages=st.lists(st.builds(HugepageLimit, st.sampled_from(["2MB", "1GB"]), _INT64.filter(lambda n: n >= 0))),
)
def test_every_resource_field_survives_the_wire_message(
    ints: dict[str, int], strings: dict[str, str], unified: dict[str, str], hugepages: list[HugepageLimit]
) -> None:
    from runtimeproxy.hooks.convert import resources_from_proto, resources_to_proto

    changes = ResourceChanges(**ints, **strings, unified=unified, hugepage_limits=hugepages)
    back = resources_from_proto(resources_to_proto(changes))
    for name in resource_fields.SCALARS:
        assert getattr(back, name) == getattr(changes, name), name
    assert dict(back.unified) == unified
    assert back.hugepage_limits == tuple(hugepages)


GUIDE = Path(__file__).parents[2] / "docs" / "writing-a-plugin.md"


def _documented_sdk_names() -> list[str]:
    """The names in the first column of the guide's "What the SDK exports" table."""
    section = GUIDE.read_text().split("## What the SDK exports", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return [name for cell in rows for name in re.findall(r"`([A-Za-z_]+)`", cell)]


def test_the_sdk_exports_exactly_the_documented_plugin_face() -> None:
    from runtimeproxy.hooks import sdk

    documented = _documented_sdk_names()
    assert len(documented) == len(set(documented))
    assert sorted(sdk.__all__) == sorted(documented)
    for name in sdk.__all__:
        assert hasattr(sdk, name), name
    for internal in ("PluginRunner", "PluginMetrics", "RunResult", "settings_specs", "resources_to_proto"):
        assert not hasattr(sdk, internal), internal


def test_the_testkit_exports_resolve() -> None:
    from runtimeproxy.hooks import testkit

    for name in testkit.__all__:
        assert hasattr(testkit, name), name


# --- discovery ------------------------------------------------------------------------------------

GOOD_MODULE = """
from runtimeproxy.hooks.sdk import Plugin

plugin = Plugin("{name}", version="1.2", order=7)

@plugin.on("PreCreateContainer")
def handler(response, **kwargs):
    response.annotations["{name}"] = "yes"
"""


def test_discovery_from_real_entry_points(site: tuple[Path, str]) -> None:
    path, prefix = site
    make_distribution(
        path,
        f"{prefix}-plugins",
        {
            "good": f"{prefix}_good:plugin",
            "whole-module": f"{prefix}_module",
            "missing": f"{prefix}_missing:plugin",
            "crashes": f"{prefix}_crash:plugin",
            "not-a-plugin": f"{prefix}_good:GOOD",
            "empty": f"{prefix}_empty:plugin",
        },
        {
            f"{prefix}_good": GOOD_MODULE.format(name=f"{prefix}-good") + "GOOD = 1\n",
            f"{prefix}_module": GOOD_MODULE.format(name=f"{prefix}-module"),
            f"{prefix}_crash": "raise RuntimeError('import-time failure')\n",
            f"{prefix}_empty": f"from runtimeproxy.hooks.sdk import Plugin\nplugin = Plugin('{prefix}-empty')\n",
        },
    )
    result = discover_plugins()
    mine = [p for p in result.plugins if p.name.startswith(prefix)]
    assert sorted(p.name for p in mine) == [f"{prefix}-good", f"{prefix}-module"]
    assert {p.version for p in mine} == {"1.2"}
    assert all(p.hook_points == {CREATE} for p in mine)
    failures = {f.name: f for f in result.failures if f.source.startswith(f"{prefix}-plugins")}
    assert set(failures) == {"missing", "crashes", "not-a-plugin", "empty"}
    assert failures["missing"].reason.startswith("ModuleNotFoundError")
    assert failures["crashes"].reason == "RuntimeError: import-time failure"
    assert "is a int, not a runtimeproxy Plugin" in failures["not-a-plugin"].reason
    assert "registers no handlers" in failures["empty"].reason
    assert failures["missing"].source == f"{prefix}-plugins 1.0: missing = {prefix}_missing:plugin"


def test_duplicate_plugin_names_are_all_refused(site: tuple[Path, str]) -> None:
    path, prefix = site
    name = f"{prefix}-dup"
    for dist in ("one", "two"):
        module = f"{prefix}_{dist}"
        source = GOOD_MODULE.format(name=name)
        make_distribution(path, f"{prefix}-{dist}", {"dup": f"{module}:plugin"}, {module: source})
    result = discover_plugins()
    assert name not in result.names()
    dups = [f for f in result.failures if f.name == name]
    assert len(dups) == 2
    assert all("duplicate plugin name" in f.reason for f in dups)


def test_discovery_takes_an_explicit_list() -> None:
    explicit = _setter("explicit-one")
    empty = Plugin("explicit-empty")
    result = discover_plugins(group="runtimeproxy.hooks.test-none", extra=[explicit, empty])
    assert result.plugins == (explicit,)
    assert [(f.name, f.source) for f in result.failures] == [("explicit-empty", "explicit")]
