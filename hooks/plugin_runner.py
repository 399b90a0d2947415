"""Running plugins: :class:`PluginRunner` calls the enabled plugins' handlers in (order, name)
order with their timeouts (``async def`` on the loop, ``def`` in a thread of its own), merges
their responses, applies each plugin's failure policy, and counts every call (PluginMetrics).

A plugin is not called in a hook call when it needs a node handle the node lacks, when its
settings for the pod's class say ``enabled: false``, or when its handler's ``when=`` predicate
answers false (Plugin.on). Each of these is reported alike: in RunResult.skipped with the
reason, at debug level in the log, and not in the call metrics (nothing ran). A predicate that
raises is the plugin's failed call (outcome "error", reason ``when=<predicate>: ...``), counted,
logged and handled by the plugin's failure policy as a failing handler would be.

A reconcile handler gets every live pod at once and may walk them in slices (hooks/pacing.py),
so it may take longer than one hook call: its timeout is the plugin's plus
RECONCILE_SECONDS_PER_POD for each pod it is given. on_start and on_stop get the plugin's timeout
and at least LIFECYCLE_SECONDS.

What follows from the policy in force and the runner alone (each plugin's settings for a class,
whether it is skipped, its handler's fixed arguments) is worked out once per hook point and class
(PluginRunner._plan) and again whenever the policy, the context or the enabled plugins change;
a hook call adds only its pod, container, response and logger. A handler is called in one
place (``_invoke``), with every argument of its kind or, without ``**kwargs``, with the ones it
names (Handler.takes, worked out when it was registered)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import enum
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, get_args

import structlog
from prometheus_client import CollectorRegistry, Counter

from runtimeproxy.common import trace
from runtimeproxy.common.logs import debug_enabled, dropped
from runtimeproxy.common.metrics_export import CallCollector, CallFamilies
from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint

from . import policy as policy_mod
from .changes import HookResponse
from .convert import qos_of
from .definition import FailurePolicy, Handler, Plugin
from .overwrites import FieldOwners, Overwrite
from .podview import plugin_view
from .qos import QoSClass, QoSResolution
from .settings import SectionSettings
from .views import ContainerInfo, PodInfo, ServerContext

__all__ = [
    "HookCallFailed",
    "Outcome",
    "PluginFailure",
    "PluginMetrics",
    "PluginRunner",
    "ReconcileReport",
    "RunResult",
    "filtered_reason",
]

log = structlog.get_logger("runtimeproxy.hooks.sdk")
#: What a reconcile handler's timeout adds per pod to its plugin's (see the module doc): about
#: twenty times what a built-in plugin spends on a pod, so a large node's round is not cut off.
RECONCILE_SECONDS_PER_POD = 0.01
#: The least time an on_start or on_stop handler gets, whatever its plugin's (per-call) timeout: it
#: runs once, sets up or tears down what the hook calls use (a tc tree, resctrl groups), and often
#: on a node busy starting other daemons too, where a hook call's few seconds are too few.
LIFECYCLE_SECONDS = 30.0
_plugin_log = structlog.get_logger("runtimeproxy.hooks.plugin")

Outcome = Literal["ok", "error", "timeout", "invalid", "busy"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
# What running one handler gave: outcome, reason ("" when ok) and its return value (None unless ok).
_Called = tuple[Outcome, str, Any]


_PLUGIN_FAMILIES = CallFamilies(
    "runtimeproxy_hooks_plugin_calls",
    "Plugin handler calls, by plugin, hook point (or start/stop/reconcile) and outcome "
    "(ok, error, timeout, invalid, busy).",
    "runtimeproxy_hooks_plugin_call_duration_seconds",
    "Time a plugin handler took (up to its timeout), by plugin and hook point.",
    ("plugin", "hook"),
    "outcome",
)


def _plugin_hook(key: tuple[str, str]) -> tuple[str, str]:
    return key


def _outcome(outcome: Outcome) -> str:
    return outcome


class PluginMetrics:
    """Per plugin and hook point: calls by outcome, and their duration; overwrites by field.

    ``calls`` (counter and histogram) is recorded once per plugin per hook call, so it is a
    lock-free collector (runtimeproxy.common.metrics_export.CallCollector): only the runner's event loop
    records (PluginRunner._call, also for sync handlers, after their thread is done) and
    scrapes read it from the metrics server's thread. Overwrites are rare: a plain Counter.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = CollectorRegistry(auto_describe=True) if registry is None else registry
        self.registry = reg
        self.calls: CallCollector[tuple[str, str], Outcome] = CallCollector(
            reg, _PLUGIN_FAMILIES, _plugin_hook, _outcome
        )
        self.overwrites = Counter(
            "runtimeproxy_hooks_plugin_overwrites",
            "Values one plugin set that a later plugin replaced in the same hook call, by field "
            "(a map's name for its entries: annotations, labels, env, resources.unified).",
            ["field"],
            registry=reg,
        )

    def record(self, plugin: str, hook: str, outcome: Outcome, seconds: float) -> None:
        self.calls.record((plugin, hook), outcome, seconds)

    def expect(self, plugin: str, hooks: Iterable[str]) -> None:
        """Export ``plugin``'s call counters at ``hooks`` at 0 for every outcome, so that an alert
        sees its first failure there."""
        for hook in hooks:
            self.calls.declare((plugin, hook), OUTCOMES)


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


