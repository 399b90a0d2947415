"""The pod/container store: entries from CRI requests, removal, and the rebuild from a real
containerd's verbose statuses (what hooks receive after a proxy restart)."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Iterator
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.dispatch.store import PodStore, StoreRebuilder
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.runtime_state import (
    ContainerEntry,
    LoadResult,
    RuntimeLoader,
    SandboxEntry,
    container_from_request,
    container_from_status,
    current_resources,
    message_from_go_json,
    sandbox_from_request,
    sandbox_from_status,
)
from runtimeproxy.testbed import Containerd

# -- requests used throughout ------------------------------------------------------------------


def pod_request(uid: str = "uid-1", cgroup_parent: str = "/kubepods/podu", **extra: Any) -> pb.RunPodSandboxRequest:
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="web", uid=uid, namespace="prod", attempt=2),
        labels={"app": "web", "io.kubernetes.pod.name": "web"},
        annotations={"note": "a=b=c", "empty": ""},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            resources=pb.LinuxContainerResources(
                cpu_period=100000,
                cpu_quota=150000,
                cpu_shares=1536,
                memory_limit_in_bytes=768 << 20,
                cpuset_mems="0",
                unified={"memory.high": "700000000"},
                memory_swap_limit_in_bytes=1 << 30,
                hugepage_limits=[pb.HugepageLimit(page_size="2MB", limit=4 << 20)],
            ),
            overhead=pb.LinuxContainerResources(cpu_shares=102, memory_limit_in_bytes=64 << 20, cpu_quota=10000),
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
        ),
        **extra,
    )
    return pb.RunPodSandboxRequest(config=config, runtime_handler="runc")


ENVS = [(b"ZED", b"last-first"), (b"A", b"x=y=z"), (b"EMPTY", b""), (b"UNICODE", "é ü".encode()), (b"M", b"==")]


def app_resources(**changes: Any) -> pb.LinuxContainerResources:
    """The resources container_request's container is created with, with `changes` applied."""
    fields: dict[str, Any] = {
        "cpu_period": 100000,
        "cpu_quota": 50000,
        "cpu_shares": 512,
        "memory_limit_in_bytes": 128 << 20,
        "oom_score_adj": 1000,
        "cpuset_cpus": "0",
    }
    return pb.LinuxContainerResources(**(fields | changes))


def container_request(sandbox_id: str, image: str = "busybox:1", **extra: Any) -> pb.CreateContainerRequest:
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app", attempt=1),
        image=pb.ImageSpec(image=image),
        envs=[pb.KeyValue(key=k.decode(), value=v) for k, v in ENVS],
        labels={"io.kubernetes.container.name": "app"},
        annotations={"io.kubernetes.container.restartCount": "1", "eq": "k=v"},
        log_path="app.log",
        linux=pb.LinuxContainerConfig(resources=app_resources()),
        **extra,
    )
    return pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=pod_request().config)


# -- entries from requests -----------------------------------------------------------------------


def test_sandbox_from_request_takes_every_field() -> None:
    request = pod_request()
    entry = sandbox_from_request("s1", request)
    assert (entry.id, entry.name, entry.namespace, entry.uid, entry.attempt) == ("s1", "web", "prod", "uid-1", 2)
    assert entry.labels == {"app": "web", "io.kubernetes.pod.name": "web"}
    assert entry.annotations == {"note": "a=b=c", "empty": ""}
    assert entry.cgroup_parent == "/kubepods/podu"
    assert entry.runtime_handler == "runc"
    assert entry.resources == request.config.linux.resources
    assert entry.overhead == request.config.linux.overhead
    assert entry.config == request.config
    assert not entry.partial


def test_entries_are_copies_of_the_request() -> None:
    request = pod_request()
    entry = sandbox_from_request("s1", request)
    request.config.labels["app"] = "changed"
    request.config.linux.resources.cpu_shares = 2
    request.config.metadata.name = "changed"
    assert entry.labels["app"] == "web"
    assert entry.resources is not None and entry.resources.cpu_shares == 1536
    assert entry.config is not None and entry.config.metadata.name == "web"


