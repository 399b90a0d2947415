"""The counters the alerts watch exist at 0 before the first failure they count.

An alert on ``increase(counter[w]) > 0`` needs a sample before the failure to increase from: a
series born with its first count (1) has none, so the first failure since a daemon started would
never alert. Each daemon therefore exports, as soon as it knows them, every series a failure can
move: runtime-hooks its plugins' calls by hook and outcome (and the container repair's), the NRI
events it subscribed by outcome; runtime-proxy each registered hook server's calls by hook and
outcome.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from metric_samples import samples_of
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.container_repair import REPAIR_LABEL, ContainerRepair
from runtimeproxy.hooks.nri.nri_metrics import EVENT_OUTCOMES, NriMetrics
from runtimeproxy.hooks.nri.service import NriHooks
from runtimeproxy.hooks.plugin_runner import OUTCOMES, PluginRunner
from runtimeproxy.hooks.sdk import HookResponse, Plugin
from runtimeproxy.hooks.testkit.builders import pod

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri
from runtimeproxy.dispatch.dispatcher import Dispatcher, HookCallOutcome, HookMetrics
from runtimeproxy.dispatch.registry import HookRegistry
from runtimeproxy.hookapi.hookpoints import HookPoint

PLUGIN_CALLS = "runtimeproxy_hooks_plugin_calls_total"


async def call(hooks: NriHooks, name: str, message: Any) -> bytes:
    return await hooks.methods()[("nri.pkg.api.v1alpha1.Plugin", name)](message.SerializeToString(), 2.0)


def sample_plugin() -> Plugin:
    plugin = Plugin("stamp", version="1", failure_policy="ignore", timeout=5.0)

    @plugin.on(HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
    async def stamp(*, response: HookResponse, **kwargs: Any) -> None:
        response.annotations["stamped"] = "yes"

    @plugin.reconcile
    async def reconcile(**kwargs: Any) -> int:
        return 0

    return plugin


def quiet_plugin() -> Plugin:
    """A plugin with a start handler and one hook point: no stop, no reconcile."""
    plugin = Plugin("quiet", version="1", failure_policy="ignore", timeout=5.0)

    @plugin.on_start
    def start(**kwargs: Any) -> None:
        pass

    @plugin.on(HookPoint.POST_START_CONTAINER)
    async def started(**kwargs: Any) -> None:
        pass

    return plugin


def plugin_calls(plugin: str, hook: str, outcome: str) -> tuple[tuple[str, str], ...]:
    return (("hook", hook), ("outcome", outcome), ("plugin", plugin))


def test_a_runner_exports_each_plugins_calls_at_zero_where_it_can_be_called(runners: list[PluginRunner]) -> None:
    registry = CollectorRegistry()
    runner = PluginRunner([sample_plugin(), quiet_plugin()], registry=registry)
    runners.append(runner)
    hooks = {
        "stamp": ("PreCreateContainer", "PreUpdateContainerResources", "reconcile"),
        "quiet": ("PostStartContainer", "start"),
    }
    expected = {
        plugin_calls(p, hook, outcome): 0.0 for p, named in hooks.items() for hook in named for outcome in OUTCOMES
    }
    assert samples_of(registry, PLUGIN_CALLS) == expected
    ContainerRepair(runner)  # its calls are counted as "repair": the plugins answering at its point
    repair = {plugin_calls("stamp", REPAIR_LABEL, outcome): 0.0 for outcome in OUTCOMES}
    assert samples_of(registry, PLUGIN_CALLS) == expected | repair


async def test_a_counted_failure_is_an_increase_from_zero(runners: list[PluginRunner]) -> None:
    registry = CollectorRegistry()
    plugin = Plugin("flaky", version="1", failure_policy="ignore", timeout=5.0)

    @plugin.on(HookPoint.PRE_RUN_POD_SANDBOX)
    async def fail(**kwargs: Any) -> None:
        raise RuntimeError("no")

    runner = PluginRunner([plugin], registry=registry)
    runners.append(runner)
    failed = plugin_calls("flaky", "PreRunPodSandbox", "error")
    assert samples_of(registry, PLUGIN_CALLS)[failed] == 0.0
    result = await runner.run(HookPoint.PRE_RUN_POD_SANDBOX, pod=pod("web"))
    assert [failure.outcome for failure in result.failures] == ["error"]
    assert samples_of(registry, PLUGIN_CALLS)[failed] == 1.0


async def test_nri_configure_exports_the_subscribed_events_at_zero(runners: list[PluginRunner]) -> None:
    runner = PluginRunner([sample_plugin()], registry=CollectorRegistry())
    runners.append(runner)
    metrics = CollectorRegistry()
    hooks = NriHooks(runner, NriMetrics(metrics))
    assert samples_of(metrics, "runtimehooks_nri_events_total") == {}  # not before it knows what it handles
    request = nri.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24")
    answer = nri.ConfigureResponse.FromString(await call(hooks, "Configure", request))
    assert answer.events & (1 << (nri.CREATE_CONTAINER - 1))
    assert answer.events & (1 << (nri.UPDATE_CONTAINER - 1))
    events = ("CreateContainer", "UpdateContainer")
    got = samples_of(metrics, "runtimehooks_nri_events_total")
    assert {(("event", e), ("outcome", o)): 0.0 for e in events for o in EVENT_OUTCOMES}.items() <= got.items()
    assert set(got.values()) == {0.0}


@pytest.fixture
async def hook_config_dir() -> AsyncIterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="rpx-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


async def test_the_proxy_exports_each_registered_servers_calls_at_zero(hook_config_dir: Path) -> None:
    registration = {
        "remote-endpoint": str(hook_config_dir / "gone.sock"),
        "runtime-hooks": ["PreRunPodSandbox", "PostStartContainer"],
    }
    (hook_config_dir / "a.json").write_text(json.dumps(registration))
    metrics = CollectorRegistry()
    registry = HookRegistry(str(hook_config_dir))
    dispatcher = Dispatcher(registry, HookMetrics(metrics))
    try:
        assert samples_of(metrics, "runtimeproxy_hook_calls_total") == {}
        assert registry.scan() is True
        await asyncio.sleep(0)
        expected = {
            (("hook", hook), ("outcome", outcome.value), ("server", "a.json")): 0.0
            for hook in ("PreRunPodSandbox", "PostStartContainer")
            for outcome in HookCallOutcome
        }
        assert samples_of(metrics, "runtimeproxy_hook_calls_total") == expected
    finally:
        await dispatcher.close()
