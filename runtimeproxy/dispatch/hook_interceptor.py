"""The hook layer as the relay sees it: runs hooks around CRI lifecycle calls.

For each claimed call: take the keys of the objects it touches (order per pod and
container), build its views from the request and the store, run the pre-hooks, and send
on the changed request. After the call: record it in the store, run the post-hooks, log
one line with everything the hooks did, and release the keys.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import structlog

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.common import logs, trace
from runtimeproxy.dispatch.dispatcher import FINE_OUTCOMES, Dispatcher, HookFailed, HookOutcome, LayerErrorAction
from runtimeproxy.dispatch.registry import HookServer
from runtimeproxy.dispatch.sequencer import KeyedSequencer
from runtimeproxy.dispatch.store import PodStore, StoreRebuilder
from runtimeproxy.hookapi import cri_mapping
from runtimeproxy.hookapi.cri_mapping import CallFrame, ContainerView, PodView
from runtimeproxy.hookapi.hookpoints import HOOKS_BY_METHOD, CallHooks, HookKind, HookPoint
from runtimeproxy.hookapi.value_bounds import LOGGED_CHANGES_MAX
from runtimeproxy.relay.call_interceptor import CallContext, CallOutcome, RejectCall
from runtimeproxy.relay.methods import MethodInfo
from runtimeproxy.runtime_state import UnreadableObjectError
from runtimeproxy.runtime_state.entries import SandboxEntry, copy_message
from runtimeproxy.wire import grpc_framing

_LOG_NAME = "runtimeproxy.hooks"
log = structlog.get_logger(_LOG_NAME)

RUNTIME_SERVICE = "runtime.v1.RuntimeService"
DEFAULT_SKIP_LABEL = "runtimeproxy.koordinator.sh/skip-hookserver"
# Calls that change the store but have no hook point of their own.
STORE_ONLY = {"RemoveContainer": CallHooks(None, None)}
# Every intercepted method -> its hook points (looked up twice per call: one dict, no function).
_CALL_HOOKS: dict[str, CallHooks] = {**HOOKS_BY_METHOD, **STORE_ONLY}
# Calls that take objects off the node.
TEARDOWN = frozenset({"StopPodSandbox", "RemovePodSandbox", "StopContainer", "RemoveContainer"})
POD_POINTS = frozenset(point for point in HookPoint if point.kind == HookKind.POD)


@dataclass
class _CallState:
    frame: CallFrame
    keys: tuple[str, ...]
    started: float  # perf_counter() as the hooks took the call (after its keys)
    skipped: bool = False
    # Set when the hook layer itself failed on this call (logged on the call's line).
    layer_error: str = ""
    results: list[HookOutcome] = field(default_factory=list)


class HookInterceptor:
    def __init__(
        self,
        dispatcher: Dispatcher,
        store: PodStore,
        loader: StoreRebuilder,
        *,
        skip_label: str = DEFAULT_SKIP_LABEL,
        skip_value: str = "true",
        output_rules: cri_mapping.OutputRules | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.store = store
        self.loader = loader  # loads what ``store`` lacks into it: the store is asked first
        self.skip_label = skip_label
        self.skip_value = skip_value
        self.output_rules = output_rules or cri_mapping.OutputRules()
        self.sequencer = KeyedSequencer()
        self._calls: dict[int, _CallState] = {}
        dispatcher.expect_layer_errors(_CALL_HOOKS)

    # -- the relay's interface ---------------------------------------------------------------

    def intercepts(self, method: MethodInfo) -> bool:
        return method.service == RUNTIME_SERVICE and method.name in _CALL_HOOKS

    async def before(self, call: CallContext, request: bytes) -> bytes:
        """Run the pre-hooks; fail closed under a Fail policy, whatever goes wrong.

        A request that is not one valid message is refused: the hooks could not see it, so
        it must not reach the runtime past them. Any other error in the hook layer (the
        store, a merge, our own bug) refuses the call when a Fail server is subscribed to
        the call's hook points, and relays it unchanged (logged and counted) otherwise.
        """
        name = call.method.name
        message = _decode(call, request)
        if trace.ON:
            trace.event("proxy.held", call=call.serial, method=name)
        keys = await self.sequencer.acquire(_keys(name, message))
        if trace.ON:
            trace.event("proxy.keys", call=call.serial, method=name, keys=keys)
        try:
            return await self._pre_hooks(call, name, message, request, keys)
        except HookFailed as failed:
            self._end(call, failed.code, str(failed), failed.result)
            raise RejectCall(failed.code, str(failed)) from None
        except Exception as exc:  # the hook layer itself failed
            return self._failed_inside(call, name, request, keys, exc)
        except BaseException:
            self._forget(call, keys)
            raise

    async def _pre_hooks(
        self, call: CallContext, name: str, message: Any, request: bytes, keys: tuple[str, ...]
    ) -> bytes:
        started = time.perf_counter()
        try:
            frame = await self._frame(name, message)
        except Exception:
            # A bare frame, so that the call is still recorded and logged (_failed_inside).
            self._calls[id(call)] = _CallState(CallFrame(name, message), keys, started)
            raise
        state = self._calls[id(call)] = _CallState(frame, keys, started, self._skipped(frame))
        point = _CALL_HOOKS[name].pre
        if point is not None and not state.skipped:
            servers = self.dispatcher.registry.servers_for(point)
            if servers:
                state.results += await self._run(point, servers, state.frame, call.deadline)
        if state.frame.mutable and state.frame.changes:
            _commit(state.frame)
            return bytes(state.frame.request.SerializeToString())
        return request

    def _failed_inside(
        self, call: CallContext, name: str, request: bytes, keys: tuple[str, ...], exc: Exception
    ) -> bytes:
        cause = f"{type(exc).__name__}: {exc}"
        # A bug gets its traceback; data the runtime holds but we cannot read is no bug.
        trace = None if isinstance(exc, UnreadableObjectError) else exc
        state = self._calls.get(id(call))
        if state is not None:
            state.layer_error = cause  # named on the call's log line
        fail_point = self._fail_point(name, state, exc)
        if fail_point is not None:
            reason = (
                f"runtime hook layer error before {name} ({cause}); refused because hook point "
                f"{fail_point.value} has a server with failure policy Fail"
            )
            log.error("hook layer failed; call refused", method=name, error=cause, exc_info=trace)
            self.dispatcher.count_layer_error(name, LayerErrorAction.REFUSED)
            self._end_or_forget(call, keys, grpc_framing.INTERNAL, reason)
            raise RejectCall(grpc_framing.INTERNAL, reason) from None
        log.error("hook layer failed; call relayed unchanged", method=name, error=cause, exc_info=trace)
        self.dispatcher.count_layer_error(name, LayerErrorAction.RELAYED_UNCHANGED)
        if state is not None:  # ``after`` still records the call in the store and logs it
            state.frame.changes.clear()
            state.skipped = True
        return request

    def _fail_point(self, name: str, state: _CallState | None, exc: Exception) -> HookPoint | None:
        """The hook point whose Fail server makes this failure refuse the call, if any.

        Two exceptions: a pod that opted out with the skip label never has hooks applied,
        and a teardown call on an object the runtime holds but we cannot decode (created
        around the proxy, so never hooked) goes on: refusing it would keep the object on
        the node for ever.
        """
        if state is not None and state.skipped:
            return None
        if isinstance(exc, UnreadableObjectError) and name in TEARDOWN:
            return None
        hooks = _CALL_HOOKS[name]
        return next((p for p in (hooks.pre, hooks.post) if p is not None and self.dispatcher.fails_closed(p)), None)

    def _end_or_forget(self, call: CallContext, keys: tuple[str, ...], code: int, message: str) -> None:
        if id(call) in self._calls:
            self._end(call, code, message, None)
        else:
            self.sequencer.release(keys)

    def _forget(self, call: CallContext, keys: tuple[str, ...]) -> None:
        self._calls.pop(id(call), None)
        self.sequencer.release(keys)

    async def after(self, call: CallContext, request: bytes, outcome: CallOutcome) -> None:
        state = self._calls.get(id(call))
        if state is None:
            return
        try:
            if outcome.code == grpc_framing.OK:
                await self._succeeded(call.method, state, outcome.response)
        except Exception as exc:  # the call has been carried out: report, never raise
            cause = f"{type(exc).__name__}: {exc}"
            state.layer_error = cause
            log.error("hook layer failed after the call", method=call.method.name, error=cause, exc_info=exc)
            self.dispatcher.count_layer_error(call.method.name, LayerErrorAction.AFTER_CALL)
        finally:
            self._end(call, outcome.code, outcome.message, None)

    # -- steps -------------------------------------------------------------------------------

    async def _succeeded(self, method: MethodInfo, state: _CallState, response: bytes | None) -> None:
        reply = method.response_type.FromString(response or b"")
        frame = state.frame
        if method.name == "CreateContainer" and frame.container is not None:
            frame.container.container_id = reply.container_id
            frame.hook_request = None  # the post-hooks are told the new id
            # Taken before kubelet's next call can be read: StartContainer waits for PostCreate.
            state.keys += await self.sequencer.acquire(["container:" + reply.container_id])
        if method.name == "RunPodSandbox" and frame.pod is not None:
            frame.pod.sandbox_id = reply.pod_sandbox_id
            frame.hook_request = None
        self._record(method.name, frame)
        point = _CALL_HOOKS[method.name].post
        if point is not None and not state.skipped:
            servers = self.dispatcher.registry.servers_for(point)
            if servers:
                state.results += await self._run(point, servers, frame, None)

    def _run(
        self, point: HookPoint, servers: list[HookServer], frame: CallFrame, deadline: float | None
    ) -> Awaitable[list[HookOutcome]]:
        """Dispatcher.run itself (no coroutine of ours around it, resumed at each of its waits),
        or with tracing on, wrapped to trace it."""
        views = FrameViews(frame, point in POD_POINTS, self.output_rules)
        run = self.dispatcher.run(point, views, deadline, servers)
        return run if not trace.ON else _traced(run, point, frame)

    def _skipped(self, frame: CallFrame) -> bool:
        return frame.pod is not None and frame.pod.config.labels.get(self.skip_label) == self.skip_value

    def _end(self, call: CallContext, code: int, message: str, failed: HookOutcome | None) -> None:
        state = self._calls.pop(id(call), None)
        if state is None:
            return
        self.sequencer.release(state.keys)
        if trace.ON:
            uid = state.frame.pod.config.metadata.uid if state.frame.pod is not None else ""
            trace.event("proxy.released", call=call.serial, method=call.method.name, uid=uid, code=code)
        _log_call(call.method.name, state, code, message, failed)

    # -- views and store ---------------------------------------------------------------------

    async def _frame(self, name: str, request: Any) -> CallFrame:
        if name == "RunPodSandbox":
            pod = PodView("", request.runtime_handler, request.config)
            return CallFrame(name, request, pod=pod, mutable=True)
        if name == "CreateContainer":
            sandbox = await self._sandbox(request.pod_sandbox_id)
            handler = sandbox.runtime_handler if sandbox is not None else ""
            pod = PodView(request.pod_sandbox_id, handler, request.sandbox_config)
            frame = CallFrame(name, request, pod=pod, container=ContainerView("", request.config), mutable=True)
            if sandbox is not None:
                frame.changes += cri_mapping.follow_pod(request.sandbox_config, _pod_config(sandbox))
            return frame
        if hasattr(request, "container_id"):
            return await self._container_frame(name, request)
        return await self._pod_frame(name, request)

    async def _container_frame(self, name: str, request: Any) -> CallFrame:
        # Only an update writes into its views at once; the others read the store's own
        # configs until a hook answer is applied (_unshare).
        update = name == "UpdateContainerResources"
        entry = self.store.container(request.container_id)
        if entry is None:
            entry = await self.loader.ensure_container(request.container_id)
        sandbox_id = entry.sandbox_id if entry is not None else ""
        pod = await self._pod_view(sandbox_id, update)
        container = ContainerView(request.container_id, _container_config(entry, update))
        frame = CallFrame(name, request, pod=pod, container=container, shared=not update)
        if update:
            container.config.linux.resources.CopyFrom(request.linux)
            container.config.annotations.update(request.annotations)
            frame.baseline_annotations = dict(container.config.annotations)
            frame.mutable = True
        return frame

    async def _pod_frame(self, name: str, request: Any) -> CallFrame:
        update = name == "UpdatePodSandboxResources"
        pod = await self._pod_view(request.pod_sandbox_id, update)
        frame = CallFrame(name, request, pod=pod, shared=not update)
        if update:
            pod.config.linux.resources.CopyFrom(request.resources)
            pod.config.linux.overhead.CopyFrom(request.overhead)
            frame.mutable = True
        return frame

    async def _pod_view(self, sandbox_id: str, copy: bool) -> PodView:
        """The pod's view: a copy of its config, or with ``copy`` False the stored one itself."""
        entry = await self._sandbox(sandbox_id) if sandbox_id else None
        if entry is None:
            return PodView(sandbox_id, "", cri.PodSandboxConfig())
        config = _pod_config(entry)
        return PodView(sandbox_id, entry.runtime_handler, copy_message(config) if copy else config)

    async def _sandbox(self, sandbox_id: str) -> SandboxEntry | None:
        """The sandbox's entry: the loader's own store first (a call less per lookup), the loader
        only for what the store lacks."""
        entry = self.store.sandbox(sandbox_id)
        return entry if entry is not None else await self.loader.ensure_sandbox(sandbox_id)

    def _record(self, name: str, frame: CallFrame) -> None:
        request, store = frame.request, self.store
        if name == "RunPodSandbox" and frame.pod is not None:
            store.put_sandbox(store.sandbox_from_request(frame.pod.sandbox_id, request))
        elif name == "CreateContainer" and frame.container is not None:
            store.put_container(store.container_from_request(frame.container.container_id, request))
        elif name == "UpdateContainerResources":
            store.update_container_resources(request.container_id, request.linux)
        elif name == "UpdatePodSandboxResources":
            store.update_sandbox_resources(request.pod_sandbox_id, request.resources, request.overhead)
        elif name == "RemoveContainer":
            store.remove_container(request.container_id)
        elif name == "RemovePodSandbox":
            store.remove_sandbox(request.pod_sandbox_id)


