"""Hook server registration files and the polling registry."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from runtimeproxy.dispatch.registry import (
    DEFAULT_TIMEOUT,
    MAX_CONFIG_BYTES,
    ConfigError,
    FailurePolicy,
    HookRegistry,
    HookServer,
    parse_config,
    parse_duration,
)
from runtimeproxy.hookapi.hookpoints import HookPoint

SOCK = "/var/run/koordlet/koordlet.sock"


def config(**fields: Any) -> str:
    data: dict[str, Any] = {"remote-endpoint": SOCK, "runtime-hooks": ["PreRunPodSandbox"]}
    for key, value in fields.items():
        data[key.replace("_", "-")] = value
    return json.dumps(data)


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def events(logs: Sequence[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == event]


def spy_on(monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple[Any, ...]]:
    """Record the arguments of every ``os.<name>`` call (it still runs)."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(os, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, spy)
    return calls


# --- parse_config --------------------------------------------------------------------------


def test_koordinator_file_parses_with_defaults() -> None:
    text = json.dumps(
        {"remote-endpoint": SOCK, "failure-policy": "Fail", "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer"]}
    )
    assert parse_config("koordlet.json", text) == HookServer(
        name="koordlet.json",
        endpoint=SOCK,
        failure_policy=FailurePolicy.FAIL,
        hooks=frozenset({HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER}),
        timeout=DEFAULT_TIMEOUT,
        index=0,
    )


@pytest.mark.parametrize("endpoint", [SOCK, "unix://" + SOCK])
def test_endpoint_forms(endpoint: str) -> None:
    assert parse_config("a.json", config(remote_endpoint=endpoint)).endpoint == SOCK


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("Fail", FailurePolicy.FAIL),
        ("Ignore", FailurePolicy.IGNORE),
        ("", FailurePolicy.IGNORE),
        (None, FailurePolicy.IGNORE),
    ],
)
def test_failure_policy(policy: str | None, expected: FailurePolicy) -> None:
    assert parse_config("a.json", config(failure_policy=policy)).failure_policy is expected


def test_missing_failure_policy_is_ignore() -> None:
    assert parse_config("a.json", json.dumps({"remote-endpoint": SOCK})).failure_policy is FailurePolicy.IGNORE


def test_hooks_parse_aliases_and_duplicates() -> None:
    server = parse_config(
        "a.json", config(runtime_hooks=["PreRemoveRunPodSandbox", "PostStopContainer", "PostStopContainer"])
    )
    assert server.hooks == {HookPoint.PRE_REMOVE_POD_SANDBOX, HookPoint.POST_STOP_CONTAINER}


def test_missing_hooks_means_none() -> None:
    assert parse_config("a.json", json.dumps({"remote-endpoint": SOCK})).hooks == frozenset()


@pytest.mark.parametrize(
    ("timeout", "seconds"),
    [
        (None, 2.0),
        (1, 1.0),
        (0.25, 0.25),
        (120, 120.0),
        ("500ms", 0.5),
        ("2s", 2.0),
        ("1m", 60.0),
        ("1m30s", 90.0),
        ("1.5s", 1.5),
        ("250000us", 0.25),
        ("2m", 120.0),
    ],
)
def test_timeout(timeout: object, seconds: float) -> None:
    assert parse_config("a.json", config(timeout=timeout)).timeout == pytest.approx(seconds)


