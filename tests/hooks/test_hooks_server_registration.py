"""runtime-hooks' registration follows its policy: a reload that switches a plugin off for every
QoS class drops that plugin's hook points (and its failure policy and timeout) from the
registration, and a call the proxy still makes to a dropped point, before it has read the new
file, gets the empty response, which the proxy's dispatcher takes as a valid answer."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
import test_hooks_server
from hook_servers import StaticViews
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.discovery import settings_specs
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.policy import PolicyWatcher
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.sdk import HookResponse, Plugin, ServerContext
from runtimeproxy.hooks.server import REGISTRATION_FILE, RuntimeHooksServer, ServerSettings, plugins_in_effect
from structlog.testing import capture_logs
from test_hooks_server import container_request, tuner

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.api.runtime.v1alpha1 import api_pb2_grpc as hook_grpc
from runtimeproxy.dispatch.dispatcher import Dispatcher
from runtimeproxy.dispatch.registry import FailurePolicy, HookRegistry
from runtimeproxy.hookapi.hookpoints import HookPoint

START = HookPoint.PRE_START_CONTAINER
CREATE = HookPoint.PRE_CREATE_CONTAINER
short_dir = test_hooks_server.short_dir  # the fixture, shared
CLASSES = tuple(qos.value for qos in QoSClass)


@dataclass(frozen=True)
class Switch:
    enabled: bool = True


def switchable() -> Plugin:
    """A "fail" plugin at PreStartContainer (which no other plugin here handles) and
    PreCreateContainer, switched off per QoS class by its ``enabled`` setting."""
    plugin = Plugin("switchable", order=20, failure_policy="fail", timeout=3.0, settings=Switch)

    @plugin.on(START, CREATE)
    def handler(response: HookResponse, **kwargs: Any) -> None:
        response.annotations["switchable"] = "ran"

    return plugin


async def rpc_call(endpoint: str, point: HookPoint) -> Any:
    """``point``'s RPC with a container request, through our grpc stubs."""
    async with grpc.aio.insecure_channel("unix://" + endpoint) as channel:
        return await getattr(hook_grpc.RuntimeHookServiceStub(channel), point.rpc)(container_request(), timeout=5)


def policy_text(off: tuple[str, ...]) -> str:
    return "switchable:\n" + "".join(f"  {qos}: {{enabled: false}}\n" for qos in off) if off else ""


@dataclass
class Node:
    """runtime-hooks with tuner and switchable, its policy file and watcher, and the proxy's
    registry of the same hook config directory, rescanned only when a test says so."""

    server: RuntimeHooksServer
    watcher: PolicyWatcher
    policy: Path
    config_dir: Path
    registry: HookRegistry

    @property
    def registration(self) -> dict[str, Any] | None:
        path = self.config_dir / REGISTRATION_FILE
        return json.loads(path.read_text()) if path.exists() else None

    def reload(self, *off: str) -> None:
        """Write a policy switching ``switchable`` off for the classes ``off``, and have it read."""
        scratch = self.policy.with_suffix(".tmp")
        scratch.write_text(policy_text(off))
        os.replace(scratch, self.policy)
        assert self.watcher.check()


async def start_node(short_dir: Path, plugins: list[Plugin], policy_text: str) -> Node:
    """runtime-hooks with ``plugins`` in ``short_dir``, its policy file holding ``policy_text``,
    read by a PolicyWatcher whose changes reach the server as serve's do (policy_changed)."""
    policy = short_dir / "policy.yaml"
    policy.write_text(policy_text)
    servers: list[RuntimeHooksServer] = []
    watcher = PolicyWatcher(policy, on_change=lambda p: servers[0].policy_changed(p), specs=settings_specs(plugins))
    watcher.check()
    runner = PluginRunner(plugins, registry=CollectorRegistry(), context=ServerContext(policy=lambda: watcher.current))
    config_dir = short_dir / "hookserver.d"
    settings = ServerSettings(
        endpoint=str(short_dir / "hooks.sock"), hook_config_dir=str(config_dir), stop_grace=0, deregister_grace=0
    )
    servers.append(RuntimeHooksServer(runner, settings))
    await servers[0].start()
    registry = HookRegistry(str(config_dir))
    registry.scan()
    return Node(servers[0], watcher, policy, config_dir, registry)


