"""Deferred node writes (hooks/write_queue.py): an "ignore" plugin's cgroup writes at a deferring
hook call land after the call, in order, before anything that could see them; a "fail" plugin's
and a non-deferring call's land inline; failures are logged and counted; a stop applies them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.cgroups import CgroupFS
from runtimeproxy.hooks.definition import Plugin
from runtimeproxy.hooks.runner import PluginRunner, pod_key
from runtimeproxy.hooks.testkit.builders import container as make_container
from runtimeproxy.hooks.testkit.builders import pod as make_pod
from runtimeproxy.hooks.testkit.cgroups import FakeCgroup, make_fake_cgroup_v1
from runtimeproxy.hooks.views import PodInfo, ServerContext
from runtimeproxy.hooks.write_queue import WriteQueue
from structlog.testing import capture_logs

from runtimeproxy.dispatch.hookpoints import HookPoint

RUN = HookPoint.PRE_RUN_POD_SANDBOX
CREATE = HookPoint.PRE_CREATE_CONTAINER
SHARES = "cpu.shares"


@pytest.fixture
def tree(tmp_path: Path) -> FakeCgroup:
    return make_fake_cgroup_v1(tmp_path / "cgroup")


@pytest.fixture
def pod(tree: FakeCgroup) -> PodInfo:
    info = make_pod("web", uid="u-1")
    return make_pod("web", uid="u-1", cgroup_parent=tree.add_pod(info.uid))


def shares(fs: CgroupFS, pod: PodInfo) -> str:
    return fs.read("cpu", SHARES, pod.cgroup_parent)


def writer(name: str, value: int, *, policy: str = "ignore", order: int = 100, point: HookPoint = RUN) -> Plugin:
    plugin = Plugin(name, failure_policy=policy, order=order)

    @plugin.on(point)
    async def write(*, pod: PodInfo, cgroups: CgroupFS, **kwargs: Any) -> None:
        cgroups.write("cpu", SHARES, value, pod.cgroup_parent)

    return plugin


def runner_for(tree: FakeCgroup, *plugins: Plugin) -> PluginRunner:
    return PluginRunner(plugins, registry=CollectorRegistry(), context=ServerContext(cgroups=tree.fs()))


def failures(runner: PluginRunner, plugin: str, hook: str) -> float:
    value = runner.metrics.registry.get_sample_value(
        "runtimeproxy_hooks_deferred_write_failures_total", {"plugin": plugin, "hook": hook}
    )
    return value or 0.0


def test_an_ignore_plugins_write_lands_after_the_call(tree: FakeCgroup, pod: PodInfo) -> None:
    runner = runner_for(tree, writer("p", 700))
    fs = tree.fs()
    before = shares(fs, pod)
    result = asyncio.run(runner.run(RUN, pod=pod, defer_writes=True))
    assert result.applied == ["p"]
    assert shares(fs, pod) == before  # answered; not written yet
    assert runner.apply_deferred(pod_key(pod)) == 0
    assert shares(fs, pod) == "700"


@pytest.mark.parametrize("defer", [False, True])
def test_a_fail_plugin_and_a_call_that_does_not_defer_write_inline(
    tree: FakeCgroup, pod: PodInfo, defer: bool
) -> None:
    runner = runner_for(tree, writer("p", 800, policy="fail" if defer else "ignore"))
    asyncio.run(runner.run(RUN, pod=pod, defer_writes=defer))
    assert shares(tree.fs(), pod) == "800"


def test_a_handler_reads_what_it_queued(tree: FakeCgroup, pod: PodInfo) -> None:
    plugin = Plugin("p")
    seen: list[str] = []

    @plugin.on(RUN)
    def write_then_read(*, pod: PodInfo, cgroups: CgroupFS, **kwargs: Any) -> None:  # sync: its own thread
        cgroups.write("cpu", SHARES, 900, pod.cgroup_parent)
        seen.append(cgroups.read("cpu", SHARES, pod.cgroup_parent))

    asyncio.run(runner_for(tree, plugin).run(RUN, pod=pod, defer_writes=True))
    assert seen == ["900"]


def test_an_inline_write_after_queued_ones_keeps_their_order(tree: FakeCgroup, pod: PodInfo) -> None:
    runner = runner_for(tree, writer("first", 300, order=1), writer("then", 400, policy="fail", order=2))
    asyncio.run(runner.run(RUN, pod=pod, defer_writes=True))
    runner.apply_deferred()
    assert shares(tree.fs(), pod) == "400"  # the queued 300 landed before the inline 400


def test_the_pods_next_hook_call_and_a_reconcile_round_see_the_writes(tree: FakeCgroup, pod: PodInfo) -> None:
    plugin = writer("p", 500)
    seen: list[str] = []

    @plugin.on(CREATE)
    async def look(*, pod: PodInfo, cgroups: CgroupFS, **kwargs: Any) -> None:
        seen.append(cgroups.read("cpu", SHARES, pod.cgroup_parent))

    @plugin.reconcile
    async def reconcile(*, pods: Any, cgroups: CgroupFS, **kwargs: Any) -> int:
        seen.extend(cgroups.read("cpu", SHARES, each.cgroup_parent) for each in pods)
        return 0

    runner = runner_for(tree, plugin)
    container = make_container("app")

    async def calls() -> None:
        await runner.run(RUN, pod=pod, defer_writes=True)
        await runner.run(CREATE, pod=pod, container=container, defer_writes=True)
        await runner.run(RUN, pod=pod, defer_writes=True)
        await runner.reconcile_report(pods=[pod])

    asyncio.run(calls())
    assert seen == ["500", "500"]


def test_a_failed_deferred_write_is_logged_and_counted_and_the_rest_land(tree: FakeCgroup, pod: PodInfo) -> None:
    plugin = Plugin("p")

    @plugin.on(RUN)
    async def two(*, pod: PodInfo, cgroups: CgroupFS, **kwargs: Any) -> None:
        cgroups.write("cpu", "cpu.cfs_quota_us", 50000, pod.cgroup_parent)
        cgroups.write("cpu", SHARES, 600, pod.cgroup_parent)

    runner = runner_for(tree, plugin)
    asyncio.run(runner.run(RUN, pod=pod, defer_writes=True))
    quota = tree.fs().path("cpu", pod.cgroup_parent, None, "cpu.cfs_quota_us")
    quota.unlink()  # the kernel's file gone before the write: the write fails (ENOENT)
    with capture_logs() as logs:
        runner.apply_deferred()
    failed = [entry for entry in logs if entry["event"] == "deferred cgroup write failed"]
    assert len(failed) == 1
    assert failed[0]["plugin"] == "p" and failed[0]["hook"] == RUN.value and failed[0]["pod"] == "default/web"
    assert "FileNotFoundError" in failed[0]["error"]
    assert failures(runner, "p", RUN.value) == 1
    assert shares(tree.fs(), pod) == "600"


def test_writes_past_the_deadline_are_cut_and_logged(tree: FakeCgroup, pod: PodInfo) -> None:
    runner = runner_for(tree, writer("p", 700))
    before = shares(tree.fs(), pod)
    asyncio.run(runner.run(RUN, pod=pod, defer_writes=True))
    with capture_logs() as logs:
        assert runner.apply_deferred(deadline=time.monotonic() - 1) == 1
    assert [entry["event"] for entry in logs] == ["deferred cgroup write not applied: too late"]
    assert shares(tree.fs(), pod) == before
    assert runner.apply_deferred() == 0  # cut means dropped, not kept for later


def test_a_stopping_runner_applies_what_is_queued(tree: FakeCgroup, pod: PodInfo) -> None:
    runner = runner_for(tree, writer("p", 750))

    async def calls() -> None:
        await runner.run(RUN, pod=pod, defer_writes=True)
        await runner.stop()

    asyncio.run(calls())
    assert shares(tree.fs(), pod) == "750"


def test_a_closed_queue_refuses_late_writes() -> None:
    queue = WriteQueue("hook", "ns/pod", lambda *args: None)
    done: list[int] = []
    assert queue.add("p", "/a", lambda: done.append(1))
    assert queue.apply(close=True) == 0
    assert not queue.add("p", "/a", lambda: done.append(2))  # the caller writes inline instead
    assert done == [1] and len(queue) == 0
