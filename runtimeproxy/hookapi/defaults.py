"""Defaults both ends of a hook call start from, so that the proxy and runtime-hooks agree
without being told: where pods' cgroups are, how fast a registration change is seen, and the
longest hook timeout a registration may ask for."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_CGROUP_ROOTS", "DEFAULT_POLL_INTERVAL", "MAX_TIMEOUT"]

#: kubelet's pod cgroups: cgroupfs driver, systemd driver. runtime-hooks uses the same default.
DEFAULT_CGROUP_ROOTS: Final = ("/kubepods", "kubepods.slice")
#: How often the hook config directory is polled when inotify cannot watch it (and, times
#: dirwatch.SAFETY_NET_FACTOR, when it can); a hook server that unregisters keeps serving a
#: few of these (runtime-hooks --deregister-grace) so the proxy notices first either way.
DEFAULT_POLL_INTERVAL: Final = 0.2
#: The longest per-hook timeout a registration file may give (seconds); runtime-hooks never
#: registers a longer one.
MAX_TIMEOUT: Final = 120.0
