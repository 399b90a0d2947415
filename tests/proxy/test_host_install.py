"""`runtime-proxy install` / `uninstall` on a host root in a temporary directory.

The root is a small host: busybox as /bin/sh and a stand-in systemctl (a shell script that logs
its calls and keeps enabled/active marks), since no systemd is PID 1 here; install runs it with
chroot as it runs the host's own systemctl under --root. The proxy whose readiness install waits
for is real: `runtime-proxy serve` on the root's /run/runtimeproxy socket, in front of the test
bed's containerd. The real systemd is the node tier's (tests/node).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import start_testbed
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.proxy import host_install
from runtimeproxy.proxy.artifact import Bundle, build_bundle
from runtimeproxy.proxy.cli import cli
from runtimeproxy.proxy.host_install import KUBELET_DROP_IN, shipped
from runtimeproxy.proxy.host_root import HostRoot
from runtimeproxy.testbed import Containerd
from runtimeproxy.testbed.daemons import Daemon
from runtimeproxy.testbed.runtimes import SERIES_SUITES
from runtimeproxy.testbed.serve_args import proxy_serve_args

REPO = Path(__file__).resolve().parents[2]
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> /systemctl.calls
case "$1" in
  is-enabled) [ -e "/systemctl.state/enabled-$3" ] ;;
  is-active) [ -e "/systemctl.state/active-$3" ] ;;
  show) if [ -e "/etc/systemd/system/$4" ]; then echo loaded; else echo not-found; fi ;;
  enable) touch "/systemctl.state/enabled-$3" "/systemctl.state/active-$3" ;;
  disable) rm -f "/systemctl.state/enabled-$3" "/systemctl.state/active-$3" ;;
esac
"""
KUBELET_UNIT = "[Service]\nExecStart=/usr/bin/kubelet\n"
OLD_DROP_IN = "[Service]\n# an older switch of kubelet's endpoint\n"
# The calls that change something (queries are left out).
CHANGING = ("daemon-reload", "enable", "disable", "restart", "try-restart")


