"""runtime-hooks as an NRI plugin: register, get configured and synchronized, stay connected.

:meth:`NriPlugin.start` connects to the runtime's NRI socket (hooks/nri/runtime_link.py),
registers (Runtime.RegisterPlugin with our name and two-digit index; the runtime gives a
plugin 5 s for it) and waits until the runtime has configured (Configure: our event
subscription) and synchronized it (Synchronize: the pods it has). Only then is the plugin
in the runtime's list and does it get events; start() returns, or raises NriUnavailable /
TimeoutError with the reason, so ``serve`` refuses to start with a clear error: NriUnavailable
when the socket cannot be reached, the runtime refuses the registration (an invalid name or
index) or closes the connection before Synchronize (NRI closes it when registration or
Configure fails); TimeoutError naming what never came (the answer to RegisterPlugin, Configure,
Synchronize).

**Shutdown.** NRI 0.6.1 (containerd 1.7) never sends the Shutdown request: its Stop closes the
listener and kills only the plugins it launched itself, and containerd stopping closes our
connection. A runtime that does send it is logged, and the close that follows is reported as
"the runtime shut NRI down"; either way the plugin reconnects.

**Reconnecting.** When the connection ends -- the runtime restarts or shuts NRI down, or
dropped us for a missed deadline -- the plugin connects and registers again at once, and
after a failed attempt as soon as the socket's directory changes (inotify,
runtimeproxy/common/dirwatch.py: the runtime makes its socket anew when it starts) or after a backoff
of 0.05 s doubling to 0.4 s, whichever comes first, for as long as it runs. So registration
follows the socket's return within half a second, with or without inotify. A failure is
logged at warning when its reason differs from the previous attempt's (at debug when the
same), the reconnection once done, with the attempts and the seconds without NRI. Events
of the time between are lost to us (the runtime does not queue them): the Synchronize that
follows registration repairs the containers created meanwhile (hooks/nri/repair.py) and hands
the reconciler the runtime's pods again. :meth:`stop` closes the connection for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from dataclasses import dataclass
from typing import Any, Final

import structlog

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb
from runtimeproxy.common.dirwatch import DirectoryChanges

from .rpc import Method, RpcError, StatusCode
from .runtime_link import NriConnection, NriUnavailable, connect
from .service import PLUGIN_SERVICE, RUNTIME_SERVICE, NriHooks

__all__ = ["DEFAULT_PLUGIN_INDEX", "DEFAULT_PLUGIN_NAME", "NriPlugin", "NriSettings"]

log = structlog.get_logger("runtimeproxy.hooks.nri")

DEFAULT_PLUGIN_NAME: Final = "runtime-hooks"
DEFAULT_PLUGIN_INDEX: Final = 50
#: NRI's DefaultPluginRegistrationTimeout: the runtime waits this long for RegisterPlugin.
REGISTRATION_TIMEOUT: Final = 5.0
#: The pause between seeing the socket's directory change and connecting: the runtime makes the
#: socket (bind) a moment before it accepts on it (listen).
SOCKET_SETTLE: Final = 0.05


@dataclass(frozen=True)
class NriSettings:
    """``socket``: the runtime's NRI socket; ``index`` 0..99 (the order among NRI plugins);
    ``ready_timeout``: seconds start() waits for registration, Configure and Synchronize;
    ``reconnect_min`` / ``reconnect_max``: the backoff between reconnection attempts (module doc)."""

    socket: str
    plugin_name: str = DEFAULT_PLUGIN_NAME
    plugin_index: int = DEFAULT_PLUGIN_INDEX
    ready_timeout: float = 2 * REGISTRATION_TIMEOUT
    reconnect_min: float = 0.05
    reconnect_max: float = 0.4

    def __post_init__(self) -> None:
        if not 0 <= self.plugin_index <= 99:
            raise ValueError(f"NRI plugin index {self.plugin_index} is not 0..99")
        if not self.plugin_name:
            raise ValueError("the NRI plugin name is empty")
        if not 0 < self.reconnect_min <= self.reconnect_max:
            raise ValueError(f"NRI reconnect backoff {self.reconnect_min}..{self.reconnect_max}s is not 0 < min <= max")


class _Session:
    """One connection's progress through registration."""

    def __init__(self) -> None:
        self.registered = False
        self.configured = asyncio.Event()
        self.synchronized = asyncio.Event()
        self.shutdown = False

    @property
    def awaited(self) -> str:
        """What the runtime has not done yet, for an error message."""
        if not self.registered:
            return "no answer to RegisterPlugin"
        return "no Synchronize" if self.configured.is_set() else "no Configure"


async def _synchronized(session: _Session, connection: NriConnection) -> None:
    """Wait for Synchronize; NriUnavailable when the runtime closes the connection first
    (it refused the registration, or went down)."""
    synced = asyncio.ensure_future(session.synchronized.wait())
    waited: list[asyncio.Future[Any]] = [synced, connection.closed]
    try:
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
    finally:
        synced.cancel()
    if not session.synchronized.is_set():
        reason = connection.closed.result()
        raise NriUnavailable(errno.ECONNRESET, f"NRI closed the connection while registering us: {reason}")


