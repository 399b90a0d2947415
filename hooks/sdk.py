"""The plugin API of runtime-hooks: how a plugin says what it handles, what its handlers get,
and how the server runs them.

A plugin is a :class:`Plugin` object and plain functions registered on it::

    from runtimeproxy.hooks.sdk import HookPoint, Plugin

    plugin = Plugin("cpu", version="1.0", order=10, failure_policy="ignore", timeout=0.5)

    @plugin.on(HookPoint.PRE_CREATE_CONTAINER, "PreUpdateContainerResources")
    def limit(*, qos, container, response, **kwargs):
        if qos == "BE":
            response.resources.cpu_quota = 50000
            response.env.set("QOS_CLASS", "BE")

A plugin with settings of its own and state (see ``Plugin`` and hooks/settings.py)::

    @dataclass(frozen=True)
    class StampSettings:
        value: str = "none"

    plugin = Plugin("stamp", settings=StampSettings, state=dict)

    @plugin.on(HookPoint.PRE_CREATE_CONTAINER)
    async def stamp(*, settings: StampSettings, state: dict, response: HookResponse, **kwargs: Any) -> None:
        state["calls"] = state.get("calls", 0) + 1
        response.env.set("STAMP", settings.value)

with ``stamp: {BE: {value: be-stamp}, LS: {value: ls-stamp}}`` in the policy file.

It is installed as an entry point of group ``runtimeproxy.hooks`` naming the object
(``cpu = mypackage.cpu:plugin``) or a module with a ``plugin`` attribute; see
:func:`discover_plugins`.

**What a plugin handles follows from its handlers.** There is no separate subscription
list: the hook points of its ``@plugin.on`` handlers are what the server registers with
the proxy, and a hook point no enabled plugin handles answers UNIMPLEMENTED.

**Handlers take keyword arguments only, and must accept ``**kwargs``** (checked when the
handler is registered). The server passes every argument in :data:`HANDLER_KWARGS`; a
handler names the ones it uses and lets ``**kwargs`` take the rest, so arguments added in
later versions never break it. That is also the one way to say whether a handler blocks: an
``async def`` handler runs on the server's event loop (quick, non-blocking work; cancelled past
its timeout), a plain ``def`` one in a worker thread (it may block; past its timeout its thread
runs on, detached).

**Settings and state.** A plugin declares the settings of one QoS class as a frozen dataclass
(``Plugin("stamp", settings=StampSettings, state=dict)``); its section of the policy file,
keyed by its name with one entry per class, is checked against it (hooks/settings.py), and
each handler gets the entry for the pod's class as ``settings``. ``state`` is made once per
server by the factory and passed to every handler of the plugin. A plugin switched off for a
class (``enabled: false``) or lacking a node handle it ``needs`` is not called.

**Each handler writes its own** :class:`HookResponse`. It is merged into the call's
response only when the handler returns normally within its plugin's timeout and its changes
pass the proxy's checks; otherwise the changes are discarded and the plugin's
``failure_policy`` decides: ``"ignore"`` logs and counts the failure and the other plugins
go on, ``"fail"`` fails the whole hook call (the proxy gets an error naming the plugin and
the reason). Plugins run one after another in (``order``, ``name``) order, every one sees
the request as the proxy sent it, and later plugins' changes win where two set the same
thing (each such overwrite is logged and counted: hooks/overwrites.py). Calls about different
pods may overlap, so one handler can run several times at once (sync ones in separate
threads): guard state shared between calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import enum
import functools
import importlib.metadata
import inspect
import math
import re
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from runtimeproxy import trace
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.dispatch import limits
from runtimeproxy.dispatch.hookpoints import HookKind, HookPoint, parse_hook_point
from runtimeproxy.metrics import DURATION_BUCKETS

from . import policy as policy_mod
from .overwrites import ENV_KIND, FieldOwners, Overwrite
from .podview import plugin_view
from .qos import QoSClass, QoSResolution, resolve_qos
from .settings import Invalid, SectionCheck, SectionSettings, SettingsSpec, join

if TYPE_CHECKING:
    from .cgroups import CgroupFS
    from .resctrl import ResctrlFS

__all__ = [
    "ENTRY_POINT_GROUP",
    "HANDLER_KWARGS",
    "LIFECYCLE_KWARGS",
    "NODE_HANDLES",
    "RECONCILE_KWARGS",
    "ContainerInfo",
    "DiscoveryResult",
    "EnvChanges",
    "FailurePolicy",
    "Handler",
    "HookCallFailed",
    "HookKind",
    "HookPoint",
    "HookResponse",
    "HugepageLimit",
    "LoadFailure",
    "Outcome",
    "Plugin",
    "PluginDefinitionError",
    "PluginFailure",
    "PluginMetrics",
    "PluginRunner",
    "PodInfo",
    "QoSClass",
    "ReconcileReport",
    "ResourceChanges",
    "Resources",
    "RunResult",
    "ServerContext",
    "discover_plugins",
    "load_entry_point",
    "qos_of",
    "resources_from_proto",
    "resources_to_proto",
    "settings_specs",
]

log = structlog.get_logger("runtimeproxy.hooks.sdk")
_plugin_log = structlog.get_logger("runtimeproxy.hooks.plugin")

ENTRY_POINT_GROUP: Final = "runtimeproxy.hooks"

#: What every hook handler is called with (more may be added; handlers take **kwargs):
#:
#: * ``hook``: the HookPoint being called.
#: * ``pod``: PodInfo of the pod (for container hooks too).
#: * ``container``: ContainerInfo, or None in pod hooks.
#: * ``qos``: the pod's QoSClass (hooks/qos.py resolve_qos, once per call);
#:   ``qos_resolution``: the QoSResolution behind it (which rule decided, and why).
#: * ``settings``: this plugin's settings for the pod's class (an instance of its ``settings=``
#:   dataclass, from the policy in force), or None when the plugin declares none;
#:   ``section``: its section-wide settings (its ``section=`` dataclass), or None;
#:   ``settings_for(qos)``: its settings for any class.
#: * ``state``: the one object the plugin's ``state=`` factory made for this runner (None without
#:   one), the same in every handler of the plugin: hook, on_start/on_stop and reconcile.
#: * ``response``: a fresh HookResponse for this handler's changes.
#: * ``cgroups``: the node's CgroupFS (hooks/cgroups.py); None only for a runner built
#:   without one (tests): a plugin that ``needs=("cgroups",)`` is then not called.
#: * ``resctrl``: ResctrlFS when resctrl is mounted, else None (``needs=("resctrl",)``: not called).
#: * ``log``: a structlog logger bound with plugin, hook, pod (and container).
#: * ``plugin``: the Plugin itself.
#: * ``dry_run``: True when the call is a rehearsal (``runtime-hooks explain``): ``cgroups`` and
#:   ``resctrl`` then record writes instead of making them, and a plugin that changes the node
#:   any other way (netlink, sysctl, files of its own) must not do so. False in the server.
HANDLER_KWARGS: Final = (
    "hook",
    "pod",
    "container",
    "qos",
    "qos_resolution",
    "settings",
    "section",
    "settings_for",
    "state",
    "response",
    "cgroups",
    "resctrl",
    "log",
    "plugin",
    "dry_run",
)
#: What on_start and on_stop handlers get: ``server`` (ServerContext), the node handles,
#: ``section``, ``settings_for(qos)`` and ``state``.
LIFECYCLE_KWARGS: Final = (
    "server",
    "plugin",
    "cgroups",
    "resctrl",
    "section",
    "settings_for",
    "state",
    "log",
    "dry_run",
)
#: What reconcile handlers get (whatever else the caller passes comes too):
#:
#: * ``pods``: the live pods (PodInfo, ``sandbox_id`` set), in no particular order.
#: * ``containers``: their running (or created) containers by the pod's ``sandbox_id``
#:   (Mapping[str, tuple[ContainerInfo, ...]]; a pod without containers may be missing).
#: * ``gone``: the pods (PodInfo) that were live at the previous round and are not any more;
#:   ``gone_containers``: likewise for containers, by sandbox id (those of gone pods
#:   included). Empty at the first round: the authoritative list is always ``pods``.
#: * the node handles, ``section``, ``settings_for(qos)``, ``state``, ``log``, ``plugin``, ``dry_run``.
#:
#: A reconcile handler returns how many values it found drifted and set back (an int >= 0;
#: None counts as 0): see PluginRunner.reconcile_report.
RECONCILE_KWARGS: Final = (
    "pods",
    "containers",
    "gone",
    "gone_containers",
    "plugin",
    "cgroups",
    "resctrl",
    "section",
    "settings_for",
    "state",
    "log",
    "dry_run",
)
#: The node handles a plugin may say it ``needs``.
NODE_HANDLES: Final = ("cgroups", "resctrl")

FailurePolicy = Literal["ignore", "fail"]
Outcome = Literal["ok", "error", "timeout", "invalid", "busy"]
# What running one handler gave: outcome, reason ("" when ok) and its return value (None unless ok).
_Called = tuple[Outcome, str, Any]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", re.ASCII)
_F = TypeVar("_F", bound=Callable[..., Any])


class PluginDefinitionError(TypeError):
    """A plugin or handler that cannot work: the message says what to change."""


# --- what handlers see -----------------------------------------------------------------------


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


# --- what handlers write ---------------------------------------------------------------------

_INT_FIELDS: Final = (
    "cpu_period",
    "cpu_quota",
    "cpu_shares",
    "memory_limit_in_bytes",
    "oom_score_adj",
    "memory_swap_limit_in_bytes",
)
_STR_FIELDS: Final = ("cpuset_cpus", "cpuset_mems")


@dataclass
class ResourceChanges:
    """Resource fields to set. As on the wire, 0 / "" / empty means "leave as it is": a
    plugin cannot set a field to zero. ``unified`` entries are added or replaced one by
    one; a non-empty ``hugepage_limits`` replaces the whole list."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_in_bytes: int = 0
    oom_score_adj: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""
    hugepage_limits: list[HugepageLimit] = field(default_factory=list)
    unified: dict[str, str] = field(default_factory=dict)
    memory_swap_limit_in_bytes: int = 0

    def is_empty(self) -> bool:
        return not (
            any(getattr(self, name) for name in (*_INT_FIELDS, *_STR_FIELDS)) or self.hugepage_limits or self.unified
        )

    def update(self, other: ResourceChanges) -> None:
        """Lay ``other``'s set fields over these."""
        for name in (*_INT_FIELDS, *_STR_FIELDS):
            value = getattr(other, name)
            if value:
                setattr(self, name, value)
        if other.hugepage_limits:
            self.hugepage_limits = list(other.hugepage_limits)
        self.unified.update(other.unified)

    def problems(self) -> list[str]:
        """Why the proxy would refuse these changes (types first, then its own checks)."""
        found = []
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                found.append(f"resources.{name} must be an int, got {type(value).__name__}")
        for name in _STR_FIELDS:
            if not isinstance(getattr(self, name), str):
                found.append(f"resources.{name} must be a str, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.unified, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.unified.items()
        ):
            found.append("resources.unified must be a dict of str to str")
        if not all(
            isinstance(h, HugepageLimit) and isinstance(h.page_size, str) and isinstance(h.limit, int)
            for h in self.hugepage_limits
        ):
            found.append("resources.hugepage_limits must be a list of HugepageLimit(page_size: str, limit: int)")
        if found:
            return found
        try:
            message = resources_to_proto(self)
        except (ValueError, TypeError) as exc:  # e.g. an int out of int64 range
            return [f"resources: {exc}"]
        return [f"resources: {problem}" for problem in limits.validate_resources(message)]


