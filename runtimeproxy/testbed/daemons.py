"""Our daemons (``runtime-proxy serve``, ``runtime-hooks serve``, a benchmark's hook server) as
subprocesses, for the end-to-end tests and the benchmarks alike.

A `Daemon` runs one command with its own sd_notify socket (``NOTIFY_SOCKET``, a datagram socket
bound in the work directory) and its output in files there; it waits for READY=1, reads the
``<N>{json}`` log lines back and stops the process with SIGTERM (SIGKILL if it lingers). The
functions below read a process's /proc figures (RSS, open fds) and find the commands to run.
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

READY_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0
# Settings from outside that would change what a daemon does: its own (RUNTIME_PROXY_*,
# RUNTIME_HOOKS_*) and a watchdog of the service manager running the caller.
DROP_ENV = ("RUNTIME_PROXY_", "RUNTIME_HOOKS_", "WATCHDOG_")


class DaemonError(RuntimeError):
    """A daemon did not become ready, or did not stop on SIGTERM."""


def eventually(check: Callable[[], T | None], timeout: float, context: Callable[[], str] = str) -> T:
    """The first value of ``check()`` that is neither None nor False, polled until ``timeout``;
    raises TimeoutError with ``context()`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s\n{context()}")
        time.sleep(0.05)


def console_command(script: str, module: str) -> list[str]:
    """The console script ``script`` of this interpreter's environment (else on PATH), or
    ``python -c`` calling ``module.main()`` when it is not installed as a script."""
    beside = Path(sys.executable).parent / script
    if beside.exists():
        return [str(beside)]
    found = shutil.which(script)
    if found:
        return [found]
    return [sys.executable, "-c", f"from {module} import main; main()"]


def stop_process(proc: subprocess.Popen[Any], timeout: float) -> int | None:
    """SIGTERM and wait up to ``timeout``; the exit status, or None when it had to be
    SIGKILLed. A process already gone is only reaped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def proc_status_kib(pid: int, key: str) -> int:
    """A kB (or count) field of /proc/<pid>/status, e.g. VmRSS, VmHWM or Threads."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(f"{key} not in /proc/{pid}/status")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a daemon's metrics address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Daemon:
    """A daemon subprocess with its own sd_notify socket, logging JSON lines to a file.

    The environment is this process's without the variables starting with one of ``drop_env``,
    plus ``env`` and NOTIFY_SOCKET. stdout and stderr go to ``<name>.log``, or with
    ``split_output`` to ``<name>.out`` and ``<name>.err``. With ``new_session`` it runs in a
    session of its own, so that a terminal's Ctrl-C reaches only the caller, which stops it.
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
        new_session: bool = False,
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
                args,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=full_env,
                cwd=workdir,
                start_new_session=new_session,
            )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait for READY=1 on the notify socket; raise DaemonError with the daemon's output otherwise."""
        deadline = time.monotonic() + timeout
        self.notify.settimeout(0.1)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DaemonError(f"{self.name} exited with {self.proc.returncode} before READY=1\n{self.log()}")
            try:
                message = self.notify.recv(4096).decode()
            except TimeoutError:
                continue
            self.notifications.append(message)
            if "READY=1" in message.splitlines():
                return
        raise DaemonError(f"{self.name}: no READY=1 within {timeout}s; got {self.notifications}\n{self.log()}")

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

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` of the daemon's log (stderr when the two are split)."""
        with contextlib.suppress(OSError):
            text = self.stderr() if self.stderr_path else self.stdout()
            return "\n".join(text.splitlines()[-lines:])
        return "(no log)"

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

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM and wait (``stop_timeout`` by default), then close the notify socket; the
        exit status, or None when the daemon had to be SIGKILLed."""
        code = stop_process(self.proc, self.stop_timeout if timeout is None else timeout)
        self.notify.close()
        return code

    def terminate(self, timeout: float | None = None) -> int:
        """SIGTERM and wait (``stop_timeout`` by default); the exit status. The notify socket
        stays open to be read; a daemon that lingers is SIGKILLed and raises DaemonError."""
        timeout = self.stop_timeout if timeout is None else timeout
        code = stop_process(self.proc, timeout)
        if code is None:
            self.notify.close()
            raise DaemonError(f"{self.name} did not exit within {timeout}s of SIGTERM\n{self.log()}")
        return code

    def kill(self) -> None:
        """SIGKILL (if still running), reap, and close the notify socket."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.notify.close()
