"""Our runtime hook API against Koordinator's: same wire layout, and live calls both ways.

Koordinator's proto (tests/data/koordinator/api.proto, a verbatim upstream copy) is
compiled here with grpc_tools.protoc. Its package is also ``runtime.v1alpha1``, so it
cannot share the default descriptor pool with ours: the layout checks load it into a
private DescriptorPool, and the live calls run its generated stubs in a subprocess.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import select
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FileDescriptor
from google.protobuf.message import Message

from runtimeproxy.api.runtime.v1alpha1 import api_pb2, api_pb2_grpc

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "koordinator" / "api.proto"
# Git blob id of apis/runtime/v1alpha1/api.proto in koordinator-sh/koordinator v1.8.0
# (commit 989ca85c62abcca92b303aa12fd2ccff2ed30fed); the file is unchanged since v0.7.0.
FIXTURE_BLOB = "53f8c6fc3d27d408966f2e8518a2a86ec85b7555"
PACKAGE = "runtime.v1alpha1"
SERVICE = "RuntimeHookService"

# Everything we add on top of Koordinator's API. Pinned so that nothing is renumbered.
EXTENSION_MESSAGES = {"KeyValue"}
EXTENSION_FIELDS = {
    "PodSandboxHookRequest": {"pod_sandbox_id": 8},
    "ContainerResourceHookRequest": {
        "container_env_list": 10,
        "pod_sandbox_id": 11,
        "runtime_handler": 12,
        "pod_overhead": 13,
    },
    "ContainerResourceHookResponse": {"container_env_list": 5},
}
_SANDBOX = ("PodSandboxHookRequest", "PodSandboxHookResponse")
_CONTAINER = ("ContainerResourceHookRequest", "ContainerResourceHookResponse")
KOORDINATOR_RPCS = {
    "PreRunPodSandboxHook": _SANDBOX,
    "PostStopPodSandboxHook": _SANDBOX,
    "PreCreateContainerHook": _CONTAINER,
    "PreStartContainerHook": _CONTAINER,
    "PostStartContainerHook": _CONTAINER,
    "PostStopContainerHook": _CONTAINER,
    "PreUpdateContainerResourcesHook": _CONTAINER,
}
EXTENSION_RPCS = {
    "PreRemovePodSandboxHook": _SANDBOX,
    "PostRemovePodSandboxHook": _SANDBOX,
    "PreUpdatePodSandboxResourcesHook": _SANDBOX,
    "PostCreateContainerHook": _CONTAINER,
    "PreStopContainerHook": _CONTAINER,
    "PostUpdateContainerResourcesHook": _CONTAINER,
}


@dataclass(frozen=True)
class Koordinator:
    """Koordinator's proto compiled into `gen_dir` (api_pb2.py, api_pb2_grpc.py)."""

    gen_dir: Path
    file_proto: descriptor_pb2.FileDescriptorProto
    side_script: Path


@pytest.fixture(scope="module")
def koord(tmp_path_factory: pytest.TempPathFactory) -> Koordinator:
    out = tmp_path_factory.mktemp("koordinator")
    descriptor_set = out / "api.binpb"
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{FIXTURE.parent}",
        f"--python_out={out}", f"--grpc_python_out={out}",
        f"--descriptor_set_out={descriptor_set}", FIXTURE.name,
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    (file_proto,) = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes()).file
    script = out / "koordinator_side.py"
    script.write_text(KOORDINATOR_SIDE)
    return Koordinator(out, file_proto, script)


@pytest.fixture(scope="module")
def theirs(koord: Koordinator) -> FileDescriptor:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(koord.file_proto)
    return pool.FindFileByName(koord.file_proto.name)


ours: FileDescriptor = api_pb2.DESCRIPTOR


def _short(full_name: str) -> str:
    return full_name.removeprefix(PACKAGE + ".")


def _messages(file: FileDescriptor) -> dict[str, Descriptor]:
    """Every message of the file, nested ones (map entries) included, by package-relative name."""
    out: dict[str, Descriptor] = {}

    def walk(d: Descriptor) -> None:
        out[_short(d.full_name)] = d
        for nested in d.nested_types:
            walk(nested)

    for d in file.message_types_by_name.values():
        walk(d)
    return out


def _enums(file: FileDescriptor) -> dict[str, EnumDescriptor]:
    enums = list(file.enum_types_by_name.values())
    enums += [e for d in _messages(file).values() for e in d.enum_types]
    return {_short(e.full_name): e for e in enums}


