"""Long loops on runtime-hooks' event loop, in slices: a reconcile round must not stall hook calls.

The server answers hook calls and runs the reconciler on one event loop. A reconcile handler that
walks every live pod without awaiting holds that loop for the whole walk (tens of ms with ~75 pods
on a 2-vCPU node, each pod a few cgroup reads), and a PreRunPodSandbox arriving meanwhile -- on a
pod start's path -- waits for all of it. :func:`paced` hands the items out in slices of at most
:data:`SLICE_SECONDS` of the consumer's work and gives the loop one turn between two slices, so such
a hook call waits for one slice at most. Time, not a count of items, bounds a slice: what one pod
costs varies tenfold with cold caches and the cgroup driver, and a quiet round then takes few turns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import TypeVar

__all__ = ["SLICE_SECONDS", "paced"]

#: The most a slice keeps the loop (plus the one item that crosses it): a hook call arriving
#: mid-round waits about this long, and a round of ~40 ms takes ~40 loop turns more.
SLICE_SECONDS = 0.001  # not Final: tests set it

_T = TypeVar("_T")


async def paced(items: Iterable[_T], budget: float | None = None) -> AsyncIterator[_T]:
    """``items`` one by one; once the consumer is done with an item, a loop turn
    (``asyncio.sleep(0)``) if ``budget`` seconds (default :data:`SLICE_SECONDS`, read at each call)
    have passed since the slice began. The first slice begins at the first item; the last item may
    be followed by a turn too (so is what the consumer does next). A cancellation (a plugin's
    timeout) is raised at such a turn, between two items."""
    clock = time.perf_counter
    seconds = SLICE_SECONDS if budget is None else budget
    until = clock() + seconds
    for item in items:
        yield item
        if clock() >= until:
            await asyncio.sleep(0)
            until = clock() + seconds
