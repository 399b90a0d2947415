"""LivePodCache: rounds after the first load only what is new and refresh known containers with a
non-verbose ContainerStatus, and give exactly what loading everything in full (list_live_pods)
gives; against a real containerd (both series) and, property-based, a scripted runtime."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import grpc.aio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runtimeproxy.hooks.live_pods import LivePodCache, LivePods, container_info, list_live_pods
from verbose_info import go_json

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.runtime_state import RuntimeLoader, container_from_list_item
from runtimeproxy.testbed import Containerd

TIMEOUT = 60.0
Call = tuple[str, str, bool]  # method, object id, verbose


def rpc_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


class Recorder:
    """A loader's calls, recorded; ``before[(method, id)]`` runs once before that call reaches
    the runtime, ``fail[(method, id)]`` is raised once instead of it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[Call] = []
        self.before: dict[tuple[str, str], Callable[[], None]] = {}
        self.fail: dict[tuple[str, str], Exception] = {}

    def __getattr__(self, method: str) -> Any:
        call = getattr(self.inner, method)

        async def recorded(request: Any, *, timeout: float) -> Any:
            object_id = getattr(request, "pod_sandbox_id", "") or getattr(request, "container_id", "")
            self.calls.append((method, object_id, getattr(request, "verbose", False)))
            if (action := self.before.pop((method, object_id), None)) is not None:
                action()
            if (error := self.fail.pop((method, object_id), None)) is not None:
                raise error
            return await call(request, timeout=timeout)

        return recorded

    def take(self) -> list[Call]:
        calls, self.calls = self.calls, []
        return calls


def recorded(loader: RuntimeLoader) -> Recorder:
    recorder = Recorder(loader.stub)
    loader._stub = recorder
    return recorder


def watched(loaders: tuple[RuntimeLoader, RuntimeLoader]) -> tuple[RuntimeLoader, Recorder, LivePodCache]:
    """The loader that loads in full, the other one's calls (recorded) and a cache over that one."""
    cached, full = loaders
    return full, recorded(cached), LivePodCache(cached)


LISTS: list[Call] = [("ListPodSandbox", "", False), ("ListContainers", "", False)]


def status_calls(calls: list[Call]) -> set[Call]:
    return {call for call in calls if call[0].endswith("Status")}


# --- against a real containerd ---------------------------------------------------------------------


class Node:
    """Pods made directly on the test bed (host network, busybox containers)."""

    def __init__(self, bed: Containerd) -> None:
        self.bed = bed
        self.cri = CriClient(bed.address, timeout=TIMEOUT)
        self.configs: dict[str, pb.PodSandboxConfig] = {}

    def run_pod(self, name: str) -> str:
        uid = str(uuid.uuid4())
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=f"{name}-{uid[:8]}", uid=uid, namespace="live"),
            labels={"app": name},
            annotations={"note": "a=b"},
            log_directory=str(self.bed.root_dir / "pod-logs" / uid),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=self.bed.cgroup_parent(uid, "burstable"),
                resources=pb.LinuxContainerResources(cpu_shares=1024, memory_limit_in_bytes=512 << 20),
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
            ),
        )
        sandbox_id: str = self.cri.runtime.RunPodSandbox(
            pb.RunPodSandboxRequest(config=config), timeout=TIMEOUT
        ).pod_sandbox_id
        self.configs[sandbox_id] = config
        return sandbox_id

    def add_container(self, sandbox_id: str, name: str, *, start: bool = True) -> str:
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name),
            image=pb.ImageSpec(image=self.bed.test_image),
            envs=[pb.KeyValue(key="GREETING", value=b"hello=world")],
            annotations={"io.kubernetes.container.restartCount": "0"},
            log_path=f"{name}.log",
            linux=pb.LinuxContainerConfig(
                resources=pb.LinuxContainerResources(
                    cpu_period=100000, cpu_quota=50000, cpu_shares=512, memory_limit_in_bytes=128 << 20
                )
            ),
        )
        request = pb.CreateContainerRequest(
            pod_sandbox_id=sandbox_id, config=config, sandbox_config=self.configs[sandbox_id]
        )
        container_id: str = self.cri.runtime.CreateContainer(request, timeout=TIMEOUT).container_id
        if start:
            self.cri.runtime.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=TIMEOUT)
        return container_id

    def update(self, container_id: str, **values: Any) -> None:
        request = pb.UpdateContainerResourcesRequest(
            container_id=container_id, linux=pb.LinuxContainerResources(**values)
        )
        self.cri.runtime.UpdateContainerResources(request, timeout=TIMEOUT)

    def stop_container(self, container_id: str) -> None:
        self.cri.runtime.StopContainer(pb.StopContainerRequest(container_id=container_id, timeout=0), timeout=TIMEOUT)

    def remove_container(self, container_id: str) -> None:
        self.stop_container(container_id)
        self.cri.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=container_id), timeout=TIMEOUT)

    def remove_pod(self, sandbox_id: str) -> None:
        self.cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=TIMEOUT)
        self.cri.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=TIMEOUT)