def _as_proto(d: Descriptor) -> descriptor_pb2.DescriptorProto:
    proto = descriptor_pb2.DescriptorProto()
    d.CopyToProto(proto)
    return proto


# --- (a) the wire layout ---------------------------------------------------------------------


def test_fixture_is_upstream_koordinator() -> None:
    data = FIXTURE.read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
    assert blob == FIXTURE_BLOB, "tests/data/koordinator/api.proto is not the pinned upstream file"
    assert b"Licensed under the Apache License, Version 2.0" in data


def test_package_and_syntax(theirs: FileDescriptor) -> None:
    assert theirs.package == ours.package == PACKAGE
    ours_proto = descriptor_pb2.FileDescriptorProto()
    ours.CopyToProto(ours_proto)
    assert ours_proto.syntax == "proto3" == theirs_syntax(theirs)
    assert not ours_proto.dependency, "the hook API must stay self-contained, like Koordinator's"


def theirs_syntax(file: FileDescriptor) -> str:
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    return proto.syntax


_FIELD_ATTRS = ("number", "label", "type", "type_name", "proto3_optional", "options")


def test_every_koordinator_message_and_field(theirs: FileDescriptor) -> None:
    their_messages, our_messages = _messages(theirs), _messages(ours)
    assert len(their_messages) == 19  # 8 messages and 11 map entries in Koordinator's file
    problems: list[str] = []
    for name, their_desc in their_messages.items():
        if name not in our_messages:
            problems.append(f"message {name} missing")
            continue
        their, our = _as_proto(their_desc), _as_proto(our_messages[name])
        if their.options != our.options:
            problems.append(f"{name}: options {their.options} != {our.options}")
        if {o.name for o in their.oneof_decl} != {o.name for o in our.oneof_decl}:
            problems.append(f"{name}: oneofs differ")
        our_fields = {f.name: f for f in our.field}
        for tf in their.field:
            of = our_fields.get(tf.name)
            if of is None:
                problems.append(f"{name}.{tf.name} missing")
                continue
            for attr in _FIELD_ATTRS:
                if getattr(tf, attr) != getattr(of, attr):
                    problems.append(
                        f"{name}.{tf.name}: {attr} {getattr(tf, attr)!r} != {getattr(of, attr)!r}"
                    )
            if tf.HasField("oneof_index") != of.HasField("oneof_index"):
                problems.append(f"{name}.{tf.name}: oneof membership differs")
    assert not problems, "\n".join(problems)


def test_every_koordinator_enum(theirs: FileDescriptor) -> None:
    # Koordinator's file declares no enums today; this keeps that true for ours if it changes.
    our_enums = _enums(ours)
    for name, their_enum in _enums(theirs).items():
        assert name in our_enums, name
        their_values = {v.name: v.number for v in their_enum.values}
        assert {v.name: v.number for v in our_enums[name].values} == their_values


def test_every_koordinator_rpc(theirs: FileDescriptor) -> None:
    their_service = theirs.services_by_name[SERVICE]
    our_service = ours.services_by_name[SERVICE]
    assert list(theirs.services_by_name) == [SERVICE]
    their_rpcs = {
        m.name: (_short(m.input_type.full_name), _short(m.output_type.full_name))
        for m in their_service.methods
    }
    assert their_rpcs == KOORDINATOR_RPCS
    for m in their_service.methods:
        mine = our_service.methods_by_name[m.name]
        assert mine.input_type.full_name == m.input_type.full_name, m.name
        assert mine.output_type.full_name == m.output_type.full_name, m.name
        assert (mine.client_streaming, mine.server_streaming) == (
            m.client_streaming,
            m.server_streaming,
        ), m.name


def test_extensions_are_pure_additions(theirs: FileDescriptor) -> None:
    their_messages, our_messages = _messages(theirs), _messages(ours)
    added = {n for n in our_messages if n not in their_messages}
    assert {n for n in added if "." not in n} == EXTENSION_MESSAGES  # top-level ones
    for name, desc in our_messages.items():
        if name in added:
            continue
        known = {f.name for f in their_messages[name].fields}
        extra = {f.name: f.number for f in desc.fields if f.name not in known}
        assert extra == EXTENSION_FIELDS.get(name, {}), name
        if extra:  # added after Koordinator's numbers, never in between
            assert min(extra.values()) > max(f.number for f in their_messages[name].fields)
    our_rpcs = {
        m.name: (_short(m.input_type.full_name), _short(m.output_type.full_name))
        for m in ours.services_by_name[SERVICE].methods
    }
    assert our_rpcs == KOORDINATOR_RPCS | EXTENSION_RPCS
    assert [m.name for m in ours.services_by_name[SERVICE].methods][:7] == list(KOORDINATOR_RPCS)
    assert not any(m.client_streaming or m.server_streaming
                   for m in ours.services_by_name[SERVICE].methods)  # fmt: skip


