"""NRI mode's line and metrics per event. The metrics are exported exactly as prometheus_client's
Counter and Histogram of the same names export them: the dashboards and alert rules read them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from runtimeproxy.hooks.nri.nri_metrics import NriMetrics
from structlog.testing import capture_logs
from test_nri_mapping import call, make_hooks, nri_container, nri_pod, stamp_plugin

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri
from runtimeproxy.common.metrics_export import DURATION_BUCKETS

EVENTS = [("RunPodSandbox", "ok", 0.0012), ("CreateContainer", "ok", 0.0004), ("CreateContainer", "failed", 0.3),
          ("RunPodSandbox", "deadline", 1.8), ("PostStartContainer", "ok", 7.0), ("CreateContainer", "ok", 0.00009)]


def exported(registry: CollectorRegistry, prefix: str) -> list[str]:
    """The registry's lines for ``prefix``, without the _created samples (their times differ)."""
    lines = generate_latest(registry).decode().splitlines()
    return [line for line in lines if prefix in line and "_created" not in line]


def test_events_are_exported_as_counter_and_histogram_would_export_them() -> None:
    ours = CollectorRegistry()
    metrics = NriMetrics(ours)
    reference = CollectorRegistry()
    events = Counter("runtimehooks_nri_events_total", "NRI events handled, by outcome", ("event", "outcome"),
                     registry=reference)
    duration = Histogram("runtimehooks_nri_event_duration_seconds", "Time from an NRI event's arrival to its answer",
                         ("event",), buckets=DURATION_BUCKETS, registry=reference)
    for event, outcome, seconds in EVENTS:
        metrics.record(event, outcome, seconds)
        events.labels(event=event, outcome=outcome).inc()
        duration.labels(event=event).observe(seconds)
    assert exported(ours, "runtimehooks_nri_event") == exported(reference, "runtimehooks_nri_event")
    assert ours.get_sample_value("runtimehooks_nri_events_total", {"event": "CreateContainer", "outcome": "ok"}) == 2.0
    created = ours.get_sample_value("runtimehooks_nri_events_created", {"event": "CreateContainer", "outcome": "ok"})
    assert created is not None and created > 0


async def test_each_event_is_counted_and_logged_once_with_its_outcome() -> None:
    hooks, registry = make_hooks(stamp_plugin())
    with capture_logs() as lines:
        await call(hooks, "CreateContainer", nri.CreateContainerRequest(pod=nri_pod(), container=nri_container()))
    [handled] = [line for line in lines if line["event"] == "NRI event handled"]
    assert (handled["nri_event"], handled["outcome"]) == ("CreateContainer", "ok")
    assert handled["hooks"] == ["PreCreateContainer"]
    assert handled["pod"] == "ns/web" and handled["container"] == "app" and handled["log_level"] == "info"
    labels = {"event": "CreateContainer"}
    assert registry.get_sample_value("runtimehooks_nri_event_duration_seconds_count", labels) == 1.0
