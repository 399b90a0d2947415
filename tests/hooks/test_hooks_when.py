"""Handler filters (``@plugin.on(..., when=predicate)``): checked when defined, answered by the
runner right before the handler would be called; a false answer calls nothing (no coroutine, no
task) and counts as the plugin skipped; a raising predicate is the plugin's failure. The network
plugin uses one so that, with shaping off, none of its hook handlers is called."""

from __future__ import annotations

import asyncio
import inspect
import warnings
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.explain import explain_manifest
from runtimeproxy.hooks.plugin_runner import HookCallFailed, PluginRunner, filtered_reason
from runtimeproxy.hooks.plugins.network import handlers as network
from runtimeproxy.hooks.sdk import HANDLER_KWARGS, HookResponse, Plugin, PluginDefinitionError, PodInfo
from runtimeproxy.hooks.testkit import policy_from
from runtimeproxy.hooks.testkit.fake_cgroups import make_fake_cgroup_v1
from structlog.testing import capture_logs

from runtimeproxy.common import logs
from runtimeproxy.hookapi.hookpoints import HookPoint

PRE_CREATE = HookPoint.PRE_CREATE_CONTAINER
POD = PodInfo("web", "default", "u1", sandbox_id="sb1", cgroup_parent="/kubepods/burstable/podu1")
BE_POD = PodInfo(
    "batch", "jobs", "u2", labels={"koordinator.sh/qosClass": "BE"}, cgroup_parent="/kubepods/besteffort/podu2"
)
NETWORK_POINTS = (HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER, HookPoint.POST_STOP_POD_SANDBOX)
PODS = Path(__file__).parents[1] / "data" / "pods"


def runner_of(*plugins: Plugin, **options: Any) -> PluginRunner:
    return PluginRunner(plugins, registry=CollectorRegistry(), **options)


def calls(runner: PluginRunner, plugin: str, hook: str = PRE_CREATE.value) -> dict[str, float]:
    """The plugin's counted calls at ``hook``, by outcome (outcomes never seen left out)."""
    found = {}
    for outcome in ("ok", "error", "timeout", "invalid", "busy"):
        value = runner.metrics.registry.get_sample_value(
            "runtimeproxy_hooks_plugin_calls_total", {"plugin": plugin, "hook": hook, "outcome": outcome}
        )
        if value:
            found[outcome] = value
    return found


