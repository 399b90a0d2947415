"""Which hook points run in which mode: through the proxy, or at which NRI event.

Through the proxy every hook point runs around its CRI call. Over NRI (containerd/nri 0.6 to
0.8) the runtime reports events instead; each runs the hook points below, in order. Two hook
points have no NRI event and never run in NRI mode (:data:`NOT_IN_NRI` says why). NRI's
RemoveContainer has no hook point of ours and is not subscribed. On a runtime with NRI 0.6,
PreCreateContainer also subscribes PostStartContainer: the OOM score its answer may set is
written there (hooks/nri/oom.py); from NRI 0.7 on the CreateContainer adjustment carries it
(hooks/nri/runtime_features.py). NRI 0.7 and 0.8 add no event.

Notifications (:data:`DEFERRED`, "answer" none below) are answered at once and their hook points
run afterwards, in the pod's order (hooks/nri/ordering.py); containerd waits for the others.

====================  ================================================  ==================
NRI event             hook points                                       answer applied
====================  ================================================  ==================
RunPodSandbox         PreRunPodSandbox                                  none (notification)
StopPodSandbox        PostStopPodSandbox                                none
RemovePodSandbox      PreRemovePodSandbox, PostRemovePodSandbox         none
CreateContainer       PreCreateContainer                                ContainerAdjustment
PostCreateContainer   PostCreateContainer                               none
StartContainer        PreStartContainer                                 none
PostStartContainer    PostStartContainer                                none
UpdateContainer       PreUpdateContainerResources                       ContainerUpdate
PostUpdateContainer   PostUpdateContainerResources                      none
StopContainer         PostStopContainer (after the container stopped)   none
====================  ================================================  ==================
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb
from runtimeproxy.hookapi.hookpoints import HookPoint

__all__ = ["DEFERRED", "EVENT_NAMES", "EVENT_POINTS", "NOT_IN_NRI", "Mode", "event_mask", "events_for", "modes_of"]


class Mode(enum.StrEnum):
    PROXY = "proxy"
    NRI = "nri"


_E = nri_pb.Event
#: NRI event number -> the hook points it runs, in order.
EVENT_POINTS: Final[Mapping[int, tuple[HookPoint, ...]]] = MappingProxyType(
    {
        _E.RUN_POD_SANDBOX: (HookPoint.PRE_RUN_POD_SANDBOX,),
        _E.STOP_POD_SANDBOX: (HookPoint.POST_STOP_POD_SANDBOX,),
        _E.REMOVE_POD_SANDBOX: (HookPoint.PRE_REMOVE_POD_SANDBOX, HookPoint.POST_REMOVE_POD_SANDBOX),
        _E.CREATE_CONTAINER: (HookPoint.PRE_CREATE_CONTAINER,),
        _E.POST_CREATE_CONTAINER: (HookPoint.POST_CREATE_CONTAINER,),
        _E.START_CONTAINER: (HookPoint.PRE_START_CONTAINER,),
        _E.POST_START_CONTAINER: (HookPoint.POST_START_CONTAINER,),
        _E.UPDATE_CONTAINER: (HookPoint.PRE_UPDATE_CONTAINER_RESOURCES,),
        _E.POST_UPDATE_CONTAINER: (HookPoint.POST_UPDATE_CONTAINER_RESOURCES,),
        _E.STOP_CONTAINER: (HookPoint.POST_STOP_CONTAINER,),
    }
)

#: Events answered before their hook points run: containerd only logs an error answer to them
#: (containerd 1.7 pkg/cri: "NRI post-start notification failed" and the like) and applies
#: nothing of them, so nothing is lost by answering at once. RunPodSandbox and StartContainer
#: stay in line: a "fail" plugin failing there fails the CRI call, as through the proxy.
DEFERRED: Final = frozenset(
    {
        _E.STOP_POD_SANDBOX,
        _E.REMOVE_POD_SANDBOX,
        _E.POST_CREATE_CONTAINER,
        _E.POST_START_CONTAINER,
        _E.POST_UPDATE_CONTAINER,
        _E.STOP_CONTAINER,
    }
)

#: Events subscribed for a hook point beyond the one that runs it, and why.
_IMPLIED: Final[Mapping[HookPoint, tuple[int, ...]]] = MappingProxyType(
    {HookPoint.PRE_CREATE_CONTAINER: (_E.POST_START_CONTAINER,)}  # the OOM score (hooks/nri/oom.py)
)

#: NRI event number -> its name as NRI's docs and our logs and metrics write it.
EVENT_NAMES: Final[Mapping[int, str]] = MappingProxyType(
    {
        _E.RUN_POD_SANDBOX: "RunPodSandbox",
        _E.STOP_POD_SANDBOX: "StopPodSandbox",
        _E.REMOVE_POD_SANDBOX: "RemovePodSandbox",
        _E.CREATE_CONTAINER: "CreateContainer",
        _E.POST_CREATE_CONTAINER: "PostCreateContainer",
        _E.START_CONTAINER: "StartContainer",
        _E.POST_START_CONTAINER: "PostStartContainer",
        _E.UPDATE_CONTAINER: "UpdateContainer",
        _E.POST_UPDATE_CONTAINER: "PostUpdateContainer",
        _E.STOP_CONTAINER: "StopContainer",
        _E.REMOVE_CONTAINER: "RemoveContainer",
    }
)

#: Hook points no NRI event runs, and why.
NOT_IN_NRI: Final[Mapping[HookPoint, str]] = MappingProxyType(
    {
        HookPoint.PRE_UPDATE_POD_SANDBOX_RESOURCES: "NRI up to 0.8 (containerd 2.1) has no pod update event",
        HookPoint.PRE_STOP_CONTAINER: "NRI reports StopContainer after the container stopped (PostStopContainer)",
    }
)


def events_for(points: Iterable[HookPoint], *, oom_at_start: bool = True) -> list[int]:
    """The NRI events that run at least one of ``points`` or that they imply, in event order.
    ``oom_at_start``: the runtime's NRI cannot carry the OOM score at creation (NRI 0.6), so it
    is written at PostStartContainer."""
    wanted = set(points)
    implied = {event for point in wanted for event in _IMPLIED.get(point, ())} if oom_at_start else set()
    return [event for event, run in EVENT_POINTS.items() if wanted & set(run) or event in implied]


def event_mask(points: Iterable[HookPoint], *, oom_at_start: bool = True) -> int:
    """ConfigureResponse.events for ``points``: bit (event - 1) per event (nri api/event.go).
    Never 0 for no points, which NRI would read as "every event": then only RemoveContainer,
    which runs nothing. Every NRI up to 0.8 refuses a bit it does not know, and knows these."""
    mask = sum(1 << (event - 1) for event in events_for(points, oom_at_start=oom_at_start))
    return mask or 1 << (_E.REMOVE_CONTAINER - 1)


def modes_of(points: Iterable[HookPoint]) -> dict[str, list[str]]:
    """Per mode, which of ``points`` run (in hook point order), and those NRI never runs."""
    chosen = set(points)
    ordered = [point for point in HookPoint if point in chosen]
    return {
        Mode.PROXY.value: [point.value for point in ordered],
        Mode.NRI.value: [point.value for point in ordered if point not in NOT_IN_NRI],
        "not_in_nri": [point.value for point in ordered if point in NOT_IN_NRI],
    }


def mode_lines(plugins: Iterable[tuple[str, Iterable[HookPoint]]]) -> list[str]:
    """One line per (plugin name, its hook points): what it gets in NRI mode, for ``plugins``
    and ``explain`` (in proxy mode it gets all of them)."""
    lines = []
    for name, points in plugins:
        modes = modes_of(points)
        line = f"{name}: in NRI mode {', '.join(modes[Mode.NRI.value]) or 'no hook point'}"
        for missing in modes["not_in_nri"]:
            line += f"; never {missing} ({NOT_IN_NRI[HookPoint(missing)]})"
        lines.append(line)
    return lines
