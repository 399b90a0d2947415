"""glibc malloc tuning: trimming works on this C library, keeps trimming until cancelled even when
nothing was free (malloc_trim answers 0 then), and does nothing where the C library lacks it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runtimeproxy.common import malloc


def test_trim_and_the_thresholds_work_on_glibc() -> None:
    assert malloc._malloc_trim() is not None
    assert malloc.return_large_blocks_to_the_kernel() is True


async def test_trim_every_goes_on_when_nothing_was_released(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def nothing_released(pad: int) -> int:
        calls.append(pad)
        return 0

    monkeypatch.setattr(malloc, "_malloc_trim", lambda: nothing_released)
    task = asyncio.create_task(malloc.trim_every(0.001))
    while len(calls) < 3:
        await asyncio.sleep(0.001)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_without_malloc_trim_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> Any:
        return None

    monkeypatch.setattr(malloc, "_libc_function", missing)
    assert malloc.return_large_blocks_to_the_kernel() is False
    await asyncio.wait_for(malloc.trim_every(0.001), 5)  # returns at once
