"""PluginRunner's plan of a hook call (settings, skip reasons and fixed arguments per point, class,
policy and context, made once): every call still sees the policy in force, its own pod, container
and response, and the plugins enabled now, exactly as a runner made for that one call would."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

import structlog
import structlog.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks import policy as policy_mod
from runtimeproxy.hooks.discovery import settings_specs
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.sdk import HANDLER_KWARGS, ContainerInfo, Plugin, PodInfo, ServerContext

from runtimeproxy.common.logs import configure_logging
from runtimeproxy.hookapi.hookpoints import HookPoint

RUN = HookPoint.PRE_RUN_POD_SANDBOX
CREATE = HookPoint.PRE_CREATE_CONTAINER
QOS_LABEL = "koordinator.sh/qosClass"
LS_POD = PodInfo(name="web", namespace="default", uid="u-ls", labels=MappingProxyType({QOS_LABEL: "LS"}))
BE_POD = PodInfo(name="batch", namespace="jobs", uid="u-be", labels=MappingProxyType({QOS_LABEL: "BE"}))


@dataclass(frozen=True)
class Dial:
    enabled: bool = True
    level: int = 0


def dial_plugin(seen: list[tuple[str, str, Any]]) -> Plugin:
    """A plugin whose per-class settings say whether it runs; it notes each call's pod and settings."""
    plugin = Plugin("dial", settings=Dial)

    @plugin.on(RUN, CREATE)
    async def handler(*, pod: PodInfo, hook: HookPoint, settings: Dial, **kwargs: Any) -> None:
        seen.append((hook.value, pod.name, settings))

    return plugin


SPECS = settings_specs([dial_plugin([])])
POLICIES = (
    policy_mod.DEFAULT_POLICY,
    policy_mod.loads_policy("dial:\n  BE: {enabled: false}\n", specs=SPECS),
    policy_mod.loads_policy("dial:\n  LS: {enabled: false, level: 1}\n  BE: {level: 2}\n", specs=SPECS),
    policy_mod.loads_policy("dial:\n  LS: {level: 3}\n", specs=SPECS),
)


def runner_of(*plugins: Plugin, **options: Any) -> PluginRunner:
    return PluginRunner(plugins, registry=CollectorRegistry(), **options)


async def one_call(run: PluginRunner, point: HookPoint, pod: PodInfo) -> tuple[list[str], dict[str, str]]:
    container = ContainerInfo(name="app") if point is CREATE else None
    result = await run.run(point, pod=pod, container=container)
    return result.applied, result.skipped


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(len(POLICIES))), st.booleans(), st.booleans()), max_size=12))
async def test_a_long_lived_runner_answers_each_call_as_a_new_runner_would(
    calls: list[tuple[int, bool, bool]],
) -> None:
    current = [POLICIES[0]]
    kept_seen: list[tuple[str, str, Any]] = []
    kept = runner_of(dial_plugin(kept_seen), context=ServerContext(policy=lambda: current[0]))
    for index, be, create in calls:
        current[0] = POLICIES[index]
        point, pod = (CREATE if create else RUN), (BE_POD if be else LS_POD)
        fresh_seen: list[tuple[str, str, Any]] = []
        fresh = runner_of(dial_plugin(fresh_seen), context=ServerContext(policy=lambda: current[0]))
        before = len(kept_seen)
        assert await one_call(kept, point, pod) == await one_call(fresh, point, pod)
        assert kept_seen[before:] == fresh_seen


async def test_each_call_gets_its_own_pod_container_response_and_logger_in_the_documented_order() -> None:
    plugin = Plugin("p")
    got: list[dict[str, Any]] = []

    @plugin.on(CREATE)
    async def handler(**kwargs: Any) -> None:
        got.append(kwargs)
        kwargs["response"].annotations["n"] = str(len(got))

    run = runner_of(plugin)
    answers = []
    for pod, name in ((LS_POD, "a"), (BE_POD, "b")):
        result = await run.run(CREATE, pod=pod, container=ContainerInfo(name=name))
        answers.append(result.response.annotations)
    first, second = got
    assert list(first) == list(second) == list(HANDLER_KWARGS)
    assert (first["pod"].name, first["container"].name, first["qos"]) == ("web", "a", "LS")
    assert (second["pod"].name, second["container"].name, second["qos"]) == ("batch", "b", "BE")
    assert first["qos_resolution"].qos_class == "LS" and second["qos_resolution"].qos_class == "BE"
    assert first["response"] is not second["response"] and first["log"] is not second["log"]
    assert answers == [{"n": "1"}, {"n": "2"}]  # the second response did not start from the first's


async def test_a_plugin_disabled_after_a_call_is_not_called_again() -> None:
    called: list[str] = []
    plugins = []
    for name in ("a", "b"):
        plugin = Plugin(name)
        plugin.on(RUN)(lambda name=name, **kwargs: called.append(name))
        plugins.append(plugin)
    run = runner_of(*plugins)
    assert (await one_call(run, RUN, LS_POD))[0] == ["a", "b"]
    run.disable("a")
    assert (await one_call(run, RUN, LS_POD))[0] == ["b"]
    assert called == ["a", "b", "b"]


async def test_a_new_context_is_seen_by_the_next_call() -> None:
    """A handle that appears (a new ServerContext) lets a plugin that needs it run, from the next call."""
    plugin = Plugin("needy", needs=("cgroups",))
    handles: list[Any] = []

    @plugin.on(RUN)
    async def handler(*, cgroups: Any, **kwargs: Any) -> None:
        handles.append(cgroups)

    run = runner_of(plugin)
    assert await one_call(run, RUN, LS_POD) == ([], {"needy": "needs cgroups, which this node lacks"})
    stand_in = object()  # no cgroup parent in the pod: the runner does not use the handle itself
    run.context = ServerContext(cgroups=cast(Any, stand_in))
    assert await one_call(run, RUN, LS_POD) == (["needy"], {})
    assert handles == [stand_in]


async def test_a_handlers_lines_carry_its_call_and_a_level_not_emitted_writes_nothing() -> None:
    plugin = Plugin("talker")

    @plugin.on(CREATE)
    async def handler(*, log: Any, **kwargs: Any) -> None:
        log.debug("detail", step=1)
        log.info("wrote", value=2)

    run = runner_of(plugin)
    for level in ("info", "debug"):
        configure_logging(level, "json")
        with structlog.testing.capture_logs() as lines:
            await run.run(CREATE, pod=BE_POD, container=ContainerInfo(name="app"))
        events = [(line["event"], line["plugin"], line["hook"], line["pod"], line["container"]) for line in lines]
        wanted = [("wrote", "talker", "PreCreateContainer", "jobs/batch", "app")]
        if level == "debug":
            wanted.insert(0, ("detail", "talker", "PreCreateContainer", "jobs/batch", "app"))
        assert events == wanted, level
    structlog.reset_defaults()
    configure_logging("info", "json")
