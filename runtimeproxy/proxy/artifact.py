"""The runtimeproxy bundle: the daemons and their dependencies, unpacked and ready to run, for
hosts with one Python version and platform; no build, compiler, pip or index on the host.

A bundle is a ``.tar.gz`` of one directory, installed as /opt/runtimeproxy:

* ``lib/``: runtimeproxy's wheel and those of its runtime dependencies (not the tools' extra),
  unpacked as pip would install them into site-packages, distribution metadata included (the
  runtime-hooks plugins are found through their entry points);
* ``bin/``: one launcher per console script, run by the host's ``/usr/bin/python3`` in isolated
  mode (-I: no PYTHONPATH, no user site) with ``lib/`` first on sys.path; it refuses a Python of
  another version than the bundle's (protobuf, PyYAML, uvloop and dbus-fast ship compiled code
  for one CPython version);
* ``bundle.json``: name, version, Python version, platform, the launchers and each wheel's sha256.

Build one (on any machine with pip and access to the package index; the wheels are picked for
the target with pip's --python-version/--platform, binary only)::

    python -m runtimeproxy.proxy.artifact --source . --out dist/ --python 3.13 --glibc 2.41

then on the host ``runtime-proxy install --from BUNDLE`` (or, with no runtime-proxy there yet,
from the bundle itself: ``tar -xzf BUNDLE -C /tmp`` and
``/tmp/runtimeproxy-*/bin/runtime-proxy install --from BUNDLE``).
"""

from __future__ import annotations

import configparser
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import click

__all__ = ["BUNDLE_FILE", "Bundle", "BundleError", "build_bundle", "launcher"]

BUNDLE_FILE = "bundle.json"
# Never part of the source copy a wheel is built from: VCS data, caches, build output.
_SOURCE_IGNORE = shutil.ignore_patterns(".git", ".tox", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
                                        "build", "dist", "*.pyc")
_OLDEST_MANYLINUX = 17


class BundleError(RuntimeError):
    """A bundle that cannot be built, read or used here; the message says why."""


def launcher(module: str, function: str, python: str) -> str:
    """The script that runs `module:function` from the bundle's lib/, with the host's Python."""
    return f'''#!/usr/bin/python3 -I
"""Launcher of a runtimeproxy bundle: runs {module}:{function} from the bundle's lib/."""
import os
import sys

if "%d.%d" % sys.version_info[:2] != "{python}":
    sys.exit("%s: this runtimeproxy bundle is built for Python {python}, not %s (%s)"
             % (sys.argv[0], sys.version.split()[0], sys.executable))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "lib"))
from {module} import {function}

sys.exit({function}())
'''


@dataclass(frozen=True)
class Bundle:
    """A built bundle: a .tar.gz or its unpacked directory."""

    source: Path
    info: dict[str, Any]

    @property
    def python(self) -> str:
        return str(self.info["python"])

    @property
    def scripts(self) -> list[str]:
        return sorted(self.info["scripts"])

    @property
    def label(self) -> str:
        return f"{self.info['name']} {self.info['version']} for Python {self.python} ({self.info['platform']})"

    @classmethod
    def open(cls, source: Path) -> Bundle:
        try:
            if source.is_dir():
                info = json.loads((source / BUNDLE_FILE).read_text())
            else:
                with tarfile.open(source, "r:gz") as archive:
                    top = _top_dir(archive)
                    member = archive.extractfile(f"{top}/{BUNDLE_FILE}")
                    if member is None:
                        raise BundleError(f"{source}: {top}/{BUNDLE_FILE} is no file")
                    info = json.loads(member.read())
        except (OSError, KeyError, ValueError, tarfile.TarError) as exc:
            raise BundleError(f"{source} is not a runtimeproxy bundle: {exc}") from exc
        if not {"name", "version", "python", "platform", "scripts"} <= set(info):
            raise BundleError(f"{source}: {BUNDLE_FILE} lacks name, version, python, platform or scripts")
        return cls(source, info)

    def unpack(self, dest: Path) -> None:
        """The bundle's directory as `dest` (which must not exist)."""
        if self.source.is_dir():
            shutil.copytree(self.source, dest, symlinks=True)
            return
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}-") as scratch, \
                tarfile.open(self.source, "r:gz") as archive:
            top = _top_dir(archive)
            archive.extractall(scratch, filter="data")  # no absolute paths, no escapes, no devices
            os.replace(Path(scratch) / top, dest)


def _top_dir(archive: tarfile.TarFile) -> str:
    tops = {PurePosixPath(name).parts[0] for name in archive.getnames()}
    if len(tops) != 1:
        raise BundleError(f"a bundle holds one directory; this one holds {sorted(tops)[:5]}")
    return tops.pop()


# -- building -----------------------------------------------------------------------------


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise BundleError(f"{what} failed (exit {done.returncode}): {' '.join(cmd)}\n{tail}")


