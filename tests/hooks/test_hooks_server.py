"""The runtime-hooks server end to end: our generated client stubs over its unix socket, the
registration file, failing and hanging plugins, and the ``runtime-hooks`` command."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from click.testing import CliRunner
from daemons import log_events, reap, spawn_hooks_serve
from hook_servers import StaticViews
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.cli import cli
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.sdk import ContainerInfo, HookResponse, Plugin, PodInfo, ServerContext
from runtimeproxy.hooks.server import REGISTRATION_FILE, RuntimeHooksServer, ServerSettings
from runtimeproxy.hooks.testkit.fake_cgroups import make_fake_cgroup_v2

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.api.runtime.v1alpha1 import api_pb2_grpc as hook_grpc
from runtimeproxy.common.listener import AlreadyServing
from runtimeproxy.dispatch.dispatcher import Dispatcher
from runtimeproxy.dispatch.registry import HookRegistry, parse_config
from runtimeproxy.hookapi import value_bounds
from runtimeproxy.hookapi.hookpoints import HookPoint

CREATE = HookPoint.PRE_CREATE_CONTAINER
RUN = HookPoint.PRE_RUN_POD_SANDBOX


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def tuner() -> Plugin:
    plugin = Plugin("tuner", order=10)

    @plugin.on(CREATE, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
    def container(container: ContainerInfo, qos: Any, response: HookResponse, **kwargs: Any) -> None:
        response.resources.cpu_quota = 40000
        response.resources.cpu_period = 100000
        response.resources.unified["memory.high"] = "1073741824"
        response.env.set("A", "changed")
        response.env.set("QOS_CLASS", str(qos))
        response.annotations["tuned"] = f"{container.name}:{dict(container.env)['A']}"

    @plugin.on(RUN)
    async def pod(pod: PodInfo, response: HookResponse, **kwargs: Any) -> None:
        response.labels["tuned"] = "yes"
        response.annotations["pod"] = f"{pod.namespace}/{pod.name}"
        response.resources.cpu_shares = 1024
        response.cgroup_parent = "/kubepods/besteffort/pod-x"

    return plugin


def container_request(**extra: Any) -> Any:
    return hook.ContainerResourceHookRequest(
        pod_meta=hook.PodSandboxMetadata(name="web", namespace="default", uid="u1"),
        container_meta=hook.ContainerMetadata(name="app"),
        pod_labels={"koordinator.sh/qosClass": "BE"},
        pod_cgroup_parent="/kubepods/besteffort/podu1",
        container_resources=hook.LinuxContainerResources(cpu_shares=2),
        container_env_list=[hook.KeyValue(key="A", value=b"1"), hook.KeyValue(key="B", value=b"\xff")],
        container_envs={"A": "1"},
        pod_sandbox_id="sb1",
        **extra,
    )


def pod_request() -> Any:
    return hook.PodSandboxHookRequest(
        pod_meta=hook.PodSandboxMetadata(name="web", namespace="default", uid="u1"),
        labels={"app": "web"},
        cgroup_parent="/kubepods/burstable/podu1",
    )


class Served:
    def __init__(self, server: RuntimeHooksServer, stub: Any, directory: Path) -> None:
        self.server = server
        self.stub = stub
        self.config_dir = directory / "hookserver.d"
        self.registration = self.config_dir / REGISTRATION_FILE


@pytest.fixture
async def served(short_dir: Path) -> AsyncIterator[Any]:
    """served(*plugins) -> a started server and a client stub; all stopped after the test."""
    started: list[tuple[RuntimeHooksServer, grpc.aio.Channel]] = []

    async def start(*plugins: Plugin, context: ServerContext | None = None, **options: Any) -> Served:
        runner = PluginRunner(plugins, registry=CollectorRegistry(), context=context)
        settings = ServerSettings(
            endpoint=str(short_dir / "hooks.sock"),
            hook_config_dir=str(short_dir / "hookserver.d"),
            stop_grace=0,
            deregister_grace=options.pop("deregister_grace", 0),
            **options,
        )
        server = RuntimeHooksServer(runner, settings)
        await server.start()
        channel = grpc.aio.insecure_channel("unix://" + server.endpoint)
        started.append((server, channel))
        return Served(server, hook_grpc.RuntimeHookServiceStub(channel), short_dir)

    yield start
    for server, channel in started:
        await channel.close()
        await server.stop(0)


async def test_plugin_changes_reach_the_client(served: Any) -> None:
    s = await served(tuner())
    response = await s.stub.PreCreateContainerHook(container_request(), timeout=5)
    assert response.container_resources.cpu_quota == 40000
    assert response.container_resources.cpu_period == 100000
    assert dict(response.container_resources.unified) == {"memory.high": "1073741824"}
    assert [(kv.key, kv.value) for kv in response.container_env_list] == [("A", b"changed"), ("QOS_CLASS", b"BE")]
    assert dict(response.container_envs) == {"A": "changed", "QOS_CLASS": "BE"}
    assert dict(response.container_annotations) == {"tuned": "app:1"}
    assert response.pod_cgroup_parent == ""
    assert value_bounds.validate_resources(response.container_resources) == []

    response = await s.stub.PreRunPodSandboxHook(pod_request(), timeout=5)
    assert dict(response.labels) == {"tuned": "yes"}
    assert dict(response.annotations) == {"pod": "default/web"}
    assert response.resources.cpu_shares == 1024
    assert response.cgroup_parent == "/kubepods/besteffort/pod-x"


async def test_a_response_without_changes_sets_nothing(served: Any) -> None:
    quiet = Plugin("quiet")

    @quiet.on(CREATE)
    def handler(**kwargs: Any) -> None: ...

    s = await served(quiet)
    response = await s.stub.PreCreateContainerHook(container_request(), timeout=5)
    assert response == hook.ContainerResourceHookResponse()
    assert not response.HasField("container_resources")


async def test_the_environment_comes_from_the_koordinator_map_when_there_is_no_list(served: Any) -> None:
    seen: list[Any] = []
    plugin = Plugin("env")

    @plugin.on(CREATE)
    def handler(container: ContainerInfo, **kwargs: Any) -> None:
        seen.append(container.env)

    s = await served(plugin)
    request = container_request()
    del request.container_env_list[:]
    request.container_envs.clear()
    request.container_envs.update({"Z": "26", "A": "1"})
    await s.stub.PreCreateContainerHook(request, timeout=5)
    await s.stub.PreCreateContainerHook(container_request(), timeout=5)
    assert seen == [(("A", "1"), ("Z", "26")), (("A", "1"), ("B", "\udcff"))]  # non-UTF-8 kept (surrogateescape)


async def test_an_unhandled_hook_point_answers_no_change_never_unimplemented(served: Any) -> None:
    """The proxy fails a hook whose registered server answers UNIMPLEMENTED; a point no plugin
    handles (one a stale registration may still list) answers the empty response."""
    s = await served(tuner())
    assert await s.stub.PostStopContainerHook(container_request(), timeout=5) == hook.ContainerResourceHookResponse()
    assert await s.stub.PreRemovePodSandboxHook(pod_request(), timeout=5) == hook.PodSandboxHookResponse()


async def test_the_registration_file_subscribes_exactly_the_handled_hooks(served: Any) -> None:
    slow = Plugin("slow", timeout=3.0)

    @slow.on(RUN)
    def handler(**kwargs: Any) -> None: ...

    s = await served(tuner(), slow)
    content = json.loads(s.registration.read_text())
    assert content == {
        "remote-endpoint": s.server.endpoint,
        "failure-policy": "Ignore",
        "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"],
        "timeout": 4.5,  # tuner 1 s + slow 3 s at PreRunPodSandbox, plus the margin
        "index": 0,
    }
    registered = parse_config(REGISTRATION_FILE, s.registration.read_text())  # the proxy's own parser
    assert registered.hooks == {RUN, CREATE, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES}
    assert registered.endpoint == s.server.endpoint
    assert [name for name in os.listdir(s.config_dir)] == [REGISTRATION_FILE]  # no scratch file left
    await s.server.stop(0)
    assert not s.registration.exists()
    assert not os.path.exists(s.server.endpoint)


async def test_a_fail_plugin_registers_with_failure_policy_fail(served: Any) -> None:
    strict = Plugin("strict", failure_policy="fail")

    @strict.on(RUN)
    def handler(**kwargs: Any) -> None: ...

    s = await served(tuner(), strict)
    content = json.loads(s.registration.read_text())
    assert content["failure-policy"] == "Fail"


async def test_socket_permissions_and_one_server_per_path(served: Any, short_dir: Path) -> None:
    s = await served(tuner())
    mode = os.stat(s.server.endpoint).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o660
    second = RuntimeHooksServer(
        PluginRunner([tuner()], registry=CollectorRegistry()),
        ServerSettings(endpoint=s.server.endpoint, hook_config_dir=str(short_dir / "other.d")),
    )
    with pytest.raises(AlreadyServing):
        await second.start()
    assert not (short_dir / "other.d" / REGISTRATION_FILE).exists()
    assert (await s.stub.PreCreateContainerHook(container_request(), timeout=5)).container_resources.cpu_quota == 40000


async def test_a_stale_socket_is_replaced(short_dir: Path, served: Any) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(short_dir / "hooks.sock"))
    stale.close()  # bound then closed: a leftover file nothing listens on
    s = await served(tuner())
    assert (await s.stub.PreCreateContainerHook(container_request(), timeout=5)).container_resources.cpu_quota


async def test_a_failing_fail_plugin_fails_the_call_with_its_name(served: Any) -> None:
    strict = Plugin("strict", order=50, failure_policy="fail")

    @strict.on(CREATE)
    def handler(**kwargs: Any) -> None:
        raise RuntimeError("no exclusive cpus left")

    s = await served(tuner(), strict)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await s.stub.PreCreateContainerHook(container_request(), timeout=5)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "plugin strict failed at PreCreateContainer: RuntimeError: no exclusive cpus left"
    assert (await s.stub.PreRunPodSandboxHook(pod_request(), timeout=5)).labels["tuned"] == "yes"


async def test_crashing_and_hanging_plugins_never_break_the_server(served: Any) -> None:
    release = threading.Event()
    crash = Plugin("crash", order=1)
    hang_sync = Plugin("hang-sync", order=2, timeout=0.3)
    hang_async = Plugin("hang-async", order=3, timeout=0.3)

    @crash.on(CREATE)
    def crashing(response: HookResponse, **kwargs: Any) -> None:
        response.resources.cpu_quota = 1000
        raise KeyError("oops")

    @hang_sync.on(CREATE)
    def hanging(response: HookResponse, **kwargs: Any) -> None:
        response.annotations["hang"] = "sync"
        release.wait(30)

    @hang_async.on(CREATE)
    async def hanging_async(**kwargs: Any) -> None:
        await asyncio.sleep(30)

    s = await served(crash, hang_sync, hang_async, tuner())
    try:
        started = time.monotonic()
        responses = await asyncio.gather(
            *(s.stub.PreCreateContainerHook(container_request(), timeout=10) for _ in range(3))
        )
        elapsed = time.monotonic() - started
    finally:
        release.set()
    assert elapsed < 3  # three concurrent calls, each waiting out two 0.3 s timeouts
    for response in responses:
        assert response.container_resources.cpu_quota == 40000
        assert dict(response.container_annotations) == {"tuned": "app:1"}
    metrics = s.server.runner.metrics.registry
    for plugin, outcome in (("crash", "error"), ("hang-sync", "timeout"), ("hang-async", "timeout"), ("tuner", "ok")):
        labels = {"plugin": plugin, "hook": "PreCreateContainer", "outcome": outcome}
        assert metrics.get_sample_value("runtimeproxy_hooks_plugin_calls_total", labels) == 3


async def test_plugins_get_the_node_cgroups(served: Any, tmp_path: Path) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cgroup")
    parent = tree.add_pod("u1", qos="besteffort")
    tree.add_container(parent, "c1")
    plugin = Plugin("writer")

    @plugin.on(HookPoint.PRE_START_CONTAINER)
    def start(pod: PodInfo, container: ContainerInfo, cgroups: Any, **kwargs: Any) -> None:
        cgroups.set_cpu_quota(pod.cgroup_parent, 20000, container_id=container.id)

    s = await served(plugin, context=ServerContext(cgroups=tree.fs()))
    request = container_request()
    request.container_meta.id = "c1"
    await s.stub.PreStartContainerHook(request, timeout=5)
    assert tree.read(parent, "cpu.max", "c1") == "20000 100000"


async def test_no_registration_without_handled_hooks(served: Any) -> None:
    only_reconcile = Plugin("background")

    @only_reconcile.reconcile
    def reconcile(**kwargs: Any) -> None: ...

    s = await served(only_reconcile)
    assert not s.registration.exists()
    assert await s.stub.PreRunPodSandboxHook(pod_request(), timeout=5) == hook.PodSandboxHookResponse()


MiB = 1 << 20


async def test_a_request_of_8_mib_is_accepted_under_the_default_limit(served: Any) -> None:
    """The proxy relays up to 16 MiB (runtimeproxy.common.message_size); a big CreateContainer reaches the plugins."""
    s = await served(tuner())
    request = container_request(container_annotations={"big": "x" * (8 * MiB)})
    assert request.ByteSize() > 8 * MiB
    response = await s.stub.PreCreateContainerHook(request, timeout=30)
    assert dict(response.container_annotations) == {"tuned": "app:1"}


async def test_a_request_over_the_configured_limit_is_refused(served: Any) -> None:
    s = await served(tuner(), max_message_size=4 * MiB)
    request = container_request(container_annotations={"big": "x" * (5 * MiB)})
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await s.stub.PreCreateContainerHook(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert (await s.stub.PreCreateContainerHook(container_request(), timeout=5)).container_annotations


async def test_the_proxys_hook_calls_and_runtime_hooks_share_one_limit(short_dir: Path) -> None:
    """The proxy's dispatcher sends and receives up to its --max-message-size, runtime-hooks
    accepts and answers as much by default: an 8 MiB request and a 5 MiB answer go through."""
    echo = Plugin("echo")

    @echo.on(CREATE)
    def create(container: ContainerInfo, response: HookResponse, **kwargs: Any) -> None:
        response.annotations["echo"] = "y" * (5 * MiB)

    settings = ServerSettings(
        endpoint=str(short_dir / "hooks.sock"), hook_config_dir=str(short_dir / "hookserver.d"), stop_grace=0
    )
    server = RuntimeHooksServer(PluginRunner([echo], registry=CollectorRegistry()), settings)
    await server.start()
    registry = HookRegistry(str(short_dir / "hookserver.d"))
    await registry.start()
    request = container_request(container_annotations={"big": "x" * (8 * MiB)}).SerializeToString()
    try:
        dispatchers = (Dispatcher(registry), Dispatcher(registry, max_message_size=4 * MiB))
        answered: list[int] = []
        echoed = StaticViews(request, lambda reply: answered.append(len(reply.container_annotations["echo"])) or [])
        [shared] = await dispatchers[0].run(CREATE, echoed, None)
        assert (shared.outcome, answered) == ("ok", [5 * MiB]), shared
        [smaller] = await dispatchers[1].run(CREATE, StaticViews(request), None)
        assert smaller.outcome == "failed" and "RESOURCE_EXHAUSTED" in smaller.error, smaller
        for dispatcher in dispatchers:
            await dispatcher.close()
    finally:
        await registry.stop()
        await server.stop(0, 0)


async def test_stop_unregisters_first_and_answers_until_the_grace_is_over(served: Any) -> None:
    s = await served(tuner(), deregister_grace=3.0)
    assert s.registration.exists()
    stopping = asyncio.create_task(s.server.stop())
    for _ in range(500):  # the file goes first, before any waiting
        if not s.registration.exists():
            break
        await asyncio.sleep(0.01)
    assert not s.registration.exists()
    response = await s.stub.PreCreateContainerHook(container_request(), timeout=5)  # still answered
    assert dict(response.container_annotations) == {"tuned": "app:1"}
    assert not stopping.done()
    await stopping
    assert not os.path.exists(s.server.endpoint)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await s.stub.PreCreateContainerHook(container_request(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-message-size", "1Mi"], "must be at least 4194304 bytes"),
        (["--max-message-size", "lots"], "is not a size"),
        (["--cgroup-parent-root", "/"], "is the whole hierarchy"),
        (["--cgroup-parent-root", "/kubepods/../x"], "invalid pod cgroup root"),
        (["--deregister-grace", "-1"], "--deregister-grace"),
    ],
)
def test_serve_refuses_bad_limits_and_roots(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["serve", *args])
    assert result.exit_code == 2 and message in result.output, result.output


# --- the command -----------------------------------------------------------------------------------

CLI_PLUGIN = """
from dataclasses import dataclass

