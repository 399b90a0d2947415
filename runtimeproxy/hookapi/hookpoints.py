"""The hook points: which hook RPC runs before or after which CRI call.

Names are those of Koordinator's hook server registration files ("PreRunPodSandbox"),
plus our extensions. The RPC of a hook point is its name with "Hook" appended.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Stage(enum.StrEnum):
    PRE = "pre"
    POST = "post"


class HookKind(enum.StrEnum):
    """Which request/response pair a hook point uses."""

    POD = "pod"  # PodSandboxHookRequest / PodSandboxHookResponse
    CONTAINER = "container"  # ContainerResourceHookRequest / ContainerResourceHookResponse


class HookPoint(enum.StrEnum):
    PRE_RUN_POD_SANDBOX = "PreRunPodSandbox"
    POST_STOP_POD_SANDBOX = "PostStopPodSandbox"
    PRE_REMOVE_POD_SANDBOX = "PreRemovePodSandbox"
    POST_REMOVE_POD_SANDBOX = "PostRemovePodSandbox"
    PRE_UPDATE_POD_SANDBOX_RESOURCES = "PreUpdatePodSandboxResources"
    PRE_CREATE_CONTAINER = "PreCreateContainer"
    POST_CREATE_CONTAINER = "PostCreateContainer"
    PRE_START_CONTAINER = "PreStartContainer"
    POST_START_CONTAINER = "PostStartContainer"
    PRE_STOP_CONTAINER = "PreStopContainer"
    POST_STOP_CONTAINER = "PostStopContainer"
    PRE_UPDATE_CONTAINER_RESOURCES = "PreUpdateContainerResources"
    POST_UPDATE_CONTAINER_RESOURCES = "PostUpdateContainerResources"

    @property
    def rpc(self) -> str:
        return self.value + "Hook"

    @property
    def stage(self) -> Stage:
        return Stage.PRE if self.value.startswith("Pre") else Stage.POST

    @property
    def kind(self) -> HookKind:
        return _KINDS[self]  # asked on every hook call: worked out once, below


_KINDS = {
    point: HookKind.CONTAINER if point.value.endswith(("Container", "ContainerResources")) else HookKind.POD
    for point in HookPoint
}

# Names other tools write in registration files for the same hook point.
ALIASES: dict[str, HookPoint] = {"PreRemoveRunPodSandbox": HookPoint.PRE_REMOVE_POD_SANDBOX}


def parse_hook_point(name: str) -> HookPoint:
    """The hook point for a registration-file name; ValueError naming the valid ones."""
    if name in ALIASES:
        return ALIASES[name]
    try:
        return HookPoint(name)
    except ValueError:
        valid = ", ".join(point.value for point in HookPoint)
        raise ValueError(f"unknown runtime hook {name!r} (valid: {valid})") from None


@dataclass(frozen=True)
class CallHooks:
    pre: HookPoint | None
    post: HookPoint | None


# CRI RuntimeService method name -> the hook points around it.
HOOKS_BY_METHOD: dict[str, CallHooks] = {
    "RunPodSandbox": CallHooks(HookPoint.PRE_RUN_POD_SANDBOX, None),
    "StopPodSandbox": CallHooks(None, HookPoint.POST_STOP_POD_SANDBOX),
    "RemovePodSandbox": CallHooks(HookPoint.PRE_REMOVE_POD_SANDBOX, HookPoint.POST_REMOVE_POD_SANDBOX),
    "UpdatePodSandboxResources": CallHooks(HookPoint.PRE_UPDATE_POD_SANDBOX_RESOURCES, None),
    "CreateContainer": CallHooks(HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_CREATE_CONTAINER),
    "StartContainer": CallHooks(HookPoint.PRE_START_CONTAINER, HookPoint.POST_START_CONTAINER),
    "StopContainer": CallHooks(HookPoint.PRE_STOP_CONTAINER, HookPoint.POST_STOP_CONTAINER),
    "UpdateContainerResources": CallHooks(
        HookPoint.PRE_UPDATE_CONTAINER_RESOURCES, HookPoint.POST_UPDATE_CONTAINER_RESOURCES
    ),
}
