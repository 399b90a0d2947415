"""The runtime-hooks gRPC server: RuntimeHookService on a unix socket, answered by the plugins.

For each of the 13 RPCs (api/runtime/v1alpha1/api.proto) the server turns the request into
PodInfo / ContainerInfo (sdk), runs the plugins that handle the hook point
(sdk.PluginRunner) and turns their merged HookResponse back into the RPC's response. A hook
point no plugin runs at answers the empty response (no change), never UNIMPLEMENTED: the
proxy fails a hook whose registered server answers UNIMPLEMENTED, and the proxy may still
call a point that the registration has just dropped. A plugin with failure policy "fail"
that fails makes the RPC answer INTERNAL with "plugin <name> failed at <hook point>: <reason>".

**Socket and protocol.** The socket comes from runtimeproxy.common.listener: the flock on
``<endpoint>.lock`` (one instance per path; a second one stops with AlreadyServing), the
refusal to replace a live socket or a non-socket, the directory's creation, and a socket never
reachable with looser permissions than ``socket_mode``. The lock is held until the server
stops. gRPC is served on it by runtimeproxy.wire.grpc_server, in the event loop's thread: grpc.aio
woke three idle threads per call, about 0.6 ms of each hook round trip during a pod start.
A request that does not decode is answered INTERNAL.

**Registration.** Once serving, the server writes ``runtime-hooks.json`` into the proxy's
hook config directory (write to a dotfile, then rename: the proxy never reads half a file)::

    {"remote-endpoint": "/var/run/runtimehooks/hooks.sock", "failure-policy": "Ignore",
     "runtime-hooks": [...the hook points its plugins in effect handle...],
     "timeout": <seconds>, "index": 0}

The plugins in effect are the enabled ones, less those the policy in force switches off
(``enabled: false``) for every QoS class. ``timeout`` is the longest sum of their timeouts at
any one hook point plus a margin (capped at the proxy's 120 s), so the proxy does not give up
on a call while its plugins are still within theirs. The failure policy is Fail when one of
them has failure policy "fail", else Ignore: when this server fails a call, the proxy goes on
with the CRI call unchanged.

The registration follows the policy: when a reload changes what it would say
(``policy_changed``), the file is rewritten, or removed when no plugin in effect handles a hook
point. Until the proxy has read the new file it may still call a dropped point; that call finds
no plugin to run and gets the empty response.

**Stopping.** ``stop()`` removes the registration file first and keeps serving for
``deregister_grace`` seconds: the proxy notices a removed file at its next scan of the
directory, at once through inotify or, when it cannot watch the directory, at its next poll
(every 0.2 s, runtimeproxy.dispatch.layer.DEFAULT_POLL_INTERVAL), and a call it starts before
then must still be answered. Under failure policy Fail an unanswered call
would refuse the pod. Then it stops accepting calls, lets those in flight finish within
``stop_grace`` and runs the plugins' on_stop.

**Message size.** The server sends and accepts messages up to ``max_message_size``, by
default the proxy's own limit (runtimeproxy.common.message_size): a request the proxy relays (a
CreateContainer with large annotations, say) reaches the plugins whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog
from google.protobuf.message import DecodeError

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.common import logs, trace
from runtimeproxy.common.cli_options import DEFAULT_HOOK_CONFIG_DIR  # the directory the proxy reads
from runtimeproxy.common.give_way import give_way
from runtimeproxy.common.listener import UnixListener, open_unix_listener
from runtimeproxy.common.message_size import DEFAULT_MAX_MESSAGE_SIZE
from runtimeproxy.hookapi.defaults import DEFAULT_POLL_INTERVAL, MAX_TIMEOUT
from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint
from runtimeproxy.wire.grpc_framing import StatusCode
from runtimeproxy.wire.grpc_server import CallInfo, H2Server, RpcError, UnaryHandler

from .changes import HookResponse
from .convert import frozen_map, resources_from_proto, resources_to_proto
from .definition import Plugin
from .plugin_runner import HookCallFailed, PluginRunner
from .policy import Policy
from .qos import QoSClass
from .views import ContainerInfo, PodInfo

__all__ = [
    "DEFAULT_DEREGISTER_GRACE",
    "DEFAULT_ENDPOINT",
    "DEFAULT_HOOK_CONFIG_DIR",
    "REGISTRATION_FILE",
    "SERVICE",
    "RuntimeHooksServer",
    "ServerSettings",
    "container_from_request",
    "container_response",
    "plugins_in_effect",
    "pod_from_container_request",
    "pod_from_request",
    "pod_response",
    "registration",
    "remove_registration",
    "write_registration",
]

log = structlog.get_logger("runtimeproxy.hooks.server")

DEFAULT_ENDPOINT: Final = "/var/run/runtimehooks/hooks.sock"
REGISTRATION_FILE: Final = "runtime-hooks.json"
SERVICE: Final = "runtime.v1alpha1.RuntimeHookService"
# Added to the plugins' timeouts in the registration: gRPC and conversion overhead.
TIMEOUT_MARGIN: Final = 0.5
#: Seconds served after the registration file is gone: five of the proxy's scans of its hook
#: config directory, so a scan that is late on a busy node still sees the file gone in time.
DEFAULT_DEREGISTER_GRACE: Final = 5 * DEFAULT_POLL_INTERVAL


@dataclass(frozen=True)
class ServerSettings:
    """Where to serve and register. ``hook_config_dir`` None or "": do not register.

    ``deregister_grace``: seconds served after unregistering on stop; ``stop_grace``: seconds
    calls in flight get after that; ``max_message_size``: bytes, both directions.
    """

    endpoint: str = DEFAULT_ENDPOINT
    hook_config_dir: str | None = DEFAULT_HOOK_CONFIG_DIR
    registration_name: str = REGISTRATION_FILE
    registration_index: int = 0
    socket_mode: int = 0o660
    socket_group: str | None = None
    stop_grace: float = 5.0
    deregister_grace: float = DEFAULT_DEREGISTER_GRACE
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE


# --- requests -> plugin view ------------------------------------------------------------------


def pod_from_request(request: Any) -> PodInfo:
    """A PodSandboxHookRequest as PodInfo."""
    return _pod_info(request, "")


def pod_from_container_request(request: Any) -> PodInfo:
    """The pod part of a ContainerResourceHookRequest as PodInfo."""
    return _pod_info(request, "pod_")


def _pod_info(request: Any, prefix: str) -> PodInfo:
    """The pod fields of a hook request; container requests name them ``pod_labels`` etc."""
    meta = request.pod_meta
    # The optional resource messages inline, no closure: this runs in every hook call.
    resources, overhead = prefix + "resources", prefix + "overhead"
    return PodInfo(
        name=meta.name,
        namespace=meta.namespace,
        uid=meta.uid,
        attempt=meta.attempt,
        sandbox_id=request.pod_sandbox_id,
        labels=frozen_map(getattr(request, prefix + "labels")),
        annotations=frozen_map(getattr(request, prefix + "annotations")),
        cgroup_parent=getattr(request, prefix + "cgroup_parent"),
        runtime_handler=request.runtime_handler,
        resources=resources_from_proto(getattr(request, resources)) if request.HasField(resources) else None,
        overhead=resources_from_proto(getattr(request, overhead)) if request.HasField(overhead) else None,
    )


def container_from_request(request: Any) -> ContainerInfo:
    """The container part of a ContainerResourceHookRequest as ContainerInfo.

    The environment comes from the ordered ``container_env_list`` when the proxy sent it,
    else from Koordinator's ``container_envs`` map (sorted by name: a map has no order).
    """
    meta = request.container_meta
    if request.container_env_list:  # values as str that round-trip (surrogateescape); a list: no generator
        env = tuple([(kv.key, kv.value.decode("utf-8", "surrogateescape")) for kv in request.container_env_list])
    else:
        env = tuple(sorted(request.container_envs.items()))
    return ContainerInfo(
        name=meta.name,
        id=meta.id,
        attempt=meta.attempt,
        annotations=frozen_map(request.container_annotations),
        resources=(
            resources_from_proto(request.container_resources) if request.HasField("container_resources") else None
        ),
        env=env,
    )


# --- plugin answers -> responses --------------------------------------------------------------


def pod_response(response: HookResponse) -> Any:
    """A merged HookResponse as PodSandboxHookResponse."""
    message = hook_pb.PodSandboxHookResponse(cgroup_parent=response.cgroup_parent)
    # Maps filled only when the plugins set entries: a protobuf map's update is Python code
    # (MutableMapping.update), run even for an empty dict, and most hook calls set none.
    if response.labels:
        message.labels.update(response.labels)
    if response.annotations:
        message.annotations.update(response.annotations)
    if not response.resources.is_empty():
        message.resources.CopyFrom(resources_to_proto(response.resources))
    return message


def container_response(response: HookResponse) -> Any:
    """A merged HookResponse as ContainerResourceHookResponse.

    Environment changes go out twice: ``container_env_list`` (ordered, bytes) for this
    proxy, and Koordinator's ``container_envs`` map, left empty when a value is not UTF-8
    (a proto string cannot hold it).
    """
    message = hook_pb.ContainerResourceHookResponse(pod_cgroup_parent=response.cgroup_parent)
    if response.annotations:  # as in pod_response
        message.container_annotations.update(response.annotations)
    if not response.resources.is_empty():
        message.container_resources.CopyFrom(resources_to_proto(response.resources))
    encoded = response.env.encoded()
    if encoded:
        message.container_env_list.extend(hook_pb.KeyValue(key=key, value=value) for key, value in encoded)
        try:
            message.container_envs.update({key: value.decode("utf-8") for key, value in encoded})
        except UnicodeDecodeError:
            message.container_envs.clear()
    return message


# --- registration file --------------------------------------------------------------------------


def plugins_in_effect(runner: PluginRunner) -> tuple[Plugin, ...]:
    """The runner's enabled plugins less those the policy in force switches off for every QoS
    class: the plugins a hook call may run. A plugin skipped for a node handle it needs stays:
    the node does not change while the server runs, and the skip is logged per call."""
    return tuple(
        plugin
        for plugin in runner.plugins
        if runner.skip_reason(plugin) or not all(runner.skip_reason(plugin, qos) for qos in QoSClass)
    )


def registration(runner: PluginRunner, settings: ServerSettings) -> dict[str, Any]:
    """The registration file's content for the runner's plugins in effect (``plugins_in_effect``)."""
    plugins = plugins_in_effect(runner)
    points = [point for point in HookPoint if any(point in plugin.hook_points for plugin in plugins)]
    longest = max(
        (sum(p.timeout for p in runner.plugins_for(point) if p in plugins) for point in points), default=0.0
    )
    return {
        "remote-endpoint": os.path.abspath(settings.endpoint),
        # A plugin that must not be skipped makes the proxy refuse the CRI call too.
        "failure-policy": "Fail" if any(p.failure_policy == "fail" for p in plugins) else "Ignore",
        "runtime-hooks": [point.value for point in points],
        "timeout": round(min(MAX_TIMEOUT, longest + TIMEOUT_MARGIN), 3),
        "index": settings.registration_index,
    }


def write_registration(directory: str, name: str, content: Mapping[str, Any]) -> str:
    """Put ``content`` in place as ``directory/name`` atomically (dotfile, fsync, rename); its path."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    path = os.path.join(directory, name)
    scratch = os.path.join(directory, f".{name}.{os.getpid()}.tmp")  # a dotfile: the proxy skips it
    data = (json.dumps(content, indent=2) + "\n").encode()
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(scratch, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(scratch)
        raise
    with contextlib.suppress(OSError):  # make the rename durable; not all filesystems allow it
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def remove_registration(path: str, endpoint: str) -> bool:
    """Remove the registration file at ``path`` if it still registers ``endpoint``; whether it did."""
    try:
        with open(path, "rb") as file:
            content = json.loads(file.read())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        content = None
    if isinstance(content, dict) and content.get("remote-endpoint") not in (endpoint, "unix://" + endpoint):
        log.info("registration file now names another server; left in place", path=path)
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return True


# --- the server ---------------------------------------------------------------------------------


class RuntimeHooksServer:
    """RuntimeHookService for ``runner``'s plugins on ``settings.endpoint``; see the module doc.

    ``start()`` runs the plugins' on_start, takes the socket, serves and registers;
    ``policy_changed`` brings the registration in line with a new policy; ``stop()``
    unregisters, serves on for ``deregister_grace`` seconds, stops serving (calls in flight get
    ``stop_grace`` seconds), runs on_stop and releases the socket. Also an async context manager.
    """

    def __init__(self, runner: PluginRunner, settings: ServerSettings | None = None) -> None:
        self.runner = runner
        self.settings = settings if settings is not None else ServerSettings()
        self.endpoint = os.path.abspath(self.settings.endpoint)
        self.registration_path: str | None = None  # where our registration is or was; None: never made
        # What the registration says now (no file when it lists no hook point); None: not registered.
        self._registration: dict[str, Any] | None = None
        self._server: H2Server | None = None
        self._listener: UnixListener | None = None
        self._started = False

    async def __aenter__(self) -> RuntimeHooksServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def hook_points(self) -> frozenset[HookPoint]:
        return self.runner.hook_points

    async def start(self) -> None:
        failed = await self.runner.start()  # raises if a "fail" plugin cannot start
        for failure in failed:
            log.error("plugin disabled: its on_start failed", plugin=failure.plugin, reason=failure.reason)
        try:
            await self._serve()
            self._register()
        except BaseException:
            await self._shutdown(0)
            await self.runner.stop()
            raise
        self._started = True
        log.info(
            "serving runtime hooks",
            endpoint=self.endpoint,
            hooks=sorted(point.value for point in self.hook_points),
            plugins=[plugin.name for plugin in self.runner.plugins],
            registration=self.registration_path,
        )

    async def stop(self, grace: float | None = None, deregister_grace: float | None = None) -> None:
        """Stop as the class doc says; ``grace`` and ``deregister_grace`` override the settings'."""
        if not self._started:
            return
        self._started = False
        if self._unregister():
            wait = self.settings.deregister_grace if deregister_grace is None else deregister_grace
            log.info("unregistered; serving on until the proxy has noticed", seconds=wait)
            await asyncio.sleep(wait)
        await self._shutdown(self.settings.stop_grace if grace is None else grace)
        await self.runner.stop()
        log.info("stopped serving runtime hooks", endpoint=self.endpoint)

    # -- serving --

    async def _serve(self) -> None:
        listener = open_unix_listener(self.endpoint, self.settings.socket_mode, group=self.settings.socket_group)
        self._listener = listener
        server = H2Server(self._handlers(), max_message_size=self.settings.max_message_size, name="runtime-hooks")
        await server.start(listener.sock)
        self._server = server

    async def _shutdown(self, grace: float) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()  # unlinks the socket (if still ours), then releases the lock

    def policy_changed(self, policy: Policy) -> None:
        """Rewrite (or remove) the registration if the policy now in force (the runner's, which
        ``policy`` is) changes what it says; a PolicyWatcher listener, run on the event loop.
        A file that cannot be written is logged and tried again at the next change."""
        if not self._started:
            return
        try:
            self._register()
        except OSError as exc:
            log.error("cannot update the registration; the proxy keeps the previous one", error=str(exc))

    def _register(self) -> None:
        """Put the registration for the plugins in effect in place, unless it is there already."""
        directory = self.settings.hook_config_dir
        if not directory:
            return
        content = registration(self.runner, self.settings)
        if content == self._registration:
            return
        path = os.path.join(directory, self.settings.registration_name)
        if not content["runtime-hooks"]:
            log.warning("no plugin in effect handles a hook point; not registered", directory=directory)
            remove_registration(path, self.endpoint)
        else:
            self.registration_path = write_registration(directory, self.settings.registration_name, content)
            hooks, policy = content["runtime-hooks"], content["failure-policy"]
            log.info("registered with the proxy", path=path, hooks=hooks, failure_policy=policy)
        self._registration = content

    def _unregister(self) -> bool:
        """Remove our registration file; whether we ever registered (the proxy may still be calling)."""
        path, self.registration_path, self._registration = self.registration_path, None, None
        if path is None:
            return False
        try:
            remove_registration(path, self.endpoint)
        except OSError as exc:
            log.warning("cannot remove registration file", path=path, error=str(exc))
        return True

    # -- RPCs --

    def _handlers(self) -> dict[str, UnaryHandler]:
        return {
            f"/{SERVICE}/{point.rpc}": self._rpc(point) if point in self.runner.hook_points else _no_change
            for point in HookPoint
        }

    def _rpc(self, point: HookPoint) -> UnaryHandler:
        pod_kind = point.kind is HookKind.POD
        request_type = hook_pb.PodSandboxHookRequest if pod_kind else hook_pb.ContainerResourceHookRequest

        async def traced(raw: bytes, info: CallInfo) -> bytes:
            request = _decode(request_type, raw, point)
            began = trace.now()  # bench/pod_timeline.py: the hook call inside runtime-hooks
            try:
                return await answer(request)
            finally:
                trace.event("hooks.rpc", hook=point.value, uid=request.pod_meta.uid, began=began)

        async def call(raw: bytes, info: CallInfo) -> bytes:
            return await answer(_decode(request_type, raw, point))

        async def answer(request: Any) -> bytes:
            release = logs.hold()  # the plugins' log lines go out after the answer: the proxy waits for it
            try:
                return await _answer(request)
            finally:
                # the server writes the answer in the step that returns it; this runs after that
                asyncio.get_running_loop().call_soon(_after_answer, release)

        async def _answer(request: Any) -> bytes:
            try:
                if pod_kind:
                    pod, container = pod_from_request(request), None
                else:
                    pod, container = pod_from_container_request(request), container_from_request(request)
                result = await self.runner.run(point, pod=pod, container=container)
                response = pod_response(result.response) if pod_kind else container_response(result.response)
                return bytes(response.SerializeToString())
            except HookCallFailed as exc:
                raise RpcError(StatusCode.INTERNAL, str(exc)) from None
            except Exception as exc:  # a bug here must answer, not hang the proxy's call
                log.exception("hook call failed", hook=point.value)
                raise RpcError(StatusCode.INTERNAL, f"runtime-hooks: {type(exc).__name__}: {exc}") from None

        call.__name__ = traced.__name__ = point.rpc
        return traced if trace.ON else call


def _after_answer(release: Callable[[], None]) -> None:
    """The proxy, woken by the answer, gets the CPU first; then the call's log lines go out."""
    give_way()
    release()


def _decode(request_type: Any, raw: bytes, point: HookPoint) -> Any:
    try:
        return request_type.FromString(raw)
    except DecodeError as exc:
        log.warning("hook request does not decode", hook=point.value, error=str(exc))
        raise RpcError(StatusCode.INTERNAL, f"runtime-hooks: the {point.rpc} request does not decode: {exc}") from None


async def _no_change(raw: bytes, info: CallInfo) -> bytes:
    """A hook point no enabled plugin handles: the empty response, valid for every hook RPC."""
    return b""
