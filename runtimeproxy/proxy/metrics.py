"""Prometheus metrics of the CRI calls the proxy relays: counted by method and status code,
timed, in flight, and the proxy's open connections."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from runtimeproxy.common.metrics_export import CallCollector, CallFamilies
from runtimeproxy.wire.grpc_framing import code_name

__all__ = ["CALLS_HELP", "CALLS_NAME", "DURATION_HELP", "DURATION_NAME", "CallMetrics"]

# The proxy's two call families, exported exactly as prometheus_client's Counter and Histogram
# with these arguments export them (names, help, labels, buckets, _created).
CALLS_NAME = "runtimeproxy_cri_calls"
CALLS_HELP = "CRI calls relayed, by method and gRPC status code name."
DURATION_NAME = "runtimeproxy_cri_call_duration_seconds"
DURATION_HELP = "Time from receiving a CRI call to sending its status, by method."


def _method_labels(method: str) -> tuple[str]:
    return (method,)


_CRI_FAMILIES = CallFamilies(CALLS_NAME, CALLS_HELP, DURATION_NAME, DURATION_HELP, ("method",), "code")


class CallMetrics(CallCollector[str, int]):
    """The proxy's call metrics, registered in ``registry`` (default: the global one).

    ``record(method, code, seconds)`` counts a call by method and gRPC status code (exported
    by name) and observes its duration, without locks (see CallCollector). Registering twice
    in one registry raises ValueError (duplicated timeseries), so build one instance per
    registry. ``method`` labels should come from a bounded set (the CRI method names), not
    from arbitrary client input.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = REGISTRY if registry is None else registry
        super().__init__(reg, _CRI_FAMILIES, _method_labels, code_name)
        self.in_flight = Gauge("runtimeproxy_cri_calls_in_flight", "CRI calls currently being relayed.", registry=reg)
        self.connections = Gauge(
            "runtimeproxy_connections",
            "Open connections: side=client (from kubelet and others) or backend (to the runtime).",
            ["side"],
            registry=reg,
        )
        self.client_connections = self.connections.labels(side="client")
        self.backend_connections = self.connections.labels(side="backend")