@pytest.mark.parametrize(("index", "expected"), [(None, 0), (5, 5), (-3, -3)])
def test_index(index: int | None, expected: int) -> None:
    assert parse_config("a.json", config(index=index)).index == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"remote-endpoint": ', "invalid JSON at line 1 column"),
        ('{\n  "remote-endpoint": "/a.sock",\n  oops\n}', "invalid JSON at line 3 column 3"),
        ("[]", "top level must be a JSON object"),
        ("{}", "missing remote-endpoint"),
        (json.dumps({"remote-endpoint": ""}), "missing remote-endpoint"),
        (json.dumps({"remote-endpoint": 5}), "remote-endpoint must be a string"),
        (json.dumps({"remote-endpoint": "relative.sock"}), "must be an absolute path"),
        (json.dumps({"remote-endpoint": "unix://relative.sock"}), "must be an absolute path"),
        (json.dumps({"remote-endpoint": "tcp://1.2.3.4:5"}), "only unix sockets"),
        (json.dumps({"remote-endpoint": "/" + "a" * 200}), "longer than 107 bytes"),
        (config(failure_policy="fail"), 'failure-policy must be "Fail" or "Ignore"'),
        (config(failure_policy=1), 'failure-policy must be "Fail" or "Ignore"'),
        (config(runtime_hooks="PreRunPodSandbox"), "runtime-hooks must be a list"),
        (config(runtime_hooks=["PreRunPodSandbox", 3]), "runtime-hooks must be a list"),
        (config(runtime_hooks=["PreRunPod"]), "unknown runtime hook 'PreRunPod' (valid: PreRunPodSandbox,"),
        (config(timeout=0), "must be > 0 and <= 120s"),
        (config(timeout=-1), "must be > 0 and <= 120s"),
        (config(timeout=120.5), "must be > 0 and <= 120s"),
        (config(timeout="121s"), "must be > 0 and <= 120s"),
        (config(timeout="0"), "must be > 0 and <= 120s"),
        (config(timeout="-1s"), "must be > 0 and <= 120s"),
        (config(timeout="2"), "invalid duration '2'"),
        (config(timeout="2 s"), "invalid duration"),
        (config(timeout="2d"), "invalid duration"),
        (config(timeout=True), "timeout must be seconds"),
        (config(timeout=[1]), "timeout must be seconds"),
        ('{"remote-endpoint": "/a.sock", "timeout": NaN}', "must be > 0"),
        ('{"remote-endpoint": "/a.sock", "timeout": Infinity}', "must be > 0"),
        (config(index=1.5), "index must be an integer"),
        (config(index="1"), "index must be an integer"),
        (config(index=False), "index must be an integer"),
    ],
)
def test_errors_name_the_file_and_reason(text: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("broken.json", text)
    assert str(info.value).startswith("hook config broken.json: ")
    assert reason in str(info.value)
    assert info.value.name == "broken.json"
    assert isinstance(info.value, ValueError)


def test_unknown_keys_warn_and_are_ignored() -> None:
    with capture_logs() as logs:
        server = parse_config("a.json", config(future_thing=1, other={"x": 1}))
    assert server.endpoint == SOCK
    [warning] = events(logs, "unknown keys in hook config ignored")
    assert warning["file"] == "a.json"
    assert warning["keys"] == ["future-thing", "other"]
    assert warning["log_level"] == "warning"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("1h", 3600.0),
        ("1h2m3s", 3723.0),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("10ns", 1e-8),
        ("3µs", 3e-6),
        ("-1.5m", -90.0),
        ("+2s", 2.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "1", ".s", "1x", "1s ", " 1s", "1s-2s", "--1s", "1e3s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


# --- the registry: scans -------------------------------------------------------------------


def test_scan_orders_by_index_then_name(tmp_path: Path) -> None:
    write(tmp_path, "b.json", config(index=1))
    write(tmp_path, "c.json", config())
    write(tmp_path, "a.json", config(index=1, runtime_hooks=["PreRunPodSandbox", "PostStopPodSandbox"]))
    registry = HookRegistry(str(tmp_path))
    assert registry.scan() is True
    assert [s.name for s in registry.servers()] == ["c.json", "a.json", "b.json"]
    assert [s.name for s in registry.servers_for(HookPoint.PRE_RUN_POD_SANDBOX)] == ["c.json", "a.json", "b.json"]
    assert [s.name for s in registry.servers_for(HookPoint.POST_STOP_POD_SANDBOX)] == ["a.json"]
    assert registry.servers_for(HookPoint.PRE_CREATE_CONTAINER) == []


def test_servers_for_returns_a_copy(tmp_path: Path) -> None:
    write(tmp_path, "a.json", config())
    registry = HookRegistry(str(tmp_path))
    registry.scan()
    registry.servers_for(HookPoint.PRE_RUN_POD_SANDBOX).clear()
    registry.servers().clear()
    assert len(registry.servers_for(HookPoint.PRE_RUN_POD_SANDBOX)) == len(registry.servers()) == 1


def test_non_json_files_and_directories_are_ignored(tmp_path: Path) -> None:
    for name in ("a.json~", ".a.json.swp", ".hidden.json", "a.json.bak", "README", "a.JSON"):
        write(tmp_path, name, config())
    (tmp_path / "dir.json").mkdir()
    registry = HookRegistry(str(tmp_path))
    assert registry.scan() is False
    assert registry.servers() == []


def test_add_change_remove(tmp_path: Path) -> None:
    registry = HookRegistry(str(tmp_path))
    assert registry.scan() is False
    with capture_logs() as logs:
        write(tmp_path, "a.json", config())
        assert registry.scan() is True
        assert registry.scan() is False  # nothing new
        write(tmp_path, "a.json", config(failure_policy="Fail", runtime_hooks=["PreCreateContainer"]))
        assert registry.scan() is True
        (tmp_path / "a.json").unlink()
        assert registry.scan() is True
    assert [e["event"] for e in logs] == ["hook server added", "hook server changed", "hook server removed"]
    changed = logs[1]
    assert changed["server"] == "a.json"
    assert changed["endpoint"] == SOCK
    assert changed["hooks"] == ["PreCreateContainer"]
    assert changed["failure_policy"] == "Fail"
    assert registry.servers() == []
    assert registry.servers_for(HookPoint.PRE_CREATE_CONTAINER) == []


def test_change_is_applied_to_the_per_point_lists(tmp_path: Path) -> None:
    write(tmp_path, "a.json", config())
    registry = HookRegistry(str(tmp_path))
    registry.scan()
    write(tmp_path, "a.json", config(runtime_hooks=["PreCreateContainer", "PostStopContainer"]))
    assert registry.scan() is True
    assert registry.servers_for(HookPoint.PRE_RUN_POD_SANDBOX) == []
    assert [s.name for s in registry.servers_for(HookPoint.PRE_CREATE_CONTAINER)] == ["a.json"]


def test_rewrite_with_same_content_is_not_a_change(tmp_path: Path) -> None:
    path = write(tmp_path, "a.json", config())
    registry = HookRegistry(str(tmp_path))
    registry.scan()
    with capture_logs() as logs:
        os.utime(path, ns=(1, 1))
        assert registry.scan() is False
    assert logs == []


def test_unchanged_files_are_not_reread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "a.json", config())
    registry = HookRegistry(str(tmp_path))
    registry.scan()
    opened = spy_on(monkeypatch, "open")
    registry.scan()
    registry.scan()
    assert opened == []
    write(tmp_path, "a.json", config(index=3))
    registry.scan()
    assert [args[0] for args in opened] == [str(tmp_path / "a.json")]  # the spy does see reads


def test_atomic_replace_is_seen(tmp_path: Path) -> None:
    write(tmp_path, "a.json", config(index=1))
    registry = HookRegistry(str(tmp_path))
    registry.scan()
    write(tmp_path, "tmp", config(index=2))  # same size, new inode
    os.replace(tmp_path / "tmp", tmp_path / "a.json")
    assert registry.scan() is True
    assert registry.servers()[0].index == 2


def skipped_beside_good(tmp_path: Path, name: str, text: str, scans: int) -> tuple[dict[str, Any], HookRegistry]:
    """`text` as `name` beside a good config, scanned `scans` times: the one warning that skips
    it (there must be exactly one), and the registry."""
    write(tmp_path, "good.json", config())
    write(tmp_path, name, text)
    registry = HookRegistry(str(tmp_path))
    with capture_logs() as logs:
        for _ in range(scans):
            registry.scan()
    [warning] = events(logs, "hook config skipped")
    assert warning["file"] == name
    return warning, registry


def test_malformed_file_is_skipped_and_warned_about_once(tmp_path: Path) -> None:
    bad = '{"remote-endpoint": "/x.sock", "runtime-hooks": ["Nope"]}'
    warning, registry = skipped_beside_good(tmp_path, "bad.json", bad, scans=5)
    assert "unknown runtime hook 'Nope'" in warning["reason"]
    assert warning["log_level"] == "warning"
    assert [s.name for s in registry.servers()] == ["good.json"]


def test_malformed_file_warns_again_after_each_change(tmp_path: Path) -> None:
    registry = HookRegistry(str(tmp_path))
    with capture_logs() as logs:
        write(tmp_path, "bad.json", "{")
        registry.scan()
        registry.scan()
        write(tmp_path, "bad.json", "{oops")
        registry.scan()
        registry.scan()
    reasons = [w["reason"] for w in events(logs, "hook config skipped")]
    assert len(reasons) == 2
    assert all("invalid JSON at line 1" in reason for reason in reasons)


def test_broken_edit_keeps_the_previous_version(tmp_path: Path) -> None:
    write(tmp_path, "a.json", config(failure_policy="Fail"))
    registry = HookRegistry(str(tmp_path))
    registry.scan()
    before = registry.servers()
    with capture_logs() as logs:
        write(tmp_path, "a.json", "")  # e.g. caught half-written
        assert registry.scan() is False
    assert registry.servers() == before
    [warning] = events(logs, "hook config skipped")
    assert warning["kept"] == "previous version"
    write(tmp_path, "a.json", config(failure_policy="Ignore"))
    assert registry.scan() is True
    assert registry.servers()[0].failure_policy is FailurePolicy.IGNORE


def test_malformed_file_fixed_later_is_added(tmp_path: Path) -> None:
    write(tmp_path, "a.json", "not json")
    registry = HookRegistry(str(tmp_path))
    registry.scan()
    assert registry.servers() == []
    write(tmp_path, "a.json", config())
    assert registry.scan() is True
    assert [s.name for s in registry.servers()] == ["a.json"]


def test_non_utf8_file_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_bytes(b'{"remote-endpoint": "/\xff.sock"}')
    registry = HookRegistry(str(tmp_path))
    with capture_logs() as logs:
        registry.scan()
    assert "not UTF-8" in events(logs, "hook config skipped")[0]["reason"]


def test_symlink_loop_warns_once(tmp_path: Path) -> None:
    (tmp_path / "a.json").symlink_to(tmp_path / "loop.json")
    (tmp_path / "loop.json").symlink_to(tmp_path / "a.json")
    registry = HookRegistry(str(tmp_path))
    with capture_logs() as logs:
        registry.scan()
        registry.scan()
    assert sorted(w["file"] for w in events(logs, "hook config skipped")) == ["a.json", "loop.json"]


def test_dangling_symlink_is_no_file_said_once(tmp_path: Path) -> None:
    (tmp_path / "a.json").symlink_to(tmp_path / "later.conf")
    registry = HookRegistry(str(tmp_path))
    with capture_logs() as logs:
        assert registry.scan() is False
        assert registry.scan() is False
    [warning] = events(logs, "hook config skipped")
    assert warning["file"] == "a.json"
    assert "dangling symlink" in warning["reason"]
    write(tmp_path, "later.conf", config())
    assert registry.scan() is True


def test_symlink_whose_target_goes_away_drops_its_server(tmp_path: Path) -> None:
    target = write(tmp_path, "real.conf", config(failure_policy="Fail"))
    (tmp_path / "link.json").symlink_to(target)
    registry = HookRegistry(str(tmp_path))
    registry.scan()
    target.unlink()  # e.g. the hook server was uninstalled, its link left behind
    with capture_logs() as logs:
        assert registry.scan() is True
        assert registry.scan() is False
    assert registry.servers() == []
    [warning] = events(logs, "hook config skipped")
    assert warning["kept"] == "nothing"


def test_symlinked_file_registers_its_target(tmp_path: Path) -> None:
    target = write(tmp_path, "real.conf", config())
    (tmp_path / "link.json").symlink_to(target)
    registry = HookRegistry(str(tmp_path))
    registry.scan()
    assert [s.name for s in registry.servers()] == ["link.json"]


def test_missing_directory_logs_once_and_is_picked_up_when_created(tmp_path: Path) -> None:
    directory = tmp_path / "hookserver.d"
    registry = HookRegistry(str(directory))
    with capture_logs() as logs:
        assert registry.scan() is False
        assert registry.scan() is False
        directory.mkdir()
        write(directory, "a.json", config())
        assert registry.scan() is True
    assert [e["event"] for e in logs] == [
        "hook config directory unreadable; no hook servers",
        "hook config directory readable",
        "hook server added",
    ]


def test_removed_directory_drops_every_server(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    write(directory, "a.json", config())
    registry = HookRegistry(str(directory))
    registry.scan()
    (directory / "a.json").unlink()
    directory.rmdir()
    assert registry.scan() is True
    assert registry.servers() == []


def test_listeners_get_the_full_list_after_each_change(tmp_path: Path) -> None:
    registry = HookRegistry(str(tmp_path))
    seen: list[list[str]] = []

    def broken(_servers: list[HookServer]) -> None:
        raise RuntimeError("boom")

    registry.add_listener(broken)
    registry.add_listener(lambda servers: seen.append([s.name for s in servers]))
    write(tmp_path, "a.json", config())
    write(tmp_path, "b.json", config())
    with capture_logs() as logs:
        registry.scan()
        registry.scan()
        (tmp_path / "a.json").unlink()
        registry.scan()
    assert seen == [["a.json", "b.json"], ["b.json"]]
    assert len(events(logs, "hook registry listener failed")) == 2


def test_poll_interval_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="poll_interval"):
        HookRegistry(str(tmp_path), poll_interval=0)


# --- the registry: watching ------------------------------------------------------------------


async def wait_for(condition: Any, within: float) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < within, "not seen in time"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_watcher_applies_add_change_remove_within_a_second(tmp_path: Path) -> None:
    write(tmp_path, "a.json", config())
    registry = HookRegistry(str(tmp_path))
    await registry.start()
    try:
        assert [s.name for s in registry.servers()] == ["a.json"]  # start() scans before returning
        write(tmp_path, "b.json", config(index=-1))
        await wait_for(lambda: [s.name for s in registry.servers()] == ["b.json", "a.json"], within=1.0)
        write(tmp_path, "a.json", config(runtime_hooks=["PostStopContainer"]))
        await wait_for(lambda: registry.servers_for(HookPoint.POST_STOP_CONTAINER) != [], within=1.0)
        (tmp_path / "b.json").unlink()
        await wait_for(lambda: [s.name for s in registry.servers()] == ["a.json"], within=1.0)
    finally:
        await registry.stop()


async def test_watcher_stops(tmp_path: Path) -> None:
    registry = HookRegistry(str(tmp_path), poll_interval=0.01)
    await registry.start()
    await registry.start()  # idempotent
    await registry.stop()
    await registry.stop()
    write(tmp_path, "a.json", config())
    await asyncio.sleep(0.05)
    assert registry.servers() == []


async def test_watcher_survives_failing_scans_and_logs_each_error_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = HookRegistry(str(tmp_path), poll_interval=0.01)
    calls = 0
    real_collect = registry._collect

    def flaky() -> Any:
        nonlocal calls
        calls += 1
        if calls <= 10:  # start() and nine polls
            raise RuntimeError("transient" if calls < 6 else "another")
        return real_collect()

    monkeypatch.setattr(registry, "_collect", flaky)
    write(tmp_path, "a.json", config())
    with capture_logs() as logs:
        await registry.start()  # its own scan failing does not fail the start
        try:
            await wait_for(lambda: registry.servers() != [], within=2.0)
        finally:
            await registry.stop()
    assert [e["error"] for e in events(logs, "hook config scan failed")] == [
        "RuntimeError: transient",
        "RuntimeError: another",
    ]
    assert len(events(logs, "hook config scan works again")) == 1


async def test_malformed_file_logs_once_while_watched(tmp_path: Path) -> None:
    registry = HookRegistry(str(tmp_path), poll_interval=0.01)
    with capture_logs() as logs:
        await registry.start()
        try:
            write(tmp_path, "bad.json", "{")
            await asyncio.sleep(0.2)  # about 20 polls
        finally:
            await registry.stop()
    assert len(events(logs, "hook config skipped")) == 1


# --- hostile and odd files -------------------------------------------------------------------

NESTING_BOMB = "[" * 1000 + "]" * 1000  # 2 KB; json.loads raises RecursionError on it


def scan_in_thread(registry: HookRegistry) -> bool:
    """``registry.scan()``, failing instead of hanging the test run if the scan blocks (a daemon
    thread: one stuck in open() cannot hold up the interpreter's exit either)."""
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(registry.scan()), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "the scan blocked"
    return result[0]


@pytest.mark.parametrize(
    "text",
    [
        NESTING_BOMB,
        '{"remote-endpoint": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"remote-endpoint": "/a.sock", "index": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}",
    ],
    ids=["arrays", "deep-value", "deep-objects"],
)
def test_nesting_bomb_is_skipped_once_and_the_others_load(tmp_path: Path, text: str) -> None:
    warning, registry = skipped_beside_good(tmp_path, "bomb.json", text, scans=3)
    assert "nested too deeply" in warning["reason"]
    assert [s.name for s in registry.servers()] == ["good.json"]


def test_nesting_bomb_over_a_valid_file_keeps_the_previous_version(tmp_path: Path) -> None:
    write(tmp_path, "a.json", config(failure_policy="Fail"))
    registry = HookRegistry(str(tmp_path))
    registry.scan()
    before = registry.servers()
    write(tmp_path, "a.json", NESTING_BOMB)
    with capture_logs() as logs:
        assert registry.scan() is False
    assert registry.servers() == before
    assert events(logs, "hook config skipped")[0]["kept"] == "previous version"


def padded(size: int) -> str:
    """A valid registration of exactly ``size`` bytes (JSON whitespace after the object)."""
    text = config()
    return text + " " * (size - len(text))


def test_file_over_the_size_cap_is_skipped_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "limit.json", padded(MAX_CONFIG_BYTES))
    write(tmp_path, "over.json", padded(MAX_CONFIG_BYTES + 1))
    opened = spy_on(monkeypatch, "open")
    registry = HookRegistry(str(tmp_path))
    with capture_logs() as logs:
        registry.scan()
        registry.scan()
    assert [s.name for s in registry.servers()] == ["limit.json"]
    [warning] = events(logs, "hook config skipped")
    assert warning["file"] == "over.json"
    assert str(MAX_CONFIG_BYTES + 1) in warning["reason"] and "limit" in warning["reason"]
    assert [os.path.basename(args[0]) for args in opened] == ["limit.json"]


