"""Lines logged on an event loop's thread leave in one write(2) per loop turn; other lines at once."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import structlog

from runtimeproxy.common import logs
from runtimeproxy.common.logs import configure_logging, get_logger


class Recorder:
    """A stdout that keeps each write apart, to count them."""

    def __init__(self, fail: bool = False) -> None:
        self.writes: list[str] = []
        self.fail = fail

    def write(self, text: str) -> int:
        if self.fail:
            raise OSError(32, "Broken pipe")
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    @contextlib.contextmanager
    def installed(self) -> Iterator[Recorder]:
        """As sys.stdout, inside a test's body: pytest re-installs its capture after fixture setup."""
        saved, sys.stdout = sys.stdout, self
        try:
            yield self
        finally:
            logs.flush()
            sys.stdout = saved

    def events(self) -> list[list[str]]:
        """Per write, the events of its lines."""
        return [[line.split('"event": "')[1].split('"')[0] for line in w.splitlines()] for w in self.writes]


@pytest.fixture
def out() -> Iterator[Recorder]:
    """A Recorder for the test to install around what it logs."""
    configure_logging("debug", "json")
    yield Recorder()
    structlog.reset_defaults()


log = get_logger("runtimeproxy.test")


def test_one_turn_is_one_write_in_order(out: Recorder) -> None:
    async def main() -> None:
        log.info("a")
        log.debug("b")
        log.warning("c")
        assert out.writes == []  # collected, not yet written
        await asyncio.sleep(0)  # the flush scheduled by "a" runs before this task resumes
        assert out.events() == [["a", "b", "c"]]
        log.info("d")
        await asyncio.sleep(0)

    with out.installed():
        asyncio.run(main())
    assert out.events() == [["a", "b", "c"], ["d"]]


def test_no_running_loop_writes_at_once(out: Recorder) -> None:
    with out.installed():
        log.info("a")
        assert out.events() == [["a"]]
        log.info("b")
        assert out.events() == [["a"], ["b"]]


def test_another_thread_writes_at_once(out: Recorder) -> None:
    seen: list[list[list[str]]] = []

    def in_thread() -> None:
        log.info("threaded")
        seen.append(out.events())

    async def main() -> None:
        await asyncio.to_thread(in_thread)

    with out.installed():
        asyncio.run(main())
    assert seen == [[["threaded"]]]


def test_error_lines_go_out_at_once_after_collected_ones(out: Recorder) -> None:
    async def main() -> None:
        log.info("before")
        log.error("failed")
        assert out.events() == [["before", "failed"]]  # one write, the collected line first
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("crashed")
        log.critical("down")
        assert out.events() == [["before", "failed"], ["crashed"], ["down"]]

    with out.installed():
        asyncio.run(main())


def test_a_direct_line_keeps_order_with_collected_ones(out: Recorder) -> None:
    async def main() -> None:
        log.info("collected")
        thread = threading.Thread(target=lambda: log.info("direct"))
        thread.start()
        thread.join()  # blocks the loop: the turn's flush has not run
        log.info("after")
        await asyncio.sleep(0)

    with out.installed():
        asyncio.run(main())
    assert out.events() == [["collected", "direct"], ["after"]]


def test_lines_of_a_closed_loops_last_turn_go_out_with_the_next_write(out: Recorder) -> None:
    loop = asyncio.new_event_loop()
    loop.call_soon(log.info, "last turn")
    loop.call_soon(loop.stop)  # the loop stops after this turn, before the flush it scheduled
    with out.installed():
        loop.run_forever()
        loop.close()  # drops the scheduled flush
        assert out.writes == []
        log.info("next")
    assert out.events() == [["last turn", "next"]]


def test_a_failed_flush_names_the_cause_on_stderr(out: Recorder, capsys: pytest.CaptureFixture[str]) -> None:
    async def main() -> None:
        log.info("a")
        log.info("b")
        await asyncio.sleep(0)

    with Recorder(fail=True).installed():
        asyncio.run(main())
    assert "2 log lines lost: BrokenPipeError" in capsys.readouterr().err