from runtimeproxy.hooks.sdk import Plugin

@dataclass(frozen=True)
class Tuning:
    enabled: bool = True
    burst: int = 0

plugin = Plugin("cli-tuner", version="2.0", order=5, failure_policy="fail", timeout=0.5, settings=Tuning)

@plugin.on("PreCreateContainer")
def create(response, qos, settings, **kwargs):
    response.annotations["qos"] = str(qos)
    response.annotations["burst"] = str(settings.burst)

@plugin.on("PreStartContainer")
def start(pod, container, cgroups, **kwargs):
    cgroups.set_cpu_quota(pod.cgroup_parent, 30000, container_id=container.id)
"""


@pytest.fixture
def plugin_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution with one plugin and one broken entry point, importable here and in children."""
    site = tmp_path / "site"
    module = f"rh_cli_{uuid.uuid4().hex[:8]}"
    info = site / f"{module}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[runtimeproxy.hooks]\ncli-tuner = {module}:plugin\nbroken = {module}_gone:plugin\n"
    )
    (site / f"{module}.py").write_text(CLI_PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop(module, None)


def test_plugins_command_lists_plugins_and_failures(plugin_site: Path) -> None:
    result = CliRunner().invoke(cli, ["plugins"])
    assert result.exit_code == 1, result.output  # a plugin failed to load
    lines = result.output.splitlines()
    assert lines[0].split() == ["NAME", "VERSION", "ORDER", "ENABLED", "FAILURE-POLICY", "TIMEOUT", "POLICY", "HOOKS"]
    row = next(line for line in lines if line.startswith("cli-tuner"))
    assert row.split() == [
        "cli-tuner",
        "2.0",
        "5",
        "yes",
        "fail",
        "0.5s",
        "cli-tuner",
        "PreCreateContainer,PreStartContainer",
    ]
    assert "not loaded:" in result.output
    assert "broken (" in result.output and "ModuleNotFoundError" in result.output

    result = CliRunner().invoke(cli, ["plugins", "--json", "--disable", "cli-tuner"])
    data = json.loads(result.output)
    [listed] = [p for p in data["plugins"] if p["name"] == "cli-tuner"]
    assert listed["enabled"] is False and listed["hooks"] == ["PreCreateContainer", "PreStartContainer"]
    assert [f["name"] for f in data["failures"]] == ["broken"]

    result = CliRunner(env={"RUNTIME_HOOKS_ENABLE": "nope"}).invoke(cli, ["plugins"])
    assert "cannot enable nope: no such plugin" in result.output


def _notify_socket(directory: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(directory / "notify.sock"))
    sock.settimeout(20)
    return sock


def _serve_env(plugin_site: Path, short_dir: Path, cgroup_root: Path, policy: Path) -> dict[str, str]:
    """``runtime-hooks serve`` on ``short_dir``/hooks.sock, registering in ``short_dir``/hookserver.d,
    telling READY on ``short_dir``/notify.sock, with the test's plugin alone."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(plugin_site), os.environ.get("PYTHONPATH", "")]),
        "NOTIFY_SOCKET": str(short_dir / "notify.sock"),
        "RUNTIME_HOOKS_ENDPOINT": f"unix://{short_dir / 'hooks.sock'}",
        "RUNTIME_HOOKS_HOOK_CONFIG_DIR": str(short_dir / "hookserver.d"),
        "RUNTIME_HOOKS_CGROUP_ROOT": str(cgroup_root),
        "RUNTIME_HOOKS_RESCTRL_ROOT": str(short_dir / "no-resctrl"),
        "RUNTIME_HOOKS_POLICY": str(policy),
        "RUNTIME_HOOKS_LOG_FORMAT": "json",
        # Only the test's plugins: the built-in ones would subscribe more hook points.
        "RUNTIME_HOOKS_DISABLE": "cpu cpuset memory resctrl network gpu",
    }


@dataclass
class _Exit:
    """How a ``runtime-hooks serve`` ended: its exit status and output."""

    code: int | None = None
    stdout: str = ""
    stderr: str = ""


@contextlib.contextmanager
def _serving(env: dict[str, str], short_dir: Path) -> Iterator[_Exit]:
    """``runtime-hooks serve`` with ``env`` (see _serve_env), once it said READY; stopped with
    SIGTERM when the block ends, which fills the yielded _Exit."""
    notify = _notify_socket(short_dir)
    process = spawn_hooks_serve(env)
    ended = _Exit()
    try:
        assert "READY=1" in notify.recv(4096).decode()
        yield ended
        process.send_signal(signal.SIGTERM)
        ended.stdout, ended.stderr = process.communicate(timeout=20)
        ended.code = process.returncode
    finally:
        reap(process)
        notify.close()


async def _create_hook(endpoint: Path, container_id: str = "") -> Any:
    """PreCreateContainerHook, then with ``container_id`` PreStartContainerHook too; the first answer."""
    async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
        stub = hook_grpc.RuntimeHookServiceStub(channel)
        created = await stub.PreCreateContainerHook(container_request(), timeout=5)
        if container_id:
            request = container_request()
            request.container_meta.id = container_id
            await stub.PreStartContainerHook(request, timeout=5)
        return created


def test_serve_command_end_to_end(plugin_site: Path, short_dir: Path, tmp_path: Path) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cgroup")
    parent = tree.add_pod("u1", qos="besteffort")
    tree.add_container(parent, "c1")
    policy = tmp_path / "policy.yaml"
    policy.write_text("cli-tuner:\n  BE: {burst: 42}\n")  # the plugin's own section
    endpoint = short_dir / "hooks.sock"
    config_dir = short_dir / "hookserver.d"
    with _serving(_serve_env(plugin_site, short_dir, tree.root, policy), short_dir) as ended:
        registration = json.loads((config_dir / REGISTRATION_FILE).read_text())
        assert registration["runtime-hooks"] == ["PreCreateContainer", "PreStartContainer"]
        assert registration["remote-endpoint"] == str(endpoint)
        created = asyncio.run(_create_hook(endpoint, "c1"))
        assert dict(created.container_annotations) == {"qos": "BE", "burst": "42"}
        assert tree.read(parent, "cpu.max", "c1") == "30000 100000"
    assert ended.code == 0, ended.stderr
    assert not (config_dir / REGISTRATION_FILE).exists()
    assert not endpoint.exists()
    events = log_events(ended.stdout)
    assert any(e["event"] == "plugin not loaded" and e["entry_point"] == "broken" for e in events)
    assert any(e["event"] == "ready" for e in events)


def _wait_for(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_serve_command_registration_follows_policy_reloads(plugin_site: Path, short_dir: Path, tmp_path: Path) -> None:
    """A reload switching cli-tuner (the one plugin) off for every class removes the registration;
    a call still made to its point gets the empty response; switched on again, it is back."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("")
    registration = short_dir / "hookserver.d" / REGISTRATION_FILE
    endpoint = short_dir / "hooks.sock"

    def reload(text: str) -> None:
        (tmp_path / "policy.tmp").write_text(text)
        os.replace(tmp_path / "policy.tmp", policy)

    env = _serve_env(plugin_site, short_dir, make_fake_cgroup_v2(tmp_path / "cgroup").root, policy)
    with _serving(env, short_dir) as ended:
        assert json.loads(registration.read_text())["failure-policy"] == "Fail"
        reload("cli-tuner:\n" + "".join(f"  {qos.value}: {{enabled: false}}\n" for qos in QoSClass))
        _wait_for(lambda: not registration.exists())
        assert asyncio.run(_create_hook(endpoint)) == hook.ContainerResourceHookResponse()
        reload("cli-tuner:\n  BE: {burst: 7}\n")
        _wait_for(registration.exists)
        assert json.loads(registration.read_text())["runtime-hooks"] == ["PreCreateContainer", "PreStartContainer"]
        assert dict(asyncio.run(_create_hook(endpoint)).container_annotations) == {"qos": "BE", "burst": "7"}
    assert ended.code == 0, ended.stderr
    events = [e["event"] for e in log_events(ended.stdout)]
    assert events.count("registered with the proxy") == 2
    assert events.count("no plugin in effect handles a hook point; not registered") == 1


def test_serve_refuses_an_invalid_policy_file(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("cpu:\n  BE: {cfs_burst_percent: -1}\n")
    result = CliRunner(env={"RUNTIME_HOOKS_POLICY": str(policy)}).invoke(cli, ["serve", "--log-format", "console"])
    assert result.exit_code == 1
    assert "cpu.BE.cfs_burst_percent" in result.output
