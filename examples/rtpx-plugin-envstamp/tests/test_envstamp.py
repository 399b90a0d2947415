"""Tests of the envstamp plugin, with the runtimeproxy hooks test kit: fake cgroup trees instead
of /sys/fs/cgroup, hook requests built as the proxy sends them, and the plugin run by the same
PluginRunner (and, in one test, the same gRPC server) that ``runtime-hooks serve`` uses."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
from rtpx_plugin_envstamp import ANNOTATION, ENV_VAR, SOURCE_ANNOTATION, plugin
from runtimeproxy.hooks.cgroups import shares_to_weight, weight_to_shares
from runtimeproxy.hooks.sdk import (
    ContainerInfo,
    HookPoint,
    PluginRunner,
    PodInfo,
    RunResult,
    ServerContext,
    discover_plugins,
)
from runtimeproxy.hooks.server import (
    RuntimeHooksServer,
    ServerSettings,
    container_from_request,
    pod_from_container_request,
)
from runtimeproxy.hooks.testkit.cgroups import FakeCgroup, make_fake_cgroup_v1, make_fake_cgroup_v2
from structlog.testing import capture_logs

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.api.runtime.v1alpha1 import api_pb2_grpc as hook_grpc

UID = "0b7a2c1e-5d4f-4e8a-9c3b-1f2e3d4c5b6a"
CONTAINER_ID = "4f9d0c2b7e1a"

# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(params=["v1", "v2"])
def cgroup_tree(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    """A fake cgroup tree (v1 and v2 in turn) with kubelet's kubepods cgroups, cgroupfs driver."""
    make = make_fake_cgroup_v1 if request.param == "v1" else make_fake_cgroup_v2
    return make(tmp_path / "cgroup")


@pytest.fixture
def runner() -> Iterator[Any]:
    """runner(cgroups=None) -> a PluginRunner with only envstamp enabled, closed after the test."""
    made: list[PluginRunner] = []

    def make(cgroups: Any = None) -> PluginRunner:
        made.append(PluginRunner([plugin], context=ServerContext(cgroups=cgroups)))
        return made[-1]

    yield make
    for each in made:
        each.close()


# --- requests as the proxy sends them ----------------------------------------------------------


def container_request(
    *,
    cgroup_parent: str,
    labels: dict[str, str] | None = None,
    container_id: str = "",
    env: dict[str, str] | None = None,
    cpu_shares: int = 512,
) -> Any:
    """A ContainerResourceHookRequest like the proxy's at CreateContainer (id "") or later hooks."""
    return hook_pb.ContainerResourceHookRequest(
        pod_meta=hook_pb.PodSandboxMetadata(name="web", namespace="shop", uid=UID, attempt=0),
        container_meta=hook_pb.ContainerMetadata(name="app", id=container_id),
        pod_labels=labels or {},
        pod_cgroup_parent=cgroup_parent,
        container_resources=hook_pb.LinuxContainerResources(cpu_shares=cpu_shares),
        container_env_list=[hook_pb.KeyValue(key=k, value=v.encode()) for k, v in (env or {}).items()],
        pod_sandbox_id="sandbox-1",
    )


def views(request: Any) -> tuple[PodInfo, ContainerInfo]:
    """What the server hands the plugin for ``request``: the server's own conversion."""
    return pod_from_container_request(request), container_from_request(request)


async def call(runner: PluginRunner, point: HookPoint, request: Any) -> RunResult:
    pod, container = views(request)
    return await runner.run(point, pod=pod, container=container)


# --- the package ---------------------------------------------------------------------------------


def test_the_plugin_is_installed_as_an_entry_point() -> None:
    discovery = discover_plugins()
    assert [f for f in discovery.failures if f.name == "envstamp"] == []
    [found] = [p for p in discovery.plugins if p.name == "envstamp"]
    assert found is plugin
    assert found.describe()["hooks"] == ["PreCreateContainer", "PostStartContainer"]
    assert found.failure_policy == "ignore" and found.policy_section is None


# --- PreCreateContainer: the stamp -------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "kube_qos", "qos", "source"),
    [
        ({}, "besteffort", "BE", "kubernetes-cgroup-parent"),
        ({}, "burstable", "LS", "kubernetes-cgroup-parent"),
        ({}, "guaranteed", "LSR", "kubernetes-cgroup-parent"),
        ({"koordinator.sh/qosClass": "LSE"}, "guaranteed", "LSE", "koordinator-label"),
    ],
)
async def test_the_container_gets_its_qos_class(
    runner: Any, labels: dict[str, str], kube_qos: Any, qos: str, source: str, tmp_path: Path
) -> None:
    parent = make_fake_cgroup_v2(tmp_path / "cgroup").pod_parent(UID, kube_qos)
    result = await call(
        runner(), HookPoint.PRE_CREATE_CONTAINER, container_request(cgroup_parent=parent, labels=labels)
    )
    assert result.applied == ["envstamp"] and result.failures == []
    assert result.response.env.items() == [(ENV_VAR, qos)]
    assert result.response.annotations == {ANNOTATION: qos, SOURCE_ANNOTATION: source}
    assert result.response.resources.is_empty() and result.response.problems() == []