def _run(code: str) -> subprocess.CompletedProcess[str]:
    prelude = (
        "import asyncio, os, signal\n"
        "from runtimeproxy.common.logs import configure_logging, get_logger\n"
        "configure_logging('info', 'json')\n"
        "log = get_logger('t')\n"
    )
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60)


def test_collected_lines_are_written_at_exit() -> None:
    code = "async def main():\n    log.info('last words')\n    raise SystemExit(3)\nasyncio.run(main())\n"
    done = _run(code)
    assert done.returncode == 3
    assert '"event": "last words"' in done.stdout


def test_sigkill_loses_only_the_interrupted_turns_info_lines() -> None:
    code = (
        "async def main():\n"
        "    log.info('flushed')\n"
        "    await asyncio.sleep(0)\n"
        "    log.info('lost')\n"
        "    log.error('at once')\n"
        "    log.info('lost too')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n"
    )
    done = _run(code)
    assert done.returncode == -9
    events = [line.split('"event": "')[1].split('"')[0] for line in done.stdout.splitlines()]
    assert events == ["flushed", "lost", "at once"]  # the error line took the collected one along


def test_stdout_is_looked_up_per_write(out: Recorder) -> None:
    later = Recorder()

    async def main() -> None:
        log.info("a")
        with later.installed():
            await asyncio.sleep(0)

    with out.installed():
        asyncio.run(main())
    assert out.writes == []
    assert later.events() == [["a"]]