@pytest.fixture
def node(containerd: Containerd) -> Iterator[Node]:
    containerd.start()  # running again if a test stopped it
    made = Node(containerd)
    try:
        yield made
    finally:
        if not containerd.running:
            containerd.start()
        containerd.remove_all_pods()
        made.cri.close()


@pytest.fixture
async def loaders(containerd: Containerd) -> Any:
    """A loader whose calls are recorded (for the cache) and one for the full loads."""
    cached, full = RuntimeLoader(containerd.address), RuntimeLoader(containerd.address)
    yield cached, full
    await cached.close()
    await full.close()


def canonical(live: LivePods) -> tuple[Any, ...]:
    """``live`` in a fixed order: containerd lists objects in no stable order (a Go map), so two
    full loads of the same runtime differ in order alone."""
    pods = sorted(live.pods, key=lambda pod: pod.sandbox_id)
    containers = {sandbox: sorted(items, key=lambda c: c.id) for sandbox, items in live.containers.items()}
    return pods, containers, live.unreadable


async def full_load(loader: RuntimeLoader) -> tuple[Any, ...]:
    return canonical(await list_live_pods(loader))


def container_ids(live: LivePods) -> set[str]:
    return {container.id for items in live.containers.values() for container in items}


@pytest.mark.e2e
async def test_known_objects_cost_one_plain_container_status_and_rounds_equal_full_loads(
    node: Node, loaders: tuple[RuntimeLoader, RuntimeLoader]
) -> None:
    full, calls, cache = watched(loaders)
    pod_a, pod_b = node.run_pod("a"), node.run_pod("b")
    a1, a2 = node.add_container(pod_a, "a1"), node.add_container(pod_a, "a2")
    b1 = node.add_container(pod_b, "b1", start=False)  # CREATED is live too

    first = await cache.read()
    assert canonical(first) == await full_load(full)
    assert {pod.sandbox_id for pod in first.pods} == {pod_a, pod_b} and container_ids(first) == {a1, a2, b1}
    assert status_calls(calls.take()) == {
        ("PodSandboxStatus", pod_a, True),
        ("PodSandboxStatus", pod_b, True),
        *{("ContainerStatus", c, True) for c in (a1, a2, b1)},
    }
    assert len(cache) == 5

    second = await cache.read()
    assert canonical(second) == canonical(first) == await full_load(full)
    round_calls = calls.take()
    assert round_calls[:2] == LISTS and sorted(round_calls[2:]) == sorted(
        ("ContainerStatus", c, False) for c in (a1, a2, b1)
    )

    node.update(a1, cpu_period=100000, cpu_quota=30000, cpu_shares=300, memory_limit_in_bytes=96 << 20)
    updated = await cache.read()
    assert canonical(updated) == await full_load(full)
    [shown] = [c for c in updated.containers[pod_a] if c.id == a1]
    assert shown.resources is not None
    assert (shown.resources.cpu_quota, shown.resources.cpu_shares, shown.resources.memory_limit_in_bytes) == (
        30000,
        300,
        96 << 20,
    )
    assert shown.env == (("GREETING", "hello=world"),)  # the rest still the create-time config
    assert not any(verbose for _, _, verbose in calls.take())

    pod_c = node.run_pod("c")
    c1 = node.add_container(pod_c, "c1")
    node.remove_pod(pod_b)
    node.stop_container(a2)  # EXITED: no longer live
    changed = await cache.read()
    assert canonical(changed) == await full_load(full)
    assert {pod.sandbox_id for pod in changed.pods} == {pod_a, pod_c} and container_ids(changed) == {a1, c1}
    assert status_calls(calls.take()) == {
        ("PodSandboxStatus", pod_c, True),
        ("ContainerStatus", c1, True),
        ("ContainerStatus", a1, False),
    }
    assert len(cache) == 4  # b's pod and container and a2 forgotten


