"""cpu.shares -> cgroup v2 cpu.weight as the node's OCI runtime converts them (hooks/cgroups.py
WeightConversion): the values runc documents for each formula, the inverse, and what CgroupFS
writes and the drift check compares under each."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.cgroups import (
    MAX_SHARES,
    MIN_SHARES,
    CgroupFS,
    WeightConversion,
    shares_to_weight,
    weight_to_shares,
)
from runtimeproxy.hooks.changes import ResourceChanges
from runtimeproxy.hooks.cli import cli
from runtimeproxy.hooks.drift import Seen, drifts
from runtimeproxy.hooks.plugins.cpu import CpuPodPlan, apply_pod_plan
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.testkit.fake_cgroups import make_fake_cgroup_v2

LINEAR, LOG_QUADRATIC = WeightConversion.LINEAR, WeightConversion.LOG_QUADRATIC
UID = "0a1b2c3d-0000-4000-8000-000000000001"
CID = "c" * 64


@pytest.mark.parametrize(
    ("shares", "linear", "log_quadratic"),
    [
        (MIN_SHARES, 1, 1),
        (1024, 39, 100),  # kubelet's one CPU: the default weight only under the new formula
        (2000, 77, 170),  # `--cpu-shares 2000` under runc 1.3.1 and 1.3.2 (opencontainers/runc#4896)
        (MAX_SHARES, 10000, 10000),
        (0, 1, 1),  # below and above the range: clamped, as the kernel's bounds
        (1 << 20, 10000, 10000),
    ],
)
def test_the_values_each_runtime_writes(shares: int, linear: int, log_quadratic: int) -> None:
    assert shares_to_weight(shares) == shares_to_weight(shares, LINEAR) == linear
    assert shares_to_weight(shares, LOG_QUADRATIC) == log_quadratic


@pytest.mark.parametrize("conversion", list(WeightConversion))
def test_every_weight_is_reached_and_the_inverse_is_its_smallest_shares(conversion: WeightConversion) -> None:
    weights = [shares_to_weight(shares, conversion) for shares in range(MIN_SHARES, MAX_SHARES + 1)]
    assert weights == sorted(weights)
    assert set(weights) == set(range(1, 10001))
    first: dict[int, int] = {}
    for shares, weight in enumerate(weights, start=MIN_SHARES):
        first.setdefault(weight, shares)
    assert all(weight_to_shares(weight, conversion) == shares for weight, shares in first.items())


@given(st.sampled_from(list(WeightConversion)), st.integers(-5, 20000))
def test_weight_to_shares_clamps_and_maps_back(conversion: WeightConversion, weight: int) -> None:
    shares = weight_to_shares(weight, conversion)
    assert MIN_SHARES <= shares <= MAX_SHARES
    assert shares_to_weight(shares, conversion) == min(max(weight, 1), 10000)


@pytest.mark.parametrize("conversion", list(WeightConversion))
def test_cgroup_fs_writes_and_reads_the_runtimes_weight(tmp_path: Path, conversion: WeightConversion) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cg")
    parent = tree.add_pod(UID)
    [container] = tree.add_container(parent, CID)
    fs = CgroupFS(tree.root, tree.driver, weight_conversion=conversion)
    fs.set_cpu_shares(parent, 2000, CID)
    assert (container / "cpu.weight").read_text().strip() == str(shares_to_weight(2000, conversion))
    assert shares_to_weight(fs.cpu_shares(parent, CID), conversion) == shares_to_weight(2000, conversion)


def test_a_weight_the_runtime_wrote_is_no_drift_under_its_own_conversion() -> None:
    """On a node whose runc writes 100 for kubelet's 1024 shares, the reconciler must not see
    drift (and rewrite 39) there; on a node whose runc writes 39, 100 is drift."""
    wanted = ResourceChanges(cpu_shares=1024)
    new_runc = Seen(cpu_shares=100, weights=True, conversion=LOG_QUADRATIC)
    old_runc = Seen(cpu_shares=39, weights=True, conversion=LINEAR)
    assert drifts(wanted, new_runc) == []
    assert drifts(wanted, old_runc) == []
    assert [(d.have, d.want) for d in drifts(wanted, Seen(cpu_shares=100, weights=True))] == [(100, 39)]
    assert [(d.have, d.want) for d in drifts(wanted, Seen(cpu_shares=39, weights=True, conversion=LOG_QUADRATIC))] == [
        (39, 100)
    ]


def test_serve_takes_the_conversion_and_refuses_others() -> None:
    shown = CliRunner().invoke(cli, ["serve", "--help"])
    assert "--cpu-weight-conversion" in shown.output and "RUNTIME_HOOKS_CPU_WEIGHT_CONVERSION" in shown.output
    refused = CliRunner().invoke(cli, ["serve", "--cpu-weight-conversion", "cubic"])
    assert refused.exit_code == 2
    assert "'cubic' is not one of 'linear', 'log-quadratic'" in refused.output


@pytest.mark.parametrize("conversion", list(WeightConversion))
def test_a_be_pods_weight_set_under_the_nodes_conversion_is_not_rewritten(
    tmp_path: Path, conversion: WeightConversion
) -> None:
    """The cpu plugin's pod-level reconcile compares the weight the file holds with the batch
    shares converted as the node's runtime would: once set, it is left alone."""
    tree = make_fake_cgroup_v2(tmp_path / "cg")
    parent = tree.add_pod(UID)
    fs = CgroupFS(tree.root, tree.driver, weight_conversion=conversion)
    plan = CpuPodPlan(cgroup_parent=parent, qos=QoSClass.BE, cpu_shares=512)
    log = structlog.get_logger("test")
    assert apply_pod_plan(fs, plan, log) == ["shares"]
    assert fs.read("cpu", "cpu.weight", parent) == str(shares_to_weight(512, conversion))
    assert apply_pod_plan(fs, plan, log) == []


def test_plugin_authors_convert_as_the_node_does_through_the_sdk(tmp_path: Path) -> None:
    """A plugin that works out a weight itself (to compare, or to report) takes the node's
    conversion from its cgroups handle: the SDK exports the type and the functions."""
    from runtimeproxy.hooks import sdk

    tree = make_fake_cgroup_v2(tmp_path / "cg")
    fs = sdk.CgroupFS(tree.root, tree.driver, weight_conversion=sdk.WeightConversion("log-quadratic"))
    assert sdk.WeightConversion is WeightConversion and fs.weight_conversion is LOG_QUADRATIC
    assert sdk.shares_to_weight(1024, fs.weight_conversion) == 100
    assert sdk.weight_to_shares(100, fs.weight_conversion) == weight_to_shares(100, LOG_QUADRATIC)
