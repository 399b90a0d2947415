"""Builds the hook layer of a running proxy and owns its background parts."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from runtimeproxy.dispatch.dispatcher import Dispatcher, HookMetrics
from runtimeproxy.dispatch.interceptor import DEFAULT_SKIP_LABEL, HookInterceptor
from runtimeproxy.dispatch.registry import HookRegistry
from runtimeproxy.dispatch.store import PodStore, RuntimeLoader, StoreRebuilder

DEFAULT_CGROUP_ROOTS = ("/kubepods", "kubepods.slice")


@dataclass(frozen=True)
class HookSettings:
    config_dir: str
    runtime_backend: str  # socket path the store is rebuilt from
    skip_label: str = DEFAULT_SKIP_LABEL
    skip_value: str = "true"
    cgroup_roots: tuple[str, ...] = DEFAULT_CGROUP_ROOTS
    poll_interval: float = 0.2


class HookLayer:
    """Registry watcher, store rebuilder, dispatcher and the interceptor the relay calls."""

    def __init__(self, settings: HookSettings, metrics_registry: CollectorRegistry | None = None) -> None:
        self.registry = HookRegistry(settings.config_dir, poll_interval=settings.poll_interval)
        self.store = PodStore()
        self.loader = RuntimeLoader(settings.runtime_backend)
        self.rebuilder = StoreRebuilder(self.store, self.loader)
        self.dispatcher = Dispatcher(self.registry, HookMetrics(metrics_registry))
        self.interceptor = HookInterceptor(
            self.dispatcher,
            self.store,
            self.rebuilder,
            skip_label=settings.skip_label,
            skip_value=settings.skip_value,
            cgroup_roots=settings.cgroup_roots,
        )

    async def start(self) -> None:
        await self.registry.start()
        self.rebuilder.start()

    async def stop(self) -> None:
        await self.registry.stop()
        await self.rebuilder.stop()
        await self.dispatcher.close()
        await self.loader.close()
