"""runtimeproxy.trace: events as JSON lines when on, nothing when off, off with a warning on a bad file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from runtimeproxy import trace


@pytest.fixture
def tracing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "trace.jsonl"
    monkeypatch.setattr(trace, "PATH", str(path))
    monkeypatch.setattr(trace, "ON", True)
    monkeypatch.setattr(trace, "_fd", None)
    yield path
    if trace._fd is not None:
        os.close(trace._fd)
    monkeypatch.setattr(trace, "_fd", None)


def test_event_appends_one_json_line_per_event(tracing: Path) -> None:
    trace.event("proxy.held", call=7, method="RunPodSandbox")
    before = trace.now()
    trace.event("proxy.keys", call=7, keys=("pod:u",))
    first, second = (json.loads(line) for line in tracing.read_text().splitlines())
    assert first["ev"] == "proxy.held" and first["call"] == 7 and first["method"] == "RunPodSandbox"
    assert first["pid"] == os.getpid() and first["cpu"] > 0
    assert second["keys"] == ["pod:u"] and second["t"] >= before >= first["t"]


def test_off_writes_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "never.jsonl"
    monkeypatch.setattr(trace, "PATH", str(path))
    monkeypatch.setattr(trace, "ON", False)
    monkeypatch.setattr(trace, "_fd", None)
    trace.event("proxy.held", call=1)
    assert not path.exists()


def test_unopenable_file_turns_tracing_off_with_a_warning(tracing: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "PATH", str(tracing / "no-such-dir" / "trace.jsonl"))
    with capture_logs() as logs:
        trace.event("proxy.held", call=1)
        trace.event("proxy.held", call=2)
    assert trace.ON is False
    assert [entry["event"] for entry in logs] == ["cannot open the trace file; tracing off"]
    assert logs[0]["env"] == trace.ENV