def test_a_forked_child_does_not_write_its_parents_lines() -> None:
    code = (
        "import sys\n"
        "async def main():\n"
        "    log.info('parent line')\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        sys.exit(0)  # the child's exit flush: nothing of the parent's to write\n"
        "    os.waitpid(pid, 0)\n"
        "asyncio.run(main())\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count('"event": "parent line"') == 1


def test_held_lines_wait_for_the_last_release(out: Recorder) -> None:
    async def main() -> None:
        first, second = logs.hold(), logs.hold()
        log.info("a")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert out.writes == []  # an answer is in flight: its lines wait
        first()
        first()  # a second release of the same hold changes nothing
        assert out.writes == []
        second()
        assert out.events() == [["a"]]  # the last release writes them
        log.info("b")
        await asyncio.sleep(0)  # no hold: back to one write per turn

    with out.installed():
        asyncio.run(main())
    assert out.events() == [["a"], ["b"]]


def test_held_lines_of_the_holding_thread_skip_the_loop_lookup_and_others_write_at_once(
    out: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[object] = []
    real = logs._running_loop
    monkeypatch.setattr(logs, "_running_loop", lambda: looks.append(None) or real())
    threaded: list[list[list[str]]] = []

    def in_thread() -> None:
        log.info("threaded")
        threaded.append(out.events())

    async def main() -> None:
        release = logs.hold()
        log.info("a")
        log.info("b")
        assert looks == []  # the release writes them: no flush to schedule, no loop to find
        await asyncio.to_thread(in_thread)  # a thread that holds nothing writes at once, after what is collected
        release()
        log.info("c")  # not held: collected for the turn's flush, which needs the loop
        assert len(looks) == 2  # the thread's look and this one
        await asyncio.sleep(0)

    with out.installed():
        asyncio.run(main())
    assert threaded == [[["a", "b", "threaded"]]]
    assert out.events() == [["a", "b", "threaded"], ["c"]]


def test_error_lines_are_not_held(out: Recorder) -> None:
    async def main() -> None:
        release = logs.hold()
        log.info("a")
        log.error("b")
        assert out.events() == [["a", "b"]]
        release()

    with out.installed():
        asyncio.run(main())


class Shown:
    """A value JSON has no type for: the renderer shows its repr, and here counts how often it did."""

    def __init__(self) -> None:
        self.shown = 0

    def __repr__(self) -> str:
        self.shown += 1
        return "shown"


def test_held_lines_are_rendered_when_written_with_the_time_they_were_logged(out: Recorder) -> None:
    value = Shown()

    async def main() -> None:
        release = logs.hold()
        log.info("a", value=value)
        logged = time.time()
        await asyncio.sleep(0.05)
        assert value.shown == 0  # not rendered while the answer is in flight
        release()
        assert value.shown == 1
        line = json.loads(out.writes[0].split(">", 1)[1])
        stamp = datetime.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()
        assert line["value"] == "shown" and line["level"] == "info"
        assert stamp <= logged  # stamped when logged, not when written

    with out.installed():
        asyncio.run(main())


def test_held_lines_are_processed_only_when_written_with_the_context_of_their_logging(out: Recorder) -> None:
    processed: list[str] = []

    def note(logger: object, method: str, event_dict: dict[str, object]) -> dict[str, object]:
        processed.append(str(event_dict["event"]))
        return event_dict

    structlog.get_config()["processors"].insert(0, note)  # the chain as configured, one step in front

    async def main() -> None:
        release = logs.hold()
        structlog.contextvars.bind_contextvars(request="r1")
        log.info("a")
        structlog.contextvars.bind_contextvars(request="r2")  # after the line: not its context
        log.info("b")
        structlog.contextvars.clear_contextvars()
        await asyncio.sleep(0.01)
        assert processed == []  # no processor ran before the answer
        release()
        assert processed == ["a", "b"]
        lines = [json.loads(line.split(">", 1)[1]) for line in out.writes[0].splitlines()]
        assert [(line["event"], line["request"]) for line in lines] == [("a", "r1"), ("b", "r2")]

    with out.installed():
        asyncio.run(main())


def test_a_held_line_a_processor_drops_is_not_written(out: Recorder) -> None:
    async def main() -> None:
        with structlog.testing.capture_logs() as captured:
            release = logs.hold()
            log.info("kept for the capture")
            assert captured == []
            release()
        assert [entry["event"] for entry in captured] == ["kept for the capture"]
        assert out.writes == []

    with out.installed():
        asyncio.run(main())


def test_a_line_logged_with_a_traceback_is_rendered_at_once_and_keeps_the_order(out: Recorder) -> None:
    value = Shown()

    async def main() -> None:
        release = logs.hold()
        log.info("a", value=value)
        try:
            raise KeyError("gone")
        except KeyError:
            log.warning("b", exc_info=True)  # its traceback is the one being handled: rendered now
        log.error("c")  # written at once, after the held lines, which are rendered for it
        assert value.shown == 1
        assert out.events() == [["a", "b", "c"]]
        assert "KeyError: 'gone'" in out.writes[0]
        release()

    with out.installed():
        asyncio.run(main())


def test_held_lines_are_written_at_the_cap_in_order_and_none_is_lost(
    out: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler that logs a flood while its answer is held has its lines written as the cap is
    reached: memory stays bounded, the order and every line are kept."""
    monkeypatch.setattr(logs, "HELD_LINES_MAX", 4)

    async def main() -> None:
        release = logs.hold()
        for n in range(10):
            log.info(f"line {n}")
        assert out.events() == [[f"line {n}" for n in range(4)], [f"line {n}" for n in range(4, 8)]]
        release()
        assert out.events()[-1] == ["line 8", "line 9"]  # the rest, at the release

    with out.installed():
        asyncio.run(main())
    assert [event for write in out.events() for event in write] == [f"line {n}" for n in range(10)]


def test_lines_collected_while_another_thread_holds_are_capped_too(
    out: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "HELD_LINES_MAX", 3)
    held = threading.Event()
    done = threading.Event()

    def holder() -> None:  # another thread's answer in flight: loop turns do not flush meanwhile
        release = logs.hold()
        held.set()
        done.wait(10)
        release()

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)

    async def main() -> None:
        for n in range(5):
            log.info(f"line {n}")
            await asyncio.sleep(0)
        assert out.events() == [["line 0", "line 1", "line 2"]]

    try:
        with out.installed():
            asyncio.run(main())
            done.set()
            thread.join(10)
    finally:
        done.set()
    assert [event for write in out.events() for event in write] == [f"line {n}" for n in range(5)]
