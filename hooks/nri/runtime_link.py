"""One connection to the runtime's NRI socket: the multiplexed trunk, our Plugin server, our Runtime client.

:func:`connect` opens the unix socket and says plainly why it cannot (:class:`NriUnavailable`):
no socket (the runtime is down, or NRI is off in its config), not a socket, nobody accepting
(a stale socket, or external plugins disabled), no permission. Over the trunk
(hooks/nri/mux.py), connection 1 carries the runtime's calls to our Plugin service
(hooks/nri/rpc.py TtrpcServer) and connection 2 our calls to its Runtime service
(TtrpcClient). The connection ends when the runtime closes it or sends bytes that cannot be
demultiplexed or framed (a ttrpc frame over the size limit); ``closed`` then holds the
reason, calls in flight fail and the server's tasks are cancelled.

**Bytes are handled as they arrive**: the socket's protocol (:class:`_Trunk`) hands each read to
the demultiplexer and the ttrpc endpoints in the loop's own read callback, so a request's task
starts in the next loop turn, with no reader task to wake in between. Nothing is buffered but the
decoders' one unfinished chunk and frame, whose sizes the decoders bound.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from collections.abc import Mapping
from typing import Final

import structlog

from .mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, MuxDecoder, MuxError, encode_chunks
from .rpc import Method, TtrpcClient, TtrpcServer
from .ttrpc import FrameTooLarge

__all__ = ["NRI_CONFIG_HINT", "NriConnection", "NriUnavailable", "connect"]

log = structlog.get_logger("runtimeproxy.hooks.nri")

#: How NRI is turned on in containerd 1.7's config, for error messages ({path}: the socket).
NRI_CONFIG_HINT: Final = 'containerd 1.7: [plugins."io.containerd.nri.v1.nri"] disable = false, socket_path = "{path}"'


class NriUnavailable(OSError):
    """The NRI socket cannot be reached; the message says why and what to check."""

    def __str__(self) -> str:
        return str(self.strerror)


async def connect(path: str, methods: Mapping[tuple[str, str], Method]) -> NriConnection:
    """A connection to the NRI socket at ``path`` serving ``methods``; NriUnavailable when there is none."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise NriUnavailable(
            errno.ENOENT,
            f"NRI socket {path} does not exist: the runtime is not running, or NRI is disabled in its "
            f"configuration or serves another socket ({NRI_CONFIG_HINT.format(path=path)})",
        ) from None
    except PermissionError:
        raise NriUnavailable(errno.EACCES, f"no permission to reach NRI socket {path}") from None
    if not stat.S_ISSOCK(mode):
        raise NriUnavailable(errno.ENOTSOCK, f"{path} is not a socket: give the runtime's NRI socket_path")
    loop = asyncio.get_running_loop()
    try:
        transport, trunk = await loop.create_unix_connection(_Trunk, path)
    except ConnectionRefusedError:
        raise NriUnavailable(
            errno.ECONNREFUSED,
            f"nothing accepts connections on NRI socket {path}: the runtime has stopped (a stale socket) "
            "or does not accept external plugins (disable_connections)",
        ) from None
    except PermissionError:
        raise NriUnavailable(errno.EACCES, f"no permission to connect to NRI socket {path}") from None
    except OSError as exc:
        raise NriUnavailable(exc.errno or errno.EIO, f"cannot connect to NRI socket {path}: {exc}") from None
    return NriConnection(transport, trunk, methods)


class _Trunk(asyncio.Protocol):
    """The socket's events, passed to its NriConnection (attached right after connecting; bytes
    that come before are kept until then)."""

    def __init__(self) -> None:
        self.connection: NriConnection | None = None
        self.early: list[bytes] = []
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if self.connection is None:
            self.early.append(data)
        else:
            self.connection.received(data)

    def eof_received(self) -> bool:
        if self.connection is not None:
            self.connection.end("the runtime closed the connection")
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if self.connection is not None:
            self.connection.end("the runtime closed the connection" if exc is None else f"connection error: {exc}")


class NriConnection:
    """The multiplexed connection; see the module doc. ``client`` calls the runtime."""

    def __init__(self, transport: asyncio.Transport, trunk: _Trunk, methods: Mapping[tuple[str, str], Method]) -> None:
        self._trunk = trunk
        self._transport = transport
        self._decoder = MuxDecoder()
        self.server = TtrpcServer(methods, lambda data: self._write(PLUGIN_SERVICE_CONN, data))
        self.client = TtrpcClient(lambda data: self._write(RUNTIME_SERVICE_CONN, data))
        self.closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._unknown_conns: set[int] = set()
        self._ending: asyncio.Task[None] | None = None
        trunk.connection = self
        early, trunk.early = trunk.early, []
        for data in early:
            self.received(data)
        if trunk.lost.done():  # lost before we were attached
            self.end("the runtime closed the connection")

    def _write(self, conn_id: int, data: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(encode_chunks(conn_id, data))

    def received(self, data: bytes) -> None:
        """Bytes read from the socket: routed at once (module doc); unreadable ones end the connection."""
        if self._ending is not None:
            return
        try:
            self._route(self._decoder.feed(data))
        except MuxError as exc:
            self.end(f"unreadable multiplexed stream: {exc}")
        except FrameTooLarge as exc:
            self.end(f"unreadable ttrpc stream: {exc}")
        except Exception:  # a bug must not leave the runtime waiting on a connection no one reads
            log.exception("NRI data could not be handled; closing the connection")
            self.end("runtime-hooks failed to handle the runtime's data")

    def _route(self, chunks: list[tuple[int, bytes]]) -> None:
        for conn_id, payload in chunks:
            if conn_id == PLUGIN_SERVICE_CONN:
                self.server.feed(payload)
            elif conn_id == RUNTIME_SERVICE_CONN:
                self.client.feed(payload)
            elif conn_id not in self._unknown_conns:  # the runtime's mux drops these too
                self._unknown_conns.add(conn_id)
                log.warning("NRI data for an unknown multiplexed connection ignored", conn=conn_id)

    def end(self, reason: str) -> asyncio.Task[None]:
        """End the connection for ``reason`` (the first reason given stands); the task doing it."""
        if self._ending is None:
            self._ending = asyncio.get_running_loop().create_task(self._end(reason), name="runtime-hooks-nri-end")
        return self._ending

    async def _end(self, reason: str) -> None:
        self.client.close(reason)
        self._transport.close()
        await self.server.close()
        await self._trunk.lost
        if not self.closed.done():
            self.closed.set_result(reason)

    async def close(self) -> None:
        """Close the connection (the runtime forgets the plugin) and wait until it is down."""
        await self.end("closed by runtime-hooks")
