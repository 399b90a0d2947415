from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtimeproxy.common.sdnotify import Watchdog, notify, watchdog_interval


def drain(sock: socket.socket) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(sock.recv(4096))
        except BlockingIOError:
            return got


@pytest.fixture
def receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A stand-in for systemd's notify socket at a filesystem path."""
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        yield sock


@pytest.fixture
def abstract_receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    name = f"runtimeproxy-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.setblocking(False)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        yield sock


def test_notify_without_socket_is_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False


def test_notify_path_socket(receiver: socket.socket) -> None:
    assert notify("READY=1\nSTATUS=serving") is True
    assert drain(receiver) == [b"READY=1\nSTATUS=serving"]


def test_notify_abstract_socket(abstract_receiver: socket.socket) -> None:
    assert notify("STOPPING=1") is True
    assert drain(abstract_receiver) == [b"STOPPING=1"]


def test_notify_sends_one_datagram_per_call(receiver: socket.socket) -> None:
    notify("READY=1")
    notify("STATUS=draining")
    assert drain(receiver) == [b"READY=1", b"STATUS=draining"]


def test_notify_missing_socket_returns_false(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert notify("READY=1") is False


def test_notify_unsupported_address_returns_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert notify("READY=1") is False


def test_notify_oversized_message_returns_false(receiver: socket.socket) -> None:
    assert notify("STATUS=" + "x" * (4 << 20)) is False


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}, 2.0),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(env) == expected


def test_watchdog_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert Watchdog().timeout == 4.0


async def test_watchdog_disabled_does_nothing(receiver: socket.socket) -> None:
    dog = Watchdog({})
    assert not dog.enabled
    assert dog.start() is False
    await asyncio.sleep(0.05)
    assert drain(receiver) == []


def test_watchdog_start_needs_running_loop() -> None:
    with pytest.raises(RuntimeError):
        Watchdog({"WATCHDOG_USEC": "100000"}).start()


async def test_watchdog_pings_every_half_interval(receiver: socket.socket) -> None:
    dog = Watchdog({"WATCHDOG_USEC": "100000"})  # 0.1 s: ping every 0.05 s
    assert dog.start() is True
    assert dog.start() is True  # idempotent: still one ping chain
    await asyncio.sleep(0.32)
    dog.stop()
    pings = drain(receiver)
    assert set(pings) == {b"WATCHDOG=1"}
    assert 3 <= len(pings) <= 8  # immediate ping + one per 0.05 s (7 when idle)


async def test_watchdog_stops(receiver: socket.socket) -> None:
    dog = Watchdog({"WATCHDOG_USEC": "100000"})
    dog.start()
    dog.stop()
    dog.stop()
    assert not dog.running
    drain(receiver)
    await asyncio.sleep(0.15)
    assert drain(receiver) == []


async def test_stuck_loop_stops_pings(receiver: socket.socket) -> None:
    dog = Watchdog({"WATCHDOG_USEC": "100000"})
    dog.start()
    drain(receiver)  # the immediate ping
    time.sleep(0.3)  # wedge the loop: no ping may be sent meanwhile
    assert drain(receiver) == []
    await asyncio.sleep(0.12)  # loop runs again: pings resume
    dog.stop()
    assert len(drain(receiver)) >= 1


async def test_watchdog_abstract_socket(abstract_receiver: socket.socket) -> None:
    dog = Watchdog({"WATCHDOG_USEC": "100000"})
    dog.start()
    await asyncio.sleep(0.01)
    dog.stop()
    assert drain(abstract_receiver) == [b"WATCHDOG=1"]
