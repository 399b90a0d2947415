"""CRI endpoint strings: ``unix:///path`` and plain ``/path`` both name a unix socket."""

from __future__ import annotations

from typing import Final

#: containerd's CRI socket where it is installed as a system service.
DEFAULT_RUNTIME_ENDPOINT: Final = "unix:///run/containerd/containerd.sock"


class EndpointError(ValueError):
    pass


def socket_path(endpoint: str) -> str:
    """The filesystem path of a unix socket endpoint."""
    value = endpoint.strip()
    if value.startswith("unix://"):
        value = value[len("unix://") :]
    elif "://" in value:
        scheme = value.split("://", 1)[0]
        raise EndpointError(f"endpoint {endpoint!r}: scheme {scheme!r} is not supported, use unix:///path")
    if not value.startswith("/"):
        raise EndpointError(f"endpoint {endpoint!r}: needs an absolute socket path (unix:///path or /path)")
    return value


def grpc_target(endpoint: str) -> str:
    """The same endpoint as a grpc channel target."""
    return "unix://" + socket_path(endpoint)