async def _traced(run: Awaitable[list[HookOutcome]], point: HookPoint, frame: CallFrame) -> list[HookOutcome]:
    began = trace.now()
    try:
        return await run
    finally:
        uid = frame.pod.config.metadata.uid if frame.pod is not None else ""
        trace.event("proxy.hook", hook=point.value, uid=uid, began=began)


def _decode(call: CallContext, request: bytes) -> Any:
    """The request as its message type, or the call is refused: hooks must see what runs."""
    try:
        return call.method.request_type.FromString(request)
    except Exception as exc:  # DecodeError, mostly: e.g. strings that are not valid UTF-8
        reason = f"request is not a valid {call.method.request_type.DESCRIPTOR.full_name}: {exc}"
        log.warning("request refused", method=call.method.name, reason=reason)
        raise RejectCall(grpc_framing.INVALID_ARGUMENT, reason) from None


def _keys(name: str, request: Any) -> list[str]:
    if name == "RunPodSandbox":
        return ["pod:" + request.config.metadata.uid]
    if name == "CreateContainer":
        return ["sandbox:" + request.pod_sandbox_id]
    if hasattr(request, "container_id"):
        return ["container:" + request.container_id]
    return ["sandbox:" + request.pod_sandbox_id]


class FrameViews:
    """A call frame's views at one hook point, as the dispatcher asks and changes them
    (dispatcher.HookViews): a pod hook point's views are the pod's, any other's the container's."""

    __slots__ = ("frame", "pod_kind", "rules")

    def __init__(self, frame: CallFrame, pod_kind: bool, rules: cri_mapping.OutputRules) -> None:
        self.frame = frame
        self.pod_kind = pod_kind
        self.rules = rules

    def hook_request(self) -> bytes:
        """The hook request for the frame's views, serialized: built once while they stay as they
        are (the pre- and post-hooks of StartContainer, several servers of one hook point)."""
        frame = self.frame
        request = frame.hook_request
        if request is None:
            pod, container = frame.pod, frame.container
            assert pod is not None
            if self.pod_kind:
                message = cri_mapping.pod_hook_request(pod)
            else:
                assert container is not None
                message = cri_mapping.container_hook_request(pod, container)
            request = frame.hook_request = bytes(message.SerializeToString())
        return request

    def apply_response(self, response: Any) -> list[str]:
        """Merge a hook's (non-empty) answer into the call's views; returns the changes made."""
        frame = self.frame
        _unshare(frame)  # never into the store's own messages
        frame.hook_request = None  # the views may change: the next hook's request is built anew
        pod, container = frame.pod, frame.container
        assert pod is not None
        if self.pod_kind:
            changes = cri_mapping.apply_pod_response(pod, response, self.rules)
        else:
            assert container is not None
            changes = cri_mapping.apply_container_response(pod, container, response, self.rules)
        frame.changes += changes
        return changes


