"""Container repair in NRI mode (hooks/container_repair.py): the Synchronize answer, and the runtime's CRI in a round.

**At Synchronize** (each registration) the runtime lists its pods and containers, each container
with the resources of its OCI spec. Every created or running one is run through the plugins
(PreUpdateContainerResources) and compared with that spec and with its cgroup; the answer
carries a ContainerUpdate for each that differs (``SynchronizeResponse.update``). containerd 1.7
applies them before the plugin gets its first event: it updates the spec and, for a running
container, has runc write the new values. So a container created while runtime-hooks was not
registered (a runtime restart, a lost connection, a missed deadline) gets the plugins' values
once it is back. The check keeps within the request's deadline as events do
(hooks/nri/service.py); containers it did not reach by then are left to the reconciler, and the
log says how many.

**In a reconcile round** (:class:`CriUpdates`) a container whose cgroup differs is updated with
the runtime's CRI UpdateContainerResources, on the endpoint the reconciler lists pods from, with
the plugins' values of the fields that differ. The runtime takes it as it takes kubelet's resize:
its NRI UpdateContainer event runs our hooks (which answer the same values), then it updates the
spec and has runc write the cgroup. NRI's own Runtime.UpdateContainers is not used: up to NRI
0.12.0 (containerd 1.7 has 0.6.1) the runtime takes its two NRI locks in the opposite order for
it than for lifecycle events, and a plugin's update arriving beside a pod start deadlocks
containerd's CRI service (https://github.com/containerd/containerd/issues/13733; NRI 0.12.1
fixed it). The CRI status a round lists is not the record here: containerd 1.7 keeps a
container's resources there as kubelet asked for them, before NRI's adjustment, so rounds
compare cgroups only and count what they repair as drifted. A round right after a Synchronize
answer with updates first gives them time to land (:class:`SynchronizeUpdates`), then compares
again, so that no container is updated twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import structlog

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb
from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.common.endpoints import socket_path
from runtimeproxy.common.message_size import DEFAULT_MAX_MESSAGE_SIZE
from runtimeproxy.hookapi import resource_fields

from ..container_repair import ContainerRepair, RepairDeferred, RepairFailed, RepairPlan
from ..drift import seen_in_record
from ..pacing import paced
from ..views import ContainerInfo, PodInfo
from .mapping import NotApplied, container_update, resources_to_nri

if TYPE_CHECKING:  # the CRI client is imported by CriUpdates: NRI's registration does not wait for it
    from runtimeproxy.wire.grpc_client import H2Channel

__all__ = ["LIVE_STATES", "MODE", "CriUpdates", "SynchronizeUpdates", "synchronize_updates", "update_of"]

log = structlog.get_logger("runtimeproxy.hooks.nri")

MODE: Final = "nri"
#: Containers that have (or are about to have) a cgroup: the ones an update reaches.
LIVE_STATES: Final = frozenset({nri_pb.CONTAINER_CREATED, nri_pb.CONTAINER_RUNNING})
#: How long the runtime may take to apply a Synchronize answer's updates (runc writes each).
LANDING_SECONDS: Final = 1.0
LANDING_SECONDS_PER_UPDATE: Final = 0.1
LANDING_MAX_SECONDS: Final = 10.0
_UPDATE_METHOD: Final = "/runtime.v1.RuntimeService/UpdateContainerResources"


def update_of(plan: RepairPlan) -> Any:
    """The NRI ContainerUpdate that sets ``plan``'s values."""
    resources = resources_to_nri(plan.changes, NotApplied())
    assert resources is not None  # a plan sets at least one field
    return container_update(plan.container.id, resources)


class SynchronizeUpdates:
    """When the last Synchronize answer asked for updates: until they have had time to land
    (LANDING_SECONDS, and LANDING_SECONDS_PER_UPDATE for each, at most LANDING_MAX_SECONDS), a
    reconcile round waits before it compares."""

    def __init__(self) -> None:
        self._until = 0.0  # time.monotonic()

    def answered(self, updates: int) -> None:
        if updates:
            landing = min(LANDING_SECONDS + LANDING_SECONDS_PER_UPDATE * updates, LANDING_MAX_SECONDS)
            self._until = time.monotonic() + landing

    def landing(self) -> float:
        """Seconds until the last answer's updates should have landed (0: they have)."""
        return max(0.0, self._until - time.monotonic())


async def synchronize_updates(
    repair: ContainerRepair,
    live: Sequence[tuple[PodInfo, ContainerInfo]],
    deadline: float,
    answered: SynchronizeUpdates | None = None,
) -> list[Any]:
    """The Synchronize answer's updates for the ``live`` (pod, container) pairs, found before
    ``deadline`` (the loop's clock); each is logged and counted as a repair, and noted in ``answered``."""
    if not repair.enabled or not live:
        return []
    updates: list[Any] = []
    checked = 0
    try:
        async with asyncio.timeout_at(deadline):
            async for pod, container in paced(live):
                wanted = await repair.wanted(pod, container)
                checked += 1
                if wanted is None:
                    continue
                record = seen_in_record(container.resources)
                plan = repair.compare(pod, container, wanted, record=record, repair_record=True)
                if plan is not None:
                    updates.append(update_of(plan))
                    repair.repaired(plan, MODE, "Synchronize answer")
    except TimeoutError:
        log.warning(
            "NRI's deadline came before every container was checked at Synchronize; the reconciler checks the rest",
            checked=checked,
            left=len(live) - checked,
        )
    if answered is not None:
        answered.answered(len(updates))
    return updates


class CriUpdates:
    """Container repair in a reconcile round of NRI mode, by the runtime's CRI UpdateContainerResources
    at ``endpoint``; see the module doc."""

    mode = MODE
    how = "UpdateContainerResources"
    record_known = False  # containerd 1.7's CRI status holds kubelet's values, not NRI's adjusted ones

    def __init__(self, endpoint: str, synchronized: SynchronizeUpdates, *, timeout: float = 10.0) -> None:
        self.synchronized = synchronized
        self.timeout = timeout
        from runtimeproxy.wire.grpc_client import H2Channel

        self._channel: H2Channel = H2Channel(socket_path(endpoint), max_message_size=DEFAULT_MAX_MESSAGE_SIZE)

    async def settle(self) -> None:
        await asyncio.sleep(self.synchronized.landing())

    async def apply(self, plan: RepairPlan) -> None:
        from runtimeproxy.runtime_state import RUNTIME_DOWN, describe_error
        from runtimeproxy.wire.grpc_client import RpcError

        linux = resource_fields.fill(pb.LinuxContainerResources(), plan.changes)
        request = pb.UpdateContainerResourcesRequest(container_id=plan.container.id, linux=linux)
        try:
            await self._channel.unary(_UPDATE_METHOD, request.SerializeToString(), self.timeout)
        except RpcError as exc:
            if exc.code() in RUNTIME_DOWN:
                raise RepairDeferred(f"the runtime is not answering: {describe_error(exc)}") from None
            raise RepairFailed(f"UpdateContainerResources: {describe_error(exc)}") from None

    async def close(self) -> None:
        await self._channel.close()
