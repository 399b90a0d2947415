"""Daemons (``runtime-proxy serve``, ``runtime-hooks serve``) as subprocesses, for end-to-end tests.

A `Daemon` runs one command with its own sd_notify socket (``NOTIFY_SOCKET``, a datagram socket
bound in the work directory) and its output in files there; it waits for READY=1, reads the
``<N>{json}`` log lines back and stops the process with SIGTERM (SIGKILL and fail if it lingers).
`ProxyAndHooks` lays out a proxy in front of the containerd test bed and a hook server in one
temporary directory and starts them. `eventually` polls a condition until it holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from runtimeproxy.testbed import Containerd

T = TypeVar("T")

CGROUP = Path("/sys/fs/cgroup")
PROXY = [sys.executable, "-c", "from runtimeproxy.cli import main; main()"]

READY_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0
# Settings from outside that would change what a daemon does: its own (RUNTIME_PROXY_*,
# RUNTIME_HOOKS_*) and a watchdog of the service manager running the tests.
DROP_ENV = ("RUNTIME_PROXY_", "RUNTIME_HOOKS_", "WATCHDOG_")


def eventually(check: Callable[[], T | None], timeout: float, context: Callable[[], str] = str) -> T:
    """The first value of ``check()`` that is neither None nor False, polled until ``timeout``;
    fails with ``context()`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s\n{context()}")
        time.sleep(0.05)


class Daemon:
    """A daemon subprocess with its own sd_notify socket, logging JSON lines to a file.

    The environment is this process's without the variables starting with one of ``drop_env``,
    plus ``env`` and NOTIFY_SOCKET. stdout and stderr go to ``<name>.log``, or with
    ``split_output`` to ``<name>.out`` and ``<name>.err``.
    """

    def __init__(
        self,
        workdir: Path,
        name: str,
        args: list[str],
        env: dict[str, str] | None = None,
        *,
        drop_env: tuple[str, ...] = DROP_ENV,
        split_output: bool = False,
        stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        self.name = name
        self.stop_timeout = stop_timeout
        self.stdout_path = workdir / f"{name}.out" if split_output else workdir / f"{name}.log"
        self.stderr_path = workdir / f"{name}.err" if split_output else None
        self.notify_path = workdir / f"{name}.notify"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notifications: list[str] = []
        full_env = {key: value for key, value in os.environ.items() if not key.startswith(drop_env)}
        full_env.update(env or {})
        full_env["NOTIFY_SOCKET"] = str(self.notify_path)
        with contextlib.ExitStack() as files:
            stdout = files.enter_context(self.stdout_path.open("wb"))
            stderr = files.enter_context(self.stderr_path.open("wb")) if self.stderr_path else subprocess.STDOUT
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=full_env, cwd=workdir
            )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait for READY=1 on the notify socket; fail with the daemon's output otherwise."""
        deadline = time.monotonic() + timeout
        self.notify.settimeout(0.1)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode} before READY=1\n{self.log()}")
            try:
                message = self.notify.recv(4096).decode()
            except TimeoutError:
                continue
            self.notifications.append(message)
            if "READY=1" in message.splitlines():
                return
        raise AssertionError(f"{self.name}: no READY=1 within {timeout}s; got {self.notifications}\n{self.log()}")

    def stdout(self) -> str:
        """What the daemon wrote to stdout (and to stderr, unless the two are split)."""
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        """What the daemon wrote to stderr, when the two are split ("" otherwise)."""
        return self.stderr_path.read_text(errors="replace") if self.stderr_path else ""

    def log(self) -> str:
        """All the daemon's output, for failure messages."""
        if self.stderr_path is None:
            return self.stdout()
        return f"--- stdout ---\n{self.stdout()}\n--- stderr ---\n{self.stderr()}"

    def records(self) -> list[dict[str, Any]]:
        """The JSON log records so far (lines are ``<N>{json}``, N the journald priority)."""
        found = []
        for line in self.stdout().splitlines():
            start = line.find("{")
            if start >= 0:
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line[start:]))
        return found

    def wait_record(self, match: Callable[[dict[str, Any]], bool], timeout: float = 10.0) -> dict[str, Any]:
        return eventually(lambda: next((r for r in self.records() if match(r)), None), timeout, self.log)

    def terminate(self, timeout: float | None = None) -> int:
        """SIGTERM and wait (``stop_timeout`` by default); the exit status (SIGKILL and fail if it
        does not exit)."""
        timeout = self.stop_timeout if timeout is None else timeout
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not exit within {timeout}s of SIGTERM\n{self.log()}") from None

    def kill(self) -> None:
        """SIGKILL (if still running), reap, and close the notify socket."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.notify.close()


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
        return [
            *PROXY,
            "serve",
            "--endpoint",
            f"unix://{self.proxy_endpoint}",
            "--remote-runtime-endpoint",
            self.containerd.address,
            "--hook-config-dir",
            str(self.config_dir),
            "--cgroup-parent-root",
            "/" + self.containerd.cgroup_prefix,
            "--log-format",
            "json",
        ]

    def hooks_args(self, command: list[str], resctrl_root: Path, *options: str) -> list[str]:
        """``runtime-hooks serve`` (``command``) on ``hooks_endpoint``, registering in ``config_dir``,
        on the host's cgroups as the test bed's runc makes them, logging JSON; then ``options``."""
        return [
            *command,
            "serve",
            "--endpoint",
            f"unix://{self.hooks_endpoint}",
            "--hook-config-dir",
            str(self.config_dir),
            "--cgroup-root",
            "/sys/fs/cgroup",
            "--cgroup-driver",
            "cgroupfs",  # the test bed's runc runs with SystemdCgroup = false
            "--cgroup-parent-root",
            f"/{self.containerd.cgroup_prefix}/kubepods",  # where the test bed's pods are
            "--resctrl-root",
            str(resctrl_root),
            "--log-format",
            "json",
            *options,
        ]

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


def remove_pod_cgroups(parent: str) -> None:
    """rmdir the pod's cgroup (and anything left below it) in every hierarchy, bottom-up."""
    for hierarchy in CGROUP.iterdir():
        top = hierarchy / parent.lstrip("/")
        if hierarchy.is_symlink() or not top.is_dir():
            continue
        for directory, _dirs, _files in os.walk(top, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(directory)
