"""Whether a process is in a container's cgroup: ``/proc/<pid>/cgroup`` against the runtime's cgroups path.

**The process's cgroups** (cgroups(7)): one line per hierarchy, ``ID:controllers:path`` --
``4:cpu,cpuacct:/kubepods/pod1/<id>`` on cgroup v1, ``0::/kubepods.slice/.../<unit>`` on v2
(a hybrid host has both kinds). A path starting with ``/..`` lies outside the reader's cgroup
namespace: only its part below the common ancestor is shown.

**The container's cgroup** comes from the OCI ``linux.cgroupsPath`` the runtime used (NRI's
``Container.linux.cgroups_path``), in one of runc's forms:

* ``/kubepods/besteffort/pod<uid>/<id>`` (cgroupfs driver): that path from the hierarchy root;
* ``<slice>:<prefix>:<name>`` (systemd driver; containerd gives
  ``kubepods-...-pod<uid>.slice:cri-containerd:<id>``): the slice nested by its dashes (an
  empty slice is ``system.slice``), then the unit ``<prefix>-<name>.scope`` (``<name>``
  when it is a slice itself);
* any other relative path (containerd's for a pod without a cgroup parent, cgroupfs driver):
  below the runtime's own cgroup, which we do not know.

**Membership** compares whole path components, never substrings: the process is in the
container when one of its lines shows exactly the container's path; where the start of a
path is unknown (outside our namespace, or a relative cgroups path) the visible part must be
the container path's tail, so the container's own directory always takes part. When the
runtime gives no cgroups path, the line's last directory must be one of the runtime's names
for the container (``<id>``, ``cri-containerd-<id>.scope``...; hooks/cgroups.py).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from ..cgroups import CONTAINER_DIR_FORMATS, CgroupPathError, expand_slice

__all__ = ["ContainerCgroup", "cgroup_paths"]

_DEFAULT_SLICE: Final = "system.slice"
_UP: Final = ".."


def cgroup_paths(text: str) -> Iterator[str]:
    """The cgroup path of each well-formed line of a ``/proc/<pid>/cgroup`` file; others are skipped."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[2].startswith("/"):
            yield parts[2]


def _components(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part)


def _cleaned(path: str) -> tuple[str, ...]:
    """A cgroupfs path's components as runc cleans it (``.`` and ``..`` resolved, never above the root)."""
    return _components(posixpath.normpath("/" + path))


@dataclass(frozen=True, slots=True)
class ContainerCgroup:
    """A container's cgroup as ``/proc/<pid>/cgroup`` would show it; see the module doc.

    ``parts``: the path's components (empty: the runtime gave none); ``anchored``: they start
    at the hierarchy root; ``leaves``: without ``parts``, the names its directory may have;
    ``described``: what it is, for messages."""

    parts: tuple[str, ...]
    anchored: bool
    described: str
    leaves: frozenset[str] = frozenset()

    @classmethod
    def of(cls, container_id: str, cgroups_path: str) -> ContainerCgroup:
        """The cgroup of ``container_id`` from the runtime's ``cgroups_path``; ValueError for a
        systemd-form path runc would refuse too."""
        if not cgroups_path:
            names = frozenset(fmt.format(id=container_id) for fmts in CONTAINER_DIR_FORMATS.values() for fmt in fmts)
            return cls((), False, "no cgroups path given: a directory the runtime names after the id", names)
        if ":" in cgroups_path and not cgroups_path.startswith("/"):
            return cls(_systemd_parts(cgroups_path), True, cgroups_path)
        return cls(_cleaned(cgroups_path), cgroups_path.startswith("/"), cgroups_path)

    def holds(self, cgroup_file: str) -> bool:
        """Whether a process whose ``/proc/<pid>/cgroup`` reads ``cgroup_file`` is in this cgroup."""
        return any(self._is_own(_components(path)) for path in cgroup_paths(cgroup_file))

    def _is_own(self, shown: tuple[str, ...]) -> bool:
        hidden = 0
        while hidden < len(shown) and shown[hidden] == _UP:
            hidden += 1
        visible = shown[hidden:]
        if not visible or _UP in visible or "." in visible:
            return False
        if not self.parts:
            return visible[-1] in self.leaves
        if self.anchored and not hidden:
            return visible == self.parts
        if self.anchored:  # above our cgroup namespace: what shows is the tail of the container's path
            return len(visible) <= len(self.parts) and self.parts[-len(visible) :] == visible
        # below a parent we do not know (a relative cgroups path)
        return len(visible) >= len(self.parts) and visible[-len(self.parts) :] == self.parts


def _systemd_parts(cgroups_path: str) -> tuple[str, ...]:
    """``slice:prefix:name`` as path components (runc's systemd driver)."""
    fields = cgroups_path.split(":")
    if len(fields) != 3 or "/" in fields[0] or not fields[2] or "/" in fields[1] + fields[2]:
        raise ValueError(f"cgroups path {cgroups_path!r} is not slice:prefix:name")
    slice_name, prefix, name = fields
    try:
        slices = expand_slice(slice_name or _DEFAULT_SLICE)
    except CgroupPathError as exc:
        raise ValueError(f"cgroups path {cgroups_path!r}: {exc}") from None
    unit = name if name.endswith(".slice") else f"{prefix}-{name}.scope"
    return (*slices, unit)
