"""Prometheus building blocks both daemons use: a lock-free call counter and duration histogram
(:class:`CallCollector`, exported as prometheus_client's Counter and Histogram would export it),
the duration buckets, and the HTTP endpoint that serves a registry at ``/metrics``."""

from __future__ import annotations

import errno
import ipaddress
import socket
import socketserver
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import INF, floatToGoString

__all__ = [
    "DURATION_BUCKETS",
    "CallCollector",
    "CallFamilies",
    "MetricsServer",
    "format_address",
    "parse_address",
    "serve_metrics",
]

# 0.1 ms (a cached List call through the proxy) .. 2 min (kubelet's default CRI deadline).
DURATION_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip


K = TypeVar("K", bound=Hashable)
E = TypeVar("E", bound=Hashable)


@dataclass(frozen=True)
class CallFamilies:
    """What a :class:`CallCollector` exports: Counter ``calls_name{*labels, extra}`` and Histogram
    ``duration_name{*labels}`` (with ``buckets``), as prometheus_client names them."""

    calls_name: str
    calls_help: str
    duration_name: str
    duration_help: str
    labels: tuple[str, ...]
    extra: str
    buckets: tuple[float, ...] = DURATION_BUCKETS
    # Exported histogram first, as when the Histogram was registered before the Counter.
    histogram_first: bool = False

    def counter(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.calls_name, self.calls_help, labels=(*self.labels, self.extra))

    def histogram(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.duration_name, self.duration_help, labels=self.labels)


class _Series(Generic[E]):
    """One key's counts by extra label value and its duration histogram (non-cumulative buckets)."""

    __slots__ = ("buckets", "created", "extra_created", "extras", "total")

    def __init__(self, created: float, size: int) -> None:
        self.extras: dict[E, int] = {}
        self.extra_created: dict[E, float] = {}
        self.buckets = [0] * size
        self.total = 0.0
        self.created = created


