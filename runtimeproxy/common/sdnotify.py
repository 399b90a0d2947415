"""systemd readiness and watchdog notifications (sd_notify(3) protocol, no libsystemd).

A notification is one datagram of ``KEY=VALUE`` lines sent to the AF_UNIX socket named
by ``$NOTIFY_SOCKET``; a leading ``@`` there names a socket in the abstract namespace.
Typical messages: ``READY=1``, ``STOPPING=1``, ``STATUS=...``, ``EXTEND_TIMEOUT_USEC=N``.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping

__all__ = ["Watchdog", "notify", "watchdog_interval"]

# A send only blocks if systemd's queue is full; bound it so a wedged manager cannot
# stall the event loop (Watchdog sends from it) for long.
_SEND_TIMEOUT = 1.0


def _socket_address(env: Mapping[str, str]) -> str | None:
    addr = env.get("NOTIFY_SOCKET", "")
    if addr.startswith("@"):
        return "\0" + addr[1:]
    if addr.startswith("/"):
        return addr
    return None  # unset, or a transport we do not speak (e.g. vsock:)


def notify(message: str) -> bool:
    """Send ``message`` to systemd. False when not under systemd or the send failed."""
    addr = _socket_address(os.environ)
    if addr is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(_SEND_TIMEOUT)
            sock.sendto(message.encode(), addr)
    except OSError:
        # Notifications are advisory; a failed one must never take the daemon down.
        return False
    return True


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """The watchdog timeout in seconds systemd set for this process, or None.

    Mirrors sd_watchdog_enabled(3): WATCHDOG_USEC must be a positive integer, and if
    WATCHDOG_PID is set it must be our pid (otherwise the variables were inherited).
    """
    env = os.environ if env is None else env
    pid = env.get("WATCHDOG_PID")
    if pid is not None and pid.strip() != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 1_000_000 if usec > 0 else None


class Watchdog:
    """Sends ``WATCHDOG=1`` every half watchdog interval from the running event loop.

    The pings are loop callbacks rather than a thread on purpose: if the loop wedges, the
    pings stop and systemd restarts the daemon, which is the point of the watchdog.
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.timeout = watchdog_interval(env)
        self._handle: asyncio.TimerHandle | None = None

    @property
    def enabled(self) -> bool:
        return self.timeout is not None

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self) -> bool:
        """Start pinging from the running loop; returns False when no watchdog is set.

        Must be called from a coroutine or callback on the loop (RuntimeError otherwise).
        """
        loop = asyncio.get_running_loop()
        if self.timeout is None:
            return False
        if self._handle is None:
            self._ping(loop, self.timeout / 2)
        return True

    def stop(self) -> None:
        """Stop pinging. Safe to call more than once and from any loop callback."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _ping(self, loop: asyncio.AbstractEventLoop, period: float) -> None:
        notify("WATCHDOG=1")
        self._handle = loop.call_later(period, self._ping, loop, period)
