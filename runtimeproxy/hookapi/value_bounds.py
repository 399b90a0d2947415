"""What the kernel and the container runtime accept from hook output, and what this node has.

A value that looks valid but that containerd, runc or the kernel refuses fails the pod
even under failure policy Ignore, because by then the proxy has already sent it on. So
hook output is checked here first (``cri_mapping.py`` does it before applying anything), and
an answer that breaks a rule counts as that hook's failure: dropped under Ignore, the
call refused under Fail.

Resource values (``validate_resources``; only fields that are set are checked):

* ``cpu_period`` 1000..1000000 us and ``cpu_quota`` -1 (unlimited) or 1000..2^44-1 us: the
  kernel's CFS bounds (kernel/sched/core.c ``tg_set_cfs_bandwidth``: min_cfs_quota_period
  1 ms, max_cfs_quota_period 1 s, and quota at most ``max_cfs_runtime`` = MAX_BW us,
  MAX_BW = 2^(64 - BW_SHIFT) - 1 with BW_SHIFT 20). Anything else is EINVAL at runc's write.
* ``cpu_shares`` 2..262144 (MIN_SHARES, MAX_SHARES); ``oom_score_adj`` -1000..1000.
* ``memory_limit_in_bytes`` at least 6 MiB; ``memory_swap_limit_in_bytes`` -1 (unlimited) or
  at least 6 MiB, and (memory + swap, as in CRI and runc) not below the memory limit.
* ``cpuset_cpus``, ``cpuset_mems``: the kernel list format (``parse_cpuset``) and, when the
  node's facts are given, only CPUs / memory nodes the node has online (``NodeFacts``).
* ``unified``: keys are cgroup v2 file names ``controller.file`` (lower-case controller,
  dot-separated parts of letters, digits, ``_`` and ``-``: no ``/``, no ``..``), not the
  ``cgroup.*`` core files (they move or kill processes or reshape the tree); values hold no
  NUL and fit one page, as a cgroup file takes one write of at most a page
  (``atomic_write_len = PAGE_SIZE`` in kernel/cgroup/cgroup.c).
* ``hugepage_limits``: ``page_size`` like ``2MB`` or ``1GB`` (a power of two, units KB to
  PB as kubelet writes them), each size at most once.

Environment (``validate_env``): names non-empty without ``=`` or NUL, values without NUL,
and ``NAME=value`` with its NUL within the kernel's MAX_ARG_STRLEN (128 KiB, else execve
fails with E2BIG). Labels: key and value together at most 4096 bytes (containerd's
``labels.Validate``, which refuses the sandbox or container otherwise).

Totals (``growth_problem``) keep a container's verbose ContainerStatus, which carries its
environment twice (config and OCI spec) JSON-escaped, far under kubelet's 16 MiB message
limit: at most 4096 variables and 512 KiB of environment, 256 KiB of annotations (the
Kubernetes API's own limit) and of labels, 128 ``unified`` keys. An answer may not take a
total over its limit; when kubelet's request is already over it, the answer may not make
it larger (kubelet's own values are not the hook's to answer for).

Log lines and error messages carry values only through ``cut``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook

__all__ = [
    "ANNOTATIONS_TOTAL_MAX",
    "CFS_PERIOD_US",
    "CFS_QUOTA_US",
    "CGROUP_PARENT_MAX",
    "CPU_SHARES",
    "ENV_COUNT_MAX",
    "ENV_ENTRY_MAX",
    "ENV_TOTAL_MAX",
    "ERROR_VALUE_MAX",
    "LABELS_TOTAL_MAX",
    "LABEL_MAX",
    "LOGGED_CHANGES_MAX",
    "LOG_VALUE_MAX",
    "MAX_CPUSET_ID",
    "MEMORY_LIMIT_MIN",
    "OOM_SCORE_ADJ",
    "UNIFIED_COUNT_MAX",
    "UNIFIED_VALUE_MAX",
    "NodeFacts",
    "Resources",
    "cut",
    "env_entry_size",
    "env_total_problems",
    "format_cpuset",
    "growth_problem",
    "label_problems",
    "map_bytes",
    "parse_cpuset",
    "validate_env",
    "validate_resources",
]

# The hook API's message and the CRI one have the same fields; either can be checked.
Resources = hook.LinuxContainerResources | cri.LinuxContainerResources

# --- bounds ------------------------------------------------------------------------------

CFS_PERIOD_US = (1000, 1_000_000)
CFS_QUOTA_US = (1000, 2**44 - 1)
CPU_SHARES = (2, 262_144)
OOM_SCORE_ADJ = (-1000, 1000)
# No kernel floor, and runc and containerd enforce none: but runc sets the limit once its init
# process is already in the cgroup and charged, so a tiny one fails the start ("unable to set
# memory limit to 1 (current usage: 2457600 ...)" here). Docker refuses less than 6 MiB
# (linuxMinMemory, "to account for overhead during startup"): the documented floor we follow.
MEMORY_LIMIT_MIN = 6 << 20
MAX_CPUSET_ID = 65535  # far above any kernel's NR_CPUS; bounds what a parse may build
LABEL_MAX = 4096  # containerd labels.Validate: len(key) + len(value) <= 4096
ANNOTATIONS_TOTAL_MAX = 256 << 10  # Kubernetes' TotalAnnotationSizeLimitB
LABELS_TOTAL_MAX = ANNOTATIONS_TOTAL_MAX  # Kubernetes has none; labels reach the same places
ENV_ENTRY_MAX = 128 << 10  # MAX_ARG_STRLEN (32 pages): "NAME=value" and its NUL
# Verbose ContainerStatus holds the environment twice, JSON-escaped (at worst 6 bytes a byte):
# 512 KiB stays far under 16 MiB, and well under execve's own total (a quarter of the stack
# rlimit, 2 MiB by default). Create + start took 0.11 s with 4096 variables here, 0.35 s with
# 10,000, and 21.6 s with 100,000.
ENV_TOTAL_MAX = 512 << 10
ENV_COUNT_MAX = 4096
UNIFIED_VALUE_MAX = 4096  # one page
UNIFIED_COUNT_MAX = 128
# PATH_MAX (4096) must hold the mount point (/sys/fs/cgroup/<controllers>/), the parent and
# the container's own directory (64 hex digits): the parent gets what the others leave.
CGROUP_PARENT_MAX = 3840

LOG_VALUE_MAX = 200
LOGGED_CHANGES_MAX = 50  # changes listed on one lifecycle log line; the rest are counted
ERROR_VALUE_MAX = 40


def cut(value: object, limit: int = LOG_VALUE_MAX, *, quote: bool = True) -> str:
    """``value`` bounded for a log line or an error message.

    str and bytes keep their first ``limit`` characters (bytes) as their repr, so control
    characters are escaped (``quote=False`` drops the quotes, for keys); anything else is
    str(). What was cut is counted: ``'aaaa'...(+1234 chars)``.
    """
    if isinstance(value, bytes):
        head, size, unit = repr(value[:limit]), len(value), "bytes"
    elif isinstance(value, str):
        head, size, unit = repr(value[:limit]), len(value), "chars"
        head = head if quote else head[1:-1]
    else:
        text = str(value)
        head, size, unit = text[:limit], len(text), "chars"
    return head if size <= limit else f"{head}...(+{size - limit} {unit})"


def _short(value: object) -> str:
    return cut(value, ERROR_VALUE_MAX)


def _key(key: str) -> str:
    """A map key or variable name for an error message: short, unquoted, escaped."""
    return cut(key, ERROR_VALUE_MAX, quote=False)


# --- cpusets -----------------------------------------------------------------------------

# [0-9], not \d: \d matches non-ASCII digits that int() would accept and the kernel not.
_CPUSET_ITEM = re.compile(r"([0-9]{1,10})(?:-([0-9]{1,10}))?")


def parse_cpuset(text: str) -> frozenset[int]:
    """The ids in a kernel list string ("0-3,8"); "" is the empty set. ValueError says what is wrong.

    Comma-separated ``N`` or ``N-M`` with N <= M, ASCII digits only, no spaces, ids
    0..65535. The kernel's stride form ``0-31:2/8`` is not accepted.
    """
    if text == "":
        return frozenset()
    ids: set[int] = set()
    for item in text.split(","):
        match = _CPUSET_ITEM.fullmatch(item)
        if match is None:
            raise ValueError(f"bad item {_short(item)} in {_short(text)} (want N or N-M, comma-separated, no spaces)")
        low = int(match.group(1))
        high = low if match.group(2) is None else int(match.group(2))
        if low > high:
            raise ValueError(f"reversed range {_short(item)} in {_short(text)}")
        if high > MAX_CPUSET_ID:
            raise ValueError(f"id {high} in {_short(text)} is above {MAX_CPUSET_ID}")
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


# --- the node ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFacts:
    """The CPUs and memory nodes this node has online, read when asked (CPUs can be hot-plugged)."""

    cpu_online: Path = Path("/sys/devices/system/cpu/online")
    node_online: Path = Path("/sys/devices/system/node/online")

    def online_cpus(self) -> frozenset[int]:
        """OSError or ValueError when the file cannot be read or parsed."""
        return parse_cpuset(self.cpu_online.read_text().strip())

    def online_mems(self) -> frozenset[int]:
        try:
            return parse_cpuset(self.node_online.read_text().strip())
        except FileNotFoundError:  # a kernel without NUMA (CONFIG_NUMA=n) has node 0 only
            return frozenset({0})

    def missing(self, name: str, ids: frozenset[int]) -> str | None:
        """Why ``ids`` (of cpuset field ``name``) are not all online here, or None."""
        what, read = ("CPUs", self.online_cpus) if name == "cpuset_cpus" else ("memory nodes", self.online_mems)
        try:
            online = read()
        except (OSError, ValueError) as exc:  # refuse what cannot be checked
            return f"{name}: cannot read the node's online {what}: {exc}"
        absent = ids - online
        if not absent:
            return None
        return (
            f"{name}: {_key(format_cpuset(absent))} not among the node's online {what} ({_key(format_cpuset(online))})"
        )


# --- resources ---------------------------------------------------------------------------

_RANGES: dict[str, tuple[int, int]] = {  # inclusive bounds of set (non-zero) values
    "cpu_period": CFS_PERIOD_US,
    "cpu_shares": CPU_SHARES,
    "oom_score_adj": OOM_SCORE_ADJ,
    "memory_limit_in_bytes": (MEMORY_LIMIT_MIN, 2**63 - 1),
}
_UNIFIED_KEY = re.compile(r"([a-z][a-z0-9_]*)(\.[A-Za-z0-9_-]+)+")
_NAME_MAX = 255  # a file name
_PAGE_SIZE = re.compile(r"([1-9][0-9]{0,9})(KB|MB|GB|TB|PB)")


def validate_resources(res: Resources, node: NodeFacts | None = None, over: Resources | None = None) -> list[str]:
    """Problems with the fields ``res`` sets (see the module docstring); empty means valid.

    With ``node``, cpusets must also name only what the node has online. With ``over``, the
    resources ``res`` is to be merged over, the rules that span fields (swap against memory,
    the number of ``unified`` keys) see the merged values.
    """
    problems = [
        f"{name} {value} is outside {low}..{high}"
        for name, (low, high) in _RANGES.items()
        if (value := getattr(res, name)) and not low <= value <= high
    ]
    problems += _quota_problems(res.cpu_quota)
    problems += _swap_problems(res, over if over is not None else res)
    for name in ("cpuset_cpus", "cpuset_mems"):
        problems += _cpuset_problems(name, getattr(res, name), node)
    problems += [problem for key, value in res.unified.items() for problem in _unified_problems(key, value)]
    problems += _hugepage_problems([limit.page_size for limit in res.hugepage_limits])
    if res.unified and (count := _unified_count_problem(over.unified if over is not None else {}, res.unified)):
        problems.append(count)
    return problems


def _quota_problems(quota: int) -> list[str]:
    low, high = CFS_QUOTA_US
    if quota and quota != -1 and not low <= quota <= high:
        return [f"cpu_quota {quota} must be -1 (unlimited) or {low}..{high} (the kernel's CFS bounds)"]
    return []


def _swap_problems(res: Resources, over: Resources) -> list[str]:
    """The swap limit (memory + swap) as set, and against the memory limit in force once merged."""
    swap = res.memory_swap_limit_in_bytes
    if swap and swap != -1 and swap < MEMORY_LIMIT_MIN:
        return [f"memory_swap_limit_in_bytes {swap} must be -1 (unlimited) or at least {MEMORY_LIMIT_MIN}"]
    if not (swap or res.memory_limit_in_bytes):
        return []
    memory = res.memory_limit_in_bytes or over.memory_limit_in_bytes
    swap = swap or over.memory_swap_limit_in_bytes
    if swap > 0 and memory > 0 and swap < memory:  # it is memory + swap, so never below memory
        return [f"memory_swap_limit_in_bytes {swap} is below memory_limit_in_bytes {memory}"]
    return []


def _cpuset_problems(name: str, text: str, node: NodeFacts | None) -> list[str]:
    try:
        ids = parse_cpuset(text)
    except ValueError as exc:
        return [f"{name}: {exc}"]
    problem = node.missing(name, ids) if node is not None and ids else None
    return [problem] if problem else []


def _unified_problems(key: str, value: str) -> list[str]:
    match = _UNIFIED_KEY.fullmatch(key)
    if match is None or len(key) > _NAME_MAX:
        return [f"unified key {_short(key)} is not a cgroup v2 file name (controller.file)"]
    if match.group(1) == "cgroup":
        return [f"unified key {_short(key)}: cgroup.* core files are not resource limits"]
    if "\0" in value:
        return [f"unified[{_key(key)}] value contains a NUL character"]
    if len(value.encode()) > UNIFIED_VALUE_MAX:
        return [f"unified[{_key(key)}] value is {len(value.encode())} bytes, over a cgroup file's {UNIFIED_VALUE_MAX}"]
    return []


def _hugepage_problems(page_sizes: list[str]) -> list[str]:
    problems = []
    for size in page_sizes:
        match = _PAGE_SIZE.fullmatch(size)
        if match is None:
            problems.append(f"hugepage page_size {_short(size)} is not like 2MB or 1GB")
        elif int(match.group(1)) & (int(match.group(1)) - 1):
            problems.append(f"hugepage page_size {_short(size)} is not a power of two")
    duplicates = sorted({size for size in page_sizes if page_sizes.count(size) > 1})
    if duplicates:
        listed = _key(", ".join(duplicates))
        problems.append(f"hugepage page_size listed more than once: {listed}")
    return problems


def _unified_count_problem(before: Iterable[str], answer: Iterable[str]) -> str | None:
    keys = set(before)
    return growth_problem("unified", len(keys), len(keys | set(answer)), UNIFIED_COUNT_MAX, "keys")


# --- environment, labels, totals -----------------------------------------------------------------


def validate_env(env: Iterable[tuple[str, str | bytes]]) -> list[str]:
    """Problems with environment variables (see the module docstring); values are never quoted."""
    problems = []
    for key, value in env:
        if not key or "=" in key or "\0" in key:
            problems.append(f"env name {_short(key)} must be non-empty and contain no '=' or NUL")
        if "\0" in value if isinstance(value, str) else b"\0" in value:
            problems.append(f"env[{_key(key)}] value contains a NUL character")
        if (size := env_entry_size(key, value)) + 1 > ENV_ENTRY_MAX:
            problems.append(
                f"env[{_key(key)}] is {size} bytes as NAME=value, over the kernel's "
                f"MAX_ARG_STRLEN of {ENV_ENTRY_MAX} (with its NUL)"
            )
    return problems


def env_entry_size(key: str, value: str | bytes) -> int:
    """Bytes of "NAME=value"."""
    return len(key.encode()) + 1 + len(value.encode() if isinstance(value, str) else value)


def env_total_problems(before: list[tuple[str, bytes]], after: list[tuple[str, bytes]]) -> list[str]:
    problems = [
        growth_problem("env", len(before), len(after), ENV_COUNT_MAX, "variables"),
        growth_problem(
            "env",
            sum(env_entry_size(k, v) for k, v in before),
            sum(env_entry_size(k, v) for k, v in after),
            ENV_TOTAL_MAX,
            "bytes",
        ),
    ]
    return [problem for problem in problems if problem]


def label_problems(labels: Mapping[str, str]) -> list[str]:
    """Labels containerd would refuse (key and value over 4096 bytes together)."""
    problems = []
    for key, value in labels.items():
        size = len(key.encode()) + len(value.encode())
        if size > LABEL_MAX:
            problems.append(
                f"labels[{_key(key)}]: key and value are {size} bytes, "
                f"over containerd's limit of {LABEL_MAX} (value {_short(value)})"
            )
    return problems


def map_bytes(items: Mapping[str, str]) -> int:
    return sum(len(key.encode()) + len(value.encode()) for key, value in items.items())


def growth_problem(name: str, before: int, after: int, limit: int, unit: str) -> str | None:
    """An answer may not take a total over ``limit``, nor grow one kubelet's request already has over it."""
    if after > limit and after > before:
        return f"{name} would hold {after} {unit}, over the limit of {limit}"
    return None
