"""hooks/kernel_files.py: whole files with plain read(2)s, links followed only when asked."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.kernel_files import read_bytes


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
