"""cached_logger: the logger structlog's lazy proxy would build, built once per configuration;
the lines it writes are byte for byte those of the uncached path, and a new configuration (or
capture_logs) reaches it at once."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from runtimeproxy.common import logs
from runtimeproxy.common.logs import cached_logger, configure_logging

CLOCK_NS = 1_700_000_000_123_456_789  # every line of a comparison gets the same timestamp


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


def configure(level: str, fmt: str) -> None:
    """configure_logging with the stamper's clock pinned, so two lines of one event are equal."""
    configure_logging(level, fmt)
    for processor in structlog.get_config()["processors"]:
        if isinstance(processor, logs._UTCStamper):
            processor._clock = lambda: CLOCK_NS


@contextlib.contextmanager
def stdout() -> Iterator[io.StringIO]:
    """What is written to stdout (no event loop here: every line is written at once)."""
    saved, sys.stdout = sys.stdout, io.StringIO()
    try:
        yield sys.stdout
    finally:
        sys.stdout = saved


def written(logger: Any, method: str, event: str, fields: dict[str, Any]) -> str:
    with stdout() as out:
        getattr(logger, method)(event, **fields)
    return out.getvalue()


names = st.sampled_from(["runtimeproxy.hooks", "runtimeproxy.relay", "", "x"])
methods = st.sampled_from(["debug", "info", "warning", "error", "critical", "exception"])
keys = st.text(min_size=1, max_size=8).filter(lambda key: key not in {"event", "exc_info"})
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.lists(st.text(max_size=6), max_size=3),
)


@given(
    st.sampled_from(["json", "console"]),
    st.sampled_from(["debug", "info", "error"]),
    names,
    methods,
    st.text(max_size=20),
    st.dictionaries(keys, values, max_size=6),
    st.dictionaries(st.text(min_size=1, max_size=6), st.text(max_size=6), max_size=2),
)
def test_a_cached_line_is_the_uncached_line(
    fmt: str, level: str, name: str, method: str, event: str, fields: dict[str, Any], bound: dict[str, str]
) -> None:
    configure(level, fmt)
    with structlog.contextvars.bound_contextvars(**bound):
        cached = written(cached_logger(name), method, event, fields)
        uncached = written(structlog.get_logger(name), method, event, fields)
    assert cached == uncached
    shown = logs.LEVELS["error" if method == "exception" else method] >= logs.LEVELS[level]
    assert bool(cached) is shown  # filtered or written, both ways


@pytest.mark.parametrize("exc_info", [True, False, None, "exception object", "exc_info tuple"])
def test_an_exception_line_is_structlogs_text(exc_info: Any) -> None:
    # The JSON renderer formats exc_info itself: the text of format_exc_info then JSONRenderer.
    configure("info", "json")
    try:
        raise RuntimeError("boom")
    except RuntimeError as error:
        given_info = {"exception object": error, "exc_info tuple": (RuntimeError, error, error.__traceback__)}
        fields = {"exc_info": given_info.get(exc_info, exc_info), "method": "StopContainer"}
        line = written(cached_logger("t"), "error", "failed", dict(fields))
        event = {"method": "StopContainer", **fields, "event": "failed", "level": "error"}
        event.update(logger="t", timestamp=logs._UTCStamper(lambda: CLOCK_NS)(None, "error", {})["timestamp"])
        formatted = structlog.processors.format_exc_info(None, "error", event)
        expected = structlog.processors.JSONRenderer()(None, "error", formatted)
    assert isinstance(expected, str)
    assert line == f"<3>{expected}\n"
    assert ('"exception": "Traceback' in line) is (exc_info not in (False, None))


def test_the_logger_is_built_once_per_configuration() -> None:
    configure_logging("info")
    first = cached_logger("runtimeproxy.hooks")
    assert cached_logger("runtimeproxy.hooks") is first
    assert cached_logger("runtimeproxy.relay") is not first
    configure_logging("info")  # new processors and wrapper class: built anew
    assert cached_logger("runtimeproxy.hooks") is not first


def test_a_new_configuration_reaches_the_next_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning")
    cached_logger("t").info("dropped")
    configure_logging("info")
    cached_logger("t").info("kept")
    structlog.configure(processors=[structlog.processors.KeyValueRenderer(key_order=["event"])])
    cached_logger("t").info("plain")
    assert capsys.readouterr().out.splitlines()[1:] == ["event='plain'"]


def test_capture_logs_sees_cached_lines_and_lets_go(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    cached_logger("t").info("before")  # built before the capture: capture_logs must still see it
    with capture_logs() as captured:
        cached_logger("t").info("inside", pod="default/web-0")
    cached_logger("t").info("after")
    assert captured == [{"event": "inside", "pod": "default/web-0", "log_level": "info"}]
    assert [line.split('"event": "')[1].split('"')[0] for line in capsys.readouterr().out.splitlines()] == [
        "before",
        "after",
    ]


def test_reset_defaults_reaches_a_cached_logger(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    cached_logger("t").info("json")
    structlog.reset_defaults()  # structlog's own defaults: no "<N>" prefix, no JSON
    cached_logger("t").info("default")
    json_line, default_line = capsys.readouterr().out.splitlines()
    assert json_line.startswith("<6>{")
    assert not default_line.startswith("<") and "default" in default_line
