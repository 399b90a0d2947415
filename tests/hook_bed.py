"""The in-process proxy with a hook layer in front of the real containerd, for end-to-end
hook tests: `HookBed` (its config directory, programmable hook servers, CRI helpers) and the
`bed` fixture that starts one per test.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest
from hook_servers import TestHookServer
from prometheus_client import CollectorRegistry

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1 import api_pb2_grpc as cri_grpc
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.dispatch.layer import HookLayer, HookSettings
from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.proxy.server import ProxyServer, ProxySettings
from runtimeproxy.testbed import Containerd

T = TypeVar("T")
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
CALL_TIMEOUT = 30.0
# The registry polls every 0.2 s; a change must show within about 1 s, we allow 2.
CONFIG_LATENCY = 2.0


# -- helpers ---------------------------------------------------------------------------------


def as_hook(resources: cri.LinuxContainerResources) -> hook.LinuxContainerResources:
    return hook.LinuxContainerResources.FromString(resources.SerializeToString())


def env_pairs(request: Any) -> list[tuple[str, bytes]]:
    return [(kv.key, kv.value) for kv in request.container_env_list]


def cgroup_file(parent: str, object_id: str, name: str) -> str:
    return (CGROUP_CPU / parent.lstrip("/") / object_id / name).read_text().strip()


async def rpc_error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def eventually(check: Callable[[], Awaitable[T | None]], timeout: float = CONFIG_LATENCY) -> tuple[T, float]:
    """Run ``check`` until it returns non-None; that value and the seconds it took."""
    began = time.monotonic()
    while True:
        value = await check()
        elapsed = time.monotonic() - began
        if value is not None:
            return value, elapsed
        if elapsed > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.05)


class HookBed:
    """An in-process proxy with a hook layer, its config directory, hook servers and clients."""

    def __init__(self, containerd: Containerd) -> None:
        self.containerd = containerd
        self.workdir = tempfile.mkdtemp(prefix="rph-", dir="/tmp")
        self.config_dir = os.path.join(self.workdir, "hooks.d")
        os.mkdir(self.config_dir)
        self.journal: list[tuple[str, str]] = []
        self.servers: list[TestHookServer] = []
        self.metrics = CollectorRegistry()
        self.layer: HookLayer | None = None
        self.proxy: ProxyServer | None = None
        self.channels: list[grpc.aio.Channel] = []
        self.endpoint = os.path.join(self.workdir, "proxy.sock")
        direct = grpc.aio.insecure_channel(containerd.address)
        self.channels.append(direct)
        self.direct = cri_grpc.RuntimeServiceStub(direct)  # containerd itself, bypassing the proxy
        self.rs: Any = None

    @property
    def roots(self) -> tuple[str, ...]:
        return ("/" + self.containerd.cgroup_prefix,)

    async def start_proxy(self) -> None:
        settings = HookSettings(
            config_dir=self.config_dir, runtime_backend=str(self.containerd.socket), cgroup_roots=self.roots
        )
        self.layer = HookLayer(settings, metrics_registry=self.metrics)
        self.proxy = ProxyServer(
            ProxySettings(endpoint=self.endpoint, runtime_backend=str(self.containerd.socket)),
            interceptor=self.layer.interceptor,
        )
        await self.layer.start()
        await self.proxy.start()
        channel = grpc.aio.insecure_channel("unix://" + self.endpoint)
        self.channels.append(channel)
        self.rs = cri_grpc.RuntimeServiceStub(channel)

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()
        if self.proxy is not None:
            await self.proxy.shutdown(1)
        if self.layer is not None:
            await self.layer.stop()
        for server in self.servers:
            await server.stop()
        await asyncio.to_thread(self.containerd.remove_all_pods)
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- hook servers --

    async def server(self, name: str) -> TestHookServer:
        server = TestHookServer(name, os.path.join(self.workdir, f"{name}.sock"), self.journal)
        await server.start()
        self.servers.append(server)
        return server

    async def serve(self, name: str, point: HookPoint, behaviour: Any, **registration: Any) -> TestHookServer:
        """A hook server ``name`` answering ``point`` with ``behaviour`` (as `TestHookServer.set`
        takes it), registered with ``registration`` (policy, timeout...)."""
        server = await self.server(name)
        server.set(point, behaviour)
        await self.register(server, **registration)
        return server

    async def wait_registered(self, *names: str) -> None:
        """Wait until the proxy's registry holds exactly these registration files."""
        assert self.layer is not None
        layer = self.layer

        async def check() -> bool | None:
            return True if {s.name for s in layer.registry.servers()} == set(names) else None

        await eventually(check)

    async def register(self, server: TestHookServer, **kwargs: Any) -> None:
        server.register(self.config_dir, **kwargs)
        await self.wait_registered(*self.registered_names())

    def registered_names(self) -> list[str]:
        return [n for n in os.listdir(self.config_dir) if n.endswith(".json") and not n.startswith(".")]

    # -- CRI objects --

    def pod_config(
        self,
        name: str = "pod",
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        resources: cri.LinuxContainerResources | None = None,
        overhead: cri.LinuxContainerResources | None = None,
        qos: str = "burstable",
    ) -> cri.PodSandboxConfig:
        uid = str(uuid.uuid4())
        config = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=name, uid=uid, namespace="hooks", attempt=1),
            labels=labels or {"app": name},
            annotations=annotations or {},
            linux=cri.LinuxPodSandboxConfig(
                cgroup_parent=self.containerd.cgroup_parent(uid, qos),
                security_context=cri.LinuxSandboxSecurityContext(
                    namespace_options=cri.NamespaceOption(network=cri.NODE)
                ),
            ),
        )
        if resources is not None:
            config.linux.resources.CopyFrom(resources)
        if overhead is not None:
            config.linux.overhead.CopyFrom(overhead)
        return config

    def container_config(
        self,
        name: str = "c",
        *,
        envs: list[tuple[str, bytes]] | None = None,
        resources: cri.LinuxContainerResources | None = None,
        annotations: dict[str, str] | None = None,
    ) -> cri.ContainerConfig:
        return cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=name, attempt=1),
            image=cri.ImageSpec(image=self.containerd.test_image),
            labels={"container": name},
            annotations=annotations or {},
            envs=[cri.KeyValue(key=k, value=v) for k, v in (envs or [])],
            linux=cri.LinuxContainerConfig(
                resources=resources or cri.LinuxContainerResources(cpu_shares=512, cpu_period=100000)
            ),
        )

    async def run_pod(self, config: cri.PodSandboxConfig) -> str:
        reply = await self.rs.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=CALL_TIMEOUT)
        return str(reply.pod_sandbox_id)

    async def create(self, sandbox_id: str, pod: cri.PodSandboxConfig, config: cri.ContainerConfig) -> str:
        request = cri.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=pod)
        reply = await self.rs.CreateContainer(request, timeout=CALL_TIMEOUT)
        return str(reply.container_id)

    async def start(self, container_id: str) -> None:
        await self.rs.StartContainer(cri.StartContainerRequest(container_id=container_id), timeout=CALL_TIMEOUT)

    async def update(self, container_id: str, resources: cri.LinuxContainerResources) -> None:
        request = cri.UpdateContainerResourcesRequest(container_id=container_id, linux=resources)
        await self.rs.UpdateContainerResources(request, timeout=CALL_TIMEOUT)

    async def pod_with_container(self, **container: Any) -> tuple[cri.PodSandboxConfig, str, str]:
        pod = self.pod_config()
        sandbox_id = await self.run_pod(pod)
        container_id = await self.create(sandbox_id, pod, self.container_config(**container))
        await self.start(container_id)
        return pod, sandbox_id, container_id

    async def sandboxes_of(self, uid: str) -> list[str]:
        """IDs containerd itself lists for pod ``uid``."""
        reply = await self.direct.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=CALL_TIMEOUT)
        return [item.id for item in reply.items if item.metadata.uid == uid]

    async def containers_of(self, sandbox_id: str) -> list[str]:
        request = cri.ListContainersRequest(filter=cri.ContainerFilter(pod_sandbox_id=sandbox_id))
        reply = await self.direct.ListContainers(request, timeout=CALL_TIMEOUT)
        return [item.id for item in reply.containers]

    async def exec(self, container_id: str, *cmd: str) -> bytes:
        request = cri.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=10)
        reply = await self.rs.ExecSync(request, timeout=CALL_TIMEOUT)
        assert reply.exit_code == 0, reply.stderr
        return bytes(reply.stdout)

    def hook_calls(self, server: str, hook: str, outcome: str) -> float:
        labels = {"server": server, "hook": hook, "outcome": outcome}
        return self.metrics.get_sample_value("runtimeproxy_hook_calls_total", labels) or 0.0


@pytest.fixture
async def bed(containerd: Containerd) -> AsyncIterator[HookBed]:
    hook_bed = HookBed(containerd)
    try:
        await hook_bed.start_proxy()
        yield hook_bed
    finally:
        await hook_bed.close()
