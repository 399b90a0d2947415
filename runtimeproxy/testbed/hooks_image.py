"""An OCI image of runtime-hooks, built from the real-node tier's root without a registry.

The image holds what ``runtime-hooks`` needs to run and nothing else, taken from the node
image's root with the run layer's installed files over it (the project as the guest has it):

* the guest's ``python3`` and its standard library (``lib-dynload`` included; tests, IDLE,
  tkinter and ensurepip left out);
* the project's distribution and its runtime dependencies, found from the distributions'
  own metadata (``Requires-Dist``, markers evaluated for the guest's Python, no extras),
  each with exactly the files its ``RECORD`` lists (entry-point scripts included);
* every shared library that Python and the extension modules link against, resolved by
  the guest's own dynamic loader (``ldd`` in a chroot of the root), with the symlinks on
  the way, and ``/etc/ld.so.cache``;
* the root's ``/var/run`` symlink to ``/run``, as any Debian base image has it: clients find
  sockets by either path (D-Bus's system bus is ``/var/run/dbus/system_bus_socket``), and the
  chart mounts them under ``/run``.

One uncompressed layer; the image config is what a Dockerfile with ``ENV PATH=...`` and
``CMD ["runtime-hooks", "serve"]`` gives.
"""

from __future__ import annotations

import email.parser
import io
import os
import re
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .images import DEFAULT_PATH, ImageSpec, tarinfo, write_image_tar

__all__ = ["HOOKS_IMAGE_REF", "HooksImageError", "build_hooks_image", "hooks_image_spec", "hooks_layer"]

HOOKS_IMAGE_REF = "localhost/runtimeproxy-testbed/runtime-hooks:1"
PROJECT = "runtimeproxy"
# Standard library parts runtime-hooks never imports (about half of it).
_STDLIB_SKIP = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "unittest",
                "venv", "config-")
_LDD_LINE = re.compile(r"^\s*(?:(\S+) => )?(\S+) \(0x[0-9a-f]+\)$")
_DIRS = {"dev": 0o755, "etc": 0o755, "proc": 0o555, "run": 0o755, "sys": 0o555, "tmp": 0o1777, "var": 0o755}


class HooksImageError(RuntimeError):
    """The root lacks something the image needs; the message names it."""


def hooks_image_spec(ref: str = HOOKS_IMAGE_REF) -> ImageSpec:
    return ImageSpec(ref=ref, cmd=["runtime-hooks", "serve"],
                     env=[DEFAULT_PATH, "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"])


@dataclass
class _Tree:
    """The merged view (``upper`` over ``root``) and the image paths picked from it."""

    root: Path
    upper: Path
    picked: set[str] = field(default_factory=set)

    def host(self, path: str) -> Path:
        relative = path.lstrip("/")
        over = self.upper / relative
        return over if os.path.lexists(over) else self.root / relative

    def add(self, path: str) -> None:
        """``path`` with its parent directories, following (and keeping) symlinks on the way."""
        parts = PurePosixPath(path).parts[1:]
        current = "/"
        for index, part in enumerate(parts):
            current = str(PurePosixPath(current) / part)
            host = self.host(current)
            if not os.path.lexists(host):
                raise HooksImageError(f"{current} is not in the node root")
            self.picked.add(current)
            if host.is_symlink():
                target = os.readlink(host)
                parent = PurePosixPath(current).parent
                resolved = os.path.normpath(target if target.startswith("/") else str(parent / target))
                self.add(str(PurePosixPath(resolved, *parts[index + 1 :])))
                return

    def add_tree(self, path: str, skip: tuple[str, ...] = ()) -> None:
        self.add(path)
        for base in (self.root, self.upper):
            top = base / path.lstrip("/")
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames[:] = [d for d in dirnames if not (dirpath == str(top) and d.startswith(skip))]
                for name in (*dirnames, *filenames):
                    self.picked.add("/" + str(Path(dirpath, name).relative_to(base)))


def _site_dirs(version: str) -> list[str]:
    """Where pip (``/usr/local``) and Debian's packages put distributions."""
    return [f"/usr/local/lib/python{version}/dist-packages", "/usr/lib/python3/dist-packages"]


def _distributions(tree: _Tree, version: str) -> dict[str, tuple[str, Path]]:
    """Normalised name -> (site directory in the image, its dist-info directory on the host)."""
    found: dict[str, tuple[str, Path]] = {}
    for site in _site_dirs(version):
        for base in (tree.upper, tree.root):
            directory = base / site.lstrip("/")
            if not directory.is_dir():
                continue
            for entry in sorted(directory.iterdir()):
                if entry.name.endswith(".dist-info") and (entry / "METADATA").is_file():
                    metadata = email.parser.Parser().parsestr((entry / "METADATA").read_text(errors="replace"))
                    found.setdefault(str(canonicalize_name(metadata["Name"])), (site, entry))
    return found


def _requirements(dist_info: Path, environment: dict[str, str]) -> list[str]:
    metadata = email.parser.Parser().parsestr((dist_info / "METADATA").read_text(errors="replace"))
    names = []
    for line in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({**environment, "extra": ""}):
            names.append(str(canonicalize_name(requirement.name)))
    return names


