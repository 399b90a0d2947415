"""The per-QoS-class policy of the runtime-hooks plugins: one YAML file.

A policy file has one section per plugin, and in each section one entry per QoS class
(``qos.QoSClass``) next to the settings that concern the whole section::

    resctrl:
      BE: {l3_percent_range: [0, 20]}   # BE gets less L3; mb_percent and the rest keep the defaults
    network:
      interface: eth0

The file is laid over the defaults: a section, class or key it leaves out keeps its default
value. Unknown sections, classes and keys are errors, so a typo cannot pass unnoticed.
``PolicyError`` names the file, the YAML path (``resctrl.BE.l3_percent_range``) and the
reason. The defaults are ``hooks/data/default-policy.yaml``, shipped as package data and
loaded at import into ``DEFAULT_POLICY``: that file is their single source, and it says
where each value comes from. docs/qos-classes.md describes every key.

``PolicyWatcher`` polls a policy file and reloads it when it changes; an invalid version is
logged and the last good policy stays in force.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, TypeVar, get_type_hints, overload

import structlog
import yaml

from . import data as _data
from .qos import QoSClass

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_POLICY_FILE",
    "NETWORK_BANDS",
    "PLUGINS",
    "BEQuotaSource",
    "CPUClassPolicy",
    "CPUPolicy",
    "CPUSetClassPolicy",
    "CPUSetPolicy",
    "ClassPolicy",
    "MemoryClassPolicy",
    "MemoryPolicy",
    "NetworkBandPolicy",
    "NetworkPolicy",
    "Plugin",
    "Policy",
    "PolicyError",
    "PolicyWatcher",
    "ReconcilerPolicy",
    "ResctrlClassPolicy",
    "ResctrlPolicy",
    "TrustPolicy",
    "V1SoftLimit",
    "dump_policy",
    "load_policy",
    "loads_policy",
    "policy_for",
]

log = structlog.get_logger("runtimeproxy.hooks.policy")

DEFAULT_POLICY_FILE: Final = "default-policy.yaml"

BEQuotaSource = Literal["batch", "kubelet"]
V1SoftLimit = Literal["unset", "request", "zero"]

_CLASS_NAMES: Final = frozenset(QoSClass)


class PolicyError(ValueError):
    """An unusable policy file: which file, where in it (a dotted YAML path, "" for the whole file), and why."""

    def __init__(self, file: str, path: str, reason: str) -> None:
        self.file = file
        self.path = path
        self.reason = reason
        super().__init__(f"{file}: {path}: {reason}" if path else f"{file}: {reason}")


# --- leaf values ------------------------------------------------------------------------
# A parser takes the YAML value and its path and returns the checked value, or raises _Invalid.

_Parser = Callable[[object, str], Any]


class _Invalid(Exception):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason


def _show(value: object) -> str:
    """A YAML value as an error message shows it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:40]) + "…"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _meta(parse: _Parser) -> Mapping[str, _Parser]:
    """A leaf field's metadata: the parser that checks its YAML value."""
    return {"parse": parse}


def _boolean(value: object, path: str) -> bool:
    if isinstance(value, bool):
        return value
    raise _Invalid(path, f"must be true or false, got {_show(value)}")


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(low: int, high: int | None = None, what: str = "an integer") -> _Parser:
    bounds = f"from {low} to {high}" if high is not None else f"of at least {low}"

    def parse(value: object, path: str) -> int:
        if not _is_integer(value):
            raise _Invalid(path, f"must be {what} {bounds}, got {_show(value)}")
        assert isinstance(value, int)
        if value < low or (high is not None and value > high):
            raise _Invalid(path, f"must be {what} {bounds}, got {value}")
        return value

    return parse


_percent = _integer(0, 100, "a percentage")


def _choice(*options: str) -> _Parser:
    def parse(value: object, path: str) -> str:
        if isinstance(value, str) and value in options:
            return value
        raise _Invalid(path, f"must be one of {', '.join(options)}, got {_show(value)}")

    return parse