@pytest.fixture
async def node(short_dir: Path) -> AsyncIterator[Node]:
    started = await start_node(short_dir, [tuner(), switchable()], "")
    try:
        yield started
    finally:
        await started.server.stop(0, 0)


async def test_a_reload_switching_a_plugin_off_drops_its_hook_points_from_the_registration(node: Node) -> None:
    before = node.registration
    assert before is not None
    assert before["runtime-hooks"] == [
        "PreRunPodSandbox",
        "PreCreateContainer",
        "PreStartContainer",
        "PreUpdateContainerResources",
    ]
    assert (before["failure-policy"], before["timeout"]) == ("Fail", 4.5)  # tuner 1 s + switchable 3 s

    node.reload("LSE", "LSR", "LS", "BE")  # one class left: still in effect
    assert node.registration == before

    node.reload(*CLASSES)
    assert [plugin.name for plugin in plugins_in_effect(node.server.runner)] == ["tuner"]
    assert node.registration == {
        **before,
        "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"],
        "failure-policy": "Ignore",  # switchable was the "fail" plugin
        "timeout": 1.5,
    }

    node.reload()  # switched on again
    assert node.registration == before


async def test_a_call_to_a_dropped_point_before_the_proxy_read_the_new_file_gets_no_change(node: Node) -> None:
    """The window: the proxy's registry still has the old file (Fail, PreStartContainer) and calls
    the dropped point; the answer is the empty response, a valid one, so the call goes on."""
    node.reload(*CLASSES)
    [stale] = node.registry.servers_for(START)  # not rescanned yet
    assert stale.failure_policy == FailurePolicy.FAIL
    dispatcher = Dispatcher(node.registry)
    request = container_request().SerializeToString()
    try:
        [result] = await dispatcher.run(START, StaticViews(request, lambda reply: ["changed"]), None)
        assert (result.outcome, result.changes) == ("ok", ())  # empty: nothing to apply
        [created] = await dispatcher.run(
            CREATE, StaticViews(request, lambda reply: list(reply.container_annotations)), None
        )
        assert created.changes == ("tuned",)  # switchable no longer runs there
    finally:
        await dispatcher.close()
    node.registry.scan()  # the proxy reads the new file
    assert node.registry.servers_for(START) == []
    assert [server.failure_policy for server in node.registry.servers()] == [FailurePolicy.IGNORE]


async def test_a_reload_switching_every_plugin_off_removes_the_registration_and_back(short_dir: Path) -> None:
    node = await start_node(short_dir, [switchable()], policy_text(CLASSES))
    try:
        assert node.registration is None  # nothing in effect at start
        node.reload()
        assert node.registration is not None
        assert node.registration["runtime-hooks"] == ["PreCreateContainer", "PreStartContainer"]
        with capture_logs() as logs:
            node.reload(*CLASSES)
        assert node.registration is None
        assert any(e["event"] == "no plugin in effect handles a hook point; not registered" for e in logs)
        assert await rpc_call(node.server.endpoint, START) == hook.ContainerResourceHookResponse()
    finally:
        await node.server.stop(0, 0)


async def test_a_registration_that_cannot_be_written_is_logged_and_written_at_the_next_change(node: Node) -> None:
    before = node.registration
    moved = node.config_dir.with_name("moved.d")
    node.config_dir.rename(moved)
    node.config_dir.write_text("not a directory")  # makedirs and the write both fail
    with capture_logs() as logs:
        node.reload(*CLASSES)  # the watcher's listener must not raise
    assert any(e["event"].startswith("cannot update the registration") for e in logs)
    node.config_dir.unlink()
    moved.rename(node.config_dir)
    assert node.registration == before  # the proxy keeps the previous one
    node.reload("LSE")  # in effect again: what the file says already
    assert node.registration == before
    node.reload(*CLASSES)  # the next change is written
    assert node.registration is not None and START.value not in node.registration["runtime-hooks"]
    shutil.rmtree(moved, ignore_errors=True)