def test_unset_resources_are_none() -> None:
    request = pb.RunPodSandboxRequest(config=pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p")))
    entry = sandbox_from_request("s", request)
    assert entry.resources is None and entry.overhead is None and entry.cgroup_parent == ""
    bare = container_from_request("c", pb.CreateContainerRequest(pod_sandbox_id="s"))
    assert bare.resources is None and bare.envs == [] and bare.image == ""
    # An empty but present message stays present (the runtime sees the same).
    request.config.linux.resources.SetInParent()
    assert sandbox_from_request("s", request).resources == pb.LinuxContainerResources()


def test_container_from_request_keeps_env_order_and_bytes() -> None:
    request = container_request("s1")
    entry = container_from_request("c1", request)
    assert (entry.id, entry.sandbox_id, entry.name, entry.attempt, entry.image) == ("c1", "s1", "app", 1, "busybox:1")
    assert entry.envs == [(k.decode(), v) for k, v in ENVS]
    assert entry.env_text()[3] == ("UNICODE", "é ü")
    assert entry.labels == {"io.kubernetes.container.name": "app"}
    assert entry.annotations == {"io.kubernetes.container.restartCount": "1", "eq": "k=v"}
    assert entry.resources == request.config.linux.resources
    assert entry.config == request.config


def test_store_helpers_are_the_module_functions() -> None:
    assert PodStore.sandbox_from_request("s", pod_request()) == sandbox_from_request("s", pod_request())
    assert PodStore.container_from_request("c", container_request("s")) == container_from_request(
        "c", container_request("s")
    )


# -- store semantics ---------------------------------------------------------------------------------


def filled_store() -> PodStore:
    store = PodStore()
    for sid in ("s1", "s2"):
        store.put_sandbox(sandbox_from_request(sid, pod_request(uid=sid)))
    for cid, sid in (("c1", "s1"), ("c2", "s1"), ("c3", "s2")):
        store.put_container(container_from_request(cid, container_request(sid)))
    return store


def test_remove_sandbox_drops_its_containers_only() -> None:
    store = filled_store()
    removed = store.remove_sandbox("s1")
    assert removed is not None and removed.id == "s1"
    assert store.sandbox("s1") is None
    assert store.container("c1") is None and store.container("c2") is None
    assert [c.id for c in store.containers()] == ["c3"]
    assert [s.id for s in store.sandboxes()] == ["s2"]
    assert store.containers_of("s1") == []
    assert store.remove_sandbox("s1") is None  # twice is harmless


def test_remove_container_leaves_sandbox_and_siblings() -> None:
    store = filled_store()
    assert store.remove_container("c1") is not None
    assert store.remove_container("c1") is None
    assert store.sandbox("s1") is not None
    assert [c.id for c in store.containers_of("s1")] == ["c2"]
    store.remove_sandbox("s1")
    assert [c.id for c in store.containers()] == ["c3"]


def test_removing_a_sandbox_drops_containers_known_before_it() -> None:
    store = PodStore()
    store.put_container(container_from_request("c1", container_request("s9")))
    store.remove_sandbox("s9")  # never known itself
    assert store.container("c1") is None


def test_put_container_moves_the_sandbox_index() -> None:
    store = filled_store()
    moved = container_from_request("c1", container_request("s2"))
    store.put_container(moved)
    assert [c.id for c in store.containers_of("s1")] == ["c2"]
    assert [c.id for c in store.containers_of("s2")] == ["c1", "c3"]
    store.remove_sandbox("s2")
    assert store.container("c1") is None and len(store) == 2


def test_update_resources() -> None:
    store = filled_store()
    new = pb.LinuxContainerResources(cpu_quota=20000, cpu_period=100000, cpu_shares=256, memory_limit_in_bytes=1 << 26)
    entry = store.update_container_resources("c1", new)
    assert entry is not None and entry.resources == new
    assert entry.config is not None and entry.config.linux.resources == new
    new.cpu_quota = 1  # the store holds a copy
    assert entry.resources.cpu_quota == 20000
    assert store.update_container_resources("nope", new) is None

    pod = pb.LinuxContainerResources(cpu_shares=4096)
    sandbox = store.update_sandbox_resources("s1", pod)
    assert sandbox is not None and sandbox.resources == pod
    assert sandbox.overhead == pod_request().config.linux.overhead  # unchanged without one
    overhead = pb.LinuxContainerResources(cpu_shares=7)
    sandbox = store.update_sandbox_resources("s1", None, overhead)
    assert sandbox is not None and sandbox.resources == pod and sandbox.overhead == overhead
    assert sandbox.config is not None and sandbox.config.linux.overhead == overhead
    assert store.update_sandbox_resources("nope", pod) is None


def test_adopt_keeps_known_entries_and_refuses_removed_ones() -> None:
    store = filled_store()
    live = store.sandbox("s1")
    loaded = SandboxEntry(id="s1", name="from-runtime", partial=True)
    assert store.adopt_sandbox(loaded) is live
    with store.watch_removals() as removed:
        store.remove_sandbox("s2")
        assert removed == {"s2", "c3"}
        assert store.adopt_sandbox(SandboxEntry(id="s2"), removed) is None
        assert store.adopt_container(ContainerEntry(id="c3", sandbox_id="s2"), removed) is None
        assert store.adopt_container(ContainerEntry(id="c4", sandbox_id="s2"), removed) is None  # its pod went
        fresh = ContainerEntry(id="c5", sandbox_id="s1")
        assert store.adopt_container(fresh, removed) is fresh
    assert store.sandbox("s2") is None and store.container("c3") is None and store.container("c4") is None
    assert store.watch_removals is not None and store._watchers == []


# -- Go JSON parsing ---------------------------------------------------------------------------------


def go_json(message: Any) -> Any:
    """What Go's encoding/json makes of a cri-api struct: snake_case names, enums and
    64-bit integers as numbers, env values as strings, empty fields left out (omitempty),
    present sub-messages kept even when empty (non-nil pointers)."""

    def value(fd: Any, item: Any) -> Any:
        if fd.message_type is not None:
            return go_json(item)
        return item.decode() if isinstance(item, bytes) else item

    out: dict[str, Any] = {}
    for fd, field_value in message.ListFields():
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            value_fd = fd.message_type.fields_by_name["value"]
            out[fd.name] = {k: value(value_fd, v) for k, v in field_value.items()}
        elif fd.is_repeated:
            out[fd.name] = [value(fd, item) for item in field_value]
        else:
            out[fd.name] = value(fd, field_value)
    return json.loads(json.dumps(out))


def test_go_json_of_a_container_config_parses_back() -> None:
    config = container_request("s").config
    config.linux.security_context.namespace_options.network = pb.NODE
    config.linux.security_context.run_as_user.value = 0  # a wrapper present with its zero
    config.mounts.add(container_path="/d", host_path="/h", readonly=True, propagation=pb.PROPAGATION_BIDIRECTIONAL)
    parsed = pb.ContainerConfig()
    assert message_from_go_json(go_json(config), parsed) == []
    assert parsed == config


def test_containerd_style_document_parses() -> None:
    # Shaped like containerd 1.6's info["info"]["config"] for a sandbox.
    doc = {
        "metadata": {"name": "p", "uid": "u", "namespace": "n", "attempt": 1},
        "labels": {"a": "b"},
        "linux": {
            "cgroup_parent": "/kubepods/podu",
            "security_context": {"namespace_options": {"network": 2, "pid": "CONTAINER"}},
            "overhead": {"cpu_shares": 10, "memory_limit_in_bytes": "1048576"},
            "resources": {"hugepage_limits": [{"page_size": "2MB"}], "unified": {"memory.high": "1"}},
        },
        "unknownNewField": {"x": 1},
        "hostname": None,
    }
    parsed = pb.PodSandboxConfig()
    problems = message_from_go_json(doc, parsed)
    assert problems == ["unknownNewField: no such field in runtime.v1.PodSandboxConfig"]
    assert parsed.linux.security_context.namespace_options.network == pb.NODE
    assert parsed.linux.security_context.namespace_options.pid == pb.CONTAINER
    assert parsed.linux.overhead.memory_limit_in_bytes == 1 << 20
    assert list(parsed.linux.resources.hugepage_limits) == [pb.HugepageLimit(page_size="2MB")]
    assert parsed.metadata.attempt == 1


def test_bad_values_are_skipped_and_reported() -> None:
    doc = {
        "metadata": {"name": 5, "attempt": 3},
        "envs": [{"key": "A", "value": "1"}, {"key": "B", "value": 2}, "junk"],
        "labels": {"ok": "1", "bad": ["x"]},
        "linux": {"resources": {"cpu_shares": "many", "cpu_quota": True, "cpu_period": 100000}},
        "stdin": "yes",
        "command": ["sh", 3],
    }
    parsed = pb.ContainerConfig()
    problems = message_from_go_json(doc, parsed)
    assert {p.split(":")[0] for p in problems} == {
        "metadata.name",
        "envs[1].value",
        "envs[2]",
        "labels[bad]",
        "linux.resources.cpu_shares",
        "linux.resources.cpu_quota",
        "stdin",
        "command[1]",
    }
    assert parsed.metadata.attempt == 3
    assert [(e.key, e.value) for e in parsed.envs] == [("A", b"1"), ("B", b""), ("", b"")]
    assert dict(parsed.labels) == {"ok": "1"}
    assert parsed.linux.resources.cpu_period == 100000
    assert list(parsed.command) == ["sh"]
    assert message_from_go_json([1], pb.ContainerConfig()) == [".: expected an object, got list"]


_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@settings(max_examples=150, deadline=None)
@given(
    envs=st.lists(st.tuples(_text, _text), max_size=6),
    labels=st.dictionaries(_text, _text, max_size=4),
    ints=st.lists(_int64, min_size=6, max_size=6),
    cpus=_text,
    unified=st.dictionaries(_text, _text, max_size=3),
    attempt=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_go_json_round_trip_property(
    envs: list[tuple[str, str]],
    labels: dict[str, str],
    ints: list[int],
    cpus: str,
    unified: dict[str, str],
    attempt: int,
) -> None:
    period, quota, shares, memory, oom, swap = ints
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="c", attempt=attempt),
        envs=[pb.KeyValue(key=k, value=v.encode()) for k, v in envs],
        labels=labels,
        annotations=labels,
        linux=pb.LinuxContainerConfig(
            resources=pb.LinuxContainerResources(
                cpu_period=period,
                cpu_quota=quota,
                cpu_shares=shares,
                memory_limit_in_bytes=memory,
                oom_score_adj=oom,
                cpuset_cpus=cpus,
                unified=unified,
                memory_swap_limit_in_bytes=swap,
            )
        ),
    )
    parsed = pb.ContainerConfig()
    assert message_from_go_json(go_json(config), parsed) == []
    assert parsed == config
    entry = container_from_request("c", pb.CreateContainerRequest(config=parsed))
    assert entry.envs == [(k, v.encode()) for k, v in envs]


