"""A programmable runtime-hook server for end-to-end tests.

`TestHookServer` serves `runtime.v1alpha1.RuntimeHookService` (our generated stubs) on a
unix socket with grpc.aio. For every hook point it

* records each request it receives, decoded (`requests[point]`), and appends
  ``(server name, hook point)`` to a journal that several servers may share, so the
  order of calls across servers can be checked;
* answers as programmed with `set(point, behaviour)`: `Respond` (a fixed response or one
  computed from the request), `Fail` (a gRPC status), `Hang` (sleeps, so the proxy's
  timeout fires), `Delay` (answers late) or `Custom`; a hook point with no behaviour
  answers UNIMPLEMENTED, as a server that does not know the RPC would.

`register()` writes the server's registration file into a hook config directory (atomically:
write and rename, so the proxy's poller never sees half a file) and `unregister()` removes
it. `write_registration()` does the same for any endpoint, e.g. one nothing listens on.

`HttpHookServer` is no gRPC server at all: it answers every call with one fixed HTTP response
(HTTP 404 text/plain, say), as another HTTP server listening on a hook socket would.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import hpack
from fake_runtime import RawH2Server
from unix_server import UnixServer

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.api.runtime.v1alpha1 import api_pb2_grpc as hook_grpc
from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint
from runtimeproxy.wire import frames
from runtimeproxy.wire.grpc_framing import StatusCode

__all__ = [
    "INVALID_CONTAINER_RESPONSES",
    "INVALID_POD_RESPONSES",
    "NOT_GRPC_ANSWERS",
    "Custom",
    "Delay",
    "Fail",
    "Hang",
    "HttpHookServer",
    "Respond",
    "StaticViews",
    "TestHookServer",
    "empty_response",
    "not_grpc_text",
    "remove_registration",
    "write_registration",
]

Journal = list[tuple[str, str]]


def empty_response(point: HookPoint | str) -> Any:
    """The response with no changes for ``point``'s kind of hook."""
    kind = HookPoint(point).kind
    return hook.PodSandboxHookResponse() if kind == HookKind.POD else hook.ContainerResourceHookResponse()


@dataclass
class StaticViews:
    """Views for Dispatcher.run (dispatcher.HookViews) that ask every server the same request;
    an answer's changes are what ``changes`` makes of it (none by default)."""

    request: bytes
    changes: Callable[[Any], list[str]] = lambda response: []

    def hook_request(self) -> bytes:
        return self.request

    def apply_response(self, response: Any) -> list[str]:
        return self.changes(response)


# -- behaviours -----------------------------------------------------------------------------


