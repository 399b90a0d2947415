"""The policy file of runtime-hooks: one YAML file, one section per plugin, read against the
settings the installed plugins declare (hooks/settings.py).

A section is keyed by the plugin's name and holds one entry per QoS class (``qos.QoSClass``)
next to the settings that concern the whole section; two sections are the server's own
(``reconciler``, ``trust``)::

    resctrl:
      BE: {l3_percent_range: [0, 20]}   # BE gets less L3; mb_percent and the rest keep the defaults
    network:
      interface: eth0
    stamp:                              # a third-party plugin's own settings
      BE: {value: be-stamp}

The file is laid over the defaults: a section, class or key it leaves out keeps its default
value. Unknown sections (none of the installed plugins defines them), classes and keys are
errors, so a typo cannot pass unnoticed. ``PolicyError`` names the file, the YAML path
(``resctrl.BE.l3_percent_range``) and the reason.

Which sections exist follows from the plugins: ``specs`` (name -> ``SettingsSpec``, see
``sdk.settings_specs``) is what a policy is read against. A plugin's defaults are its own; the
built-ins' and the server's are in ``hooks/data/default-policy.yaml`` (package data, their
single source, saying where each value comes from), which ``builtin_defaults`` hands to each
built-in plugin. docs/qos-classes.md describes every built-in key.

``PolicyWatcher`` watches a policy file (inotify on its directory, polling when that cannot
be) and reloads it when it changes; an invalid version is logged and the last good policy
stays in force. What it read and why a version was refused (``LoadFailure``) go to a
``LoadObserver`` (hooks/policy_metrics.py exports them).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any, Final, Protocol

import structlog
import yaml

try:  # libyaml's parser, for the built-in defaults read at every start (ten times PyYAML's own)
    from yaml import CSafeLoader as _LibyamlSafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _LibyamlSafeLoader  # type: ignore[assignment]

from runtimeproxy.common.dirwatch import DirectoryChanges

from . import data as _data
from .settings import Invalid, SectionSettings, SettingsSpec, boolean, build, mapping, parsed_by, plain, seconds

__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_POLICY_FILE",
    "SERVER_SECTIONS",
    "LoadFailure",
    "LoadObserver",
    "Policy",
    "PolicyError",
    "PolicyWatcher",
    "ReconcilerPolicy",
    "Specs",
    "TrustPolicy",
    "builtin_defaults",
    "default_policy",
    "dump_policy",
    "load_policy",
    "loads_policy",
]

log = structlog.get_logger("runtimeproxy.hooks.policy")

DEFAULT_POLICY_FILE: Final = "default-policy.yaml"
#: The sections that are the server's own, not a plugin's.
SERVER_SECTIONS: Final = ("reconciler", "trust")

#: What a policy is read against: each plugin's settings, by plugin (= section) name.
Specs = Mapping[str, SettingsSpec]


class LoadFailure(StrEnum):
    """Why a version of the policy file was not put in force: the ``cause`` label of
    runtimeproxy_hooks_policy_load_failures_total."""

    UNREADABLE = "unreadable"  # cannot be looked at or read (permissions, I/O error)
    ENCODING = "encoding"  # not UTF-8 text
    YAML = "yaml"  # not valid YAML: syntax, a key given twice, nested too deeply
    INVALID = "invalid"  # YAML that breaks the schema: an unknown section, class or key, a bad value
    REMOVED = "removed"  # the file went away after it had been there


class PolicyError(ValueError):
    """An unusable policy file: which file, where in it (a dotted YAML path, "" for the whole file),
    why, and what kind of failure it is (``cause``)."""

    def __init__(self, file: str, path: str, reason: str, cause: LoadFailure = LoadFailure.INVALID) -> None:
        self.file = file
        self.path = path
        self.reason = reason
        self.cause = cause
        super().__init__(f"{file}: {path}: {reason}" if path else f"{file}: {reason}")


# --- the server's own sections ------------------------------------------------------------------


@dataclass(frozen=True)
class ReconcilerPolicy:
    """``interval_seconds``: how often the plugins re-apply the policy to running containers."""

    interval_seconds: float = field(metadata=parsed_by(seconds(0.1, 86400.0)))


@dataclass(frozen=True)
class TrustPolicy:
    """What runtime-hooks takes from a pod's own metadata (docs/security.md).

    ``pod_cpuset``: the cpuset in the pod annotation scheduling.koordinator.sh/resource-status
    pins the containers of pinned classes, and lets the cpu plugin lift their CFS quota; false
    ignores it (no plugin sees the annotation: hooks/podview.py).
    ``pod_cpu_qos``: an LS pod's annotation koordinator.sh/cpuQOS sets its own group identity
    (hooks/plugins/cpu_qos.py); false ignores it (hooks/podview.py withholds it).
    """

    pod_cpuset: bool = field(metadata=parsed_by(boolean))
    pod_cpu_qos: bool = field(metadata=parsed_by(boolean))


_SERVER_TYPES: Final[Mapping[str, type[Any]]] = MappingProxyType({"reconciler": ReconcilerPolicy, "trust": TrustPolicy})


@dataclass(frozen=True)
class Policy:
    """The policy in force: the server's own sections and each plugin's (by plugin name).

    A plugin without a section here (the policy was read without its spec) has its defaults:
    ``section`` gives them when asked with the spec."""

    reconciler: ReconcilerPolicy
    trust: TrustPolicy
    sections: Mapping[str, SectionSettings] = field(default_factory=lambda: MappingProxyType({}))

    def section(self, spec: SettingsSpec) -> SectionSettings:
        """The plugin's section in force: read from the file, else the spec's defaults."""
        found = self.sections.get(spec.name)
        return found if found is not None else spec.defaults


# --- loading ----------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (PyYAML keeps the last silently)."""