class Host:
    """The temporary host root and what its systemctl was asked."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def calls(self) -> list[str]:
        path = self.root / "systemctl.calls"
        return path.read_text().splitlines() if path.exists() else []

    def changing_calls(self) -> list[str]:
        return [call for call in self.calls() if call.split()[0] in CHANGING]

    def forget_calls(self) -> None:
        (self.root / "systemctl.calls").unlink(missing_ok=True)

    def snapshot(self) -> dict[str, tuple[str, int, bytes | str]]:
        """Every path under the root but the stand-in's log and state and /run: kind, mode, content."""
        found: dict[str, tuple[str, int, bytes | str]] = {}
        for path in sorted(self.root.rglob("*")):
            relative = str(path.relative_to(self.root))
            if relative.startswith(("systemctl.", "run/")):  # the stand-in's state, the live proxy's
                continue
            mode = stat.S_IMODE(path.lstat().st_mode)
            if path.is_symlink():
                found[relative] = ("symlink", mode, os.readlink(path))
            elif path.is_dir():
                found[relative] = ("dir", mode, "")
            else:
                found[relative] = ("file", mode, path.read_bytes())
        return found

    def file(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")


def make_host(kubelet: bool = True) -> Host:
    # Short: the proxy's socket path lies inside it (unix socket paths are limited).
    root = Path(tempfile.mkdtemp(prefix="rtpx-host-", dir="/tmp"))
    for directory in ("bin", "usr/bin", "usr/local/bin", "run/systemd/system", "etc/systemd/system", "etc/default",
                      "var", "systemctl.state"):
        (root / directory).mkdir(parents=True)
    shutil.copy2("/bin/busybox", root / "bin/busybox")
    for applet in ("sh", "touch", "rm"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "var/run").symlink_to("/run")  # absolute, as on a host: resolved inside the root
    (root / "usr/bin/systemctl").write_text(FAKE_SYSTEMCTL)
    (root / "usr/bin/systemctl").chmod(0o755)
    for script in ("runtime-proxy", "runtime-hooks"):  # installed as INSTALL.md step 1 says
        (root / "usr/local/bin" / script).write_text("#!/bin/sh\n")
        (root / "usr/local/bin" / script).chmod(0o755)
    if kubelet:
        (root / "etc/systemd/system/kubelet.service").write_text(KUBELET_UNIT)
    return Host(root)


@pytest.fixture
def host() -> Iterator[Host]:
    made = make_host()
    yield made
    shutil.rmtree(made.root, ignore_errors=True)


@pytest.fixture(scope="module")
def runtime() -> Iterator[Containerd]:
    bed = start_testbed(next(iter(SERIES_SUITES)))
    yield bed
    bed.stop()


@pytest.fixture
def proxy(host: Host, runtime: Containerd) -> Iterator[Daemon]:
    """runtime-proxy serving on the host root's socket, as its unit would."""
    socket = host.file("/run/runtimeproxy/runtimeproxy.sock")
    socket.parent.mkdir(parents=True)
    daemon = Daemon(host.root / "run", "proxy", proxy_serve_args(socket, runtime.address, host.root / "run/hooks.d"))
    daemon.wait_ready()
    yield daemon
    daemon.stop()


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def install(host: Host, *args: str) -> tuple[int, str]:
    return run("install", "--root", str(host.root), "--ready-timeout", "20", *args)


def uninstall(host: Host, *args: str) -> tuple[int, str]:
    return run("uninstall", "--root", str(host.root), *args)


# -- install ------------------------------------------------------------------------------


def test_dry_run_prints_every_change_and_makes_none(host: Host) -> None:
    before = host.snapshot()
    code, out = install(host, "--dry-run")
    assert code == 0, out
    assert host.snapshot() == before
    assert host.changing_calls() == []
    for line in ("would write /etc/systemd/system/runtime-proxy.service", "would write /etc/default/runtime-hooks",
                 "would systemctl enable --now runtime-proxy.service", f"would write {KUBELET_DROP_IN}",
                 "would systemctl restart kubelet.service", "would record the changes in"):
        assert line in out, out
    assert "dry run: " in out


def test_install_writes_the_shipped_files_then_switches_kubelet(host: Host, proxy: Daemon) -> None:
    code, out = install(host, "--hooks-setting", "RUNTIME_HOOKS_CGROUP_DRIVER=systemd")
    assert code == 0, out
    for unit in ("runtime-proxy.service", "runtime-hooks.service"):
        path = host.file(f"/etc/systemd/system/{unit}")
        assert path.read_bytes() == shipped(unit)
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert host.file("/etc/default/runtime-proxy").read_bytes() == shipped("runtime-proxy.env")
    hooks_env = host.file("/etc/default/runtime-hooks").read_text()
    assert hooks_env.startswith(shipped("runtime-hooks.env").decode())
    assert hooks_env.endswith("\nRUNTIME_HOOKS_CGROUP_DRIVER=systemd\n")
    drop_in = host.file(KUBELET_DROP_IN).read_text()
    assert drop_in == shipped("kubelet.service.d/10-runtime-proxy.conf").decode()
    assert "--container-runtime-endpoint=unix:///var/run/runtimeproxy/runtimeproxy.sock" in drop_in
    assert host.file("/etc/runtime/hookserver.d").is_dir()
    assert stat.S_IMODE(host.file("/var/lib/runtimeproxy/install.json").stat().st_mode) == 0o600
    # kubelet is switched only after the proxy answered.
    assert host.changing_calls() == ["daemon-reload", "enable --now runtime-hooks.service",
                                     "enable --now runtime-proxy.service", "daemon-reload",
                                     "restart kubelet.service"]
    assert out.index("runtime-proxy answers through") < out.index(f"write {KUBELET_DROP_IN}"), out


def test_a_second_install_changes_nothing_and_says_so(host: Host, proxy: Daemon) -> None:
    assert install(host)[0] == 0
    before = host.snapshot()
    host.forget_calls()
    code, out = install(host)
    assert code == 0, out
    assert "nothing to change" in out
    assert host.snapshot() == before
    assert host.changing_calls() == []


def test_a_changed_setting_rewrites_its_file_and_restarts_only_its_unit(host: Host, proxy: Daemon) -> None:
    assert install(host)[0] == 0
    host.forget_calls()
    code, out = install(host, "--proxy-setting", "RUNTIME_PROXY_LOG_LEVEL=debug")
    assert code == 0, out
    assert host.file("/etc/default/runtime-proxy").read_text().endswith("RUNTIME_PROXY_LOG_LEVEL=debug\n")
    assert host.changing_calls() == ["restart runtime-proxy.service"]


def test_a_settings_file_edited_on_the_host_is_kept(host: Host, proxy: Daemon) -> None:
    assert install(host)[0] == 0
    edited = host.file("/etc/default/runtime-hooks")
    edited.write_text(edited.read_text() + "RUNTIME_HOOKS_LOG_LEVEL=debug\n")
    code, out = install(host, "--hooks-setting", "RUNTIME_HOOKS_CGROUP_DRIVER=systemd")
    assert code == 0, out
    assert "keep /etc/default/runtime-hooks" in out
    assert edited.read_text().endswith("RUNTIME_HOOKS_LOG_LEVEL=debug\n")
    code, out = uninstall(host)
    assert code == 0, out
    assert "keep /etc/default/runtime-hooks: edited since install" in out
    assert edited.exists() and not host.file("/etc/default/runtime-proxy").exists()


def test_a_proxy_endpoint_setting_moves_kubelet_and_the_readiness_call(host: Host, runtime: Containerd) -> None:
    socket = host.file("/run/other/cri.sock")
    socket.parent.mkdir(parents=True)
    daemon = Daemon(host.root / "run", "proxy", proxy_serve_args(socket, runtime.address, host.root / "run/hooks.d"))
    try:
        daemon.wait_ready()
        code, out = install(host, "--proxy-setting", "RUNTIME_PROXY_ENDPOINT=unix:///var/run/other/cri.sock")
    finally:
        daemon.stop()
    assert code == 0, out
    assert "--container-runtime-endpoint=unix:///var/run/other/cri.sock" in host.file(KUBELET_DROP_IN).read_text()


def test_a_proxy_that_never_answers_leaves_kubelet_untouched(host: Host) -> None:
    code, out = run("install", "--root", str(host.root), "--ready-timeout", "0.5")
    assert code == 1
    assert "runtime-proxy is not serving: no answer to CRI Version" in out and "kubelet is left as it was" in out
    assert not host.file(KUBELET_DROP_IN).exists()
    assert "kubelet.service" not in " ".join(host.changing_calls())
    # What was done is recorded: uninstall takes it back.
    code, out = uninstall(host)
    assert code == 0, out
    assert not host.file("/etc/systemd/system/runtime-proxy.service").exists()


def test_without_kubelet_its_part_is_skipped_and_said(proxy: Daemon, host: Host) -> None:
    host.file("/etc/systemd/system/kubelet.service").unlink()
    code, out = install(host)
    assert code == 0, out
    assert "kubelet.service is not installed on this host: its drop-in is skipped" in out
    assert not host.file(KUBELET_DROP_IN).parent.exists()


def test_no_kubelet_option_leaves_kubelet_alone(proxy: Daemon, host: Host) -> None:
    code, out = install(host, "--no-kubelet")
    assert code == 0, out
    assert "kubelet left alone (--no-kubelet)" in out
    assert not host.file(KUBELET_DROP_IN).exists()


def test_no_hooks_installs_only_the_proxy(proxy: Daemon, host: Host) -> None:
    """Where runtime-hooks runs as the chart's DaemonSet: no runtime-hooks unit to fight its pod."""
    before = host.snapshot()
    code, out = install(host, "--no-hooks")
    assert code == 0, out
    assert not host.file("/etc/systemd/system/runtime-hooks.service").exists()
    assert not host.file("/etc/default/runtime-hooks").exists()
    assert host.file("/etc/systemd/system/runtime-proxy.service").read_bytes() == shipped("runtime-proxy.service")
    assert "enable --now runtime-hooks.service" not in host.changing_calls()
    assert "enable --now runtime-proxy.service" in host.changing_calls()
    assert uninstall(host)[0] == 0
    assert host.snapshot() == before


def test_no_hooks_stops_the_unit_an_earlier_install_enabled(proxy: Daemon, host: Host) -> None:
    before = host.snapshot()
    assert install(host)[0] == 0
    host.forget_calls()
    code, out = install(host, "--no-hooks")
    assert code == 0, out
    assert host.changing_calls() == ["disable --now runtime-hooks.service"]
    host.forget_calls()
    assert uninstall(host)[0] == 0
    assert "disable --now runtime-hooks.service" not in host.changing_calls()
    assert host.snapshot() == before  # its files, still recorded, are removed too


# -- uninstall -------------------------------------------------------------------------------


def test_uninstall_puts_back_exactly_what_was_there(host: Host, proxy: Daemon) -> None:
    host.file(KUBELET_DROP_IN).parent.mkdir()
    host.file(KUBELET_DROP_IN).write_text(OLD_DROP_IN)
    before = host.snapshot()
    assert install(host)[0] == 0
    assert host.snapshot() != before
    host.forget_calls()
    code, out = uninstall(host)
    assert code == 0, out
    assert host.snapshot() == before
    assert host.file(KUBELET_DROP_IN).read_text() == OLD_DROP_IN
    # kubelet back first, while the proxy still serves; then the units go.
    assert host.changing_calls() == ["daemon-reload", "try-restart kubelet.service",
                                     "disable --now runtime-proxy.service", "disable --now runtime-hooks.service",
                                     "daemon-reload"]
    code, out = uninstall(host)
    assert code == 0 and "nothing to undo" in out


def test_uninstall_dry_run_changes_nothing(host: Host, proxy: Daemon) -> None:
    assert install(host)[0] == 0
    before = host.snapshot()
    host.forget_calls()
    code, out = uninstall(host, "--dry-run")
    assert code == 0, out
    assert f"would remove {KUBELET_DROP_IN}" in out and "would systemctl disable --now runtime-proxy.service" in out
    assert host.snapshot() == before and host.changing_calls() == []


# -- refusals ----------------------------------------------------------------------------------


def test_not_root_is_refused(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_install.os, "geteuid", lambda: 1000)
    before = host.snapshot()
    code, out = install(host)
    assert code == 1 and "must run as root" in out
    assert host.snapshot() == before


def test_a_host_without_systemd_is_refused(host: Host) -> None:
    shutil.rmtree(host.file("/run/systemd"))
    before = host.snapshot()
    for command in (install, uninstall):
        code, out = command(host)
        assert code == 1 and "systemd is not running this host: no /run/systemd/system" in out, out
    assert host.snapshot() == before


def test_missing_daemons_are_named(host: Host) -> None:
    host.file("/usr/local/bin/runtime-hooks").unlink()
    code, out = install(host)
    assert code == 1 and "/usr/local/bin/runtime-hooks not found" in out and "--from" in out


@pytest.mark.parametrize("setting", ["RUNTIME_HOOKS_X=1", "NOT_OURS=1", "RUNTIME_PROXY_LOG_LEVEL"])
def test_a_bad_setting_is_refused_before_any_change(host: Host, setting: str) -> None:
    before = host.snapshot()
    code, out = install(host, "--proxy-setting", setting)
    assert code == 1 and f"{setting!r} is no RUNTIME_PROXY_NAME=value setting" in out, out
    assert host.snapshot() == before


# -- paths under the root ---------------------------------------------------------------------


def test_absolute_symlinks_resolve_inside_the_root(host: Host) -> None:
    resolved = HostRoot(host.root).path("/var/run/runtimeproxy/runtimeproxy.sock")
    assert resolved == host.root / "run/runtimeproxy/runtimeproxy.sock"


@given(st.lists(st.sampled_from(["..", ".", "etc", "var", "run", "x"]), max_size=8))
def test_no_host_path_leaves_the_root(parts: list[str]) -> None:
    root = Path("/tmp/rtpx-nonexistent-root")
    assert HostRoot(root).path("/" + "/".join(parts)).is_relative_to(root)


# -- the bundle -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle of this checkout for this Python, built as the docs say (with this environment's
    setuptools instead of a fetched one)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    glibc = int((os.confstr("CS_GNU_LIBC_VERSION") or "glibc 2.17").split()[1].split(".")[1])
    return build_bundle(REPO, tmp_path_factory.mktemp("bundle"), python=version, glibc_minor=glibc,
                        machine=os.uname().machine, build_isolation=False)