def test_symlink_to_a_huge_file_is_skipped_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "elsewhere" / "big"
    big.parent.mkdir()
    with big.open("wb") as file:
        file.truncate(256 << 20)  # sparse: 256 MiB without writing them
    (tmp_path / "big.json").symlink_to(big)
    read = spy_on(monkeypatch, "read")
    registry = HookRegistry(str(tmp_path))
    with capture_logs() as logs:
        registry.scan()
    assert read == []
    [warning] = events(logs, "hook config skipped")
    assert warning["file"] == "big.json" and str(256 << 20) in warning["reason"]


def test_reads_stop_after_cap_plus_one_bytes_whatever_stat_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file that grows after its stat (or whose stat size lies, as in /proc): the read is bounded.
    write(tmp_path, "grows.json", padded(4 * MAX_CONFIG_BYTES))
    real_stat, real_fstat, real_read = os.stat, os.fstat, os.read

    def small(st: os.stat_result) -> os.stat_result:
        fields = list(st)
        fields[stat.ST_SIZE] = 100
        return os.stat_result(fields)

    total = 0

    def counting_read(fd: int, n: int) -> bytes:
        nonlocal total
        data = real_read(fd, n)
        total += len(data)
        return data

    monkeypatch.setattr(os, "stat", lambda path, *a, **k: small(real_stat(path, *a, **k)))
    monkeypatch.setattr(os, "fstat", lambda fd: small(real_fstat(fd)))
    monkeypatch.setattr(os, "read", counting_read)
    registry = HookRegistry(str(tmp_path))
    with capture_logs() as logs:
        registry.scan()
    assert total == MAX_CONFIG_BYTES + 1
    [warning] = events(logs, "hook config skipped")
    assert f"more than {MAX_CONFIG_BYTES} bytes" in warning["reason"]


