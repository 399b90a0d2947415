"""The OOM score in NRI mode (hooks/nri/oom.py) against a fake /proc: raised only, never lowered,
never written to a process outside the container, and every other outcome a reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.nri.oom import OomApplied, OomNotApplied, OomScores

CID = "c0ffee" * 10


def fake_process(proc: Path, pid: int, oom: str, cgroup: str = f"4:cpu,cpuacct:/kubepods/pod1/{CID}\n") -> Path:
    directory = proc / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup").write_text(cgroup)
    (directory / "oom_score_adj").write_text(oom)
    return directory / "oom_score_adj"


def test_a_remembered_score_is_raised_once_and_only_then(tmp_path: Path) -> None:
    oom_file = fake_process(tmp_path, 42, "500\n")
    scores = OomScores(tmp_path)
    assert scores.remember(CID, 1000) == []
    assert scores.apply(CID, 42) == OomApplied(42, 500, 1000)
    assert oom_file.read_text() == "1000\n"
    assert scores.apply(CID, 42) is None  # applied once; nothing pending now
    assert scores.apply("other", 42) is None  # nothing remembered for it


def test_a_higher_score_is_never_lowered(tmp_path: Path) -> None:
    oom_file = fake_process(tmp_path, 42, "1000\n")
    scores = OomScores(tmp_path)
    scores.remember(CID, 900)
    applied = scores.apply(CID, 42)
    assert applied == OomApplied(42, 1000, 1000) and not applied.raised
    assert oom_file.read_text() == "1000\n"


@pytest.mark.parametrize(
    ("pid", "setup", "reason"),
    [
        (0, None, "the runtime gave no pid"),
        (7, None, "process 7 is gone"),
        (42, "0::/other/container\n", "not in the container's cgroup"),
    ],
)
def test_what_cannot_be_applied_says_why(tmp_path: Path, pid: int, setup: str | None, reason: str) -> None:
    if setup is not None:
        oom_file = fake_process(tmp_path, pid, "0\n", cgroup=setup)
    scores = OomScores(tmp_path)
    scores.remember(CID, 1000)
    with pytest.raises(OomNotApplied, match=reason):
        scores.apply(CID, pid)
    if setup is not None:
        assert oom_file.read_text() == "0\n"  # a reused pid is never touched
    assert scores.apply(CID, pid) is None  # given up, not retried


def test_an_unwritable_file_is_a_reason(tmp_path: Path) -> None:
    oom_file = fake_process(tmp_path, 42, "0\n")
    oom_file.unlink()
    oom_file.mkdir()  # reading fails: EISDIR
    scores = OomScores(tmp_path)
    scores.remember(CID, 1000)
    with pytest.raises(OomNotApplied, match="/proc/42/oom_score_adj"):
        scores.apply(CID, 42)


def test_remember_refuses_what_the_kernel_would_and_forgets_stopped_containers(tmp_path: Path) -> None:
    scores = OomScores(tmp_path, limit=2)
    for bad in (1001, -1001):
        with pytest.raises(ValueError, match=r"outside -1000\.\.1000"):
            scores.remember(CID, bad)
    with pytest.raises(ValueError, match="no container id"):
        scores.remember("", 1000)
    scores.remember("a", 1000)
    assert scores.forget("a") == 1000 and scores.forget("a") is None
    assert scores.remember("a", 1) == [] and scores.remember("b", 2) == []
    assert scores.remember("c", 3) == ["a"]  # the oldest goes past the limit
    assert len(scores) == 2


@given(st.one_of(st.integers(-5000, 5000).map(str), st.text(max_size=12)))
def test_any_file_content_gives_a_value_or_a_reason(content: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        proc = Path(directory)
        fake_process(proc, 42, content)
        scores = OomScores(proc)
        scores.remember(CID, 1000)
        try:
            value = int(content.strip())
        except ValueError:
            value = None
        if value is not None and -1000 <= value <= 1000:
            applied = scores.apply(CID, 42)
            assert applied == OomApplied(42, value, 1000)
        else:
            with pytest.raises(OomNotApplied, match="oom_score_adj holds"):
                scores.apply(CID, 42)