def _percent_range(value: object, path: str) -> tuple[int, int]:
    if not isinstance(value, list | tuple) or len(value) != 2 or not all(_is_integer(item) for item in value):
        raise _Invalid(path, f"must be [start, end], two integer percentages, got {_show(value)}")
    start, end = value
    for name, number in (("start", start), ("end", end)):
        if not 0 <= number <= 100:
            raise _Invalid(path, f"{name} must be a percentage from 0 to 100, got {number}")
    if start >= end:
        raise _Invalid(path, f"start ({start}) must be below end ({end})")
    return (start, end)


def _seconds(low: float, high: float) -> _Parser:
    def parse(value: object, path: str) -> float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _Invalid(path, f"must be a number of seconds from {low:g} to {high:g}, got {_show(value)}")
        if not (math.isfinite(value) and low <= value <= high):
            raise _Invalid(path, f"must be a number of seconds from {low:g} to {high:g}, got {value!r}")
        return float(value)

    return parse


_IFNAMSIZ: Final = 16  # linux/if.h, with the terminating NUL


def _interface(value: object, path: str) -> str:
    """A network interface name as the kernel accepts it (dev_valid_name), or "" for none."""
    if not isinstance(value, str):
        raise _Invalid(path, f"must be an interface name (a string, \"\" for none), got {_show(value)}")
    if value == "":
        return value
    if (
        len(value.encode()) >= _IFNAMSIZ
        or value in (".", "..")
        or any(char in "/:" or char.isspace() or not char.isprintable() for char in value)
    ):
        reason = "at most 15 bytes, no '/', ':', space or control character"
        raise _Invalid(path, f"{_show(value)} is not a valid interface name ({reason})")
    return value


# --- the policy -------------------------------------------------------------------------
# Class entries are fields named after the classes (LSE, LSR, LS, BE, SYSTEM), so the YAML
# path of a value is its attribute path: policy.resctrl.BE.l3_percent_range.


@dataclass(frozen=True)
class CPUClassPolicy:
    """CPU settings of one class.

    ``cfs_quota_enabled``: false runs the container with no CFS quota (-1).
    ``cfs_burst_percent``: cpu.cfs_burst_us (v1) / cpu.max.burst (v2) as a percentage of the
    cpu limit, 0 = off. ``cfs_quota_burst_percent``: the ceiling, as a percentage of the
    limit, to which the reconciler may raise the quota while the node has CPU to spare, 100 =
    never. ``cpu_idle``: cgroup cpu.idle. ``group_identity``: cpu.bvt_warp_ns (-1..2) on
    kernels that have it.
    """

    cfs_quota_enabled: bool = field(metadata=_meta(_boolean))
    cfs_burst_percent: int = field(metadata=_meta(_integer(0, 10000, "a percentage")))
    cfs_quota_burst_percent: int = field(metadata=_meta(_integer(100, None, "a percentage")))
    cpu_idle: bool = field(metadata=_meta(_boolean))
    group_identity: int = field(metadata=_meta(_integer(-1, 2)))


@dataclass(frozen=True)
class CPUPolicy:
    """``be_quota_source``: "batch" sets a BE container's CFS quota from its kubernetes.io/batch-cpu
    limit, "kubelet" keeps kubelet's."""

    be_quota_source: BEQuotaSource = field(metadata=_meta(_choice("batch", "kubelet")))
    LSE: CPUClassPolicy
    LSR: CPUClassPolicy
    LS: CPUClassPolicy
    BE: CPUClassPolicy
    SYSTEM: CPUClassPolicy


@dataclass(frozen=True)
class CPUSetClassPolicy:
    """``pinned``: the container runs on the cpuset assigned to its pod instead of the shared pool."""

    pinned: bool = field(metadata=_meta(_boolean))


@dataclass(frozen=True)
class CPUSetPolicy:
    LSE: CPUSetClassPolicy
    LSR: CPUSetClassPolicy
    LS: CPUSetClassPolicy
    BE: CPUSetClassPolicy
    SYSTEM: CPUSetClassPolicy


