"""The command lines of ``runtime-proxy serve`` and ``runtime-hooks serve`` on a test host: the
options every end-to-end test and benchmark gives them; each caller appends its own."""

from __future__ import annotations

from pathlib import Path

from .daemons import console_command


def proxy_serve_args(endpoint: Path, backend: str, hook_dir: Path, *options: str) -> list[str]:
    """``runtime-proxy serve`` on the unix socket ``endpoint`` in front of ``backend`` (an
    address), with the hook servers registered in ``hook_dir``; then ``options``."""
    return [
        *console_command("runtime-proxy", "runtimeproxy.proxy.cli"),
        "serve",
        "--endpoint",
        f"unix://{endpoint}",
        "--remote-runtime-endpoint",
        backend,
        "--hook-config-dir",
        str(hook_dir),
        *options,
    ]


def hooks_serve_args(
    command: list[str], endpoint: Path, hook_dir: Path, cgroup_root: str, pod_root: str, resctrl_root: Path
) -> list[str]:
    """``runtime-hooks serve`` (``command``) on the unix socket ``endpoint``, registering in
    ``hook_dir``, on the cgroups under ``cgroup_root`` as the test bed's runc makes them (cgroupfs
    driver), writing only pod cgroups below ``pod_root``, with resctrl at ``resctrl_root``."""
    return [
        *command,
        "serve",
        "--endpoint",
        f"unix://{endpoint}",
        "--hook-config-dir",
        str(hook_dir),
        "--cgroup-root",
        cgroup_root,
        "--cgroup-driver",
        "cgroupfs",  # the test bed's runc runs with SystemdCgroup = false
        "--cgroup-parent-root",
        pod_root,
        "--resctrl-root",
        str(resctrl_root),
    ]


def hooks_command() -> list[str]:
    """The ``runtime-hooks`` command of this interpreter's environment."""
    return console_command("runtime-hooks", "runtimeproxy.hooks.cli")