def _platforms(glibc_minor: int, machine: str) -> list[str]:
    return [f"manylinux_2_{minor}_{machine}" for minor in range(_OLDEST_MANYLINUX, glibc_minor + 1)] + [
        f"manylinux2014_{machine}", f"manylinux1_{machine}", "any"]


def _wheels(source: Path, work: Path, python: str, glibc_minor: int, machine: str, build_isolation: bool) -> Path:
    """runtimeproxy's wheel built from a copy of `source`, and its runtime dependencies' wheels
    for the target, in one directory."""
    copy = work / "source"
    shutil.copytree(source, copy, ignore=_SOURCE_IGNORE, symlinks=True)
    wheels = work / "wheels"
    isolation = [] if build_isolation else ["--no-build-isolation"]
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(wheels), str(copy)],
         "building runtimeproxy's wheel")
    [own] = wheels.glob("runtimeproxy-*.whl")
    digits = python.replace(".", "")
    platforms = [arg for tag in _platforms(glibc_minor, machine) for arg in ("--platform", tag)]
    _run([sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels), "--only-binary=:all:",
          "--python-version", python, "--implementation", "cp", "--abi", f"cp{digits}", "--abi", "abi3",
          "--abi", "none", *platforms, str(own)], "downloading the dependencies' wheels")
    return wheels


def _unpack_wheel(wheel: Path, lib: Path) -> None:
    """A wheel's files as pip installs them into site-packages: its .data/purelib and platlib
    merged in; its scripts, headers and data are not needed by the daemons."""
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            parts = PurePosixPath(name).parts
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            if ".." in parts or name.endswith("/"):
                continue
            target = lib.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(name))


def _console_scripts(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser(delimiters=("=",))
        parser.read_string(archive.read(name).decode())
    return dict(parser["console_scripts"]) if parser.has_section("console_scripts") else {}


def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def build_bundle(source: Path, out: Path, *, python: str, glibc_minor: int, machine: str,
                 build_isolation: bool = True) -> Path:
    """Build the bundle of the project at `source` for CPython `python` (X.Y) on `machine` with
    glibc 2.`glibc_minor` or newer; the path of the .tar.gz written into `out`."""
    with tempfile.TemporaryDirectory(prefix="runtimeproxy-bundle-") as scratch:
        work = Path(scratch)
        wheels = _wheels(source, work, python, glibc_minor, machine, build_isolation)
        [own] = wheels.glob("runtimeproxy-*.whl")
        version = own.name.split("-")[1]
        platform_tag = f"manylinux_2_{glibc_minor}_{machine}"
        top = f"runtimeproxy-{version}-cp{python.replace('.', '')}-{platform_tag}"
        root = work / top
        for wheel in sorted(wheels.glob("*.whl")):
            _unpack_wheel(wheel, root / "lib")
        scripts = _console_scripts(own)
        (root / "bin").mkdir()
        for script, target in scripts.items():
            module, _, function = target.strip().partition(":")
            path = root / "bin" / script
            path.write_text(launcher(module, function, python))
            path.chmod(0o755)
        info = {"name": "runtimeproxy", "version": version, "python": python, "platform": platform_tag,
                "scripts": scripts,
                "wheels": {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in sorted(wheels.glob("*.whl"))}}
        (root / BUNDLE_FILE).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        out.mkdir(parents=True, exist_ok=True)
        dest = out / f"{top}.tar.gz"
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            archive.add(root, arcname=top, filter=_tar_filter)
        dest.write_bytes(buffer.getvalue())
        return dest


def _host_glibc_minor() -> int:
    version = os.confstr("CS_GNU_LIBC_VERSION") or "glibc 2.17"
    return int(version.split()[1].split(".")[1])


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--source", type=click.Path(exists=True, file_okay=False, path_type=Path), default=".",
              show_default=True, help="The project's source tree (copied; nothing is written into it).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default="dist", show_default=True,
              help="Directory the bundle is written to.")
@click.option("--python", "python", default=f"{sys.version_info[0]}.{sys.version_info[1]}", show_default=True,
              help="The hosts' CPython version (X.Y): the bundle runs on that one only.")
@click.option("--glibc", default=f"2.{_host_glibc_minor()}", show_default=True,
              help="The oldest glibc of the hosts (2.N): no wheel needing a newer one is taken.")
@click.option("--machine", default=platform.machine(), show_default=True, help="The hosts' architecture.")
@click.option("--build-isolation/--no-build-isolation", default=True, show_default=True,
              help="Build runtimeproxy's wheel in an isolated environment (pip fetches setuptools), or "
                   "with this Python's setuptools.")
def main(source: Path, out: Path, python: str, glibc: str, machine: str, build_isolation: bool) -> None:
    """Build a runtimeproxy bundle: the daemons with their dependencies, for `runtime-proxy install --from`."""
    try:
        minor = int(glibc.split(".")[1])
        path = build_bundle(source, out, python=python, glibc_minor=minor, machine=machine,
                            build_isolation=build_isolation)
    except (BundleError, IndexError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(path))


if __name__ == "__main__":
    main()
