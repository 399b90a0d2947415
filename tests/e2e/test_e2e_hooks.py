"""Hook servers around real CRI calls: the proxy (in-process, or the daemon where it must
restart) in front of the real containerd, with programmable hook servers (hook_servers.py).

Each test checks what hook servers receive, what their answers do to what containerd
creates (cgroup files, sandbox status, a container's environment), and how failures,
timeouts, invalid answers, registration changes and restarts are handled.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from hook_bed import (
    CALL_TIMEOUT,
    CGROUP_CPU,
    CONFIG_LATENCY,
    HookBed,
    as_hook,
    cgroup_file,
    env_pairs,
    eventually,
    rpc_error,
)
from hook_servers import (
    INVALID_CONTAINER_RESPONSES,
    INVALID_POD_RESPONSES,
    Custom,
    Fail,
    Hang,
    Respond,
    remove_registration,
    write_raw_registration,
    write_registration,
)

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1 import api_pb2_grpc as cri_grpc
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

P = HookPoint
DAEMON = [sys.executable, "-c", "from runtimeproxy.proxy.cli import main; main()"]
SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"


# -- what each hook point is told --------------------------------------------------------------


POD_RESOURCES = cri.LinuxContainerResources(
    cpu_period=100000, cpu_quota=200000, cpu_shares=2048, memory_limit_in_bytes=512 << 20
)
POD_OVERHEAD = cri.LinuxContainerResources(
    cpu_period=100000, cpu_quota=10000, cpu_shares=102, memory_limit_in_bytes=64 << 20
)
ENVS = [("Z", b"1"), ("A", b"x=y=z"), ("Z", b"2"), ("EMPTY", b""), ("UNI", "ü".encode())]


async def test_every_hook_point_gets_the_call_content(bed: HookBed) -> None:
    server = (await bed.server("all")).respond_all()
    await bed.register(server, policy="Fail", hooks=list(HookPoint))
    pod = bed.pod_config(
        "content",
        labels={"app": "content", "tier": "x"},
        annotations={"note": "a=b", "empty": ""},
        resources=POD_RESOURCES,
        overhead=POD_OVERHEAD,
    )
    meta = hook.PodSandboxMetadata(name="content", uid=pod.metadata.uid, namespace="hooks", attempt=1)
    parent = pod.linux.cgroup_parent

    sandbox_id = await bed.run_pod(pod)
    pre_run = server.last(P.PRE_RUN_POD_SANDBOX)
    assert pre_run.pod_meta == meta
    assert dict(pre_run.labels) == {"app": "content", "tier": "x"}
    assert dict(pre_run.annotations) == {"note": "a=b", "empty": ""}
    assert pre_run.cgroup_parent == parent
    assert pre_run.resources == as_hook(POD_RESOURCES)
    assert pre_run.overhead == as_hook(POD_OVERHEAD)
    assert pre_run.pod_sandbox_id == ""

    resources = cri.LinuxContainerResources(
        cpu_period=100000, cpu_quota=50000, cpu_shares=512, memory_limit_in_bytes=128 << 20
    )
    config = bed.container_config("main", envs=ENVS, resources=resources, annotations={"c-note": "1"})
    container_id = await bed.create(sandbox_id, pod, config)
    post_create = await server.wait_for(P.POST_CREATE_CONTAINER)
    pre_create = server.last(P.PRE_CREATE_CONTAINER)
    assert pre_create.container_meta == hook.ContainerMetadata(name="main", attempt=1, id="")
    assert post_create.container_meta == hook.ContainerMetadata(name="main", attempt=1, id=container_id)

    def check_container(request: Any, want: cri.LinuxContainerResources, label: str) -> None:
        where = f"{label}: "
        assert request.pod_meta == meta, where
        assert request.container_meta.name == "main", where
        assert dict(request.pod_labels) == {"app": "content", "tier": "x"}, where
        assert dict(request.pod_annotations) == {"note": "a=b", "empty": ""}, where
        assert dict(request.container_annotations) == {"c-note": "1"}, where
        assert request.pod_cgroup_parent == parent, where
        assert request.container_resources == as_hook(want), where
        assert request.pod_resources == as_hook(POD_RESOURCES), where
        assert request.pod_overhead == as_hook(POD_OVERHEAD), where
        assert env_pairs(request) == ENVS, where
        assert dict(request.container_envs) == {"Z": "2", "A": "x=y=z", "EMPTY": "", "UNI": "ü"}, where
        assert request.pod_sandbox_id == sandbox_id, where

    check_container(pre_create, resources, "PreCreateContainer")
    check_container(post_create, resources, "PostCreateContainer")

    await bed.start(container_id)
    await server.wait_for(P.POST_START_CONTAINER)
    for point in (P.PRE_START_CONTAINER, P.POST_START_CONTAINER):
        assert server.last(point).container_meta.id == container_id
        check_container(server.last(point), resources, point.value)

    new = cri.LinuxContainerResources(
        cpu_period=100000, cpu_quota=80000, cpu_shares=768, memory_limit_in_bytes=256 << 20
    )
    await bed.update(container_id, new)
    await server.wait_for(P.POST_UPDATE_CONTAINER_RESOURCES)
    for point in (P.PRE_UPDATE_CONTAINER_RESOURCES, P.POST_UPDATE_CONTAINER_RESOURCES):
        assert server.last(point).container_meta.id == container_id
        check_container(server.last(point), new, point.value)

    await bed.rs.StopContainer(cri.StopContainerRequest(container_id=container_id, timeout=0), timeout=CALL_TIMEOUT)
    await server.wait_for(P.POST_STOP_CONTAINER)
    for point in (P.PRE_STOP_CONTAINER, P.POST_STOP_CONTAINER):
        assert server.last(point).container_meta.id == container_id
        check_container(server.last(point), new, point.value)

    await bed.rs.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
    await server.wait_for(P.POST_STOP_POD_SANDBOX)
    await bed.rs.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
    await server.wait_for(P.POST_REMOVE_POD_SANDBOX)
    for point in (P.POST_STOP_POD_SANDBOX, P.PRE_REMOVE_POD_SANDBOX, P.POST_REMOVE_POD_SANDBOX):
        request = server.last(point)
        assert request.pod_meta == meta, point
        assert request.pod_sandbox_id == sandbox_id, point
        assert dict(request.labels) == {"app": "content", "tier": "x"}, point
        assert dict(request.annotations) == {"note": "a=b", "empty": ""}, point
        assert request.cgroup_parent == parent, point
        assert request.resources == as_hook(POD_RESOURCES), point
        assert request.overhead == as_hook(POD_OVERHEAD), point

    assert [point for _, point in bed.journal] == [
        "PreRunPodSandbox",
        "PreCreateContainer",
        "PostCreateContainer",
        "PreStartContainer",
        "PostStartContainer",
        "PreUpdateContainerResources",
        "PostUpdateContainerResources",
        "PreStopContainer",
        "PostStopContainer",
        "PostStopPodSandbox",
        "PreRemovePodSandbox",
        "PostRemovePodSandbox",
    ]
    assert await bed.sandboxes_of(pod.metadata.uid) == []


# -- hook answers reach containerd ----------------------------------------------------------


async def test_pod_changes_reach_containerd(bed: HookBed) -> None:
    server = await bed.server("pod")
    pod = bed.pod_config("podchanges", labels={"app": "p"}, annotations={"kept": "1"})
    moved = bed.containerd.cgroup_parent(pod.metadata.uid, "besteffort")
    server.set(
        P.PRE_RUN_POD_SANDBOX,
        hook.PodSandboxHookResponse(
            labels={"hook-label": "L"}, annotations={"hook-note": "v=1", "kept": "2"}, cgroup_parent=moved
        ),
    )
    await bed.register(server)
    sandbox_id = await bed.run_pod(pod)
    status = (await bed.rs.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id))).status
    assert dict(status.labels) == {"app": "p", "hook-label": "L"}
    assert dict(status.annotations) == {"kept": "2", "hook-note": "v=1"}
    # The sandbox's (pause container's) cgroup is under the parent the hook chose.
    assert (CGROUP_CPU / moved.lstrip("/") / sandbox_id).is_dir()
    assert not (CGROUP_CPU / pod.linux.cgroup_parent.lstrip("/") / sandbox_id).exists()
    # A container created from kubelet's original sandbox config follows its pod there,
    # and its hooks see the pod's labels as the pod hook left them.
    server.set(P.PRE_CREATE_CONTAINER, hook.ContainerResourceHookResponse())
    await bed.register(server)
    await asyncio.sleep(0.5)
    container_id = await bed.create(sandbox_id, pod, bed.container_config())
    await bed.start(container_id)  # runc makes the cgroup at start
    assert (CGROUP_CPU / moved.lstrip("/") / container_id).is_dir()
    created = server.calls(P.PRE_CREATE_CONTAINER)[-1]
    assert created.pod_cgroup_parent == moved
    assert created.pod_labels["hook-label"] == "L"


async def test_container_changes_reach_containerd(bed: HookBed) -> None:
    server = await bed.server("ctr")
    server.set(
        P.PRE_CREATE_CONTAINER,
        hook.ContainerResourceHookResponse(
            container_resources=hook.LinuxContainerResources(cpu_quota=50000),
            container_annotations={"hooked": "yes"},
            container_env_list=[hook.KeyValue(key="NEW", value=b"k=v=w"), hook.KeyValue(key="A", value=b"in=place")],
        ),
    )
    server.set(
        P.PRE_UPDATE_CONTAINER_RESOURCES,
        hook.ContainerResourceHookResponse(container_resources=hook.LinuxContainerResources(cpu_quota=70000)),
    )
    server.set(P.POST_UPDATE_CONTAINER_RESOURCES, Respond())
    await bed.register(server)
    pod = bed.pod_config("ctrchanges")
    sandbox_id = await bed.run_pod(pod)
    envs = [("Z", b"1"), ("A", b"x=y"), ("M", b"m")]
    container_id = await bed.create(sandbox_id, pod, bed.container_config(envs=envs))
    await bed.start(container_id)
    parent = pod.linux.cgroup_parent

    assert cgroup_file(parent, container_id, "cpu.cfs_quota_us") == "50000"
    assert cgroup_file(parent, container_id, "cpu.shares") == "512"  # the request's, untouched
    assert await bed.exec(container_id, "sh", "-c", "echo $NEW") == b"k=v=w\n"
    # exec runs with the container's OCI process env (PID 1 is the pod's pause process here).
    environ = (await bed.exec(container_id, "cat", "/proc/self/environ")).split(b"\0")
    ours = [item for item in environ if item.split(b"=", 1)[0] in (b"Z", b"A", b"M", b"NEW")]
    assert ours == [b"Z=1", b"A=in=place", b"M=m", b"NEW=k=v=w"]
    status = await bed.rs.ContainerStatus(cri.ContainerStatusRequest(container_id=container_id))
    assert status.status.annotations["hooked"] == "yes"

    await bed.update(container_id, cri.LinuxContainerResources(cpu_period=100000, cpu_quota=40000, cpu_shares=256))
    assert cgroup_file(parent, container_id, "cpu.cfs_quota_us") == "70000"  # the hook's, not the 40000 asked
    assert cgroup_file(parent, container_id, "cpu.shares") == "256"
    post = await server.wait_for(P.POST_UPDATE_CONTAINER_RESOURCES)
    assert post.container_resources.cpu_quota == 70000  # post-hooks see what was sent


# -- several servers --------------------------------------------------------------------------


def _chain_step(name: str, quota: int, *, expect_quota: int | None = None) -> Custom:
    """A PreCreateContainer answer adding env/annotation ``name`` and setting cpu_quota."""

    def answer(point: HookPoint, request: Any, context: Any) -> Any:
        if expect_quota is not None:
            assert request.container_resources.cpu_quota == expect_quota
        return hook.ContainerResourceHookResponse(
            container_resources=hook.LinuxContainerResources(cpu_quota=quota),
            container_annotations={name: "yes"},
            container_env_list=[hook.KeyValue(key=name.upper(), value=name.encode())],
        )

    return Custom(answer)


@pytest.mark.parametrize("layout", ["index", "file-name"])
async def test_servers_are_chained_in_order(bed: HookBed, layout: str) -> None:
    # "index": b.json has index 1, a.json index 2 -> b first although a sorts first by name.
    # "file-name": both index 5 -> a.json first; b.json is written first.
    first_name, second_name = ("b", "a") if layout == "index" else ("a", "b")
    first, second = await bed.server(first_name), await bed.server(second_name)
    first.set(P.PRE_RUN_POD_SANDBOX, hook.PodSandboxHookResponse(labels={"first": "1"}, annotations={"by": "1"}))
    second.set(
        P.PRE_RUN_POD_SANDBOX,
        Custom(
            lambda point, request, context: hook.PodSandboxHookResponse(
                annotations={"by": "2", "saw-first": request.labels.get("first", "no")}
            )
        ),
    )
    first.set(P.PRE_CREATE_CONTAINER, _chain_step(first_name, 30000))
    second.set(P.PRE_CREATE_CONTAINER, _chain_step(second_name, 60000, expect_quota=30000))
    if layout == "index":
        second.register(bed.config_dir, index=2)
        await bed.register(first, index=1)
    else:
        second.register(bed.config_dir, index=5)
        await bed.register(first, index=5)

    pod = bed.pod_config("chain")
    sandbox_id = await bed.run_pod(pod)
    container_id = await bed.create(sandbox_id, pod, bed.container_config(envs=[("ORIG", b"o")]))
    await bed.start(container_id)

    assert bed.journal == [
        (first_name, "PreRunPodSandbox"),
        (second_name, "PreRunPodSandbox"),
        (first_name, "PreCreateContainer"),
        (second_name, "PreCreateContainer"),
    ]
    # The second server saw the first one's changes...
    assert second.last(P.PRE_RUN_POD_SANDBOX).labels["first"] == "1"
    seen = second.last(P.PRE_CREATE_CONTAINER)
    assert env_pairs(seen) == [("ORIG", b"o"), (first_name.upper(), first_name.encode())]
    assert dict(seen.container_annotations) == {first_name: "yes"}
    # ...and both changes reached containerd, the second winning where they overlap.
    status = (await bed.rs.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id))).status
    assert status.labels["first"] == "1"
    assert status.annotations["by"] == "2" and status.annotations["saw-first"] == "1"
    assert cgroup_file(pod.linux.cgroup_parent, container_id, "cpu.cfs_quota_us") == "60000"
    out = await bed.exec(container_id, "sh", "-c", f"echo $ORIG ${first_name.upper()} ${second_name.upper()}")
    assert out == f"o {first_name} {second_name}\n".encode()
    container = (await bed.rs.ContainerStatus(cri.ContainerStatusRequest(container_id=container_id))).status
    assert container.annotations[first_name] == "yes" and container.annotations[second_name] == "yes"


# -- failure policies -------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_failing_pre_run_pod_sandbox(bed: HookBed, policy: str) -> None:
    refusal = Fail(grpc.StatusCode.PERMISSION_DENIED, "not on my node")
    server = await bed.serve("failing", P.PRE_RUN_POD_SANDBOX, refusal, policy=policy)
    pod = bed.pod_config("failpod")
    if policy == "Fail":
        error = await rpc_error(bed.run_pod(pod))
        assert "failing.json" in error.details() and "PreRunPodSandbox" in error.details()
        assert "not on my node" in error.details()
        assert await bed.sandboxes_of(pod.metadata.uid) == []  # containerd was never asked
    else:
        sandbox_id = await bed.run_pod(pod)
        assert await bed.sandboxes_of(pod.metadata.uid) == [sandbox_id]
        status = (await bed.rs.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id))).status
        assert dict(status.labels) == dict(pod.labels) and dict(status.annotations) == dict(pod.annotations)
    assert len(server.calls(P.PRE_RUN_POD_SANDBOX)) == 1


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_failing_pre_create_container(bed: HookBed, policy: str) -> None:
    await bed.serve("failing", P.PRE_CREATE_CONTAINER, Fail(grpc.StatusCode.INTERNAL, "boom"), policy=policy)
    pod = bed.pod_config("failctr")
    sandbox_id = await bed.run_pod(pod)
    if policy == "Fail":
        error = await rpc_error(bed.create(sandbox_id, pod, bed.container_config()))
        assert "failing.json" in error.details() and "PreCreateContainer" in error.details()
        assert await bed.containers_of(sandbox_id) == []
    else:
        container_id = await bed.create(sandbox_id, pod, bed.container_config())
        assert await bed.containers_of(sandbox_id) == [container_id]


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_server_down(bed: HookBed, policy: str) -> None:
    nowhere = os.path.join(bed.workdir, "nobody-listens.sock")
    write_registration(bed.config_dir, "down.json", nowhere, [P.PRE_RUN_POD_SANDBOX], policy=policy)
    await bed.wait_registered("down.json")
    pod = bed.pod_config("down")
    began = time.monotonic()
    if policy == "Fail":
        error = await rpc_error(bed.run_pod(pod))
        assert "down.json" in error.details() and "PreRunPodSandbox" in error.details()
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert await bed.sandboxes_of(pod.metadata.uid) == []
    else:
        await bed.run_pod(pod)
    assert time.monotonic() - began < 5
    assert bed.hook_calls("down.json", "PreRunPodSandbox", "failed") == 1


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_hanging_server_times_out(bed: HookBed, policy: str) -> None:
    await bed.serve("slow", P.PRE_RUN_POD_SANDBOX, Hang(), policy=policy, timeout="500ms")
    pod = bed.pod_config("hang")
    began = time.monotonic()
    if policy == "Fail":
        error = await rpc_error(bed.run_pod(pod))
        elapsed = time.monotonic() - began
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "slow.json" in error.details() and "PreRunPodSandbox" in error.details()
        assert await bed.sandboxes_of(pod.metadata.uid) == []
        assert 0.45 < elapsed < 5
    else:
        await bed.run_pod(pod)
        assert 0.45 < time.monotonic() - began < 5
    assert bed.hook_calls("slow.json", "PreRunPodSandbox", "timeout") == 1


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
@pytest.mark.parametrize("field", sorted(INVALID_CONTAINER_RESPONSES))
async def test_invalid_container_answer(bed: HookBed, policy: str, field: str) -> None:
    await bed.serve("invalid", P.PRE_CREATE_CONTAINER, INVALID_CONTAINER_RESPONSES[field], policy=policy)
    pod = bed.pod_config("invalidctr")
    sandbox_id = await bed.run_pod(pod)
    if policy == "Fail":
        error = await rpc_error(bed.create(sandbox_id, pod, bed.container_config()))
        assert field in error.details() and "invalid.json" in error.details()
        assert "PreCreateContainer" in error.details()
        assert await bed.containers_of(sandbox_id) == []
    else:
        container_id = await bed.create(sandbox_id, pod, bed.container_config())
        await bed.start(container_id)
        # None of the answer was applied, not even its valid cpu_quota; the container is
        # under the parent kubelet asked for.
        parent = pod.linux.cgroup_parent
        assert cgroup_file(parent, container_id, "cpu.cfs_quota_us") == "-1"
        assert cgroup_file(parent, container_id, "cpu.shares") == "512"
    assert bed.hook_calls("invalid.json", "PreCreateContainer", "invalid") == 1


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
@pytest.mark.parametrize("field", sorted(INVALID_POD_RESPONSES))
async def test_invalid_pod_answer(bed: HookBed, policy: str, field: str) -> None:
    await bed.serve("invalid", P.PRE_RUN_POD_SANDBOX, INVALID_POD_RESPONSES[field], policy=policy)
    pod = bed.pod_config("invalidpod")
    if policy == "Fail":
        error = await rpc_error(bed.run_pod(pod))
        assert field in error.details() and "invalid.json" in error.details()
        assert await bed.sandboxes_of(pod.metadata.uid) == []
    else:
        sandbox_id = await bed.run_pod(pod)
        status = (await bed.rs.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id))).status
        assert "invalid-hook" not in status.annotations  # the valid part of the answer is dropped too
        assert (CGROUP_CPU / pod.linux.cgroup_parent.lstrip("/") / sandbox_id).is_dir()


async def test_post_hook_failures_never_fail_the_call(bed: HookBed) -> None:
    server = await bed.server("post")
    for point in (
        P.POST_CREATE_CONTAINER,
        P.POST_UPDATE_CONTAINER_RESOURCES,
        P.POST_STOP_CONTAINER,
        P.POST_STOP_POD_SANDBOX,
    ):
        server.set(point, Fail(grpc.StatusCode.INTERNAL, "post says no"))
    server.set(P.POST_START_CONTAINER, Hang())
    server.set(P.POST_REMOVE_POD_SANDBOX, hook.PodSandboxHookResponse(cgroup_parent="/../etc"))  # invalid
    await bed.register(server, policy="Fail", timeout=0.5)

    pod = bed.pod_config("post")
    sandbox_id = await bed.run_pod(pod)
    container_id = await bed.create(sandbox_id, pod, bed.container_config())
    began = time.monotonic()
    await bed.start(container_id)
    assert time.monotonic() - began < 5
    await bed.update(container_id, cri.LinuxContainerResources(cpu_quota=40000, cpu_period=100000))
    assert cgroup_file(pod.linux.cgroup_parent, container_id, "cpu.cfs_quota_us") == "40000"
    await bed.rs.StopContainer(cri.StopContainerRequest(container_id=container_id, timeout=0), timeout=CALL_TIMEOUT)
    await bed.rs.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
    await bed.rs.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
    await server.wait_for(P.POST_REMOVE_POD_SANDBOX)
    assert await bed.sandboxes_of(pod.metadata.uid) == []
    for point in (
        P.POST_CREATE_CONTAINER,
        P.POST_START_CONTAINER,
        P.POST_UPDATE_CONTAINER_RESOURCES,
        P.POST_STOP_CONTAINER,
        P.POST_STOP_POD_SANDBOX,
        P.POST_REMOVE_POD_SANDBOX,
    ):
        assert len(server.calls(point)) == 1, point


async def test_unimplemented_registered_hooks_under_ignore_let_the_lifecycle_through(bed: HookBed) -> None:
    """Each UNIMPLEMENTED fails its hook (counted); Ignore relays every call unchanged.
    Under Fail the first one refuses RunPodSandbox (tests/e2e/test_fault_fail_closed.py)."""
    server = await bed.server("koordlike")  # no behaviours: answers UNIMPLEMENTED to everything
    await bed.register(server, policy="Ignore", hooks=list(HookPoint))
    _, sandbox_id, container_id = await bed.pod_with_container()
    await bed.update(container_id, cri.LinuxContainerResources(cpu_quota=40000, cpu_period=100000))
    await bed.rs.StopContainer(cri.StopContainerRequest(container_id=container_id, timeout=0), timeout=CALL_TIMEOUT)
    await bed.rs.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
    await bed.rs.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
    await server.wait_for(P.POST_REMOVE_POD_SANDBOX)
    assert len({point for _, point in bed.journal}) == 12  # asked at every hook point of the lifecycle
    assert bed.hook_calls("koordlike.json", "PreRunPodSandbox", "unimplemented") == 1
    assert bed.hook_calls("koordlike.json", "PreCreateContainer", "unimplemented") == 1


async def test_skip_label_bypasses_every_hook(bed: HookBed) -> None:
    server = await bed.server("strict")
    for point in HookPoint:
        server.set(point, Fail(grpc.StatusCode.INTERNAL, "must not be called"))
    await bed.register(server, policy="Fail")
    control = bed.pod_config("control", labels={SKIP_LABEL: "false"})
    await rpc_error(bed.run_pod(control))  # the label's value must match: this pod is hooked
    server.clear()
    bed.journal.clear()

    pod = bed.pod_config("skipped", labels={SKIP_LABEL: "true"})
    sandbox_id = await bed.run_pod(pod)
    container_id = await bed.create(sandbox_id, pod, bed.container_config())
    await bed.start(container_id)
    await bed.update(container_id, cri.LinuxContainerResources(cpu_quota=40000, cpu_period=100000))
    await bed.rs.StopContainer(cri.StopContainerRequest(container_id=container_id, timeout=0), timeout=CALL_TIMEOUT)
    await bed.rs.RemoveContainer(cri.RemoveContainerRequest(container_id=container_id), timeout=CALL_TIMEOUT)
    await bed.rs.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
    await bed.rs.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
    await asyncio.sleep(0.2)  # post-hooks, were any due, would have run by now
    assert bed.journal == []


async def test_skip_label_bypasses_post_stop_pod_sandbox(bed: HookBed) -> None:
    server = await bed.serve("strict", P.POST_STOP_POD_SANDBOX, Respond(), policy="Fail")
    pod = bed.pod_config("skipped", labels={SKIP_LABEL: "true"})
    sandbox_id = await bed.run_pod(pod)
    await bed.rs.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CALL_TIMEOUT)
    await asyncio.sleep(0.3)
    assert server.calls(P.POST_STOP_POD_SANDBOX) == []


# -- registrations changing while the proxy runs -----------------------------------------------


async def test_registration_changes_take_effect_while_running(bed: HookBed) -> None:
    _, _, container_id = await bed.pod_with_container()
    s, t = await bed.server("s"), await bed.server("t")
    quota = iter(range(20000, 10**6, 1000))
    latencies: dict[str, float] = {}

    async def probe() -> grpc.StatusCode:
        """One UpdateContainerResources through the proxy; its status code."""
        try:
            await bed.update(container_id, cri.LinuxContainerResources(cpu_quota=next(quota), cpu_period=100000))
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    async def until(step: str, check: Callable[[], Awaitable[bool]]) -> None:
        async def attempt() -> bool | None:
            return True if await check() else None

        _, latencies[step] = await eventually(attempt)

    # Added: a new file is picked up.
    s.set(P.PRE_UPDATE_CONTAINER_RESOURCES, Fail(grpc.StatusCode.INTERNAL, "s fails"))
    s.register(bed.config_dir, policy="Ignore")

    async def s_called() -> bool:
        before = len(s.calls(P.PRE_UPDATE_CONTAINER_RESOURCES))
        code = await probe()
        assert code == grpc.StatusCode.OK  # Ignore
        return len(s.calls(P.PRE_UPDATE_CONTAINER_RESOURCES)) > before

    await until("added", s_called)

    # Changed policy: Ignore -> Fail.
    s.register(bed.config_dir, policy="Fail")

    async def probe_fails() -> bool:
        return await probe() != grpc.StatusCode.OK

    await until("policy changed", probe_fails)

    # Changed hooks list: no longer subscribed to PreUpdateContainerResources.
    s.register(bed.config_dir, policy="Fail", hooks=[P.PRE_RUN_POD_SANDBOX])

    async def probe_ok() -> bool:
        return await probe() == grpc.StatusCode.OK

    await until("hooks changed", probe_ok)
    s_calls = len(s.calls(P.PRE_UPDATE_CONTAINER_RESOURCES))
    assert await probe() == grpc.StatusCode.OK and len(s.calls(P.PRE_UPDATE_CONTAINER_RESOURCES)) == s_calls

    # A malformed new file does not disturb the others, and a new good one still registers.
    write_raw_registration(bed.config_dir, "broken.json", '{"remote-endpoint": ')
    write_raw_registration(bed.config_dir, "wrong.json", '{"remote-endpoint": "/x.sock", "failure-policy": "Maybe"}')
    s.set(P.PRE_UPDATE_CONTAINER_RESOURCES, Respond())
    s.register(bed.config_dir, policy="Fail", hooks=[P.PRE_UPDATE_CONTAINER_RESOURCES])
    t.set(P.PRE_UPDATE_CONTAINER_RESOURCES, Respond())
    t.register(bed.config_dir, policy="Fail")

    async def both_called() -> bool:
        before = len(s.calls(P.PRE_UPDATE_CONTAINER_RESOURCES)), len(t.calls(P.PRE_UPDATE_CONTAINER_RESOURCES))
        assert await probe() == grpc.StatusCode.OK
        after = len(s.calls(P.PRE_UPDATE_CONTAINER_RESOURCES)), len(t.calls(P.PRE_UPDATE_CONTAINER_RESOURCES))
        return after[0] > before[0] and after[1] > before[1]

    await until("malformed beside good", both_called)

    # A registered file turned malformed keeps its last good version (documented).
    write_raw_registration(bed.config_dir, "t.json", "{ half a file")
    await asyncio.sleep(0.6)  # three polls
    before = len(t.calls(P.PRE_UPDATE_CONTAINER_RESOURCES))
    assert await probe() == grpc.StatusCode.OK
    assert len(t.calls(P.PRE_UPDATE_CONTAINER_RESOURCES)) == before + 1

    # Removed: neither server is called any more.
    s.unregister()
    remove_registration(bed.config_dir, "t.json")

    async def none_called() -> bool:
        before = s.total_calls() + t.total_calls()
        assert await probe() == grpc.StatusCode.OK
        return s.total_calls() + t.total_calls() == before

    await until("removed", none_called)
    for step, seconds in latencies.items():
        assert seconds < CONFIG_LATENCY, (step, seconds)
    print("registration change latencies:", {k: round(v, 3) for k, v in latencies.items()})


# -- metrics ------------------------------------------------------------------------------------


async def test_metrics_count_outcomes(bed: HookBed) -> None:
    server = await bed.server("m")
    _, _, container_id = await bed.pod_with_container()
    await bed.register(server, policy="Ignore", hooks=[P.PRE_UPDATE_CONTAINER_RESOURCES], timeout=0.3)
    behaviours = {
        "ok": Respond(),
        "failed": Fail(grpc.StatusCode.INTERNAL, "no"),
        "timeout": Hang(),
        "invalid": hook.ContainerResourceHookResponse(container_resources=hook.LinuxContainerResources(cpu_shares=1)),
        "unimplemented": None,
    }
    for count, behaviour in enumerate(behaviours.values(), start=1):
        server.set(P.PRE_UPDATE_CONTAINER_RESOURCES, behaviour)
        await bed.update(container_id, cri.LinuxContainerResources(cpu_quota=40000 + count * 1000, cpu_period=100000))
        assert len(server.calls(P.PRE_UPDATE_CONTAINER_RESOURCES)) == count
    for outcome in behaviours:
        assert bed.hook_calls("m.json", "PreUpdateContainerResources", outcome) == 1, outcome
    labels = {"server": "m.json", "hook": "PreUpdateContainerResources"}
    assert bed.metrics.get_sample_value("runtimeproxy_hook_duration_seconds_count", labels) == 5


# -- concurrency --------------------------------------------------------------------------------


async def test_slow_hook_for_one_pod_does_not_hold_up_another(bed: HookBed) -> None:
    server = await bed.server("slowpod")

    async def answer(point: HookPoint, request: Any, context: Any) -> Any:
        if request.pod_meta.name == "slow":
            await asyncio.sleep(1.0)
        return hook.PodSandboxHookResponse()

    server.set(P.PRE_RUN_POD_SANDBOX, Custom(answer))
    await bed.register(server)
    finished: list[str] = []

    async def run(name: str) -> float:
        began = time.monotonic()
        await bed.run_pod(bed.pod_config(name))
        finished.append(name)
        return time.monotonic() - began

    slow = asyncio.create_task(run("slow"))
    await server.wait_for(P.PRE_RUN_POD_SANDBOX)  # A is inside its hook
    fast_seconds = await run("fast")
    slow_seconds = await slow
    assert finished == ["fast", "slow"]
    assert fast_seconds < 0.9 and slow_seconds >= 1.0


# -- the daemon restarting between CreateContainer and StartContainer -------------------------


class DaemonProcess:
    def __init__(self, workdir: str, name: str, containerd: Containerd, config_dir: str) -> None:
        self.endpoint = os.path.join(workdir, f"{name}.sock")
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.args = [
            *DAEMON,
            "serve",
            "--endpoint",
            "unix://" + self.endpoint,
            "--remote-runtime-endpoint",
            containerd.address,
            "--hook-config-dir",
            config_dir,
            "--cgroup-parent-root",
            "/" + containerd.cgroup_prefix,
            "--log-format",
            "console",
        ]
        self.proc: asyncio.subprocess.Process | None = None
        self.channel: grpc.aio.Channel | None = None

    async def start(self) -> Any:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        with open(self.log_path, "wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.args, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env
            )
        self.channel = grpc.aio.insecure_channel("unix://" + self.endpoint)
        stub = cri_grpc.RuntimeServiceStub(self.channel)
        deadline = time.monotonic() + 20
        while True:
            assert self.proc.returncode is None, f"daemon exited early:\n{self.log()}"
            try:
                await stub.Version(cri.VersionRequest(), timeout=1)
                return stub
            except grpc.aio.AioRpcError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"daemon not serving within 20 s:\n{self.log()}") from None
                await asyncio.sleep(0.05)

    async def terminate(self) -> int:
        if self.channel is not None:
            await self.channel.close()
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"daemon ignored SIGTERM:\n{self.log()}") from None

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self.channel is not None:
            await self.channel.close()

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")


async def test_restart_between_create_and_start_keeps_hook_context(bed: HookBed) -> None:
    server = await bed.server("restart")
    server.set(
        P.PRE_CREATE_CONTAINER,
        hook.ContainerResourceHookResponse(
            container_resources=hook.LinuxContainerResources(cpu_quota=50000),
            container_env_list=[hook.KeyValue(key="HOOKED", value=b"h=1")],
        ),
    )
    server.set(P.POST_CREATE_CONTAINER, Respond())
    server.set(P.PRE_START_CONTAINER, Respond())
    server.register(bed.config_dir)
    first = DaemonProcess(bed.workdir, "first", bed.containerd, bed.config_dir)
    second = DaemonProcess(bed.workdir, "second", bed.containerd, bed.config_dir)
    try:
        rs = await first.start()
        pod = bed.pod_config(
            "restart",
            labels={"app": "restart", "team": "t"},
            annotations={"a": "1"},
            resources=POD_RESOURCES,
            overhead=POD_OVERHEAD,
        )
        sandbox_id = (await rs.RunPodSandbox(cri.RunPodSandboxRequest(config=pod), timeout=CALL_TIMEOUT)).pod_sandbox_id
        config = bed.container_config("main", envs=ENVS, annotations={"c": "2"})
        request = cri.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=pod)
        container_id = (await rs.CreateContainer(request, timeout=CALL_TIMEOUT)).container_id
        await server.wait_for(P.POST_CREATE_CONTAINER)
        assert await first.terminate() == 0, first.log()

        rs = await second.start()
        await rs.StartContainer(cri.StartContainerRequest(container_id=container_id), timeout=CALL_TIMEOUT)
    finally:
        await first.kill()
        await second.kill()

    created = server.last(P.PRE_CREATE_CONTAINER)
    started = server.last(P.PRE_START_CONTAINER)
    assert started.container_meta == hook.ContainerMetadata(name="main", attempt=1, id=container_id)
    assert started.pod_meta == created.pod_meta
    assert dict(started.pod_labels) == dict(created.pod_labels) == {"app": "restart", "team": "t"}
    assert dict(started.pod_annotations) == dict(created.pod_annotations)
    assert dict(started.container_annotations) == dict(created.container_annotations)
    assert started.pod_cgroup_parent == created.pod_cgroup_parent == pod.linux.cgroup_parent
    assert started.pod_resources == created.pod_resources == as_hook(POD_RESOURCES)
    assert started.pod_overhead == created.pod_overhead == as_hook(POD_OVERHEAD)
    assert started.pod_sandbox_id == sandbox_id
    # What containerd was asked for: PreCreate's view plus the hook's own changes.
    want_resources = hook.LinuxContainerResources()
    want_resources.CopyFrom(created.container_resources)
    want_resources.cpu_quota = 50000
    assert started.container_resources == want_resources
    assert env_pairs(started) == [*env_pairs(created), ("HOOKED", b"h=1")]
    assert cgroup_file(pod.linux.cgroup_parent, container_id, "cpu.cfs_quota_us") == "50000"


# -- UpdatePodSandboxResources: no runtime in reach implements it -------------------------------


@pytest.mark.parametrize("hooks", [False, True], ids=["no-hooks", "hooks"])
async def test_update_pod_sandbox_resources_is_refused_as_the_runtime_refuses_it(bed: HookBed, hooks: bool) -> None:
    """No test-bed series implements UpdatePodSandboxResources (1.6 and 1.7 do not know the
    method, 2.x answers UNIMPLEMENTED): through the proxy the caller gets the runtime's own
    refusal, with hook servers registered on every hook point or none. The hook answer is
    relayed like any other, so PreUpdatePodSandboxResources runs, and its refusal is the
    runtime's alone."""
    server = None
    if hooks:
        server = (await bed.server("resize")).respond_all()
        await bed.register(server, policy="Fail", hooks=list(HookPoint))
    pod, sandbox_id, _container_id = await bed.pod_with_container()
    request = cri.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id=sandbox_id, overhead=POD_OVERHEAD, resources=POD_RESOURCES
    )
    through = await rpc_error(bed.rs.UpdatePodSandboxResources(request, timeout=CALL_TIMEOUT))
    straight = await rpc_error(bed.direct.UpdatePodSandboxResources(request, timeout=CALL_TIMEOUT))
    assert through.code() == straight.code() == grpc.StatusCode.UNIMPLEMENTED
    assert through.details() == straight.details()
    if server is not None:
        asked = server.last(P.PRE_UPDATE_POD_SANDBOX_RESOURCES)
        assert asked.pod_sandbox_id == sandbox_id
        assert asked.resources == as_hook(POD_RESOURCES)
    assert await bed.sandboxes_of(pod.metadata.uid) == [sandbox_id]  # the pod is untouched
