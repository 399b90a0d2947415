"""A plugin's hook server for wire-level tests: :func:`hook_server` serves the plugins over gRPC
on a unix socket of its own, as ``runtime-hooks serve`` does, without registering with a proxy."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimeproxy.hookapi.hookpoints import HookPoint

from ..definition import Plugin
from ..server import RuntimeHooksServer, ServerSettings
from .builders import plugin_runner

__all__ = ["ServedHooks", "hook_server"]


@dataclass(frozen=True)
class ServedHooks:
    """A running hook server: where it listens, what it would register, and a way to call it."""

    server: RuntimeHooksServer

    @property
    def endpoint(self) -> str:
        """The unix socket path the server listens on."""
        return self.server.endpoint

    @property
    def hook_points(self) -> frozenset[HookPoint]:
        """The hook points it registers with the proxy: those its plugins handle."""
        return self.server.hook_points

    async def call(self, rpc: str, request: Any, timeout: float = 5.0) -> Any:
        """The reply to ``request`` at method ``rpc`` of the hook service (``"PreCreateContainerHook"``),
        over gRPC as the proxy calls it."""
        import grpc.aio  # only a wire-level test needs the gRPC client

        from runtimeproxy.api.runtime.v1alpha1 import api_pb2_grpc as hook_grpc

        async with grpc.aio.insecure_channel(f"unix://{self.endpoint}") as channel:
            stubs: Any = hook_grpc  # generated without type hints
            return await getattr(stubs.RuntimeHookServiceStub(channel), rpc)(request, timeout=timeout)


@contextlib.asynccontextmanager
async def hook_server(plugin: Plugin | Iterable[Plugin]) -> AsyncIterator[ServedHooks]:
    """The hook server running ``plugin`` (or several plugins) with the default policy, as
    :class:`ServedHooks`. Stopped, and its socket removed, on leaving."""
    directory = Path(tempfile.mkdtemp(prefix="rtpx-hooks-", dir="/tmp"))  # unix socket paths are short
    settings = ServerSettings(endpoint=str(directory / "hooks.sock"), hook_config_dir=None, stop_grace=0)
    try:
        async with plugin_runner(plugin) as runner:
            server = RuntimeHooksServer(runner, settings)
            await server.start()
            try:
                yield ServedHooks(server)
            finally:
                await server.stop(0)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
