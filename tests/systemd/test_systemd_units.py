"""Guards for the shipped systemd files: the directives the daemon's behaviour relies on."""

from __future__ import annotations

import configparser
import re
import subprocess
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD / "runtime-proxy.service"
ENV_FILE = SYSTEMD / "runtime-proxy.env"
DROP_IN = SYSTEMD / "kubelet.service.d" / "10-runtime-proxy.conf"
DEFAULT_DRAIN_GRACE = 10.0
ENV_VARS = [
    "RUNTIME_PROXY_ENDPOINT",
    "RUNTIME_PROXY_REMOTE_RUNTIME_ENDPOINT",
    "RUNTIME_PROXY_REMOTE_IMAGE_ENDPOINT",
    "RUNTIME_PROXY_HOOK_CONFIG_DIR",
    "RUNTIME_PROXY_METRICS_ADDRESS",
    "RUNTIME_PROXY_LOG_LEVEL",
    "RUNTIME_PROXY_LOG_FORMAT",
    "RUNTIME_PROXY_SOCKET_GROUP",
    "RUNTIME_PROXY_MAX_MESSAGE_SIZE",
    "RUNTIME_PROXY_DRAIN_GRACE",
]


def load(path: Path) -> configparser.ConfigParser:
    # strict=False: systemd allows repeated keys (the last one wins, as here).
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read(path)
    return parser


def words(value: str) -> set[str]:
    return set(value.split())


def seconds(span: str) -> float:
    """Parse the systemd time spans used here ("30s", "2", "1min 30s")."""
    units = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 0.001, "min": 60.0, "m": 60.0}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span):
        total += float(number) * units[unit]
    return total


@pytest.fixture(scope="module")
def unit() -> configparser.ConfigParser:
    return load(UNIT)


def test_notify_and_watchdog(unit: configparser.ConfigParser) -> None:
    service = unit["Service"]
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert seconds(service["WatchdogSec"]) == 30


def test_restart_policy(unit: configparser.ConfigParser) -> None:
    assert unit["Service"]["Restart"] == "always"
    assert seconds(unit["Service"]["RestartSec"]) == 2
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"  # never stop retrying


def test_ordering(unit: configparser.ConfigParser) -> None:
    section = unit["Unit"]
    assert "containerd.service" in words(section["After"])
    assert "containerd.service" in words(section["Wants"])
    assert "kubelet.service" in words(section["Before"])
    # A containerd restart must not stop the proxy.
    assert "containerd.service" not in words(section.get("Requires", ""))
    assert "containerd.service" not in words(section.get("BindsTo", ""))
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_exec_and_environment(unit: configparser.ConfigParser) -> None:
    service = unit["Service"]
    assert service["ExecStart"] == "/usr/local/bin/runtime-proxy serve"
    assert service["EnvironmentFile"] == "-/etc/default/runtime-proxy"


def test_stop_leaves_time_to_drain(unit: configparser.ConfigParser) -> None:
    service = unit["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert seconds(service["TimeoutStopSec"]) >= DEFAULT_DRAIN_GRACE + 5


def test_runtime_directory_holds_the_kubelet_socket(unit: configparser.ConfigParser) -> None:
    service = unit["Service"]
    assert service["RuntimeDirectory"] == "runtimeproxy"
    assert service["RuntimeDirectoryMode"] == "0750"
    socket_dir = Path(kubelet_endpoint().removeprefix("unix://")).parent
    assert socket_dir.name == service["RuntimeDirectory"]
    assert str(socket_dir.parent) in ("/run", "/var/run")


def test_hardening_keeps_what_the_proxy_needs(unit: configparser.ConfigParser) -> None:
    service = unit["Service"]
    assert service["ProtectSystem"] == "strict"
    assert service["NoNewPrivileges"] == "yes"
    assert "AF_UNIX" in words(service["RestrictAddressFamilies"])
    assert {"AF_INET", "AF_INET6"} <= words(service["RestrictAddressFamilies"])
    assert "CAP_CHOWN" in words(service["CapabilityBoundingSet"])  # socket group
    assert "/run/runtimeproxy" in service["ReadWritePaths"]
    # These would break a CRI proxy outright.
    assert service.get("PrivateNetwork", "no") == "no"
    assert service.get("IPAddressDeny", "") == ""


def kubelet_endpoint() -> str:
    exec_start = load(DROP_IN)["Service"]["ExecStart"]
    match = re.search(r"--container-runtime-endpoint=(\S+)", exec_start)
    assert match, exec_start
    return match[1]


def test_kubelet_drop_in_overrides_kubeadm_exec_start() -> None:
    text = DROP_IN.read_text()
    assert re.search(r"^ExecStart=$", text, re.MULTILINE), "ExecStart= reset missing"
    exec_start = load(DROP_IN)["Service"]["ExecStart"]
    for var in ("KUBELET_KUBECONFIG_ARGS", "KUBELET_CONFIG_ARGS", "KUBELET_KUBEADM_ARGS"):
        assert f"${var}" in exec_start
    # Last on the line, so it beats any earlier --container-runtime-endpoint.
    assert exec_start.split()[-1].startswith("--container-runtime-endpoint=")
    assert kubelet_endpoint() == "unix:///var/run/runtimeproxy/runtimeproxy.sock"
    # Drop-ins apply in file-name order: ours must come after kubeadm's.
    assert sorted([DROP_IN.name, "10-kubeadm.conf"])[-1] == DROP_IN.name


def test_kubelet_drop_in_orders_after_proxy() -> None:
    section = load(DROP_IN)["Unit"]
    assert "runtime-proxy.service" in words(section["After"])
    assert "runtime-proxy.service" in words(section["Wants"])


def test_env_file_documents_every_flag() -> None:
    text = ENV_FILE.read_text()
    for var in ENV_VARS:
        assert re.search(rf"^#{var}=", text, re.MULTILINE), var
    assert not re.search(r"^[A-Z_]+=", text, re.MULTILINE), "example must not set values"
    endpoint = re.search(r"^#RUNTIME_PROXY_ENDPOINT=(\S+)", text, re.MULTILINE)
    assert endpoint
    assert endpoint[1] == kubelet_endpoint()


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    # The real ExecStart binary is not installed here; verify the rest of the unit.
    unit_text = UNIT.read_text().replace("/usr/local/bin/runtime-proxy serve", "/bin/true")
    (tmp_path / UNIT.name).write_text(unit_text)
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / UNIT.name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
