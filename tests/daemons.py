"""The proxy in front of the containerd test bed and a hook server, as subprocesses, for
end-to-end tests: `ProxyAndHooks` lays them out in one temporary directory and starts them.

The process helpers (`Daemon`, `eventually`, ...) live in runtimeproxy/testbed/daemons.py, shared
with the benchmarks; they are re-exported here for the tests. `spawn_hooks_serve` starts a bare
``runtime-hooks serve`` configured by its environment alone, for tests that talk to it directly.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtimeproxy.testbed import Containerd
from runtimeproxy.testbed.daemons import DROP_ENV, STOP_TIMEOUT, Daemon, eventually
from runtimeproxy.testbed.podcgroups import remove_pod_cgroups
from runtimeproxy.testbed.serve_args import hooks_serve_args, proxy_serve_args

__all__ = [
    "DROP_ENV",
    "HOOKS_CLI",
    "Daemon",
    "ProxyAndHooks",
    "eventually",
    "log_events",
    "reap",
    "spawn_hooks_serve",
]

# runtime-hooks from this interpreter's package, not an installed script (it may be older).
HOOKS_CLI = [sys.executable, "-c", "from runtimeproxy.hooks.cli import main; main()"]


def spawn_hooks_serve(env: Mapping[str, str]) -> subprocess.Popen[str]:
    """``runtime-hooks serve`` whose settings are all in ``env`` (its whole environment), its
    output piped as text; the caller stops it."""
    return subprocess.Popen([*HOOKS_CLI, "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def reap(process: subprocess.Popen[str]) -> None:
    """Kill `process` and wait for it if it still runs: the cleanup after a test that meant to stop
    it (and may have failed before)."""
    if process.poll() is None:
        process.kill()
        process.communicate()


def log_events(output: str) -> list[dict[str, Any]]:
    """The JSON log records in a daemon's output (a line may carry a prefix before its record)."""
    return [json.loads(line[line.index("{") :]) for line in output.splitlines() if "{" in line]


class ProxyAndHooks:
    """The proxy in front of the test bed and a hook server, in one short temporary directory
    (socket paths are limited): their command lines, starting them (each waited for READY=1),
    killing them. ``drop_env`` and ``stop_timeout`` go to every `Daemon`."""

    def __init__(
        self,
        containerd: Containerd,
        prefix: str,
        *,
        drop_env: tuple[str, ...] = DROP_ENV,
        stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        self.containerd = containerd
        self.workdir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        self.config_dir = self.workdir / "hookserver.d"
        self.proxy_endpoint = self.workdir / "proxy.sock"
        self.hooks_endpoint = self.workdir / "hooks.sock"
        self.services: list[Daemon] = []
        self.parents: list[str] = []  # pod cgroups a test made, removed by ``close``
        self.drop_env = drop_env
        self.stop_timeout = stop_timeout

    def proxy_args(self) -> list[str]:
        """``runtime-proxy serve`` on ``proxy_endpoint`` in front of the test bed, with the hook
        servers registered in ``config_dir``, logging JSON."""
        options = ("--cgroup-parent-root", "/" + self.containerd.cgroup_prefix, "--log-format", "json")
        return proxy_serve_args(self.proxy_endpoint, self.containerd.address, self.config_dir, *options)

    def hooks_args(self, command: list[str], resctrl_root: Path, *options: str) -> list[str]:
        """``runtime-hooks serve`` (``command``) on ``hooks_endpoint``, registering in ``config_dir``,
        on the host's cgroups where the test bed's pods are, logging JSON; then ``options``."""
        pods = f"/{self.containerd.cgroup_prefix}/kubepods"
        serve = hooks_serve_args(command, self.hooks_endpoint, self.config_dir, "/sys/fs/cgroup", pods, resctrl_root)
        return [*serve, "--log-format", "json", *options]

    def start_daemon(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Daemon:
        service = Daemon(self.workdir, name, args, env, drop_env=self.drop_env, stop_timeout=self.stop_timeout)
        self.services.append(service)
        service.wait_ready()
        return service

    def kill_daemons(self) -> None:
        for service in reversed(self.services):
            service.kill()

    def close(self) -> None:
        """Kill the daemons, remove the test bed's pods, the pod cgroups in ``parents`` and the
        work directory, each even when an earlier step failed."""
        try:
            self.kill_daemons()
        finally:
            try:
                self.containerd.remove_all_pods()
            finally:
                for parent in self.parents:
                    remove_pod_cgroups(parent)
                shutil.rmtree(self.workdir, ignore_errors=True)