@dataclass(frozen=True)
class ResctrlClassPolicy:
    """``l3_percent_range``: (start, end) of the L3 cache ways the class may fill, in percent
    (CAT), start < end. ``mb_percent``: its memory bandwidth ceiling (MBA), 1..100."""

    l3_percent_range: tuple[int, int] = field(metadata=_meta(_percent_range))
    mb_percent: int = field(metadata=_meta(_integer(1, 100, "a percentage")))


@dataclass(frozen=True)
class ResctrlPolicy:
    LSE: ResctrlClassPolicy
    LSR: ResctrlClassPolicy
    LS: ResctrlClassPolicy
    BE: ResctrlClassPolicy
    SYSTEM: ResctrlClassPolicy


@dataclass(frozen=True)
class MemoryClassPolicy:
    """Memory settings of one class (cgroup v2 unless said otherwise).

    memory.min = request * ``min_percent`` / 100 and memory.low = request * ``low_percent`` /
    100 (0 = off; low may not be below min); memory.high = request + (limit - request) *
    ``throttling_percent`` / 100 (0 = off, "max"). ``wmark_ratio``, ``wmark_scale_permill``,
    ``wmark_min_adj``: Anolis OS memcg async reclaim, written only where the files exist.
    ``v1_soft_limit`` (cgroup v1): memory.soft_limit_in_bytes "unset", "request" or "zero".
    """

    min_percent: int = field(metadata=_meta(_percent))
    low_percent: int = field(metadata=_meta(_percent))
    throttling_percent: int = field(metadata=_meta(_percent))
    wmark_ratio: int = field(metadata=_meta(_percent))
    wmark_scale_permill: int = field(metadata=_meta(_integer(1, 1000, "a per-mille value")))
    wmark_min_adj: int = field(metadata=_meta(_integer(-25, 50)))
    v1_soft_limit: V1SoftLimit = field(metadata=_meta(_choice("unset", "request", "zero")))

    def _problems(self) -> Iterator[tuple[str, str]]:
        if self.low_percent and self.low_percent < self.min_percent:
            reason = f"{self.low_percent} is below min_percent ({self.min_percent}): memory.low < memory.min"
            yield "low_percent", reason


@dataclass(frozen=True)
class MemoryPolicy:
    LSE: MemoryClassPolicy
    LSR: MemoryClassPolicy
    LS: MemoryClassPolicy
    BE: MemoryClassPolicy
    SYSTEM: MemoryClassPolicy


@dataclass(frozen=True)
class NetworkBandPolicy:
    """One egress band: guaranteed ``rate_percent`` and ``ceil_percent`` of the link speed, HTB ``priority``."""

    rate_percent: int = field(metadata=_meta(_integer(1, 100, "a percentage")))
    ceil_percent: int = field(metadata=_meta(_integer(1, 100, "a percentage")))
    priority: int = field(metadata=_meta(_integer(0, 7)))

    def _problems(self) -> Iterator[tuple[str, str]]:
        if self.rate_percent > self.ceil_percent:
            yield "rate_percent", f"{self.rate_percent} is above ceil_percent ({self.ceil_percent})"


@dataclass(frozen=True)
class NetworkPolicy:
    """``interface``: the shaped interface, "" = network QoS off. ``link_speed_mbit``: its speed,
    0 = read /sys/class/net/<interface>/speed. Bands SYSTEM, LS, BE (see ``NETWORK_BANDS``)."""

    interface: str = field(metadata=_meta(_interface))
    link_speed_mbit: int = field(metadata=_meta(_integer(0)))
    SYSTEM: NetworkBandPolicy
    LS: NetworkBandPolicy
    BE: NetworkBandPolicy

    _key_hints: ClassVar[Mapping[str, str]] = MappingProxyType(
        {name: f"{name} has no band of its own: LSE, LSR and LS pods share the LS band" for name in ("LSE", "LSR")}
    )

    def _problems(self) -> Iterator[tuple[str, str]]:
        total = self.SYSTEM.rate_percent + self.LS.rate_percent + self.BE.rate_percent
        if total > 100:
            rates = f"SYSTEM {self.SYSTEM.rate_percent} + LS {self.LS.rate_percent} + BE {self.BE.rate_percent}"
            yield "", f"the bands' rate_percent add up to {total} ({rates}), more than 100"


