"""The HTTP/2 limits peers went over, as a Prometheus counter, and the metrics endpoint every
daemon serves: whatever its registry holds plus that counter and the process metrics."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, Metric

from runtimeproxy.common.metrics_export import MetricsServer, serve_metrics
from runtimeproxy.wire import peer_limits

__all__ = ["PeerLimitMetrics", "start_metrics_server"]


class PeerLimitMetrics:
    """``runtimeproxy_h2_peer_limit_exceeded_total{peer,limit}``: HTTP/2 peers cut off for going
    over a limit (wire.peer_limits), in this process, whichever of its connections it was. Every
    peer kind and limit is exported, at 0 until it happens, so that an alert sees the first one."""

    NAME = "runtimeproxy_h2_peer_limit_exceeded"
    HELP = (
        "HTTP/2 connections closed with ENHANCE_YOUR_CALM because the peer went over a limit, by peer "
        "(cri_client, runtime, grpc_server, grpc_client) and limit."
    )

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.NAME, self.HELP, labels=("peer", "limit"))

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        counts = peer_limits.exceeded_counts()
        family = self._family()
        for peer in peer_limits.PEER_KINDS:
            for limit in peer_limits.LIMIT_NAMES:
                family.add_metric((peer, limit), float(counts.get((peer, limit), 0)))
        yield family


def _export_peer_limits(registry: CollectorRegistry) -> None:
    """Every daemon that serves metrics exports the peer-limit counter and the process metrics
    (process_resident_memory_bytes, process_start_time_seconds...), once per registry."""
    with contextlib.suppress(ValueError):  # registered before (a metrics server started again on it)
        registry.register(PeerLimitMetrics())
    with contextlib.suppress(ValueError):  # the global registry has its own from the start
        ProcessCollector(registry=registry)


def start_metrics_server(address: str, registry: CollectorRegistry | None = None) -> MetricsServer:
    """Serve ``registry`` (default: global) with the peer-limit counter and the process metrics at
    ``http://address/metrics`` from a daemon thread.

    Raises ValueError for a malformed address and OSError if it cannot be bound.
    """
    registry = REGISTRY if registry is None else registry
    _export_peer_limits(registry)
    return serve_metrics(address, registry)
