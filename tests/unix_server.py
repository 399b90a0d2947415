"""A grpc.aio server on a unix socket that a test server class fills with its services: the
start and stop the raw-bytes server (tests/fake_runtime.py) and the hook servers
(tests/hook_servers.py) share."""

from __future__ import annotations

from typing import Self

import grpc
import grpc.aio


class UnixServer:
    """Serves what `add_services` puts on a grpc.aio server, on the unix socket ``socket``;
    `start` again after `stop` serves anew."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self._server: grpc.aio.Server | None = None

    def add_services(self, server: grpc.aio.Server) -> None:
        raise NotImplementedError

    async def start(self) -> Self:
        server = grpc.aio.server()
        self.add_services(server)
        server.add_insecure_port("unix://" + self.socket)
        await server.start()
        self._server = server
        return self

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)  # no grace: cancels hanging handlers too