@dataclass(frozen=True)
class ReconcilerPolicy:
    """``interval_seconds``: how often the plugins re-apply the policy to running containers."""

    interval_seconds: float = field(metadata=_meta(_seconds(0.1, 86400.0)))


@dataclass(frozen=True)
class TrustPolicy:
    """What runtime-hooks takes from a pod's own metadata (docs/security.md).

    ``pod_cpuset``: the cpuset in the pod annotation scheduling.koordinator.sh/resource-status
    pins the containers of pinned classes, and lets the cpu plugin lift their CFS quota; false
    ignores it (no plugin sees the annotation: hooks/podview.py).
    """

    pod_cpuset: bool = field(metadata=_meta(_boolean))


@dataclass(frozen=True)
class Policy:
    """The whole policy: one section per plugin, the reconciler's interval, and what is trusted."""

    cpu: CPUPolicy
    cpuset: CPUSetPolicy
    resctrl: ResctrlPolicy
    memory: MemoryPolicy
    network: NetworkPolicy
    reconciler: ReconcilerPolicy
    trust: TrustPolicy


ClassPolicy = CPUClassPolicy | CPUSetClassPolicy | ResctrlClassPolicy | MemoryClassPolicy | NetworkBandPolicy
Plugin = Literal["cpu", "cpuset", "resctrl", "memory", "network"]
PLUGINS: Final[tuple[Plugin, ...]] = ("cpu", "cpuset", "resctrl", "memory", "network")

# The network band of each class, as Koordinator's tc plugin groups them (GetPodNetQoSClassByName).
NETWORK_BANDS: Final[Mapping[QoSClass, QoSClass]] = MappingProxyType(
    {
        QoSClass.LSE: QoSClass.LS,
        QoSClass.LSR: QoSClass.LS,
        QoSClass.LS: QoSClass.LS,
        QoSClass.BE: QoSClass.BE,
        QoSClass.SYSTEM: QoSClass.SYSTEM,
    }
)


@overload
def policy_for(policy: Policy, plugin: Literal["cpu"], qos: QoSClass) -> CPUClassPolicy: ...
@overload
def policy_for(policy: Policy, plugin: Literal["cpuset"], qos: QoSClass) -> CPUSetClassPolicy: ...
@overload
def policy_for(policy: Policy, plugin: Literal["resctrl"], qos: QoSClass) -> ResctrlClassPolicy: ...
@overload
def policy_for(policy: Policy, plugin: Literal["memory"], qos: QoSClass) -> MemoryClassPolicy: ...
@overload
def policy_for(policy: Policy, plugin: Literal["network"], qos: QoSClass) -> NetworkBandPolicy: ...
@overload
def policy_for(policy: Policy, plugin: str, qos: QoSClass) -> ClassPolicy: ...
def policy_for(policy: Policy, plugin: str, qos: QoSClass) -> ClassPolicy:
    """A plugin's settings for one class; for "network", the band the class uses."""
    if plugin not in PLUGINS:
        raise ValueError(f"no per-class policy for plugin {plugin!r} (plugins: {', '.join(PLUGINS)})")
    qos = QoSClass(qos)
    if plugin == "network":
        qos = NETWORK_BANDS[qos]
    entry: ClassPolicy = getattr(getattr(policy, plugin), qos.value)
    return entry


# --- loading ----------------------------------------------------------------------------

_D = TypeVar("_D", bound="DataclassInstance")


