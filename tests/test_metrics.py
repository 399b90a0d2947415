from __future__ import annotations

import math
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import prometheus_client
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from runtimeproxy.hooks.plugin_runner import OUTCOMES, Outcome, PluginMetrics

from runtimeproxy.common.metrics_export import DURATION_BUCKETS, MetricsServer, format_address, parse_address
from runtimeproxy.proxy.metrics import CallMetrics
from runtimeproxy.wire.grpc_framing import code_name
from runtimeproxy.wire.peer_limit_metrics import start_metrics_server


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


def test_record_counts_and_observes(registry: CollectorRegistry) -> None:
    m = CallMetrics(registry)
    m.record("RunPodSandbox", 0, 0.2)
    m.record("RunPodSandbox", 0, 0.3)
    m.record("RunPodSandbox", 14, 1.5)
    m.record("Version", 0, 0.0004)
    got = samples(registry)
    calls = "runtimeproxy_cri_calls_total"
    assert got[key(calls, method="RunPodSandbox", code="OK")] == 2
    assert got[key(calls, method="RunPodSandbox", code="UNAVAILABLE")] == 1
    assert got[key(calls, method="Version", code="OK")] == 1
    hist = "runtimeproxy_cri_call_duration_seconds"
    assert got[key(hist + "_count", method="RunPodSandbox")] == 3
    assert got[key(hist + "_sum", method="RunPodSandbox")] == pytest.approx(2.0)
    assert got[key(hist + "_bucket", method="Version", le="0.0005")] == 1
    assert got[key(hist + "_bucket", method="Version", le="0.00025")] == 0


def test_unknown_code_becomes_number(registry: CollectorRegistry) -> None:
    m = CallMetrics(registry)
    m.record("Version", 42, 0.001)
    assert samples(registry)[key("runtimeproxy_cri_calls_total", method="Version", code="42")] == 1


def test_code_names() -> None:
    assert code_name(0) == "OK"
    assert code_name(4) == "DEADLINE_EXCEEDED"
    assert code_name(12) == "UNIMPLEMENTED"
    assert code_name(16) == "UNAUTHENTICATED"
    assert code_name(17) == "17"
    assert code_name(-1) == "-1"


def test_code_names_match_grpc() -> None:
    grpc = pytest.importorskip("grpc")
    for status in grpc.StatusCode:
        assert code_name(status.value[0]) == status.name


def test_buckets_span_tenth_ms_to_two_minutes() -> None:
    assert DURATION_BUCKETS[0] == 0.0001
    assert DURATION_BUCKETS[-1] == 120.0
    assert list(DURATION_BUCKETS) == sorted(set(DURATION_BUCKETS))


def test_gauges(registry: CollectorRegistry) -> None:
    m = CallMetrics(registry)
    m.in_flight.inc()
    m.in_flight.inc()
    m.in_flight.dec()
    m.client_connections.inc()
    m.backend_connections.inc(3)
    got = samples(registry)
    assert got[key("runtimeproxy_cri_calls_in_flight")] == 1
    assert got[key("runtimeproxy_connections", side="client")] == 1
    assert got[key("runtimeproxy_connections", side="backend")] == 3


def test_both_connection_sides_are_exported_at_zero(registry: CollectorRegistry) -> None:
    CallMetrics(registry)
    got = samples(registry)
    assert got[key("runtimeproxy_connections", side="client")] == 0
    assert got[key("runtimeproxy_connections", side="backend")] == 0


