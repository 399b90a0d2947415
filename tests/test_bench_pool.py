"""bench/pod_timeline.py --pool: several runs' pods pooled, each still paired within its own run."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def timeline() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # the bench scripts import each other by bare name
    try:
        return importlib.import_module("pod_timeline")
    finally:
        sys.path.remove(str(BENCH))


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
