"""The request path of the NRI service looks up the running loop once per connection, not once per
request: on Python 3.11 each look is a getpid(2), and the runtime waits for every answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from runtimeproxy.hooks.nri.rpc import TtrpcServer
from runtimeproxy.hooks.nri.ttrpc import FrameDecoder, MessageType, encode_frame
from runtimeproxy.hooks.sdk import HookResponse, Plugin
from test_nri_mapping import make_hooks, nri_container, nri_pod

from runtimeproxy.api.nri.ttrpc import ttrpc_pb2 as ttrpc_pb
from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri
from runtimeproxy.hookapi.hookpoints import HookPoint


def shares_plugin() -> Plugin:
    plugin = Plugin("shares", version="1")

    @plugin.on(HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_RUN_POD_SANDBOX)
    async def shares(*, response: HookResponse, **kwargs: Any) -> None:  # never suspends
        if response.kind.value == "container":
            response.resources.cpu_shares = 300

    return plugin


def request(stream: int, method: str, message: Any) -> bytes:
    payload = ttrpc_pb.Request(
        service="nri.pkg.api.v1alpha1.Plugin", method=method, payload=message.SerializeToString(), timeout_nano=10**9
    ).SerializeToString()
    return encode_frame(stream, MessageType.REQUEST, payload)


async def test_requests_after_the_first_do_not_look_up_the_running_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    hooks, _ = make_hooks(shares_plugin())
    sent: list[bytes] = []
    server = TtrpcServer(hooks.methods(), sent.append)
    looks: list[str] = []
    real = asyncio.events.get_running_loop

    def counted() -> asyncio.AbstractEventLoop:
        looks.append("look")
        return real()

    monkeypatch.setattr(asyncio, "get_running_loop", counted)
    monkeypatch.setattr(asyncio.events, "get_running_loop", counted)
    events = [
        ("StateChange", nri.StateChangeEvent(event=nri.RUN_POD_SANDBOX, pod=nri_pod())),
        ("CreateContainer", nri.CreateContainerRequest(pod=nri_pod(), container=nri_container())),
    ]
    for stream, (method, message) in enumerate(events * 3):
        server.feed(request(2 * stream + 1, method, message))
        while len(sent) <= stream:
            await asyncio.sleep(0)
    frames = FrameDecoder().feed(b"".join(sent))
    answers = [ttrpc_pb.Response.FromString(frame.payload) for frame in frames]
    assert [answer.status.code for answer in answers] == [0] * 6
    created = nri.CreateContainerResponse.FromString(answers[-1].payload)
    assert created.adjust.linux.resources.cpu.shares.value == 300  # the plugins did run
    assert len(looks) <= 2  # the server's and the pod queues' first look; none per request
