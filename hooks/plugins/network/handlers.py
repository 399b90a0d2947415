"""The ``network`` plugin and its handlers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ... import policy as policy_mod
from ...cgroups import CgroupFS
from ...qos import QoSClass
from ...sdk import HookPoint, Plugin, PodInfo
from .config import NETWORK_BANDS, NetworkBandSettings, NetworkSection, check_rates, network_config
from .plan import explain
from .state import NetworkQoS

plugin = Plugin(
    "network",
    version="1.0",
    order=60,
    failure_policy="ignore",
    timeout=5.0,
    description="Egress bandwidth bands (SYSTEM/LS/BE) with HTB; pods classified by net_cls classid and address",
    settings=NetworkBandSettings,
    section=NetworkSection,
    class_entry={qos.value: band.value for qos, band in NETWORK_BANDS.items()},
    defaults=policy_mod.builtin_defaults("network"),
    check=check_rates,
    state=NetworkQoS,
)
BandsFor = Callable[[QoSClass], NetworkBandSettings]


# In a dry run (``runtime-hooks explain``) nothing goes through netlink: on_start describes the
# tree, hook calls write classids through the recording ``cgroups`` handle only.


@plugin.on_start
def _start(
    *,
    server: Any,
    section: NetworkSection,
    settings_for: BandsFor,
    state: NetworkQoS,
    log: Any,
    dry_run: bool = False,
    **kwargs: Any,
) -> None:
    config = network_config(section, settings_for)
    if dry_run:
        info = explain(config)
        log.info(
            "network: tree the policy asks for (dry run)", **{k: info[k] for k in ("enabled", "interface", "root")}
        )
        return
    netns = server.settings.get("network_netns") if server is not None else None
    state.start(config, log, netns=netns or None)


@plugin.on_stop
def _stop(*, state: NetworkQoS, log: Any, **kwargs: Any) -> None:
    if state.shaper is not None:
        log.info("leaving the network QoS tree in place", interface=state.shaper.interface)


# The hook handlers run only while there is traffic to shape (``_shaping``): with shaping off (no
# interface in the policy, the common case) the runner does not call them at all, so a hook call
# costs this plugin no coroutine and no task. When called, the netlink work runs on a thread
# (pyroute2's sync API cannot run inside the server's event loop).


def _shaping(*, section: NetworkSection, state: NetworkQoS, dry_run: bool = False, **kwargs: Any) -> bool:
    """Whether the hook handlers have anything to do: this node shapes traffic or, in a rehearsal
    (where on_start sets nothing up), the policy names an interface to shape."""
    return bool(section.interface) if dry_run else state.shaper is not None


@plugin.on(HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER, when=_shaping)
async def _classify(
    *,
    pod: PodInfo,
    qos: QoSClass,
    state: NetworkQoS,
    cgroups: CgroupFS | None,
    log: Any,
    dry_run: bool = False,
    **kwargs: Any,
) -> None:
    if dry_run:
        NetworkQoS.rehearse(pod, qos, cgroups, log)
    else:
        await asyncio.to_thread(state.classify, pod, qos, cgroups, log)


@plugin.on(HookPoint.POST_STOP_POD_SANDBOX, when=_shaping)
async def _forget(*, pod: PodInfo, state: NetworkQoS, log: Any, dry_run: bool = False, **kwargs: Any) -> None:
    if not dry_run:
        await asyncio.to_thread(state.forget, pod, log)


@plugin.reconcile
def _reconcile(
    *,
    pods: Sequence[PodInfo],
    section: NetworkSection,
    settings_for: BandsFor,
    state: NetworkQoS,
    cgroups: CgroupFS | None,
    log: Any,
    dry_run: bool = False,
    **kwargs: Any,
) -> int:
    """The number of drifted things set back (tree parts, classid files, address filters)."""
    if dry_run:
        return 0
    return sum(state.reconcile(pods, network_config(section, settings_for), cgroups, log).values())
