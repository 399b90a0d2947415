"""Whether a CRI endpoint serves: a Version call through its socket, answered.

`runtime-proxy install` switches kubelet over only once the proxy answers one: an answer means the
proxy listens, relays, and reaches the runtime behind it. Made with the project's own gRPC client
(runtimeproxy.wire), so a node install needs no grpcio.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from runtimeproxy.api.runtime.v1 import api_pb2
from runtimeproxy.common.message_size import DEFAULT_MAX_MESSAGE_SIZE
from runtimeproxy.wire.grpc_client import H2Channel, RpcError

__all__ = ["VERSION_METHOD", "NotServing", "cri_version", "wait_until_serving"]

VERSION_METHOD = "/runtime.v1.RuntimeService/Version"
_CALL_TIMEOUT_S = 5.0


class NotServing(RuntimeError):
    """No answer within the time given; the message carries the last error."""


async def _version(socket: Path, timeout: float) -> str:
    channel = H2Channel(str(socket), max_message_size=DEFAULT_MAX_MESSAGE_SIZE)
    try:
        request = api_pb2.VersionRequest(version="v1").SerializeToString()
        reply = api_pb2.VersionResponse.FromString(await channel.unary(VERSION_METHOD, request, timeout))
    finally:
        await channel.close()
    return f"{reply.runtime_name} {reply.runtime_version}"


def cri_version(socket: Path, timeout: float = _CALL_TIMEOUT_S) -> str:
    """The runtime's name and version, answered through `socket`; RpcError if not answered."""
    return asyncio.run(_version(socket, timeout))


def wait_until_serving(socket: Path, timeout: float, interval: float = 0.5) -> str:
    """Call Version through `socket` until it is answered (its runtime name and version) or
    `timeout` seconds have passed (NotServing with the last error)."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            return cri_version(socket, max(0.1, min(_CALL_TIMEOUT_S, remaining)))
        except RpcError as exc:
            last = f"{exc.code().name}: {exc.details()}"
        if time.monotonic() + interval >= deadline:
            raise NotServing(f"no answer to CRI Version on {socket} within {timeout:g} s (last: {last})")
        time.sleep(interval)
