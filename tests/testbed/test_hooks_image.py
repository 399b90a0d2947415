"""What the runtime-hooks image takes from a node root: Python, its standard library, the project
and exactly its runtime dependencies (a fake root here; the node tier builds it from the real one)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from runtimeproxy.testbed.hooks_image import HooksImageError, build_hooks_image, hooks_layer

SITE = "usr/local/lib/python3.13/dist-packages"


def _dist(base: Path, name: str, requires: list[str], files: dict[str, str]) -> None:
    site = base / SITE
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    lines = "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n{lines}")
    record = [f"{name}-1.0.dist-info/METADATA,,"]
    for relative, content in files.items():
        path = (site / relative).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        record.append(f"{relative},sha256=x,1")
    (info / "RECORD").write_text("\n".join(record) + "\n")


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root, upper = tmp_path / "root", tmp_path / "upper"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3.13").write_text("not an ELF file here")
    (root / "usr/bin/python3").symlink_to("python3.13")
    for part in ("os.py", "test/test_os.py", "json/__init__.py", "idlelib/idle.py"):
        (root / "usr/lib/python3.13" / part).parent.mkdir(parents=True, exist_ok=True)
        (root / "usr/lib/python3.13" / part).write_text("")
    (root / "lib").symlink_to("usr/lib")
    (root / "run").mkdir()
    (root / "var").mkdir()
    (root / "var/run").symlink_to("/run")
    _dist(root, "Foo", ['Zed>=1; python_version >= "3.8"'], {"foo/__init__.py": ""})
    _dist(root, "zed", [], {"zed.py": ""})
    _dist(root, "bar", [], {"bar.py": ""})
    _dist(root, "old", [], {"old.py": ""})
    _dist(upper, "runtimeproxy", ["foo", 'bar; extra == "tools"', 'old; python_version < "3.0"'],
          {"runtimeproxy/__init__.py": "", "../../../bin/runtime-hooks": "#!/usr/bin/python3\n"})
    return root, upper


def _names(layer: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        return set(tar.getnames())


def test_takes_the_project_and_its_runtime_dependencies_only(tree: tuple[Path, Path]) -> None:
    layer, summary = hooks_layer(*tree)
    names = _names(layer)
    assert summary["distributions"] == ["foo", "runtimeproxy", "zed"]
    assert {f"{SITE}/foo/__init__.py", f"{SITE}/zed.py", f"{SITE}/runtimeproxy/__init__.py",
            "usr/local/bin/runtime-hooks", "usr/bin/python3", "usr/bin/python3.13",
            "usr/lib/python3.13/os.py", "usr/lib/python3.13/json/__init__.py"} <= names
    assert not {f"{SITE}/bar.py", f"{SITE}/old.py"} & names  # an extra's, a marker's
    assert not any(name.startswith(("usr/lib/python3.13/test", "usr/lib/python3.13/idlelib")) for name in names)
    assert {"tmp", "proc", "sys", "dev", "run"} <= names
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        var_run = tar.getmember("var/run")
        assert var_run.issym() and var_run.linkname == "/run"  # /var/run/dbus/... reaches the mounts under /run
        assert len(tar.getnames()) == len(names)  # each path once


def test_image_config_is_what_a_dockerfile_gives(tree: tuple[Path, Path], tmp_path: Path) -> None:
    dest = tmp_path / "image.tar"
    build_hooks_image(*tree, dest, ref="localhost/x/runtime-hooks:1")
    with tarfile.open(dest) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        [entry] = index["manifests"]
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == "localhost/x/runtime-hooks:1"
        manifest = json.load(tar.extractfile("blobs/sha256/" + entry["digest"].split(":")[1]))  # type: ignore[arg-type]
        config = json.load(tar.extractfile("blobs/sha256/" + manifest["config"]["digest"].split(":")[1]))  # type: ignore[arg-type]
    assert config["config"]["Cmd"] == ["runtime-hooks", "serve"]
    assert any(env.startswith("PATH=") and "/usr/local/bin" in env for env in config["config"]["Env"])
    assert manifest["layers"][0]["mediaType"] == "application/vnd.oci.image.layer.v1.tar"


def test_a_missing_dependency_is_named(tree: tuple[Path, Path]) -> None:
    root, upper = tree
    for path in (root / SITE).glob("zed*"):
        if path.is_dir():
            for child in path.iterdir():
                child.unlink()
            path.rmdir()
        else:
            path.unlink()
    with pytest.raises(HooksImageError, match="'zed'"):
        hooks_layer(root, upper)


def test_an_elf_file_outside_the_root_is_refused(tree: tuple[Path, Path]) -> None:
    root, upper = tree
    (upper / SITE / "runtimeproxy" / "__init__.py").write_bytes(b"\x7fELF rest")
    with pytest.raises(HooksImageError, match="outside the node root"):
        hooks_layer(root, upper)