def _unshare(frame: CallFrame) -> None:
    """Give the frame copies of views that are the store's own messages, before writing."""
    if not frame.shared:
        return
    frame.shared = False
    if frame.pod is not None:
        frame.pod.config = copy_message(frame.pod.config)
    if frame.container is not None:
        frame.container.config = copy_message(frame.container.config)


def _commit(frame: CallFrame) -> None:
    """Write changes made on copies back into the requests that carry only part of them."""
    request = frame.request
    if frame.method == "UpdateContainerResources" and frame.container is not None:
        config = frame.container.config
        request.linux.CopyFrom(config.linux.resources)
        for key, value in config.annotations.items():
            if frame.baseline_annotations.get(key) != value:
                request.annotations[key] = value
    elif frame.method == "UpdatePodSandboxResources" and frame.pod is not None:
        request.resources.CopyFrom(frame.pod.config.linux.resources)


def _pod_config(entry: Any) -> Any:
    """The sandbox's config to read (its own, not a copy), or one built from its entry's fields."""
    config = getattr(entry, "config", None)
    if config is not None:
        return config
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(
            name=entry.name, uid=entry.uid, namespace=entry.namespace, attempt=entry.attempt
        ),
        labels=entry.labels,
        annotations=entry.annotations,
        linux=cri.LinuxPodSandboxConfig(
            cgroup_parent=entry.cgroup_parent, resources=entry.resources, overhead=entry.overhead
        ),
    )


