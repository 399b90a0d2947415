"""The proxy's pod store as Prometheus sees it."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter

__all__ = ["StoreMetrics"]


class StoreMetrics:
    """The hook layer's pod/container store (dispatch/store/), in ``registry`` (default: global)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.unreadable = Counter(
            "runtimeproxy_store_unreadable_objects",
            "Sandboxes and containers the runtime has but whose data cannot be decoded (e.g. a label "
            "that is not UTF-8), by kind: skipped by the store, each counted once.",
            ["kind"],
            registry=REGISTRY if registry is None else registry,
        )

    def count_unreadable(self, kind: str) -> None:
        self.unreadable.labels(kind=kind).inc()
