"""The Kubernetes QoS class of a pod (``pod.status.qosClass``), as kubelet computes it.

``pkg/apis/core/v1/helper/qos/qos.go`` (ComputePodQOS), with the API server's defaulting of
requests to limits applied first. Not the same thing as Koordinator's QoS classes
(``runtimeproxy.hooks.qos.QoSClass``: LSR, LS, BE...), which a pod states in a label.
"""

from __future__ import annotations

import enum
from decimal import Decimal
from typing import Any

from runtimeproxy.kubelet_model.pod_resources import (
    QOS_RESOURCES,
    ResourceList,
    pod_containers,
    pod_init_containers,
    pod_level_requirements,
    requirements,
)

__all__ = ["KubeQoSClass", "pod_qos_class"]


class KubeQoSClass(enum.StrEnum):
    """Pod QoS classes, spelled as in ``pod.status.qosClass``."""

    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BEST_EFFORT = "BestEffort"


def _resource_qos(requests: ResourceList, limits: ResourceList) -> KubeQoSClass:
    if not requests and not limits:
        return KubeQoSClass.BEST_EFFORT
    result: KubeQoSClass | None = None
    for name in QOS_RESOURCES:
        request = requests.get(name, Decimal(0))
        limit = limits.get(name, Decimal(0))
        if request != limit:
            return KubeQoSClass.BURSTABLE
        best_effort = request == 0
        this = KubeQoSClass.BEST_EFFORT if best_effort else KubeQoSClass.GUARANTEED
        if result is None:
            result = this
        elif result != this:
            return KubeQoSClass.BURSTABLE
    assert result is not None
    return result


def pod_qos_class(pod: Any) -> KubeQoSClass:
    """The Pod's QoS class.

    BestEffort: no container (init or regular) sets a cpu or memory request
    or limit.  Guaranteed: every container sets cpu and memory limits and the
    requests equal them (a request left out defaults to its limit).
    Burstable: anything else.  Pod-level ``spec.resources``, when present,
    decides on its own.
    """
    level = pod_level_requirements(pod)
    if level is not None:
        return _resource_qos(*level)
    result: KubeQoSClass | None = None
    for container in pod_init_containers(pod) + pod_containers(pod):
        qos = _resource_qos(*requirements(container.resources))
        if qos is KubeQoSClass.BURSTABLE:
            return qos
        if result is None:
            result = qos
        elif result != qos:
            return KubeQoSClass.BURSTABLE
    return result or KubeQoSClass.BEST_EFFORT