def test_fifo_is_skipped_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.json")
    write(tmp_path, "good.json", config())
    registry = HookRegistry(str(tmp_path))
    with capture_logs() as logs:
        assert scan_in_thread(registry) is True
        assert scan_in_thread(registry) is False
    [warning] = events(logs, "hook config skipped")
    assert warning["file"] == "pipe.json" and warning["reason"] == "not a regular file (a FIFO)"
    assert [s.name for s in registry.servers()] == ["good.json"]


def test_fifo_swapped_in_after_the_stat_does_not_block_the_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    regular = write(tmp_path, "regular", config())
    os.mkfifo(tmp_path / "pipe.json")
    real_stat = os.stat
    # The stat sees a regular file; by the open it is a FIFO (a writer could race us so).
    monkeypatch.setattr(
        os, "stat", lambda path, *a, **k: real_stat(regular if str(path).endswith("pipe.json") else path)
    )
    registry = HookRegistry(str(tmp_path))
    with capture_logs() as logs:
        scan_in_thread(registry)
    [warning] = events(logs, "hook config skipped")
    assert warning["reason"] == "not a regular file (a FIFO)"


def test_directory_and_socket_named_json_are_skipped_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "dir.json").mkdir()
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(tmp_path / "sock.json"))
        registry = HookRegistry(str(tmp_path))
        with capture_logs() as logs:
            registry.scan()
            registry.scan()
    finally:
        listener.close()
    reasons = {w["file"]: w["reason"] for w in events(logs, "hook config skipped")}
    assert reasons == {"dir.json": "not a regular file (a directory)", "sock.json": "not a regular file (a socket)"}
    assert len(events(logs, "hook config skipped")) == 2