def test_the_bundle_holds_the_daemons_without_the_tools(bundle: Path) -> None:
    info = Bundle.open(bundle).info
    assert set(info["scripts"]) == {"runtime-proxy", "runtime-hooks"}
    with tarfile.open(bundle) as archive:
        names = archive.getnames()
    top = names[0].split("/")[0]
    for package in ("runtimeproxy/proxy/cli.py", "runtimeproxy/hooks/cli.py", "google/protobuf", "yaml",
                    "runtimeproxy/data/systemd/runtime-proxy.service"):
        assert any(name.startswith(f"{top}/lib/{package}") for name in names), package
    assert not any(name.startswith((f"{top}/lib/grpc", f"{top}/lib/kubernetes")) for name in names)


def test_install_from_the_bundle_runs_the_daemons_from_it(host: Host, proxy: Daemon, bundle: Path) -> None:
    for script in ("runtime-proxy", "runtime-hooks"):
        host.file(f"/usr/local/bin/{script}").unlink()
    python = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (host.root / "usr/bin/python3").symlink_to(python)
    (host.root / "usr/bin" / python).write_text("")  # the host's Python, by name
    before = host.snapshot()
    code, out = install(host, "--from", str(bundle))
    assert code == 0, out
    launcher = host.file("/usr/local/bin/runtime-proxy")
    assert os.readlink(launcher) == "/opt/runtimeproxy/bin/runtime-proxy"
    installed = host.file("/opt/runtimeproxy/bin")
    version = subprocess.run([installed / "runtime-proxy", "--version"], capture_output=True, text=True, check=False,
                             env={"PATH": "/usr/bin:/bin"})
    assert version.returncode == 0 and version.stdout.startswith("runtime-proxy, version"), version
    hooks = subprocess.run([installed / "runtime-hooks", "--help"], capture_output=True, text=True, check=False,
                           env={"PATH": "/usr/bin:/bin"})
    assert hooks.returncode == 0 and "serve" in hooks.stdout, hooks
    assert "nothing to change" in install(host, "--from", str(bundle))[1]
    code, out = uninstall(host)
    assert code == 0, out
    assert host.snapshot() == before


def test_a_bundle_for_another_python_is_refused(host: Host, bundle: Path) -> None:
    (host.root / "usr/bin/python3").symlink_to("python3.9")
    (host.root / "usr/bin/python3.9").write_text("")
    before = host.snapshot()
    code, out = install(host, "--from", str(bundle))
    assert code == 1 and "the host has Python 3.9: build a bundle for it" in out, out
    assert host.snapshot() == before