@dataclass(eq=False)  # kept in a set, by identity
class _SyncCall:
    """One sync handler call whose thread runs; guarded by the runner's lock."""

    work: concurrent.futures.Future[Any] | None = None  # its thread's future, once started
    hung: bool = False  # past its timeout


class _Step(NamedTuple):
    """One plugin in a hook call's plan (PluginRunner._plan)."""

    plugin: Plugin
    handler: Handler
    skip: str  # why it is not called ("" when it is): PluginRunner.skip_reason
    given: dict[str, Any]  # its handler's arguments, the per-call ones as None placeholders
    key: tuple[str, str]  # its name and the hook: the metrics' labels


class _Plan(NamedTuple):
    """What a hook call at one point does for one class under one policy."""

    kind: HookKind
    hook: str  # the point's value
    steps: tuple[_Step, ...]


class _Stage(enum.Enum):
    START = "start"
    STOP = "stop"
    RECONCILE = "reconcile"


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
        self._sync_calls: dict[str, set[_SyncCall]] = {}  # per plugin: its sync calls whose threads run
        self._lock = threading.Lock()
        self._orphans: set[asyncio.Future[Any]] = set()
        self._odd_returns: set[str] = set()  # plugins warned about their reconcile return value
        self._states: dict[str, Any] = {}  # per plugin: what its state factory made, once
        self._state_failures: list[PluginFailure] = []
        # run()'s plans (by point and class) for the policy and context they were made with.
        self._plans: dict[tuple[HookPoint, QoSClass], _Plan] = {}
        self._planned_policy: policy_mod.Policy | None = None
        self._planned_context: ServerContext | None = None
        enabled = [available[name] for name in wanted - disabled]
        self._set_enabled(plugin for plugin in enabled if self._make_state(plugin))
        for plugin in self.plugins:
            self.metrics.expect(plugin.name, _call_hooks(plugin))

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
        spec = plugin.settings_spec
        if qos is None or spec is None:
            return self._skip_reason(plugin, qos, None)
        return self._skip_reason(plugin, qos, self.context.policy().section(spec).for_class(qos))

    def _skip_reason(self, plugin: Plugin, qos: QoSClass | None, settings: Any) -> str:
        """skip_reason, given the plugin's settings for class ``qos`` (None: none, or do not look)."""
        context = self.context
        for handle in plugin.needs:  # a loop, no list: on most calls nothing is missing
            if getattr(context, handle) is None:
                missing = [need for need in plugin.needs if getattr(context, need) is None]
                return f"needs {' and '.join(missing)}, which this node lacks"
        if settings is not None and getattr(settings, "enabled", True) is False:
            spec = plugin.settings_spec
            assert spec is not None and qos is not None  # settings come from the spec's section for qos
            return f"{plugin.name}.{spec.class_entry[QoSClass(qos)]}.enabled is false"
        return ""

    def _settings_kwargs(self, plugin: Plugin, section: SectionSettings | None) -> dict[str, Any]:
        """``section``, ``settings_for`` and ``state`` for the plugin's handlers, from its policy ``section``."""
        return {
            "section": section.common if section is not None else None,
            # The section's own method: a closure per plugin per hook call would do the same.
            "settings_for": section.for_class if section is not None else _no_settings,
            "state": self._states.get(plugin.name),
        }

    def _set_enabled(self, plugins: Iterable[Plugin]) -> None:
        self.plugins: tuple[Plugin, ...] = tuple(sorted(plugins, key=lambda p: (p.order, p.name)))
        self._by_point = {
            point: tuple(plugin for plugin in self.plugins if point in plugin.hook_points) for point in HookPoint
        }
        # What run() calls at each point, looked up once, not once per plugin per call.
        self._handlers: dict[HookPoint, tuple[tuple[Plugin, Handler], ...]] = {
            point: tuple((plugin, _handler(plugin, point)) for plugin in plugins)
            for point, plugins in self._by_point.items()
        }
        self._plans = {}
        self._hook_points = frozenset(point for point, plugins in self._by_point.items() if plugins)

    @property
    def hook_points(self) -> frozenset[HookPoint]:
        """The hook points at least one enabled plugin handles."""
        return self._hook_points

    def plugins_for(self, point: HookPoint) -> tuple[Plugin, ...]:
        return self._by_point[point]

    def expect_calls_as(self, label: str, point: HookPoint) -> None:
        """Export at 0 the call counters of ``point``'s plugins under ``label``: the name that
        ``run(point, label=...)`` counts their calls under."""
        for plugin in self._by_point[point]:
            self.metrics.expect(plugin.name, (label,))

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
        label: str | None = None,
        deadline: Callable[[], float] | None = None,
    ) -> RunResult:
        """Run ``point``'s handlers; the merged response. HookCallFailed when a "fail" plugin fails.
        ``label``: the name the calls are counted, logged and failed under instead of the point's
        (container repair runs PreUpdateContainerResources as "repair", hooks/container_repair.py);
        what is withheld from the plugins is then said at debug, as in a reconcile round.
        ``deadline``: when the whole call must end, on the loop's clock (TimeoutError past it, the
        call given up). Asked for, and a timer set, only around handlers that can wait on the loop:
        the others run to their end at once, where no timeout could interrupt them anyway."""
        resolution = qos if qos is not None else qos_of(pod, container)
        context = self.context
        policy = context.policy()
        plan = self._plan(point, resolution.qos_class, policy, context)
        kind = plan.kind
        hook = plan.hook if label is None else label
        result = RunResult(HookResponse(kind))
        bound = {"hook": hook, "pod": f"{pod.namespace}/{pod.name}"}
        if container is not None:
            bound["container"] = container.name
        pod = self._view(pod, policy, "info" if label is None else "debug", bound)
        owners: FieldOwners | None = None  # made when a plugin changes something (few do)
        for plugin, handler, skip, given, key in plan.steps:
            if label is not None:
                key = (plugin.name, label)
            if skip:
                _not_called(result, plugin, skip, bound)
                continue
            response = HookResponse(kind)
            # The per-call arguments fill the places ``given`` holds for them (the same key order).
            kwargs = {
                **given,
                "pod": pod,
                "container": container,
                "qos_resolution": resolution,
                "response": response,
                "log": _PluginLog(plugin.name, bound),
            }
            outcome: Outcome = "ok"
            reason = ""
            wanted: Any = True
            if handler.when is not None:  # a failed predicate is the plugin's failed call (below)
                outcome, reason, wanted = self._filter(key, handler, kwargs)
            if outcome == "ok" and not wanted:  # no coroutine, no task: as if skipped
                _not_called(result, plugin, filtered_reason(handler), bound)
                continue
            if outcome == "ok":
                if handler.never_suspends:  # most handlers: no coroutine of the runner's own either
                    outcome, reason, _ = self._call_now(key, handler, kwargs)
                elif deadline is None:
                    outcome, reason, _ = await self._call(plugin, handler, hook, kwargs)
                else:
                    async with asyncio.timeout_at(deadline()):
                        outcome, reason, _ = await self._call(plugin, handler, hook, kwargs)
            if outcome == "ok" and response.untouched():  # nothing to check, merge or own
                result.applied.append(plugin.name)
                continue
            if outcome == "ok":
                problems = response.problems()
                if problems:
                    outcome, reason = "invalid", "; ".join(problems)
            if outcome == "ok":
                if owners is None:
                    owners = FieldOwners()
                owners.take(plugin.name, response, functools.partial(self._overwritten, bound))
                result.response.merge(response)
                result.applied.append(plugin.name)
                continue
            failure = PluginFailure(plugin.name, hook, outcome, reason, plugin.failure_policy)
            self._log_failure(failure, bound)
            if plugin.failure_policy == "fail":
                raise HookCallFailed(failure)
            result.failures.append(failure)
        return result

    def _plan(self, point: HookPoint, qos: QoSClass, policy: policy_mod.Policy, context: ServerContext) -> _Plan:
        """What ``run`` does at ``point`` for a pod of class ``qos``: made once per policy in force
        (and context), as everything in it follows from them, not from the pod."""
        if policy is not self._planned_policy or context is not self._planned_context:
            self._plans = {}
            self._planned_policy, self._planned_context = policy, context
        try:
            return self._plans[point, qos]
        except KeyError:
            pass
        hook = point.value
        steps = []
        for plugin, handler in self._handlers[point]:
            spec = plugin.settings_spec
            section = policy.section(spec) if spec is not None else None
            settings = section.for_class(qos) if section is not None else None
            given: dict[str, Any] = {
                "hook": point,
                "pod": None,
                "container": None,
                "qos": qos,
                "qos_resolution": None,
                "settings": settings,
                **self._settings_kwargs(plugin, section),
                "response": None,
                "cgroups": context.cgroups,
                "resctrl": context.resctrl,
                "log": None,
                "plugin": plugin,
                "dry_run": context.dry_run,
            }
            steps.append(_Step(plugin, handler, self._skip_reason(plugin, qos, settings), given, (plugin.name, hook)))
        plan = self._plans[point, qos] = _Plan(point.kind, hook, tuple(steps))
        return plan

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
        """Call the on_stop handlers (failures are logged and returned), then close(). A plugin's
        on_stop waits for its handler calls still running in threads (``_settle``)."""
        failures = []
        for plugin in reversed(self.plugins):
            if plugin.stop_handler is not None:
                await self._settle(plugin)
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
        viewed = tuple(self._view(pod, policy, "debug", {"pod": f"{pod.namespace}/{pod.name}"}) for pod in pods)
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
            kwargs["pods"] = pods_for = self._called_for(plugin, viewed)
            timeout = plugin.timeout + RECONCILE_SECONDS_PER_POD * len(pods_for)
            outcome, reason, value = await self._call(plugin, handler, _Stage.RECONCILE.value, kwargs, timeout)
            if outcome != "ok":
                failure = PluginFailure(plugin.name, _Stage.RECONCILE.value, outcome, reason, plugin.failure_policy)
                self._log_failure(failure, {"hook": _Stage.RECONCILE.value})
                report.failures.append(failure)
                continue
            report.repaired[plugin.name] = _repair_count(plugin.name, value, self._odd_returns)
        return report

    def _view(
        self, pod: PodInfo, policy: policy_mod.Policy, level: Literal["info", "debug"], bound: Mapping[str, str]
    ) -> PodInfo:
        """``pod`` as the plugins see it (hooks/podview.py), each withheld part said at ``level`` (the
        logger's method looked up only then: each lookup binds a logger)."""
        view, withheld = plugin_view(pod, self.context.cgroups, policy)
        for reason in withheld:
            getattr(log, level)("withheld from the plugins", reason=reason, **bound)
        return view

    def _called_for(self, plugin: Plugin, pods: tuple[PodInfo, ...]) -> tuple[PodInfo, ...]:
        """The pods whose class does not switch ``plugin`` off (``enabled: false``)."""
        spec = plugin.settings_spec
        if spec is None or not spec.switchable:
            return pods
        return tuple(pod for pod in pods if not self.skip_reason(plugin, qos_of(pod).qos_class))

    async def _settle(self, plugin: Plugin) -> None:
        """Wait, at most the plugin's timeout, for its handler calls still running in threads.
        A shutdown cancels a reconcile round or a hook call, but not the thread of a sync
        handler: without this its on_stop could undo (or close) what such a call still uses."""
        with self._lock:
            calls = self._sync_calls.get(plugin.name, ())
            running = [asyncio.wrap_future(call.work) for call in calls if call.work is not None]
        if not running:
            return
        _, still = await asyncio.wait(running, timeout=plugin.timeout)
        for waiter in still:
            waiter.cancel()  # detached: the thread's end must not reach the loop, closed by then
        if still:
            log.warning(
                "handler calls still run in threads; calling on_stop anyway",
                plugin=plugin.name,
                threads=len(still),
                waited_s=plugin.timeout,
            )

    def close(self) -> None:
        """Run no more sync handlers. Their threads are daemon threads: a hung one never delays exit."""
        self._closed = True

    async def _lifecycle(self, plugin: Plugin, stage: _Stage) -> PluginFailure | None:
        handler = plugin.start_handler if stage is _Stage.START else plugin.stop_handler
        if handler is None or self.skip_reason(plugin):
            return None
        kwargs = {**self._node_kwargs(plugin, stage), "server": self.context}
        timeout = max(plugin.timeout, LIFECYCLE_SECONDS)
        outcome, reason, _ = await self._call(plugin, handler, stage.value, kwargs, timeout)
        if outcome == "ok":
            return None
        failure = PluginFailure(plugin.name, stage.value, outcome, reason, plugin.failure_policy)
        self._log_failure(failure, {"hook": stage.value})
        return failure

    def _node_kwargs(self, plugin: Plugin, stage: _Stage) -> dict[str, Any]:
        spec = plugin.settings_spec
        return {
            **self._settings_kwargs(plugin, self.context.policy().section(spec) if spec is not None else None),
            "plugin": plugin,
            "cgroups": self.context.cgroups,
            "resctrl": self.context.resctrl,
            "log": _plugin_log.bind(plugin=plugin.name, hook=stage.value),
            "dry_run": self.context.dry_run,
        }

    async def _call(
        self, plugin: Plugin, handler: Handler, hook: str, kwargs: dict[str, Any], timeout: float | None = None
    ) -> _Called:
        """Outcome, reason and (when "ok") the handler's return value, within ``timeout`` seconds
        (default: the plugin's)."""
        key = (plugin.name, hook)
        if handler.never_suspends:
            return self._call_now(key, handler, kwargs)
        started = time.perf_counter()
        limit = plugin.timeout if timeout is None else timeout
        if handler.is_async:
            called = await self._call_async(plugin, handler, kwargs, limit)
        else:
            called = await self._call_sync(plugin, handler, kwargs, limit)
        return self._counted(key, called, started)

    def _call_now(self, key: tuple[str, str], handler: Handler, kwargs: dict[str, Any]) -> _Called:
        """``_call`` for an async handler that cannot suspend (Handler.never_suspends): run to its end
        at once, in a copy of the current context as a task would (its context changes stay its own).
        ``key``: the plugin's name and the hook, as the metrics label the call."""
        started = time.perf_counter()
        try:
            coro = _invoke(handler, kwargs)  # raises only for a call that does not fit its signature
            contextvars.copy_context().run(coro.send, None)
        except StopIteration as stop:
            called: _Called = ("ok", "", stop.value)
        except asyncio.CancelledError:
            called = ("error", "cancelled", None)
        except Exception as exc:
            called = ("error", _reason(exc), None)
        else:  # cannot happen for a body without await; never leave it half run
            coro.close()
            called = ("error", "suspended although its body has no await", None)
        return self._counted(key, called, started)

    def _filter(self, key: tuple[str, str], handler: Handler, kwargs: dict[str, Any]) -> _Called:
        """What ``handler``'s when= predicate answers: ("ok", "", whether to call the handler), or
        ("error", reason, None) when it raised or answered an awaitable (counted as the plugin's
        call, which then fails). A false answer is not counted: the plugin is not called."""
        assert handler.when is not None
        started = time.perf_counter()
        try:
            takes = handler.when_takes
            answer = handler.when(**kwargs) if takes is None else handler.when(**{name: kwargs[name] for name in takes})
            if answer is True or answer is False:  # the usual answers: no more calls
                return "ok", "", answer
            if inspect.isawaitable(answer):
                getattr(answer, "close", _no_close)()  # no "coroutine was never awaited" warning
                raise _ReturnedAwaitable("returned an awaitable: a predicate is a plain function")
            return "ok", "", bool(answer)
        except Exception as exc:
            return self._counted(key, ("error", f"when={handler.when_name}: {_reason(exc)}", None), started)

    def _counted(self, key: tuple[str, str], called: _Called, started: float) -> _Called:
        """``called``, recorded in the metrics (and the trace) as a call of ``key`` (plugin, hook)
        that began at ``started``."""
        seconds = time.perf_counter() - started
        self.metrics.calls.record(key, called[0], seconds)
        if trace.ON:  # bench/pod_timeline.py: each plugin's part of a hook call
            trace.event("hooks.plugin", plugin=key[0], hook=key[1], outcome=called[0], seconds=seconds)
        return called

    async def _call_async(self, plugin: Plugin, handler: Handler, kwargs: dict[str, Any], timeout: float) -> _Called:
        """A handler that may suspend, as a task of its own, within its timeout."""
        started = time.monotonic()
        try:
            awaitable = _invoke(handler, kwargs)
        except Exception as exc:  # the call itself raised before returning a coroutine
            return "error", _reason(exc), None
        try:
            # A handler that can suspend runs as a task of its own: asyncio.timeout() and anything
            # else keyed on the current task must find the handler's, not the hook call's.
            task = asyncio.ensure_future(awaitable)
        except Exception as exc:  # not awaitable
            return "error", _reason(exc), None
        try:
            # One loop turn first (the task's first step runs in it, before this call resumes): many
            # such handlers end there (network with shaping off), and a done task needs no timer,
            # no waiter and two loop turns (epoll_waits) fewer.
            await asyncio.sleep(0)
            if task.done():
                return _task_outcome(task)
            # asyncio.wait, not wait_for: a handler that swallows its cancellation must not hold up the call.
            remaining = max(0.0, timeout - (time.monotonic() - started))
            done, _ = await asyncio.wait({task}, timeout=remaining)
        except asyncio.CancelledError:  # the hook call itself was cancelled (the proxy gave up)
            task.cancel()
            self._keep_orphan(task, plugin)
            raise
        if not done:
            task.cancel()
            self._keep_orphan(task, plugin)
            return "timeout", f"no answer within {timeout:g}s", None
        return _task_outcome(task)

    async def _call_sync(self, plugin: Plugin, handler: Handler, kwargs: dict[str, Any], timeout: float) -> _Called:
        if self._closed:
            return "error", "not run: the runner is closed", None
        with self._lock:
            running = self._sync_calls.setdefault(plugin.name, set())
            hung = sum(call.hung for call in running)
            if hung >= self._max_hung:
                return "busy", f"{hung} earlier calls of its sync handlers timed out and still run", None
            call = _SyncCall()
            running.add(call)  # before its thread starts: the thread's end takes it out
        context = contextvars.copy_context()
        try:
            work = _in_thread(
                functools.partial(context.run, _run_sync_handler, handler, kwargs),
                f"runtime-hooks-{plugin.name}",
                lambda: self._sync_done(plugin.name, call),
            )
        except BaseException:  # no thread (e.g. none can be started): nothing runs
            self._sync_done(plugin.name, call)
            raise
        with self._lock:  # what stop() waits for
            call.work = work
        future = asyncio.wrap_future(work)
        try:
            done, _ = await asyncio.wait({future}, timeout=timeout)
        except asyncio.CancelledError:
            future.cancel()  # detach from the thread, which runs on
            work.add_done_callback(functools.partial(_late_end, plugin.name))
            raise
        if not done:
            # Detached, the thread's end does not touch the loop (which may be closed by then).
            future.cancel()
            work.add_done_callback(functools.partial(_late_end, plugin.name))
            with self._lock:  # only calls past their timeout and still running count as hung
                call.hung = call in self._sync_calls[plugin.name]
            return "timeout", f"no answer within {timeout:g}s (its thread runs on)", None
        return _task_outcome(future)

    def _sync_done(self, name: str, call: _SyncCall) -> None:
        with self._lock:
            self._sync_calls[name].discard(call)

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