class EnvChanges:
    """Environment variables to set, in order. As the proxy applies them, a name the
    container already has takes the new value where it stands (at every repeat), a new name
    is appended; variables are never removed. Setting a name twice keeps its first position
    and the last value."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    def set(self, name: str, value: str) -> None:
        self._values[name] = value

    __setitem__ = set

    def update(self, pairs: Mapping[str, str] | Iterable[tuple[str, str]]) -> None:
        for name, value in pairs.items() if isinstance(pairs, Mapping) else pairs:
            self.set(name, value)

    def items(self) -> list[tuple[str, str]]:
        return list(self._values.items())

    def __getitem__(self, name: str) -> str:
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __repr__(self) -> str:
        return f"EnvChanges({self._values!r})"

    def problems(self) -> list[str]:
        found: list[str] = []
        for name, value in self._values.items():
            if not isinstance(name, str) or not isinstance(value, str):
                found.append(f"env: names and values must be str, got {name!r}={value!r}")
        if found:
            return found
        return [f"env: {problem}" for problem in limits.validate_env(self.encoded())]

    def encoded(self) -> list[tuple[str, bytes]]:
        """The changes with values as bytes (surrogateescape undone)."""
        return [(name, value.encode("utf-8", "surrogateescape")) for name, value in self._values.items()]


class HookResponse:
    """One handler's changes (and, after merging, a whole call's).

    * ``resources``: ResourceChanges for the pod (pod hooks) or the container (container hooks).
    * ``annotations``: added to / replacing the pod's (pod hooks) or the container's annotations.
    * ``labels``: added to / replacing the pod's labels; pod hooks only.
    * ``env``: EnvChanges for the container; container hooks only.
    * ``cgroup_parent``: a new pod cgroup parent ("" = unchanged).

    Which of these the proxy applies depends on the hook point (docs/hook-api.md): Post
    hooks' responses are never applied, PreStartContainer applies nothing, and so on.
    """

    def __init__(self, kind: HookKind) -> None:
        self.kind = kind
        self.resources = ResourceChanges()
        self.annotations: dict[str, str] = {}
        self.labels: dict[str, str] = {}
        self.env = EnvChanges()
        self.cgroup_parent = ""

    def __repr__(self) -> str:
        fields = {
            "resources": None if self.resources.is_empty() else self.resources,
            "annotations": self.annotations or None,
            "labels": self.labels or None,
            "env": self.env.items() or None,
            "cgroup_parent": self.cgroup_parent or None,
        }
        shown = ", ".join(f"{name}={value!r}" for name, value in fields.items() if value is not None)
        return f"HookResponse({self.kind.value}{', ' if shown else ''}{shown})"

    def is_empty(self) -> bool:
        changes = (self.annotations, self.labels, len(self.env), self.cgroup_parent)
        return self.resources.is_empty() and not any(changes)

    def set_fields(self) -> Iterator[tuple[str, str, Any]]:
        """(field, kind, value) of every field these changes set. A map entry is a field of its
        own (``annotations[key]``, ``env[NAME]``) whose kind is the map's name, so kinds are few."""
        for name in (*_INT_FIELDS, *_STR_FIELDS):
            value = getattr(self.resources, name)
            if value:  # 0 / "" means "leave as it is"
                yield f"resources.{name}", f"resources.{name}", value
        if self.resources.hugepage_limits:
            yield "resources.hugepage_limits", "resources.hugepage_limits", list(self.resources.hugepage_limits)
        maps = (
            ("resources.unified", self.resources.unified),
            ("annotations", self.annotations),
            ("labels", self.labels),
        )
        for kind, mapping in (*maps, (ENV_KIND, dict(self.env.items()))):
            for key, value in mapping.items():
                yield f"{kind}[{key}]", kind, value
        if self.cgroup_parent:
            yield "cgroup_parent", "cgroup_parent", self.cgroup_parent

    def merge(self, other: HookResponse) -> None:
        """Lay ``other``'s changes over these (later plugins win)."""
        self.resources.update(other.resources)
        self.annotations.update(other.annotations)
        self.labels.update(other.labels)
        self.env.update(other.env.items())
        if other.cgroup_parent:
            self.cgroup_parent = other.cgroup_parent

    def problems(self) -> list[str]:
        """Why these changes cannot be sent (or the proxy would refuse them); empty when fine."""
        found = self.resources.problems()
        for name in ("annotations", "labels"):
            mapping = getattr(self, name)
            if not isinstance(mapping, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
            ):
                found.append(f"{name} must be a dict of str to str")
        if not isinstance(self.cgroup_parent, str):
            found.append(f"cgroup_parent must be a str, got {type(self.cgroup_parent).__name__}")
        elif "\0" in self.cgroup_parent:
            found.append("cgroup_parent contains NUL")
        if not isinstance(self.env, EnvChanges):
            found.append("env must stay an EnvChanges (use response.env.set(name, value))")
        else:
            found += self.env.problems()
            if self.kind is HookKind.POD and len(self.env):
                found.append("env: pod hooks cannot change a container's environment")
        if self.kind is HookKind.CONTAINER and self.labels:
            found.append("labels: container hooks cannot change pod labels")
        return found