def _record_files(site: str, dist_info: Path) -> Iterator[str]:
    for line in (dist_info / "RECORD").read_text().splitlines():
        relative = line.rsplit(",", 2)[0].strip('"')
        if relative:
            yield os.path.normpath(str(PurePosixPath(site) / relative))


def _python_version(tree: _Tree) -> str:
    target = os.readlink(tree.host("/usr/bin/python3"))
    match = re.fullmatch(r"python(3\.\d+)", target)
    if match is None:
        raise HooksImageError(f"/usr/bin/python3 points to {target!r}, not to python3.N")
    return match.group(1)


def _guest_environment(version: str) -> dict[str, str]:
    environment: dict[str, str] = dict(default_environment())  # type: ignore[arg-type]
    environment.update(python_version=version, python_full_version=f"{version}.0",
                       implementation_version=f"{version}.0", sys_platform="linux", os_name="posix",
                       platform_system="Linux")
    return environment


def _add_project(tree: _Tree, version: str) -> list[str]:
    """The project and its runtime dependencies; their names."""
    dists = _distributions(tree, version)
    environment = _guest_environment(version)
    wanted: list[str] = [str(canonicalize_name(PROJECT))]
    seen: list[str] = []
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        if name not in dists:
            raise HooksImageError(f"distribution {name!r} (a runtime dependency) is not installed in the node root")
        seen.append(name)
        site, dist_info = dists[name]
        for path in _record_files(site, dist_info):
            if os.path.lexists(tree.host(path)):
                tree.add(path)
        wanted.extend(_requirements(dist_info, environment))
    return seen


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


def _linked_libraries(tree: _Tree, path: str) -> list[str]:
    """What the guest's loader loads for ``path`` (a file of the node root)."""
    done = subprocess.run(["chroot", str(tree.root), "/usr/bin/ldd", path], capture_output=True, text=True,
                          check=False)
    libraries = []
    for line in done.stdout.splitlines():
        if "not found" in line:
            raise HooksImageError(f"{path}: {line.strip()}")
        match = _LDD_LINE.match(line)
        if match and match.group(2).startswith("/"):
            libraries.append(match.group(2))
    if done.returncode != 0 and "not a dynamic executable" not in done.stderr + done.stdout:
        raise HooksImageError(f"ldd {path} failed: {done.stderr.strip()}")
    return libraries


def _add_libraries(tree: _Tree) -> int:
    elves = sorted(path for path in tree.picked if tree.host(path).is_file() and not tree.host(path).is_symlink()
                   and _is_elf(tree.host(path)))
    libraries: set[str] = set()
    for path in elves:
        if not (tree.root / path.lstrip("/")).exists():
            raise HooksImageError(f"{path}: an ELF file outside the node root, its libraries cannot be resolved")
        libraries.update(_linked_libraries(tree, path))
    for library in sorted(libraries):
        tree.add(library)
    return len(libraries)


def hooks_layer(root: Path, upper: Path) -> tuple[bytes, dict[str, object]]:
    """The image's one layer, and what went into it (for the test's evidence)."""
    tree = _Tree(root, upper)
    version = _python_version(tree)
    tree.add(f"/usr/bin/python{version}")
    tree.add("/usr/bin/python3")
    tree.add_tree(f"/usr/lib/python{version}", _STDLIB_SKIP)
    distributions = _add_project(tree, version)
    libraries = _add_libraries(tree)
    if os.path.exists(tree.host("/etc/ld.so.cache")):
        tree.add("/etc/ld.so.cache")
    if os.path.lexists(tree.host("/var/run")):
        tree.add("/var/run")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in sorted(_DIRS.items()):
            if f"/{name}" not in tree.picked:
                tar.addfile(tarinfo(name, tarfile.DIRTYPE, mode))
        for path in sorted(tree.picked):
            _add_entry(tar, path, tree.host(path))
    return buf.getvalue(), {"python": version, "distributions": sorted(distributions), "libraries": libraries,
                            "files": len(tree.picked)}


def _add_entry(tar: tarfile.TarFile, path: str, host: Path) -> None:
    info = host.lstat()
    name = path.lstrip("/")
    if stat.S_ISLNK(info.st_mode):
        entry = tarinfo(name, tarfile.SYMTYPE, 0o777)
        entry.linkname = os.readlink(host)
        tar.addfile(entry)
    elif stat.S_ISDIR(info.st_mode):
        tar.addfile(tarinfo(name, tarfile.DIRTYPE, stat.S_IMODE(info.st_mode)))
    elif stat.S_ISREG(info.st_mode):
        with open(host, "rb") as handle:
            tar.addfile(tarinfo(name, tarfile.REGTYPE, stat.S_IMODE(info.st_mode), info.st_size), handle)


def build_hooks_image(root: Path, upper: Path, dest: Path, ref: str = HOOKS_IMAGE_REF) -> dict[str, object]:
    """Write the image as an OCI layout tar at ``dest`` (``ctr images import`` takes it); what it holds."""
    layer, summary = hooks_layer(root, upper)
    write_image_tar([hooks_image_spec(ref)], layer, dest)
    summary["layer_bytes"] = len(layer)
    return summary