class _PluginLog:
    """A handler's logger, bound to its plugin and call on first use: most calls log nothing, and
    a bind builds a whole logger (about 2 us; loggers are not cached, runtimeproxy/common/logs.py)."""

    __slots__ = ("_bound", "_call", "_plugin")

    def __init__(self, plugin: str, call: Mapping[str, str]) -> None:
        self._plugin = plugin
        self._call = call  # the hook call's fields, shared by its plugins' loggers
        self._bound: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._bound is None:
            if dropped(name):  # a debug line at info level: nothing to bind for
                return _drop_line
            self._bound = _plugin_log.bind(plugin=self._plugin, **self._call)
        return getattr(self._bound, name)


def _drop_line(*args: Any, **kwargs: Any) -> None:
    """A logger method of a level not emitted (what structlog's filtering logger gives for it)."""


class _ReturnedAwaitable(Exception):
    pass


def filtered_reason(handler: Handler | None) -> str:
    """RunResult.skipped's reason for a call ``handler``'s when= predicate filtered out ("": it has none)."""
    return f"when={handler.when_name} is false" if handler is not None and handler.when is not None else ""


def _no_close() -> None:
    """``close`` of an awaitable that has none."""


def _not_called(result: RunResult, plugin: Plugin, reason: str, bound: Mapping[str, str]) -> None:
    """Record in ``result`` that ``plugin`` is not called in this hook call, and why."""
    result.skipped[plugin.name] = reason
    if debug_enabled():  # a disabled level still binds a logger when looked up
        log.debug("plugin not called", plugin=plugin.name, reason=reason, **bound)


