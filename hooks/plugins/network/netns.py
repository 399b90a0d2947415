"""Network namespaces: running code in one, telling them apart, the link speed and addresses."""

from __future__ import annotations

import ctypes
import ipaddress
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

from .libc import libc

_T = TypeVar("_T")
_CLONE_NEWNET: Final = 0x40000000


def netns_path(netns: str | None) -> str | None:
    """The path of ``netns`` (a name under /run/netns, or a path); None for this process's own."""
    if not netns:
        return None
    return netns if "/" in netns else f"/run/netns/{netns}"


def run_in_netns(netns: str | None, fn: Callable[[], _T]) -> _T:
    """``fn()`` in a new thread, moved into network namespace ``netns`` (a name under /run/netns,
    a path such as /proc/PID/ns/net, or None for this process's own). A fresh thread also keeps
    pyroute2's sync API away from any running asyncio loop. Only that thread changes namespace."""
    path = netns_path(netns)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC) if path is not None else None
    outcome: list[Any] = []

    def target() -> None:
        try:
            if fd is not None and libc.setns(fd, _CLONE_NEWNET) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"setns({path}): {os.strerror(code)}")
            outcome.append((True, fn()))
        except BaseException as exc:
            outcome.append((False, exc))

    try:
        thread = threading.Thread(target=target, name="network-netns", daemon=True)
        thread.start()
        thread.join()
    finally:
        if fd is not None:
            os.close(fd)
    ok, value = outcome[0]
    if not ok:
        raise value
    result: _T = value
    return result


def netns_id_of(path: str) -> tuple[int, int]:
    """(st_dev, st_ino) of the namespace file at ``path``: equal for the same namespace."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def link_speed_mbit(interface: str, netns: str | None = None, sys_root: str = "/sys") -> int | None:
    """The interface's speed from ``/sys/class/net/<interface>/speed``; None when unknown (no such
    file, -1, or an interface in another namespace, which this process's sysfs does not show)."""
    if netns is not None:
        return None
    try:
        text = Path(sys_root, "class", "net", interface, "speed").read_text().strip()
        speed = int(text)
    except (OSError, ValueError):
        return None
    return speed if 0 < speed < 0xFFFFFFFF else None


def netns_addresses(netns: str) -> list[str]:
    """The global unicast addresses in network namespace ``netns`` (a path or /run/netns name)."""

    def work() -> list[str]:
        from pyroute2 import IPRoute

        found: list[str] = []
        with IPRoute() as ipr:
            for message in ipr.get_addr():
                text = message.get_attr("IFA_LOCAL") or message.get_attr("IFA_ADDRESS")
                if not text:
                    continue
                ip = ipaddress.ip_address(text)
                if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
                    continue
                if str(ip) not in found:
                    found.append(str(ip))
        return found

    return run_in_netns(netns, work)
