"""Builds the hook layer of a running proxy and owns its background parts."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from runtimeproxy.common.message_size import DEFAULT_MAX_MESSAGE_SIZE
from runtimeproxy.dispatch.dispatcher import Dispatcher, HookMetrics
from runtimeproxy.dispatch.hook_interceptor import DEFAULT_SKIP_LABEL, HookInterceptor
from runtimeproxy.dispatch.registry import HookRegistry
from runtimeproxy.dispatch.store import PodStore, StoreMetrics, StoreRebuilder
from runtimeproxy.hookapi.cri_mapping import OutputRules
from runtimeproxy.hookapi.defaults import DEFAULT_CGROUP_ROOTS, DEFAULT_POLL_INTERVAL
from runtimeproxy.hookapi.merge_rules import CgroupDriver
from runtimeproxy.runtime_state import RuntimeLoader


@dataclass(frozen=True)
class HookSettings:
    config_dir: str
    runtime_backend: str  # socket path the store is rebuilt from
    skip_label: str = DEFAULT_SKIP_LABEL
    skip_value: str = "true"
    cgroup_roots: tuple[str, ...] = DEFAULT_CGROUP_ROOTS
    cgroup_driver: CgroupDriver = "auto"  # auto: the form kubelet used for each pod (hookapi/merge_rules.py)
    poll_interval: float = DEFAULT_POLL_INTERVAL
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE  # the relay's, for hook calls too


class HookLayer:
    """Registry watcher, store rebuilder, dispatcher and the interceptor the relay calls."""

    def __init__(self, settings: HookSettings, metrics_registry: CollectorRegistry | None = None) -> None:
        self.registry = HookRegistry(settings.config_dir, poll_interval=settings.poll_interval)
        self.store = PodStore()
        store_metrics = StoreMetrics(metrics_registry)
        self.loader = RuntimeLoader(settings.runtime_backend, on_unreadable=store_metrics.count_unreadable)
        self.rebuilder = StoreRebuilder(self.store, self.loader)
        self.dispatcher = Dispatcher(self.registry, HookMetrics(metrics_registry), settings.max_message_size)
        self.interceptor = HookInterceptor(
            self.dispatcher,
            self.store,
            self.rebuilder,
            skip_label=settings.skip_label,
            skip_value=settings.skip_value,
            output_rules=OutputRules(settings.cgroup_roots, settings.cgroup_driver),
        )

    async def start(self) -> None:
        await self.registry.start()
        self.rebuilder.start()

    async def stop(self) -> None:
        await self.registry.stop()
        await self.rebuilder.stop()
        await self.dispatcher.close()
        await self.loader.close()