# --- protobuf conversion (used by the server; plugins never see protobuf) ----------------------


def resources_from_proto(message: Any) -> Resources:
    """A LinuxContainerResources message (hook API or CRI) as Resources."""
    return Resources(
        cpu_period=message.cpu_period,
        cpu_quota=message.cpu_quota,
        cpu_shares=message.cpu_shares,
        memory_limit_in_bytes=message.memory_limit_in_bytes,
        oom_score_adj=message.oom_score_adj,
        cpuset_cpus=message.cpuset_cpus,
        cpuset_mems=message.cpuset_mems,
        hugepage_limits=tuple(HugepageLimit(h.page_size, h.limit) for h in message.hugepage_limits),
        unified=MappingProxyType(dict(message.unified)),
        memory_swap_limit_in_bytes=message.memory_swap_limit_in_bytes,
    )


def resources_to_proto(changes: ResourceChanges) -> Any:
    """ResourceChanges as a hook-API LinuxContainerResources message."""
    return hook_pb.LinuxContainerResources(
        cpu_period=changes.cpu_period,
        cpu_quota=changes.cpu_quota,
        cpu_shares=changes.cpu_shares,
        memory_limit_in_bytes=changes.memory_limit_in_bytes,
        oom_score_adj=changes.oom_score_adj,
        cpuset_cpus=changes.cpuset_cpus,
        cpuset_mems=changes.cpuset_mems,
        hugepage_limits=[hook_pb.HugepageLimit(page_size=h.page_size, limit=h.limit) for h in changes.hugepage_limits],
        unified=changes.unified,
        memory_swap_limit_in_bytes=changes.memory_swap_limit_in_bytes,
    )


# --- plugins ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Handler:
    """A registered function; ``is_async`` decides how it is run."""

    fn: Callable[..., Any]
    is_async: bool
    name: str


@dataclass
class _SyncCall:
    """One sync handler call on its thread; guarded by the runner's lock."""

    finished: bool = False
    hung: bool = False


def _callable_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else str(name)


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


def _check_handler(fn: Any, what: str, known: Sequence[str]) -> Handler:
    """The Handler for ``fn``; PluginDefinitionError unless it takes keyword arguments and **kwargs."""
    if not callable(fn):
        raise PluginDefinitionError(f"{what} must be a function, got {fn!r}")
    name = _callable_name(fn)
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise PluginDefinitionError(f"{what} {name} is a generator; handlers are plain functions or async def")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise PluginDefinitionError(f"{what} {name}: cannot read its signature ({exc})") from None
    parameters = list(signature.parameters.values())
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        raise PluginDefinitionError(
            f"{what} {name}{signature} must accept **kwargs, e.g. def {getattr(fn, '__name__', 'handler')}"
            f"(*, pod, response, **kwargs): arguments are passed by keyword and new ones are added over time"
        )
    for p in parameters:
        if p.default is not inspect.Parameter.empty or p.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            continue
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise PluginDefinitionError(
                f"{what} {name}: positional-only parameter {p.name!r} cannot be passed; arguments come by keyword"
            )
        if p.name not in known:
            raise PluginDefinitionError(
                f"{what} {name}: parameter {p.name!r} is not an argument it is called with "
                f"(give it a default, or use one of: {', '.join(known)})"
            )
    return Handler(fn, _is_async(fn), name)


def _failure_policy(value: str) -> FailurePolicy:
    lowered = value.lower() if isinstance(value, str) else value
    if lowered == "ignore":
        return "ignore"
    if lowered == "fail":
        return "fail"
    raise PluginDefinitionError(f'failure_policy must be "ignore" or "fail", got {value!r}')


def _hook_point(value: HookPoint | str) -> HookPoint:
    if isinstance(value, HookPoint):
        return value
    if not isinstance(value, str):
        if callable(value):
            raise PluginDefinitionError("use @plugin.on(HookPoint...), with the hook points in parentheses")
        raise PluginDefinitionError(f"hook points are HookPoint members or their names, got {value!r}")
    try:
        return parse_hook_point(value.removesuffix("Hook") if value.endswith("Hook") else value)
    except ValueError as exc:
        raise PluginDefinitionError(str(exc)) from None