class _DefaultsLoader(_LibyamlSafeLoader):
    """_Loader's constructors on libyaml's parser: for our own file only, whose errors are bugs,
    so that a user's file keeps PyYAML's messages and nesting limit."""


def _construct_mapping(loader: _Loader | _DefaultsLoader, node: yaml.MappingNode) -> dict[Any, Any]:
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
_DefaultsLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{exc.problem}{where}"
    return str(exc)


def _unknown_section(key: object, specs: Specs) -> str:
    plugins = ", ".join(sorted(specs)) or "none"
    return (
        f"unknown section {key!r}: no installed plugin defines it (plugin sections: {plugins}; "
        f"server sections: {', '.join(SERVER_SECTIONS)})"
    )


def _build_policy(raw: object, base: Policy, specs: Specs) -> Policy:
    data = mapping(raw, "", (*SERVER_SECTIONS, *sorted(specs)))
    for key in data:
        if key not in specs and key not in SERVER_SECTIONS:
            raise Invalid(str(key), _unknown_section(key, specs))
    server = {
        name: build(kind, data[name], getattr(base, name), name) if name in data else getattr(base, name)
        for name, kind in _SERVER_TYPES.items()
    }
    sections = {
        name: spec.load(data[name], base.section(spec), name) if name in data else base.section(spec)
        for name, spec in sorted(specs.items())
    }
    return Policy(server["reconciler"], server["trust"], MappingProxyType(sections))


def _yaml(text: str, file: str, loader: type[_Loader | _DefaultsLoader] = _Loader) -> object:
    try:
        return yaml.load(text, Loader=loader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PolicyError(file, "", f"not valid YAML: {_yaml_problem(exc)}", LoadFailure.YAML) from None
    except RecursionError:
        raise PolicyError(file, "", "not valid YAML: nested too deeply", LoadFailure.YAML) from None


def loads_policy(text: str, file: str = "<string>", base: Policy | None = None, specs: Specs | None = None) -> Policy:
    """The policy in YAML ``text`` laid over ``base`` (default: ``default_policy(specs)``), with a
    section for each plugin in ``specs`` (none: only the server's); ``file`` names it in errors."""
    given = specs or {}
    try:
        return _build_policy(_yaml(text, file), base if base is not None else DEFAULT_POLICY, given)
    except Invalid as exc:
        raise PolicyError(file, exc.path, exc.reason) from None


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
        raise PolicyError(path, "", f"cannot read the file: {exc.strerror or exc}", LoadFailure.UNREADABLE) from None
    try:
        return key, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(path, "", f"not UTF-8 text (byte {exc.start})", LoadFailure.ENCODING) from None


def load_policy(path: str | os.PathLike[str], base: Policy | None = None, specs: Specs | None = None) -> Policy:
    """The policy file at ``path``, as ``loads_policy`` reads text. Raises PolicyError."""
    name = os.fspath(path)
    return loads_policy(_read(name)[1], name, base, specs)


# --- dumping ----------------------------------------------------------------------------


class _Flow(list[Any]):
    """A list dumped in flow style: ``[0, 30]``."""


class _Dumper(yaml.SafeDumper):
    pass


def _represent_flow(dumper: _Dumper, data: _Flow) -> yaml.SequenceNode:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)


