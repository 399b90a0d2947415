"""What the relay knows about each gRPC method, taken from the compiled CRI descriptors.

Whether a method streams is not visible on the wire, so it comes from the descriptors.
A method they do not list (a newer kubelet) is still relayed; it is only marked unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message_factory import GetMessageClass

from runtimeproxy.api.runtime.v1 import api_pb2


@dataclass(frozen=True, slots=True)
class MethodInfo:
    path: str
    service: str
    name: str
    known: bool
    client_streaming: bool = False
    server_streaming: bool = False
    request_type: Any = None
    response_type: Any = None

    @property
    def unary(self) -> bool:
        return self.known and not (self.client_streaming or self.server_streaming)


def _split_path(path: str) -> tuple[str, str]:
    service, _, name = path.lstrip("/").rpartition("/")
    return service, name


class MethodTable:
    """Method path -> MethodInfo, for the services of one or more proto files."""

    def __init__(self, files: tuple[FileDescriptor, ...] = (api_pb2.DESCRIPTOR,)) -> None:
        self._methods: dict[str, MethodInfo] = {}
        for file in files:
            for service in file.services_by_name.values():
                for method in service.methods:
                    info = MethodInfo(
                        path=f"/{service.full_name}/{method.name}",
                        service=service.full_name,
                        name=method.name,
                        known=True,
                        client_streaming=method.client_streaming,
                        server_streaming=method.server_streaming,
                        request_type=GetMessageClass(method.input_type),
                        response_type=GetMessageClass(method.output_type),
                    )
                    self._methods[info.path] = info

    def lookup(self, path: str) -> MethodInfo:
        info = self._methods.get(path)
        if info is None:
            service, name = _split_path(path)
            info = MethodInfo(path=path, service=service, name=name, known=False)
            if len(self._methods) < 4096:  # remember a few unknown paths, not unbounded
                self._methods[path] = info
        return info

    def known(self) -> list[MethodInfo]:
        return [info for info in self._methods.values() if info.known]


# RuntimeService calls that change a pod's or container's life: the ones hooks wrap,
# and the ones the proxy logs at info.
LIFECYCLE_METHODS = frozenset(
    {
        "RunPodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "UpdatePodSandboxResources",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "RemoveContainer",
        "UpdateContainerResources",
    }
)


def is_lifecycle(method: MethodInfo) -> bool:
    return method.service == "runtime.v1.RuntimeService" and method.name in LIFECYCLE_METHODS
