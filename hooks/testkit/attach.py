"""A fake resctrl tree made elsewhere (another process) driven by this process as by a kernel.

:func:`~runtimeproxy.hooks.testkit.fake_resctrl.make_fake_resctrl` builds a tree of files, but the
kernel behaviour behind it (mkdir populating a group, schemata writes validated and
re-rendered, tasks moved) lives in the :class:`FakeResctrl` object of the process that made
it. A test that starts ``runtime-hooks serve --resctrl-root TREE`` as a subprocess gives that
process its own kernel with :func:`attach_fake_resctrl`, from a module imported before the
server starts::

    # rtpx_fake_kernel.py, in a directory put on the subprocess's PYTHONPATH
    import json, os
    from runtimeproxy.hooks.testkit import attach_fake_resctrl

    spec = json.loads(os.environ["FAKE_RESCTRL"])          # {"root": ..., "options": {...}}
    attach_fake_resctrl(spec["root"], **spec["options"])

    # the command:  python -c "import rtpx_fake_kernel; from runtimeproxy.hooks.cli import main; main()" serve ...

From then on every :class:`~runtimeproxy.hooks.resctrl_fs.ResctrlFS` of the process made without
``ops=`` (the server's, its plugins', the reconciler's) sends its mkdir, rmdir and writes under
the tree to the fake, and everything else to the real kernel, as before. The test reads the
files the fake renders, as one reads the kernel's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from .. import resctrl_fs as resctrl_mod
from ..resctrl_fs import RESERVED_NAMES, KernelOps
from .fake_resctrl import FakeKernelError, FakeResctrl, _Group, kernel_schemata_write, make_fake_resctrl

__all__ = ["attach_fake_resctrl", "attached_fake_resctrl", "detach_fake_resctrl"]

_lock = threading.Lock()
_attached: dict[str, FakeResctrl] = {}  # by the tree's absolute, normalised root


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.normpath(os.path.abspath(path))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _fake_for(path: Path) -> tuple[FakeResctrl, Path] | None:
    """The attached fake whose tree holds ``path``, and the path as the fake names it."""
    full = _key(path)
    with _lock:
        attached = list(_attached.items())
    for root, fake in attached:
        if _under(full, root):
            return fake, Path(full)
    real = os.path.realpath(full)
    for root, fake in attached:
        real_root = os.path.realpath(root)
        if _under(real, real_root):
            return fake, Path(root) / os.path.relpath(real, real_root)
    return None


class _KernelOrFake(KernelOps):
    """KernelOps, except under an attached fake tree: there the fake kernel answers."""

    def mkdir(self, path: Path) -> None:
        found = _fake_for(path)
        if found is None:
            super().mkdir(path)
        else:
            found[0].mkdir(found[1])

    def rmdir(self, path: Path) -> None:
        found = _fake_for(path)
        if found is None:
            super().rmdir(path)
        else:
            found[0].rmdir(found[1])

    def write(self, path: Path, data: bytes) -> None:
        found = _fake_for(path)
        if found is None:
            super().write(path, data)
        else:
            found[0].write(found[1], data)


def _info_files(root: Path) -> dict[str, bytes]:
    """What describes the hardware: info/ (less the files that change with use) and the root's cpus."""
    files = {}
    for path in sorted((root / "info").rglob("*")):
        if path.is_file() and path.name not in ("last_cmd_status", "bit_usage"):
            files[str(path.relative_to(root))] = path.read_bytes()
    for name in ("cpus", "cpus_list"):
        files[name] = (root / name).read_bytes()
    return files


def _adopt(kernel: FakeResctrl, root: Path) -> None:
    """Take over the state the tree shows: its groups, their schemata and tasks, the last status."""
    groups_found = (e.name for e in root.iterdir() if e.is_dir() and not e.is_symlink())
    names = ["", *sorted(name for name in groups_found if name not in RESERVED_NAMES)]
    if len(names) > kernel.num_closids:
        raise ValueError(f"{root}: {len(names) - 1} groups, more than {kernel.num_closids} CLOSIDs allow")
    groups: dict[str, _Group] = {}
    for name in names:
        directory = root / name if name else root
        defaults = {r.name: dict.fromkeys(r.domain_ids, r.default) for r in kernel.resources.values()}
        text = (directory / "schemata").read_bytes()
        try:
            schemata = kernel_schemata_write(text, kernel.resources, defaults) if text.strip() else defaults
        except FakeKernelError as exc:
            raise ValueError(
                f"{directory / 'schemata'}: not what the fake kernel renders ({exc.status or exc})"
            ) from exc
        tasks = [int(word) for word in (directory / "tasks").read_text().split()]
        groups[name] = _Group(schemata, tasks)
    status = (root / "info" / "last_cmd_status").read_text()
    kernel.root = root
    kernel._groups = groups
    kernel._status = "" if status == "ok\n" else status


def attach_fake_resctrl(root: str | os.PathLike[str], **options: Any) -> FakeResctrl:
    """Make this process treat the fake resctrl tree at ``root`` as the kernel would.

    ``root`` must have been made by :func:`make_fake_resctrl` with the same ``options`` (in any
    process); ValueError otherwise. Its current state is taken over: the groups that exist, their
    schemata and tasks. Returns the fake kernel now behind the tree (``.writes``, ``.schemata()``
    ... show what this process did). Attaching a tree again replaces its fake.
    """
    tree = Path(_key(root))
    if not (tree / "info" / "last_cmd_status").is_file():
        raise ValueError(f"{tree} is not a fake resctrl tree (no info/last_cmd_status)")
    scratch = Path(tempfile.mkdtemp(prefix="rtpx-fake-resctrl-"))
    try:
        kernel = make_fake_resctrl(scratch / "resctrl", **options)
        if _info_files(kernel.root) != _info_files(tree):
            raise ValueError(f"{tree} was made with other options than {options!r}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _adopt(kernel, tree)
    with _lock:
        _attached[str(tree)] = kernel
        resctrl_mod.KernelOps = _KernelOrFake  # type: ignore[misc]  # what ResctrlFS(root) without ops= uses
    return kernel


def attached_fake_resctrl(root: str | os.PathLike[str]) -> FakeResctrl | None:
    """The fake kernel attached to the tree at ``root``, if any."""
    with _lock:
        return _attached.get(_key(root))


def detach_fake_resctrl(root: str | os.PathLike[str] | None = None) -> None:
    """Stop driving the tree at ``root`` (None: every tree) with a fake; once none is left,
    :class:`ResctrlFS` objects made afterwards get the plain KernelOps again."""
    with _lock:
        if root is None:
            _attached.clear()
        else:
            _attached.pop(_key(root), None)
        if not _attached:
            resctrl_mod.KernelOps = KernelOps  # type: ignore[misc]
