"""The real-node tier's host-side pieces that need no VM: apt sources, the image key, the
results protocol, run-layer paths and qemu's command line. (The VM itself: tests/node/.)"""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.testbed import vm
from runtimeproxy.testbed.nodeflavour import FLAVOURS, SID_2X, TRIXIE_17, runtime_layer
from runtimeproxy.testbed.nodelayer import RunLayer
from runtimeproxy.testbed.nodeproto import DONE, PREFIX, encode, parse
from runtimeproxy.testbed.noderoot import NodeImage, NodeImageError, debian_mirror, image_key
from runtimeproxy.testbed.noderun import containerd_config
from runtimeproxy.testbed.runtimes import CACHE_ENV, RuntimeFetchError, locate

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


# -- node flavours ----------------------------------------------------------------------------


def test_guest_containerd_configs_per_major() -> None:
    v2 = tomllib.loads(containerd_config("localhost/pause:1"))
    cri = v2["plugins"]["io.containerd.grpc.v1.cri"]
    assert v2["version"] == 2 and cri["sandbox_image"] == "localhost/pause:1"
    assert cri["containerd"]["snapshotter"] == "native"
    assert cri["containerd"]["runtimes"]["runc"]["options"] == {"SystemdCgroup": True, "NoPivotRoot": True}
    v3 = tomllib.loads(containerd_config("localhost/pause:1", major=2))
    images, runtime = v3["plugins"]["io.containerd.cri.v1.images"], v3["plugins"]["io.containerd.cri.v1.runtime"]
    assert v3["version"] == 3 and images["snapshotter"] == "native"
    assert images["pinned_images"] == {"sandbox": "localhost/pause:1"}
    assert runtime["containerd"]["default_runtime_name"] == "runc"
    assert runtime["containerd"]["runtimes"]["runc"]["options"] == {"SystemdCgroup": True, "NoPivotRoot": True}
    assert v3["plugins"]["io.containerd.nri.v1.nri"] == {"disable": True}  # off, as on 1.7
    unpack = v3["plugins"]["io.containerd.transfer.v1.local"]["unpack_config"]
    assert unpack == [{"platform": "linux/amd64", "snapshotter": "native"}]  # ctr images import


@pytest.mark.parametrize("series", ["1.7", "2.x"])
def test_containerd_reads_the_guest_config_as_written(tmp_path: Path, series: str) -> None:
    """The build of each flavour's series (the host suites' 1.7 is trixie's, as in the image;
    their 2.x is the one the sid-2.x flavour boots) takes every setting: none is dropped as
    unknown, which containerd does without a word."""
    build = locate(series)
    config = tmp_path / "config.toml"
    config.write_text(containerd_config("localhost/pause:1", major=int(build.version.split(".")[0])))
    done = subprocess.run([build.binary("containerd"), "--config", str(config), "config", "dump"],
                          capture_output=True, text=True, timeout=60, check=True)
    dumped = tomllib.loads(done.stdout)["plugins"]
    if series == "1.7":
        cri = dumped["io.containerd.grpc.v1.cri"]
        sandbox, snapshotter, runtimes = cri["sandbox_image"], cri["containerd"]["snapshotter"], cri["containerd"]
    else:
        images = dumped["io.containerd.cri.v1.images"]
        sandbox, snapshotter = images["pinned_images"]["sandbox"], images["snapshotter"]
        runtimes = dumped["io.containerd.cri.v1.runtime"]["containerd"]
        assert dumped["io.containerd.nri.v1.nri"]["disable"] is True
        [unpack] = dumped["io.containerd.transfer.v1.local"]["unpack_config"]
        assert (unpack["platform"], unpack["snapshotter"]) == ("linux/amd64", "native")
    assert (sandbox, snapshotter, runtimes["default_runtime_name"]) == ("localhost/pause:1", "native", "runc")
    options = runtimes["runtimes"]["runc"]["options"]
    assert options["SystemdCgroup"] is True and options["NoPivotRoot"] is True


def _cpio_names(archive: Path) -> list[str]:
    listed = subprocess.run(f"zstd -dc {archive} | cpio -t --quiet", shell=True, capture_output=True, text=True,
                            check=True)
    return listed.stdout.split()


def test_a_flavours_runtimes_are_one_cached_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "runtimes"
    bin_dir = cache / "containerd-2.9.9" / "usr" / "bin"
    for name in ("containerd", "containerd-shim-runc-v2", "ctr"):
        (bin_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (bin_dir / name).write_text("#!/bin/sh\necho 'containerd x 2.9.9 y'\n")
        (bin_dir / name).chmod(0o755)
    (cache / "runc-1.3.9" / "usr" / "sbin").mkdir(parents=True)
    (cache / "runc-1.3.9" / "usr" / "sbin" / "runc").write_text("runc")
    monkeypatch.setenv(CACHE_ENV, str(cache))

    archive, versions = runtime_layer(SID_2X, tmp_path / "node")
    assert versions == {"containerd": "2.9.9", "runc": "1.3.9"}
    assert archive == tmp_path / "node" / "runtimes" / "containerd-2.9.9-runc-1.3.9.cpio.zst"
    assert {"usr/bin/containerd", "usr/bin/containerd-shim-runc-v2", "usr/bin/ctr", "usr/sbin/runc"} <= set(
        _cpio_names(archive))
    built = archive.stat().st_mtime_ns
    assert runtime_layer(SID_2X, tmp_path / "node") == (archive, versions) and archive.stat().st_mtime_ns == built
    assert sorted(p.name for p in archive.parent.iterdir()) == [archive.name]  # no work files left
    (cache / "runc-1.3.9").rename(cache / "gone")
    with pytest.raises(RuntimeFetchError, match="holds no runc"):
        runtime_layer(SID_2X, tmp_path / "node")
    with pytest.raises(ValueError, match="the image's own runtimes"):
        TRIXIE_17.builds()
    assert [flavour.name for flavour in FLAVOURS] == ["trixie-1.7", "sid-2.x"]
    assert {flavour.weight_conversion for flavour in FLAVOURS} == {"linear", "log-quadratic"}
