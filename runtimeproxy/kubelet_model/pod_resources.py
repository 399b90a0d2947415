"""What a pod and its containers ask for: their requests and limits, as kubelet sums them.

Quantities are Decimals (parsed by :func:`runtimeproxy.kubelet_model.manifest.parse_quantity_value`);
requests default to limits as the API server's defaulting does
(``pkg/apis/core/v1/defaults.go``); pod-level sums follow
``staging/src/k8s.io/component-helpers/resource/helpers.go`` (PodRequests / PodLimits and
the restartable init container rules).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from runtimeproxy.kubelet_model.manifest import parse_quantity_value

__all__ = [
    "QOS_RESOURCES",
    "ResourceList",
    "aggregate",
    "container_limits",
    "container_requests",
    "int_value",
    "is_sidecar",
    "milli_value",
    "parse_resource_list",
    "pod_containers",
    "pod_init_containers",
    "pod_level_requirements",
    "pod_limits",
    "pod_requests",
    "requirements",
]

ResourceList = Mapping[str, Decimal]
#: The resources that decide the QoS class and that pod-level ``spec.resources`` may set.
QOS_RESOURCES = ("cpu", "memory")
_INT64_MAX = 2**63 - 1


def parse_resource_list(raw: Mapping[str, Any] | None) -> dict[str, Decimal]:
    """A manifest's ``requests`` or ``limits`` (name: quantity) with the quantities parsed."""
    return {name: parse_quantity_value(value) for name, value in (raw or {}).items()}


def requirements(resources: Any) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
    """(requests, limits) of a ``V1ResourceRequirements`` (or None).

    Requests default to limits for every resource that has a limit but no
    request, as the API server's defaulting does.
    """
    if resources is None:
        return {}, {}
    limits = parse_resource_list(resources.limits)
    requests = parse_resource_list(resources.requests)
    for name, limit in limits.items():
        requests.setdefault(name, limit)
    return requests, limits


def container_requests(container: Any) -> dict[str, Decimal]:
    """The container's requests after requests-default-to-limits."""
    return requirements(container.resources)[0]


def container_limits(container: Any) -> dict[str, Decimal]:
    """The container's limits."""
    return requirements(container.resources)[1]


def milli_value(quantity: Decimal | None) -> int:
    """resource.Quantity.MilliValue(): rounded up, 0 for a missing quantity."""
    if quantity is None:
        return 0
    return min(math.ceil(quantity * 1000), _INT64_MAX)


def int_value(quantity: Decimal | None) -> int:
    """resource.Quantity.Value(): rounded up, 0 for a missing quantity."""
    if quantity is None:
        return 0
    return min(math.ceil(quantity), _INT64_MAX)


def pod_init_containers(pod: Any) -> list[Any]:
    """The pod's init containers, sidecars (restartable ones) included."""
    return list(pod.spec.init_containers or [])


def pod_containers(pod: Any) -> list[Any]:
    """The pod's regular containers."""
    return list(pod.spec.containers or [])


def is_sidecar(container: Any) -> bool:
    """Whether an init container is a sidecar (``restartPolicy: Always``): it runs alongside the pod."""
    return getattr(container, "restart_policy", None) == "Always"


def _add(into: dict[str, Decimal], other: ResourceList) -> None:
    for name, quantity in other.items():
        into[name] = into.get(name, Decimal(0)) + quantity


def _max(into: dict[str, Decimal], other: ResourceList) -> None:
    for name, quantity in other.items():
        if name not in into or quantity > into[name]:
            into[name] = quantity


def aggregate(pod: Any, pick: Callable[[Any], dict[str, Decimal]]) -> dict[str, Decimal]:
    """Sum over regular containers, folded with the init container rules.

    Restartable init containers (sidecars) run alongside the regular
    containers, so they are added; each ordinary init container runs alone
    together with the sidecars started before it, so the pod needs the
    maximum of those.
    """
    total: dict[str, Decimal] = {}
    for container in pod_containers(pod):
        _add(total, pick(container))
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for container in pod_init_containers(pod):
        own = pick(container)
        if is_sidecar(container):
            _add(total, own)
            _add(sidecars, own)
            _max(init_peak, sidecars)
        else:
            running = dict(own)
            _add(running, sidecars)
            _max(init_peak, running)
    _max(total, init_peak)
    return total


def pod_level_requirements(pod: Any) -> tuple[dict[str, Decimal], dict[str, Decimal]] | None:
    """Pod-level (spec.resources) requests and limits, defaulted, if set."""
    resources = getattr(pod.spec, "resources", None)
    if resources is None:
        return None
    limits = parse_resource_list(resources.limits)
    requests = parse_resource_list(resources.requests)
    if limits:
        from_containers = aggregate(pod, container_requests)
        for name, limit in limits.items():
            # defaults.go: a missing pod-level request defaults to the sum of
            # the container requests if any container asks for it, else to
            # the pod-level limit.
            if name not in requests:
                requests[name] = from_containers.get(name, limit)
    return requests, limits


def pod_requests(pod: Any) -> dict[str, Decimal]:
    """PodRequests without overhead: pod-level requests win where set."""
    return _pod_total(pod, container_requests, 0)


def pod_limits(pod: Any) -> dict[str, Decimal]:
    """PodLimits without overhead: pod-level limits win where set."""
    return _pod_total(pod, container_limits, 1)


def _pod_total(pod: Any, pick: Callable[[Any], dict[str, Decimal]], level_index: int) -> dict[str, Decimal]:
    """The containers' total (``aggregate`` of ``pick``), with the pod-level requests (0) or
    limits (1) in place of the cpu and memory they set."""
    total = aggregate(pod, pick)
    level = pod_level_requirements(pod)
    if level is not None:
        for name in QOS_RESOURCES:
            if name in level[level_index]:
                total[name] = level[level_index][name]
    return total
