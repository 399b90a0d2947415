"""Merging hook responses into CRI requests, and where a hook may move a pod's cgroup.

Merge rules (what a "Pre" hook's response does to the request):

1. Maps (labels, annotations, ``unified``) -- ``merge_map``: a key present in the response
   sets the request's value (added or overwritten); keys the response leaves out are kept.
   A response cannot delete a key: proto3 maps have no way to say "remove".
2. Environment -- ``merge_env``: the request's variables keep their order. A name already
   present takes the response's value in place; a name repeated in the request takes it
   at every occurrence, so all runtimes see the new value whichever duplicate they honour
   (containerd keeps the last, a raw ``execve`` environment serves the first to
   ``getenv``) and no position moves. New names are appended in the response's order; a
   name repeated in the response is applied in turn (the last value wins, at the position
   of its first appearance). Variables are never removed. Values are opaque bytes:
   ``=`` and anything else in them is kept as is.
3. Resources -- ``merge_resources``: field by field, and only for fields the response sets.
   Proto3 has no field presence, so zero or empty means "not set": ``cpu_period``,
   ``cpu_quota``, ``cpu_shares``, ``memory_limit_in_bytes``, ``oom_score_adj`` and
   ``memory_swap_limit_in_bytes`` change when non-zero, ``cpuset_cpus`` and
   ``cpuset_mems`` when non-empty; a non-empty ``hugepage_limits`` replaces the whole
   list; ``unified`` is merged like a map (rule 1). Consequently a hook cannot set a field
   to zero -- in particular it cannot set ``oom_score_adj`` to 0 or clear a cpuset.

What a hook may answer at all (bounds, sizes, the node's CPUs) is checked in ``value_bounds.py``.

``validate_cgroup_parent`` (where a cgroup parent may go):

* Its form must be the node's cgroup driver's (``pod_cgroup_driver``): a systemd slice name
  (one segment ending in ``.slice``) under the systemd driver, an absolute cgroupfs path
  under cgroupfs. Given the other form, containerd would place the cgroup outside kubelet's
  hierarchy (a slice name taken as a relative path on a cgroupfs node). With driver
  ``auto`` the form is the one kubelet used for the pod (its cgroup parent as the hooks
  found it; an earlier answer could only keep that form); when the pod has no cgroup
  parent the driver is unknown and no parent is accepted (set ``--cgroup-driver``).
* A cgroupfs path is absolute and normalized (no ``.``, ``..`` or empty segments, no
  trailing ``/``), at most 3840 bytes, each segment at most 255, and equal to or below an
  allowed root, matched on whole segments (``/kubepods`` admits
  ``/kubepods/burstable/pod1``, not ``/kubepodsX``).
* A slice name is the slice of an allowed root or below it (``kubepods.slice`` admits
  ``kubepods-burstable-pod1.slice``, not ``kubepodsX.slice``).
* A root names one of kubelet's cgroups in either form, as kubelet converts them:
  ``/kubepods/burstable`` is ``kubepods-burstable.slice`` (a ``-`` inside a path segment is
  ``_`` in the slice name). A path root whose last segment is a slice
  (``/kubepods.slice/kubepods-burstable.slice``, systemd's own path for it) is that path
  for paths and that slice for slices.
* Control characters are refused in both forms.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Literal, TypeVar

from runtimeproxy.hookapi import resource_fields
from runtimeproxy.hookapi.value_bounds import CGROUP_PARENT_MAX, Resources, cut

__all__ = [
    "CgroupDriver",
    "CgroupForm",
    "merge_env",
    "merge_map",
    "merge_resources",
    "parent_form",
    "pod_cgroup_driver",
    "root_forms",
    "validate_cgroup_parent",
]

V = TypeVar("V", str, bytes)
CgroupDriver = Literal["auto", "systemd", "cgroupfs"]
CgroupForm = Literal["systemd", "cgroupfs"]


# --- merging ---------------------------------------------------------------------------


def merge_map(target: MutableMapping[str, str], changes: Mapping[str, str]) -> dict[str, tuple[str | None, str]]:
    """Rule 1: set every key of ``changes`` in ``target``; returns {key: (old, new)} actually changed."""
    made: dict[str, tuple[str | None, str]] = {}
    for key, value in changes.items():
        old = target.get(key)  # .get, not [], which would insert into a protobuf map
        if old != value:
            target[key] = value
            made[key] = (old, value)
    return made


def merge_env(
    env: Sequence[tuple[str, V]], changes: Iterable[tuple[str, V]]
) -> tuple[list[tuple[str, V]], dict[str, tuple[V | None, V]]]:
    """Rule 2: the merged environment and {name: (old, new)} for names whose value changed.

    ``old`` is the value the request had (its last occurrence, the one containerd uses),
    None for an added name. Pass a mapping's ``.items()`` to merge a map.
    """
    merged = list(env)
    positions = _positions(merged)
    touched: dict[str, V] = {}
    for key, value in changes:
        slots = positions.setdefault(key, [])
        if not slots:
            slots.append(len(merged))
            merged.append((key, value))
        for i in slots:
            merged[i] = (key, value)
        touched[key] = value
    return merged, _env_changes(env, touched)


def _positions(env: Sequence[tuple[str, V]]) -> dict[str, list[int]]:
    positions: dict[str, list[int]] = {}
    for i, (key, _) in enumerate(env):
        positions.setdefault(key, []).append(i)
    return positions


def _env_changes(env: Sequence[tuple[str, V]], touched: Mapping[str, V]) -> dict[str, tuple[V | None, V]]:
    original = _positions(env)
    made: dict[str, tuple[V | None, V]] = {}
    for key, value in touched.items():
        slots = original.get(key, [])
        if not slots:
            made[key] = (None, value)
        elif any(env[i][1] != value for i in slots):
            made[key] = (env[slots[-1]][1], value)
    return made


def merge_resources(target: Resources, changes: Resources) -> dict[str, tuple[object, object]]:
    """Rule 3: merge the fields ``changes`` sets into ``target``; returns {field: (old, new)} changed.

    Keys are field names, ``unified[<key>]`` for unified entries; hugepage limits are
    reported as lists of (page_size, limit).
    """
    made: dict[str, tuple[object, object]] = {}
    for name in resource_fields.SCALARS:  # zero / "" is proto3's default: "not set"
        old, new = getattr(target, name), getattr(changes, name)
        if new and new != old:
            setattr(target, name, new)
            made[name] = (old, new)
    made.update(_merge_hugepages(target, changes))
    for key, change in merge_map(target.unified, changes.unified).items():
        made[f"unified[{key}]"] = change
    return made


def _merge_hugepages(target: Resources, changes: Resources) -> dict[str, tuple[object, object]]:
    old = [(limit.page_size, limit.limit) for limit in target.hugepage_limits]
    new = [(limit.page_size, limit.limit) for limit in changes.hugepage_limits]
    if not new or new == old:
        return {}
    # Rebuilt rather than CopyFrom: target and changes may be different message types.
    del target.hugepage_limits[:]
    for page_size, limit in new:
        target.hugepage_limits.add(page_size=page_size, limit=limit)
    return {"hugepage_limits": (old, new)}


# --- cgroup parents ------------------------------------------------------------------------

_SLICE = re.compile(r"[A-Za-z0-9:_.\\]+(?:-[A-Za-z0-9:_.\\]+)*\.slice")
_NAME_MAX = 255  # a cgroup directory name, and a systemd unit name, is at most this long
RootForms = tuple[list[str], str]  # (cgroupfs segments, slice stem)


def _has_control(text: str) -> bool:
    return any(ord(char) < 0x20 or ord(char) == 0x7F for char in text)


def parent_form(parent: str) -> CgroupForm | None:
    """The driver a cgroup parent is written for: a slice name is systemd's, a path cgroupfs's."""
    if parent.startswith("/"):
        return "cgroupfs"
    if parent.endswith(".slice") and "/" not in parent:
        return "systemd"
    return None


def pod_cgroup_driver(driver: CgroupDriver, pod_parent: str) -> CgroupForm | None:
    """The driver a pod's cgroup parent must follow: the configured one, else (auto) kubelet's
    form for the pod; None when that cannot be told (the pod has no cgroup parent)."""
    return parent_form(pod_parent) if driver == "auto" else driver


def root_forms(root: str) -> RootForms:
    """An allowed root in both forms, as kubelet converts its cgroup names (module docstring).

    A root is configuration: a malformed one raises ValueError.
    """
    if root.startswith("/"):
        segments = [s for s in root.split("/") if s]
        if any(segment in (".", "..") for segment in segments):
            raise ValueError(f"allowed cgroup root {root!r} has a '.' or '..' segment")
        if segments and segments[-1].endswith(".slice"):
            return segments, segments[-1].removesuffix(".slice")
        return segments, "-".join(segment.replace("-", "_") for segment in segments)
    if _SLICE.fullmatch(root):
        stem = root.removesuffix(".slice")
        return [part.replace("_", "-") for part in stem.split("-")], stem
    raise ValueError(f"allowed cgroup root {root!r} is neither an absolute path nor a slice name")


def validate_cgroup_parent(parent: str, allowed_roots: Sequence[str], driver: CgroupForm | None) -> str | None:
    """Why ``parent`` is not an acceptable cgroup parent under ``driver``, or None (module docstring).

    ``driver`` None means the node's driver is unknown for this pod: every parent is refused.
    """
    roots = [root_forms(root) for root in allowed_roots]
    if not parent:
        return "cgroup parent is empty"
    shown = cut(parent, 60)
    if _has_control(parent):
        return f"cgroup parent {shown} contains control characters"
    form = parent_form(parent)
    if form is None:
        return f"cgroup parent {shown} is neither an absolute cgroupfs path nor a systemd slice name"
    if driver is None:
        return (
            f"cgroup parent {shown}: the pod has no cgroup parent of its own, so its cgroup driver is unknown "
            "(set --cgroup-driver)"
        )
    if form != driver:
        written = "a systemd slice" if form == "systemd" else "a cgroupfs path"
        return f"cgroup parent {shown} is {written}, but this node's pods use the {driver} cgroup driver"
    return _cgroupfs_problem(parent, shown, roots) if form == "cgroupfs" else _slice_problem(parent, shown, roots)


def _cgroupfs_problem(parent: str, shown: str, roots: list[RootForms]) -> str | None:
    if len(parent.encode()) > CGROUP_PARENT_MAX:
        return f"cgroup parent {shown} is longer than {CGROUP_PARENT_MAX} bytes"
    segments = [] if parent == "/" else parent[1:].split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        return f"cgroup parent {shown} is not a normalized path (empty, '.' or '..' segment, or trailing '/')"
    if any(len(segment.encode()) > _NAME_MAX for segment in segments):
        return f"cgroup parent {shown} has a segment longer than {_NAME_MAX} bytes"
    # Strictly below a root: the root itself is no pod's cgroup (a pod placed there would
    # sit beside the QoS-class parents, and its containers' cgroups with them).
    if any(len(segments) > len(root) and segments[: len(root)] == root for root, _ in roots):
        return None
    allowed = ", ".join("/" + "/".join(root) for root, _ in roots) or "none configured"
    return f"cgroup parent {shown} is not under an allowed root ({allowed})"


def _slice_problem(parent: str, shown: str, roots: list[RootForms]) -> str | None:
    if not _SLICE.fullmatch(parent) or len(parent.encode()) > _NAME_MAX:
        return f"cgroup parent {shown} is not a valid systemd slice name"
    stem = parent.removesuffix(".slice")
    if any(not prefix or stem.startswith(prefix + "-") for _, prefix in roots):
        return None
    allowed = ", ".join(f"{prefix}.slice" if prefix else "any slice" for _, prefix in roots) or "none configured"
    return f"cgroup parent {shown} is not a slice of an allowed root ({allowed})"