class CallCollector(Generic[K, E]):
    """A call counter and duration histogram over plain dicts and lists, registered in ``registry``.

    Each call is recorded under a key (the histogram's label values, given by ``key_labels``)
    and one extra value (the counter's last label, given by ``extra_label``, which must map
    distinct values to distinct strings). Keys and extras should come from bounded sets.

    prometheus_client's Counter and Histogram take a lock per increment (three per call), and
    ``record`` runs for every relayed call or plugin call. Only one thread (the event loop)
    writes; a scrape (the metrics server's thread) reads without locking: it copies each
    container in one C-level call, which the GIL makes atomic, and reads ints and floats,
    which are replaced whole. Entries are published before the list that names them, so a
    scrape never sees a name without its series. A scrape racing a call may see its bucket
    counted and not yet its sum (prometheus_client is no more atomic across the two).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        families: CallFamilies,
        key_labels: Callable[[K], tuple[str, ...]],
        extra_label: Callable[[E], str],
    ) -> None:
        self._families = families
        self._bounds: tuple[float, ...] = (*families.buckets, INF)
        self._bucket_labels = tuple(floatToGoString(b) for b in self._bounds)  # type: ignore[no-untyped-call]
        self._key_labels = key_labels
        self._extra_label = extra_label
        self._series: dict[K, _Series[E]] = {}  # observed keys, in the order of their first observation
        # Keys declared and not yet observed: their counters only (declare). A key is moved to
        # _series, added there before it leaves here, at its first observation.
        self._declared: dict[K, _Series[E]] = {}
        # (key, extra) in the order each was first recorded: the counter's sample order.
        self._extra_order: list[tuple[K, E]] = []
        registry.register(self)

    def record(self, key: K, extra: E, seconds: float) -> None:
        """Count one finished call and observe its duration."""
        try:  # a subscript, not .get(): no method call on the path every call takes
            series = self._series[key]
        except KeyError:
            series = self._first_observation(key)
        try:
            series.extras[extra] += 1
        except KeyError:
            self._first_of_extra(key, series, extra)
        if seconds <= INF:  # NaN goes in no bucket (nor _count), as in Histogram.observe
            series.buckets[bisect_left(self._bounds, seconds)] += 1
        series.total += seconds

    def _first_of_extra(self, key: K, series: _Series[E], extra: E, count: int = 1) -> None:
        series.extra_created[extra] = time.time()
        series.extras[extra] = count
        self._extra_order.append((key, extra))  # last: a scrape finds the series complete

    def _first_observation(self, key: K) -> _Series[E]:
        series = self._declared.get(key)
        if series is None:
            series = _Series(time.time(), len(self._bounds))
        else:
            series.created = time.time()  # the histogram's, as it starts now
        self._series[key] = series
        self._declared.pop(key, None)  # after: a scrape finds the key in one of the two
        return series

    def declare(self, key: K, extras: Iterable[E]) -> None:
        """Export ``key``'s counter at 0 for each of ``extras`` not counted yet (its histogram
        comes with the first observation, as prometheus_client's would): a series born with its
        first count has no earlier sample, so an alert on increase() would never see that first
        count. From the recording thread, as ``record``."""
        series = self._series.get(key) or self._declared.get(key)
        if series is None:
            series = self._declared[key] = _Series(time.time(), len(self._bounds))
        for extra in extras:
            if extra not in series.extras:
                self._first_of_extra(key, series, extra, 0)

    def describe(self) -> Iterator[Metric]:
        """The families without samples: what the registry checks for duplicate names."""
        families = (self._families.counter(), self._families.histogram())
        yield from reversed(families) if self._families.histogram_first else families

    def collect(self) -> Iterator[Metric]:
        """Called from the scraping thread; see the class comment for why no lock is needed."""
        order = list(self._extra_order)  # before the series: each key in it has its series
        declared = dict(self._declared)  # before the observed ones: a key moving is in one of them
        series = dict(self._series)
        # Whether Counter and Histogram export _created now (PROMETHEUS_DISABLE_CREATED_SERIES,
        # disable_created_metrics()): prometheus_client keeps it in this module variable.
        created = bool(getattr(prometheus_metrics, "_use_created", True))
        calls = self._families.counter()
        for key, extra in order:
            one = series.get(key) or declared[key]
            stamp = one.extra_created[extra] if created else None
            calls.add_metric((*self._key_labels(key), self._extra_label(extra)), float(one.extras[extra]), stamp)
        duration, names = self._families.histogram(), self._families.labels
        stamp_name = self._families.duration_name + "_created"
        for key, one in series.items():
            labels = self._key_labels(key)
            buckets, total = list(one.buckets), one.total
            duration.add_metric(labels, list(zip(self._bucket_labels, _cumulative(buckets), strict=True)), total)
            if created:
                duration.add_sample(stamp_name, dict(zip(names, labels, strict=True)), one.created)
        yield from (duration, calls) if self._families.histogram_first else (calls, duration)


def _cumulative(counts: list[int]) -> list[float]:
    """Running totals as floats, summed as Histogram sums its buckets."""
    acc, out = 0.0, []
    for count in counts:
        acc += count
        out.append(acc)
    return out


def parse_address(address: str) -> tuple[str, int]:
    """Parse ``host:port``, ``[v6]:port`` or ``:port`` into ``(host, port)``.

    ``:port`` gives host ``""``, meaning every interface (as in Go's net.Listen); the
    server binds it dual-stack. Port 0 asks the kernel for a free port.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep:
        raise ValueError(f"metrics address {address!r}: expected host:port, [ipv6]:port or :port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        _check_ipv6(address, host)
    elif ":" in host:
        raise ValueError(f"metrics address {address!r}: IPv6 addresses must be in brackets")
    elif "[" in host or "]" in host:
        raise ValueError(f"metrics address {address!r}: unbalanced brackets")
    return host, _parse_port(address, port_text)


def _check_ipv6(address: str, host: str) -> None:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        raise ValueError(f"metrics address {address!r}: {host!r} is not an IPv6 address") from None


def _parse_port(address: str, text: str) -> int:
    # isdecimal + ascii: int() would also accept "+1", " 1", "1_0" and non-ASCII digits.
    if not (text.isascii() and text.isdecimal()):
        raise ValueError(f"metrics address {address!r}: port {text!r} is not a number")
    port = int(text)
    if port > 65535:
        raise ValueError(f"metrics address {address!r}: port {port} is out of range 0-65535")
    return port


def format_address(host: str, port: int) -> str:
    """Inverse of parse_address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood stderr; stay silent."""


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, family: socket.AddressFamily, dual: bool) -> None:
        # TCPServer.__init__ creates the socket from address_family, so set it first.
        self.address_family = family
        self.dual_stack = dual
        super().__init__((host, port), _QuietHandler)

    def server_bind(self) -> None:
        if self.dual_stack:  # accept IPv4 too, whatever net.ipv6.bindv6only says
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # HTTPServer.server_bind would call socket.getfqdn(), a reverse-DNS lookup that can
        # stall daemon start-up for seconds on a node with broken DNS.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


@dataclass
class MetricsServer:
    """A running metrics endpoint; ``host``/``port`` are what was actually bound."""

    host: str
    port: int
    _httpd: _Server = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    def close(self) -> None:
        """Stop serving, close the socket and wait briefly for the thread."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def _family_of(host: str) -> socket.AddressFamily:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return infos[0][0]


def _make_server(host: str, port: int, app: Any) -> _Server:
    dual = host == ""
    if dual:
        host = "::"
    server = _Server(host, port, _family_of(host), dual)
    server.set_app(app)
    return server


def _bind(host: str, port: int, app: Any) -> _Server:
    try:
        return _make_server(host, port, app)
    except OSError as exc:
        # ":port" on a host with IPv6 disabled: fall back to IPv4 only.
        if host == "" and exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
            return _make_server("0.0.0.0", port, app)
        raise


def serve_metrics(address: str, registry: CollectorRegistry) -> MetricsServer:
    """Serve ``registry`` at ``http://address/metrics`` from a daemon thread.

    Raises ValueError for a malformed address and OSError if it cannot be bound.
    """
    host, port = parse_address(address)
    app = make_wsgi_app(registry)
    httpd = _bind(host, port, app)
    bound_host, bound_port = httpd.server_address[:2]
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return MetricsServer(str(bound_host), int(bound_port), httpd, thread)