@pytest.mark.e2e
async def test_objects_removed_between_list_and_status_are_skipped_and_forgotten(
    node: Node, loaders: tuple[RuntimeLoader, RuntimeLoader]
) -> None:
    full, calls, cache = watched(loaders)
    pod_a = node.run_pod("a")
    a1, a2 = node.add_container(pod_a, "a1"), node.add_container(pod_a, "a2")
    await cache.read()
    pod_d = node.run_pod("d")
    a3 = node.add_container(pod_a, "a3")
    # Listed, then removed before their status call: the runtime answers NOT_FOUND.
    calls.before[("ContainerStatus", a1)] = lambda: node.remove_container(a1)  # known: plain status
    calls.before[("ContainerStatus", a3)] = lambda: node.remove_container(a3)  # new: verbose status
    calls.before[("PodSandboxStatus", pod_d)] = lambda: node.remove_pod(pod_d)
    live = await cache.read()
    assert not calls.before
    assert [pod.sandbox_id for pod in live.pods] == [pod_a] and container_ids(live) == {a2}
    assert canonical(live) == await full_load(full) and live.unreadable == 0
    assert len(cache) == 2  # pod a and a2
    calls.take()
    assert canonical(await cache.read()) == canonical(live)
    assert status_calls(calls.take()) == {("ContainerStatus", a2, False)}


@pytest.mark.e2e
async def test_partial_entries_are_loaded_in_full_again(
    node: Node, loaders: tuple[RuntimeLoader, RuntimeLoader]
) -> None:
    full, calls, cache = watched(loaders)
    pod_a = node.run_pod("a")
    a1 = node.add_container(pod_a, "a1")
    complete = await cache.read()
    pod_b = node.run_pod("b")
    calls.take()
    # The status calls fail while the runtime answers: list data only, as a full load would show.
    calls.fail[("ContainerStatus", a1)] = rpc_error(grpc.StatusCode.INTERNAL, "boom")
    calls.fail[("PodSandboxStatus", pod_b)] = rpc_error(grpc.StatusCode.INTERNAL, "boom")
    partial = await cache.read()
    [listed] = (await cache.loader.list_containers(pb.ListContainersRequest(filter=pb.ContainerFilter(id=a1)))).items
    assert partial.containers[pod_a] == (container_info(container_from_list_item(listed)),)
    [pod_b_partial] = [pod for pod in partial.pods if pod.sandbox_id == pod_b]
    assert pod_b_partial.cgroup_parent == "" and pod_b_partial.resources is None
    assert len(cache) == 1  # pod a only
    calls.take()
    again = await cache.read()
    assert canonical(again) == await full_load(full)
    assert again.containers == complete.containers
    assert status_calls(calls.take()) == {("ContainerStatus", a1, True), ("PodSandboxStatus", pod_b, True)}


@pytest.mark.e2e
async def test_a_runtime_that_fails_or_restarts_leaves_nothing_stale(
    node: Node, loaders: tuple[RuntimeLoader, RuntimeLoader]
) -> None:
    full, calls, cache = watched(loaders)
    pod_a = node.run_pod("a")
    a1 = node.add_container(pod_a, "a1")
    before = await cache.read()
    calls.fail[("ListPodSandbox", "")] = rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")
    with pytest.raises(grpc.aio.AioRpcError):
        await cache.read()
    assert len(cache) == 0
    calls.take()
    assert canonical(await cache.read()) == canonical(before)
    assert status_calls(calls.take()) == {("PodSandboxStatus", pod_a, True), ("ContainerStatus", a1, True)}

    node.bed.stop_daemon()  # a real restart: the round fails, the next one loads everything again
    with pytest.raises(Exception):  # noqa: B017 -- whatever the lost connection raises
        await cache.read()
    assert len(cache) == 0
    node.bed.start()
    calls.take()
    async with asyncio.timeout(30):
        while True:
            try:
                after = await cache.read()
                break
            except Exception:
                await asyncio.sleep(0.2)
    assert canonical(after) == canonical(before) == await full_load(full)
    assert {("PodSandboxStatus", pod_a, True), ("ContainerStatus", a1, True)} <= status_calls(calls.take())


