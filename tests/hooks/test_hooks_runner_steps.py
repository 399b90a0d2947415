"""How PluginRunner runs an ``async def`` handler: one that can suspend as a task of its own under its
timeout (so its own ``asyncio.timeout()`` stays its own), one whose body has no await to its end in
the hook call itself; the same outcomes, answers, context isolation and metrics either way."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks import plugin_runner as runner_mod
from runtimeproxy.hooks.definition import never_suspends
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.sdk import ContainerInfo, Plugin, PodInfo

from runtimeproxy.hookapi.hookpoints import HookPoint

CREATE = HookPoint.PRE_CREATE_CONTAINER
POD = PodInfo(name="web", namespace="default", uid="u-1", cgroup_parent="/kubepods/burstable/podu-1")
CONTAINER = ContainerInfo(name="app")
SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("SEEN", default="unset")


def runner(*plugins: Plugin) -> PluginRunner:
    return PluginRunner(plugins, registry=CollectorRegistry())


def calls(run: PluginRunner, plugin: str, outcome: str) -> float:
    labels = {"plugin": plugin, "hook": CREATE.value, "outcome": outcome}
    return run.metrics.registry.get_sample_value("runtimeproxy_hooks_plugin_calls_total", labels) or 0.0


def observed(run: PluginRunner, plugin: str) -> float:
    labels = {"plugin": plugin, "hook": CREATE.value}
    return run.metrics.registry.get_sample_value("runtimeproxy_hooks_plugin_call_duration_seconds_count", labels) or 0.0


@pytest.mark.parametrize("suspensions", [0, 1, 3])
async def test_a_handler_answers_the_same_whether_or_not_it_suspends(suspensions: int) -> None:
    plugin = Plugin("p", timeout=5.0)

    @plugin.on(CREATE)
    async def handler(*, response: Any, **kwargs: Any) -> None:
        for _ in range(suspensions):
            await asyncio.sleep(0)
        response.annotations["steps"] = str(suspensions)

    run = runner(plugin)
    result = await run.run(CREATE, pod=POD, container=CONTAINER)
    assert result.applied == ["p"] and result.failures == []
    assert result.response.annotations == {"steps": str(suspensions)}
    assert calls(run, "p", "ok") == 1


@pytest.mark.parametrize("suspend_first", [False, True])
async def test_an_exception_before_or_after_a_suspension_is_the_plugins_error(suspend_first: bool) -> None:
    plugin = Plugin("p")

    @plugin.on(CREATE)
    async def handler(**kwargs: Any) -> None:
        if suspend_first:
            await asyncio.sleep(0)
        raise RuntimeError("boom")

    run = runner(plugin)
    result = await run.run(CREATE, pod=POD, container=CONTAINER)
    assert [(f.outcome, f.reason) for f in result.failures] == [("error", "RuntimeError: boom")]
    assert calls(run, "p", "error") == 1


async def test_a_handler_raising_cancelled_error_itself_is_an_error_named_cancelled() -> None:
    plugin = Plugin("p")

    @plugin.on(CREATE)
    async def handler(**kwargs: Any) -> None:
        raise asyncio.CancelledError

    result = await runner(plugin).run(CREATE, pod=POD, container=CONTAINER)
    assert [(f.outcome, f.reason) for f in result.failures] == [("error", "cancelled")]


@pytest.mark.parametrize("suspend", [False, True])
async def test_context_variables_a_handler_sets_stay_its_own(suspend: bool) -> None:
    first, second = Plugin("first", order=1), Plugin("second", order=2)
    seen: list[str] = []

    @first.on(CREATE)
    async def setter(**kwargs: Any) -> None:
        SEEN.set("first")
        if suspend:
            await asyncio.sleep(0)
        seen.append(SEEN.get())

    @second.on(CREATE)
    async def reader(**kwargs: Any) -> None:
        seen.append(SEEN.get())

    await runner(first, second).run(CREATE, pod=POD, container=CONTAINER)
    assert seen == ["first", "unset"]
    assert SEEN.get() == "unset"


async def test_a_suspended_handler_past_its_timeout_after_a_slow_first_step_times_out() -> None:
    plugin = Plugin("p", timeout=0.05)
    cancelled = asyncio.Event()

    @plugin.on(CREATE)
    async def handler(**kwargs: Any) -> None:
        await asyncio.sleep(0)  # suspends once, then waits past the timeout
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    run = runner(plugin)
    result = await asyncio.wait_for(run.run(CREATE, pod=POD, container=CONTAINER), 5)
    assert [(f.outcome, f.reason) for f in result.failures] == [("timeout", "no answer within 0.05s")]
    await asyncio.wait_for(cancelled.wait(), 2)
    assert calls(run, "p", "timeout") == 1


async def test_cancelling_the_hook_call_cancels_a_suspended_handler() -> None:
    plugin = Plugin("p", timeout=30.0)
    waiting, cleaned = asyncio.Event(), asyncio.Event()

    @plugin.on(CREATE)
    async def handler(**kwargs: Any) -> None:
        waiting.set()
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.set()

    call = asyncio.ensure_future(runner(plugin).run(CREATE, pod=POD, container=CONTAINER))
    await asyncio.wait_for(waiting.wait(), 2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(cleaned.wait(), 2)


async def test_a_handler_awaiting_a_future_gets_its_result_and_its_exception() -> None:
    plugin = Plugin("p")
    got: list[Any] = []

    @plugin.on(CREATE)
    async def handler(**kwargs: Any) -> None:
        loop = asyncio.get_running_loop()
        ok, bad = loop.create_future(), loop.create_future()
        loop.call_soon(ok.set_result, 42)
        loop.call_soon(bad.set_exception, ValueError("no"))
        got.append(await ok)
        try:
            await bad
        except ValueError as exc:
            got.append(str(exc))

    result = await runner(plugin).run(CREATE, pod=POD, container=CONTAINER)
    assert result.failures == []
    assert got == [42, "no"]


async def test_every_call_is_counted_by_outcome_and_timed() -> None:
    plugin = Plugin("p")
    fail = [False, False, True]

    @plugin.on(CREATE)
    async def handler(**kwargs: Any) -> None:
        if fail.pop(0):
            raise RuntimeError("third")

    run = runner(plugin)
    for _ in range(3):
        await run.run(CREATE, pod=POD, container=CONTAINER)
    assert (calls(run, "p", "ok"), calls(run, "p", "error")) == (2, 1)
    assert observed(run, "p") == 3


async def test_reconcile_handlers_return_their_repairs_with_or_without_suspending() -> None:
    quick, slow = Plugin("quick", order=1), Plugin("slow", order=2)

    @quick.reconcile
    async def repaired_now(**kwargs: Any) -> int:
        return 2

    @slow.reconcile
    async def repaired_later(**kwargs: Any) -> int:
        await asyncio.sleep(0)
        return 3

    report = await runner(quick, slow).reconcile_report(pods=[POD])
    assert report.repaired == {"quick": 2, "slow": 3}
    assert report.failures == []


async def test_a_handlers_own_asyncio_timeout_is_its_own() -> None:
    """A handler that opens ``asyncio.timeout()`` before its first await (as clients such as aiohttp
    do inside) gets its TimeoutError itself: the hook call goes on with the other plugins."""
    first, second = Plugin("first", order=1), Plugin("second", order=2)

    @first.on(CREATE)
    async def slow_client(**kwargs: Any) -> None:
        async with asyncio.timeout(0.05):
            await asyncio.sleep(30)

    @second.on(CREATE)
    async def stamp(*, response: Any, **kwargs: Any) -> None:
        response.annotations["second"] = "ran"

    result = await asyncio.wait_for(runner(first, second).run(CREATE, pod=POD, container=CONTAINER), 5)
    assert [(f.plugin, f.outcome) for f in result.failures] == [("first", "error")]
    assert "TimeoutError" in result.failures[0].reason
    assert result.response.annotations == {"second": "ran"}


# -- handlers that cannot suspend run in the hook call itself ------------------------------------------


async def _no_await(**kwargs: Any) -> None:
    pass


async def _awaits(**kwargs: Any) -> None:
    await asyncio.sleep(0)


async def _async_with(**kwargs: Any) -> None:
    async with asyncio.Lock():
        pass


async def _async_for(**kwargs: Any) -> None:
    async def numbers() -> Any:
        yield 1

    async for _ in numbers():
        pass


async def _async_comprehension(**kwargs: Any) -> list[int]:
    async def numbers() -> Any:
        yield 1

    return [n async for n in numbers()]


async def _nested_await_only(**kwargs: Any) -> None:
    async def inner() -> None:  # defined, never awaited here: the handler itself cannot suspend
        await asyncio.sleep(0)

    del inner


class _AsyncCallable:
    async def __call__(self, **kwargs: Any) -> None:
        pass


def _sync(**kwargs: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (_no_await, True),
        (_nested_await_only, True),
        (_awaits, False),
        (_async_with, False),
        (_async_for, False),
        (_async_comprehension, False),
        (_AsyncCallable(), False),  # not a plain function: run the general way
        (functools.partial(_no_await), False),
        (_sync, False),
    ],
)
def test_which_handlers_never_suspend(fn: Any, expected: bool) -> None:
    assert never_suspends(fn) is expected


async def test_a_handler_without_await_runs_in_the_hook_call_and_one_with_await_in_a_task_of_its_own() -> None:
    inline, tasked = Plugin("inline", order=1), Plugin("tasked", order=2)
    tasks: dict[str, asyncio.Task[Any] | None] = {}

    @inline.on(CREATE)
    async def quick(**kwargs: Any) -> None:
        tasks["inline"] = asyncio.current_task()

    @tasked.on(CREATE)
    async def slow(**kwargs: Any) -> None:
        tasks["tasked"] = asyncio.current_task()
        await asyncio.sleep(0)

    assert inline.handler(CREATE).never_suspends and not tasked.handler(CREATE).never_suspends  # type: ignore[union-attr]
    result = await runner(inline, tasked).run(CREATE, pod=POD, container=CONTAINER)
    assert result.applied == ["inline", "tasked"]
    assert tasks["inline"] is asyncio.current_task()
    assert tasks["tasked"] is not None and tasks["tasked"] is not asyncio.current_task()


@pytest.mark.parametrize("per_pod", [0.0, 60.0], ids=["plugin-timeout-only", "with-the-per-pod-allowance"])
async def test_a_reconcile_round_gets_its_plugins_timeout_plus_an_allowance_per_pod(
    monkeypatch: pytest.MonkeyPatch, per_pod: float
) -> None:
    """A round walks every live pod (in slices: hooks/pacing.py), so it may outlast one hook call."""
    monkeypatch.setattr(runner_mod, "RECONCILE_SECONDS_PER_POD", per_pod)
    plugin = Plugin("p", timeout=0.01)

    @plugin.reconcile
    async def walk(*, pods: Any, **kwargs: Any) -> int:
        await asyncio.sleep(0.05)  # past the plugin's own timeout
        return len(pods)

    report = await runner(plugin).reconcile_report(pods=[POD, POD])
    if per_pod:
        assert report.repaired == {"p": 2} and report.failures == []
    else:
        assert [(f.outcome, f.reason) for f in report.failures] == [("timeout", "no answer within 0.01s")]


async def test_a_deadline_is_asked_for_only_where_a_handler_can_wait_and_ends_the_call_past_it() -> None:
    quick = Plugin("quick", version="1")
    waits = Plugin("waits", version="1", timeout=5.0)
    shaping = False

    @quick.on(CREATE)
    async def at_once(*, response: Any, **kwargs: Any) -> None:
        response.resources.cpu_shares = 2

    @waits.on(CREATE, when=lambda **kwargs: shaping)
    async def later(**kwargs: Any) -> None:
        await asyncio.sleep(0.2)

    asked: list[float] = []

    def deadline() -> float:
        asked.append(asyncio.get_running_loop().time() + 0.05)
        return asked[-1]

    run = runner(quick, waits)
    result = await run.run(CREATE, pod=POD, container=CONTAINER, deadline=deadline)
    assert result.response.resources.cpu_shares == 2 and asked == []  # nothing could wait: no timer
    shaping = True
    with pytest.raises(TimeoutError):
        await run.run(CREATE, pod=POD, container=CONTAINER, deadline=deadline)
    assert len(asked) == 1  # asked once, for the handler that waits
    result = await run.run(CREATE, pod=POD, container=CONTAINER)  # no deadline: the plugin's own timeout
    assert result.applied == ["quick", "waits"]


async def test_on_start_gets_more_than_a_hook_call_and_still_has_an_end(monkeypatch: pytest.MonkeyPatch) -> None:
    slow = Plugin("slow", version="1", timeout=0.05)  # a hook call's budget
    took: list[float] = [0.3]

    @slow.on_start
    def setup(**kwargs: Any) -> None:
        time.sleep(took[0])  # longer than a hook call may take, as a tc tree on a busy node does

    @slow.on(CREATE)
    async def noop(**kwargs: Any) -> None:
        return None

    assert await runner(slow).start() == []  # started: on_start had LIFECYCLE_SECONDS
    monkeypatch.setattr(runner_mod, "LIFECYCLE_SECONDS", 0.1)
    took[0] = 1.0
    run = runner(slow)
    [failure] = await run.start()
    assert (failure.plugin, failure.outcome) == ("slow", "timeout")
    assert failure.reason == "no answer within 0.1s (its thread runs on)"
    assert run.plugins == ()  # an "ignore" plugin whose on_start failed is disabled
