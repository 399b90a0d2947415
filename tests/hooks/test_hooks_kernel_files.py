"""hooks/kernel_files.py: whole files with plain read(2)s, a setting with one write(2), links
followed only when asked."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.kernel_files import read_bytes, write_bytes


@given(st.binary(max_size=200_000))
def test_the_whole_content_comes_back_across_read_chunks(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("kf") / "file"
    path.write_bytes(data)
    assert read_bytes(path) == data
    assert read_bytes(str(path), follow=False) == data


def test_a_link_is_followed_only_when_asked(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"12345\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert read_bytes(link) == b"12345\n"
    with pytest.raises(OSError) as raised:
        read_bytes(link, follow=False)
    assert raised.value.errno == errno.ELOOP


def test_a_missing_file_raises_enoent(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "gone")


@given(st.binary(max_size=200_000))
def test_one_record_reads_the_whole_content_too(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("kf") / "file"
    path.write_bytes(data)
    assert read_bytes(path, one_record=True) == data
    assert read_bytes(path, follow=False, one_record=True) == data


@pytest.mark.parametrize(("size", "one_record", "reads"), [(7, True, 1), (0, True, 1), (7, False, 2), (65536, True, 2)])
def test_one_record_stops_at_a_short_first_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, one_record: bool, reads: int
) -> None:
    """A short first read is the whole record: the empty read after it is saved; a full one goes on."""
    path = tmp_path / "value"
    path.write_bytes(b"1" * size)
    calls: list[int] = []
    real_read = os.read

    def counting(fd: int, n: int) -> bytes:
        calls.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", counting)
    assert read_bytes(path, one_record=one_record) == b"1" * size
    assert len(calls) == reads


def test_a_name_is_read_below_a_directory_fd(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"0\n")
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_bytes("file", one_record=True, dir_fd=directory) == b"0\n"
        with pytest.raises(FileNotFoundError):
            read_bytes("gone", dir_fd=directory)
    finally:
        os.close(directory)


def test_a_setting_is_written_whole_into_an_existing_file_only(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"100000\n")
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        write_bytes("file", b"7\n", dir_fd=directory)  # truncated first
        with pytest.raises(FileNotFoundError):
            write_bytes("gone", b"1", dir_fd=directory)  # never created
    finally:
        os.close(directory)
    assert (tmp_path / "file").read_bytes() == b"7\n"
    assert not (tmp_path / "gone").exists()
    (tmp_path / "link").symlink_to(tmp_path / "file")
    with pytest.raises(OSError) as raised:
        write_bytes(tmp_path / "link", b"9", follow=False)
    assert raised.value.errno == errno.ELOOP
    assert (tmp_path / "file").read_bytes() == b"7\n"


def test_a_command_is_written_without_truncating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """truncate=False (resctrl's command files): opened without O_TRUNC, one write(2) as always."""
    (tmp_path / "schemata").write_bytes(b"L3:0=ff\n")
    flags: list[int] = []
    real_open = os.open

    def spying_open(path: object, flag: int, *args: object, **kwargs: object) -> int:
        flags.append(flag)
        return real_open(path, flag, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spying_open)
    write_bytes(tmp_path / "schemata", b"MB", truncate=False)
    write_bytes(tmp_path / "schemata", b"L3:0=0f\n")
    assert [bool(flag & os.O_TRUNC) for flag in flags] == [False, True]
    assert (tmp_path / "schemata").read_bytes() == b"L3:0=0f\n"
