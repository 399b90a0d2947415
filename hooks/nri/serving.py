"""What ``runtime-hooks serve --nri-socket`` starts beside (or instead of) the proxy's hook server."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import structlog
from prometheus_client import CollectorRegistry

from ..container_repair import ContainerRepair
from ..plugin_runner import PluginRunner
from ..views import ContainerInfo, PodInfo
from .nri_metrics import NriMetrics
from .plugin import NriPlugin, NriSettings
from .service import NriHooks

__all__ = ["StartingState", "start_nri"]

log = structlog.get_logger("runtimeproxy.hooks.nri")


class StartingState:
    """Synchronize's pods as the reconciler's starting state: each Synchronize (at every
    registration) runs one reconcile round over the pods and containers the runtime reported,
    so values drifted while we were not connected are set back at once, not at the next interval."""

    def __init__(self, runner: PluginRunner) -> None:
        self.runner = runner
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, pods: Sequence[PodInfo], containers: Mapping[str, Sequence[ContainerInfo]]) -> None:
        if not any(plugin.reconcile_handler is not None for plugin in self.runner.plugins):
            return
        task = asyncio.get_running_loop().create_task(self._round(pods, containers))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _round(self, pods: Sequence[PodInfo], containers: Mapping[str, Sequence[ContainerInfo]]) -> None:
        try:
            report = await self.runner.reconcile_report(pods=pods, containers=containers)
        except Exception:  # a bug in a round must not go unseen
            log.exception("reconcile round over NRI's pods failed")
            return
        repaired = {name: count for name, count in report.repaired.items() if count}
        log.info("reconciled NRI's pods", pods=len(pods), repaired=repaired, failed=[f.plugin for f in report.failures])

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()


async def start_nri(
    runner: PluginRunner, settings: NriSettings, registry: CollectorRegistry | None, repair: ContainerRepair
) -> NriPlugin:
    """The NRI plugin for ``runner``, registered and synchronized (raises with the reason otherwise);
    its Synchronize answers repair containers with ``repair`` (hooks/nri/repair.py)."""
    hooks = NriHooks(runner, NriMetrics(registry), on_synchronize=StartingState(runner), repair=repair)
    plugin = NriPlugin(hooks, settings)
    await plugin.start()
    return plugin
