"""Merging hook responses into CRI requests, and checking what hooks answer.

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

Validation rules (``validate_resources``; only fields that are set are checked):

* ``cpu_period`` 1000..1000000 (µs, the kernel's CFS bounds); ``cpu_quota`` -1
  (unlimited) or >= 1000; ``cpu_shares`` 2..262144; ``oom_score_adj`` -1000..1000;
  ``memory_limit_in_bytes`` > 0; ``memory_swap_limit_in_bytes`` -1 (unlimited) or > 0,
  and (memory + swap, as in CRI and runc) not below ``memory_limit_in_bytes`` when the
  same message sets both.
* ``cpuset_cpus``, ``cpuset_mems``: the kernel list format, comma-separated ``N`` or
  ``N-M`` with N <= M, ASCII digits only, no spaces, ids 0..65535 (``parse_cpuset``).
  The kernel's stride form ``0-31:2/8`` is not accepted.
* ``unified`` keys are cgroup v2 file names ``controller.file`` (lower-case controller,
  dot-separated parts of letters, digits, ``_`` and ``-``; hence no ``/``, no ``..``),
  but not the ``cgroup.*`` core files (``cgroup.procs``, ``cgroup.kill``...): those move
  or kill processes or reshape the tree instead of limiting resources. Values hold no NUL.
* ``hugepage_limits``: ``page_size`` like ``2MB`` or ``1GB`` (a power of two, units KB to
  PB as the kubelet writes them), each size at most once.

``validate_env`` checks environment names (non-empty, no ``=``, no NUL) and values (no NUL).

``validate_cgroup_parent``: a cgroup parent is either an absolute, normalized cgroupfs path
(no ``.``, ``..`` or empty segments, no trailing ``/``) equal to or below an allowed root,
matched on whole segments (``/kubepods`` admits ``/kubepods/burstable/pod1``, not
``/kubepodsX``), or a systemd slice name (one segment ending in ``.slice``) that is the
slice of an allowed root or below it (``/kubepods`` admits ``kubepods.slice`` and
``kubepods-burstable-pod1.slice``, not ``kubepodsX.slice``). Control characters are
refused in both forms.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import TypeVar

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook

__all__ = [
    "MAX_CPUSET_ID",
    "Resources",
    "format_cpuset",
    "merge_env",
    "merge_map",
    "merge_resources",
    "parse_cpuset",
    "validate_cgroup_parent",
    "validate_env",
    "validate_resources",
]

# The hook API's message and the CRI one have the same fields; either can be merged.
Resources = hook.LinuxContainerResources | cri.LinuxContainerResources
V = TypeVar("V", str, bytes)

MAX_CPUSET_ID = 65535

# Scalar resource fields; zero / "" is proto3's default and so means "not set".
_SCALAR_FIELDS = (
    "cpu_period",
    "cpu_quota",
    "cpu_shares",
    "memory_limit_in_bytes",
    "oom_score_adj",
    "cpuset_cpus",
    "cpuset_mems",
    "memory_swap_limit_in_bytes",
)


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
    for name in _SCALAR_FIELDS:
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


# --- cpusets -----------------------------------------------------------------------------

# [0-9], not \d: \d matches non-ASCII digits that int() would accept and the kernel not.
_CPUSET_ITEM = re.compile(r"([0-9]{1,10})(?:-([0-9]{1,10}))?")


def parse_cpuset(text: str) -> frozenset[int]:
    """The ids in a kernel list string ("0-3,8"); "" is the empty set. ValueError says what is wrong."""
    if text == "":
        return frozenset()
    ids: set[int] = set()
    for item in text.split(","):
        match = _CPUSET_ITEM.fullmatch(item)
        if match is None:
            raise ValueError(f"bad item {item!r} in {text!r} (want N or N-M, comma-separated, no spaces)")
        low = int(match.group(1))
        high = low if match.group(2) is None else int(match.group(2))
        if low > high:
            raise ValueError(f"reversed range {item!r} in {text!r}")
        if high > MAX_CPUSET_ID:
            raise ValueError(f"id {high} in {text!r} is above {MAX_CPUSET_ID}")
        ids.update(range(low, high + 1))
    return frozenset(ids)


def format_cpuset(cpus: Iterable[int]) -> str:
    """The canonical kernel list string: sorted, runs of two or more as "N-M" ({0,1,2,5} -> "0-2,5")."""
    ids = sorted(set(cpus))
    if ids and (ids[0] < 0 or ids[-1] > MAX_CPUSET_ID):
        raise ValueError(f"cpuset ids must be 0..{MAX_CPUSET_ID}")
    items: list[str] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:  # end of a run
            low, high = ids[start], ids[i - 1]
            items.append(str(low) if low == high else f"{low}-{high}")
            start = i
    return ",".join(items)


# --- validation ----------------------------------------------------------------------------

_RANGES: dict[str, tuple[int, int]] = {  # inclusive bounds of set (non-zero) values
    "cpu_period": (1000, 1_000_000),
    "cpu_shares": (2, 262_144),
    "oom_score_adj": (-1000, 1000),
    "memory_limit_in_bytes": (1, 2**63 - 1),
}
_UNIFIED_KEY = re.compile(r"([a-z][a-z0-9_]*)(\.[A-Za-z0-9_-]+)+")
_PAGE_SIZE = re.compile(r"([1-9][0-9]{0,9})(KB|MB|GB|TB|PB)")


def validate_resources(res: Resources) -> list[str]:
    """Problems with the fields ``res`` sets (see the module docstring); empty means valid."""
    problems = [
        f"{name} {value} is outside {low}..{high}"
        for name, (low, high) in _RANGES.items()
        if (value := getattr(res, name)) and not low <= value <= high
    ]
    problems += _quota_and_swap_problems(res)
    for name in ("cpuset_cpus", "cpuset_mems"):
        problems += _cpuset_problems(name, getattr(res, name))
    problems += [problem for key, value in res.unified.items() for problem in _unified_problems(key, value)]
    problems += _hugepage_problems([limit.page_size for limit in res.hugepage_limits])
    return problems


def _quota_and_swap_problems(res: Resources) -> list[str]:
    problems = []
    if res.cpu_quota and res.cpu_quota != -1 and res.cpu_quota < 1000:
        problems.append(f"cpu_quota {res.cpu_quota} must be -1 (unlimited) or >= 1000")
    swap, memory = res.memory_swap_limit_in_bytes, res.memory_limit_in_bytes
    if swap and swap < -1:
        problems.append(f"memory_swap_limit_in_bytes {swap} must be -1 (unlimited) or > 0")
    elif swap > 0 and memory > 0 and swap < memory:  # it is memory + swap, so never below memory
        problems.append(f"memory_swap_limit_in_bytes {swap} is below memory_limit_in_bytes {memory}")
    return problems


def _cpuset_problems(name: str, text: str) -> list[str]:
    try:
        parse_cpuset(text)
    except ValueError as exc:
        return [f"{name}: {exc}"]
    return []


def _unified_problems(key: str, value: str) -> list[str]:
    match = _UNIFIED_KEY.fullmatch(key)
    if match is None:
        return [f"unified key {key!r} is not a cgroup v2 file name (controller.file)"]
    if match.group(1) == "cgroup":
        return [f"unified key {key!r}: cgroup.* core files are not resource limits"]
    if "\0" in value:
        return [f"unified[{key}] value contains a NUL character"]
    return []


def _hugepage_problems(page_sizes: list[str]) -> list[str]:
    problems = []
    for size in page_sizes:
        match = _PAGE_SIZE.fullmatch(size)
        if match is None:
            problems.append(f"hugepage page_size {size!r} is not like 2MB or 1GB")
        elif int(match.group(1)) & (int(match.group(1)) - 1):
            problems.append(f"hugepage page_size {size!r} is not a power of two")
    duplicates = sorted({size for size in page_sizes if page_sizes.count(size) > 1})
    if duplicates:
        problems.append(f"hugepage page_size listed more than once: {', '.join(duplicates)}")
    return problems


def validate_env(env: Iterable[tuple[str, str | bytes]]) -> list[str]:
    """Problems with environment variables: names non-empty without '=' or NUL, values without NUL."""
    problems = []
    for key, value in env:
        if not key or "=" in key or "\0" in key:
            problems.append(f"env name {key!r} must be non-empty and contain no '=' or NUL")
        if "\0" in value if isinstance(value, str) else b"\0" in value:
            problems.append(f"env {key!r} value contains a NUL character")
    return problems


# --- cgroup parents ------------------------------------------------------------------------

_SLICE = re.compile(r"[A-Za-z0-9:_.\\]+(?:-[A-Za-z0-9:_.\\]+)*\.slice")
_NAME_MAX = 255  # a cgroup directory name, and a systemd unit name, is at most this long


def _has_control(text: str) -> bool:
    return any(ord(char) < 0x20 or ord(char) == 0x7F for char in text)


def _root_forms(root: str) -> tuple[list[str], str]:
    """An allowed root as (cgroupfs segments, slice stem): "/kubepods/burstable" -> ([...], "kubepods-burstable").

    A root may be a cgroupfs path ("/kubepods", "/kubepods.slice/kubepods-besteffort.slice")
    or a slice name ("kubepods-besteffort.slice", whose cgroupfs path systemd nests by dashes).
    """
    if root.startswith("/"):
        segments = [s for s in root.split("/") if s]
        if segments and segments[-1].endswith(".slice"):
            return segments, segments[-1].removesuffix(".slice")
        return segments, "-".join(segments)
    if _SLICE.fullmatch(root):
        stem = root.removesuffix(".slice")
        parts = stem.split("-")
        return ["-".join(parts[: i + 1]) + ".slice" for i in range(len(parts))], stem
    raise ValueError(f"allowed cgroup root {root!r} is neither an absolute path nor a slice name")


def validate_cgroup_parent(parent: str, allowed_roots: Sequence[str]) -> str | None:
    """Why ``parent`` is not an acceptable cgroup parent, or None (rules in the module docstring).

    ``allowed_roots`` is configuration: a malformed root raises ValueError.
    """
    roots = [_root_forms(root) for root in allowed_roots]
    if not parent:
        return "cgroup parent is empty"
    if _has_control(parent):
        return f"cgroup parent {parent!r} contains control characters"
    if parent.startswith("/"):
        return _cgroupfs_problem(parent, roots)
    if "/" not in parent and parent.endswith(".slice"):
        return _slice_problem(parent, roots)
    return f"cgroup parent {parent!r} is neither an absolute cgroupfs path nor a systemd slice name"


def _cgroupfs_problem(parent: str, roots: list[tuple[list[str], str]]) -> str | None:
    segments = [] if parent == "/" else parent[1:].split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        return f"cgroup parent {parent!r} is not a normalized path (empty, '.' or '..' segment, or trailing '/')"
    if any(len(segment.encode()) > _NAME_MAX for segment in segments):
        return f"cgroup parent {parent!r} has a segment longer than {_NAME_MAX} bytes"
    if any(segments[: len(root)] == root for root, _ in roots):
        return None
    return f"cgroup parent {parent!r} is not under an allowed root ({_describe(roots)})"


def _slice_problem(parent: str, roots: list[tuple[list[str], str]]) -> str | None:
    if not _SLICE.fullmatch(parent) or len(parent.encode()) > _NAME_MAX:
        return f"cgroup parent {parent!r} is not a valid systemd slice name"
    stem = parent.removesuffix(".slice")
    if any(not prefix or stem == prefix or stem.startswith(prefix + "-") for _, prefix in roots):
        return None
    return f"cgroup parent {parent!r} is not a slice of an allowed root ({_describe(roots)})"


def _describe(roots: list[tuple[list[str], str]]) -> str:
    return ", ".join("/" + "/".join(segments) for segments, _ in roots) or "none configured"
