"""Prometheus metrics of the NRI side of runtime-hooks (plugin calls are counted by the runner as in proxy mode)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from runtimeproxy.common.metrics_export import CallCollector, CallFamilies

__all__ = ["EVENT_OUTCOMES", "NriMetrics"]

_EVENT_FAMILIES = CallFamilies(
    "runtimehooks_nri_events",
    "NRI events handled, by outcome",
    "runtimehooks_nri_event_duration_seconds",
    "Time from an NRI event's arrival to its answer",
    ("event",),
    "outcome",
)


# How an event can end (NriMetrics' doc says when each applies).
EVENT_OUTCOMES = ("ok", "failed", "deadline", "error")


def _event_labels(event: str) -> tuple[str]:
    return (event,)


def _outcome(outcome: str) -> str:
    return outcome


class NriMetrics:
    """``runtimehooks_nri_events_total{event,outcome}`` (ok, failed: a "fail" plugin failed and the
    runtime was told; deadline: answered unchanged before NRI's timeout; error: a bug),
    ``runtimehooks_nri_event_duration_seconds{event}``, ``runtimehooks_nri_connected`` (1 while
    registered), ``runtimehooks_nri_reconnects_total`` and ``runtimehooks_nri_not_applied_total{field}``
    (answer fields NRI cannot carry; map entries counted under the map's name)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else REGISTRY
        # Recorded for every event: the lock-free collector the runner's plugin calls use, not
        # prometheus_client's Counter and Histogram (a lock and a label lookup per increment).
        self.events: CallCollector[str, str] = CallCollector(registry, _EVENT_FAMILIES, _event_labels, _outcome)
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
        self.events.record(event, outcome, seconds)

    def expect(self, events: Iterable[str]) -> None:
        """Export the counters of ``events`` at 0 for every outcome, so that an alert sees the
        first event that fails."""
        for event in events:
            self.events.declare(event, EVENT_OUTCOMES)
