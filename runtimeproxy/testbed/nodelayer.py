"""The per-run layer of the real-node tier: the project and this run's files, over the node image.

The cached node image (`noderoot`) holds everything that changes rarely. What changes with
every edit of the project goes into a second, small initramfs archive that the kernel
unpacks over the first:

* the project itself, installed system-wide from a copy of the source (as systemd/INSTALL.md
  installs its wheel, so the entry points land in /usr/local/bin) with
  the guest's own pip and Python, in a chroot on the host: an overlay mount whose lower
  layer is the cached root (never written) collects exactly the installed files;
* files the run adds (`RunLayer.add_file`, `add_tree`, `add_symlink`): configuration,
  the scenario's plan, images, units.

`RunLayer.build()` packs all of it with `noderoot.pack_cpio`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

from .noderoot import NodeImage, NodeImageError, chroot, pack_cpio

__all__ = ["RunLayer", "copy_source"]

# Never part of a source copy: VCS data, caches, build output.
_SOURCE_IGNORE = shutil.ignore_patterns(".git", ".tox", "*.egg-info", "__pycache__", ".mypy_cache",
                                        ".ruff_cache", ".pytest_cache", ".hypothesis", "build", "dist", "*.pyc")


def copy_source(source: Path, dest: Path) -> None:
    """The project's source tree without VCS data, caches or build output."""
    shutil.copytree(source, dest, ignore=_SOURCE_IGNORE, symlinks=True)


@contextlib.contextmanager
def _overlay(lower: Path, work: Path) -> Iterator[tuple[Path, Path]]:
    """(merged, upper): a writable view of `lower` whose changes all land in `upper`."""
    upper, scratch, merged = work / "upper", work / "overlay-work", work / "merged"
    for directory in (upper, scratch, merged):
        directory.mkdir(parents=True)
    options = f"lowerdir={lower},upperdir={upper},workdir={scratch}"
    done = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NodeImageError(f"overlay mount over {lower} failed: {done.stderr.strip()}")
    try:
        yield merged, upper
    finally:
        if subprocess.run(["umount", str(merged)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(merged)], capture_output=True, check=False)
        shutil.rmtree(scratch, ignore_errors=True)


def _whiteouts(upper: Path) -> list[str]:
    """Files the install deleted from the lower layer (overlay marks them as 0:0 devices):
    an initramfs cannot delete, so any would be a layer that does not mean what it says."""
    found = []
    for path in upper.rglob("*"):
        mode = path.lstat().st_mode
        if stat.S_ISCHR(mode) and path.lstat().st_rdev == 0:
            found.append(str(path.relative_to(upper)))
    return found


class RunLayer:
    """Collects this run's files in `work`/upper and packs them (see the module doc)."""

    def __init__(self, image: NodeImage, work: Path) -> None:
        self.image = image
        self.work = work
        self.upper = work / "upper"

    def install_project(self, source: Path) -> str:
        """`pip install` the project from a copy of `source` inside the image; pip's output."""
        with _overlay(self.image.root, self.work) as (merged, upper):
            copy_source(source, merged / "tmp/runtimeproxy-src")
            try:
                out = chroot(merged, "python3", "-m", "pip", "install", "--no-deps", "--no-index",
                             "--no-build-isolation", "--no-cache-dir", "--break-system-packages",
                             "--root-user-action=ignore", "/tmp/runtimeproxy-src", step="pip install (project)")
            finally:
                shutil.rmtree(merged / "tmp/runtimeproxy-src", ignore_errors=True)
            deleted = _whiteouts(upper)
        if deleted:
            raise NodeImageError(f"installing the project deleted files of the image: {deleted[:10]}")
        return out

    def _target(self, path: str) -> Path:
        if not path.startswith("/") or ".." in Path(path).parts:
            raise ValueError(f"layer paths are absolute and stay inside the root: {path!r}")
        target = self.upper / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def add_file(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        target = self._target(path)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
        os.chmod(target, mode)

    def add_tree(self, path: str, source: Path) -> None:
        shutil.copytree(source, self._target(path), dirs_exist_ok=True, ignore=_SOURCE_IGNORE)

    def add_symlink(self, path: str, points_to: str) -> None:
        target = self._target(path)
        target.unlink(missing_ok=True)
        target.symlink_to(points_to)

    def build(self) -> Path:
        """The packed layer (zstd cpio), beside `work`/upper."""
        self.upper.mkdir(parents=True, exist_ok=True)
        dest = self.work / "run.cpio.zst"
        pack_cpio(self.upper, dest, level=3)
        return dest