def test_second_instance_in_same_registry_fails(registry: CollectorRegistry) -> None:
    CallMetrics(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        CallMetrics(registry)


class ReferenceCallMetrics:
    """The call metrics as prometheus_client's own Counter, Histogram and Gauges (the proxy's
    implementation before its lock-free collector): what the exposition must stay equal to."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "runtimeproxy_cri_calls",
            "CRI calls relayed, by method and gRPC status code name.",
            ["method", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "runtimeproxy_cri_call_duration_seconds",
            "Time from receiving a CRI call to sending its status, by method.",
            ["method"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        Gauge("runtimeproxy_cri_calls_in_flight", "CRI calls currently being relayed.", registry=registry)
        connections = Gauge(
            "runtimeproxy_connections",
            "Open connections: side=client (from kubelet and others) or backend (to the runtime).",
            ["side"],
            registry=registry,
        )
        connections.labels(side="client")
        connections.labels(side="backend")

    def record(self, method: str, code: int, seconds: float) -> None:
        self.calls.labels(method=method, code=code_name(code)).inc()
        self.duration.labels(method=method).observe(seconds)


def expositions(calls: list[tuple[str, int, float]]) -> list[tuple[bytes, bytes]]:
    """(ours, reference) in the Prometheus text format and in OpenMetrics, after ``calls``."""
    ours_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    with mock.patch("time.time", return_value=1_700_000_000.25):  # equal _created stamps
        ours, reference = CallMetrics(ours_registry), ReferenceCallMetrics(reference_registry)
        for call in calls:
            ours.record(*call)
            reference.record(*call)
    return [
        (generate(ours_registry), generate(reference_registry)) for generate in (generate_latest, generate_openmetrics)
    ]


_calls = st.lists(
    st.tuples(
        st.sampled_from(["/runtime.v1.RuntimeService/Version", "ListContainers", "RunPodSandbox", 'a"b\\c\n']),
        st.sampled_from([0, 1, 2, 4, 8, 13, 14, 16, 17, -1, 1000]),
        st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([*DURATION_BUCKETS, 0.0, -0.0]),
    ),
    max_size=40,
)


@given(calls=_calls)
def test_exposition_equals_prometheus_counter_and_histogram(calls: list[tuple[str, int, float]]) -> None:
    for ours, reference in expositions(calls):
        assert ours == reference


@pytest.mark.parametrize("created", [False, True])
def test_created_series_follow_prometheus_switch(created: bool) -> None:
    calls = [("Version", 0, 0.0003), ("ListContainers", 14, 2.0), ("Version", 2, 0.5)]
    if not created:
        prometheus_client.disable_created_metrics()
    try:
        for ours, reference in expositions(calls):
            assert ours == reference
            assert (b"_created" in ours) is created
    finally:
        prometheus_client.enable_created_metrics()


class ReferencePluginMetrics:
    """runtime-hooks' plugin metrics as prometheus_client's Counters and Histogram (before the
    lock-free collector): what PluginMetrics' exposition must stay equal to."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "runtimeproxy_hooks_plugin_calls",
            "Plugin handler calls, by plugin, hook point (or start/stop/reconcile) and outcome "
            "(ok, error, timeout, invalid, busy).",
            ["plugin", "hook", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "runtimeproxy_hooks_plugin_call_duration_seconds",
            "Time a plugin handler took (up to its timeout), by plugin and hook point.",
            ["plugin", "hook"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.overwrites = Counter(
            "runtimeproxy_hooks_plugin_overwrites",
            "Values one plugin set that a later plugin replaced in the same hook call, by field "
            "(a map's name for its entries: annotations, labels, env, resources.unified).",
            ["field"],
            registry=registry,
        )

    def record(self, plugin: str, hook: str, outcome: Outcome, seconds: float) -> None:
        self.calls.labels(plugin=plugin, hook=hook, outcome=outcome).inc()
        self.duration.labels(plugin=plugin, hook=hook).observe(seconds)

    def expect(self, plugin: str, hooks: list[str]) -> None:
        """prometheus_client's way to export series before their first count: labels() alone."""
        for hook in hooks:
            for outcome in OUTCOMES:
                self.calls.labels(plugin=plugin, hook=hook, outcome=outcome)


_PluginCall = tuple[str, str, Outcome, float]
_PluginExpected = tuple[str, str]  # (plugin, hook) whose series are exported at 0 (PluginMetrics.expect)


def plugin_expositions(
    calls: list[_PluginCall | _PluginExpected], overwrites: list[str]
) -> list[tuple[bytes, bytes]]:
    """(ours, reference) in the Prometheus text format and in OpenMetrics, after ``calls`` (and
    the series expected among them)."""
    ours_registry, reference_registry = CollectorRegistry(auto_describe=True), CollectorRegistry(auto_describe=True)
    with mock.patch("time.time", return_value=1_700_000_000.25):  # equal _created stamps
        ours, reference = PluginMetrics(ours_registry), ReferencePluginMetrics(reference_registry)
        for call in calls:
            if len(call) == 2:
                ours.expect(call[0], [call[1]])
                reference.expect(call[0], [call[1]])
                continue
            ours.record(*call)
            reference.record(*call)
        for kind in overwrites:
            ours.overwrites.labels(field=kind).inc()
            reference.overwrites.labels(field=kind).inc()
    return [
        (generate(ours_registry), generate(reference_registry)) for generate in (generate_latest, generate_openmetrics)
    ]


_plugins = st.sampled_from(["cpu", "memory", "resctrl", 'x"y\\z\n', ""])
_hooks = st.sampled_from(["PreRunPodSandbox", "PreCreateContainer", "PostStartContainer", "start", "reconcile"])
_plugin_calls = st.lists(
    st.tuples(
        _plugins,
        _hooks,
        st.sampled_from(OUTCOMES),
        st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([*DURATION_BUCKETS, 0.0, -0.0]),
    )
    | st.tuples(_plugins, _hooks),
    max_size=40,
)


@given(calls=_plugin_calls, overwrites=st.lists(st.sampled_from(["annotations", "env", "resources.unified"])))
def test_plugin_exposition_equals_prometheus_counter_and_histogram(
    calls: list[_PluginCall | _PluginExpected], overwrites: list[str]
) -> None:
    for ours, reference in plugin_expositions(calls, overwrites):
        assert ours == reference


@pytest.mark.parametrize("created", [False, True])
def test_plugin_created_series_follow_prometheus_switch(created: bool) -> None:
    calls: list[_PluginCall] = [("cpu", "PreCreateContainer", "ok", 0.0003), ("cpu", "PreCreateContainer", "busy", 2.0)]
    if not created:
        prometheus_client.disable_created_metrics()
    try:
        for ours, reference in plugin_expositions(calls, ["env"]):
            assert ours == reference
            assert (b"_created" in ours) is created
    finally:
        prometheus_client.enable_created_metrics()


def test_plugin_metrics_count_by_plugin_hook_and_outcome(registry: CollectorRegistry) -> None:
    m = PluginMetrics(registry)
    m.record("cpu", "PreCreateContainer", "ok", 0.0004)
    m.calls.record(("cpu", "PreCreateContainer"), "timeout", 1.0)  # the runner's direct path
    m.record("memory", "PreCreateContainer", "ok", 0.002)
    got = samples(registry)
    calls = "runtimeproxy_hooks_plugin_calls_total"
    assert got[key(calls, plugin="cpu", hook="PreCreateContainer", outcome="ok")] == 1
    assert got[key(calls, plugin="cpu", hook="PreCreateContainer", outcome="timeout")] == 1
    assert got[key(calls, plugin="memory", hook="PreCreateContainer", outcome="ok")] == 1
    hist = "runtimeproxy_hooks_plugin_call_duration_seconds"
    assert got[key(hist + "_count", plugin="cpu", hook="PreCreateContainer")] == 2
    assert got[key(hist + "_sum", plugin="cpu", hook="PreCreateContainer")] == pytest.approx(1.0004)
    assert got[key(hist + "_bucket", plugin="memory", hook="PreCreateContainer", le="0.0025")] == 1
    assert got[key(hist + "_bucket", plugin="memory", hook="PreCreateContainer", le="0.001")] == 0


def test_expected_series_are_exported_at_zero_and_keep_their_counts(registry: CollectorRegistry) -> None:
    m = PluginMetrics(registry)
    m.record("cpu", "PreCreateContainer", "error", 0.001)
    m.expect("cpu", ["PreCreateContainer", "reconcile"])
    m.expect("cpu", ["PreCreateContainer"])  # again: nothing changes
    got = samples(registry)
    calls = "runtimeproxy_hooks_plugin_calls_total"
    for outcome in OUTCOMES:
        assert got[key(calls, plugin="cpu", hook="reconcile", outcome=outcome)] == 0
        assert got[key(calls, plugin="cpu", hook="PreCreateContainer", outcome=outcome)] == (outcome == "error")
    hist = "runtimeproxy_hooks_plugin_call_duration_seconds_count"
    assert key(hist, plugin="cpu", hook="reconcile") not in got  # no histogram before an observation
    assert got[key(hist, plugin="cpu", hook="PreCreateContainer")] == 1
    m.record("cpu", "reconcile", "timeout", 2.0)
    got = samples(registry)
    assert got[key(calls, plugin="cpu", hook="reconcile", outcome="timeout")] == 1
    assert got[key(hist, plugin="cpu", hook="reconcile")] == 1


def test_second_plugin_metrics_in_same_registry_fails(registry: CollectorRegistry) -> None:
    PluginMetrics(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        PluginMetrics(registry)


def test_nan_duration_is_summed_but_in_no_bucket(registry: CollectorRegistry) -> None:
    m = CallMetrics(registry)
    m.record("Version", 0, math.nan)
    got = samples(registry)
    hist = "runtimeproxy_cri_call_duration_seconds"
    assert got[key("runtimeproxy_cri_calls_total", method="Version", code="OK")] == 1
    assert got[key(hist + "_count", method="Version")] == 0
    assert math.isnan(got[key(hist + "_sum", method="Version")])


def record_while_scraping(
    registry: CollectorRegistry, record: Callable[[], None], on_scrape: Callable[[Any], None] = lambda got: None
) -> None:
    """Run ``record`` on this thread while another scrapes ``registry`` again and again (each
    scrape's samples to ``on_scrape``), as the metrics server's thread does; its errors re-raised."""
    done = threading.Event()
    failures: list[BaseException] = []

    def scrape_until_done() -> None:
        try:
            while not done.is_set():
                on_scrape(samples(registry))
        except BaseException as exc:  # reported to the test thread
            failures.append(exc)

    scraper = threading.Thread(target=scrape_until_done)
    scraper.start()
    try:
        record()
    finally:
        done.set()
        scraper.join()
    assert not failures, failures


def test_scrapes_from_another_thread_while_recording(registry: CollectorRegistry) -> None:
    """The event loop records without locks while the metrics server's thread collects."""
    m = CallMetrics(registry)
    methods = [f"/svc/M{n}" for n in range(50)]
    seen: list[float] = []

    def record() -> None:
        for n in range(20_000):
            m.record(methods[n % len(methods)], n % 17, 0.001)

    def total(got: Any) -> None:
        seen.append(sum(v for (name, _), v in got.items() if name == "runtimeproxy_cri_calls_total"))

    record_while_scraping(registry, record, total)
    assert seen == sorted(seen)  # counts only grow, scrape after scrape
    assert sum(v for (name, _), v in samples(registry).items() if name == "runtimeproxy_cri_calls_total") == 20_000


def test_scrapes_while_declared_keys_get_their_first_observation(registry: CollectorRegistry) -> None:
    """A declared key moves to the observed ones at its first call: a scrape meanwhile finds it."""
    m = PluginMetrics(registry)

    def record() -> None:
        for n in range(3_000):
            m.expect(f"plugin-{n}", ["PreCreateContainer"])
            m.record(f"plugin-{n}", "PreCreateContainer", "ok", 0.001)

    record_while_scraping(registry, record)
    got = samples(registry)
    calls = "runtimeproxy_hooks_plugin_calls_total"
    assert sum(v for (name, _), v in got.items() if name == calls) == 3_000
    count = "runtimeproxy_hooks_plugin_call_duration_seconds_count"
    assert sum(1 for (name, _) in got if name == count) == 3_000


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9090", ("127.0.0.1", 9090)),
        (":9090", ("", 9090)),
        ("[::1]:9090", ("::1", 9090)),
        ("[::]:0", ("::", 0)),
        ("localhost:65535", ("localhost", 65535)),
        ("0.0.0.0:1", ("0.0.0.0", 1)),
    ],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("9090", "expected host:port"),
        ("", "expected host:port"),
        ("localhost", "expected host:port"),
        ("::1:9090", "must be in brackets"),
        ("[::1]", "must be in brackets"),
        ("[nothost]:80", "not an IPv6 address"),
        ("[::1:80", "brackets"),
        ("host]:80", "brackets"),
        ("host:", "not a number"),
        ("host:http", "not a number"),
        ("host:+80", "not a number"),
        ("host: 80", "not a number"),
        ("host:65536", "out of range"),
    ],
)
def test_parse_address_errors(address: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_address(address)


_label = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\Z")
_hostnames = st.lists(_label, min_size=1, max_size=4).map(".".join)
_hosts = st.one_of(
    st.just(""),
    _hostnames,
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
)


@given(host=_hosts, port=st.integers(min_value=0, max_value=65535))
def test_address_round_trip(host: str, port: int) -> None:
    assert parse_address(format_address(host, port)) == (host, port)


@pytest.fixture
def server(registry: CollectorRegistry) -> Iterator[MetricsServer]:
    srv = start_metrics_server("127.0.0.1:0", registry)
    yield srv
    srv.close()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        body: bytes = resp.read()
        return body.decode()


def test_server_serves_metrics(registry: CollectorRegistry, server: MetricsServer) -> None:
    CallMetrics(registry).record("ListContainers", 0, 0.001)
    assert server.host == "127.0.0.1"
    assert server.port > 0
    body = scrape(f"http://{server.address}/metrics")
    assert 'runtimeproxy_cri_calls_total{code="OK",method="ListContainers"} 1.0' in body


def test_server_close_releases_port(registry: CollectorRegistry) -> None:
    srv = start_metrics_server("127.0.0.1:0", registry)
    port = srv.port
    srv.close()
    with socket.create_server(("127.0.0.1", port)):  # would fail if still bound
        pass


def _ipv6_loopback_works() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback_works(), reason="no IPv6 loopback")
def test_server_ipv6(registry: CollectorRegistry) -> None:
    srv = start_metrics_server("[::1]:0", registry)
    try:
        assert srv.address == f"[::1]:{srv.port}"
        assert "python_info" not in scrape(f"http://[::1]:{srv.port}/metrics")
    finally:
        srv.close()


def test_server_all_interfaces_accepts_ipv4(registry: CollectorRegistry) -> None:
    CallMetrics(registry)
    srv = start_metrics_server(":0", registry)
    try:
        assert "runtimeproxy_cri_calls_in_flight" in scrape(f"http://127.0.0.1:{srv.port}/metrics")
    finally:
        srv.close()


def test_server_bad_address(registry: CollectorRegistry) -> None:
    with pytest.raises(ValueError, match="expected host:port"):
        start_metrics_server("9090", registry)


def test_server_port_in_use(registry: CollectorRegistry, server: MetricsServer) -> None:
    with pytest.raises(OSError):
        start_metrics_server(f"127.0.0.1:{server.port}", registry)
