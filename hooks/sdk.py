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

**Handlers take keyword arguments only** (checked when the handler is registered). A handler
with ``**kwargs`` gets every argument in :data:`HANDLER_KWARGS` and names the ones it uses; a
handler without it gets only the arguments it names (``def limit(*, qos, response)``), each of
which must be one of :data:`HANDLER_KWARGS` (an unknown name is refused at registration). Either
way, arguments added in later versions never break it. How a handler is written also says
whether it blocks: an ``async def`` handler runs on the server's event loop (quick, non-blocking
work; cancelled past its timeout), a plain ``def`` one in a worker thread (it may block; past its
timeout its thread runs on, detached).

**Filters.** ``@plugin.on(*points, when=predicate)``: a plain function taking the handler's
keyword arguments (with or without ``**kwargs``, checked like a handler's), called right before each call;
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

**What is here.** This module is the whole plugin face: everything a plugin imports from
runtime-hooks is in ``__all__`` (docs/writing-a-plugin.md lists each name); everything else in
``runtimeproxy.hooks`` is the server's own and may change. Tests of a plugin use
:mod:`runtimeproxy.hooks.testkit`.

* Defining a plugin: ``Plugin``, ``HookPoint``, ``HookKind``, ``FailurePolicy``,
  ``PluginDefinitionError``, the argument names ``HANDLER_KWARGS``, ``LIFECYCLE_KWARGS``,
  ``RECONCILE_KWARGS`` and ``NODE_HANDLES``.
* What handlers see: ``PodInfo``, ``ContainerInfo``, ``Resources``, ``HugepageLimit``,
  ``ServerContext`` (on_start/on_stop's ``server``), ``QoSClass``, ``QoSResolution`` and
  ``qos_of`` (a pod's class).
* What handlers write: ``HookResponse``, ``ResourceChanges``, ``EnvChanges``.
* Settings: ``parsed_by`` and the parsers ``boolean``, ``integer``, ``number``, ``string``,
  ``choice``, ``percent``, ``percent_range``, ``seconds``; ``feeds`` (a field that becomes a
  response field carries the bounds the proxy applies to it); ``Invalid``, ``Parser``,
  ``SectionCheck``, ``SectionSettings``.
* The node handles: ``CgroupFS``, ``CgroupVersion``, ``CgroupError``; ``shares_to_weight``,
  ``weight_to_shares`` and ``WeightConversion`` (how the node's runtime turns CPU shares into
  cgroup v2 weight: a plugin that converts itself passes ``cgroups.weight_conversion``, the
  node's, which ``CgroupFS.set_cpu_shares`` already follows); ``ResctrlFS``, ``ResctrlError``.
* ``paced``: for a reconcile handler that walks many pods without holding the event loop
  (``async for pod in paced(pods)``): hook calls go on between its slices.
* ``discover_plugins`` and ``ENTRY_POINT_GROUP``: how the server finds installed plugins.
"""

from __future__ import annotations

from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint

from .cgroups import CgroupError, CgroupFS, CgroupVersion, WeightConversion, shares_to_weight, weight_to_shares
from .changes import EnvChanges, HookResponse, ResourceChanges
from .convert import qos_of
from .definition import (
    HANDLER_KWARGS,
    LIFECYCLE_KWARGS,
    NODE_HANDLES,
    RECONCILE_KWARGS,
    FailurePolicy,
    Plugin,
    PluginDefinitionError,
)
from .discovery import ENTRY_POINT_GROUP, discover_plugins
from .pacing import paced
from .qos import QoSClass, QoSResolution
from .resctrl_fs import ResctrlError, ResctrlFS
from .settings import (
    Invalid,
    Parser,
    SectionCheck,
    SectionSettings,
    boolean,
    choice,
    feeds,
    integer,
    number,
    parsed_by,
    percent,
    percent_range,
    seconds,
    string,
)
from .views import ContainerInfo, HugepageLimit, PodInfo, Resources, ServerContext

__all__ = [
    "ENTRY_POINT_GROUP",
    "HANDLER_KWARGS",
    "LIFECYCLE_KWARGS",
    "NODE_HANDLES",
    "RECONCILE_KWARGS",
    "CgroupError",
    "CgroupFS",
    "CgroupVersion",
    "ContainerInfo",
    "EnvChanges",
    "FailurePolicy",
    "HookKind",
    "HookPoint",
    "HookResponse",
    "HugepageLimit",
    "Invalid",
    "Parser",
    "Plugin",
    "PluginDefinitionError",
    "PodInfo",
    "QoSClass",
    "QoSResolution",
    "ResctrlError",
    "ResctrlFS",
    "ResourceChanges",
    "Resources",
    "SectionCheck",
    "SectionSettings",
    "ServerContext",
    "WeightConversion",
    "boolean",
    "choice",
    "discover_plugins",
    "feeds",
    "integer",
    "number",
    "paced",
    "parsed_by",
    "percent",
    "percent_range",
    "qos_of",
    "seconds",
    "shares_to_weight",
    "string",
    "weight_to_shares",
]