# -- current resources (create-time config + status) -------------------------------------------------


def test_current_resources_rules() -> None:
    configured = app_resources()  # a memory limit of 1 << 27
    # containerd reports swap == limit (its default) and may have raised oom_score_adj.
    reported = app_resources(memory_swap_limit_in_bytes=1 << 27, oom_score_adj=999)
    assert current_resources(configured, reported) == configured
    # An update changed quota and memory.
    reported.cpu_quota, reported.memory_limit_in_bytes, reported.memory_swap_limit_in_bytes = 20000, 1 << 26, 1 << 26
    updated = current_resources(configured, reported)
    assert updated is not None
    assert (updated.cpu_quota, updated.memory_limit_in_bytes, updated.memory_swap_limit_in_bytes) == (20000, 1 << 26, 0)
    assert updated.oom_score_adj == 1000
    # A swap limit that was asked for, or that differs from the memory limit, is taken.
    asked = pb.LinuxContainerResources(memory_limit_in_bytes=1 << 27, memory_swap_limit_in_bytes=1 << 27)
    kept = current_resources(asked, reported)
    assert kept is not None and kept.memory_swap_limit_in_bytes == kept.memory_limit_in_bytes == 1 << 26
    reported.memory_swap_limit_in_bytes = 1 << 28
    merged = current_resources(configured, reported)
    assert merged is not None and merged.memory_swap_limit_in_bytes == 1 << 28
    # No status: the configured ones; nothing at all: None.
    assert current_resources(configured, None) == configured
    assert current_resources(None, pb.LinuxContainerResources()) is None
    # Without a config, the status alone (less the derived swap).
    alone = pb.LinuxContainerResources(cpu_shares=2, memory_limit_in_bytes=5, memory_swap_limit_in_bytes=5)
    assert current_resources(None, alone, config_known=False) == pb.LinuxContainerResources(
        cpu_shares=2, memory_limit_in_bytes=5
    )
    # A config without resources but a status with values an update set.
    assert current_resources(None, pb.LinuxContainerResources(cpu_quota=7)) == pb.LinuxContainerResources(cpu_quota=7)


