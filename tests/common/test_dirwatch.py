"""The inotify directory watch: the kernel record parser and the watch on a real directory."""

from __future__ import annotations

import asyncio
import errno
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from runtimeproxy.common import dirwatch
from runtimeproxy.common.dirwatch import DirWatch, InotifyEvent, parse_events

HEADER = struct.Struct("=iIII")


def record(event: InotifyEvent, padding: int) -> bytes:
    """``event`` as the kernel lays it out: a named event's name NUL-terminated plus ``padding``
    more NULs, an event on the directory itself with no name bytes at all."""
    name = os.fsencode(event.name)
    body = name + b"\0" * (1 + padding) if name else b""
    return HEADER.pack(event.wd, event.mask, event.cookie, len(body)) + body


names = st.binary(min_size=1, max_size=255).filter(lambda n: b"\0" not in n and b"/" not in n).map(os.fsdecode)
inotify_events = st.builds(
    InotifyEvent,
    wd=st.integers(-(2**31), 2**31 - 1),
    mask=st.integers(0, 2**32 - 1),
    cookie=st.integers(0, 2**32 - 1),
    name=st.just("") | names,
)


@settings(max_examples=200)
@given(records=st.lists(st.tuples(inotify_events, st.integers(0, 20)), max_size=8), cut=st.integers(0, 10_000))
def test_records_parse_back_and_a_truncated_buffer_keeps_only_whole_records(
    records: list[tuple[InotifyEvent, int]], cut: int
) -> None:
    encoded = [record(event, padding) for event, padding in records]
    data = b"".join(encoded)
    assert parse_events(data) == ([event for event, _ in records], 0)
    prefix = data[: min(cut, len(data))]
    whole, size = [], 0
    for (event, _), raw in zip(records, encoded, strict=True):
        if size + len(raw) > len(prefix):
            break
        whole.append(event)
        size += len(raw)
    assert parse_events(prefix) == (whole, len(prefix) - size)


@given(data=st.binary(max_size=200))
def test_any_bytes_parse_without_error(data: bytes) -> None:
    events, rest = parse_events(data)
    assert 0 <= rest <= len(data)
    assert len(events) * HEADER.size <= len(data) - rest


# --- the watch on a real directory -------------------------------------------------------------


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


class Counter:
    def __init__(self) -> None:
        self.calls = 0
        self.called = asyncio.Event()

    def __call__(self) -> None:
        self.calls += 1
        self.called.set()

    async def next_call(self) -> None:
        await asyncio.wait_for(self.called.wait(), timeout=10)
        self.called.clear()


async def settle() -> None:
    """Let the loop run ready callbacks (a pending inotify read among them) a few times."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_many_events_in_one_read_make_one_call(tmp_path: Path) -> None:
    counter = Counter()
    watch = DirWatch(str(tmp_path), counter)
    watch.open()
    try:
        for number in range(50):  # all queued before the loop reads once
            (tmp_path / f"f{number}.json").write_text("{}")
        await counter.next_call()
        await settle()
        assert counter.calls == 1 and watch.active
    finally:
        watch.close()
        watch.close()  # idempotent
    assert not watch.active


@pytest.mark.parametrize("change", ["create", "rewrite", "remove", "rename-in", "rename-out", "chmod"])
async def test_each_kind_of_change_is_reported(tmp_path: Path, change: str) -> None:
    (tmp_path / "a.json").write_text("{}")
    (tmp_path.parent / f"{tmp_path.name}-outside").write_text("{}")
    counter = Counter()
    watch = DirWatch(str(tmp_path), counter)
    watch.open()
    try:
        actions: dict[str, Callable[[], object]] = {
            "create": lambda: (tmp_path / "b.json").write_text("{}"),
            "rewrite": lambda: (tmp_path / "a.json").write_text('{"x": 1}'),
            "remove": lambda: (tmp_path / "a.json").unlink(),
            "rename-in": lambda: (tmp_path.parent / f"{tmp_path.name}-outside").rename(tmp_path / "c.json"),
            "rename-out": lambda: (tmp_path / "a.json").rename(tmp_path.parent / f"{tmp_path.name}-gone"),
            "chmod": lambda: (tmp_path / "a.json").chmod(0o600),
        }
        actions[change]()
        await counter.next_call()
        assert watch.active
    finally:
        watch.close()


@pytest.mark.parametrize("how", ["removed", "moved"])
async def test_watch_ends_when_the_directory_goes(tmp_path: Path, how: str) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    counter = Counter()
    watch = DirWatch(str(directory), counter)
    watch.open()
    fds = open_fds()
    if how == "removed":
        directory.rmdir()
    else:
        directory.rename(tmp_path / "elsewhere")
    while watch.active:
        await counter.next_call()
    assert len(open_fds()) == len(fds) - 1  # the inotify instance is closed
    watch.close()


@pytest.mark.parametrize(
    ("make", "code"),
    [(lambda p: None, errno.ENOENT), (lambda p: p.write_text(""), errno.ENOTDIR)],
    ids=["missing", "a-file"],
)
async def test_open_fails_with_the_cause_and_leaves_nothing_open(
    tmp_path: Path, make: Callable[[Path], object], code: int
) -> None:
    path = tmp_path / "x"
    make(path)
    fds = open_fds()
    with pytest.raises(OSError) as raised:
        DirWatch(str(path), lambda: None).open()
    assert raised.value.errno == code
    assert "inotify_add_watch" in str(raised.value)
    assert open_fds() == fds


async def test_open_fails_off_linux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dirwatch._Libc, "_functions", None)
    monkeypatch.setattr(dirwatch, "_LINUX", False)
    with pytest.raises(OSError) as raised:
        DirWatch(str(tmp_path), lambda: None).open()
    assert raised.value.errno == errno.ENOSYS


def encoded(*events: InotifyEvent) -> bytes:
    return b"".join(record(event, 3) for event in events)


def test_queue_overflow_is_a_change_and_the_watch_stays() -> None:
    watch = DirWatch("/nowhere", lambda: None)
    watch._fd = 10**6  # pretend open: _handle closes only when the watch is over
    watch._handle(encoded(InotifyEvent(-1, dirwatch.IN_Q_OVERFLOW, 0, "")))
    assert watch.active


@pytest.mark.parametrize(
    "mask", [dirwatch.IN_IGNORED, dirwatch.IN_DELETE_SELF, dirwatch.IN_MOVE_SELF, dirwatch.IN_UNMOUNT]
)
def test_events_that_end_the_watch(mask: int, monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[int] = []
    monkeypatch.setattr(os, "close", closed.append)
    watch = DirWatch("/nowhere", lambda: None)
    watch._fd = 10**6
    watch._handle(encoded(InotifyEvent(1, dirwatch.IN_CREATE, 0, "a.json"), InotifyEvent(1, mask, 0, "")))
    assert not watch.active and closed == [10**6]


def test_truncated_read_is_logged_and_its_whole_records_still_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "close", lambda fd: None)
    watch = DirWatch("/nowhere", lambda: None)
    watch._fd = 10**6
    data = encoded(InotifyEvent(1, dirwatch.IN_DELETE_SELF, 0, ""), InotifyEvent(1, dirwatch.IN_CREATE, 0, "b.json"))
    with capture_logs() as logs:
        watch._handle(data[:-2])
    assert [(e["event"], e["bytes_left"]) for e in logs] == [("inotify read ended inside a record", len(data) - 18)]
    assert not watch.active  # the whole DELETE_SELF record before the cut was applied
