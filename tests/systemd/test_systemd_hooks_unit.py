"""Guards for systemd/runtime-hooks.service and runtime-hooks.env: the directives the hook server
relies on, and the watchdog pings that make WatchdogSec= safe."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from daemons import reap, spawn_hooks_serve
from runtimeproxy.hooks.cli import serve
from runtimeproxy.hooks.reconciler import DEFAULT_RUNTIME_ENDPOINT
from runtimeproxy.hooks.server import DEFAULT_ENDPOINT, DEFAULT_HOOK_CONFIG_DIR, ServerSettings
from runtimeproxy.hooks.testkit.fake_cgroups import make_fake_cgroup_v2

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD / "runtime-hooks.service"
ENV_FILE = SYSTEMD / "runtime-hooks.env"
PROXY_UNIT = SYSTEMD / "runtime-proxy.service"

Unit = dict[str, dict[str, list[str]]]


def load(path: Path) -> Unit:
    """Sections -> directive -> every value given, in order (systemd adds up repeated list directives)."""
    unit: Unit = {}
    section: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def one(unit: Unit, section: str, key: str, default: str | None = None) -> str:
    values = unit[section].get(key)
    if not values:
        assert default is not None, f"[{section}] {key}= missing"
        return default
    return values[-1]


def words(unit: Unit, section: str, key: str) -> set[str]:
    return {word for value in unit[section].get(key, []) for word in value.split()}


def seconds(span: str) -> float:
    units = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 0.001, "min": 60.0, "m": 60.0}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span))


@pytest.fixture(scope="module")
def unit() -> Unit:
    return load(UNIT)


def test_notify_watchdog_and_restart(unit: Unit) -> None:
    assert one(unit, "Service", "Type") == "notify"
    assert one(unit, "Service", "NotifyAccess") == "main"
    assert 0 < seconds(one(unit, "Service", "WatchdogSec")) <= 60
    assert one(unit, "Service", "Restart") == "always"
    assert seconds(one(unit, "Service", "RestartSec")) > 0
    assert one(unit, "Unit", "StartLimitIntervalSec") == "0"


def test_ordering_around_containerd_the_proxy_and_kubelet(unit: Unit) -> None:
    assert "containerd.service" in words(unit, "Unit", "After")
    assert "containerd.service" in words(unit, "Unit", "Wants")
    assert {"runtime-proxy.service", "kubelet.service"} <= words(unit, "Unit", "Before")
    assert "containerd.service" not in words(unit, "Unit", "Requires") | words(unit, "Unit", "BindsTo")
    # The proxy's own unit must not be ordered before us (that would be a cycle).
    assert "runtime-hooks.service" not in words(load(PROXY_UNIT), "Unit", "Before")
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_exec_environment_and_stop(unit: Unit) -> None:
    assert one(unit, "Service", "ExecStart") == "/usr/local/bin/runtime-hooks serve"
    assert one(unit, "Service", "EnvironmentFile") == "-/etc/default/runtime-hooks"
    assert one(unit, "Service", "KillSignal") == "SIGTERM"
    settings = ServerSettings()
    assert seconds(one(unit, "Service", "TimeoutStopSec")) >= settings.deregister_grace + settings.stop_grace + 5


def test_runtime_and_config_directories_match_the_defaults(unit: Unit) -> None:
    socket_dir = Path(DEFAULT_ENDPOINT).parent
    assert socket_dir.name == one(unit, "Service", "RuntimeDirectory")
    assert str(socket_dir.parent) in ("/run", "/var/run")
    assert "/etc/" + one(unit, "Service", "ConfigurationDirectory") == DEFAULT_HOOK_CONFIG_DIR
    # The proxy reads the same directory.
    proxy_env = (SYSTEMD / "runtime-proxy.env").read_text()
    assert f"#RUNTIME_PROXY_HOOK_CONFIG_DIR={DEFAULT_HOOK_CONFIG_DIR}" in proxy_env


def test_hardening_still_lets_the_plugins_work(unit: Unit) -> None:
    writable = {path.lstrip("-") for path in words(unit, "Service", "ReadWritePaths")}
    assert {"/sys/fs/cgroup", "/sys/fs/resctrl", DEFAULT_HOOK_CONFIG_DIR, "/run/runtimehooks"} <= writable
    assert one(unit, "Service", "ProtectSystem") == "strict"
    assert one(unit, "Service", "ProtectControlGroups", "no") == "no"  # cgroups are written
    assert one(unit, "Service", "NoNewPrivileges") == "yes"
    families = words(unit, "Service", "RestrictAddressFamilies")
    assert {"AF_UNIX", "AF_NETLINK", "AF_INET", "AF_INET6"} <= families
    assert "CAP_NET_ADMIN" in words(unit, "Service", "CapabilityBoundingSet")
    # These would break tc on the node's interfaces, or hide later mounts.
    assert one(unit, "Service", "PrivateNetwork", "no") == "no"
    assert one(unit, "Service", "PrivateMounts", "no") == "no"
    assert one(unit, "Service", "IPAddressDeny", "") == ""
    assert "@system-service" in words(unit, "Service", "SystemCallFilter")


def serve_envvars() -> list[str]:
    found = []
    for param in serve.params:
        if isinstance(param, click.Option):
            envvar = param.envvar if isinstance(param.envvar, str) else f"RUNTIME_HOOKS_{(param.name or '').upper()}"
            found.append(envvar)
    return found


def test_env_file_documents_every_flag() -> None:
    text = ENV_FILE.read_text()
    variables = serve_envvars()
    assert "RUNTIME_HOOKS_RUNTIME_ENDPOINT" in variables and "RUNTIME_HOOKS_POLICY" in variables
    for var in variables:
        assert re.search(rf"^#{var}=", text, re.MULTILINE), var
    documented = set(re.findall(r"^#(RUNTIME_HOOKS_[A-Z_]+)=", text, re.MULTILINE))
    assert documented == set(variables), "no variable that serve does not read"
    assert not re.search(r"^[A-Z_]+=", text, re.MULTILINE), "the example must not set values"
    for var, default in (
        ("RUNTIME_HOOKS_ENDPOINT", DEFAULT_ENDPOINT),
        ("RUNTIME_HOOKS_HOOK_CONFIG_DIR", DEFAULT_HOOK_CONFIG_DIR),
        ("RUNTIME_HOOKS_RUNTIME_ENDPOINT", DEFAULT_RUNTIME_ENDPOINT),
    ):
        assert f"#{var}={default}\n" in text, var


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rhu-", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_serve_pings_the_watchdog_from_its_loop(short_dir: Path, tmp_path: Path) -> None:
    """WatchdogSec= is only safe because serve sends WATCHDOG=1 every half interval."""
    tree = make_fake_cgroup_v2(tmp_path / "cgroup")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(short_dir / "notify.sock"))
    notify.settimeout(20)
    env = {
        **os.environ,
        "NOTIFY_SOCKET": str(short_dir / "notify.sock"),
        "WATCHDOG_USEC": "200000",
        "RUNTIME_HOOKS_ENDPOINT": str(short_dir / "hooks.sock"),
        "RUNTIME_HOOKS_HOOK_CONFIG_DIR": str(short_dir / "hookserver.d"),
        "RUNTIME_HOOKS_CGROUP_ROOT": str(tree.root),
        "RUNTIME_HOOKS_RESCTRL_ROOT": str(tmp_path / "no-resctrl"),
        "RUNTIME_HOOKS_RUNTIME_ENDPOINT": "",
    }
    env.pop("WATCHDOG_PID", None)
    process = spawn_hooks_serve(env)
    try:
        messages: list[str] = []
        deadline = time.monotonic() + 20
        while sum(m == "WATCHDOG=1" for m in messages) < 3 and time.monotonic() < deadline:
            messages.append(notify.recv(4096).decode())
        assert any("READY=1" in m for m in messages), messages
        assert sum(m == "WATCHDOG=1" for m in messages) >= 3, messages
        process.terminate()
        process.communicate(timeout=20)
    finally:
        reap(process)
        notify.close()
    assert process.returncode == 0


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    # The real ExecStart binary is not installed here; verify the rest of the unit.
    (tmp_path / UNIT.name).write_text(UNIT.read_text().replace("/usr/local/bin/runtime-hooks serve", "/bin/true"))
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / UNIT.name)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