async def test_the_stamp_replaces_a_value_the_container_already_has(runner: Any) -> None:
    request = container_request(cgroup_parent=f"/kubepods/besteffort/pod{UID}", env={ENV_VAR: "forged", "A": "1"})
    result = await call(runner(), HookPoint.PRE_CREATE_CONTAINER, request)
    assert result.response.env.items() == [(ENV_VAR, "BE")]  # the proxy sets it in place; A is untouched


async def test_through_the_hook_server(runner: Any) -> None:
    """The same call over gRPC, as the proxy makes it: what goes back on the wire."""
    directory = Path(tempfile.mkdtemp(prefix="envstamp-", dir="/tmp"))  # unix socket paths are short
    settings = ServerSettings(endpoint=str(directory / "hooks.sock"), hook_config_dir=None, stop_grace=0)
    server = RuntimeHooksServer(runner(), settings)
    try:
        await server.start()
        async with grpc.aio.insecure_channel(f"unix://{server.endpoint}") as channel:
            stubs: Any = hook_grpc  # generated without type hints
            stub = stubs.RuntimeHookServiceStub(channel)
            request = container_request(cgroup_parent=f"/kubepods/burstable/pod{UID}")
            reply = await stub.PreCreateContainerHook(request, timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as info:  # not handled: the proxy skips this server
                await stub.PreStartContainerHook(request, timeout=5)
        assert [(kv.key, kv.value) for kv in reply.container_env_list] == [(ENV_VAR, b"LS")]
        assert dict(reply.container_annotations) == {ANNOTATION: "LS", SOURCE_ANNOTATION: "kubernetes-cgroup-parent"}
        assert not reply.HasField("container_resources")
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert server.hook_points == {HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER}
    finally:
        await server.stop(0)
        shutil.rmtree(directory, ignore_errors=True)


# --- PostStartContainer: reading the container's cgroup --------------------------------------


async def test_the_started_container_cpu_shares_are_logged(runner: Any, cgroup_tree: FakeCgroup) -> None:
    parent = cgroup_tree.add_pod(UID, "burstable")
    cgroup_tree.add_container(parent, CONTAINER_ID)
    cgroups = cgroup_tree.fs()
    cgroups.set_cpu_shares(parent, 512, container_id=CONTAINER_ID)  # what runc did at create
    request = container_request(cgroup_parent=parent, container_id=CONTAINER_ID)
    with capture_logs() as logs:
        result = await call(runner(cgroups), HookPoint.POST_START_CONTAINER, request)
    assert result.applied == ["envstamp"] and result.response.is_empty()
    # v2 keeps cpu.weight (1..10000), a coarser scale: 512 shares come back as the smallest
    # shares value with the same weight.
    expected = 512 if cgroup_tree.version == 1 else weight_to_shares(shares_to_weight(512))
    [record] = [r for r in logs if r["event"] == "envstamp: container started"]
    assert record["cpu_shares"] == expected
    assert record["cgroup_version"] == cgroup_tree.version
    assert (record["plugin"], record["hook"], record["pod"], record["container"]) == (
        "envstamp",
        "PostStartContainer",
        "shop/web",
        "app",
    )


async def test_a_container_without_a_cgroup_is_logged_not_an_error(runner: Any, cgroup_tree: FakeCgroup) -> None:
    parent = cgroup_tree.add_pod(UID, "besteffort")  # no container cgroup: it is gone already
    request = container_request(cgroup_parent=parent, container_id=CONTAINER_ID)
    with capture_logs() as logs:
        result = await call(runner(cgroup_tree.fs()), HookPoint.POST_START_CONTAINER, request)
    assert result.failures == []
    [record] = [r for r in logs if r["plugin"] == "envstamp"]
    assert record["event"] == "envstamp: cannot read cpu shares" and record["log_level"] == "warning"


async def test_a_parent_outside_the_cgroup_root_is_refused(runner: Any, cgroup_tree: FakeCgroup) -> None:
    request = container_request(cgroup_parent="/kubepods/../../etc", container_id=CONTAINER_ID)
    with capture_logs() as logs:
        result = await call(runner(cgroup_tree.fs()), HookPoint.POST_START_CONTAINER, request)
    assert result.failures == []
    [record] = [r for r in logs if r["plugin"] == "envstamp"]
    assert "'..' segment" in record["error"]


async def test_without_cgroups_the_hook_does_nothing(runner: Any) -> None:
    request = container_request(cgroup_parent=f"/kubepods/pod{UID}", container_id=CONTAINER_ID)
    with capture_logs() as logs:
        result = await call(runner(None), HookPoint.POST_START_CONTAINER, request)
    assert result.applied == ["envstamp"] and [r for r in logs if r.get("plugin") == "envstamp"] == []