def _container_config(entry: Any, copy: bool) -> Any:
    """The container's config: a copy, or with ``copy`` False the stored one itself."""
    if entry is None:
        return cri.ContainerConfig()
    config = getattr(entry, "config", None)
    if config is not None:
        return copy_message(config) if copy else config
    return cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=entry.name, attempt=entry.attempt),
        labels=entry.labels,
        annotations=entry.annotations,
        envs=[cri.KeyValue(key=key, value=value) for key, value in entry.envs],
        linux=cri.LinuxContainerConfig(resources=entry.resources),
    )


def _log_call(name: str, state: _CallState, code: int, message: str, failed: HookOutcome | None) -> None:
    frame = state.frame
    pod = frame.pod.config.metadata if frame.pod is not None else None
    problem = failed is not None or bool(state.layer_error)
    hooks = []
    for result in state.results:  # one pass, no comprehension: this runs for every hooked call
        hooks.append(result.summary())
        problem = problem or result.outcome not in FINE_OUTCOMES
    if failed is not None:
        hooks.append(failed.summary())
    # Each change is bounded already (value_bounds.cut); so is how many a log line lists.
    changes, more = frame.changes, len(frame.changes) - LOGGED_CHANGES_MAX
    fields: dict[str, Any] = {
        "method": name,
        "code": grpc_framing.code_name(code),
        "duration_ms": round((time.perf_counter() - state.started) * 1000, 3),
        "pod": f"{pod.namespace}/{pod.name}" if pod is not None and pod.name else None,
        "container": frame.container.config.metadata.name if frame.container is not None else None,
        "hooks": hooks,
        "changes": [*changes[:LOGGED_CHANGES_MAX], f"... and {more} more"] if more > 0 else changes,
    }
    if state.layer_error:
        fields["hook_layer_error"] = state.layer_error
    elif state.skipped:
        fields["skipped"] = "skip label"
    if code != grpc_framing.OK:
        fields["error"] = message
    line = logs.cached_logger(_LOG_NAME)  # log's logger, not rebuilt per line as the lazy proxy does
    (line.warning if problem else line.info)("lifecycle call", **fields)
