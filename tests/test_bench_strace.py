"""bench/nri_peer_bench.py reading strace -f output: time inside the plugin per event and the file
calls made meanwhile, with calls that another thread interrupted joined again."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from bench_scripts import bench_module
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def peer() -> ModuleType:
    return bench_module("nri_peer_bench")


def hexed(data: bytes) -> str:
    return "".join(f"\\x{byte:02x}" for byte in data)


CREATE = hexed(b"\x00" * 18 + b"nri.pkg.api.v1alpha1.Plugin\x12\x0fCreateContainer")


def test_an_event_split_by_another_thread_is_timed_and_its_file_calls_counted(peer: ModuleType, tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text(
        "\n".join([
            f'7 10.000000 read(9, "{CREATE}"..., 65536) = 120 <0.000100>',
            '8 10.000200 openat(AT_FDCWD, "\\x2f\\x73", O_RDONLY|O_CLOEXEC <unfinished ...>',
            '7 10.000300 newfstatat(AT_FDCWD, "\\x2f", {...}, 0) = 0 <0.000010>',
            "8 10.000400 <... openat resumed>) = 11 <0.000200>",
            "7 10.000500 futex(0x1, FUTEX_WAKE, 1) = 0 <0.000005>",
            '8 10.000900 write(9, "\\x00\\x01"..., 18 <unfinished ...>',
            '7 10.001000 write(11, "\\x35", 1) = 1 <0.000010>',
            "8 10.001100 <... write resumed>) = 18 <0.000200>",
        ])
        + "\n"
    )
    times, calls = peer.inside_times(trace)
    assert times["CreateContainer"] == [pytest.approx(0.0009 - 0.0001)]  # read's end to the answer's start
    assert calls["CreateContainer"] == [2]  # the open (begun before the stat) and the stat; not the write


@given(st.lists(st.sampled_from(["openat", "newfstatat", "mkdir", "futex", "epoll_pwait", "getpid"]), max_size=20))
def test_only_file_calls_between_request_and_answer_count(peer: ModuleType, names: list[str]) -> None:
    lines = [f'5 1.000000 read(3, "{CREATE}"..., 4096) = 90 <0.000010>']
    lines += [f'5 1.{n + 1:06d} {name}(AT_FDCWD, "\\x2f") = 0 <0.000001>' for n, name in enumerate(names)]
    lines += ['5 2.000000 write(3, "\\x00"..., 18) = 18 <0.000010>']
    lines += ['5 2.000100 openat(AT_FDCWD, "\\x2f") = 4 <0.000001>']  # after the answer: not counted
    _, calls = peer.inside_of(lines)
    assert calls["CreateContainer"] == [sum(name in ("openat", "newfstatat", "mkdir") for name in names)]