def test_status_without_info_gives_a_partial_entry_and_a_warning() -> None:
    status = pb.PodSandboxStatus(
        id="s1",
        metadata=pb.PodSandboxMetadata(name="p", uid="u", namespace="n", attempt=1),
        labels={"a": "b"},
        annotations={"c": "d"},
        runtime_handler="runc",
    )
    with capture_logs() as logs:
        entry = sandbox_from_status(status, {})
        bad = sandbox_from_status(status, {"info": "{not json"})
    assert entry == SandboxEntry(
        id="s1",
        name="p",
        namespace="n",
        uid="u",
        attempt=1,
        labels={"a": "b"},
        annotations={"c": "d"},
        runtime_handler="runc",
        partial=True,
    )
    assert bad == entry
    assert [log["log_level"] for log in logs] == ["warning", "warning"]
    assert all(log["id"] == "s1" for log in logs)

    cstatus = pb.ContainerStatus(
        id="c1",
        metadata=pb.ContainerMetadata(name="app", attempt=2),
        image=pb.ImageSpec(image="img"),
        labels={"l": "1"},
        resources=pb.ContainerResources(linux=pb.LinuxContainerResources(cpu_shares=2)),
    )
    centry = container_from_status(cstatus, {"info": json.dumps({"sandboxID": "s1"})})
    assert centry == ContainerEntry(
        id="c1",
        sandbox_id="",
        name="app",
        attempt=2,
        labels={"l": "1"},
        image="img",
        resources=pb.LinuxContainerResources(cpu_shares=2),
        partial=True,
    )


# -- the loader against a scripted runtime -----------------------------------------------------------------


def rpc_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


_R = TypeVar("_R", pb.RunPodSandboxRequest, pb.CreateContainerRequest)


