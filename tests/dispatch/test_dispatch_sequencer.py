"""KeyedSequencer: per-key mutual exclusion, arrival order, cancellation at every stage."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy.dispatch.sequencer import KeyedSequencer

T = TypeVar("T")


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _user(seq: KeyedSequencer, order: list[T], hold: int = 0) -> Callable[[T], Coroutine[Any, Any, None]]:
    """A task body: take key "k", note ``name`` in ``order``, hold it ``hold`` loop turns, give it back."""

    async def user(name: T) -> None:
        keys = await seq.acquire(["k"])
        order.append(name)
        await _turns(hold)
        seq.release(keys)

    return user


def test_a_free_key_is_taken_without_yielding() -> None:
    async def main() -> None:
        seq = KeyedSequencer()
        coro = seq.acquire(["b", "a", "b"])
        try:
            coro.send(None)  # runs to the end at once: no await suspended it
        except StopIteration as done:
            assert done.value == ("a", "b")
        else:
            raise AssertionError("acquire of free keys suspended")
        assert len(seq) == 2
        seq.release(("a", "b"))
        assert len(seq) == 0

    asyncio.run(main())


def test_waiters_get_the_key_in_arrival_order() -> None:
    async def main() -> None:
        seq = KeyedSequencer()
        order: list[int] = []
        first = await seq.acquire(["k"])
        user = _user(seq, order, hold=2)
        tasks = [asyncio.create_task(user(i)) for i in range(4)]
        await _turns(3)
        assert order == []
        seq.release(first)
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3]
        assert len(seq) == 0

    asyncio.run(main())


def test_a_newcomer_queues_behind_a_waiter_that_was_handed_the_key() -> None:
    async def main() -> None:
        seq = KeyedSequencer()
        order: list[str] = []
        first = await seq.acquire(["k"])
        user = _user(seq, order)
        waiting = asyncio.create_task(user("waiter"))
        await _turns(1)
        seq.release(first)  # handed to the waiter, which has not run yet
        late = asyncio.create_task(user("newcomer"))
        await asyncio.gather(waiting, late)
        assert order == ["waiter", "newcomer"]
        assert len(seq) == 0

    asyncio.run(main())


def test_a_cancelled_waiter_is_skipped() -> None:
    async def main() -> None:
        seq = KeyedSequencer()
        order: list[int] = []
        first = await seq.acquire(["k"])
        user = _user(seq, order)
        tasks = [asyncio.create_task(user(i)) for i in range(3)]
        await _turns(1)
        tasks[1].cancel()
        await _turns(1)
        seq.release(first)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[1], asyncio.CancelledError)
        assert order == [0, 2]
        assert len(seq) == 0

    asyncio.run(main())


def test_a_waiter_cancelled_after_the_handover_passes_the_key_on() -> None:
    async def main() -> None:
        seq = KeyedSequencer()
        order: list[int] = []
        first = await seq.acquire(["k"])
        user = _user(seq, order)
        tasks = [asyncio.create_task(user(i)) for i in range(2)]
        await _turns(1)
        seq.release(first)  # task 0 owns the key now, but has not run
        tasks[0].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert order == [1]
        assert len(seq) == 0

    asyncio.run(main())


def test_cancelled_while_waiting_for_a_second_key_releases_the_first() -> None:
    async def main() -> None:
        seq = KeyedSequencer()
        b = await seq.acquire(["b"])
        task = asyncio.create_task(seq.acquire(["a", "b"]))
        await _turns(1)
        assert len(seq) == 2  # "a" taken, waiting for "b"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert len(seq) == 1
        assert await seq.acquire(["a"]) == ("a",)  # free again, at once
        seq.release(("a",))
        seq.release(b)
        assert len(seq) == 0

    asyncio.run(main())


# A script: per task, its keys, how many loop turns it holds them, and when (if ever) it is cancelled.
_task = st.tuples(
    st.lists(st.sampled_from("abc"), min_size=1, max_size=3),
    st.integers(0, 3),
    st.none() | st.integers(0, 6),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_task, min_size=1, max_size=8))
def test_keys_are_exclusive_and_fifo_whatever_is_cancelled(script: list[tuple[list[str], int, int | None]]) -> None:
    async def main() -> None:
        seq = KeyedSequencer()
        holders: dict[str, int] = {}
        granted: list[int] = []  # single-key tasks, in the order they got their key

        async def user(i: int, keys: list[str], hold: int) -> None:
            held = await seq.acquire(keys)
            assert sorted(held) == sorted(set(keys))
            for key in held:
                assert key not in holders, f"{key} held by {holders.get(key)} and {i}"
                holders[key] = i
            granted.append(i)
            try:
                await _turns(hold)
            finally:
                for key in held:
                    del holders[key]
                seq.release(held)

        tasks = []
        for i, (keys, hold, _) in enumerate(script):
            tasks.append(asyncio.create_task(user(i, keys, hold)))
            await asyncio.sleep(0)  # arrival order = task order
        for turn in range(8):
            for task, (_, _, cancel_at) in zip(tasks, script, strict=True):
                if cancel_at == turn:
                    task.cancel()
            await asyncio.sleep(0)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        assert len(seq) == 0
        assert not holders
        for i, result in enumerate(results):
            assert result is None or isinstance(result, asyncio.CancelledError), result
            if result is None:
                assert i in granted
        # Among tasks that wait on one same single key, those granted got it in arrival order.
        for key in "abc":
            single = [i for i in granted if set(script[i][0]) == {key}]
            assert single == sorted(single)

    asyncio.run(main())
