from __future__ import annotations

import asyncio
import fcntl
import grp
import os
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import runtimeproxy
from runtimeproxy.common.listener import AlreadyServing, UnixListener, open_unix_listener

# Fails (never skips) without root: chown to another group needs it.
needs_root = pytest.mark.usefixtures("require_root")


@pytest.fixture
def sock_path(tmp_path: Path) -> str:
    return str(tmp_path / "run" / "proxy.sock")


@pytest.fixture
def listener(sock_path: str) -> Iterator[UnixListener]:
    lst = open_unix_listener(sock_path)
    yield lst
    lst.close()


def mode_of(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def connects(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        try:
            c.connect(path)
        except OSError:
            return False
    return True


def leave_stale_socket(path: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # the file stays, nobody listens: what a crashed server leaves behind


def test_modes_of_socket_and_created_dir(listener: UnixListener, sock_path: str) -> None:
    assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    assert mode_of(sock_path) == 0o660
    assert mode_of(os.path.dirname(sock_path)) == 0o750


def test_custom_modes(tmp_path: Path) -> None:
    path = str(tmp_path / "a" / "b" / "s.sock")
    with open_unix_listener(path, mode=0o600, dir_mode=0o700):
        assert mode_of(path) == 0o600
        assert mode_of(os.path.dirname(path)) == 0o700


def test_existing_dir_is_left_alone(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    with open_unix_listener(str(tmp_path / "s.sock"), dir_mode=0o700):
        assert mode_of(str(tmp_path)) == 0o755


def test_umask_is_restored(sock_path: str) -> None:
    before = os.umask(0o022)
    try:
        with open_unix_listener(sock_path):
            assert os.umask(0o022) == 0o022
    finally:
        os.umask(before)


def test_socket_is_listening_and_nonblocking(listener: UnixListener, sock_path: str) -> None:
    assert listener.path == sock_path
    assert listener.sock.getblocking() is False
    assert listener.fileno() == listener.sock.fileno()
    assert connects(sock_path)


async def test_works_with_asyncio_server(listener: UnixListener, sock_path: str) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(echo, sock=listener.sock)
    async with server:
        reader, writer = await asyncio.open_unix_connection(sock_path)
        writer.write(b"ping\n")
        assert await reader.readline() == b"ping\n"
        writer.close()
        await writer.wait_closed()


def test_second_open_in_process_fails(listener: UnixListener, sock_path: str) -> None:
    with pytest.raises(AlreadyServing) as info:
        open_unix_listener(sock_path)
    assert info.value.path == sock_path
    assert info.value.pid == os.getpid()
    assert str(os.getpid()) in str(info.value)
    assert connects(sock_path)  # the first one is untouched


def test_second_open_from_other_process_fails(listener: UnixListener, sock_path: str) -> None:
    code = textwrap.dedent(
        f"""
        from runtimeproxy.common.listener import AlreadyServing, open_unix_listener
        try:
            open_unix_listener({sock_path!r})
        except AlreadyServing as exc:
            print(exc.pid)
            raise SystemExit(3)
        """
    )
    src_root = str(Path(runtimeproxy.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src_root}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.strip() == str(os.getpid())
    assert connects(sock_path)


def test_stale_socket_is_replaced(sock_path: str) -> None:
    os.makedirs(os.path.dirname(sock_path))
    leave_stale_socket(sock_path)
    assert not connects(sock_path)
    with open_unix_listener(sock_path):
        assert connects(sock_path)


def test_refuses_regular_file(sock_path: str) -> None:
    os.makedirs(os.path.dirname(sock_path))
    Path(sock_path).write_text("precious")
    with pytest.raises(FileExistsError, match="not a socket"):
        open_unix_listener(sock_path)
    assert Path(sock_path).read_text() == "precious"
    os.unlink(sock_path)
    with open_unix_listener(sock_path):  # the failed attempt released its lock
        pass


def test_refuses_directory(sock_path: str) -> None:
    os.makedirs(sock_path)
    with pytest.raises(FileExistsError, match="not a socket"):
        open_unix_listener(sock_path)


def test_detects_live_server_without_lock(sock_path: str) -> None:
    os.makedirs(os.path.dirname(sock_path))
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(sock_path)
    other.listen(1)
    try:
        with pytest.raises(AlreadyServing, match="answers on it") as info:
            open_unix_listener(sock_path)
        assert info.value.pid is None
        assert connects(sock_path)  # not removed
    finally:
        other.close()
    with open_unix_listener(sock_path):  # now it is stale, and the lock was released
        assert connects(sock_path)


def test_detects_live_datagram_socket(sock_path: str) -> None:
    os.makedirs(os.path.dirname(sock_path))
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as other:
        other.bind(sock_path)
        with pytest.raises(AlreadyServing):
            open_unix_listener(sock_path)
        assert os.path.exists(sock_path)


def test_close_removes_socket_and_releases_lock(sock_path: str) -> None:
    first = open_unix_listener(sock_path)
    first.close()
    first.close()  # idempotent
    assert not os.path.exists(sock_path)
    assert not os.path.exists(sock_path + ".lock")  # never left behind
    with open_unix_listener(sock_path):
        assert connects(sock_path)
        assert os.path.exists(sock_path + ".lock")
    assert not os.path.exists(sock_path + ".lock")


def test_a_failed_start_leaves_no_lock_file(sock_path: str) -> None:
    os.makedirs(sock_path)  # a directory where the socket should go
    with pytest.raises(FileExistsError):
        open_unix_listener(sock_path)
    assert not os.path.exists(sock_path + ".lock")


def test_a_lock_on_a_removed_lock_file_is_not_kept(sock_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A contender that opened the lock file just before its holder removed it on release
    # must not count the lock it then gets on the removed file: it opens the new one.
    os.makedirs(os.path.dirname(sock_path))
    lock_path = sock_path + ".lock"
    real_flock = fcntl.flock
    removed: list[bool] = []

    def flock_after_removal(fd: int, operation: int) -> None:
        if not removed:
            removed.append(True)
            os.unlink(lock_path)  # the holder's release, between our open and our flock
        real_flock(fd, operation)

    Path(lock_path).write_text("")
    monkeypatch.setattr(fcntl, "flock", flock_after_removal)
    with open_unix_listener(sock_path) as lst:
        assert os.fstat(lst.lock_fd).st_ino == os.stat(lock_path).st_ino
    assert removed == [True]


def test_close_leaves_a_socket_that_is_not_ours(sock_path: str) -> None:
    lst = open_unix_listener(sock_path)
    os.unlink(sock_path)  # someone replaced our file behind our back
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(sock_path)
        other.listen(1)
        lst.close()
        assert connects(sock_path)


def test_unknown_group(sock_path: str) -> None:
    with pytest.raises(ValueError, match="unknown group 'no-such-group-xyz'"):
        open_unix_listener(sock_path, group="no-such-group-xyz")
    assert not os.path.exists(os.path.dirname(sock_path))  # validated before side effects


@needs_root
def test_group_by_numeric_gid(sock_path: str) -> None:
    with open_unix_listener(sock_path, group="4242"):
        assert os.lstat(sock_path).st_gid == 4242
        assert os.lstat(os.path.dirname(sock_path)).st_gid == 4242
        assert mode_of(sock_path) == 0o660


@needs_root
def test_group_by_name(sock_path: str) -> None:
    name = grp.getgrgid(os.getgid()).gr_name
    with open_unix_listener(sock_path, group=name):
        assert os.lstat(sock_path).st_gid == os.getgid()


def test_path_too_long(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="longer than 107 bytes"):
        open_unix_listener(str(tmp_path / ("x" * 120)))


def test_relative_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_unix_listener("rel.sock") as lst:
        assert lst.path == str(tmp_path / "rel.sock")
        assert connects(lst.path)