class ScriptedRuntime:
    """A RuntimeService stub whose answers come from the store entries it was given."""

    def __init__(self, sandboxes: list[pb.RunPodSandboxRequest], containers: list[pb.CreateContainerRequest]) -> None:
        self.sandboxes = {f"s{i}": r for i, r in enumerate(sandboxes)}
        self.containers = {f"c{i}": r for i, r in enumerate(containers)}
        self.errors: dict[str, grpc.aio.AioRpcError] = {}
        self.before_status: Any = None
        self.calls: list[str] = []

    def _find(self, table: dict[str, _R], object_id: str, kind: str) -> _R:
        """``object_id``'s request in ``table``; raises the error scripted for it, else NOT_FOUND."""
        if object_id in self.errors:
            raise self.errors[object_id]
        if object_id not in table:
            raise rpc_error(grpc.StatusCode.NOT_FOUND, f"no such {kind}")
        return table[object_id]

    async def ListPodSandbox(self, request: Any, timeout: float) -> pb.ListPodSandboxResponse:
        self.calls.append("ListPodSandbox")
        if "list" in self.errors:
            raise self.errors["list"]
        return pb.ListPodSandboxResponse(
            items=[
                pb.PodSandbox(
                    id=i,
                    metadata=r.config.metadata,
                    labels=r.config.labels,
                    annotations=r.config.annotations,
                    runtime_handler=r.runtime_handler,
                )
                for i, r in self.sandboxes.items()
            ]
        )

    async def ListContainers(self, request: Any, timeout: float) -> pb.ListContainersResponse:
        self.calls.append("ListContainers")
        wanted = request.filter.id
        return pb.ListContainersResponse(
            containers=[
                pb.Container(
                    id=i,
                    pod_sandbox_id=r.pod_sandbox_id,
                    metadata=r.config.metadata,
                    image=r.config.image,
                    labels=r.config.labels,
                    annotations=r.config.annotations,
                )
                for i, r in self.containers.items()
                if not wanted or wanted == i
            ]
        )

    async def PodSandboxStatus(self, request: Any, timeout: float) -> pb.PodSandboxStatusResponse:
        self.calls.append(f"PodSandboxStatus {request.pod_sandbox_id}")
        if self.before_status is not None:
            self.before_status(request.pod_sandbox_id)
        r = self._find(self.sandboxes, request.pod_sandbox_id, "sandbox")
        info = {"info": json.dumps({"runtimeHandler": r.runtime_handler, "config": go_json(r.config)})}
        status = pb.PodSandboxStatus(
            id=request.pod_sandbox_id,
            metadata=r.config.metadata,
            labels=r.config.labels,
            annotations=r.config.annotations,
            runtime_handler=r.runtime_handler,
        )
        return pb.PodSandboxStatusResponse(status=status, info=info)

    async def ContainerStatus(self, request: Any, timeout: float) -> pb.ContainerStatusResponse:
        self.calls.append(f"ContainerStatus {request.container_id}")
        r = self._find(self.containers, request.container_id, "container")
        info = {"info": json.dumps({"sandboxID": r.pod_sandbox_id, "config": go_json(r.config)})}
        status = pb.ContainerStatus(
            id=request.container_id,
            metadata=r.config.metadata,
            labels=r.config.labels,
            annotations=r.config.annotations,
            image=r.config.image,
        )
        return pb.ContainerStatusResponse(status=status, info=info)


def scripted_loader(runtime: ScriptedRuntime) -> RuntimeLoader:
    loader = RuntimeLoader("unix:///nonexistent.sock")
    loader._stub = runtime  # no channel is opened
    return loader


async def test_load_all_with_a_scripted_runtime() -> None:
    runtime = ScriptedRuntime(
        [pod_request("u0"), pod_request("u1")],
        [container_request("s0"), container_request("s1"), container_request("s1")],
    )
    store = PodStore()
    known = sandbox_from_request("s1", pod_request("live"))
    store.put_sandbox(known)
    result = await scripted_loader(runtime).load_all(store)
    assert result == LoadResult(sandboxes=1, containers=3, partial=0, already_known=1, vanished=0)
    assert store.sandbox("s1") is known  # what the proxy saw live wins
    assert store.sandbox("s0") == sandbox_from_request("s0", runtime.sandboxes["s0"])
    for cid, request in runtime.containers.items():
        assert store.container(cid) == container_from_request(cid, request)
    assert [c.id for c in store.containers_of("s1")] == ["c1", "c2"]


async def test_load_all_failures_per_object() -> None:
    runtime = ScriptedRuntime(
        [pod_request("u0"), pod_request("u1"), pod_request("u2")], [container_request("s0"), container_request("s1")]
    )
    runtime.errors["s1"] = rpc_error(grpc.StatusCode.NOT_FOUND)  # removed after the List
    runtime.errors["s2"] = rpc_error(grpc.StatusCode.INTERNAL, "boom")  # status broken: list data
    store = PodStore()
    with capture_logs() as logs:
        result = await scripted_loader(runtime).load_all(store)
    assert result == LoadResult(sandboxes=2, containers=2, partial=1, already_known=0, vanished=1)
    partial = store.sandbox("s2")
    assert partial is not None and partial.partial and partial.labels == dict(runtime.sandboxes["s2"].config.labels)
    assert partial.cgroup_parent == "" and partial.resources is None
    assert any(log["event"].startswith("status call failed") and "boom" in log["error"] for log in logs)

    runtime.errors["c1"] = rpc_error(grpc.StatusCode.UNAVAILABLE, "gone")  # runtime down: the load fails
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await scripted_loader(runtime).load_all(PodStore())
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_objects_removed_during_a_load_stay_removed() -> None:
    runtime = ScriptedRuntime([pod_request("u0")], [container_request("s0")])
    store = PodStore()
    runtime.before_status = lambda _sid: store.remove_sandbox("s0")  # relayed RemovePodSandbox meanwhile
    result = await scripted_loader(runtime).load_all(store)
    assert store.sandbox("s0") is None and store.container("c0") is None
    assert result.vanished == 2


