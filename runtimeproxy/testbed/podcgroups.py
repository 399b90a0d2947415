"""Pod cgroups made and removed as kubelet's pod container manager does around a pod: the test
bed has no kubelet, so the tests and benchmarks that need a pod cgroup do it themselves."""

from __future__ import annotations

import os
import time
from pathlib import Path

from .containerd import cgroup_hierarchies


def make_pod_cgroups(parent: str) -> None:
    """Create the pod cgroup ``parent`` in every mounted hierarchy, as kubelet does before it
    calls RunPodSandbox."""
    for hierarchy in cgroup_hierarchies():
        (hierarchy / parent.lstrip("/")).mkdir(parents=True, exist_ok=True)


def remove_pod_cgroups(parent: str, timeout: float = 0.0) -> list[str]:
    """rmdir the pod cgroup ``parent`` and anything left below it in every hierarchy,
    bottom-up, as kubelet does once the pod is gone; retried until ``timeout`` while the kernel
    still counts a dying task in one. What could not be removed, as ``path: reason``."""
    deadline = time.monotonic() + timeout
    while True:
        tops = [hierarchy / parent.lstrip("/") for hierarchy in cgroup_hierarchies()]
        left = [problem for top in tops for problem in _rmdir_tree(top)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _rmdir_tree(top: Path) -> list[str]:
    left = []
    for directory, _dirs, _files in os.walk(top, topdown=False):
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError as err:
            left.append(f"{directory}: {err.strerror}")
    return left
