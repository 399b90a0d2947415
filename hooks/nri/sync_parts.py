"""Synchronize in parts: NRI 0.7+ splits a runtime state too large for one message.

When the pods and containers do not fit in one ttrpc message, the runtime sends them in
several SynchronizeRequests, each but the last with ``more`` set; the plugin answers those
with ``more`` set and no update (any other answer makes the runtime drop the plugin: "plugin
does not handle split sync requests", nri pkg/adaptation/plugin.go) and the last one with its
updates for the whole state. A runtime on NRI 0.6 always sends one request without ``more``.

:class:`SyncParts` collects the parts; a new connection starts with none (:meth:`reset`, at
Configure), so the parts of a connection that ended midway are never mixed into the next one's.
"""

from __future__ import annotations

from typing import Any

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb

__all__ = ["MAX_HELD", "SyncParts", "SyncTooLarge"]

#: Pods and containers held across parts at most: far above any node (kubelet's default is 110
#: pods), low enough that a runtime sending parts without end cannot grow the plugin's memory.
MAX_HELD = 100_000


class SyncTooLarge(ValueError):
    """A split Synchronize went past :data:`MAX_HELD`; its parts are dropped."""


class SyncParts:
    """The parts of one split Synchronize received so far."""

    def __init__(self) -> None:
        self._pods: list[Any] = []
        self._containers: list[Any] = []

    def __len__(self) -> int:
        """Pods and containers held from earlier parts."""
        return len(self._pods) + len(self._containers)

    def reset(self) -> None:
        self._pods.clear()
        self._containers.clear()

    def add(self, request: Any) -> Any | None:
        """Take one SynchronizeRequest: None while more parts follow, else the whole state as one
        SynchronizeRequest (``request`` itself when it came in one part)."""
        if request.more:
            if len(self) + len(request.pods) + len(request.containers) > MAX_HELD:
                self.reset()
                raise SyncTooLarge(f"split Synchronize holds over {MAX_HELD} pods and containers: refused")
            self._pods.extend(request.pods)
            self._containers.extend(request.containers)
            return None
        if not self:
            return request
        whole = nri_pb.SynchronizeRequest(pods=self._pods, containers=self._containers)
        whole.pods.extend(request.pods)
        whole.containers.extend(request.containers)
        self.reset()
        return whole
