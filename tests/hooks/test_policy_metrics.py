"""hooks/policy_metrics.py: the policy in force as one info series whose hash equal policies share,
the time of the last good load, and each refused version of the file counted by cause, as
PolicyWatcher reports them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from metric_samples import samples_of
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks.discovery import settings_specs
from runtimeproxy.hooks.plugins import cpu, memory, resctrl
from runtimeproxy.hooks.policy import LoadFailure, PolicyWatcher, default_policy, dump_policy, loads_policy
from runtimeproxy.hooks.policy_metrics import PolicyMetrics, policy_hash

SPECS = settings_specs((cpu.plugin, memory.plugin, resctrl.plugin))
DEFAULTS = default_policy(SPECS)
INFO = "runtimeproxy_hooks_policy_info"
LOADED = "runtimeproxy_hooks_policy_last_load_timestamp_seconds"
FAILURES = "runtimeproxy_hooks_policy_load_failures_total"
GOOD = "resctrl: {BE: {l3_percent_range: [0, 20]}}\n"
OTHER = "resctrl: {BE: {l3_percent_range: [0, 40]}}\n"


def hashes(registry: CollectorRegistry) -> dict[str, float]:
    return {dict(labels)["hash"]: value for labels, value in samples_of(registry, INFO).items()}


def failures(registry: CollectorRegistry) -> dict[str, float]:
    return {dict(labels)["cause"]: value for labels, value in samples_of(registry, FAILURES).items()}


def write(path: Path, data: str | bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data.encode() if isinstance(data, str) else data)
    temporary.replace(path)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def watched(tmp_path: Path, registry: CollectorRegistry) -> Iterator[tuple[Path, PolicyWatcher, PolicyMetrics]]:
    path = tmp_path / "policy.yaml"
    metrics = PolicyMetrics(registry, SPECS, DEFAULTS)
    yield path, PolicyWatcher(path, specs=SPECS, observer=metrics), metrics


def test_the_hash_is_that_of_the_policy_as_policy_show_prints_it() -> None:
    policy = loads_policy(GOOD, specs=SPECS)
    digest = hashlib.sha256(dump_policy(policy, SPECS).encode()).hexdigest()[:12]
    assert policy_hash(policy, SPECS) == digest
    # Written differently, the same effective policy: the same hash; another policy: another.
    spelled_out = "resctrl:\n  BE:\n    l3_percent_range: [0, 20]\n  LS: {}\n# a comment\n"
    assert policy_hash(loads_policy(spelled_out, specs=SPECS), SPECS) == digest
    assert policy_hash(loads_policy(OTHER, specs=SPECS), SPECS) != digest
    assert policy_hash(DEFAULTS, SPECS) != digest


def test_from_the_start_the_defaults_and_every_cause_at_zero(registry: CollectorRegistry) -> None:
    with mock.patch("time.time", return_value=1_700_000_000.5):
        PolicyMetrics(registry, SPECS, DEFAULTS)
    assert hashes(registry) == {policy_hash(DEFAULTS, SPECS): 1.0}
    assert samples_of(registry, LOADED) == {(): 1_700_000_000.5}
    assert failures(registry) == {cause.value: 0.0 for cause in LoadFailure}


def test_a_reload_replaces_the_info_series(
    watched: tuple[Path, PolicyWatcher, PolicyMetrics], registry: CollectorRegistry
) -> None:
    path, watcher, _metrics = watched
    write(path, GOOD)
    with mock.patch("time.time", return_value=1_800_000_000.0):
        assert watcher.check()
    assert hashes(registry) == {policy_hash(watcher.current, SPECS): 1.0}
    assert samples_of(registry, LOADED) == {(): 1_800_000_000.0}
    write(path, OTHER)
    assert watcher.check()
    assert hashes(registry) == {policy_hash(loads_policy(OTHER, specs=SPECS), SPECS): 1.0}  # the old one is gone
    # Read again with the same policy: still one series, and the load time moves on.
    write(path, OTHER + "# edited\n")
    with mock.patch("time.time", return_value=1_900_000_000.0):
        assert not watcher.check()
    assert len(hashes(registry)) == 1
    assert samples_of(registry, LOADED) == {(): 1_900_000_000.0}
    assert set(failures(registry).values()) == {0.0}


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        ("resctrl: {BE: {l3_percent_range: [0, 20]\n", LoadFailure.YAML),
        ("cpu: {}\ncpu: {}\n", LoadFailure.YAML),
        ("resctrl: {BE: {l3_percent_range: [30, 20]}}\n", LoadFailure.INVALID),
        ("no_such_plugin: {}\n", LoadFailure.INVALID),
        (b"resctrl: {BE: {}}\n# \xff\n", LoadFailure.ENCODING),
    ],
    ids=["syntax", "key-twice", "bad-value", "unknown-section", "not-utf8"],
)
def test_a_refused_version_is_counted_by_cause_and_the_last_good_policy_stays(
    watched: tuple[Path, PolicyWatcher, PolicyMetrics],
    registry: CollectorRegistry,
    content: str | bytes,
    cause: LoadFailure,
) -> None:
    path, watcher, metrics = watched
    write(path, GOOD)
    assert watcher.check()
    good, loaded = metrics.hash, samples_of(registry, LOADED)
    write(path, content)
    assert not watcher.check()
    assert failures(registry) == {c.value: 1.0 if c is cause else 0.0 for c in LoadFailure}
    assert hashes(registry) == {good: 1.0}
    assert samples_of(registry, LOADED) == loaded


def test_an_unreadable_and_a_removed_file_are_counted(
    watched: tuple[Path, PolicyWatcher, PolicyMetrics], registry: CollectorRegistry
) -> None:
    path, watcher, metrics = watched
    assert not watcher.check()  # no file at the first look: the defaults apply, no failure
    assert set(failures(registry).values()) == {0.0}
    write(path, GOOD)
    assert watcher.check()
    good = metrics.hash
    path.unlink()
    path.mkdir()  # open() fails whoever we are (root reads any file)
    assert not watcher.check()
    assert failures(registry)["unreadable"] == 1.0
    path.rmdir()
    assert not watcher.check()
    assert failures(registry)["removed"] == 1.0
    assert hashes(registry) == {good: 1.0}
