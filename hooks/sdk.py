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
the proxy (unless the policy switches the plugin off for every QoS class), and a hook point
no plugin runs at answers the empty response (no change).

**Handlers take keyword arguments only, and must accept ``**kwargs``** (checked when the
handler is registered). The server passes every argument in :data:`HANDLER_KWARGS`; a
handler names the ones it uses and lets ``**kwargs`` take the rest, so arguments added in
later versions never break it. That is also the one way to say whether a handler blocks: an
``async def`` handler runs on the server's event loop (quick, non-blocking work; cancelled past
its timeout), a plain ``def`` one in a worker thread (it may block; past its timeout its thread
runs on, detached).

**Filters.** ``@plugin.on(*points, when=predicate)``: a plain function taking the handler's
keyword arguments (and ``**kwargs``, checked like a handler's), called right before each call;
when it answers false the handler is not called at all (no coroutine, no task, no thread) and the
call is reported as the plugin skipped (``RunResult.skipped``: ``filtered_reason(handler)``, that is
``when=<predicate> is false``; not counted in the call metrics). A predicate that raises fails
the plugin's call, as its handler would.

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

**Where things are** (this module only re-exports them; import from here in plugins):

* hooks/views.py: what handlers see: ``PodInfo``, ``ContainerInfo``, ``Resources``,
  ``HugepageLimit``, ``ServerContext``.
* hooks/changes.py: what handlers write: ``HookResponse``, ``ResourceChanges``, ``EnvChanges``.
* hooks/definition.py: ``Plugin``, its handlers and their checks (``PluginDefinitionError``),
  the arguments handlers get (``HANDLER_KWARGS``, ``LIFECYCLE_KWARGS``, ``RECONCILE_KWARGS``).
* hooks/discovery.py: entry points (``discover_plugins``, ``load_entry_point``), ``settings_specs``.
* hooks/plugin_runner.py: ``PluginRunner``, call outcomes (``RunResult``, ``PluginFailure``,
  ``HookCallFailed``, ``ReconcileReport``) and ``PluginMetrics``.
* hooks/convert.py: protobuf conversion (``resources_from_proto``, ``resources_to_proto``) and
  ``qos_of`` (the pod's class).
* hooks/settings.py: plugin settings; hooks/qos.py: ``QoSClass`` and how a pod's class is found.
* hooks/pacing.py: ``paced``, for a reconcile handler that walks many pods without holding the
  event loop (``async for pod in paced(pods)``): hook calls go on between its slices.
"""

from __future__ import annotations

from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint

from .changes import EnvChanges, HookResponse, ResourceChanges
from .convert import qos_of, resources_from_proto, resources_to_proto
from .definition import (
    HANDLER_KWARGS,
    LIFECYCLE_KWARGS,
    NODE_HANDLES,
    RECONCILE_KWARGS,
    FailurePolicy,
    Handler,
    Plugin,
    PluginDefinitionError,
)
from .discovery import (
    ENTRY_POINT_GROUP,
    DiscoveryResult,
    LoadFailure,
    discover_plugins,
    load_entry_point,
    settings_specs,
)
from .pacing import paced
from .plugin_runner import (
    HookCallFailed,
    Outcome,
    PluginFailure,
    PluginMetrics,
    PluginRunner,
    ReconcileReport,
    RunResult,
    filtered_reason,
)
from .qos import QoSClass
from .views import ContainerInfo, HugepageLimit, PodInfo, Resources, ServerContext

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
    "filtered_reason",
    "load_entry_point",
    "paced",
    "qos_of",
    "resources_from_proto",
    "resources_to_proto",
    "settings_specs",
]
