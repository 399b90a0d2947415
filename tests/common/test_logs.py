from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
import structlog

from runtimeproxy.common.logs import configure_logging, debug_enabled, get_logger

PREFIXED = re.compile(r"^<(\d)>(\{.*\})$")


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


def lines(out: str) -> list[tuple[int, dict[str, object]]]:
    parsed = []
    for line in out.splitlines():
        match = PREFIXED.match(line)
        assert match, f"line without <N> prefix: {line!r}"
        parsed.append((int(match[1]), json.loads(match[2])))
    return parsed


def test_json_lines_carry_priority_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("debug", "json")
    log = get_logger("runtimeproxy.test")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    log.critical("c")
    got = lines(capsys.readouterr().out)
    assert [(prio, rec["level"]) for prio, rec in got] == [
        (7, "debug"),
        (6, "info"),
        (4, "warning"),
        (3, "error"),
        (2, "critical"),
    ]


def test_json_fields(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    get_logger("runtimeproxy.relay").info("call done", method="Version", code="OK")
    [(_, rec)] = lines(capsys.readouterr().out)
    assert rec["event"] == "call done"
    assert rec["logger"] == "runtimeproxy.relay"
    assert rec["method"] == "Version"
    assert rec["code"] == "OK"
    stamp = datetime.fromisoformat(str(rec["timestamp"]).replace("Z", "+00:00"))
    assert stamp.utcoffset() == timedelta(0)


def test_contextvars_are_merged(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    log = get_logger("t")
    with structlog.contextvars.bound_contextvars(request_id="r-1", pod="web-0"):
        log.info("inside")
    log.info("outside")
    (_, inside), (_, outside) = lines(capsys.readouterr().out)
    assert inside["request_id"] == "r-1"
    assert inside["pod"] == "web-0"
    assert "request_id" not in outside


def test_exception_is_rendered_into_json(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger("t").exception("failed")
    [(prio, rec)] = lines(capsys.readouterr().out)
    assert prio == 3
    assert "RuntimeError: boom" in str(rec["exception"])


def test_filtering_drops_lower_levels(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning")
    log = get_logger("t")
    log.debug("no")
    log.info("no")
    log.warning("yes")
    log.error("yes too")
    got = lines(capsys.readouterr().out)
    assert [rec["event"] for _, rec in got] == ["yes", "yes too"]
    assert not debug_enabled()


def test_disabled_level_does_not_run_processors(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")

    class Exploding:
        def __repr__(self) -> str:
            raise AssertionError("rendered a filtered event")

    get_logger("t").debug("skipped", value=Exploding())
    assert capsys.readouterr().out == ""


def test_debug_enabled_follows_level() -> None:
    configure_logging("debug")
    assert debug_enabled()
    configure_logging("info")
    assert not debug_enabled()


def test_level_and_format_are_case_insensitive(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("WARN", "JSON")
    get_logger("t").warning("w")
    [(prio, _)] = lines(capsys.readouterr().out)
    assert prio == 4


def test_console_format_has_no_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "console")
    get_logger("runtimeproxy.console").info("hello there", answer=42)
    out = capsys.readouterr().out
    assert not out.startswith("<")
    assert "hello there" in out
    assert "answer=42" in out
    assert "runtimeproxy.console" in out


def test_logger_made_before_configure_uses_new_config(capsys: pytest.CaptureFixture[str]) -> None:
    log = get_logger("early")  # like a module-level logger created at import time
    configure_logging("error")
    log.warning("filtered")
    log.error("kept")
    [(_, rec)] = lines(capsys.readouterr().out)
    assert rec["event"] == "kept"
    assert rec["logger"] == "early"


@pytest.mark.parametrize("level", ["verbose", "", "trace"])
def test_invalid_level(level: str) -> None:
    with pytest.raises(ValueError, match="debug, info, warning, error, critical"):
        configure_logging(level)


def test_invalid_format() -> None:
    with pytest.raises(ValueError, match="json, console"):
        configure_logging("info", "logfmt")
