"""Finding plugins: the ones installed as entry points of group ``runtimeproxy.hooks``
(``name = module:plugin``, or a module with a ``plugin`` attribute) plus explicit ones; a bad
plugin becomes a LoadFailure with its reason, never an exception."""

from __future__ import annotations

import importlib.metadata
import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import structlog

from .definition import Plugin, PluginDefinitionError
from .settings import SettingsSpec

__all__ = [
    "ENTRY_POINT_GROUP",
    "DiscoveryResult",
    "LoadFailure",
    "discover_plugins",
    "load_entry_point",
    "settings_specs",
]

log = structlog.get_logger("runtimeproxy.hooks.sdk")

ENTRY_POINT_GROUP: Final = "runtimeproxy.hooks"


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


class _Distributions:
    """Name and version of the distributions that installed entry points, each read once: every
    read of a distribution's name or version parses its whole METADATA file."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[object, tuple[str, str] | None]] = {}  # the dist kept: its id stays its own

    def of(self, entry_point: importlib.metadata.EntryPoint) -> tuple[str, str] | None:
        dist = getattr(entry_point, "dist", None)
        if dist is None:
            return None
        known = self._seen.get(id(dist))
        if known is None:
            metadata = dist.metadata
            name, version = metadata["Name"], metadata["Version"]
            known = (dist, (name, version) if isinstance(name, str) and isinstance(version, str) else None)
            self._seen[id(dist)] = known
        return known[1]


def _source(entry_point: importlib.metadata.EntryPoint, dist: tuple[str, str] | None) -> str:
    where = f"{dist[0]} {dist[1]}: " if dist is not None else ""
    return f"{where}{entry_point.name} = {entry_point.value}"


def load_entry_point(entry_point: importlib.metadata.EntryPoint, *, dist_version: str | None = None) -> Plugin:
    """The Plugin an entry point names (the object, or a module's ``plugin``); raises on failure.

    A plugin left at the default version ``"0"`` takes the version of the distribution that
    installed the entry point, when there is one (``dist_version`` when the caller has read it)."""
    target = entry_point.load()
    if isinstance(target, types.ModuleType):
        if not hasattr(target, "plugin"):
            raise PluginDefinitionError(f"module {target.__name__} has no attribute 'plugin'")
        target = target.plugin
    if not isinstance(target, Plugin):
        raise PluginDefinitionError(f"{entry_point.value} is a {type(target).__name__}, not a runtimeproxy Plugin")
    target.check()
    if target.version == "0":
        version = dist_version
        if version is None:
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
    dists = _Distributions()
    for entry_point in sorted(points, key=lambda ep: (ep.name, ep.value)):
        dist = dists.of(entry_point)
        source = _source(entry_point, dist)
        try:
            plugin = load_entry_point(entry_point, dist_version=dist[1] if dist is not None else None)
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
