"""PolicyWatcher reloads through inotify on the file's directory, and polls when it cannot watch."""

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
from runtimeproxy.hooks.policy import Policy, PolicyWatcher
from structlog.testing import capture_logs

from runtimeproxy.common import dirwatch

FOREVER = 3600.0  # a poll interval no test waits for: what is seen was seen through inotify
QUICK = 0.02
NEVER = 10**9  # a safety-net factor: a watched directory is then looked at on inotify events only
WITHIN = 10.0  # seconds to wait for a reload; a failure, not a measure
NOT_WATCHED = "policy file directory not watched; polling it"


def policy(interval: float) -> str:
    return f"reconciler: {{interval_seconds: {interval}}}\n"


def warnings(logs: Sequence[MutableMapping[str, Any]]) -> list[str]:
    return not_watched_errors(logs, "policy file directory")


class Reloads:
    """The watcher's on_change calls, awaitable."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Policy] = asyncio.Queue()

    async def next(self) -> float:
        return (await asyncio.wait_for(self.queue.get(), WITHIN)).reconciler.interval_seconds


@asynccontextmanager
async def watching(path: Path, poll_interval: float) -> AsyncIterator[tuple[PolicyWatcher, Reloads]]:
    reloads = Reloads()
    watcher = PolicyWatcher(path, reloads.queue.put_nowait, poll_interval=poll_interval)
    await watcher.start()
    try:
        yield watcher, reloads
    finally:
        await watcher.stop()


def replace(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.rename(temporary, path)


def configmap_version(directory: Path, name: str, text: str) -> None:
    """What kubelet's atomic writer does for a ConfigMap volume: a new timestamped directory,
    then the ``..data`` symlink swapped to it by rename, then the previous version removed; the
    file is a symlink through ``..data``."""
    data = directory / "..data"
    previous = os.readlink(data) if data.is_symlink() else None
    version = directory / name
    version.mkdir()
    (version / "policy.yaml").write_text(text)
    (directory / "..data_tmp").symlink_to(name)
    os.rename(directory / "..data_tmp", data)
    if previous is not None:
        shutil.rmtree(directory / previous)


async def test_edit_in_place_and_replacement_are_seen_without_polling(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy(5))
    async with watching(path, FOREVER) as (_, reloads):
        assert await reloads.next() == 5.0  # start's read
        path.write_text(policy(6))  # in place
        assert await reloads.next() == 6.0
        replace(path, policy(7))  # write + rename
        assert await reloads.next() == 7.0


async def test_configmap_symlink_swap_is_seen_without_polling(tmp_path: Path) -> None:
    configmap_version(tmp_path, "..2026_11_24_06_00_00.1", policy(5))
    path = tmp_path / "policy.yaml"
    path.symlink_to("..data/policy.yaml")
    async with watching(path, FOREVER) as (_, reloads):
        assert await reloads.next() == 5.0
        configmap_version(tmp_path, "..2026_11_24_06_01_00.2", policy(8))
        assert await reloads.next() == 8.0


async def test_file_created_after_start_is_seen_without_polling(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    async with watching(path, FOREVER) as (watcher, reloads):
        replace(path, policy(9))
        assert await reloads.next() == 9.0
        assert watcher.current.reconciler.interval_seconds == 9.0


async def test_stop_closes_the_watch(tmp_path: Path) -> None:
    fds = len(os.listdir("/proc/self/fd"))
    async with watching(tmp_path / "policy.yaml", FOREVER):
        assert len(os.listdir("/proc/self/fd")) == fds + 1
    assert len(os.listdir("/proc/self/fd")) == fds


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EMFILE, errno.ENOSYS])
async def test_without_inotify_it_polls_and_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    error = fail_inotify(monkeypatch, code, "inotify_init1")
    path = tmp_path / "policy.yaml"
    path.write_text(policy(5))
    with capture_logs() as logs:
        async with watching(path, QUICK) as (_, reloads):
            assert await reloads.next() == 5.0
            replace(path, policy(6))
            assert await reloads.next() == 6.0
            path.write_text(policy(7))
            assert await reloads.next() == 7.0  # several polls and retries by now
    assert warnings(logs) == [error]
    warning = next(e for e in logs if e["event"] == NOT_WATCHED)
    assert warning["directory"] == str(tmp_path) and warning["poll_interval_s"] == QUICK


async def test_missing_directory_is_polled_then_watched_once_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dirwatch, "SAFETY_NET_FACTOR", NEVER)  # once watched, only inotify tells
    directory = tmp_path / "policy"
    path = directory / "policy.yaml"
    with capture_logs() as logs:
        async with watching(path, QUICK) as (watcher, reloads):
            directory.mkdir()
            path.write_text(policy(5))
            assert await reloads.next() == 5.0
            while "policy file directory watched again" not in [e["event"] for e in logs]:
                await asyncio.sleep(QUICK)
            path.write_text(policy(6))
            assert await reloads.next() == 6.0
            assert watcher.current.reconciler.interval_seconds == 6.0
    assert warnings(logs) == ["inotify_add_watch: No such file or directory"]
    assert [e["event"] for e in logs].count("policy file directory watched again") == 1


async def test_safety_net_sees_a_symlink_target_edited_elsewhere(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "real.yaml").write_text(policy(5))
    watched = tmp_path / "watched"
    watched.mkdir()
    path = watched / "policy.yaml"
    path.symlink_to(elsewhere / "real.yaml")
    async with watching(path, QUICK) as (_, reloads):  # safety net: 10 x QUICK
        assert await reloads.next() == 5.0
        replace(elsewhere / "real.yaml", policy(6))  # no event in the watched directory
        assert await reloads.next() == 6.0