class NriPlugin:
    """The NRI plugin serving ``hooks``' Plugin service; see the module doc."""

    def __init__(self, hooks: NriHooks, settings: NriSettings) -> None:
        self.hooks = hooks
        self.settings = settings
        self.connection: NriConnection | None = None
        self.registrations = 0
        self._session = _Session()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def name(self) -> str:
        """The name the runtime knows us by ("50-runtime-hooks")."""
        return f"{self.settings.plugin_index:02d}-{self.settings.plugin_name}"

    async def start(self) -> None:
        """Connect and register, waiting until synchronized; then keep reconnecting in the background."""
        self._stopping = False
        await self._connect()
        self._task = asyncio.get_running_loop().create_task(self._stay_connected(), name="runtime-hooks-nri")

    async def stop(self) -> None:
        """Close the connection and stop reconnecting."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        connection, self.connection = self.connection, None
        if connection is not None:
            await connection.close()
        self.hooks.metrics.connected.set(0)
        await self.hooks.close()  # notifications' hooks still running (hooks/nri/service.py)

    async def _connect(self) -> None:
        session = _Session()
        connection = await connect(self.settings.socket, self._methods(session))
        try:
            async with asyncio.timeout(self.settings.ready_timeout):
                request = nri_pb.RegisterPluginRequest(
                    plugin_name=self.settings.plugin_name, plugin_idx=f"{self.settings.plugin_index:02d}"
                )
                await connection.client.call(
                    RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString(), REGISTRATION_TIMEOUT
                )
                session.registered = True
                await _synchronized(session, connection)
        except (TimeoutError, RpcError) as exc:
            await connection.close()
            if isinstance(exc, RpcError) and exc.code != StatusCode.DEADLINE_EXCEEDED:
                # refused (an invalid name or index), or the connection closed before the answer
                raise NriUnavailable(
                    errno.ECONNREFUSED, f"NRI at {self.settings.socket} did not register us: {exc}"
                ) from None
            waited = self.settings.ready_timeout
            if not session.registered:
                waited = min(waited, REGISTRATION_TIMEOUT)
            raise TimeoutError(f"NRI at {self.settings.socket} sent {session.awaited} within {waited:g}s") from None
        except BaseException:
            await connection.close()
            raise
        self.connection, self._session = connection, session
        self.registrations += 1
        self.hooks.metrics.connected.set(1)
        log.info("registered as an NRI plugin", socket=self.settings.socket, plugin=self.name)

    def _methods(self, session: _Session) -> dict[tuple[str, str], Method]:
        """The service's methods, noting this connection's Configure, Synchronize and Shutdown."""
        methods = self.hooks.methods()

        def noting(name: str, mark: asyncio.Event | None) -> None:
            inner = methods[(PLUGIN_SERVICE, name)]

            async def method(payload: bytes, timeout: float | None) -> bytes:
                answer = await inner(payload, timeout)
                if mark is not None:
                    mark.set()
                else:
                    session.shutdown = True
                return answer

            methods[(PLUGIN_SERVICE, name)] = method

        noting("Configure", session.configured)
        noting("Synchronize", session.synchronized)
        noting("Shutdown", None)
        return methods

    async def _stay_connected(self) -> None:
        while not self._stopping:
            connection = self.connection
            assert connection is not None
            reason = await connection.closed
            lost = time.monotonic()
            self.hooks.metrics.connected.set(0)
            if self._stopping:
                return
            if self._session.shutdown:
                reason = f"the runtime shut NRI down ({reason})"
            log.warning("NRI connection lost; reconnecting", reason=reason, socket=self.settings.socket)
            changes = DirectoryChanges(
                os.path.dirname(self.settings.socket) or ".",
                self.settings.reconnect_max,
                what="NRI socket directory",
                logger=log,
            )
            changes.open()  # before the first attempt: a socket made after it wakes the next one
            try:
                attempts = await self._reconnect(changes)
            finally:
                changes.close()
            self.hooks.metrics.reconnects.inc()
            log.info(
                "NRI plugin re-registered",
                attempts=attempts,
                plugin=self.name,
                without_nri_s=round(time.monotonic() - lost, 3),
            )

    async def _reconnect(self, changes: DirectoryChanges) -> int:
        """Connect and register until it works (module doc); the attempts it took."""
        delay = self.settings.reconnect_min
        attempts = 0
        said = ""
        while True:
            attempts += 1
            try:
                await self._connect()
            except (NriUnavailable, RpcError, TimeoutError) as exc:
                error = str(exc)
                say = log.warning if error != said else log.debug
                say("NRI reconnection failed", error=error, attempts=attempts, retry_in_s=delay)
                said = error
                await self._socket_changed(changes, delay)
                delay = min(delay * 2, self.settings.reconnect_max)
                continue
            return attempts

    async def _socket_changed(self, changes: DirectoryChanges, delay: float) -> None:
        """Until the socket's directory changes (then SOCKET_SETTLE more), at most ``delay`` seconds."""
        try:
            async with asyncio.timeout(delay):
                await changes.wait()
        except TimeoutError:
            return
        await asyncio.sleep(SOCKET_SETTLE)
