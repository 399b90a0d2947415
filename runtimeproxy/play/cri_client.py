"""A small synchronous CRI client (RuntimeService and ImageService stubs).

    with CriClient("/run/containerd/containerd.sock") as client:
        client.runtime.Version(api_pb2.VersionRequest(), timeout=client.timeout)

``endpoint`` is ``unix:///path/to.sock``, a plain filesystem path, or any
other gRPC target (``dns:///host:port``...), passed on as it is.
"""

from __future__ import annotations

import os
import socket
from types import TracebackType
from typing import Any

import grpc

from runtimeproxy.common.message_size import DEFAULT_MAX_MESSAGE_SIZE

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "CriClient", "grpc_target", "unix_socket_path", "unix_socket_served"]

DEFAULT_MAX_MESSAGE_BYTES = DEFAULT_MAX_MESSAGE_SIZE


def grpc_target(endpoint: str) -> str:
    """The gRPC target for an endpoint: a path becomes ``unix://<absolute path>``."""
    if not endpoint:
        raise ValueError("empty CRI endpoint")
    if endpoint.startswith(("unix:", "unix-abstract:")) or "://" in endpoint:
        return endpoint
    return "unix://" + os.path.abspath(endpoint)


def unix_socket_path(endpoint: str) -> str | None:
    """The filesystem path of a unix-socket endpoint; None for other targets (abstract included)."""
    target = grpc_target(endpoint)
    for prefix in ("unix://", "unix:"):
        if target.startswith(prefix):  # "unix-abstract:" does not match
            return target.removeprefix(prefix)
    return None


def unix_socket_served(endpoint: str) -> bool | None:
    """Whether something accepts connections on the endpoint's socket; None when the endpoint
    is no unix socket path (nothing to check without speaking its protocol)."""
    path = unix_socket_path(endpoint)
    if path is None:
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:  # missing, not a socket, refused (no listener), no permission
            return False
    return True


class CriClient:
    """One insecure channel with a RuntimeService and an ImageService stub.

    ``timeout`` is the per-call deadline callers are expected to pass
    (``timeout=client.timeout``); the stubs themselves have none.
    """

    def __init__(
        self,
        endpoint: str,
        timeout: float = 30.0,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        options: list[tuple[str, Any]] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.target = grpc_target(endpoint)
        self.timeout = timeout
        channel_options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        channel_options.extend(options or [])
        self.channel = grpc.insecure_channel(self.target, options=channel_options)
        # Imported here: the proxy daemon uses this module's helpers only, and the generated
        # stubs cost it about 2.7 MiB.
        from runtimeproxy.api.runtime.v1 import api_pb2_grpc

        stubs: Any = api_pb2_grpc  # generated without type hints
        self.runtime: Any = stubs.RuntimeServiceStub(self.channel)
        self.image: Any = stubs.ImageServiceStub(self.channel)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the channel connects; ``grpc.FutureTimeoutError`` otherwise."""
        grpc.channel_ready_future(self.channel).result(timeout=self.timeout if timeout is None else timeout)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> CriClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CriClient({self.endpoint!r}, timeout={self.timeout!r})"
