"""NRI's pods as the plugins' PodInfo, converted once per pod while the runtime describes it alike.

The runtime sends the whole pod with every event of it (RunPodSandbox, CreateContainer,
PostStartContainer...). :class:`PodInfos` remembers the PodInfo made of a pod's message by pod
id, with a copy of the message, and gives it again while the pod's message is equal to that copy
(protobuf equality: the same fields with the same values, maps compared as maps); a pod whose
message differs in anything is converted anew and replaces it. PodInfo is frozen, so one can
serve every event of the pod. At most ``limit`` pods are remembered, the least recently used
forgotten first: a node runs a few hundred pods at most, and a forgotten pod is only converted
again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb

from ..views import PodInfo
from .mapping import pod_from_nri

__all__ = ["DEFAULT_LIMIT", "PodInfos"]

DEFAULT_LIMIT: Final = 1024


class PodInfos:
    """PodInfo of NRI PodSandbox messages, remembered per pod id; see the module doc."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"PodInfos limit {limit} is not positive")
        self.limit = limit
        self._known: OrderedDict[str, tuple[Any, PodInfo]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._known)

    def of(self, pod: Any) -> PodInfo:
        """The PodInfo of ``pod`` (an NRI PodSandbox)."""
        known = self._known.get(pod.id)
        if known is not None and known[0] == pod:
            self._known.move_to_end(pod.id)
            return known[1]
        info = pod_from_nri(pod)
        copy = nri_pb.PodSandbox()
        copy.CopyFrom(pod)  # not the request's own sub-message, which holds the whole request
        self._known[pod.id] = (copy, info)
        self._known.move_to_end(pod.id)
        if len(self._known) > self.limit:
            self._known.popitem(last=False)
        return info

    def forget(self, pod_id: str) -> None:
        """Forget pod ``pod_id`` (it is gone)."""
        self._known.pop(pod_id, None)