class Behaviour:
    async def __call__(self, point: HookPoint, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise NotImplementedError


@dataclass
class Respond(Behaviour):
    """Answer ``response``: a message, a function of the request giving one, or None (no changes)."""

    response: Any = None

    async def __call__(self, point: HookPoint, request: Any, context: grpc.aio.ServicerContext) -> Any:
        response = self.response(request) if callable(self.response) else self.response
        return empty_response(point) if response is None else response


@dataclass
class Fail(Behaviour):
    """End the hook call with a gRPC status."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    details: str = "hook server says no"

    async def __call__(self, point: HookPoint, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(self.code, self.details)


@dataclass
class Hang(Behaviour):
    """Sleep far longer than any hook timeout, then answer with no changes."""

    seconds: float = 60.0

    async def __call__(self, point: HookPoint, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await asyncio.sleep(self.seconds)
        return empty_response(point)


@dataclass
class Delay(Behaviour):
    """Answer after ``seconds`` with what ``then`` answers."""

    seconds: float
    then: Behaviour = field(default_factory=Respond)

    async def __call__(self, point: HookPoint, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await asyncio.sleep(self.seconds)
        return await self.then(point, request, context)


@dataclass
class Custom(Behaviour):
    """Anything else: ``fn(point, request, context)``, plain or async, returns the response."""

    fn: Callable[[HookPoint, Any, grpc.aio.ServicerContext], Any]

    async def __call__(self, point: HookPoint, request: Any, context: grpc.aio.ServicerContext) -> Any:
        result = self.fn(point, request, context)
        return await result if inspect.isawaitable(result) else result


# Responses the proxy must refuse (each breaks one validation rule), by the field named in the error.
INVALID_CONTAINER_RESPONSES: dict[str, Any] = {
    "cpu_shares": hook.ContainerResourceHookResponse(
        container_resources=hook.LinuxContainerResources(cpu_shares=1, cpu_quota=50000)
    ),
    "cpuset_cpus": hook.ContainerResourceHookResponse(
        container_resources=hook.LinuxContainerResources(cpuset_cpus="3-1", cpu_quota=50000)
    ),
    "pod_cgroup_parent": hook.ContainerResourceHookResponse(
        pod_cgroup_parent="/../etc",
        container_resources=hook.LinuxContainerResources(cpu_quota=50000),
    ),
}
INVALID_POD_RESPONSES: dict[str, Any] = {
    "cgroup_parent": hook.PodSandboxHookResponse(cgroup_parent="/../etc", annotations={"invalid-hook": "ran"}),
    "resources": hook.PodSandboxHookResponse(
        resources=hook.LinuxContainerResources(cpu_shares=1), annotations={"invalid-hook": "ran"}
    ),
}


# -- registration files ---------------------------------------------------------------------


def write_registration(
    config_dir: str | os.PathLike[str],
    file_name: str,
    endpoint: str,
    hooks: Iterable[HookPoint | str],
    *,
    policy: str | None = "Fail",
    timeout: float | str | None = None,
    index: int | None = None,
    extra: dict[str, Any] | None = None,
) -> str:
    """Write a registration file atomically; returns its path. None values are left out."""
    data: dict[str, Any] = {"remote-endpoint": endpoint, "runtime-hooks": [str(HookPoint(h)) for h in hooks]}
    if policy is not None:
        data["failure-policy"] = policy
    if timeout is not None:
        data["timeout"] = timeout
    if index is not None:
        data["index"] = index
    data.update(extra or {})
    return write_raw_registration(config_dir, file_name, json.dumps(data))


def write_raw_registration(config_dir: str | os.PathLike[str], file_name: str, text: str) -> str:
    """Put ``text`` in place as ``file_name`` by write-and-rename (a dotfile, which the proxy ignores)."""
    path = os.path.join(config_dir, file_name)
    scratch = os.path.join(config_dir, f".{file_name}.tmp")
    with open(scratch, "w") as file:
        file.write(text)
    os.replace(scratch, path)
    return path


def remove_registration(config_dir: str | os.PathLike[str], file_name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(config_dir, file_name))


# -- the server -----------------------------------------------------------------------------


def _handler(point: HookPoint) -> Callable[..., Awaitable[Any]]:
    async def handle(self: _Servicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self.owner.handle(point, request, context)

    handle.__name__ = point.rpc
    return handle


class _Servicer(hook_grpc.RuntimeHookServiceServicer):
    def __init__(self, owner: TestHookServer) -> None:
        self.owner = owner


for _point in HookPoint:  # every RPC of the service goes through TestHookServer.handle
    setattr(_Servicer, _point.rpc, _handler(_point))


class TestHookServer(UnixServer):
    """One hook server on ``socket``; see the module docstring."""

    __test__ = False  # not a pytest test class

    def __init__(self, name: str, socket: str, journal: Journal | None = None) -> None:
        if len(os.fsencode(socket)) >= 100:
            raise ValueError(f"unix socket path too long: {socket}")
        super().__init__(socket)
        self.name = name
        self.journal: Journal = journal if journal is not None else []
        self.behaviours: dict[HookPoint, Behaviour] = {}
        self.requests: dict[HookPoint, list[Any]] = {point: [] for point in HookPoint}
        self._registration: tuple[str, str] | None = None

    @property
    def file_name(self) -> str:
        return f"{self.name}.json"

    # -- programming --

    def set(self, point: HookPoint | str, behaviour: Behaviour | Any | None) -> TestHookServer:
        """Program ``point``: a Behaviour, a response message (answered as is) or None (UNIMPLEMENTED)."""
        point = HookPoint(point)
        if behaviour is None:
            self.behaviours.pop(point, None)
        elif isinstance(behaviour, Behaviour):
            self.behaviours[point] = behaviour
        else:
            self.behaviours[point] = Respond(behaviour)
        return self

    def respond_all(self, points: Iterable[HookPoint | str] = tuple(HookPoint)) -> TestHookServer:
        """Answer ``points`` with no changes."""
        for point in points:
            self.set(point, Respond())
        return self

    # -- what it saw --

    def calls(self, point: HookPoint | str) -> list[Any]:
        return self.requests[HookPoint(point)]

    def last(self, point: HookPoint | str) -> Any:
        seen = self.calls(point)
        assert seen, f"{self.name}: no {HookPoint(point).value} call received"
        return seen[-1]

    def total_calls(self) -> int:
        return sum(len(seen) for seen in self.requests.values())

    def clear(self) -> None:
        for seen in self.requests.values():
            seen.clear()

    async def wait_for(self, point: HookPoint | str, count: int = 1, timeout: float = 5.0) -> Any:
        """Wait until ``count`` calls of ``point`` arrived (post-hooks run after the CRI reply); the last."""
        point = HookPoint(point)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.requests[point]) < count:
            if loop.time() > deadline:
                raise AssertionError(
                    f"{self.name}: {len(self.requests[point])} {point.value} calls after {timeout}s, wanted {count}"
                )
            await asyncio.sleep(0.01)
        return self.requests[point][-1]

    # -- serving --

    async def handle(self, point: HookPoint, request: Any, context: grpc.aio.ServicerContext) -> Any:
        copy = type(request)()
        copy.CopyFrom(request)
        self.requests[point].append(copy)
        self.journal.append((self.name, point.value))
        behaviour = self.behaviours.get(point)
        if behaviour is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{self.name} does not serve {point.rpc}")
        return await behaviour(point, request, context)

    def add_services(self, server: grpc.aio.Server) -> None:
        hook_grpc.add_RuntimeHookServiceServicer_to_server(_Servicer(self), server)

    # -- registration --

    def register(
        self,
        config_dir: str | os.PathLike[str],
        *,
        policy: str | None = "Fail",
        hooks: Iterable[HookPoint | str] | None = None,
        timeout: float | str | None = None,
        index: int | None = None,
        file_name: str | None = None,
    ) -> str:
        """Write this server's registration file; ``hooks`` defaults to the programmed hook points."""
        name = file_name or self.file_name
        points = sorted(self.behaviours, key=list(HookPoint).index) if hooks is None else hooks
        path = write_registration(config_dir, name, self.socket, points, policy=policy, timeout=timeout, index=index)
        self._registration = (os.fspath(config_dir), name)
        return path

    def unregister(self) -> None:
        if self._registration is not None:
            remove_registration(*self._registration)
            self._registration = None


# -- a server that is no gRPC server ---------------------------------------------------------

# HTTP answers that are no gRPC answer, by test id: (HTTP status, content-type, body) for an
# HttpHookServer, and the status the proxy refuses a call with when a Fail pre-hook answers so.
NOT_GRPC_ANSWERS: dict[str, tuple[tuple[str, str | None, bytes], StatusCode]] = {
    "404-text": (("404", "text/plain", b"404 page not found\n"), StatusCode.INTERNAL),
    "200-html": (("200", "text/html", b"<html></html>"), StatusCode.INTERNAL),
    "200-no-content-type": (("200", None, b""), StatusCode.INTERNAL),
    "500": (("500", "text/plain", b"oops"), StatusCode.INTERNAL),
    "503": (("503", "text/plain", b""), StatusCode.UNAVAILABLE),
}


def not_grpc_text(status: str, content_type: str | None) -> str:
    """How the proxy names such an answer in its errors and logs."""
    return f"HTTP {status} {content_type or 'without content-type'}, not a gRPC answer"


class HttpHookServer(RawH2Server):
    """Answers every call, once its request has ended, with HTTP ``status``, ``content_type``
    (None: no content-type) and ``body``, and no grpc-status: what an HTTP server that is no
    hook server answers. `rpcs()` lists the RPCs called, in order."""

    def __init__(self, status: str, content_type: str | None = "text/plain", body: bytes = b"") -> None:
        super().__init__()
        self.status = status
        self.content_type = content_type
        self.body = body

    def rpcs(self) -> list[str]:
        return [self.paths[stream].rsplit("/", 1)[-1] for stream in sorted(self.paths)]

    def _answer(self, encoder: hpack.Encoder, sid: int) -> bytes:
        headers = [(":status", self.status)]
        if self.content_type is not None:
            headers.append(("content-type", self.content_type))
        block = encoder.encode(headers)
        if not self.body:
            return frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS | frames.FLAG_END_STREAM, sid, block)
        head = frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, block)
        return head + frames.frame(frames.DATA, frames.FLAG_END_STREAM, sid, self.body)