def _needs(name: str, needs: Iterable[str]) -> tuple[str, ...]:
    given = (needs,) if isinstance(needs, str) else tuple(needs)
    unknown = [item for item in given if item not in NODE_HANDLES]
    if unknown:
        raise PluginDefinitionError(
            f"plugin {name}: needs {', '.join(map(repr, unknown))}: the node handles are {', '.join(NODE_HANDLES)}"
        )
    return tuple(dict.fromkeys(given))


def _settings_spec(
    name: str,
    settings: type[Any] | None,
    section: type[Any] | None,
    class_entry: Mapping[str, str] | None,
    defaults: Mapping[str, Any] | None,
    check: SectionCheck | None,
) -> SettingsSpec | None:
    """The plugin's SettingsSpec (None: it has no settings); PluginDefinitionError saying what is wrong."""
    if settings is None and section is None:
        if defaults or class_entry or check:
            raise PluginDefinitionError(f"plugin {name}: defaults, class_entry and check need settings= or section=")
        return None
    if name in policy_mod.SERVER_SECTIONS:
        raise PluginDefinitionError(f"plugin {name}: {name!r} is a server section of the policy; rename the plugin")
    try:
        return SettingsSpec(
            name, settings=settings, section=section, class_entry=class_entry, defaults=defaults, check=check
        )
    except TypeError as exc:
        raise PluginDefinitionError(f"plugin {name}: {exc}") from None
    except Invalid as exc:
        where = join(name, exc.path)
        raise PluginDefinitionError(f"plugin {name}: its defaults: {where}: {exc.reason}") from None


class Plugin:
    """A runtime-hooks plugin: a name, settings, state, and the handlers registered on it.

    * ``name``: unique among the server's plugins; letters, digits, ``_ . -``. It is also the
      name of the plugin's section in the policy file.
    * ``order``: plugins run in (order, name) order, lower first.
    * ``failure_policy``: ``"ignore"`` (a failing handler is logged and skipped) or
      ``"fail"`` (it fails the hook call); see the module doc.
    * ``timeout``: seconds each handler call may take.
    * ``settings``: a frozen dataclass holding the settings of ONE QoS class; the plugin's
      section of the policy file has one entry per class, checked against it (hooks/settings.py)
      and laid over its defaults. Handlers get the entry for the pod's class as ``settings``.
      **A settings dataclass with a bool field ``enabled`` switches the plugin off per class**:
      for a pod whose class's entry says ``enabled: false`` the plugin is not called at all.
    * ``section``: a frozen dataclass of the section-wide keys (handlers get it as ``section``).
    * ``class_entry``: classes that use another class's entry (``{"LSE": "LS", "LSR": "LS"}``).
    * ``defaults``: the section's defaults, shaped as in a policy file (per-class values over
      the dataclasses' own defaults).
    * ``check``: a check across the whole section, yielding (path in the section, reason).
    * ``state``: a factory (``dict``, a class, ...) called once per runner; what it makes is
      passed as ``state`` to every handler of the plugin. Plugins keep no module globals.
    * ``needs``: node handles the plugin cannot work without (``"cgroups"``, ``"resctrl"``);
      where the node lacks one the plugin is not called at all, so handlers need no None check.

    How a handler runs follows from how it is written: an ``async def`` handler runs on the
    server's event loop (it must not block; past its timeout it is cancelled), a plain
    ``def`` handler in a worker thread of its own (it may block; past its timeout its
    thread runs on, detached). Either way a call past its timeout counts as "timeout".
    """

    def __init__(
        self,
        name: str,
        *,
        version: str = "0",
        order: int = 100,
        failure_policy: FailurePolicy | str = "ignore",
        timeout: float = 1.0,
        description: str = "",
        settings: type[Any] | None = None,
        section: type[Any] | None = None,
        class_entry: Mapping[str, str] | None = None,
        defaults: Mapping[str, Any] | None = None,
        check: SectionCheck | None = None,
        state: Callable[[], Any] | None = None,
        needs: Iterable[str] = (),
    ) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise PluginDefinitionError(
                f"invalid plugin name {name!r}: 1-63 letters, digits, '_', '.', '-', starting with a letter or digit"
            )
        if isinstance(order, bool) or not isinstance(order, int):
            raise PluginDefinitionError(f"plugin {name}: order must be an int, got {order!r}")
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or not 0 < timeout <= 120
        ):
            raise PluginDefinitionError(f"plugin {name}: timeout must be > 0 and <= 120 seconds, got {timeout!r}")
        if state is not None and not callable(state):
            raise PluginDefinitionError(f"plugin {name}: state must be a factory (a class or function), got {state!r}")
        self.name = name
        self.version = str(version)
        self.order = order
        self.failure_policy: FailurePolicy = _failure_policy(failure_policy)
        self.timeout = float(timeout)
        self.description = description
        self.needs: tuple[str, ...] = _needs(name, needs)
        self.state_factory = state
        self.settings_spec: SettingsSpec | None = _settings_spec(name, settings, section, class_entry, defaults, check)
        self._handlers: dict[HookPoint, Handler] = {}
        self.start_handler: Handler | None = None
        self.stop_handler: Handler | None = None
        self.reconcile_handler: Handler | None = None

    def __repr__(self) -> str:
        points = ",".join(point.value for point in self.hook_points_ordered)
        return f"Plugin({self.name!r}, version={self.version!r}, order={self.order}, hooks=[{points}])"

    # -- registering --

    def on(self, *points: HookPoint | str) -> Callable[[_F], _F]:
        """Decorator: run the function at each of ``points`` (HookPoint members or names)."""
        if not points:
            raise PluginDefinitionError("@plugin.on needs at least one hook point")
        parsed = [_hook_point(point) for point in points]

        def register(fn: _F) -> _F:
            handler = _check_handler(fn, f"plugin {self.name}: handler", HANDLER_KWARGS)
            for point in parsed:
                existing = self._handlers.get(point)
                if existing is not None and existing.fn is not fn:
                    raise PluginDefinitionError(
                        f"plugin {self.name}: {point.value} already has handler {existing.name}; "
                        "one handler per hook point (call your functions from it)"
                    )
            for point in parsed:
                self._handlers[point] = handler
            return fn

        return register

    def on_start(self, fn: _F) -> _F:
        """Decorator: call ``fn(server=..., **kwargs)`` once when the server starts."""
        self.start_handler = self._single(fn, "on_start", self.start_handler, LIFECYCLE_KWARGS)
        return fn

    def on_stop(self, fn: _F) -> _F:
        """Decorator: call ``fn(server=..., **kwargs)`` once when the server stops."""
        self.stop_handler = self._single(fn, "on_stop", self.stop_handler, LIFECYCLE_KWARGS)
        return fn

    def reconcile(self, fn: _F) -> _F:
        """Decorator: call ``fn(pods=..., containers=..., gone=..., **kwargs)`` every reconcile
        interval (see RECONCILE_KWARGS); it returns how many drifted values it set back."""
        self.reconcile_handler = self._single(fn, "reconcile", self.reconcile_handler, RECONCILE_KWARGS)
        return fn

    def _single(self, fn: Any, what: str, existing: Handler | None, known: Sequence[str]) -> Handler:
        if existing is not None:
            raise PluginDefinitionError(f"plugin {self.name}: {what} is already {existing.name}")
        return _check_handler(fn, f"plugin {self.name}: {what} handler", known)

    # -- reading --

    @property
    def handlers(self) -> Mapping[HookPoint, Handler]:
        return MappingProxyType(self._handlers)

    @property
    def hook_points(self) -> frozenset[HookPoint]:
        """The hook points the plugin handles: what it subscribes to."""
        return frozenset(self._handlers)

    @property
    def hook_points_ordered(self) -> list[HookPoint]:
        return [point for point in HookPoint if point in self._handlers]

    def handler(self, point: HookPoint) -> Handler | None:
        return self._handlers.get(point)

    def check(self) -> None:
        """PluginDefinitionError if the plugin registers nothing at all."""
        if not self._handlers and self.reconcile_handler is None and self.start_handler is None:
            raise PluginDefinitionError(f"plugin {self.name} registers no handlers")

    def describe(self) -> dict[str, Any]:
        """The plugin as plain data (for listings)."""
        return {
            "name": self.name,
            "version": self.version,
            "order": self.order,
            "failure_policy": self.failure_policy,
            "timeout": self.timeout,
            "settings": list(self.settings_spec.keys()) if self.settings_spec is not None else [],
            "needs": list(self.needs),
            "hooks": [point.value for point in self.hook_points_ordered],
            "reconcile": self.reconcile_handler is not None,
            "description": self.description,
        }