def curse(directory: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """Write cursed.json, a valid registration whose parsing raises ``error`` (a bug in the parser)."""
    write(directory, "cursed.json", config())
    real_parse = parse_config

    def parse(name: str, text: str) -> HookServer:
        if name == "cursed.json":
            raise error
        return real_parse(name, text)

    monkeypatch.setattr("runtimeproxy.dispatch.registry.parse_config", parse)


def test_unexpected_error_in_one_file_skips_that_file_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "good.json", config())
    curse(tmp_path, monkeypatch, MemoryError("out of memory"))
    registry = HookRegistry(str(tmp_path))
    with capture_logs() as logs:
        registry.scan()
        registry.scan()
    [warning] = events(logs, "hook config skipped")
    assert warning["file"] == "cursed.json" and warning["reason"] == "MemoryError: out of memory"
    assert [s.name for s in registry.servers()] == ["good.json"]


async def test_watcher_applies_removals_while_another_file_is_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "fail.json", config(failure_policy="Fail"))
    write(tmp_path, "bomb.json", NESTING_BOMB)
    os.mkfifo(tmp_path / "pipe.json")
    curse(tmp_path, monkeypatch, RuntimeError("a bug"))
    registry = HookRegistry(str(tmp_path), poll_interval=0.01)
    with capture_logs() as logs:
        await registry.start()
        try:
            assert [s.name for s in registry.servers()] == ["fail.json"]
            (tmp_path / "fail.json").unlink()
            await wait_for(lambda: registry.servers() == [], within=2.0)
            await asyncio.sleep(0.1)  # more polls: nothing is logged twice
        finally:
            await registry.stop()
    assert sorted(w["file"] for w in events(logs, "hook config skipped")) == ["bomb.json", "cursed.json", "pipe.json"]
    assert events(logs, "hook config scan failed") == []


