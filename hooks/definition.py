"""Defining a plugin: the :class:`Plugin` object, its handlers and the checks made when one is
registered (keyword arguments only, known argument names), and the arguments each kind of
handler is called with: all of them for a handler with ``**kwargs``, the ones it names for one
without (Handler.takes, worked out once at registration)."""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final, Literal, TypeVar

from runtimeproxy.common.coroutines import never_suspends
from runtimeproxy.hookapi.hookpoints import HookPoint, parse_hook_point

from . import policy as policy_mod
from .settings import Invalid, SectionCheck, SettingsSpec, join

__all__ = [
    "HANDLER_KWARGS",
    "LIFECYCLE_KWARGS",
    "NODE_HANDLES",
    "RECONCILE_KWARGS",
    "FailurePolicy",
    "Handler",
    "Plugin",
    "PluginDefinitionError",
]

#: What every hook handler may be called with (more may be added: a handler with **kwargs gets
#: them all, one without gets the ones it names):
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
#: What every handler outside a hook call gets (PluginRunner._node_kwargs): the node handles,
#: ``section``, ``settings_for(qos)``, ``state``, ``log``, ``plugin`` and ``dry_run``.
_OUTSIDE_CALL_KWARGS: Final = ("plugin", "cgroups", "resctrl", "section", "settings_for", "state", "log", "dry_run")
#: What on_start and on_stop handlers get: ``server`` (ServerContext) and the above.
LIFECYCLE_KWARGS: Final = ("server", *_OUTSIDE_CALL_KWARGS)
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
RECONCILE_KWARGS: Final = ("pods", "containers", "gone", "gone_containers", *_OUTSIDE_CALL_KWARGS)
#: The node handles a plugin may say it ``needs``.
NODE_HANDLES: Final = ("cgroups", "resctrl")

FailurePolicy = Literal["ignore", "fail"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", re.ASCII)
_F = TypeVar("_F", bound=Callable[..., Any])


class PluginDefinitionError(TypeError):
    """A plugin or handler that cannot work: the message says what to change."""


@dataclass(frozen=True)
class Handler:
    """A registered function; ``is_async`` decides how it is run, ``when`` whether it is.

    ``never_suspends``: an ``async def`` with no ``await``, ``async for`` or ``async with`` in its
    body can never give the loop a turn, so the runner calls it in the hook call itself, without
    a task of its own and the loop turns that costs (plugin_runner.PluginRunner._call_now).
    """

    fn: Callable[..., Any]
    is_async: bool
    name: str
    never_suspends: bool = False
    #: ``@plugin.on(..., when=predicate)``: called with the handler's arguments right before the
    #: handler would be; a false answer means the handler is not called (plugin_runner.PluginRunner._filter).
    when: Callable[..., Any] | None = None
    when_name: str = ""
    #: The argument names the handler takes when it has no ``**kwargs`` (None: it takes them all).
    takes: tuple[str, ...] | None = None
    #: Likewise for its ``when=`` predicate.
    when_takes: tuple[str, ...] | None = None

    def arguments(self, given: Mapping[str, Any]) -> Mapping[str, Any]:
        """What of ``given`` (every argument of the handler's kind) it is called with."""
        takes = self.takes
        return given if takes is None else {name: given[name] for name in takes}


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
    """The Handler for ``fn``; PluginDefinitionError unless it takes keyword arguments, all known."""
    name = _check_callable(fn, what)
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise PluginDefinitionError(f"{what} {name} is a generator; handlers are plain functions or async def")
    takes = _check_signature(fn, what, name, known)
    return Handler(fn, _is_async(fn), name, never_suspends(fn), takes=takes)


def _check_predicate(fn: Any, what: str) -> tuple[str, tuple[str, ...] | None]:
    """The name of a ``when=`` predicate and the arguments it takes (None: all);
    PluginDefinitionError unless it is a plain function taking a hook handler's arguments by
    keyword (checked as a handler is)."""
    name = _check_callable(fn, what)
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn) or _is_async(fn):
        raise PluginDefinitionError(
            f"{what} {name} must be a plain function returning true or false: "
            "a predicate is answered before the handler is called, without awaiting anything"
        )
    return name, _check_signature(fn, what, name, HANDLER_KWARGS)


def _check_callable(fn: Any, what: str) -> str:
    """``fn``'s name; PluginDefinitionError when it cannot be called at all."""
    if not callable(fn):
        raise PluginDefinitionError(f"{what} must be a function, got {fn!r}")
    return _callable_name(fn)


def _check_signature(fn: Callable[..., Any], what: str, name: str, known: Sequence[str]) -> tuple[str, ...] | None:
    """The argument names ``fn`` takes (None: it has **kwargs and takes all of ``known``);
    PluginDefinitionError unless every parameter can be passed by keyword and each one without
    a default is among ``known``."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise PluginDefinitionError(f"{what} {name}: cannot read its signature ({exc})") from None
    parameters = list(signature.parameters.values())
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
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
    if takes_all:
        return None
    return tuple(
        p.name
        for p in parameters
        if p.name in known and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    )


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

    def on(self, *points: HookPoint | str, when: Callable[..., Any] | None = None) -> Callable[[_F], _F]:
        """Decorator: run the function at each of ``points`` (HookPoint members or names).

        ``when``: a filter, a plain (not async) function called with the handler's keyword
        arguments right before each call; when it answers false the handler is not called at all
        (no coroutine, no task, no thread): the call counts as the plugin skipped, with reason
        ``when=<its name> is false``. One that raises fails the plugin's call, as its handler would.
        """
        if not points:
            raise PluginDefinitionError("@plugin.on needs at least one hook point")
        parsed = [_hook_point(point) for point in points]
        when_name, when_takes = _check_predicate(when, f"plugin {self.name}: when=") if when is not None else ("", None)

        def register(fn: _F) -> _F:
            handler = _check_handler(fn, f"plugin {self.name}: handler", HANDLER_KWARGS)
            if when is not None:
                handler = replace(handler, when=when, when_name=when_name, when_takes=when_takes)
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
        """Decorator: call ``fn(server=..., **kwargs)`` once when the server stops, after the
        plugin's handler calls still running in threads have ended (waiting at most its timeout)."""
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