# --- discovery ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadFailure:
    """A plugin that could not be used: which entry point (or plugin name), from where, and why."""

    name: str
    source: str
    reason: str


@dataclass(frozen=True)
class DiscoveryResult:
    plugins: tuple[Plugin, ...]
    failures: tuple[LoadFailure, ...]

    def names(self) -> list[str]:
        return [plugin.name for plugin in self.plugins]


def _source(entry_point: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    where = f"{dist.name} {dist.version}: " if dist is not None else ""
    return f"{where}{entry_point.name} = {entry_point.value}"


def load_entry_point(entry_point: importlib.metadata.EntryPoint) -> Plugin:
    """The Plugin an entry point names (the object, or a module's ``plugin``); raises on failure.

    A plugin left at the default version ``"0"`` takes the version of the distribution that
    installed the entry point, when there is one."""
    target = entry_point.load()
    if isinstance(target, types.ModuleType):
        if not hasattr(target, "plugin"):
            raise PluginDefinitionError(f"module {target.__name__} has no attribute 'plugin'")
        target = target.plugin
    if not isinstance(target, Plugin):
        raise PluginDefinitionError(f"{entry_point.value} is a {type(target).__name__}, not a runtimeproxy Plugin")
    target.check()
    if target.version == "0":
        dist = getattr(entry_point, "dist", None)
        version = getattr(dist, "version", None) if dist is not None else None
        if isinstance(version, str) and version:
            target.version = version
    return target


def discover_plugins(
    group: str = ENTRY_POINT_GROUP,
    *,
    extra: Iterable[Plugin] = (),
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
) -> DiscoveryResult:
    """The plugins installed as entry points of ``group``, plus ``extra`` ones (e.g. in tests).

    Never raises for a bad plugin: an entry point that fails to import or does not name a
    valid Plugin becomes a LoadFailure with the reason. Plugins sharing a name are all
    refused (a LoadFailure each): picking one would be a guess. ``entry_points`` replaces
    the installed ones (tests).
    """
    found: list[tuple[Plugin, str]] = []
    failures: list[LoadFailure] = []
    points = importlib.metadata.entry_points(group=group) if entry_points is None else entry_points
    for entry_point in sorted(points, key=lambda ep: (ep.name, ep.value)):
        source = _source(entry_point)
        try:
            plugin = load_entry_point(entry_point)
        except (Exception, SystemExit) as exc:  # a plugin's import may do anything; none may stop the server
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.debug("plugin entry point failed", entry_point=source, exc_info=True)
            failures.append(LoadFailure(entry_point.name, source, reason))
            continue
        found.append((plugin, source))
    for plugin in extra:
        if not isinstance(plugin, Plugin):
            failures.append(LoadFailure(repr(plugin), "explicit", f"not a Plugin: {type(plugin).__name__}"))
            continue
        try:
            plugin.check()
        except PluginDefinitionError as exc:
            failures.append(LoadFailure(plugin.name, "explicit", str(exc)))
            continue
        found.append((plugin, f"explicit: {plugin.name}"))
    by_name: dict[str, list[tuple[Plugin, str]]] = {}
    for plugin, source in found:
        same = by_name.setdefault(plugin.name, [])
        if not any(other is plugin for other, _ in same):  # two entry points naming one object: one plugin
            same.append((plugin, source))
    plugins: list[Plugin] = []
    for name, entries in by_name.items():
        if len(entries) == 1:
            plugins.append(entries[0][0])
            continue
        sources = "; ".join(source for _, source in entries)
        for _, source in entries:
            failures.append(LoadFailure(name, source, f"duplicate plugin name {name!r}, none loaded (from: {sources})"))
    plugins.sort(key=lambda p: (p.order, p.name))
    return DiscoveryResult(tuple(plugins), tuple(failures))


def settings_specs(plugins: Iterable[Plugin]) -> dict[str, SettingsSpec]:
    """The policy sections ``plugins`` define (what a policy file is read against), by name."""
    return {plugin.name: plugin.settings_spec for plugin in plugins if plugin.settings_spec is not None}


# --- running ------------------------------------------------------------------------------------


class PluginMetrics:
    """Per plugin and hook point: calls by outcome, and their duration."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = CollectorRegistry(auto_describe=True) if registry is None else registry
        self.registry = reg
        self.calls = Counter(
            "runtimeproxy_hooks_plugin_calls",
            "Plugin handler calls, by plugin, hook point (or start/stop/reconcile) and outcome "
            "(ok, error, timeout, invalid, busy).",
            ["plugin", "hook", "outcome"],
            registry=reg,
        )
        self.duration = Histogram(
            "runtimeproxy_hooks_plugin_call_duration_seconds",
            "Time a plugin handler took (up to its timeout), by plugin and hook point.",
            ["plugin", "hook"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.overwrites = Counter(
            "runtimeproxy_hooks_plugin_overwrites",
            "Values one plugin set that a later plugin replaced in the same hook call, by field "
            "(a map's name for its entries: annotations, labels, env, resources.unified).",
            ["field"],
            registry=reg,
        )

    def record(self, plugin: str, hook: str, outcome: Outcome, seconds: float) -> None:
        self.calls.labels(plugin=plugin, hook=hook, outcome=outcome).inc()
        self.duration.labels(plugin=plugin, hook=hook).observe(seconds)


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    hook: str
    outcome: Outcome
    reason: str
    failure_policy: FailurePolicy


@dataclass
class RunResult:
    """A hook call's merged response, the plugins whose changes it holds, the ignored failures
    and the plugins not called."""

    response: HookResponse
    applied: list[str] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)
    #: Plugins not called for this pod, and why (PluginRunner.skip_reason).
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass
class ReconcileReport:
    """One reconcile round: per plugin that ran, how many drifted values it set back (its
    handler's return value), and the failures (logged and counted, never raised)."""

    repaired: dict[str, int] = field(default_factory=dict)
    failures: list[PluginFailure] = field(default_factory=list)


class HookCallFailed(Exception):
    """A plugin with failure_policy "fail" failed: the hook call fails."""

    def __init__(self, failure: PluginFailure) -> None:
        self.failure = failure
        super().__init__(f"plugin {failure.plugin} failed at {failure.hook}: {failure.reason}")


class _Stage(enum.Enum):
    START = "start"
    STOP = "stop"
    RECONCILE = "reconcile"


def _qos_resources(resources: Resources | None) -> Any:
    if resources is None:
        return None
    return hook_pb.LinuxContainerResources(
        cpu_shares=resources.cpu_shares,
        cpu_quota=resources.cpu_quota,
        memory_limit_in_bytes=resources.memory_limit_in_bytes,
    )


def qos_of(pod: PodInfo, container: ContainerInfo | None = None) -> QoSResolution:
    """The pod's QoS class (the container's resources stand in when the pod's are unknown)."""
    resources = pod.resources if pod.resources is not None else (container.resources if container else None)
    return resolve_qos(pod.labels, pod.annotations, pod.cgroup_parent, _qos_resources(resources))


class PluginRunner:
    """Runs the enabled plugins' handlers: see the module doc for order, timeouts and failures.

    ``enable``: only these plugins (None: all); ``disable``: not these. Enabling a plugin
    that is not there is an error (ValueError naming the available ones); disabling one
    is only logged. A sync handler that is still running after its timeout keeps its worker
    thread (Python cannot stop a thread); a plugin with ``max_hung`` such calls still
    running is not called again until one ends (outcome "busy").
    """

    def __init__(
        self,
        plugins: Iterable[Plugin],
        *,
        enable: Iterable[str] | None = None,
        disable: Iterable[str] = (),
        context: ServerContext | None = None,
        registry: CollectorRegistry | None = None,
        metrics: PluginMetrics | None = None,
        max_hung: int = 4,
    ) -> None:
        available: dict[str, Plugin] = {}
        for plugin in plugins:
            if plugin.name in available:
                raise ValueError(f"two plugins are named {plugin.name!r}")
            available[plugin.name] = plugin
        wanted = set(available) if enable is None else set(enable)
        unknown = sorted(wanted - set(available))
        if unknown:
            known = ", ".join(sorted(available)) or "none"
            raise ValueError(f"cannot enable {', '.join(unknown)}: no such plugin (available: {known})")
        disabled = set(disable)
        for name in sorted(disabled - set(available)):
            log.warning("disabled plugin is not installed", plugin=name)
        self.available: Mapping[str, Plugin] = MappingProxyType(available)
        self.context = context if context is not None else ServerContext()
        self.metrics = metrics if metrics is not None else PluginMetrics(registry)
        self._max_hung = max_hung
        self._closed = False
        self._running_sync: dict[str, int] = {}  # per plugin: sync calls past their timeout, still running
        self._lock = threading.Lock()
        self._orphans: set[asyncio.Future[Any]] = set()
        self._odd_returns: set[str] = set()  # plugins warned about their reconcile return value
        self._states: dict[str, Any] = {}  # per plugin: what its state factory made, once
        self._state_failures: list[PluginFailure] = []
        enabled = [available[name] for name in wanted - disabled]
        self._set_enabled(plugin for plugin in enabled if self._make_state(plugin))

    def _make_state(self, plugin: Plugin) -> bool:
        """Call the plugin's state factory (once, for this runner); False (logged, kept for
        ``start``) when it raised: the plugin cannot run without its state."""
        if plugin.state_factory is None:
            self._states[plugin.name] = None
            return True
        try:
            self._states[plugin.name] = plugin.state_factory()
        except Exception as exc:  # a plugin's factory may do anything; it must not stop the others
            failure = PluginFailure(
                plugin.name, _Stage.START.value, "error", f"state factory: {_reason(exc)}", plugin.failure_policy
            )
            self._log_failure(failure, {"hook": _Stage.START.value})
            self._state_failures.append(failure)
            return False
        return True

    def state_of(self, name: str) -> Any:
        """The state object of plugin ``name`` in this runner (None: it has none). KeyError if unknown."""
        return self._states[name]

    def skip_reason(self, plugin: Plugin, qos: QoSClass | None = None) -> str:
        """Why ``plugin`` is not called ("" when it is): a node handle it needs is missing, or (for a
        pod of class ``qos``) its settings entry for the class says ``enabled: false``."""
        missing = [handle for handle in plugin.needs if getattr(self.context, handle) is None]
        if missing:
            return f"needs {' and '.join(missing)}, which this node lacks"
        spec = plugin.settings_spec
        if qos is None or spec is None or spec.settings is None:
            return ""
        entry = self.context.policy().section(spec).for_class(qos)
        if getattr(entry, "enabled", True) is False:
            return f"{plugin.name}.{spec.class_entry[QoSClass(qos)]}.enabled is false"
        return ""

    def _settings_kwargs(self, plugin: Plugin, policy: policy_mod.Policy) -> dict[str, Any]:
        """``section``, ``settings_for`` and ``state`` for the plugin's handlers, from ``policy``."""
        spec = plugin.settings_spec
        section: SectionSettings | None = policy.section(spec) if spec is not None else None

        def settings_for(qos: QoSClass | str) -> Any:
            return section.for_class(qos) if section is not None else None

        return {
            "section": section.common if section is not None else None,
            "settings_for": settings_for,
            "state": self._states.get(plugin.name),
        }

    def _set_enabled(self, plugins: Iterable[Plugin]) -> None:
        self.plugins: tuple[Plugin, ...] = tuple(sorted(plugins, key=lambda p: (p.order, p.name)))
        self._by_point = {
            point: tuple(plugin for plugin in self.plugins if point in plugin.hook_points) for point in HookPoint
        }

    @property
    def hook_points(self) -> frozenset[HookPoint]:
        """The hook points at least one enabled plugin handles."""
        return frozenset(point for point, plugins in self._by_point.items() if plugins)

    def plugins_for(self, point: HookPoint) -> tuple[Plugin, ...]:
        return self._by_point[point]

    def disable(self, name: str) -> None:
        """Stop running plugin ``name`` (e.g. after its on_start failed)."""
        self._set_enabled(plugin for plugin in self.plugins if plugin.name != name)

    # -- calls --

    async def run(
        self,
        point: HookPoint,
        *,
        pod: PodInfo,
        container: ContainerInfo | None = None,
        qos: QoSResolution | None = None,
    ) -> RunResult:
        """Run ``point``'s handlers; the merged response. HookCallFailed when a "fail" plugin fails."""
        resolution = qos if qos is not None else qos_of(pod, container)
        policy = self.context.policy()
        result = RunResult(HookResponse(point.kind))
        bound = {"hook": point.value, "pod": f"{pod.namespace}/{pod.name}"}
        if container is not None:
            bound["container"] = container.name
        pod = self._view(pod, policy, log.info, bound)
        owners = FieldOwners()
        for plugin in self._by_point[point]:
            skip = self.skip_reason(plugin, resolution.qos_class)
            if skip:
                result.skipped[plugin.name] = skip
                log.debug("plugin not called", plugin=plugin.name, reason=skip, **bound)
                continue
            handler = plugin.handler(point)
            assert handler is not None
            response = HookResponse(point.kind)
            given = self._settings_kwargs(plugin, policy)
            kwargs: dict[str, Any] = {
                "hook": point,
                "pod": pod,
                "container": container,
                "qos": resolution.qos_class,
                "qos_resolution": resolution,
                "settings": given["settings_for"](resolution.qos_class),
                **given,
                "response": response,
                "cgroups": self.context.cgroups,
                "resctrl": self.context.resctrl,
                "log": _plugin_log.bind(plugin=plugin.name, **bound),
                "plugin": plugin,
                "dry_run": self.context.dry_run,
            }
            outcome, reason, _ = await self._call(plugin, handler, point.value, kwargs)
            if outcome == "ok":
                problems = response.problems()
                if problems:
                    outcome, reason = "invalid", "; ".join(problems)
            if outcome == "ok":
                owners.take(plugin.name, response, functools.partial(self._overwritten, bound))
                result.response.merge(response)
                result.applied.append(plugin.name)
                continue
            failure = PluginFailure(plugin.name, point.value, outcome, reason, plugin.failure_policy)
            self._log_failure(failure, bound)
            if plugin.failure_policy == "fail":
                raise HookCallFailed(failure)
            result.failures.append(failure)
        return result

    async def start(self) -> list[PluginFailure]:
        """Call the on_start handlers. A failing "ignore" plugin is disabled (returned in the
        list); a failing "fail" plugin raises HookCallFailed: the server must not start without it."""
        failures: list[PluginFailure] = []
        for refused in self._state_failures:
            if refused.failure_policy == "fail":
                raise HookCallFailed(refused)
            failures.append(refused)
        for plugin in list(self.plugins):
            failure = await self._lifecycle(plugin, _Stage.START)
            if failure is None:
                continue
            if plugin.failure_policy == "fail":
                raise HookCallFailed(failure)
            self.disable(plugin.name)
            failures.append(failure)
        return failures

    async def stop(self) -> list[PluginFailure]:
        """Call the on_stop handlers (failures are logged and returned), then close()."""
        failures = []
        for plugin in reversed(self.plugins):
            failure = await self._lifecycle(plugin, _Stage.STOP)
            if failure is not None:
                failures.append(failure)
        self.close()
        return failures

    async def reconcile(self, *, pods: Sequence[PodInfo], **extra: Any) -> list[PluginFailure]:
        """Call every enabled plugin's reconcile handler with ``pods``, ``extra`` and the node
        handles; failures are logged, counted and returned, whatever the failure policy."""
        return (await self.reconcile_report(pods=pods, **extra)).failures

    async def reconcile_report(
        self,
        *,
        pods: Sequence[PodInfo],
        containers: Mapping[str, Sequence[ContainerInfo]] | None = None,
        gone: Sequence[PodInfo] = (),
        gone_containers: Mapping[str, Sequence[ContainerInfo]] | None = None,
        **extra: Any,
    ) -> ReconcileReport:
        """``reconcile``, also giving what each handler returned: the number of drifted values
        it set back. A return value that is not an int >= 0 (or None, for 0) is logged and
        taken as 0; the call still counts as "ok"."""
        report = ReconcileReport()
        policy = self.context.policy()  # each round: its hook calls have said it at info already
        viewed = tuple(self._view(pod, policy, log.debug, {"pod": f"{pod.namespace}/{pod.name}"}) for pod in pods)
        given = {
            "pods": viewed,
            "containers": MappingProxyType(dict(containers or {})),
            "gone": tuple(gone),
            "gone_containers": MappingProxyType(dict(gone_containers or {})),
        }
        for plugin in self.plugins:
            handler = plugin.reconcile_handler
            if handler is None or self.skip_reason(plugin):
                continue
            kwargs = {**extra, **self._node_kwargs(plugin, _Stage.RECONCILE), **given}
            kwargs["pods"] = self._called_for(plugin, viewed)
            outcome, reason, value = await self._call(plugin, handler, _Stage.RECONCILE.value, kwargs)
            if outcome != "ok":
                failure = PluginFailure(plugin.name, _Stage.RECONCILE.value, outcome, reason, plugin.failure_policy)
                self._log_failure(failure, {"hook": _Stage.RECONCILE.value})
                report.failures.append(failure)
                continue
            report.repaired[plugin.name] = _repair_count(plugin.name, value, self._odd_returns)
        return report

    def _view(self, pod: PodInfo, policy: policy_mod.Policy, say: Any, bound: Mapping[str, str]) -> PodInfo:
        """``pod`` as the plugins see it (hooks/podview.py), each withheld part said with ``say``."""
        view, withheld = plugin_view(pod, self.context.cgroups, policy)
        for reason in withheld:
            say("withheld from the plugins", reason=reason, **bound)
        return view

    def _called_for(self, plugin: Plugin, pods: tuple[PodInfo, ...]) -> tuple[PodInfo, ...]:
        """The pods whose class does not switch ``plugin`` off (``enabled: false``)."""
        spec = plugin.settings_spec
        if spec is None or not spec.switchable:
            return pods
        return tuple(pod for pod in pods if not self.skip_reason(plugin, qos_of(pod).qos_class))

    def close(self) -> None:
        """Run no more sync handlers. Their threads are daemon threads: a hung one never delays exit."""
        self._closed = True

    async def _lifecycle(self, plugin: Plugin, stage: _Stage) -> PluginFailure | None:
        handler = plugin.start_handler if stage is _Stage.START else plugin.stop_handler
        if handler is None or self.skip_reason(plugin):
            return None
        kwargs = {**self._node_kwargs(plugin, stage), "server": self.context}
        outcome, reason, _ = await self._call(plugin, handler, stage.value, kwargs)
        if outcome == "ok":
            return None
        failure = PluginFailure(plugin.name, stage.value, outcome, reason, plugin.failure_policy)
        self._log_failure(failure, {"hook": stage.value})
        return failure

    def _node_kwargs(self, plugin: Plugin, stage: _Stage) -> dict[str, Any]:
        return {
            **self._settings_kwargs(plugin, self.context.policy()),
            "plugin": plugin,
            "cgroups": self.context.cgroups,
            "resctrl": self.context.resctrl,
            "log": _plugin_log.bind(plugin=plugin.name, hook=stage.value),
            "dry_run": self.context.dry_run,
        }

    async def _call(self, plugin: Plugin, handler: Handler, hook: str, kwargs: dict[str, Any]) -> _Called:
        """Outcome, reason and (when "ok") the handler's return value."""
        started = time.perf_counter()
        if handler.is_async:
            called = await self._call_async(plugin, handler, kwargs)
        else:
            called = await self._call_sync(plugin, handler, kwargs)
        self.metrics.record(plugin.name, hook, called[0], time.perf_counter() - started)
        if trace.ON:  # bench/pod_timeline.py: each plugin's part of a hook call
            trace.event(
                "hooks.plugin", plugin=plugin.name, hook=hook, outcome=called[0], seconds=time.perf_counter() - started
            )
        return called

    async def _call_async(self, plugin: Plugin, handler: Handler, kwargs: dict[str, Any]) -> _Called:
        try:
            task = asyncio.ensure_future(handler.fn(**kwargs))
        except Exception as exc:  # the call itself raised before returning a coroutine
            return "error", _reason(exc), None
        # asyncio.wait, not wait_for: a handler that swallows its cancellation must not hold up the call.
        try:
            done, _ = await asyncio.wait({task}, timeout=plugin.timeout)
        except asyncio.CancelledError:  # the hook call itself was cancelled (the proxy gave up)
            task.cancel()
            self._keep_orphan(task, plugin)
            raise
        if not done:
            task.cancel()
            self._keep_orphan(task, plugin)
            return "timeout", f"no answer within {plugin.timeout:g}s", None
        return _task_outcome(task)

    async def _call_sync(self, plugin: Plugin, handler: Handler, kwargs: dict[str, Any]) -> _Called:
        if self._closed:
            return "error", "not run: the runner is closed", None
        with self._lock:
            hung = self._running_sync.get(plugin.name, 0)
            if hung >= self._max_hung:
                return "busy", f"{hung} earlier calls of its sync handlers timed out and still run", None
        call = _SyncCall()
        context = contextvars.copy_context()
        work = _in_thread(
            functools.partial(context.run, _run_sync_handler, handler, kwargs),
            f"runtime-hooks-{plugin.name}",
            lambda: self._sync_done(plugin.name, call),
        )
        future = asyncio.wrap_future(work)
        try:
            done, _ = await asyncio.wait({future}, timeout=plugin.timeout)
        except asyncio.CancelledError:
            future.cancel()  # detach from the thread, which runs on
            work.add_done_callback(functools.partial(_late_end, plugin.name))
            raise
        if not done:
            # Detached, the thread's end does not touch the loop (which may be closed by then).
            future.cancel()
            work.add_done_callback(functools.partial(_late_end, plugin.name))
            with self._lock:
                if not call.finished:  # only calls past their timeout count as hung
                    call.hung = True
                    self._running_sync[plugin.name] = self._running_sync.get(plugin.name, 0) + 1
            return "timeout", f"no answer within {plugin.timeout:g}s (its thread runs on)", None
        return _task_outcome(future)

    def _sync_done(self, name: str, call: _SyncCall) -> None:
        with self._lock:
            call.finished = True
            if call.hung:
                self._running_sync[name] -= 1

    def _keep_orphan(self, future: asyncio.Future[Any], plugin: Plugin) -> None:
        """Hold a timed-out call until it ends, then log how (never as an unretrieved exception)."""
        self._orphans.add(future)

        def finished(done: asyncio.Future[Any]) -> None:
            self._orphans.discard(done)
            if done.cancelled():
                return
            exc = done.exception()
            log.info("timed-out plugin call ended", plugin=plugin.name, error=_reason(exc) if exc is not None else None)

        future.add_done_callback(finished)

    def _overwritten(self, bound: Mapping[str, str], overwrite: Overwrite) -> None:
        self.metrics.overwrites.labels(field=overwrite.kind).inc()
        log.warning("plugin overwrote another plugin's value", **bound, **overwrite.log_fields())

    @staticmethod
    def _log_failure(failure: PluginFailure, bound: Mapping[str, str]) -> None:
        fields = {**bound, "plugin": failure.plugin, "outcome": failure.outcome, "reason": failure.reason}
        if failure.failure_policy == "fail":
            log.error("plugin failed; failing the hook call", **fields)
        else:
            log.warning("plugin failed; its changes are ignored", **fields)


class _ReturnedAwaitable(Exception):
    pass


def _late_end(plugin: str, work: concurrent.futures.Future[Any]) -> None:
    """Log how a timed-out sync handler finally ended (runs in its thread)."""
    if work.cancelled():
        return
    exc = work.exception()
    log.info("timed-out plugin call ended", plugin=plugin, error=_reason(exc) if exc is not None else None)


def _in_thread(fn: Callable[[], Any], name: str, finished: Callable[[], None]) -> concurrent.futures.Future[Any]:
    """Run ``fn`` in a new daemon thread; its future. ``finished`` runs in the thread when ``fn`` ends.

    Not a ThreadPoolExecutor: its workers are joined at interpreter exit, so one hung plugin
    would keep the server from exiting on SIGTERM. A thread per call costs tens of
    microseconds, little next to a gRPC call, and a hung one blocks nothing.
    """
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def target() -> None:
        try:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
        finally:
            finished()

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


def _run_sync_handler(handler: Handler, kwargs: dict[str, Any]) -> Any:
    result = handler.fn(**kwargs)
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if callable(close):
            close()  # no "coroutine was never awaited" warning
        raise _ReturnedAwaitable(f"{handler.name} is not async def but returned an awaitable; declare it async def")
    return result


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _task_outcome(future: asyncio.Future[Any]) -> _Called:
    if future.cancelled():
        return "error", "cancelled", None
    exc = future.exception()
    if exc is None:
        return "ok", "", future.result()
    return "error", _reason(exc), None


def _repair_count(plugin: str, value: Any, warned: set[str]) -> int:
    """A reconcile handler's return value as a count of repaired values (see reconcile_report);
    ``warned``: the plugins already told about an odd return value (once each, not every round)."""
    if value is None:
        return 0
    if isinstance(value, int) and value >= 0:  # bool included: True is one repair
        return int(value)
    if plugin not in warned:
        warned.add(plugin)
        log.warning(
            "reconcile handler should return the number of values it repaired (an int >= 0); taken as 0",
            plugin=plugin,
            returned=repr(value)[:80],
        )
    return 0
