"""Prometheus metrics of the NRI side of runtime-hooks (plugin calls are counted by the runner as in proxy mode)."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from runtimeproxy.common.metrics_export import DURATION_BUCKETS

__all__ = ["NriMetrics"]


class NriMetrics:
    """``runtimehooks_nri_events_total{event,outcome}`` (ok, failed: a "fail" plugin failed and the
    runtime was told; deadline: answered unchanged before NRI's timeout; error: a bug),
    ``runtimehooks_nri_event_duration_seconds{event}``, ``runtimehooks_nri_connected`` (1 while
    registered), ``runtimehooks_nri_reconnects_total`` and ``runtimehooks_nri_not_applied_total{field}``
    (answer fields NRI cannot carry; map entries counted under the map's name)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else REGISTRY
        self.events = Counter(
            "runtimehooks_nri_events_total", "NRI events handled, by outcome", ("event", "outcome"), registry=registry
        )
        self.duration = Histogram(
            "runtimehooks_nri_event_duration_seconds",
            "Time from an NRI event's arrival to its answer",
            ("event",),
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.connected = Gauge(
            "runtimehooks_nri_connected", "1 while registered with the runtime's NRI", registry=registry
        )
        self.reconnects = Counter(
            "runtimehooks_nri_reconnects_total", "Registrations after a lost connection", registry=registry
        )
        self.not_applied = Counter(
            "runtimehooks_nri_not_applied_total", "Answer fields NRI cannot apply", ("field",), registry=registry
        )

    def record(self, event: str, outcome: str, seconds: float) -> None:
        self.events.labels(event=event, outcome=outcome).inc()
        self.duration.labels(event=event).observe(seconds)
