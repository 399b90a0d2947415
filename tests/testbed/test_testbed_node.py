"""The real-node tier's host-side pieces that need no VM: apt sources, the image key, the
results protocol, run-layer paths and qemu's command line. (The VM itself: tests/node/.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.testbed import vm
from runtimeproxy.testbed.nodelayer import RunLayer
from runtimeproxy.testbed.nodeproto import DONE, PREFIX, encode, parse
from runtimeproxy.testbed.noderoot import NodeImage, NodeImageError, debian_mirror, image_key

DEB822 = """\
Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://off.example/debian
Suites: bookworm
Enabled: no

Types: deb
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
"""


def test_mirror_is_the_main_archive_of_a_deb822_file(tmp_path: Path) -> None:
    (tmp_path / "debian.sources").write_text(DEB822)
    assert debian_mirror([tmp_path]) == "http://mirror.example/debian"


def test_mirror_from_a_one_line_list(tmp_path: Path) -> None:
    sources = tmp_path / "sources.list"
    sources.write_text("# deb http://commented.example/debian bookworm main\n"
                       "deb http://security.example/debian-security bookworm-security main\n"
                       "deb [arch=amd64 signed-by=/k.gpg] http://plain.example/debian bookworm main contrib\n")
    assert debian_mirror([sources]) == "http://plain.example/debian"


def test_no_mirror_is_an_error_naming_the_files(tmp_path: Path) -> None:
    sources = tmp_path / "sources.list"
    sources.write_text("deb http://security.example/debian-security bookworm-security main\n")
    with pytest.raises(NodeImageError, match=r"no Debian archive.*sources\.list"):
        debian_mirror([sources, tmp_path / "missing.d"])


def test_image_key_changes_with_every_input_and_not_with_order() -> None:
    base = image_key("trixie", ["a", "b"], "linux-image-1", ["x>=1", "y"])
    assert base == image_key("trixie", ["b", "a"], "linux-image-1", ["y", "x>=1"])
    others = {image_key("sid", ["a", "b"], "linux-image-1", ["x>=1", "y"]),
              image_key("trixie", ["a"], "linux-image-1", ["x>=1", "y"]),
              image_key("trixie", ["a", "b"], "linux-image-2", ["x>=1", "y"]),
              image_key("trixie", ["a", "b"], "linux-image-1", ["x>=2", "y"])}
    assert base not in others and len(others) == 4


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                     max_leaves=12)


@given(facts=st.dictionaries(st.text(min_size=1), _json, max_size=5))
def test_facts_survive_the_serial_line(facts: dict[str, Any]) -> None:
    text = "kernel noise\r\n" + "".join(encode(n, d, 1.5).decode() for n, d in facts.items()) + "\x00\n"
    parsed = parse(text.replace("\n", "\r\n"))
    assert parsed.data == facts and not parsed.errors


def test_a_cut_line_and_a_repeated_fact_are_errors() -> None:
    text = (encode("a", 1, 1).decode() + encode("a", 2, 2).decode() + PREFIX + '{"name": "b", "t": 3, "da')
    parsed = parse(text)
    assert parsed.data == {"a": 2} and parsed.times == {"a": 2.0}
    assert len(parsed.errors) == 2 and "sent twice" in parsed.errors[0] and "unreadable" in parsed.errors[1]
    assert not parsed.complete
    assert parse(encode(DONE, {}, 9).decode()).complete


def test_a_fact_without_a_string_name_is_an_error() -> None:
    parsed = parse(PREFIX + json.dumps({"name": 3, "t": 1, "data": None}))
    assert not parsed.data and "string name" in parsed.errors[0]


@pytest.mark.parametrize("path", ["etc/relative", "/etc/../../escape", "/.."])
def test_run_layer_paths_stay_inside_the_root(tmp_path: Path, path: str) -> None:
    layer = RunLayer(NodeImage("k", tmp_path / "image"), tmp_path / "work")
    with pytest.raises(ValueError, match="inside the root"):
        layer.add_file(path, "x")


def test_run_layer_files_land_under_upper(tmp_path: Path) -> None:
    layer = RunLayer(NodeImage("k", tmp_path / "image"), tmp_path / "work")
    layer.add_file("/etc/a/b.conf", "v", mode=0o600)
    layer.add_symlink("/etc/systemd/system/x.service", "/dev/null")
    assert (layer.upper / "etc/a/b.conf").read_text() == "v"
    assert (layer.upper / "etc/a/b.conf").stat().st_mode & 0o777 == 0o600
    assert (layer.upper / "etc/systemd/system/x.service").readlink() == Path("/dev/null")


def test_qemu_runs_tcg_without_network_or_disks(tmp_path: Path) -> None:
    cmd = vm.qemu_command(tmp_path / "k", tmp_path / "i", tmp_path / "c", tmp_path / "r", memory_mb=512, cpus=2)
    assert cmd[cmd.index("-accel") + 1] == "tcg" and "-nodefaults" in cmd
    assert not any(arg in cmd for arg in ("-netdev", "-drive", "-hda", "-enable-kvm"))
    assert [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-serial"] == [f"file:{tmp_path}/c", f"file:{tmp_path}/r"]


def test_archives_are_concatenated_on_4_byte_boundaries(tmp_path: Path) -> None:
    parts = [tmp_path / "a", tmp_path / "b"]
    parts[0].write_bytes(b"12345")
    parts[1].write_bytes(b"xy")
    vm._concatenate(parts, tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"12345\0\0\0xy\0\0"


def test_boot_without_qemu_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vm.shutil, "which", lambda _name: None)
    with pytest.raises(vm.VMError, match=r"node-deps\.sh"):
        vm.boot(tmp_path / "k", [], tmp_path, timeout=1)