# --- (b) live calls across the two implementations ---------------------------------------------

# Runs Koordinator's generated stubs only (never runtimeproxy's), in its own interpreter.
#   koordinator_side.py GEN_DIR serve          grpc.aio hook server; prints its port, stops at EOF
#   koordinator_side.py GEN_DIR call ADDRESS   stdin: [{method, request}], stdout: results
# The server answers like koordlet does (it echoes the request's fields into the response) and
# adds two annotations: ECHO, the request as it re-encodes it (unknown fields included), and
# SEEN, the request's fields as it decoded them.
KOORDINATOR_SIDE = """\
import asyncio
import base64
import json
import sys

sys.path.insert(0, sys.argv[1])

import api_pb2
import api_pb2_grpc
import grpc
from google.protobuf import json_format

ECHO, SEEN = "x-test-echo", "x-test-seen"
SERVICE = api_pb2.DESCRIPTOR.services_by_name["RuntimeHookService"]


def view(msg):
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def reply(req):
    notes = {
        ECHO: base64.b64encode(req.SerializeToString()).decode(),
        SEEN: json.dumps(view(req), sort_keys=True),
    }
    if isinstance(req, api_pb2.PodSandboxHookRequest):
        return api_pb2.PodSandboxHookResponse(
            labels=dict(req.labels),
            annotations={**req.annotations, **notes},
            cgroup_parent=req.cgroup_parent,
            resources=req.resources if req.HasField("resources") else None,
        )
    resources = req.container_resources if req.HasField("container_resources") else None
    return api_pb2.ContainerResourceHookResponse(
        container_annotations={**req.container_annotations, **notes},
        container_resources=resources,
        pod_cgroup_parent=req.pod_cgroup_parent,
        container_envs=dict(req.container_envs),
    )


class Servicer(api_pb2_grpc.RuntimeHookServiceServicer):
    pass


async def _handle(self, request, context):
    return reply(request)


for _method in SERVICE.methods:
    setattr(Servicer, _method.name, _handle)


async def serve():
    server = grpc.aio.server()
    api_pb2_grpc.add_RuntimeHookServiceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)


async def call(address):
    results = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_pb2_grpc.RuntimeHookServiceStub(channel)
        for item in json.load(sys.stdin):
            method = SERVICE.methods_by_name[item["method"]]
            request = getattr(api_pb2, method.input_type.name)()
            json_format.ParseDict(item["request"], request)
            response = await getattr(stub, method.name)(request, timeout=30)
            results.append({
                "method": method.name,
                "response": view(response),
                "raw": base64.b64encode(response.SerializeToString()).decode(),
            })
    json.dump(results, sys.stdout)


if sys.argv[2] == "serve":
    asyncio.run(serve())
else:
    asyncio.run(call(sys.argv[3]))
"""
ECHO, SEEN = "x-test-echo", "x-test-seen"


