"""Property test: random bytes and hostile-but-well-formed messages as hook answers.

A real hook server (raw gRPC, so it can answer any bytes) is registered with the proxy's hook
layer; each example sets its answer and runs one lifecycle call through the interceptor as
the relay would. Whatever the answer:

* nothing crashes: the call is either refused with a gRPC status or sent on as a request
  that decodes;
* under Fail nothing passes unhooked: a call sent on had the server's answer accepted (its
  outcome is ``ok``), and every call that was sent on gets its lifecycle log line;
* under Ignore an answer that was not accepted leaves the request exactly as it was;
* nothing lands outside the roots: the pod's cgroup parent stays under the kubepods root in
  the form kubelet used, and the container's environment has only valid names.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hook_servers import write_registration
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs
from test_fault_fail_closed import GarbageHookServer

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.dispatch.layer import HookLayer, HookSettings
from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.relay.call_interceptor import CallContext, CallOutcome, RejectCall
from runtimeproxy.relay.methods import MethodTable
from runtimeproxy.wire import grpc_framing

POD_UID = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
POD_PARENT = f"/kubepods/burstable/pod{POD_UID}"
ROOT = "/kubepods"
METHODS = MethodTable()

# Cgroup parents worth trying: escapes, the other driver's form, roots themselves, junk.
PARENTS = st.one_of(
    st.sampled_from(
        [
            "", "/", "/kubepods", "/kubepods/besteffort", "/kubepods/../etc", "/kubepods/./x/../../y",
            "kubepods.slice", "kubepods-besteffort.slice", "kubepods-besteffort-podx.slice", "/system.slice",
            "/kubepods/besteffort/pod1/../../..", "//kubepods//x", "/kubepodsX/y", "/kubepods/\0x",
            "/kubepods/" + "a" * 5000,
        ]
    ),
    st.text(max_size=40),
)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
CPUSETS = st.one_of(
    st.sampled_from(["", "0", "0-1", "1-0", "0-4095", "0,,1", "99999", "-1", "0-"]), st.text(max_size=12)
)
KEYS = st.one_of(st.sampled_from(["", "A=B", "A\0B", "PATH", "é", "x" * 300]), st.text(max_size=20))
VALUES = st.one_of(st.text(max_size=30), st.just("v" * 70_000))


@st.composite
def resources(draw: st.DrawFn) -> Any:
    return hook.LinuxContainerResources(
        cpu_period=draw(INT64),
        cpu_quota=draw(INT64),
        cpu_shares=draw(INT64),
        memory_limit_in_bytes=draw(INT64),
        oom_score_adj=draw(INT64),
        cpuset_cpus=draw(CPUSETS),
        cpuset_mems=draw(CPUSETS),
        unified=draw(st.dictionaries(KEYS, VALUES, max_size=3)),
        memory_swap_limit_in_bytes=draw(INT64),
    )


@st.composite
def pod_answers(draw: st.DrawFn) -> bytes:
    answer = hook.PodSandboxHookResponse(
        labels=draw(st.dictionaries(KEYS, VALUES, max_size=4)),
        annotations=draw(st.dictionaries(KEYS, VALUES, max_size=4)),
        cgroup_parent=draw(PARENTS),
    )
    if draw(st.booleans()):
        answer.resources.CopyFrom(draw(resources()))
    return bytes(answer.SerializeToString())


@st.composite
def container_answers(draw: st.DrawFn) -> bytes:
    answer = hook.ContainerResourceHookResponse(
        container_annotations=draw(st.dictionaries(KEYS, VALUES, max_size=4)),
        pod_cgroup_parent=draw(PARENTS),
        container_envs=draw(st.dictionaries(KEYS, VALUES, max_size=4)),
        container_env_list=[
            hook.KeyValue(key=k, value=v.encode())
            for k, v in draw(st.lists(st.tuples(KEYS, VALUES), max_size=4))
        ],
    )
    if draw(st.booleans()):
        answer.container_resources.CopyFrom(draw(resources()))
    return bytes(answer.SerializeToString())


def answers(kind: str) -> st.SearchStrategy[bytes]:
    well_formed = pod_answers() if kind == "pod" else container_answers()
    return st.one_of(st.binary(max_size=64), well_formed)


class Bed:
    """The hook layer (no relay, no runtime) with one raw hook server registered."""

    def __init__(self, policy: str, point: HookPoint) -> None:
        self.workdir = tempfile.mkdtemp(prefix="rpq-", dir="/tmp")
        self.config_dir = os.path.join(self.workdir, "hooks.d")
        os.mkdir(self.config_dir)
        self.policy = policy
        self.point = point
        self.metrics = CollectorRegistry()
        settings = HookSettings(self.config_dir, os.path.join(self.workdir, "no-runtime.sock"), cgroup_roots=(ROOT,))
        self.layer = HookLayer(settings, metrics_registry=self.metrics)
        self.server = GarbageHookServer(os.path.join(self.workdir, "hook.sock"), b"")

    async def start(self) -> Bed:
        await self.server.start()
        write_registration(self.config_dir, "hostile.json", self.server.socket, [self.point], policy=self.policy)
        await self.layer.registry.start()  # the store's rebuilder is not started: no runtime here
        assert [s.name for s in self.layer.registry.servers()] == ["hostile.json"]
        return self

    async def stop(self) -> None:
        await self.layer.registry.stop()
        await self.layer.dispatcher.close()
        await self.server.stop()

    def outcomes(self, outcome: str) -> float:
        labels = {"server": "hostile.json", "hook": self.point.value, "outcome": outcome}
        return self.metrics.get_sample_value("runtimeproxy_hook_calls_total", labels) or 0.0


def pod_config() -> Any:
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name="p", uid=POD_UID, namespace="ns", attempt=0),
        labels={"app": "p"},
        linux=cri.LinuxPodSandboxConfig(cgroup_parent=POD_PARENT),
    )


def request_for(point: HookPoint) -> tuple[str, bytes]:
    if point == HookPoint.PRE_RUN_POD_SANDBOX:
        return "RunPodSandbox", cri.RunPodSandboxRequest(config=pod_config()).SerializeToString()
    config = cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name="c"),
        envs=[cri.KeyValue(key="KEEP", value=b"1")],
        linux=cri.LinuxContainerConfig(resources=cri.LinuxContainerResources(cpu_shares=512)),
    )
    request = cri.CreateContainerRequest(pod_sandbox_id="", config=config, sandbox_config=pod_config())
    return "CreateContainer", request.SerializeToString()


def sent_parent_and_envs(method: str, sent: bytes) -> tuple[str, list[str]]:
    if method == "RunPodSandbox":
        return cri.RunPodSandboxRequest.FromString(sent).config.linux.cgroup_parent, []
    request = cri.CreateContainerRequest.FromString(sent)
    return request.sandbox_config.linux.cgroup_parent, [env.key for env in request.config.envs]


def under_root(parent: str) -> bool:
    parts = parent.split("/")
    inside = parent.startswith(ROOT + "/")
    return inside and ".." not in parts and "." not in parts and "" not in parts[1:]


async def one_call(bed: Bed, answer: bytes) -> None:
    bed.server.answer = answer
    method, request = request_for(bed.point)
    call = CallContext(method=METHODS.lookup(f"/runtime.v1.RuntimeService/{method}"))
    accepted_before = bed.outcomes("ok")
    with capture_logs() as logs:
        try:
            sent = await bed.layer.interceptor.before(call, request)
        except RejectCall as refused:
            assert bed.policy == "Fail", f"Ignore refused a call: {refused.message}"
            assert refused.code != grpc_framing.OK and refused.message
            assert [entry for entry in logs if entry["event"] == "lifecycle call"]  # logged
            return
        await bed.layer.interceptor.after(call, sent, CallOutcome(grpc_framing.OK, "", None))
    accepted = bed.outcomes("ok") > accepted_before
    lines = [entry for entry in logs if entry["event"] == "lifecycle call"]
    assert len(lines) == 1, "a call sent on must have its lifecycle log line"
    if bed.policy == "Fail":
        assert accepted, "under Fail a call went on although the hook's answer was not accepted"
    if not accepted:
        assert sent == request, "an answer that was not accepted changed the request"
    parent, env_names = sent_parent_and_envs(method, sent)
    assert under_root(parent), f"cgroup parent {parent!r} is outside {ROOT}"
    for name in env_names:
        assert name and "=" not in name and "\0" not in name, f"invalid env name {name!r}"


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module", params=["Fail", "Ignore"])
def pod_bed(request: pytest.FixtureRequest, loop: asyncio.AbstractEventLoop) -> Iterator[Bed]:
    bed = loop.run_until_complete(Bed(request.param, HookPoint.PRE_RUN_POD_SANDBOX).start())
    yield bed
    loop.run_until_complete(bed.stop())


@pytest.fixture(scope="module", params=["Fail", "Ignore"])
def container_bed(request: pytest.FixtureRequest, loop: asyncio.AbstractEventLoop) -> Iterator[Bed]:
    bed = loop.run_until_complete(Bed(request.param, HookPoint.PRE_CREATE_CONTAINER).start())
    yield bed
    loop.run_until_complete(bed.stop())


EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@EXAMPLES
@given(answer=answers("pod"))
def test_any_pod_hook_answer(pod_bed: Bed, loop: asyncio.AbstractEventLoop, answer: bytes) -> None:
    loop.run_until_complete(one_call(pod_bed, answer))


@EXAMPLES
@given(answer=answers("container"))
def test_any_container_hook_answer(container_bed: Bed, loop: asyncio.AbstractEventLoop, answer: bytes) -> None:
    loop.run_until_complete(one_call(container_bed, answer))
