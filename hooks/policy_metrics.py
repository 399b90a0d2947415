"""Prometheus metrics of the policy in force in runtime-hooks, the same in proxy and NRI mode.

* ``runtimeproxy_hooks_policy_info{hash}``: 1, one series, for the policy in force. ``hash`` is
  the first 12 hex digits of the SHA-256 of the policy as ``runtime-hooks policy show`` prints
  it (``dump_policy``): nodes whose effective policies are equal show the same hash, however
  their files are written, and a reload that changes the policy replaces the series.
* ``runtimeproxy_hooks_policy_last_load_timestamp_seconds``: when a valid version was last read
  (when the built-in defaults were put in force, for a node with no policy file).
* ``runtimeproxy_hooks_policy_load_failures_total{cause}``: versions not put in force, by
  ``LoadFailure``; every cause is exported from the start, at 0.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from .policy import LoadFailure, Policy, Specs, dump_policy

__all__ = ["HASH_DIGITS", "PolicyMetrics", "policy_hash"]

#: Hex digits of the SHA-256 that ``hash`` keeps: enough to tell policies apart on one cluster.
HASH_DIGITS = 12

INFO_NAME = "runtimeproxy_hooks_policy_info"
LOADED_NAME = "runtimeproxy_hooks_policy_last_load_timestamp_seconds"


def policy_hash(policy: Policy, specs: Specs) -> str:
    """The ``hash`` label of ``policy`` read against ``specs``."""
    return hashlib.sha256(dump_policy(policy, specs).encode()).hexdigest()[:HASH_DIGITS]


class _InForce:
    """A policy put in force and when, with its hash worked out on first use: a YAML dump of the
    whole policy, which serve's start (and NRI registration) does not wait for."""

    __slots__ = ("_digest", "_specs", "loaded_at", "policy")

    def __init__(self, policy: Policy, specs: Specs) -> None:
        self.policy, self._specs, self.loaded_at = policy, specs, time.time()
        self._digest: str | None = None

    @property
    def hash(self) -> str:
        if self._digest is None:  # a scrape and the loop may both get here: same result, one str set
            self._digest = policy_hash(self.policy, self._specs)
        return self._digest


class PolicyMetrics:
    """The metrics of the module doc in ``registry``, starting from ``policy`` (in force now);
    a ``policy.LoadObserver`` for the PolicyWatcher.

    The policy and its load time are one object, replaced whole on the event loop and read
    whole by a scrape from the metrics server's thread: a scrape never sees two hashes, or none.
    """

    def __init__(self, registry: CollectorRegistry, specs: Specs, policy: Policy) -> None:
        self._specs = specs
        self._state = _InForce(policy, specs)
        self.failures = Counter(
            "runtimeproxy_hooks_policy_load_failures",
            "Versions of the policy file not put in force (the last good policy stays), by cause: "
            + ", ".join(cause.value for cause in LoadFailure)
            + ".",
            ["cause"],
            registry=registry,
        )
        for cause in LoadFailure:
            self.failures.labels(cause=cause.value)
        registry.register(self)

    @property
    def hash(self) -> str:
        return self._state.hash

    def loaded(self, policy: Policy) -> None:
        self._state = _InForce(policy, self._specs)

    def failed(self, cause: LoadFailure) -> None:
        self.failures.labels(cause=cause.value).inc()

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        state = self._state
        info, loaded = self._families()
        info.add_metric((state.hash,), 1.0)
        loaded.add_metric((), state.loaded_at)
        yield from (info, loaded)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        info = GaugeMetricFamily(
            INFO_NAME,
            "1 for the policy in force; hash: the first 12 hex digits of the SHA-256 of the effective "
            "policy as `runtime-hooks policy show` prints it (equal policies, equal hash).",
            labels=("hash",),
        )
        loaded = GaugeMetricFamily(
            LOADED_NAME,
            "Unix time a valid policy was last read (the built-in defaults: when they were put in force at start).",
        )
        return info, loaded