class TaskCount:
    """Counts the tasks made on the running loop (its task factory) while in effect."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any) -> asyncio.Task[Any]:
        self.made += 1
        return asyncio.Task(coro, loop=loop, **kw)


@pytest.fixture
async def tasks() -> AsyncIterator[TaskCount]:
    loop = asyncio.get_running_loop()
    count = TaskCount()
    loop.set_task_factory(count)
    yield count
    loop.set_task_factory(None)


def filtered_plugin(
    when: Callable[..., Any], entered: list[str], *, name: str = "p", failure_policy: str = "ignore"
) -> Plugin:
    """A plugin whose handler (one that can suspend: a task of its own when called) is filtered by ``when``."""
    plugin = Plugin(name, failure_policy=failure_policy)

    @plugin.on(PRE_CREATE, when=when)
    async def handler(*, response: HookResponse, **kwargs: Any) -> None:
        entered.append(name)
        await asyncio.sleep(0)
        response.annotations[f"{name}/seen"] = "yes"

    return plugin


def never(**kwargs: Any) -> bool:
    return False


def always(**kwargs: Any) -> bool:
    return True


# --- definition ----------------------------------------------------------------------------------


async def _async_predicate(**kwargs: Any) -> bool:
    return True


def _generator_predicate(**kwargs: Any) -> Iterator[bool]:
    yield True


def _unknown_argument(*, pods: Any, **kwargs: Any) -> bool:
    return True


def _positional_only(pod: Any, /, **kwargs: Any) -> bool:
    return True


@pytest.mark.parametrize(
    ("predicate", "says"),
    [
        ("not a function", "when= must be a function"),
        (_async_predicate, "must be a plain function"),
        (_generator_predicate, "must be a plain function"),
        (_unknown_argument, "parameter 'pods' is not an argument it is called with"),
        (_positional_only, "positional-only parameter 'pod'"),
    ],
)
def test_a_predicate_that_cannot_work_is_refused_where_it_is_given(predicate: Any, says: str) -> None:
    plugin = Plugin("p")
    with pytest.raises(PluginDefinitionError, match="plugin p: when=") as caught:
        plugin.on(PRE_CREATE, when=predicate)  # before any handler is decorated
    assert says in str(caught.value)
    assert plugin.hook_points == frozenset()


def _predicate_taking(names: list[str]) -> Callable[..., bool]:
    def predicate(**kwargs: Any) -> bool:
        return True

    keyword = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in names]
    predicate.__signature__ = inspect.Signature([*keyword, inspect.Parameter("kw", inspect.Parameter.VAR_KEYWORD)])  # type: ignore[attr-defined]
    return predicate


@given(st.lists(st.sampled_from([*HANDLER_KWARGS, "pods", "server", "gone", "request"]), unique=True, max_size=6))
def test_a_predicate_may_name_exactly_the_arguments_handlers_get(names: list[str]) -> None:
    plugin = Plugin("p")
    predicate = _predicate_taking(names)
    unknown = [name for name in names if name not in HANDLER_KWARGS]
    if unknown:
        with pytest.raises(PluginDefinitionError, match=f"parameter {unknown[0]!r}"):
            plugin.on(PRE_CREATE, when=predicate)
    else:
        plugin.on(PRE_CREATE, when=predicate)(lambda **kwargs: None)
        handler = plugin.handler(PRE_CREATE)
        assert handler is not None and handler.when is predicate
        assert filtered_reason(handler) == f"when={handler.when_name} is false"
        assert handler.when_name.endswith("_predicate_taking.<locals>.predicate")


def test_the_filter_belongs_to_the_points_it_was_given_with() -> None:
    plugin = Plugin("p")

    async def handler(**kwargs: Any) -> None: ...

    plugin.on(PRE_CREATE, when=never)(handler)
    plugin.on(HookPoint.POST_START_CONTAINER)(handler)  # the same function, unfiltered there
    filtered, plain = plugin.handler(PRE_CREATE), plugin.handler(HookPoint.POST_START_CONTAINER)
    assert filtered is not None and filtered.when is never and filtered.never_suspends
    assert plain is not None and plain.when is None and filtered_reason(plain) == ""


# --- the runner ----------------------------------------------------------------------------------


async def test_a_false_answer_calls_nothing_and_counts_as_skipped(tasks: TaskCount) -> None:
    entered: list[str] = []
    runner = runner_of(filtered_plugin(never, entered), filtered_plugin(always, entered, name="q"))
    made = tasks.made
    result = await runner.run(PRE_CREATE, pod=POD)
    assert entered == ["q"] and tasks.made == made + 1  # q's task only
    assert result.skipped == {"p": f"when={__name__}.never is false"}
    assert result.applied == ["q"] and result.failures == []
    assert dict(result.response.annotations) == {"q/seen": "yes"}
    assert calls(runner, "p") == {} and calls(runner, "q") == {"ok": 1.0}


async def test_a_filtered_call_is_said_at_debug_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_min_level", 10)  # debug lines on (as --log-level debug sets it)
    runner = runner_of(filtered_plugin(never, []))
    with capture_logs() as captured:
        await runner.run(PRE_CREATE, pod=POD)
    [line] = [entry for entry in captured if entry["event"] == "plugin not called"]
    assert line["log_level"] == "debug" and line["plugin"] == "p"
    assert line["reason"] == f"when={__name__}.never is false"


async def test_the_predicate_sees_the_handlers_arguments_and_decides_per_call() -> None:
    seen: list[dict[str, Any]] = []

    def only_be(*, qos: str, **kwargs: Any) -> bool:
        seen.append({"qos": qos, **kwargs})
        return qos == "BE"

    entered: list[str] = []
    runner = runner_of(filtered_plugin(only_be, entered))
    ls, be = await runner.run(PRE_CREATE, pod=POD), await runner.run(PRE_CREATE, pod=BE_POD)
    assert entered == ["p"]
    assert "p" in ls.skipped and ls.applied == []
    assert be.skipped == {} and be.applied == ["p"] and dict(be.response.annotations) == {"p/seen": "yes"}
    assert [set(kwargs) for kwargs in seen] == [set(HANDLER_KWARGS)] * 2
    assert [kwargs["pod"].uid for kwargs in seen] == ["u1", "u2"]
    assert calls(runner, "p") == {"ok": 1.0}


@pytest.mark.parametrize(("answer", "called"), [(1, True), ("yes", True), (0, False), (None, False), ("", False)])
async def test_any_true_value_calls_the_handler_any_false_one_does_not(answer: Any, called: bool) -> None:
    entered: list[str] = []
    runner = runner_of(filtered_plugin(lambda **kwargs: answer, entered))
    result = await runner.run(PRE_CREATE, pod=POD)
    assert (entered == ["p"]) is called and ("p" in result.skipped) is not called


def _raises(**kwargs: Any) -> bool:
    raise KeyError("interface")


async def test_a_raising_predicate_is_the_plugins_failure_under_ignore() -> None:
    entered: list[str] = []
    runner = runner_of(filtered_plugin(_raises, entered), filtered_plugin(always, entered, name="q"))
    with capture_logs() as captured:
        result = await runner.run(PRE_CREATE, pod=POD)
    assert entered == ["q"] and result.applied == ["q"] and result.skipped == {}
    [failure] = result.failures
    assert (failure.plugin, failure.outcome) == ("p", "error")
    assert failure.reason == f"when={__name__}._raises: KeyError: 'interface'"
    assert calls(runner, "p") == {"error": 1.0}
    [line] = [entry for entry in captured if entry["event"] == "plugin failed; its changes are ignored"]
    assert line["plugin"] == "p" and line["reason"] == failure.reason


async def test_a_raising_predicate_fails_the_hook_call_under_fail() -> None:
    entered: list[str] = []
    runner = runner_of(filtered_plugin(_raises, entered, failure_policy="fail"))
    with pytest.raises(HookCallFailed, match=r"plugin p failed at PreCreateContainer: when=.*_raises: KeyError"):
        await runner.run(PRE_CREATE, pod=POD)
    assert entered == [] and calls(runner, "p") == {"error": 1.0}


async def test_a_false_answer_under_fail_is_no_failure() -> None:
    runner = runner_of(filtered_plugin(never, [], failure_policy="fail"))
    result = await runner.run(PRE_CREATE, pod=POD)
    assert result.failures == [] and list(result.skipped) == ["p"]


async def test_an_awaitable_answer_is_an_error_and_is_closed() -> None:
    runner = runner_of(filtered_plugin(lambda **kwargs: asyncio.sleep(0, True), []))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would be a RuntimeWarning
        result = await runner.run(PRE_CREATE, pod=POD)
    [failure] = result.failures
    assert failure.outcome == "error" and "returned an awaitable" in failure.reason


async def test_an_answer_without_truth_value_is_an_error() -> None:
    class Undecided:
        def __bool__(self) -> bool:
            raise ValueError("ambiguous")

    runner = runner_of(filtered_plugin(lambda **kwargs: Undecided(), []))
    [failure] = (await runner.run(PRE_CREATE, pod=POD)).failures
    assert failure.outcome == "error" and failure.reason.endswith("ValueError: ambiguous")


async def test_a_plugin_skipped_for_other_reasons_never_asks_its_predicate() -> None:
    asked: list[str] = []
    plugin = Plugin("needy", needs=("resctrl",))
    plugin.on(PRE_CREATE, when=lambda **kwargs: asked.append("asked"))(lambda **kwargs: None)
    result = await runner_of(plugin).run(PRE_CREATE, pod=POD)
    assert asked == [] and result.skipped == {"needy": "needs resctrl, which this node lacks"}


# --- the network plugin --------------------------------------------------------------------------


async def test_network_with_shaping_off_calls_no_handler_and_makes_no_task(tasks: TaskCount) -> None:
    runner = runner_of(network.plugin)  # the default policy: no interface, so on_start shapes nothing
    assert await runner.start() == []
    made = tasks.made
    for point in NETWORK_POINTS:
        result = await runner.run(point, pod=POD)
        assert result.skipped == {"network": f"when={network.__name__}._shaping is false"}
        assert result.failures == [] and result.applied == [] and result.response.is_empty()
        assert calls(runner, "network", point.value) == {}
    assert tasks.made == made
    await runner.stop()


async def test_network_with_shaping_on_still_classifies_and_forgets(tasks: TaskCount) -> None:
    runner = runner_of(network.plugin)
    state = runner.state_of("network")
    state.shaper = object()  # what on_start sets when the policy names an interface
    done: list[tuple[str, str]] = []
    state.classify = lambda pod, qos, cgroups, log: done.append(("classify", pod.uid))
    state.forget = lambda pod, log: done.append(("forget", pod.uid))
    made = tasks.made
    for point in NETWORK_POINTS:
        result = await runner.run(point, pod=POD)
        assert result.applied == ["network"] and result.skipped == {} and result.failures == []
        assert calls(runner, "network", point.value) == {"ok": 1.0}
    assert done == [("classify", "u1"), ("classify", "u1"), ("forget", "u1")]
    assert tasks.made > made  # each call is a task of its own (it awaits a thread)


async def test_explain_rehearses_network_only_when_the_policy_names_an_interface(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v1(tmp_path / "cgroup")

    async def rehearse(policy: str) -> tuple[Any, list[Any]]:
        with capture_logs() as captured:
            e = await explain_manifest(
                PODS / "be-pod.yaml",
                [network.plugin],
                cgroup_root=tree.root,
                resctrl_root=tmp_path / "no-resctrl",
                policy=policy_from(policy, network.plugin),
            )
        return e, [entry for entry in captured if entry["event"] == "network: pod goes to its band (dry run)"]

    shaped, rehearsed = await rehearse("network: {interface: nosuch0, link_speed_mbit: 100}")
    [report] = shaped.plugins
    assert report.not_called == "" and len(rehearsed) == 2  # PreCreateContainer and PostStartContainer
    assert rehearsed[0]["band"] == "BE"

    idle, rehearsed = await rehearse("network: {interface: ''}")
    [report] = idle.plugins
    assert rehearsed == [] and report.not_called == ""  # filtered per call: not "not called" for the pod
    assert idle.idle_reasons["network"].startswith('network.interface is ""')
