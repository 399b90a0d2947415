"""Notifications answered before their hooks, in per-pod order (hooks/nri/ordering.py, service.py),
and the OOM score a PreCreateContainer answer sets, written at PostStartContainer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.nri.nri_metrics import NriMetrics
from runtimeproxy.hooks.nri.oom import OomScores
from runtimeproxy.hooks.nri.ordering import PodQueues
from runtimeproxy.hooks.nri.service import NriHooks
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.sdk import HookResponse, Plugin
from test_nri_mapping import call, nri_container, nri_pod
from test_nri_oom import CID, fake_process

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri
from runtimeproxy.hookapi.hookpoints import HookPoint

# -- PodQueues ---------------------------------------------------------------------------------------------


async def test_work_for_one_key_runs_in_submission_order_and_keys_run_side_by_side() -> None:
    queues = PodQueues()
    log: list[str] = []
    release = asyncio.Event()

    async def step(name: str, wait: asyncio.Event | None = None) -> str:
        log.append(f"{name} start")
        if wait is not None:
            await wait.wait()
        log.append(f"{name} end")
        return name

    first = queues.submit("pod", lambda: step("a1", release))
    second = queues.submit("pod", lambda: step("a2"))
    other = queues.submit("other", lambda: step("b1"))
    assert await other == "b1"  # not held up by the other pod's blocked work
    assert log == ["a1 start", "b1 start", "b1 end"]
    release.set()
    assert (await first, await second) == ("a1", "a2")
    assert log[3:] == ["a1 end", "a2 start", "a2 end"]
    assert len(queues) == 0


async def test_run_uses_the_callers_task_when_idle_and_keeps_the_order_either_way() -> None:
    queues = PodQueues()
    log: list[str] = []
    release = asyncio.Event()

    async def step(name: str, wait: asyncio.Event | None = None) -> asyncio.Task[Any] | None:
        log.append(f"{name} start")
        if wait is not None:
            await wait.wait()
        log.append(f"{name} end")
        return asyncio.current_task()

    async def caller() -> tuple[asyncio.Task[Any] | None, asyncio.Task[Any] | None]:
        return asyncio.current_task(), await queues.run("pod", lambda: step("a1", release))

    first = asyncio.get_running_loop().create_task(caller())
    await asyncio.sleep(0)  # a1 runs in its caller's task and waits
    later = queues.submit("pod", lambda: step("a2"))  # arrives meanwhile: waits for a1
    queued = asyncio.get_running_loop().create_task(queues.run("pod", lambda: step("a3")))
    await asyncio.sleep(0)
    assert log == ["a1 start"]
    release.set()
    own, ran_in = await first
    assert ran_in is own  # no task of its own
    await later
    assert await queued is not None
    assert log == ["a1 start", "a1 end", "a2 start", "a2 end", "a3 start", "a3 end"]
    assert len(queues) == 0


async def test_a_failed_or_cancelled_earlier_item_does_not_block_the_pod() -> None:
    queues = PodQueues()

    async def fail() -> None:
        raise KeyError("earlier")

    async def hang() -> None:
        await asyncio.sleep(3600)

    async def value() -> int:
        return 7

    failed = queues.submit("pod", fail)
    hung = queues.submit("pod", hang)
    later = queues.submit("pod", value)
    with pytest.raises(KeyError):
        await failed
    hung.cancel()
    assert await later == 7
    # cancelling a queued item cancels it alone, not the one it waits for
    blocker = asyncio.Event()

    async def wait_blocker() -> str:
        await blocker.wait()
        return "ran"

    running = queues.submit("pod", wait_blocker)
    queued = queues.submit("pod", value)
    await asyncio.sleep(0)
    queued.cancel()
    blocker.set()
    assert await running == "ran"
    with pytest.raises(asyncio.CancelledError):
        await queued
    await queues.drain()
    assert len(queues) == 0


# -- the service: notifications first, hooks after -------------------------------------------------------


class Gate:
    """A plugin whose PostStartContainer hook blocks until released; every hook logs its call."""

    def __init__(self, failure_policy: str = "ignore") -> None:
        self.calls: list[str] = []
        self.release = asyncio.Event()
        self.plugin = Plugin("gate", version="1", failure_policy=failure_policy, timeout=5.0)
        self.plugin.on(HookPoint.POST_START_CONTAINER)(self.post_start)
        self.plugin.on(HookPoint.PRE_CREATE_CONTAINER)(self.pre_create)

    async def post_start(self, *, container: Any, **kwargs: Any) -> None:
        self.calls.append(f"post-start {container.name}")
        await self.release.wait()
        if self.plugin.failure_policy == "fail":
            raise RuntimeError("post-start broke")
        self.calls.append(f"post-start {container.name} done")

    async def pre_create(self, *, container: Any, response: HookResponse, **kwargs: Any) -> None:
        self.calls.append(f"pre-create {container.name}")
        response.resources.oom_score_adj = 1000


def make(gate: Gate, proc: Path) -> tuple[NriHooks, CollectorRegistry]:
    registry = CollectorRegistry()
    hooks = NriHooks(PluginRunner([gate.plugin], registry=registry), NriMetrics(registry), oom=OomScores(proc))
    return hooks, registry


def started(name: str, container_id: str = CID, pid: int = 42) -> Any:
    container = nri_container()
    container.name, container.id, container.pid = name, container_id, pid
    return nri.StateChangeEvent(event=nri.POST_START_CONTAINER, pod=nri_pod(), container=container)


async def test_post_start_is_answered_before_its_hooks_and_the_pods_next_event_waits(tmp_path: Path) -> None:
    gate = Gate()
    hooks, registry = make(gate, tmp_path)
    assert await asyncio.wait_for(call(hooks, "StateChange", started("app")), 1.0) == b""  # answered at once
    await asyncio.sleep(0.01)
    assert gate.calls == ["post-start app"]  # its hooks still run
    # the same pod's next CreateContainer waits for them, then runs and is answered
    second = nri_container()
    second.name, second.id = "side", "c2"
    create = asyncio.ensure_future(
        call(hooks, "CreateContainer", nri.CreateContainerRequest(pod=nri_pod(), container=second))
    )
    await asyncio.sleep(0.05)
    assert not create.done() and gate.calls == ["post-start app"]
    gate.release.set()
    await asyncio.wait_for(create, 2.0)
    assert gate.calls == ["post-start app", "post-start app done", "pre-create side"]
    assert (
        registry.get_sample_value("runtimehooks_nri_events_total", {"event": "PostStartContainer", "outcome": "ok"})
        == 1
    )


async def test_a_fail_plugin_failing_at_a_notification_is_logged_and_counted(tmp_path: Path) -> None:
    gate = Gate("fail")
    gate.release.set()
    hooks, registry = make(gate, tmp_path)
    assert await call(hooks, "StateChange", started("app")) == b""  # the runtime is not told
    await hooks.queues.drain()
    labels = {"event": "PostStartContainer", "outcome": "failed"}
    assert registry.get_sample_value("runtimehooks_nri_events_total", labels) == 1.0
    # (at an event answered after its hooks it fails the runtime's call: test_nri_mapping.py)


async def test_the_create_answers_oom_score_is_written_at_post_start(tmp_path: Path) -> None:
    gate = Gate()
    gate.release.set()
    hooks, registry = make(gate, tmp_path)
    oom_file = fake_process(tmp_path, 42, "500\n")
    container = nri_container()
    container.id = CID
    answer = nri.CreateContainerResponse.FromString(
        await call(hooks, "CreateContainer", nri.CreateContainerRequest(pod=nri_pod(), container=container))
    )
    assert not answer.adjust.linux.resources.HasField("cpu")  # nothing for NRI to carry
    assert registry.get_sample_value("runtimehooks_nri_not_applied_total", {"field": "resources.oom_score_adj"}) is None
    await call(hooks, "StateChange", started("app"))
    await hooks.queues.drain()
    assert oom_file.read_text() == "1000\n"


async def test_an_oom_score_that_cannot_be_written_is_counted_as_not_applied(tmp_path: Path) -> None:
    gate = Gate()
    gate.release.set()
    hooks, registry = make(gate, tmp_path)
    container = nri_container()
    container.id = CID
    await call(hooks, "CreateContainer", nri.CreateContainerRequest(pod=nri_pod(), container=container))
    await call(hooks, "StateChange", started("app", pid=0))  # no pid given
    await hooks.queues.drain()
    labels = {"field": "resources.oom_score_adj"}
    assert registry.get_sample_value("runtimehooks_nri_not_applied_total", labels) == 1.0
    # a container stopped before it started: forgotten, nothing written later
    await call(hooks, "CreateContainer", nri.CreateContainerRequest(pod=nri_pod(), container=container))
    await call(hooks, "StopContainer", nri.StopContainerRequest(pod=nri_pod(), container=container))
    assert len(hooks.oom) == 0


async def test_stopping_gives_running_hooks_a_grace_then_cancels_them(tmp_path: Path) -> None:
    gate = Gate()
    hooks, _ = make(gate, tmp_path)
    await call(hooks, "StateChange", started("app"))
    await asyncio.sleep(0.01)
    await hooks.close(grace=0.05)
    assert gate.calls == ["post-start app"] and len(hooks.queues) == 0