def _no_settings(qos: QoSClass | str) -> None:
    """``settings_for`` of a plugin without a policy section."""
    return None


def _handler(plugin: Plugin, point: HookPoint) -> Handler:
    handler = plugin.handler(point)
    assert handler is not None  # the plugin is listed at point because it has a handler there
    return handler


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


def _call_hooks(plugin: Plugin) -> list[str]:
    """The ``hook`` labels ``plugin``'s calls are counted under: its hook points and its
    lifecycle and reconcile handlers' stages."""
    hooks = [point.value for point in HookPoint if point in plugin.hook_points]
    stages = (
        (_Stage.START, plugin.start_handler),
        (_Stage.STOP, plugin.stop_handler),
        (_Stage.RECONCILE, plugin.reconcile_handler),
    )
    return hooks + [stage.value for stage, handler in stages if handler is not None]


def _invoke(handler: Handler, kwargs: Mapping[str, Any]) -> Any:
    """The one place a plugin's handler is called: with all of ``kwargs`` (the arguments of its
    kind) when it takes ``**kwargs``, else with the ones it names (Handler.takes)."""
    return handler.fn(**handler.arguments(kwargs))


def _run_sync_handler(handler: Handler, kwargs: dict[str, Any]) -> Any:
    result = _invoke(handler, kwargs)
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
