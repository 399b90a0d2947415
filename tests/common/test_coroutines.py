"""never_suspends: which ``async def`` functions can run to their end without suspending."""

from __future__ import annotations

import asyncio
import dis
import gc
import inspect
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import pytest

from runtimeproxy.common.coroutines import never_suspends


async def plain(value: int) -> int:
    return value + 1


async def awaits() -> None:
    await asyncio.sleep(0)


async def iterates(items: AsyncIterator[int]) -> int:
    total = 0
    async for item in items:
        total += item
    return total


async def enters(lock: asyncio.Lock) -> None:
    async with lock:
        pass


async def awaits_in_a_branch_not_taken(flag: bool) -> None:
    if flag:
        await asyncio.sleep(0)


async def defines_an_inner_coroutine() -> Callable[[], Any]:
    async def inner() -> None:
        await asyncio.sleep(0)

    return inner  # the outer one itself never suspends


def sync(value: int) -> int:
    return value


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (plain, True),
        (defines_an_inner_coroutine, True),
        (awaits, False),
        (iterates, False),
        (enters, False),
        (awaits_in_a_branch_not_taken, False),  # could suspend: that is what counts
        (sync, False),
        (partial(plain, 1), False),
    ],
)
def test_only_an_async_def_with_no_await_never_suspends(fn: Callable[..., Any], expected: bool) -> None:
    assert never_suspends(fn) is expected


def _suspends_by_dis(fn: Any) -> bool:
    names = {"GET_AWAITABLE", "GET_AITER", "GET_ANEXT", "BEFORE_ASYNC_WITH", "END_ASYNC_FOR", "SEND", "YIELD_VALUE"}
    return any(op.opname in names for op in dis.get_instructions(fn.__code__))


def test_the_bytecode_scan_agrees_with_dis_on_every_loaded_coroutine_function() -> None:
    # the plugins, the runner, the NRI service, the hook server, the reconciler

    functions = [o for o in gc.get_objects() if inspect.isfunction(o) and inspect.iscoroutinefunction(o)]
    assert len(functions) > 100
    disagree = [fn.__qualname__ for fn in functions if never_suspends(fn) == _suspends_by_dis(fn)]
    assert disagree == []
