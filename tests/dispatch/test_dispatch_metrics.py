"""dispatch/dispatcher.py HookMetrics: every hook call counted and timed under its own labels,
exported byte for byte as prometheus_client's own Histogram and Counter exported them."""

from __future__ import annotations

from unittest import mock

import prometheus_client
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from runtimeproxy.dispatch.dispatcher import HookCallOutcome, HookMetrics, HookOutcome
from runtimeproxy.hookapi.hookpoints import HookPoint


def test_each_call_counts_under_its_server_hook_and_outcome() -> None:
    registry = CollectorRegistry()
    metrics = HookMetrics(registry)
    pre, post = HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER
    ok, timeout = HookCallOutcome.OK, HookCallOutcome.TIMEOUT
    calls = [
        ("a.json", pre, ok, 0.0002),
        ("a.json", pre, ok, 0.003),
        ("a.json", pre, timeout, 1.0),
        ("b.json", pre, ok, 0.0004),
        ("a.json", post, ok, 0.02),
    ]
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


class ReferenceHookMetrics:
    """The hook metrics as prometheus_client's Histogram and Counters, registered in this order
    (the dispatcher's implementation before the lock-free collector): what HookMetrics'
    exposition must stay equal to."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.duration = Histogram(
            "runtimeproxy_hook_duration_seconds",
            "Round trip of hook server calls, by server and hook point.",
            ["server", "hook"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=registry,
        )
        self.outcomes = Counter(
            "runtimeproxy_hook_calls",
            "Hook server calls by outcome: ok, unregistered, unimplemented, not_grpc, failed, timeout, invalid.",
            ["server", "hook", "outcome"],
            registry=registry,
        )
        self.layer_errors = Counter(
            "runtimeproxy_hook_layer_errors",
            "Errors inside the proxy's hook layer, by CRI method and what became of the call: "
            "refused (a Fail server was subscribed), relayed_unchanged (Ignore only), after_call.",
            ["method", "action"],
            registry=registry,
        )
        self.refused = Counter(
            "runtimeproxy_cri_calls_refused",
            "CRI calls refused because a pre-hook of a server with failure policy Fail failed, by CRI "
            "method, server and hook point.",
            ["method", "server", "hook"],
            registry=registry,
        )

    def record(self, result: HookOutcome) -> None:
        self.duration.labels(result.server, result.point.value).observe(result.seconds)
        self.outcomes.labels(result.server, result.point.value, result.outcome.value).inc()


# The outcome label's values, as docs/hook-api.md and the metric's help text name them.
OUTCOME_WORDS = ["ok", "unregistered", "unimplemented", "not_grpc", "failed", "timeout", "invalid"]
_hook_calls = st.lists(
    st.builds(
        HookOutcome,
        st.sampled_from(["a.json", "b.json", 'x"y\\z\n.json']),
        st.sampled_from(list(HookPoint)),
        st.sampled_from(OUTCOME_WORDS).map(HookCallOutcome),
        st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0005, 0.001, 10.0, 0.0, -0.0]),
    ),
    max_size=30,
)
_layer_errors = st.lists(
    st.tuples(st.sampled_from(["RunPodSandbox", "StopContainer"]), st.sampled_from(["refused", "after_call"]))
)


def hook_expositions(calls: list[HookOutcome], errors: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """(ours, reference) in the Prometheus text format and in OpenMetrics, after ``calls``."""
    ours_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    with mock.patch("time.time", return_value=1_700_000_000.25):  # equal _created stamps
        ours, reference = HookMetrics(ours_registry), ReferenceHookMetrics(reference_registry)
        for call in calls:
            ours.record(call)
            reference.record(call)
        for method, action in errors:
            ours.layer_errors.labels(method, action).inc()
            reference.layer_errors.labels(method, action).inc()
    return [
        (generate(ours_registry), generate(reference_registry)) for generate in (generate_latest, generate_openmetrics)
    ]


@given(calls=_hook_calls, errors=_layer_errors)
def test_exposition_equals_prometheus_histogram_and_counters(
    calls: list[HookOutcome], errors: list[tuple[str, str]]
) -> None:
    for ours, reference in hook_expositions(calls, errors):
        assert ours == reference


@pytest.mark.parametrize("created", [False, True])
def test_created_series_follow_prometheus_switch(created: bool) -> None:
    calls = [HookOutcome("a.json", HookPoint.PRE_RUN_POD_SANDBOX, HookCallOutcome.OK, 0.0003)]
    if not created:
        prometheus_client.disable_created_metrics()
    try:
        for ours, reference in hook_expositions(calls, [("RunPodSandbox", "refused")]):
            assert ours == reference
            assert (b"_created" in ours) is created
    finally:
        prometheus_client.enable_created_metrics()


def test_the_outcome_label_takes_exactly_the_documented_words() -> None:
    """The outcomes are user-visible (metric label, log lines, docs): one member per word, and
    a member formats, logs and compares as its word."""
    assert [outcome.value for outcome in HookCallOutcome] == OUTCOME_WORDS
    for outcome in HookCallOutcome:
        assert (f"{outcome}", str(outcome), outcome) == (outcome.value, outcome.value, outcome.value)
