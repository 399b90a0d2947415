"""Whether a container's resource values are the ones the plugins set: the comparison behind container repair.

The plugins' answer for a container (a merged :class:`~.changes.ResourceChanges`) is compared
field by field with what one source shows of the container (:class:`Seen`):

* **the runtime's record** (:func:`seen_in_record`): the resources the runtime keeps for it --
  NRI's container (its OCI spec) or the CRI ``ContainerStatus``. A field the record leaves unset
  is what a new container cgroup starts with: no CFS quota, a 100 ms period, 1024 shares, no
  memory limit, the parent's cpuset (shown as "", which differs from any list a plugin sets);
* **the cgroup** (hooks/container_repair.py reads it): the kernel's values. cgroup v2 keeps
  shares as ``cpu.weight``, so they are compared as weights there (shares that map to the same
  weight are equal); the kernel keeps memory limits in whole pages, so a limit is compared
  rounded down to the page size.

Only :data:`REPAIRED_FIELDS` are compared, and only those the answer sets (0 / "" in it means
"leave as it is"): the CFS quota (any value <= 0 is "no limit", -1), period and shares, the
cpuset's CPUs and memory nodes (as sets: "0-1" equals "0,1") and the memory limit, which differs
only when it is looser than the plugins' (none, or larger): a limit is only ever lowered, as the
memory plugin's reconciler does, never lifted over a tighter one. A field the source does not show
(None) never differs. The rest of an answer is not repaired: the OOM score
belongs to processes, not to the cgroup, and NRI cannot update it; the swap limit follows the
memory limit in the runtime; hugepage and ``unified`` values are left to the hook calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from runtimeproxy.hookapi.value_bounds import parse_cpuset

from .cgroups import MAX_SHARES, MIN_SHARES, WeightConversion, shares_to_weight
from .changes import ResourceChanges
from .views import Resources

__all__ = [
    "DEFAULT_CFS_PERIOD_US",
    "DEFAULT_SHARES",
    "REPAIRED_FIELDS",
    "UNLIMITED",
    "Drift",
    "Seen",
    "changes_for",
    "drifts",
    "seen_in_record",
    "wanted_fields",
]

#: The fields container repair keeps, in the order they are compared and reported.
REPAIRED_FIELDS: Final = (
    "cpu_quota",
    "cpu_period",
    "cpu_shares",
    "cpuset_cpus",
    "cpuset_mems",
    "memory_limit_in_bytes",
)
#: "No limit", for the CFS quota and the memory limit alike.
UNLIMITED: Final = -1
#: What a new cgroup starts with where the runtime's record sets nothing.
DEFAULT_CFS_PERIOD_US: Final = 100_000
DEFAULT_SHARES: Final = 1024


@dataclass(frozen=True)
class Seen:
    """A container's values as one source shows them; None where the source does not tell.

    ``cpu_quota`` and ``memory_limit_in_bytes``: -1 for no limit. ``weights``: ``cpu_shares`` holds
    cgroup v2's ``cpu.weight``, made from shares by ``conversion``. ``page_size``: the unit the
    source keeps memory limits in (1: exact)."""

    cpu_quota: int | None = None
    cpu_period: int | None = None
    cpu_shares: int | None = None
    cpuset_cpus: str | None = None
    cpuset_mems: str | None = None
    memory_limit_in_bytes: int | None = None
    weights: bool = False
    page_size: int = 1
    conversion: WeightConversion = WeightConversion.LINEAR


@dataclass(frozen=True)
class Drift:
    """One field that differs: what the source shows and what the plugins set."""

    field: str
    have: int | str
    want: int | str

    def __str__(self) -> str:
        return f"{self.field}: {self.have!r} -> {self.want!r}"


def seen_in_record(resources: Resources | None) -> Seen:
    """The runtime's record of a container (its resources as NRI or the CRI give them); unset
    fields as a new cgroup has them (see the module doc). No resources at all: nothing known."""
    if resources is None:
        return Seen()
    return Seen(
        cpu_quota=resources.cpu_quota if resources.cpu_quota > 0 else UNLIMITED,
        cpu_period=resources.cpu_period or DEFAULT_CFS_PERIOD_US,
        cpu_shares=resources.cpu_shares or DEFAULT_SHARES,
        cpuset_cpus=resources.cpuset_cpus,
        cpuset_mems=resources.cpuset_mems,
        memory_limit_in_bytes=resources.memory_limit_in_bytes or UNLIMITED,
    )


def wanted_fields(wanted: ResourceChanges) -> list[str]:
    """The REPAIRED_FIELDS the plugins' answer sets."""
    return [name for name in REPAIRED_FIELDS if getattr(wanted, name)]


def drifts(wanted: ResourceChanges, seen: Seen) -> list[Drift]:
    """The fields ``wanted`` sets whose value ``seen`` shows otherwise, in REPAIRED_FIELDS order."""
    return list(_drifts(wanted, seen))


def _drifts(wanted: ResourceChanges, seen: Seen) -> Iterator[Drift]:
    if wanted.cpu_quota and seen.cpu_quota is not None:
        want = wanted.cpu_quota if wanted.cpu_quota > 0 else UNLIMITED
        have = seen.cpu_quota if seen.cpu_quota > 0 else UNLIMITED
        if have != want:
            yield Drift("cpu_quota", have, want)
    if wanted.cpu_period > 0 and seen.cpu_period is not None and seen.cpu_period != wanted.cpu_period:
        yield Drift("cpu_period", seen.cpu_period, wanted.cpu_period)
    if wanted.cpu_shares > 0 and seen.cpu_shares is not None:
        if seen.weights:
            want = shares_to_weight(_bounded_shares(wanted.cpu_shares), seen.conversion)
            if seen.cpu_shares != want:
                yield Drift("cpu_weight", seen.cpu_shares, want)
        elif seen.cpu_shares != wanted.cpu_shares:
            yield Drift("cpu_shares", seen.cpu_shares, wanted.cpu_shares)
    for name in ("cpuset_cpus", "cpuset_mems"):
        want_list: str = getattr(wanted, name)
        have_list: str | None = getattr(seen, name)
        if want_list and have_list is not None and not _same_cpuset(have_list, want_list):
            yield Drift(name, have_list, want_list)
    if wanted.memory_limit_in_bytes > 0 and seen.memory_limit_in_bytes is not None:
        want = wanted.memory_limit_in_bytes - wanted.memory_limit_in_bytes % seen.page_size
        have = seen.memory_limit_in_bytes
        if have == UNLIMITED or have > want:  # only ever lowered
            yield Drift("memory_limit_in_bytes", have, want)


def changes_for(wanted: ResourceChanges, found: list[Drift]) -> ResourceChanges:
    """The part of ``wanted`` that repairs ``found``: its values of the drifted fields only
    (a drifted weight is repaired through the shares it stands for)."""
    names = {"cpu_shares" if drift.field == "cpu_weight" else drift.field for drift in found}
    changes = ResourceChanges()
    for name in names:
        setattr(changes, name, getattr(wanted, name))
    return changes


def _bounded_shares(shares: int) -> int:
    """Shares as the kernel keeps them (it clamps what is written to 2..262144)."""
    return min(max(shares, MIN_SHARES), MAX_SHARES)


def _same_cpuset(have: str, want: str) -> bool:
    """Whether two cpuset lists name the same CPUs (or nodes); unparsable ones compare as text."""
    try:
        return parse_cpuset(have) == parse_cpuset(want)
    except ValueError:
        return have.strip() == want.strip()