_Dumper.add_representer(_Flow, _represent_flow)


def _flow(value: Any) -> Any:
    """Lists of scalars in flow style (``[0, 30]``), mappings recursed."""
    if isinstance(value, dict):
        return {key: _flow(item) for key, item in value.items()}
    if isinstance(value, list):
        return _Flow(value)
    return value


def dump_policy(policy: Policy, specs: Specs | None = None) -> str:
    """The whole policy as YAML that ``loads_policy`` (with the same ``specs``) reads back to an
    equal policy: the plugins' sections (each plugin in ``specs`` too, with its defaults where the
    policy has none), then the server's."""
    sections = {name: policy.sections[name] for name in sorted(policy.sections)}
    for name, spec in sorted((specs or {}).items()):
        sections.setdefault(name, policy.section(spec))
    data: dict[str, Any] = {name: section.plain() for name, section in sections.items() if section.plain()}
    data.update({name: plain(getattr(policy, name)) for name in SERVER_SECTIONS})
    text: str = yaml.dump(_flow(data), Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    return text


# --- the defaults -----------------------------------------------------------------------

_DEFAULTS_NAME: Final = f"{_data.__name__}/{DEFAULT_POLICY_FILE}"


@cache
def _default_data() -> Mapping[str, Any]:
    text = resources.files(_data).joinpath(DEFAULT_POLICY_FILE).read_text(encoding="utf-8")
    raw = _yaml(text, _DEFAULTS_NAME, _DefaultsLoader)
    if not isinstance(raw, dict):
        raise PolicyError(_DEFAULTS_NAME, "", "the defaults must be a mapping")
    return MappingProxyType(raw)


def builtin_defaults(name: str) -> Mapping[str, Any]:
    """A built-in plugin's section of ``hooks/data/default-policy.yaml``, for ``Plugin(defaults=...)``."""
    section = _default_data().get(name)
    if not isinstance(section, dict):
        raise PolicyError(_DEFAULTS_NAME, name, "missing: every built-in plugin's defaults are in this file")
    return MappingProxyType(section)


def _load_server_defaults() -> Policy:
    data = _default_data()
    try:
        server = {name: build(kind, data.get(name), None, name) for name, kind in _SERVER_TYPES.items()}
    except Invalid as exc:
        raise PolicyError(_DEFAULTS_NAME, exc.path, exc.reason) from None
    return Policy(server["reconciler"], server["trust"])


#: The server's defaults; no plugin section (each plugin has its own defaults: ``Policy.section``).
DEFAULT_POLICY: Final[Policy] = _load_server_defaults()


def default_policy(specs: Specs | None = None) -> Policy:
    """The defaults, with a section holding each plugin's defaults for every spec in ``specs``."""
    sections = {name: spec.defaults for name, spec in sorted((specs or {}).items())}
    return Policy(DEFAULT_POLICY.reconciler, DEFAULT_POLICY.trust, MappingProxyType(sections))


# --- watching ---------------------------------------------------------------------------


class LoadObserver(Protocol):
    """Told what a PolicyWatcher made of each version of its file."""

    def loaded(self, policy: Policy) -> None:
        """A version was read and is valid; ``policy`` is in force (changed or not)."""

    def failed(self, cause: LoadFailure) -> None:
        """A version was not put in force; the last good policy stays."""


class PolicyWatcher:
    """The policy in ``path``, reloaded when the file changes; ``current`` is the policy in force.

    The file is looked at (a stat) whenever inotify reports a change in its directory, which
    covers an edit in place, a replacement by rename and a ConfigMap volume's ``..data``
    symlink swap, and re-read when its (mtime, size, inode) changes; replace it atomically
    (write, then rename) so no half-written version is read. ``poll_interval`` is the fallback:
    it is polled that often while the directory cannot be watched (no inotify, out of watches,
    no directory yet), and every ``runtimeproxy.common.dirwatch.SAFETY_NET_FACTOR`` times that while
    watched, for what inotify cannot see (a symlinked file's target edited in another
    directory, a bind mount).

    Each good version is read against ``specs`` (the plugins' settings) and laid over
    ``base`` (default ``default_policy(specs)``): a key removed from the file goes back to its
    default. ``on_change(policy)`` runs, on the event loop, whenever ``current`` changes,
    including when ``start`` first reads the file.

    Before ``start`` and while the file has never been readable, ``current`` is ``base``.
    An invalid version is logged once (file, YAML path, reason) and the last good policy
    stays; so does it when the file is removed or unreadable. ``observer`` hears of each
    version read and of each failure (a file missing at the first look is none: the defaults
    are meant to apply then).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        on_change: Callable[[Policy], object] | None = None,
        *,
        poll_interval: float = 0.5,
        base: Policy | None = None,
        specs: Specs | None = None,
        observer: LoadObserver | None = None,
    ) -> None:
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval!r}")
        self.path = os.fspath(path)
        self.poll_interval = poll_interval
        self._on_change = on_change
        self._observer = observer
        self._specs: Specs = MappingProxyType(dict(specs or {}))
        self._base = default_policy(self._specs) if base is None else base
        self._current = self._base
        self._seen: _FileKey | str | None = None  # the version last looked at, or why there was none
        self._task: asyncio.Task[None] | None = None
        self._changes: DirectoryChanges | None = None  # while started

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
                self._failed(LoadFailure.REMOVED)
            return False
        if isinstance(key, str):
            log.error("policy file unreadable; keeping the current policy", path=self.path, error=key)
            self._failed(LoadFailure.UNREADABLE)
            return False
        try:
            self._seen, text = _read(self.path)  # the version actually read
            policy = loads_policy(text, self.path, self._base, self._specs)
        except PolicyError as exc:
            log.error(
                "policy file invalid; keeping the current policy",
                path=self.path,
                yaml_path=exc.path,
                reason=exc.reason,
                error=str(exc),
                cause=exc.cause.value,
            )
            self._failed(exc.cause)
            return False
        changed = self._set(policy)
        if self._observer is not None:
            self._observer.loaded(self._current)
        return changed

    def _failed(self, cause: LoadFailure) -> None:
        if self._observer is not None:
            self._observer.failed(cause)

    def _set(self, policy: Policy) -> bool:
        old, self._current = self._current, policy
        changed = [name for name in SERVER_SECTIONS if getattr(old, name) != getattr(policy, name)]
        changed += [
            name
            for name in sorted({*old.sections, *policy.sections})
            if old.sections.get(name) != policy.sections.get(name)
        ]
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
        """Watch the file's directory, read the file once, then keep watching it in a background
        task until ``stop``."""
        if self._task is not None:
            return
        directory = os.path.dirname(os.path.abspath(self.path))
        self._changes = DirectoryChanges(directory, self.poll_interval, what="policy file directory", logger=log)
        self._changes.open()  # before the read, so nothing changed in between goes unseen
        self.check()
        self._task = asyncio.create_task(self._watch(self._changes), name="policy-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task})
        if self._changes is not None:
            self._changes.close()
            self._changes = None

    async def _watch(self, changes: DirectoryChanges) -> None:
        while True:
            await changes.wait()
            try:
                self.check()
            except Exception:  # the watcher must outlive any surprise; the next change or poll retries
                log.exception("policy file check failed", path=self.path)