# --- the cheap path against the full one, property-based ----------------------------------------------


class OneContainer:
    """A runtime with one READY pod and one RUNNING container whose reported resources (the
    OCI spec's, which updates change) the test sets; its verbose info holds the create-time
    config, or none (``has_config`` False: the entry is partial)."""

    def __init__(self, configured: pb.LinuxContainerResources | None, has_config: bool) -> None:
        self.config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="app", attempt=1),
            envs=[pb.KeyValue(key="A", value=b"x=y")],
            annotations={"k": "v"},
        )
        if configured is not None:
            self.config.linux.resources.CopyFrom(configured)
        self.has_config = has_config
        self.reported: pb.LinuxContainerResources | None = None
        self.verbose: list[bool] = []

    async def ListPodSandbox(self, request: Any, timeout: float) -> pb.ListPodSandboxResponse:
        meta = pb.PodSandboxMetadata(name="p", uid="u", namespace="n")
        return pb.ListPodSandboxResponse(items=[pb.PodSandbox(id="s1", metadata=meta, state=pb.SANDBOX_READY)])

    async def ListContainers(self, request: Any, timeout: float) -> pb.ListContainersResponse:
        item = pb.Container(id="c1", pod_sandbox_id="s1", metadata=self.config.metadata, state=pb.CONTAINER_RUNNING)
        return pb.ListContainersResponse(containers=[item])

    async def PodSandboxStatus(self, request: Any, timeout: float) -> pb.PodSandboxStatusResponse:
        config = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", uid="u", namespace="n"))
        status = pb.PodSandboxStatus(id="s1", metadata=config.metadata, state=pb.SANDBOX_READY)
        return pb.PodSandboxStatusResponse(status=status, info={"info": json.dumps({"config": go_json(config)})})

    async def ContainerStatus(self, request: Any, timeout: float) -> pb.ContainerStatusResponse:
        self.verbose.append(request.verbose)
        status = pb.ContainerStatus(id="c1", metadata=self.config.metadata, state=pb.CONTAINER_RUNNING)
        if self.reported is not None:
            status.resources.linux.CopyFrom(self.reported)
        if not request.verbose:
            return pb.ContainerStatusResponse(status=status)
        doc: dict[str, Any] = {"sandboxID": "s1"}
        if self.has_config:
            doc["config"] = go_json(self.config)
        return pb.ContainerStatusResponse(status=status, info={"info": json.dumps(doc)})


_values = st.sampled_from([0, 1, 5, 1 << 27])  # few values: equal limits (containerd's derived swap) happen
resources = st.builds(
    pb.LinuxContainerResources,
    cpu_period=_values,
    cpu_quota=_values,
    cpu_shares=_values,
    memory_limit_in_bytes=_values,
    memory_swap_limit_in_bytes=_values,
    oom_score_adj=st.sampled_from([0, -998, 1000]),
    cpuset_cpus=st.sampled_from(["", "0", "0-1"]),
    unified=st.dictionaries(st.sampled_from(["memory.high", "cpu.idle"]), st.sampled_from(["1", "2"]), max_size=2),
    hugepage_limits=st.lists(st.builds(pb.HugepageLimit, page_size=st.just("2MB"), limit=_values), max_size=1),
)


@settings(max_examples=150, deadline=None)
@given(
    configured=st.none() | resources,
    has_config=st.booleans(),
    rounds=st.lists(st.none() | resources, min_size=1, max_size=4),
)
def test_cheap_rounds_give_what_full_loads_give(
    configured: pb.LinuxContainerResources | None, has_config: bool, rounds: list[pb.LinuxContainerResources | None]
) -> None:
    runtime = OneContainer(configured, has_config)
    cheap, full = RuntimeLoader("unix:///nonexistent.sock"), RuntimeLoader("unix:///nonexistent.sock")
    cheap._stub = full._stub = runtime  # no channel is opened
    cache = LivePodCache(cheap)

    async def play() -> None:
        for index, reported in enumerate(rounds):
            runtime.reported = reported
            runtime.verbose.clear()
            live = await cache.read()
            # Known and complete: a plain status; new or partial: a verbose one.
            assert runtime.verbose == [index == 0 or not has_config]
            assert live == await list_live_pods(full)

    asyncio.run(play())
