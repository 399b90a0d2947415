"""The CRI proto, its generated modules, and the wire details the proxy relies on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor as _d
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.api import generate
from runtimeproxy.api.runtime.v1 import api_pb2, api_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "runtimeproxy" / "api"


def _run_generator(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "runtimeproxy.api.generate", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)


def _tree(root: Path) -> dict[Path, bytes]:
    names = ("__init__.py", *generate.SUFFIXES)
    return {
        p.relative_to(root): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name.endswith(names) and p.parent != root
    }


# --- (a) generated code is up to date --------------------------------------------------


def test_checked_in_modules_match_fresh_generation(tmp_path: Path) -> None:
    result = _run_generator("--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    fresh, checked_in = _tree(tmp_path), _tree(OUT)
    assert sorted(fresh) == sorted(checked_in)
    stale = [str(rel) for rel in fresh if fresh[rel] != checked_in[rel]]
    assert not stale, (
        f"stale generated files {stale}: run `python -m runtimeproxy.api.generate` "
        "(a different grpcio-tools version also changes the output)"
    )
    assert Path("runtime/v1/api_pb2.py") in fresh


def test_generation_is_deterministic() -> None:
    assert generate.generate(REPO / "api") == generate.generate(REPO / "api")


def test_check_flag(tmp_path: Path) -> None:
    assert _run_generator("--out", str(tmp_path)).returncode == 0
    assert _run_generator("--check", "--out", str(tmp_path)).returncode == 0
    (tmp_path / "runtime/v1/api_pb2.py").write_text("# edited\n")
    (tmp_path / "runtime/v1/gone_pb2.py").write_text("# orphan\n")
    result = _run_generator("--check", "--out", str(tmp_path))
    assert result.returncode == 1
    assert "api_pb2.py" in result.stderr
    assert "gone_pb2.py" in result.stderr
    assert "api_pb2_grpc.py" not in result.stderr
    assert (tmp_path / "runtime/v1/api_pb2.py").read_text() == "# edited\n"


def test_generated_imports_are_relative() -> None:
    grpc_src = (OUT / "runtime/v1/api_pb2_grpc.py").read_text()
    assert "from . import api_pb2 as" in grpc_src
    assert "from runtime" not in grpc_src
    assert api_pb2.CreateContainerRequest.__module__ == api_pb2.__name__
    assert "runtime" not in sys.modules


# --- (b) field numbers the proxy depends on -----------------------------------------------

_SCALARS = {
    _d.FieldDescriptor.TYPE_INT64: "int64",
    _d.FieldDescriptor.TYPE_INT32: "int32",
    _d.FieldDescriptor.TYPE_UINT32: "uint32",
    _d.FieldDescriptor.TYPE_UINT64: "uint64",
    _d.FieldDescriptor.TYPE_STRING: "string",
    _d.FieldDescriptor.TYPE_BOOL: "bool",
}


def _type(f: Any) -> str:  # a FieldDescriptor (the stubs type .fields as a union)
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key, value = (_type(x) for x in f.message_type.fields)
        return f"map<{key}, {value}>"
    name = f.message_type.name if f.message_type else f.enum_type.name if f.enum_type else None
    base = name or _SCALARS[f.type]
    return f"repeated {base}" if f.is_repeated else base


def _fields(message: type[Message]) -> dict[str, tuple[int, str]]:
    return {f.name: (f.number, _type(f)) for f in message.DESCRIPTOR.fields}


LINUX_RESOURCES = {
    "cpu_period": (1, "int64"),
    "cpu_quota": (2, "int64"),
    "cpu_shares": (3, "int64"),
    "memory_limit_in_bytes": (4, "int64"),
    "oom_score_adj": (5, "int64"),
    "cpuset_cpus": (6, "string"),
    "cpuset_mems": (7, "string"),
    "hugepage_limits": (8, "repeated HugepageLimit"),
    "unified": (9, "map<string, string>"),
    "memory_swap_limit_in_bytes": (10, "int64"),
}


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            api_pb2.CreateContainerRequest,
            {
                "pod_sandbox_id": (1, "string"),
                "config": (2, "ContainerConfig"),
                "sandbox_config": (3, "PodSandboxConfig"),
            },
        ),
        (
            api_pb2.RunPodSandboxRequest,
            {"config": (1, "PodSandboxConfig"), "runtime_handler": (2, "string")},
        ),
        (
            api_pb2.UpdateContainerResourcesRequest,
            {
                "container_id": (1, "string"),
                "linux": (2, "LinuxContainerResources"),
                "windows": (3, "WindowsContainerResources"),
                "annotations": (4, "map<string, string>"),
            },
        ),
        (
            api_pb2.UpdatePodSandboxResourcesRequest,
            {
                "pod_sandbox_id": (1, "string"),
                "overhead": (2, "LinuxContainerResources"),
                "resources": (3, "LinuxContainerResources"),
            },
        ),
        (
            api_pb2.PodSandboxConfig,
            {
                "metadata": (1, "PodSandboxMetadata"),
                "hostname": (2, "string"),
                "log_directory": (3, "string"),
                "dns_config": (4, "DNSConfig"),
                "port_mappings": (5, "repeated PortMapping"),
                "labels": (6, "map<string, string>"),
                "annotations": (7, "map<string, string>"),
                "linux": (8, "LinuxPodSandboxConfig"),
                "windows": (9, "WindowsPodSandboxConfig"),
            },
        ),
        (
            api_pb2.LinuxPodSandboxConfig,
            {
                "cgroup_parent": (1, "string"),
                "security_context": (2, "LinuxSandboxSecurityContext"),
                "sysctls": (3, "map<string, string>"),
                "overhead": (4, "LinuxContainerResources"),
                "resources": (5, "LinuxContainerResources"),
            },
        ),
        (
            api_pb2.PodSandboxMetadata,
            {
                "name": (1, "string"),
                "uid": (2, "string"),
                "namespace": (3, "string"),
                "attempt": (4, "uint32"),
            },
        ),
        (
            api_pb2.LinuxContainerConfig,
            {
                "resources": (1, "LinuxContainerResources"),
                "security_context": (2, "LinuxContainerSecurityContext"),
            },
        ),
        (api_pb2.LinuxContainerResources, LINUX_RESOURCES),
        (api_pb2.HugepageLimit, {"page_size": (1, "string"), "limit": (2, "uint64")}),
        (api_pb2.ContainerMetadata, {"name": (1, "string"), "attempt": (2, "uint32")}),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)
def test_complete_field_layout(
    message: type[Message], expected: dict[str, tuple[int, str]]
) -> None:
    assert _fields(message) == expected


def test_container_config_fields() -> None:
    fields = _fields(api_pb2.ContainerConfig)
    assert fields["metadata"] == (1, "ContainerMetadata")
    assert fields["image"] == (2, "ImageSpec")
    assert fields["envs"] == (6, "repeated KeyValue")
    assert fields["mounts"] == (7, "repeated Mount")
    assert fields["devices"] == (8, "repeated Device")
    assert fields["labels"] == (9, "map<string, string>")
    assert fields["annotations"] == (10, "map<string, string>")
    assert fields["linux"] == (15, "LinuxContainerConfig")
    assert fields["windows"] == (16, "WindowsContainerConfig")
    assert fields["CDI_devices"] == (17, "repeated CDIDevice")


def test_container_status_resources() -> None:
    assert _fields(api_pb2.ContainerStatus)["resources"] == (16, "ContainerResources")
    assert _fields(api_pb2.ContainerResources) == {
        "linux": (1, "LinuxContainerResources"),
        "windows": (2, "WindowsContainerResources"),
    }


def test_resources_wire_bytes() -> None:
    # Hand-encoded: field 2 (cpu_quota) varint 50000, field 6 (cpuset_cpus) "0-3".
    msg = api_pb2.LinuxContainerResources(cpu_quota=50000, cpuset_cpus="0-3")
    assert msg.SerializeToString() == b"\x10\xd0\x86\x03" + b"\x32\x030-3"


# --- (c) services and streaming -------------------------------------------------------------

UPSTREAM_RUNTIME_RPCS = [
    "Version", "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "PodSandboxStatus",
    "ListPodSandbox", "StreamPodSandboxes", "CreateContainer", "StartContainer", "StopContainer",
    "RemoveContainer", "ListContainers", "StreamContainers", "ContainerStatus",
    "UpdateContainerResources", "ReopenContainerLog", "ExecSync", "Exec", "Attach", "PortForward",
    "ContainerStats", "ListContainerStats", "StreamContainerStats", "PodSandboxStats",
    "ListPodSandboxStats", "StreamPodSandboxStats", "UpdateRuntimeConfig", "Status",
    "CheckpointContainer", "CheckpointPod", "RestorePod", "GetContainerEvents",
    "ListMetricDescriptors", "ListPodSandboxMetrics", "StreamPodSandboxMetrics", "RuntimeConfig",
    "UpdatePodSandboxResources",
]  # fmt: skip
UPSTREAM_IMAGE_RPCS = [
    "ListImages", "StreamImages", "ImageStatus", "PullImage", "RemoveImage", "ImageFsInfo",
]  # fmt: skip
UPSTREAM_SERVER_STREAMING = {
    "/runtime.v1.RuntimeService/StreamPodSandboxes",
    "/runtime.v1.RuntimeService/StreamContainers",
    "/runtime.v1.RuntimeService/StreamContainerStats",
    "/runtime.v1.RuntimeService/StreamPodSandboxStats",
    "/runtime.v1.RuntimeService/GetContainerEvents",
    "/runtime.v1.RuntimeService/StreamPodSandboxMetrics",
    "/runtime.v1.ImageService/StreamImages",
}


def _methods() -> list[_d.MethodDescriptor]:
    services = api_pb2.DESCRIPTOR.services_by_name.values()
    return [m for s in services for m in s.methods]


def test_services_and_rpcs() -> None:
    services = api_pb2.DESCRIPTOR.services_by_name
    assert sorted(services) == ["ImageService", "RuntimeService"]
    assert [m.name for m in services["RuntimeService"].methods] == UPSTREAM_RUNTIME_RPCS
    assert [m.name for m in services["ImageService"].methods] == UPSTREAM_IMAGE_RPCS


def test_server_streaming_set() -> None:
    streaming = {f"/{m.containing_service.full_name}/{m.name}" for m in _methods()
                 if m.server_streaming}  # fmt: skip
    assert streaming == UPSTREAM_SERVER_STREAMING
    assert not [m.name for m in _methods() if m.client_streaming]


def test_streaming_method_types() -> None:
    m = api_pb2.DESCRIPTOR.services_by_name["RuntimeService"].methods_by_name
    assert m["GetContainerEvents"].input_type.name == "GetEventsRequest"
    assert m["GetContainerEvents"].output_type.name == "ContainerEventResponse"
    assert m["StreamContainers"].output_type.name == "StreamContainersResponse"


def test_grpc_stubs_exist() -> None:
    for name in ("RuntimeServiceStub", "RuntimeServiceServicer", "ImageServiceStub",
                 "ImageServiceServicer", "add_RuntimeServiceServicer_to_server"):  # fmt: skip
        assert hasattr(api_pb2_grpc, name), name


# --- (d) unknown fields survive a decode/re-encode --------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _varint(len(payload)) + payload


def test_unknown_fields_survive_round_trip() -> None:
    # Unknown fields at three depths: LinuxContainerResources, ContainerConfig and the request.
    unknown_resources = _key(77, 0) + _varint(123456789)
    unknown_config = _len_field(4242, b"future payload")
    unknown_request = _key(99, 5) + b"\x01\x02\x03\x04"  # fixed32
    resources = _key(3, 0) + _varint(1024) + unknown_resources  # cpu_shares=1024
    config = _len_field(15, _len_field(1, resources)) + unknown_config  # linux.resources
    wire = _len_field(1, b"sandbox-1") + _len_field(2, config) + unknown_request

    msg = api_pb2.CreateContainerRequest.FromString(wire)
    assert msg.pod_sandbox_id == "sandbox-1"
    assert msg.config.linux.resources.cpu_shares == 1024
    assert msg.SerializeToString() == wire

    # A hook that edits a known field must not drop the unknown ones.
    msg.config.linux.resources.cpu_shares = 2
    out = msg.SerializeToString()
    assert out != wire
    for part in (unknown_resources, unknown_config, unknown_request):
        assert part in out
    assert api_pb2.CreateContainerRequest.FromString(out).config.linux.resources.cpu_shares == 2


_KNOWN = {f.number for f in api_pb2.RunPodSandboxRequest.DESCRIPTOR.fields}


@given(
    number=st.integers(min_value=3, max_value=(1 << 29) - 1).filter(
        lambda n: n not in _KNOWN and not 19000 <= n <= 19999
    ),
    payload=st.binary(max_size=64),
    handler=st.text(max_size=16),
)
def test_unknown_field_round_trip_property(number: int, payload: bytes, handler: str) -> None:
    known = api_pb2.RunPodSandboxRequest(runtime_handler=handler).SerializeToString()
    wire = known + _len_field(number, payload)
    msg = api_pb2.RunPodSandboxRequest.FromString(wire)
    assert msg.runtime_handler == handler
    assert msg.SerializeToString() == wire
