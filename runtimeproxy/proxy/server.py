"""The proxy daemon: listens on its unix socket and relays every connection to the runtime."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import structlog

from runtimeproxy.common.listener import UnixListener, open_unix_listener
from runtimeproxy.common.logs import debug_enabled
from runtimeproxy.common.message_size import DEFAULT_MAX_MESSAGE_SIZE
from runtimeproxy.proxy.metrics import CallMetrics
from runtimeproxy.relay.call_interceptor import CallInterceptor, PassThrough
from runtimeproxy.relay.connection import Backends, RelayConnection, RelayOptions
from runtimeproxy.relay.methods import MethodInfo, MethodTable, is_lifecycle
from runtimeproxy.wire.grpc_framing import code_name

log = structlog.get_logger("runtimeproxy.proxy.server")

DEFAULT_MAX_MESSAGE = DEFAULT_MAX_MESSAGE_SIZE


@dataclass(frozen=True)
class ProxySettings:
    endpoint: str  # socket path the proxy serves
    runtime_backend: str  # socket path of the runtime (containerd)
    image_backend: str | None = None  # socket path of the image service, if elsewhere
    max_message_size: int = DEFAULT_MAX_MESSAGE
    # Bytes of intercepted requests held at once; None: twice the largest message.
    held_request_budget: int | None = None
    drain_grace: float = 10.0
    socket_mode: int = 0o660
    socket_dir_mode: int = 0o750
    socket_group: str | None = None


class CallLog:
    """Logs and counts every finished call: lifecycle calls at info, the rest at debug.

    A call the hook layer has seen gets its info line from there (with the hooks'
    outcomes), so it is not logged twice.
    """

    def __init__(self, metrics: CallMetrics | None) -> None:
        self.metrics = metrics

    def __call__(self, method: MethodInfo, code: int, message: str, seconds: float, hooks_logged: bool) -> None:
        if self.metrics is not None:
            self.metrics.record(method.path, code, seconds)
        if not hooks_logged and is_lifecycle(method):
            log.info(
                "cri call",
                method=method.name,
                code=code_name(code),
                duration_ms=round(seconds * 1000, 3),
                **({"error": message} if code else {}),
            )
        elif debug_enabled():
            log.debug(
                "cri call", method=method.path, code=code_name(code), duration_ms=round(seconds * 1000, 3)
            )


class ProxyServer:
    """Accepts client connections and pairs each with a backend connection."""

    def __init__(
        self,
        settings: ProxySettings,
        interceptor: CallInterceptor | None = None,
        metrics: CallMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        interceptor = interceptor or PassThrough()
        self.options = RelayOptions(
            backends=Backends(settings.runtime_backend, settings.image_backend),
            methods=MethodTable(),
            interceptor=interceptor,
            observer=CallLog(metrics),
            max_message_size=settings.max_message_size,
            held_budget=settings.held_request_budget,
        )
        self.connections: set[RelayConnection] = set()
        self._listener: UnixListener | None = None
        self._server: asyncio.AbstractServer | None = None
        if metrics is not None:
            # Read at scrape time, so the relay's hot path does no gauge bookkeeping.
            metrics.in_flight.set_function(lambda: self.active_calls)
            metrics.client_connections.set_function(lambda: len(self.connections))
            metrics.backend_connections.set_function(self._backend_connections)

    async def start(self) -> None:
        """Bind the socket (refusing if another instance serves it) and start accepting."""
        s = self.settings
        self._listener = open_unix_listener(s.endpoint, s.socket_mode, s.socket_dir_mode, s.socket_group)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._accept, sock=self._listener.sock)
        log.info(
            "serving",
            endpoint=s.endpoint,
            runtime_backend=s.runtime_backend,
            image_backend=s.image_backend or s.runtime_backend,
        )

    def _accept(self) -> asyncio.Protocol:
        conn = RelayConnection(self.options, self.connections.discard)
        self.connections.add(conn)
        return conn.client_protocol()

    def _backend_connections(self) -> int:
        return sum(1 for conn in self.connections if conn.upstream_transport is not None)

    @property
    def active_calls(self) -> int:
        return sum(conn.active_calls for conn in self.connections)

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting, let calls in flight and their post-hooks finish (up to ``grace``
        seconds), then close; what had to be cut off is counted and logged."""
        grace = self.settings.drain_grace if grace is None else grace
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.start_drain()
        after_tasks = self.options.after_tasks
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while (self.active_calls or after_tasks) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        calls_left = self.active_calls
        for conn in list(self.connections):
            conn.close()  # ends the calls left, which may start more post-call work
        await asyncio.sleep(0)
        post_hooks_left = len(after_tasks)
        for task in list(after_tasks):
            task.cancel()
        if after_tasks:
            await asyncio.wait(list(after_tasks), timeout=1.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
        if self._listener is not None:
            self._listener.close()
        log_stop = log.warning if calls_left or post_hooks_left else log.info
        log_stop("stopped", calls_cut_off=calls_left, post_call_work_cut_off=post_hooks_left)
