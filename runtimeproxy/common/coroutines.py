"""Whether an ``async def`` function can ever suspend: the hook runner and our gRPC server run a
coroutine that cannot at once, in the caller, without a task of its own and the loop turns that
costs."""

from __future__ import annotations

import dis
import inspect
from collections.abc import Callable
from typing import Any, Final

__all__ = ["never_suspends"]

# The opcodes through which a coroutine can suspend (CPython 3.11-3.13): await, async for, async
# with, and the yields they are built on. A code object with none of them runs to its end at once.
_SUSPENDING_OPS: Final = frozenset(
    {"GET_AWAITABLE", "GET_AITER", "GET_ANEXT", "BEFORE_ASYNC_WITH", "END_ASYNC_FOR", "SEND", "YIELD_VALUE"}
)
_SUSPENDING_CODES: Final = frozenset(dis.opmap[name] for name in _SUSPENDING_OPS if name in dis.opmap)


def never_suspends(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is an ``async def`` function that cannot suspend. Anything else (a wrapper
    object, a partial, a sync function) answers False: it is run the general way."""
    if not (inspect.isfunction(fn) and inspect.iscoroutinefunction(fn)):
        return False
    # co_code is wordcode: an opcode at every even offset (inline caches read as CACHE, arguments
    # sit at odd offsets); scanned as bytes, a check takes microseconds, not dis's milliseconds.
    return _SUSPENDING_CODES.isdisjoint(fn.__code__.co_code[::2])
