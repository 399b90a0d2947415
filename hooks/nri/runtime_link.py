"""One connection to the runtime's NRI socket: the multiplexed trunk, our Plugin server, our Runtime client.

:func:`connect` opens the unix socket and says plainly why it cannot (:class:`NriUnavailable`):
no socket (the runtime is down, or NRI is off in its config), not a socket, nobody accepting
(a stale socket, or external plugins disabled), no permission. Over the trunk
(hooks/nri/mux.py), connection 1 carries the runtime's calls to our Plugin service
(hooks/nri/rpc.py TtrpcServer) and connection 2 our calls to its Runtime service
(TtrpcClient). The connection ends when the runtime closes it or sends bytes that cannot be
demultiplexed or framed (a ttrpc frame over the size limit); ``closed`` then holds the
reason, calls in flight fail and the server's tasks are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
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
_READ_SIZE: Final = 1 << 16


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
    try:
        reader, writer = await asyncio.open_unix_connection(path, limit=_READ_SIZE)
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
    return NriConnection(reader, writer, methods)


class NriConnection:
    """The multiplexed connection; see the module doc. ``client`` calls the runtime."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, methods: Mapping[tuple[str, str], Method]
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = MuxDecoder()
        self.server = TtrpcServer(methods, lambda data: self._write(PLUGIN_SERVICE_CONN, data))
        self.client = TtrpcClient(lambda data: self._write(RUNTIME_SERVICE_CONN, data))
        loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[str] = loop.create_future()
        self._unknown_conns: set[int] = set()
        self._task = loop.create_task(self._read(), name="runtime-hooks-nri-read")

    def _write(self, conn_id: int, data: bytes) -> None:
        if not self._writer.is_closing():
            self._writer.write(encode_chunks(conn_id, data))

    async def _read(self) -> None:
        reason = "closed by runtime-hooks"
        try:
            while True:
                data = await self._reader.read(_READ_SIZE)
                if not data:
                    reason = "the runtime closed the connection"
                    break
                self._route(self._decoder.feed(data))
        except MuxError as exc:
            reason = f"unreadable multiplexed stream: {exc}"
        except FrameTooLarge as exc:
            reason = f"unreadable ttrpc stream: {exc}"
        except OSError as exc:
            reason = f"connection error: {exc}"
        finally:
            await self._end(reason)

    def _route(self, chunks: list[tuple[int, bytes]]) -> None:
        for conn_id, payload in chunks:
            if conn_id == PLUGIN_SERVICE_CONN:
                self.server.feed(payload)
            elif conn_id == RUNTIME_SERVICE_CONN:
                self.client.feed(payload)
            elif conn_id not in self._unknown_conns:  # the runtime's mux drops these too
                self._unknown_conns.add(conn_id)
                log.warning("NRI data for an unknown multiplexed connection ignored", conn=conn_id)

    async def _end(self, reason: str) -> None:
        self.client.close(reason)
        await self.server.close()
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
        if not self.closed.done():
            self.closed.set_result(reason)

    async def close(self) -> None:
        """Close the connection (the runtime forgets the plugin) and wait until it is down."""
        self._writer.close()
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.closed.done():
            await self._end("closed by runtime-hooks")
