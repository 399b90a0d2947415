"""What plugin handlers see: the pod and container of a hook call as plain frozen values, and
what the server offers plugins outside a hook call (``ServerContext``). Plugins never see protobuf:
hooks/convert.py builds these from the hook API's messages."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from . import policy as policy_mod

if TYPE_CHECKING:
    from .cgroups import CgroupFS
    from .resctrl_fs import ResctrlFS

__all__ = ["ContainerInfo", "HugepageLimit", "PodInfo", "Resources", "ServerContext"]


@dataclass(frozen=True, slots=True)
class HugepageLimit:
    page_size: str  # e.g. "2MB"
    limit: int  # bytes


@dataclass(frozen=True)
class Resources:
    """A LinuxContainerResources as plain values; 0 / "" / empty means "not set"."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_in_bytes: int = 0
    oom_score_adj: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""
    hugepage_limits: tuple[HugepageLimit, ...] = ()
    unified: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    memory_swap_limit_in_bytes: int = 0


@dataclass(frozen=True)
class PodInfo:
    """The pod a hook call is about. ``sandbox_id`` is "" in PreRunPodSandbox (not created yet);
    ``resources`` (the pod's total) and ``overhead`` are None when the proxy did not send them."""

    name: str
    namespace: str
    uid: str
    attempt: int = 0
    sandbox_id: str = ""
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cgroup_parent: str = ""
    runtime_handler: str = ""
    resources: Resources | None = None
    overhead: Resources | None = None


@dataclass(frozen=True)
class ContainerInfo:
    """The container of a container hook. ``id`` is "" before the runtime created it;
    ``env`` is in CRI order with repeats kept (values not valid UTF-8 are decoded with
    surrogateescape, so they round-trip exactly)."""

    name: str
    id: str = ""
    attempt: int = 0
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    resources: Resources | None = None
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ServerContext:
    """What the server offers plugins outside a hook call (on_start / on_stop get it as ``server``).

    ``dry_run``: the handles record instead of writing (``runtime-hooks explain``); passed to
    every handler as ``dry_run``.
    """

    cgroups: CgroupFS | None = None
    resctrl: ResctrlFS | None = None
    policy: Callable[[], policy_mod.Policy] = lambda: policy_mod.DEFAULT_POLICY
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    dry_run: bool = False