def _view(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def _resources(base: int) -> api_pb2.LinuxContainerResources:
    return api_pb2.LinuxContainerResources(
        cpu_period=100_000 + base,
        cpu_quota=-1 if base == 0 else 50_000 * base,
        cpu_shares=1024 + base,
        memory_limit_in_bytes=(1 << 30) * (base + 1),
        oom_score_adj=-997 + base,
        cpuset_cpus=f"{base}-{base + 3},{base + 8}",
        cpuset_mems=str(base % 2),
        hugepage_limits=[
            api_pb2.HugepageLimit(page_size="2MB", limit=(2 << 20) * (base + 4)),
            api_pb2.HugepageLimit(page_size="1GB", limit=(1 << 30) * (base + 1)),
        ],
        unified={"memory.high": str((1 << 29) * (base + 1)), "io.weight": f"default {base + 1}"},
        memory_swap_limit_in_bytes=(1 << 31) * (base + 1),
    )


def sandbox_request() -> api_pb2.PodSandboxHookRequest:
    """Every field set, Koordinator's and ours."""
    return api_pb2.PodSandboxHookRequest(
        pod_meta=api_pb2.PodSandboxMetadata(
            name="web-0", uid="3f1c9a6e-0d5b-4c1e-9a77-1b2c3d4e5f60", namespace="shop", attempt=2
        ),
        runtime_handler="kata",
        labels={"app": "web", "io.kubernetes.pod.name": "web-0"},
        annotations={"koordinator.sh/qosClass": "LS", "note": "ünïcödé ✓"},
        cgroup_parent="/kubepods/burstable/pod3f1c9a6e",
        overhead=_resources(1),
        resources=_resources(2),
        pod_sandbox_id="b7e0f3a1c2d4",
    )


def container_request() -> api_pb2.ContainerResourceHookRequest:
    """Every field set, Koordinator's and ours; the env list has order and a duplicate."""
    sandbox = sandbox_request()
    return api_pb2.ContainerResourceHookRequest(
        pod_meta=sandbox.pod_meta,
        container_meta=api_pb2.ContainerMetadata(name="nginx", attempt=1, id="c0ffee42"),
        container_annotations={"io.kubernetes.container.hash": "9f3b"},
        container_resources=_resources(0),
        pod_resources=sandbox.resources,
        pod_annotations=dict(sandbox.annotations),
        pod_labels=dict(sandbox.labels),
        pod_cgroup_parent=sandbox.cgroup_parent,
        container_envs={"PATH": "/usr/bin:/bin", "MODE": "late"},
        container_env_list=[
            api_pb2.KeyValue(key="PATH", value=b"/usr/bin:/bin"),
            api_pb2.KeyValue(key="MODE", value=b"early"),
            api_pb2.KeyValue(key="MODE", value=b"late"),
        ],
        pod_sandbox_id=sandbox.pod_sandbox_id,
        runtime_handler=sandbox.runtime_handler,
        pod_overhead=sandbox.overhead,
    )


def _request(rpc: str) -> api_pb2.PodSandboxHookRequest | api_pb2.ContainerResourceHookRequest:
    if (KOORDINATOR_RPCS | EXTENSION_RPCS)[rpc] == _SANDBOX:
        return sandbox_request()
    return container_request()


def _koordinator_view(msg: Message) -> Message:
    """`msg` with our extension fields cleared: what a Koordinator peer can decode."""
    out = type(msg)()
    out.CopyFrom(msg)
    for name in EXTENSION_FIELDS.get(msg.DESCRIPTOR.name, {}):
        out.ClearField(name)
    return out


def _unset(msg: Message, prefix: str = "") -> list[str]:
    """Fields of `msg` (recursively) still at their default: a sample must have none."""
    missing: list[str] = []
    for f in msg.DESCRIPTOR.fields:
        name, value = prefix + f.name, getattr(msg, f.name)
        if f.is_repeated:  # maps too
            if not len(value):
                missing.append(name)
            elif f.message_type is not None and not f.message_type.GetOptions().map_entry:
                for i, item in enumerate(value):
                    missing += _unset(item, f"{name}[{i}].")
        elif f.message_type is not None:
            missing += _unset(value, name + ".") if msg.HasField(f.name) else [name]
        elif value == f.default_value:
            missing.append(name)
    return missing


def test_samples_set_every_field() -> None:
    assert _unset(sandbox_request()) == []
    assert _unset(container_request()) == []


@pytest.fixture(scope="module")
def koordinator_server(
    koord: Koordinator, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Address of a grpc.aio server built from Koordinator's stubs, in a subprocess."""
    stderr_path = tmp_path_factory.mktemp("koordinator-server") / "stderr"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(koord.side_script), str(koord.gen_dir), "serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        assert line.strip().isdigit(), f"server did not start: {stderr_path.read_text()}"
        yield f"127.0.0.1:{line.strip()}"
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("rpc", list(KOORDINATOR_RPCS))
async def test_our_client_their_server(koordinator_server: str, rpc: str) -> None:
    request = _request(rpc)
    async with grpc.aio.insecure_channel(koordinator_server) as channel:
        stub = api_pb2_grpc.RuntimeHookServiceStub(channel)  # type: ignore[no-untyped-call]
        response = await getattr(stub, rpc)(request, timeout=30)
    if isinstance(response, api_pb2.PodSandboxHookResponse):
        notes = response.annotations
    else:
        notes = response.container_annotations
    echo, seen = notes.pop(ECHO), json.loads(notes.pop(SEEN))
    # Koordinator's decoder saw every one of its fields exactly as we sent them ...
    assert seen == _view(_koordinator_view(request))
    # ... and carried our extension fields through as unknown fields.
    assert type(request).FromString(base64.b64decode(echo)) == request

    if isinstance(request, api_pb2.PodSandboxHookRequest):
        assert isinstance(response, api_pb2.PodSandboxHookResponse)
        assert dict(response.labels) == dict(request.labels)
        assert dict(response.annotations) == dict(request.annotations)
        assert response.cgroup_parent == request.cgroup_parent
        assert response.resources == request.resources
    else:
        assert isinstance(response, api_pb2.ContainerResourceHookResponse)
        assert dict(response.container_annotations) == dict(request.container_annotations)
        assert response.container_resources == request.container_resources
        assert response.pod_cgroup_parent == request.pod_cgroup_parent
        assert dict(response.container_envs) == dict(request.container_envs)
        assert not response.container_env_list  # a Koordinator server cannot set it


@pytest.mark.parametrize("rpc", list(EXTENSION_RPCS))
async def test_their_server_lacks_extension_rpcs(koordinator_server: str, rpc: str) -> None:
    async with grpc.aio.insecure_channel(koordinator_server) as channel:
        stub = api_pb2_grpc.RuntimeHookServiceStub(channel)  # type: ignore[no-untyped-call]
        call = getattr(stub, rpc)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(_request(rpc), timeout=30)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def _our_reply(request: Message) -> Message:
    """Our hook server's answer: every response field set, our extension included."""
    if isinstance(request, api_pb2.PodSandboxHookRequest):
        return api_pb2.PodSandboxHookResponse(
            labels={**request.labels, "added": "yes"},
            annotations={**request.annotations, "hooked": "true"},
            cgroup_parent=request.cgroup_parent + "/hooked",
            resources=_resources(5),
        )
    assert isinstance(request, api_pb2.ContainerResourceHookRequest)
    envs = sorted(request.container_envs.items())
    return api_pb2.ContainerResourceHookResponse(
        container_annotations={**request.container_annotations, "hooked": "true"},
        container_resources=_resources(6),
        pod_cgroup_parent=request.pod_cgroup_parent + "/hooked",
        container_envs={**request.container_envs, "HOOKED": "1"},
        container_env_list=[api_pb2.KeyValue(key=k, value=v.encode()) for k, v in envs],
    )


class _OurServer(api_pb2_grpc.RuntimeHookServiceServicer):
    def __init__(self) -> None:
        self.received: dict[str, Message] = {}


def _recording(rpc: str) -> Any:
    async def handle(self: _OurServer, request: Message, context: Any) -> Message:
        self.received[rpc] = request
        return _our_reply(request)

    return handle


for _rpc in (*KOORDINATOR_RPCS, *EXTENSION_RPCS):
    setattr(_OurServer, _rpc, _recording(_rpc))


async def test_their_client_our_server(koord: Koordinator) -> None:
    # Their client builds each request from Koordinator's fields, via its own message classes.
    sent = {rpc: _view(_koordinator_view(_request(rpc))) for rpc in KOORDINATOR_RPCS}
    calls = [{"method": rpc, "request": request} for rpc, request in sent.items()]
    servicer = _OurServer()
    server = grpc.aio.server()
    api_pb2_grpc.add_RuntimeHookServiceServicer_to_server(  # type: ignore[no-untyped-call]
        servicer, server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(koord.side_script), str(koord.gen_dir), "call", f"127.0.0.1:{port}",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(json.dumps(calls).encode()), 90)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
    finally:
        await server.stop(None)
    assert proc.returncode == 0, err.decode()
    results = {r["method"]: r for r in json.loads(out)}
    assert sorted(results) == sorted(KOORDINATOR_RPCS)

    for rpc, result in results.items():
        request = servicer.received[rpc]
        # Every field their client set arrived, field by field; our extensions stayed empty.
        assert _view(request) == sent[rpc], rpc
        assert _view(_koordinator_view(request)) == _view(request), rpc
        expected = _our_reply(request)
        # Their client decoded every Koordinator field of our answer ...
        assert result["response"] == _view(_koordinator_view(expected)), rpc
        # ... and kept our extension field (container_env_list) as an unknown field.
        raw = base64.b64decode(result["raw"])
        assert type(expected).FromString(raw) == expected, rpc
