"""`runtime-proxy serve` start-up checks that need no runtime: a bad metrics address is refused
before anything is bound or logged, and the hook config directory is made or warned about."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from click.testing import CliRunner
from structlog.testing import capture_logs

from runtimeproxy.proxy.cli import _prepare_hook_config_dir, cli


def test_a_bad_metrics_address_is_refused_before_anything_is_bound(tmp_path: Path) -> None:
    endpoint = tmp_path / "proxy.sock"
    with capture_logs() as logs:
        result = CliRunner().invoke(
            cli,
            [
                "serve",
                "--endpoint",
                str(endpoint),
                "--remote-runtime-endpoint",
                str(tmp_path / "containerd.sock"),
                "--hook-config-dir",
                str(tmp_path / "hooks.d"),
                "--metrics-address",
                "nonsense",
            ],
        )
    assert result.exit_code == 2, result.output
    assert "--metrics-address" in result.output and "nonsense" in result.output
    assert not [e for e in logs if e["event"] in ("serving", "ready")]
    assert sorted(os.listdir(tmp_path)) == []  # no socket, no lock file, no directory


def test_a_missing_hook_config_dir_is_created_0750(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "hookserver.d"
    with capture_logs() as logs:
        _prepare_hook_config_dir(str(path))
    assert path.is_dir() and stat.S_IMODE(path.stat().st_mode) == 0o750
    assert [e["event"] for e in logs] == ["created the hook config directory"]
    with capture_logs() as logs:
        _prepare_hook_config_dir(str(path))  # there already: nothing to say
    assert logs == []


def test_an_unreadable_hook_config_dir_is_warned_about(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with capture_logs() as logs:
        _prepare_hook_config_dir(str(blocker / "hookserver.d"))  # its parent is a file
    assert [(e["log_level"], e["event"]) for e in logs] == [
        ("warning", "cannot create the hook config directory; no hooks until it exists")
    ]
    with capture_logs() as logs:
        _prepare_hook_config_dir(str(blocker))  # exists, but is no directory it can list
    assert [e["log_level"] for e in logs] == ["warning"]
    assert "not readable" in logs[0]["event"] and logs[0]["path"] == str(blocker)
