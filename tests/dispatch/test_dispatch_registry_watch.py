"""The registry picks registrations up through inotify, and polls when it cannot watch."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from collections.abc import AsyncIterator, MutableMapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from inotify_faults import fail_inotify, not_watched_errors
from structlog.testing import capture_logs

from runtimeproxy.common import dirwatch
from runtimeproxy.common.dirwatch import DirWatch
from runtimeproxy.dispatch.registry import HookRegistry, HookServer

SOCK = "/var/run/koordlet/koordlet.sock"
FOREVER = 3600.0  # a poll interval no test waits for: what is seen was seen through inotify
QUICK = 0.02
NEVER = 10**9  # a safety-net factor: a watched directory is then rescanned on inotify events only
WITHIN = 10.0  # seconds to wait for a listener call; a failure, not a measure


def config(hook: str = "PreRunPodSandbox", index: int = 0) -> str:
    return f'{{"remote-endpoint": "{SOCK}", "runtime-hooks": ["{hook}"], "index": {index}}}'


def warnings(logs: Sequence[MutableMapping[str, Any]]) -> list[str]:
    return not_watched_errors(logs, "hook config directory")


class Changes:
    """The registry's listener calls, awaitable."""

    def __init__(self, registry: HookRegistry) -> None:
        self._queue: asyncio.Queue[list[HookServer]] = asyncio.Queue()
        registry.add_listener(self._queue.put_nowait)

    async def next(self) -> list[tuple[str, list[str]]]:
        servers = await asyncio.wait_for(self._queue.get(), WITHIN)
        return [(s.name, sorted(p.value for p in s.hooks)) for s in servers]


@asynccontextmanager
async def running(directory: Path, poll_interval: float) -> AsyncIterator[tuple[HookRegistry, Changes]]:
    registry = HookRegistry(str(directory), poll_interval=poll_interval)
    changes = Changes(registry)
    await registry.start()
    try:
        yield registry, changes
    finally:
        await registry.stop()


async def test_create_rewrite_replace_remove_are_seen_without_polling(tmp_path: Path) -> None:
    async with running(tmp_path, FOREVER) as (registry, changes):
        assert registry._watching()
        (tmp_path / "a.json").write_text(config())
        assert await changes.next() == [("a.json", ["PreRunPodSandbox"])]
        (tmp_path / "a.json").write_text(config("PostStopContainer"))  # in place
        assert await changes.next() == [("a.json", ["PostStopContainer"])]
        (tmp_path / ".b.tmp").write_text(config(index=-1))
        os.rename(tmp_path / ".b.tmp", tmp_path / "b.json")  # atomic replacement
        assert await changes.next() == [("b.json", ["PreRunPodSandbox"]), ("a.json", ["PostStopContainer"])]
        (tmp_path / "a.json").unlink()
        assert await changes.next() == [("b.json", ["PreRunPodSandbox"])]


async def test_stop_closes_the_watch(tmp_path: Path) -> None:
    fds = len(os.listdir("/proc/self/fd"))
    async with running(tmp_path, FOREVER) as (registry, _):
        assert len(os.listdir("/proc/self/fd")) == fds + 1
    assert len(os.listdir("/proc/self/fd")) == fds and registry._watch is None


async def test_safety_net_poll_sees_what_inotify_cannot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def deaf(self: DirWatch) -> None:  # a watch that is armed but never reports
        self._fd = os.open(os.devnull, os.O_RDONLY)

    monkeypatch.setattr(DirWatch, "open", deaf)
    async with running(tmp_path, QUICK) as (registry, changes):
        assert registry._watching()
        (tmp_path / "a.json").write_text(config())
        assert await changes.next() == [("a.json", ["PreRunPodSandbox"])]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EMFILE, errno.ENOSYS])
async def test_without_inotify_it_polls_and_logs_the_cause_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    error = fail_inotify(monkeypatch, code, "inotify_add_watch")
    with capture_logs() as logs:
        async with running(tmp_path, QUICK) as (registry, changes):
            (tmp_path / "a.json").write_text(config())
            assert await changes.next() == [("a.json", ["PreRunPodSandbox"])]
            (tmp_path / "a.json").unlink()
            assert await changes.next() == []  # several polls and retries by now
            assert not registry._watching()
    assert warnings(logs) == [error]


async def test_missing_directory_is_polled_then_watched_once_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dirwatch, "SAFETY_NET_FACTOR", NEVER)  # once watched, only inotify tells
    directory = tmp_path / "hookserver.d"
    with capture_logs() as logs:
        async with running(directory, QUICK) as (registry, changes):
            directory.mkdir()
            (directory / "a.json").write_text(config())
            assert await changes.next() == [("a.json", ["PreRunPodSandbox"])]
            while not registry._watching():
                await asyncio.sleep(QUICK)
            (directory / "b.json").write_text(config(index=1))
            assert [name for name, _ in await changes.next()] == ["a.json", "b.json"]
    assert warnings(logs) == ["inotify_add_watch: No such file or directory"]
    assert [e["event"] for e in logs].count("hook config directory watched again") == 1


@pytest.mark.parametrize("how", ["removed", "moved"])
async def test_directory_removed_or_moved_then_recreated(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dirwatch, "SAFETY_NET_FACTOR", NEVER)
    directory = tmp_path / "hookserver.d"
    directory.mkdir()
    (directory / "a.json").write_text(config())
    with capture_logs() as logs:
        async with running(directory, QUICK) as (registry, changes):
            assert await changes.next() == [("a.json", ["PreRunPodSandbox"])]  # start()'s scan
            if how == "removed":
                shutil.rmtree(directory)
            else:
                directory.rename(tmp_path / "old")
            assert await changes.next() == []
            directory.mkdir()
            (directory / "b.json").write_text(config())
            assert await changes.next() == [("b.json", ["PreRunPodSandbox"])]
            while not registry._watching():
                await asyncio.sleep(QUICK)
            (directory / "b.json").unlink()
            assert await changes.next() == []
    assert warnings(logs)[0] == "the directory was removed, moved or unmounted"
    assert [e["event"] for e in logs].count("hook config directory watched again") == 1