async def test_load_container_without_info_asks_list_for_the_sandbox() -> None:
    runtime = ScriptedRuntime([pod_request("u0")], [container_request("s0")])
    original = runtime.ContainerStatus

    async def no_info(request: Any, timeout: float) -> pb.ContainerStatusResponse:
        response = await original(request, timeout)
        response.info.clear()
        return response

    runtime.ContainerStatus = no_info  # type: ignore[method-assign]
    with capture_logs():
        entry = await scripted_loader(runtime).load_container("c0")
    assert entry is not None and entry.partial and entry.sandbox_id == "s0"
    assert await scripted_loader(runtime).load_container("c9") is None


# -- the rebuilder (scripted) ------------------------------------------------------------------------------


def test_backoff_doubles_to_the_cap_with_jitter() -> None:
    rebuilder = StoreRebuilder(PodStore(), scripted_loader(ScriptedRuntime([], [])), rng=random.Random(1))
    nominal = [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    delays = [rebuilder.backoff(n) for n in range(1, 10)]
    for delay, expected in zip(delays, nominal, strict=True):
        assert 0.8 * expected <= delay <= min(30.0, 1.2 * expected)
    assert len(set(delays)) == len(delays)  # jittered
    exact = StoreRebuilder(PodStore(), scripted_loader(ScriptedRuntime([], [])), jitter=0.0)
    assert [exact.backoff(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


async def test_ensure_loads_once_for_concurrent_callers_and_times_out() -> None:
    runtime = ScriptedRuntime([pod_request("u0")], [container_request("s0")])
    gate = asyncio.Event()
    original = runtime.ContainerStatus

    async def slow(request: Any, timeout: float) -> pb.ContainerStatusResponse:
        await gate.wait()
        return await original(request, timeout)

    runtime.ContainerStatus = slow  # type: ignore[method-assign]
    store = PodStore()
    rebuilder = StoreRebuilder(store, scripted_loader(runtime), ensure_timeout=0.2)
    first = asyncio.ensure_future(rebuilder.ensure_container("c0"))
    second = asyncio.ensure_future(rebuilder.ensure_container("c0"))
    await asyncio.sleep(0.05)
    gate.set()
    one, two = await asyncio.gather(first, second)
    assert one is two is store.container("c0")
    assert runtime.calls.count("ContainerStatus c0") == 1
    assert store.sandbox("s0") is not None  # the container's unknown sandbox came along
    assert await rebuilder.ensure_container("c0") is one  # known now: no call
    assert runtime.calls.count("ContainerStatus c0") == 1

    gate.clear()
    runtime.containers["c7"] = container_request("s0")
    with capture_logs() as logs:
        began = time.monotonic()
        assert await rebuilder.ensure_container("c7") is None
    assert time.monotonic() - began < 1.0
    assert logs[-1]["event"].startswith("loading an unknown object timed out")
    await rebuilder.stop()
    assert await rebuilder.ensure_sandbox("") is None


# -- against the real containerd ---------------------------------------------------------------------------

# CRI fields newer than the cri-api a containerd was built with never reach it, so its verbose
# status cannot give them back. They live only in `config`; no entry field depends on them.
# The build's cri-api decides, not the series: Debian's 1.7.24 is built with cri-api 0.32.3
# (its Built-Using) and keeps CDI devices, the user-specified image and the supplemental
# groups policy, which 1.6.20 drops (as upstream's 1.7 builds, on cri-api 0.27, would); sid's
# 2.1.9 keeps and drops what 1.7.24 does.
LOST_FIELDS = {  # series: (container fields, sandbox fields)
    "1.6": (
        ("stop_signal", "CDI_devices", "image.user_specified_image", "image.image_ref"),
        ("linux.security_context.supplemental_groups_policy",),
    ),
    "1.7": (("stop_signal", "image.image_ref"), ()),
    "2.x": (("stop_signal", "image.image_ref"), ()),
}


def clear_path(message: Any, dotted: str) -> None:
    *parents, name = dotted.split(".")
    for part in parents:
        message = getattr(message, part)
    message.ClearField(name)


@pytest.fixture
def bed(containerd: Containerd) -> Iterator[Containerd]:
    containerd.start()  # running again if a test stopped it
    yield containerd
    if not containerd.running:
        containerd.start()
    containerd.remove_all_pods()


@pytest.fixture
def cri(bed: Containerd) -> Iterator[CriClient]:
    with CriClient(bed.address, timeout=60.0) as client:
        yield client


def create_pod_and_container(
    bed: Containerd, cri: CriClient, *, start: bool = True
) -> tuple[str, pb.RunPodSandboxRequest, str, pb.CreateContainerRequest]:
    uid = str(uuid.uuid4())
    # Host network (no CNI), so no hostname: runc cannot set one without a UTS namespace.
    pod = pod_request(uid, bed.cgroup_parent(uid, "burstable"), log_directory=str(bed.root_dir / "pod-logs" / uid))
    pod.config.metadata.name = f"store-{uid[:8]}"
    pod.config.linux.security_context.supplemental_groups_policy = pb.Strict
    pod_id = cri.runtime.RunPodSandbox(pod, timeout=60).pod_sandbox_id
    create = container_request(
        pod_id,
        bed.test_image,
        stop_signal=pb.SIGNAL_SIGTERM,
        CDI_devices=[pb.CDIDevice(name="vendor.example/dev=x")],
    )
    create.config.image.user_specified_image = "busybox"
    create.config.image.image_ref = "sha256:unknown"
    create.sandbox_config.CopyFrom(pod.config)
    if not start:  # runc refuses unified on cgroup v1 at start; create keeps it
        create.config.linux.resources.unified["memory.high"] = str(100 << 20)
        create.config.linux.resources.hugepage_limits.add(page_size="2MB", limit=2 << 20)
    container_id = cri.runtime.CreateContainer(create, timeout=60).container_id
    if start:
        cri.runtime.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=60)
    return pod_id, pod, container_id, create


def expected_after_round_trip(
    pod_id: str, pod: pb.RunPodSandboxRequest, container_id: str, create: pb.CreateContainerRequest, series: str
) -> tuple[SandboxEntry, ContainerEntry]:
    """The entries the live requests give, less what containerd `series` cannot keep."""
    sandbox = sandbox_from_request(pod_id, pod)
    container = container_from_request(container_id, create)
    assert sandbox.config is not None and container.config is not None
    lost_container, lost_sandbox = LOST_FIELDS[series]
    for path in lost_sandbox:
        clear_path(sandbox.config, path)
    for path in lost_container:
        clear_path(container.config, path)
    return sandbox, container


@pytest.mark.e2e
async def test_rebuilt_entries_equal_the_requests(bed: Containerd, cri: CriClient) -> None:
    pod_id, pod, container_id, create = create_pod_and_container(bed, cri)
    live = PodStore()
    live.put_sandbox(sandbox_from_request(pod_id, pod))
    live.put_container(container_from_request(container_id, create))

    store = PodStore()
    loader = RuntimeLoader(bed.address)
    try:
        result = await loader.load_all(store)
    finally:
        await loader.close()
    assert result == LoadResult(sandboxes=1, containers=1)

    sandbox, container = store.sandbox(pod_id), store.container(container_id)
    expected_sandbox, expected_container = expected_after_round_trip(
        pod_id, pod, container_id, create, bed.build.series
    )
    assert sandbox == expected_sandbox
    assert container == expected_container
    # Every field hooks get is what the live store had: only `config` lost the newer fields.
    live_sandbox, live_container = live.sandbox(pod_id), live.container(container_id)
    assert live_sandbox is not None and live_container is not None
    for name in (
        "name",
        "namespace",
        "uid",
        "attempt",
        "labels",
        "annotations",
        "cgroup_parent",
        "runtime_handler",
        "resources",
        "overhead",
        "partial",
    ):
        assert getattr(sandbox, name) == getattr(live_sandbox, name), name
    for name in ("sandbox_id", "name", "attempt", "labels", "annotations", "resources", "envs", "image", "partial"):
        assert getattr(container, name) == getattr(live_container, name), name
    assert container is not None and container.envs == [(k.decode(), v) for k, v in ENVS]
    assert sandbox is not None and sandbox.runtime_handler == "runc"
    # What each series drops or keeps, spelled out.
    assert container.config is not None and sandbox.config is not None
    assert container.config.stop_signal == pb.SIGNAL_RUNTIME_DEFAULT and container.config.image.image_ref == ""
    kept = {
        "CDI_devices": [d.name for d in container.config.CDI_devices],
        "user_specified_image": container.config.image.user_specified_image,
        "supplemental_groups_policy": sandbox.config.linux.security_context.supplemental_groups_policy,
    }
    if bed.build.series == "1.6":
        assert kept == {"CDI_devices": [], "user_specified_image": "", "supplemental_groups_policy": pb.Merge}
    else:
        assert kept == {
            "CDI_devices": ["vendor.example/dev=x"],
            "user_specified_image": "busybox",
            "supplemental_groups_policy": pb.Strict,
        }


@pytest.mark.e2e
async def test_rebuild_sees_resource_updates(bed: Containerd, cri: CriClient) -> None:
    pod_id, pod, container_id, create = create_pod_and_container(bed, cri)
    update = pb.LinuxContainerResources(
        cpu_period=100000,
        cpu_quota=30000,
        cpu_shares=300,
        memory_limit_in_bytes=96 << 20,
        oom_score_adj=1000,
        cpuset_cpus="0",
    )
    cri.runtime.UpdateContainerResources(
        pb.UpdateContainerResourcesRequest(container_id=container_id, linux=update), timeout=60
    )
    live = PodStore()
    live.put_container(container_from_request(container_id, create))
    live.update_container_resources(container_id, update)

    store = PodStore()
    loader = RuntimeLoader(bed.address)
    try:
        await loader.load_all(store)
    finally:
        await loader.close()
    rebuilt, before = store.container(container_id), live.container(container_id)
    assert rebuilt is not None and before is not None
    # containerd's info keeps the create-time config; the status's current values win.
    assert rebuilt.resources == update == before.resources
    _, expected = expected_after_round_trip(pod_id, pod, container_id, create, bed.build.series)
    assert expected.config is not None
    expected.config.linux.resources.CopyFrom(update)
    expected.resources = update
    assert rebuilt == expected


@pytest.mark.e2e
async def test_rebuild_reads_stopped_objects_in_full(bed: Containerd, cri: CriClient) -> None:
    """A stopped pod and its exited container (what a restarted proxy meets after kubelet
    stopped a pod) read back as completely as running ones, on every containerd series."""
    pod_id, pod, container_id, create = create_pod_and_container(bed, cri)
    cri.runtime.StopContainer(pb.StopContainerRequest(container_id=container_id, timeout=0), timeout=60)
    cri.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
    store = PodStore()
    loader = RuntimeLoader(bed.address)
    try:
        assert await loader.load_all(store) == LoadResult(sandboxes=1, containers=1)
    finally:
        await loader.close()
    expected_sandbox, expected_container = expected_after_round_trip(
        pod_id, pod, container_id, create, bed.build.series
    )
    assert store.sandbox(pod_id) == expected_sandbox
    assert store.container(container_id) == expected_container


@pytest.mark.e2e
async def test_rebuild_retries_while_containerd_is_down(bed: Containerd, cri: CriClient) -> None:
    pod_id, pod, container_id, create = create_pod_and_container(bed, cri)
    cri.close()
    bed.stop_daemon()
    store = PodStore()
    loader = RuntimeLoader(bed.address, timeout=5.0)
    rebuilder = StoreRebuilder(store, loader, initial_backoff=0.05, max_backoff=0.4, ensure_timeout=0.5)
    try:
        with capture_logs() as logs:
            rebuilder.start()
            deadline = time.monotonic() + 10
            while rebuilder.failures < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert rebuilder.failures >= 3 and not rebuilder.ready.is_set()
            # The proxy keeps relaying: an on-demand load gives up quickly.
            began = time.monotonic()
            assert await rebuilder.ensure_container(container_id) is None
            assert time.monotonic() - began < 1.0
            await asyncio.to_thread(bed.start)
            await asyncio.wait_for(rebuilder.ready.wait(), timeout=15)
        failures = [log for log in logs if log["event"].startswith("store rebuild from the runtime failed")]
        assert len(failures) >= 3
        assert all(log["log_level"] == "warning" and log["error"].startswith("UNAVAILABLE") for log in failures)
        assert [log["retry_in_s"] for log in failures[:3]] == sorted(log["retry_in_s"] for log in failures[:3])
        assert any(log["event"] == "store rebuilt from the runtime" for log in logs)
        assert rebuilder.result == LoadResult(sandboxes=1, containers=1)
        # Shims kept the pod across the daemon's restart; the entries are the same.
        expected_sandbox, expected_container = expected_after_round_trip(
            pod_id, pod, container_id, create, bed.build.series
        )
        assert store.sandbox(pod_id) == expected_sandbox
        assert store.container(container_id) == expected_container
    finally:
        await rebuilder.stop()
        await loader.close()


@pytest.mark.e2e
async def test_ensure_container_loads_an_unknown_one(bed: Containerd, cri: CriClient) -> None:
    store = PodStore()
    loader = RuntimeLoader(bed.address)
    rebuilder = StoreRebuilder(store, loader)  # never started: the store stays empty
    try:
        pod_id, pod, container_id, create = create_pod_and_container(bed, cri, start=False)
        entry = await rebuilder.ensure_container(container_id)
        expected_sandbox, expected_container = expected_after_round_trip(
            pod_id, pod, container_id, create, bed.build.series
        )
        assert entry == expected_container and store.container(container_id) is entry
        assert store.sandbox(pod_id) == expected_sandbox  # its sandbox came along
        assert await rebuilder.ensure_sandbox(pod_id) is store.sandbox(pod_id)
        with capture_logs():
            assert await rebuilder.ensure_container("0" * 64) is None
            assert await rebuilder.ensure_sandbox("f" * 64) is None
        assert len(store) == 2
    finally:
        await rebuilder.stop()
        await loader.close()
