"""dispatch/hook_interceptor.py: Start/Stop calls read the store's own configs (no copy) and must
never write into them; one hook request serves the pre- and post-hooks while the views stay."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.dispatch.dispatcher import Dispatcher, HookMetrics
from runtimeproxy.dispatch.hook_interceptor import HookInterceptor
from runtimeproxy.dispatch.registry import FailurePolicy, HookServer
from runtimeproxy.dispatch.store import PodStore
from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.relay.call_interceptor import CallContext, CallOutcome, RejectCall
from runtimeproxy.relay.methods import MethodTable

METHODS = MethodTable()
SANDBOX, CONTAINER = "s1", "c1"


class Registry:
    def __init__(self, policy: FailurePolicy) -> None:
        self.server = HookServer("one.json", "/none.sock", policy, frozenset(HookPoint), 5.0, 0)

    def servers_for(self, point: HookPoint) -> list[HookServer]:
        return [self.server]

    def add_listener(self, callback: Any) -> None:
        pass


class Channel:
    """Answers each hook RPC from ``answers`` (default: empty) and keeps what it was sent."""

    def __init__(self, answers: dict[str, bytes]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, bytes]] = []

    async def unary(self, path: str, data: bytes, timeout: float) -> bytes:
        rpc = path.rsplit("/", 1)[1]
        self.sent.append((rpc, data))
        return self.answers.get(rpc, b"")


class Loader:
    def __init__(self, store: PodStore) -> None:
        self.store = store

    async def ensure_sandbox(self, sandbox_id: str) -> Any:
        return self.store.sandbox(sandbox_id)

    async def ensure_container(self, container_id: str) -> Any:
        return self.store.container(container_id)


def interceptor(
    answers: dict[str, bytes], policy: FailurePolicy = FailurePolicy.FAIL
) -> tuple[HookInterceptor, Channel]:
    store = PodStore()
    pod = cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name="web", uid="u1", namespace="default"),
        labels={"app": "web"},
        linux=cri.LinuxPodSandboxConfig(cgroup_parent="/kubepods/podu1"),
    )
    store.put_sandbox(store.sandbox_from_request(SANDBOX, cri.RunPodSandboxRequest(config=pod)))
    container = cri.ContainerConfig(metadata=cri.ContainerMetadata(name="app"), annotations={"a": "1"})
    create = cri.CreateContainerRequest(pod_sandbox_id=SANDBOX, config=container, sandbox_config=pod)
    store.put_container(store.container_from_request(CONTAINER, create))
    dispatcher = Dispatcher(Registry(policy), HookMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    channel = Channel(answers)
    dispatcher._channel = lambda server: channel  # type: ignore[assignment,method-assign,return-value]
    return HookInterceptor(dispatcher, store, Loader(store)), channel  # type: ignore[arg-type]


async def call(ic: HookInterceptor, name: str, request: Any) -> None:
    context = CallContext(METHODS.lookup("/runtime.v1.RuntimeService/" + name))
    sent = await ic.before(context, request.SerializeToString())
    await ic.after(context, sent, CallOutcome(0, "", b""))


def stored(ic: HookInterceptor) -> tuple[bytes, bytes]:
    sandbox, container = ic.store.sandbox(SANDBOX), ic.store.container(CONTAINER)
    assert sandbox is not None and sandbox.config is not None
    assert container is not None and container.config is not None
    return sandbox.config.SerializeToString(deterministic=True), container.config.SerializeToString(deterministic=True)


def test_empty_answers_share_one_request_for_pre_and_post() -> None:
    ic, channel = interceptor({})
    asyncio.run(call(ic, "StartContainer", cri.StartContainerRequest(container_id=CONTAINER)))
    assert [rpc for rpc, _ in channel.sent] == ["PreStartContainerHook", "PostStartContainerHook"]
    assert channel.sent[0][1] == channel.sent[1][1]
    request = hook.ContainerResourceHookRequest.FromString(channel.sent[0][1])
    assert (request.container_meta.id, dict(request.container_annotations)) == (CONTAINER, {"a": "1"})
    assert dict(request.pod_labels) == {"app": "web"}


def test_an_answer_to_a_start_hook_changes_the_next_request_and_never_the_store() -> None:
    answer = hook.ContainerResourceHookResponse(
        container_annotations={"a": "2"}, pod_cgroup_parent="/kubepods/besteffort/podu1"
    )
    ic, channel = interceptor({"PreStartContainerHook": answer.SerializeToString()})
    before = stored(ic)
    asyncio.run(call(ic, "StartContainer", cri.StartContainerRequest(container_id=CONTAINER)))
    assert stored(ic) == before
    post = hook.ContainerResourceHookRequest.FromString(channel.sent[1][1])
    assert dict(post.container_annotations) == {"a": "2"}  # as the pre-hook left the views
    assert post.pod_cgroup_parent == "/kubepods/besteffort/podu1"
    asyncio.run(call(ic, "StopContainer", cri.StopContainerRequest(container_id=CONTAINER)))
    assert dict(hook.ContainerResourceHookRequest.FromString(channel.sent[2][1]).container_annotations) == {"a": "1"}


def test_an_invalid_answer_to_a_fail_server_refuses_the_call_and_leaves_the_store() -> None:
    answer = hook.ContainerResourceHookResponse(pod_cgroup_parent="/elsewhere/pod")
    ic, _ = interceptor({"PreStopContainerHook": answer.SerializeToString()})
    before = stored(ic)
    with pytest.raises(RejectCall, match="PreStopContainer"):
        asyncio.run(call(ic, "StopContainer", cri.StopContainerRequest(container_id=CONTAINER)))
    assert stored(ic) == before


def test_a_pod_hook_answer_on_stop_pod_never_reaches_the_store() -> None:
    answer = hook.PodSandboxHookResponse(labels={"app": "other"})
    ic, _ = interceptor({"PostStopPodSandboxHook": answer.SerializeToString()})
    before = stored(ic)
    asyncio.run(call(ic, "StopPodSandbox", cri.StopPodSandboxRequest(pod_sandbox_id=SANDBOX)))
    assert stored(ic) == before