@cache
def _types(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _field_names(cls: type[DataclassInstance]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _unknown_key(cls: type[DataclassInstance], key: object) -> str:
    names = _field_names(cls)
    valid = f"valid keys: {', '.join(names)}"
    if isinstance(key, str):
        hints: Mapping[str, str] = getattr(cls, "_key_hints", {})
        if key in hints:
            return f"{hints[key]} ({valid})"
        if any(name in _CLASS_NAMES for name in names):
            if key.upper() in names and key.upper() in _CLASS_NAMES:
                return f"unknown QoS class {key!r}: class names are upper case, did you mean {key.upper()!r}? ({valid})"
            if key.isupper():
                return f"unknown QoS class {key!r} ({valid})"
    return f"unknown key {_show(key)} ({valid})"


def _build(cls: type[_D], raw: object, base: _D | None, path: str) -> _D:
    """``cls`` from its YAML mapping, keys it leaves out taken from ``base`` (required if None)."""
    if raw is None:  # "cpu:" with nothing under it
        raw = {}
    if not isinstance(raw, dict):
        what = "must be a mapping" if path else "the policy must be a mapping"
        raise _Invalid(path, f"{what} with keys {', '.join(_field_names(cls))}, got {_show(raw)}")
    names = _field_names(cls)
    for key in raw:
        if key not in names:
            raise _Invalid(_join(path, key), _unknown_key(cls, key))
    values: dict[str, Any] = {}
    for item in fields(cls):
        where = _join(path, item.name)
        if item.name in raw:
            kind = _types(cls)[item.name]
            if isinstance(kind, type) and is_dataclass(kind):
                values[item.name] = _build(kind, raw[item.name], getattr(base, item.name, None), where)
            else:
                values[item.name] = item.metadata["parse"](raw[item.name], where)
        elif base is not None:
            values[item.name] = getattr(base, item.name)
        else:
            raise _Invalid(where, "missing (the defaults file must set every key)")
    make: Callable[..., _D] = cls
    built = make(**values)
    problems: Callable[[], Iterator[tuple[str, str]]] | None = getattr(built, "_problems", None)
    for where, reason in problems() if problems else ():
        raise _Invalid(_join(path, where) if where else path, reason)
    return built


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (PyYAML keeps the last silently)."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _value in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # unhashable: construct_mapping reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark, f"found key {key!r} twice", key_node.start_mark
            )
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{exc.problem}{where}"
    return str(exc)


def _parse(text: str, file: str, base: Policy | None) -> Policy:
    try:
        raw = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PolicyError(file, "", f"not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise PolicyError(file, "", "not valid YAML: nested too deeply") from None
    try:
        return _build(Policy, raw, base, "")
    except _Invalid as exc:
        raise PolicyError(file, exc.path, exc.reason) from None


def loads_policy(text: str, file: str = "<string>", base: Policy | None = None) -> Policy:
    """The policy in YAML ``text`` laid over ``base`` (default: ``DEFAULT_POLICY``); ``file`` names it in errors."""
    return _parse(text, file, DEFAULT_POLICY if base is None else base)


_FileKey = tuple[int, int, int]


def _file_key(st: os.stat_result) -> _FileKey:
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _read(path: str) -> tuple[_FileKey, str]:
    """The file's text and the (mtime_ns, size, inode) of the version read; PolicyError if unreadable."""
    try:
        with open(path, "rb") as file:
            key = _file_key(os.fstat(file.fileno()))
            data = file.read()
    except OSError as exc:
        raise PolicyError(path, "", f"cannot read the file: {exc.strerror or exc}") from None
    try:
        return key, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(path, "", f"not UTF-8 text (byte {exc.start})") from None


def load_policy(path: str | os.PathLike[str], base: Policy | None = None) -> Policy:
    """The policy file at ``path`` laid over ``base`` (default: ``DEFAULT_POLICY``). Raises PolicyError."""
    name = os.fspath(path)
    return loads_policy(_read(name)[1], name, base)


# --- dumping ----------------------------------------------------------------------------


class _Flow(list[Any]):
    """A list dumped in flow style: ``[0, 30]``."""


class _Dumper(yaml.SafeDumper):
    pass


def _represent_flow(dumper: _Dumper, data: _Flow) -> yaml.SequenceNode:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)


_Dumper.add_representer(_Flow, _represent_flow)


def _plain(value: object) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {item.name: _plain(getattr(value, item.name)) for item in fields(value)}
    if isinstance(value, tuple):
        return _Flow(value)
    return value


def dump_policy(policy: Policy) -> str:
    """The whole policy as YAML that ``loads_policy`` reads back to an equal policy."""
    text: str = yaml.dump(_plain(policy), Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    return text


# --- the defaults -----------------------------------------------------------------------


def _load_defaults() -> Policy:
    resource = resources.files(_data).joinpath(DEFAULT_POLICY_FILE)
    return _parse(resource.read_text(encoding="utf-8"), f"{_data.__name__}/{DEFAULT_POLICY_FILE}", None)


DEFAULT_POLICY: Final[Policy] = _load_defaults()


# --- watching ---------------------------------------------------------------------------


class PolicyWatcher:
    """The policy in ``path``, reloaded when the file changes; ``current`` is the policy in force.

    The file is polled every ``poll_interval`` seconds and re-read when its (mtime, size,
    inode) changes; replace it atomically (write, then rename) so no half-written version is
    read. Each good version is laid over ``base`` (default ``DEFAULT_POLICY``): a key removed
    from the file goes back to its default. ``on_change(policy)`` runs, on the event loop,
    whenever ``current`` changes, including when ``start`` first reads the file.

    Before ``start`` and while the file has never been readable, ``current`` is ``base``.
    An invalid version is logged once (file, YAML path, reason) and the last good policy
    stays; so does it when the file is removed or unreadable.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_change: Callable[[Policy], object] | None = None,
        *,
        poll_interval: float = 0.5,
        base: Policy | None = None,
    ) -> None:
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval!r}")
        self.path = os.fspath(path)
        self.poll_interval = poll_interval
        self._on_change = on_change
        self._base = DEFAULT_POLICY if base is None else base
        self._current = self._base
        self._seen: _FileKey | str | None = None  # the version last looked at, or why there was none
        self._task: asyncio.Task[None] | None = None

    @property
    def current(self) -> Policy:
        return self._current

    def check(self) -> bool:
        """Look at the file now and load it if it changed; True if ``current`` changed."""
        try:
            key: _FileKey | str = _file_key(os.stat(self.path))
        except FileNotFoundError:
            key = "missing"
        except OSError as exc:
            key = f"cannot stat the file: {exc.strerror or exc}"
        if key == self._seen:
            return False
        first, self._seen = self._seen is None, key
        if key == "missing":
            if first:
                log.info("no policy file; using the defaults", path=self.path)
            else:
                log.warning("policy file removed; keeping the current policy", path=self.path)
            return False
        if isinstance(key, str):
            log.error("policy file unreadable; keeping the current policy", path=self.path, error=key)
            return False
        try:
            self._seen, text = _read(self.path)  # the version actually read
            policy = loads_policy(text, self.path, self._base)
        except PolicyError as exc:
            log.error(
                "policy file invalid; keeping the current policy",
                path=self.path,
                yaml_path=exc.path,
                reason=exc.reason,
                error=str(exc),
            )
            return False
        return self._set(policy)

    def _set(self, policy: Policy) -> bool:
        old, self._current = self._current, policy
        changed = [item.name for item in fields(Policy) if getattr(old, item.name) != getattr(policy, item.name)]
        if not changed:
            log.info("policy file read; policy unchanged", path=self.path)
            return False
        log.info("policy loaded", path=self.path, changed=changed)
        if self._on_change is not None:
            try:
                self._on_change(policy)
            except Exception:  # a consumer's bug must not stop the watcher
                log.exception("policy change callback failed", path=self.path)
        return True

    async def start(self) -> None:
        """Read the file once, then keep polling it in a background task until ``stop``."""
        if self._task is not None:
            return
        self.check()
        self._task = asyncio.create_task(self._poll(), name="policy-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task})

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                self.check()
            except Exception:  # the watcher must outlive any surprise; the next poll retries
                log.exception("policy file check failed", path=self.path)
