"""systemctl acting on the systemd of the host whose root is a `HostRoot`.

On the host itself that is plain ``systemctl``. With the host mounted elsewhere (the installer pod
mounts it at /host, its /run included) it is the host's own systemctl run in a chroot of that
root: it talks to the host's PID 1 through the root's /run/systemd/private (or the system bus under
/run/dbus), so its version always matches the host's systemd, and no D-Bus client is needed in the
pod. systemctl ignores most verbs in a chroot unless $SYSTEMD_IGNORE_CHROOT is set, which says it is
meant (``systemctl --root`` only edits files: it can neither reload nor start units).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from runtimeproxy.proxy.host_root import HostRoot

__all__ = ["Systemctl", "SystemdError"]

_TIMEOUT_S = 300  # a start job of a Type=notify unit waits for its READY=1


class SystemdError(RuntimeError):
    """systemd is missing, or a systemctl call failed (the message says which and why)."""


class Systemctl:
    def __init__(self, host: HostRoot) -> None:
        self.host = host

    def command(self, *args: str) -> list[str]:
        if self.host.is_own_root:
            return ["systemctl", *args]
        return ["chroot", str(self.host.root), "systemctl", *args]

    def check_present(self) -> None:
        """SystemdError unless the host runs systemd as PID 1 (sd_booted: /run/systemd/system
        exists) and has systemctl."""
        if not self.host.is_dir("/run/systemd/system"):
            where = "" if self.host.is_own_root else f" under {self.host.root} (is the host's /run mounted there?)"
            raise SystemdError(f"systemd is not running this host: no /run/systemd/system{where}")
        if not self.host.is_own_root and not any(
            self.host.path(f"{d}/systemctl").exists() for d in ("/usr/bin", "/bin")
        ):
            raise SystemdError(f"no systemctl in {self.host.root}/usr/bin or {self.host.root}/bin")

    def _run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        cmd = self.command(*args)
        env = {**os.environ, "SYSTEMD_IGNORE_CHROOT": "1", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S, env=env, check=False)
        except FileNotFoundError as exc:
            raise SystemdError(f"{cmd[0]} not found: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise SystemdError(f"`{' '.join(cmd)}` gave no answer within {_TIMEOUT_S} s") from exc

    def run(self, *args: str) -> None:
        """One change (daemon-reload, enable --now, restart...); SystemdError if it fails."""
        done = self._run(args)
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip()
            raise SystemdError(f"`systemctl {' '.join(args)}` failed (exit {done.returncode}): {detail}")

    def is_enabled(self, unit: str) -> bool:
        return self._run(["is-enabled", "--quiet", unit]).returncode == 0

    def is_active(self, unit: str) -> bool:
        return self._run(["is-active", "--quiet", unit]).returncode == 0

    def is_loaded(self, unit: str) -> bool:
        """Whether systemd knows the unit (a unit file for it exists)."""
        done = self._run(["show", "--property=LoadState", "--value", unit])
        return done.returncode == 0 and done.stdout.strip() == "loaded"
