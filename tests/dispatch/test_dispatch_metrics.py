"""dispatch/dispatcher.py HookMetrics: every hook call counted and timed under its own labels
(the labelled series are looked up once and reused)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from runtimeproxy.dispatch.dispatcher import HookMetrics, HookOutcome
from runtimeproxy.dispatch.hookpoints import HookPoint


def test_each_call_counts_under_its_server_hook_and_outcome() -> None:
    registry = CollectorRegistry()
    metrics = HookMetrics(registry)
    pre, post = HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER
    calls = [("a.json", pre, "ok", 0.0002), ("a.json", pre, "ok", 0.003), ("a.json", pre, "timeout", 1.0),
             ("b.json", pre, "ok", 0.0004), ("a.json", post, "ok", 0.02)]
    for server, point, outcome, seconds in calls:
        metrics.record(HookOutcome(server, point, outcome, seconds))

    def count(server: str, hook: str, outcome: str) -> float | None:
        labels = {"server": server, "hook": hook, "outcome": outcome}
        return registry.get_sample_value("runtimeproxy_hook_calls_total", labels)

    assert count("a.json", "PreCreateContainer", "ok") == 2
    assert count("a.json", "PreCreateContainer", "timeout") == 1
    assert count("b.json", "PreCreateContainer", "ok") == 1
    assert count("a.json", "PostStartContainer", "ok") == 1
    assert count("b.json", "PostStartContainer", "ok") is None
    durations = {"server": "a.json", "hook": "PreCreateContainer"}
    assert registry.get_sample_value("runtimeproxy_hook_duration_seconds_count", durations) == 3
    assert registry.get_sample_value("runtimeproxy_hook_duration_seconds_sum", durations) == 0.0002 + 0.003 + 1.0
    assert registry.get_sample_value("runtimeproxy_hook_duration_seconds_bucket", durations | {"le": "0.0005"}) == 1