async def test_watcher_reads_files_off_the_event_loop_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "a.json", config())
    registry = HookRegistry(str(tmp_path), poll_interval=0.01)
    threads: list[int] = []
    real_collect = registry._collect

    def collect() -> Any:
        threads.append(threading.get_ident())
        return real_collect()

    monkeypatch.setattr(registry, "_collect", collect)
    await registry.start()
    try:
        await wait_for(lambda: len(threads) >= 3, within=2.0)
    finally:
        await registry.stop()
    assert threading.get_ident() not in threads
    assert [s.name for s in registry.servers()] == ["a.json"]


# --- property: whatever a file holds, the scan survives and the others load ------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
registration_like = st.fixed_dictionaries(
    {},
    optional={
        "remote-endpoint": st.sampled_from([SOCK, "unix://" + SOCK, "", "rel.sock"]) | json_values,
        "failure-policy": st.sampled_from(["Fail", "Ignore", ""]) | json_values,
        "runtime-hooks": st.lists(st.sampled_from([p.value for p in HookPoint] + ["Nope"]), max_size=3) | json_values,
        "timeout": st.sampled_from(["500ms", "2s", 0, 1.5, "1h"]) | json_values,
        "index": st.integers() | json_values,
    },
)
file_contents = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda value: json.dumps(value).encode()),
    registration_like.map(lambda value: json.dumps(value).encode()),
    st.integers(0, 3000).map(lambda depth: ("[" * depth + "]" * depth).encode()),
    st.integers(0, 3000).map(lambda depth: ('{"a":' * depth + "0" + "}" * depth).encode()),
)


@settings(max_examples=150, deadline=None)
@given(contents=st.lists(file_contents, min_size=1, max_size=3))
def test_scan_survives_any_file_contents(contents: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        write(root, "good-a.json", config(index=-1))
        write(root, "good-z.json", config(failure_policy="Fail"))
        for number, data in enumerate(contents):
            (root / f"random-{number}.json").write_bytes(data)
        registry = HookRegistry(directory)
        with capture_logs() as logs:
            registry.scan()
            registry.scan()
        registered = {s.name: s for s in registry.servers()}
        assert {"good-a.json", "good-z.json"} <= registered.keys()
        skipped = [w["file"] for w in events(logs, "hook config skipped")]
        for number, data in enumerate(contents):
            name = f"random-{number}.json"
            # Exactly one outcome: registered as parse_config reads it, or skipped with one line.
            if name in registered:
                assert registered[name] == parse_config(name, data.decode())
                assert name not in skipped
            else:
                assert skipped.count(name) == 1
