"""bench/pod_timeline.py --pool: several runs' pods pooled, each still paired within its own run."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from bench_scripts import bench_module


@pytest.fixture(scope="module")
def timeline() -> ModuleType:
    return bench_module("pod_timeline")


def run(group_starts: list[tuple[float, float, float]]) -> dict[str, Any]:
    """A report of one run: per group, the start (ms) of its direct, hooks and noop pods."""
    pods = [{"group": f"g{n}", "target": target, "start_ms": ms}
            for n, starts in enumerate(group_starts)
            for target, ms in zip(("direct", "hooks", "noop"), starts, strict=True)]
    return {"pods": pods}


def test_pods_pair_only_within_their_run(timeline: ModuleType) -> None:
    # Same group names in both runs: pooled naively, run 2's direct pods would replace run 1's.
    first = run([(100.0, 102.0, 101.0), (110.0, 112.0, 111.0)])
    second = run([(200.0, 206.0, 203.0), (210.0, 216.0, 213.0)])
    found = timeline.ratios(timeline.pooled_pods([first, second]))
    assert found["hooks"]["pods"] == 4
    assert found["hooks"]["paired"]["mean_ms"] == pytest.approx((2 + 2 + 6 + 6) / 4)
    assert found["noop"]["paired"]["mean_ms"] == pytest.approx((1 + 1 + 3 + 3) / 4)
    assert found["hooks"]["paired_ratio"] == pytest.approx(1 + 4 / 155)


def test_pool_prints_each_run_and_the_pooled_verdict(timeline: ModuleType, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    paths = []
    for n, report in enumerate([run([(100.0, 102.0, 101.0)] * 3), run([(100.0, 104.0, 101.0)] * 3)]):
        paths.append(tmp_path / f"run{n}.json")
        paths[-1].write_text(json.dumps(report))
    timeline.main(["--pool", *map(str, paths)])
    out = capsys.readouterr().out
    assert str(paths[0]) in out and str(paths[1]) in out
    assert "Pooled, 6 pods per target over 2 runs" in out
    pooled = out.split("Pooled", 1)[1]
    assert "1.030x ± " in pooled and "(+3.00 ms, median +3.00)  <= 1.03x: met" in pooled
    assert "1.010x ± 0.000 (+1.00 ms, median +1.00)  <= 1.02x: met" in pooled


# -- bench/relay_bench.py --pool: per-round throughput ratios ------------------------------


@pytest.fixture(scope="module")
def relay() -> ModuleType:
    return bench_module("relay_bench")


def relay_run(direct: list[float], proxy: list[float], hop: list[float] | None = None) -> dict[str, Any]:
    """A relay_bench report whose only row is Version at 16 callers, with these calls/s per round
    (the hop's too when given, as with --hop)."""
    row: dict[str, Any] = {"method": "Version", "concurrency": 16,
                           "direct": {"round_calls_per_s": direct}, "proxy": {"round_calls_per_s": proxy}}
    if hop is not None:
        row["hop"] = {"round_calls_per_s": hop}
    return {"results": [row]}


def test_relay_rounds_pair_each_proxy_run_with_its_direct_run(relay: ModuleType) -> None:
    # Round 2 is slow for both targets: paired, it counts as the same ratio as round 1.
    first = relay_run([10000.0, 5000.0], [9000.0, 4500.0])
    second = relay_run([10000.0], [10000.0])
    assert relay.pooled_round_ratios([first, second]) == {("Version", 16, "proxy"): pytest.approx([0.9, 0.9, 1.0])}
    mean, half = relay.mean_ci95([0.9, 0.9, 1.0])
    assert mean == pytest.approx(0.9333, abs=1e-4) and half == pytest.approx(1.96 * 0.057735 / 3**0.5, rel=1e-4)


def test_relay_pool_prints_each_run_and_the_pooled_ratio(relay: ModuleType, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    paths = []
    for n, report in enumerate([relay_run([100.0, 100.0], [90.0, 80.0]), relay_run([100.0, 100.0], [90.0, 100.0])]):
        paths.append(tmp_path / f"relay{n}.json")
        paths[-1].write_text(json.dumps(report))
    relay.main(["--pool", *map(str, paths)])
    out = capsys.readouterr().out
    assert f"{paths[0]}:\n  Version x16 proxy             0.90 0.80, mean 0.85x" in out
    assert "Pooled, 2 runs:\n  Version x16 proxy             4 rounds, throughput 0.900x ± 0.080  >= 0.9x: ok" in out


def test_relay_pool_keeps_the_hop_apart_and_pools_it_from_the_runs_that_had_one(
    relay: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [relay_run([100.0], [80.0], hop=[85.0]), relay_run([100.0], [84.0]), relay_run([100.0], [86.0], hop=[87.0])]
    assert relay.pooled_round_ratios(runs) == {
        ("Version", 16, "proxy"): pytest.approx([0.80, 0.84, 0.86]),
        ("Version", 16, "hop"): pytest.approx([0.85, 0.87]),
        ("Version", 16, "proxy/hop"): pytest.approx([80 / 85, 86 / 87]),  # paired within each run
    }
    paths = []
    for n, report in enumerate(runs):
        paths.append(tmp_path / f"relay{n}.json")
        paths[-1].write_text(json.dumps(report))
    relay.main(["--pool", *map(str, paths)])
    pooled = capsys.readouterr().out.split("Pooled, 3 runs:\n", 1)[1].splitlines()
    assert pooled[0].startswith("  Version x16 proxy             3 rounds, throughput 0.833x") and pooled[0].endswith(
        ">= 0.9x: MISSED"
    )
    assert pooled[1].startswith("  Version x16 hop               2 rounds, throughput 0.860x")
    assert pooled[2].startswith("  Version x16 proxy/hop         2 rounds, throughput 0.965x")
    assert "MISSED" not in pooled[1] + pooled[2]  # a verdict only for the proxy against direct


def test_relay_pool_refuses_a_report_without_rounds(relay: ModuleType, tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"results": [{"method": "Version", "concurrency": 16, "direct": {}, "proxy": {}}]}))
    with pytest.raises(SystemExit, match="no per-round calls/s"):
        relay.main(["--pool", str(old)])
