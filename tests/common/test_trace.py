"""runtimeproxy.common.trace: events as JSON lines when on (written in batches and at exit), nothing when
off, off with a warning on a bad file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from runtimeproxy.common import trace


@pytest.fixture
def tracing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "trace.jsonl"
    monkeypatch.setattr(trace, "PATH", str(path))
    monkeypatch.setattr(trace, "ON", True)
    monkeypatch.setattr(trace, "_fd", None)
    trace._pending.clear()
    yield path
    trace._pending.clear()
    if trace._fd is not None:
        os.close(trace._fd)
    monkeypatch.setattr(trace, "_fd", None)


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_events_are_json_lines_once_flushed(tracing: Path) -> None:
    trace.event("proxy.held", call=7, method="RunPodSandbox")
    before = trace.now()
    trace.event("proxy.keys", call=7, keys=("pod:u",))
    assert lines(tracing) == []  # held in memory: no write(2) per event
    trace.flush()
    first, second = lines(tracing)
    assert first["ev"] == "proxy.held" and first["call"] == 7 and first["method"] == "RunPodSandbox"
    assert first["pid"] == os.getpid() and isinstance(first["cpu"], int) and first["cpu"] > 0
    assert second["keys"] == ["pod:u"] and second["t"] >= before >= first["t"]  # type: ignore[operator]
    trace.flush()  # nothing new: nothing written twice
    assert len(lines(tracing)) == 2


def test_a_full_buffer_is_written_at_once(tracing: Path) -> None:
    for n in range(trace.FLUSH_EVENTS - 1):
        trace.event("e", n=n)
    assert lines(tracing) == []
    trace.event("e", n=trace.FLUSH_EVENTS - 1)
    assert [e["n"] for e in lines(tracing)] == list(range(trace.FLUSH_EVENTS))


def test_off_writes_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "never.jsonl"
    monkeypatch.setattr(trace, "PATH", str(path))
    monkeypatch.setattr(trace, "ON", False)
    monkeypatch.setattr(trace, "_fd", None)
    trace.event("proxy.held", call=1)
    trace.flush()
    assert not path.exists() and not trace._pending


def test_unopenable_file_turns_tracing_off_with_a_warning(tracing: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "PATH", str(tracing / "no-such-dir" / "trace.jsonl"))
    with capture_logs() as logs:
        trace.event("proxy.held", call=1)
        trace.flush()
        trace.event("proxy.held", call=2)
        trace.flush()
    assert trace.ON is False and not trace._pending
    assert [entry["event"] for entry in logs] == ["cannot open the trace file; tracing off"]
    assert logs[0]["env"] == trace.ENV


def test_unwritable_file_stops_tracing_with_a_warning(tracing: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "_fd", os.open("/dev/null", os.O_RDONLY))  # write(2) fails: EBADF
    with capture_logs() as logs:
        trace.event("proxy.held", call=1)
        trace.flush()
    assert trace.ON is False
    assert [entry["event"] for entry in logs] == ["trace file not writable; tracing stopped"]


def test_a_forked_child_writes_its_own_events_only(tracing: Path) -> None:
    trace.event("parent.before")
    pid = os.fork()
    if pid == 0:  # the child: its pid in its lines, the parent's pending event not repeated
        try:
            trace.event("child")
            trace.flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    trace.flush()
    assert [(e["ev"], e["pid"]) for e in lines(tracing)] == [("child", pid), ("parent.before", os.getpid())]


def test_events_still_held_are_written_when_the_process_exits(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    code = "from runtimeproxy.common import trace\nfor n in range(3): trace.event('e', n=n)\nraise SystemExit(0)\n"
    subprocess.run([sys.executable, "-c", code], env={**os.environ, trace.ENV: str(path)}, check=True, timeout=60)
    assert [e["n"] for e in lines(path)] == [0, 1, 2]
