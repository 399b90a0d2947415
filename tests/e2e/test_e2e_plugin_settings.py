"""A third-party plugin with settings and state of its own, end to end.

The plugin is the contract of docs/writing-a-plugin.md, word for word, plus one more handler
that reports its ``state``. It is installed by entry point (a dist-info on the
``runtime-hooks serve`` subprocess' path), its settings come from a policy file, and pods run
through ``runtime-proxy serve`` in front of the real containerd test bed: a BE pod's container
must get ``STAMP=be-stamp``, an LS pod's ``STAMP=ls-stamp``, and the state must have counted
both calls.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from daemons import HOOKS_CLI, Daemon, ProxyAndHooks

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

REGISTRATION_LATENCY = 5.0

STAMP_PLUGIN = """
from dataclasses import dataclass
from typing import Any

from runtimeproxy.hooks.sdk import HookPoint, HookResponse, Plugin


@dataclass(frozen=True)
class StampSettings:
    value: str = "none"

plugin = Plugin("stamp", settings=StampSettings, state=dict)

@plugin.on(HookPoint.PRE_CREATE_CONTAINER)
async def stamp(*, settings: StampSettings, state: dict, response: HookResponse, **kwargs: Any) -> None:
    state["calls"] = state.get("calls", 0) + 1
    response.env.set("STAMP", settings.value)


@plugin.on(HookPoint.POST_START_CONTAINER)
async def report(*, state: dict, settings: StampSettings, log: Any, **kwargs: Any) -> None:
    log.info("stamp: container started", calls=state.get("calls", 0), value=settings.value)
"""
POLICY = "stamp: {BE: {value: be-stamp}, LS: {value: ls-stamp}}\n"


def install_plugin(site: Path) -> None:
    """The plugin as an installed distribution: its module and a dist-info naming the entry point."""
    module = f"rtpx_stamp_{uuid.uuid4().hex[:8]}"
    info = site / f"{module}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[runtimeproxy.hooks]\nstamp = {module}:plugin\n")
    (site / f"{module}.py").write_text(STAMP_PLUGIN)


class Node(ProxyAndHooks):
    def __init__(self, containerd: Containerd) -> None:
        super().__init__(containerd, "rtpxst-")
        self.site = self.workdir / "site"
        install_plugin(self.site)
        self.policy = self.workdir / "policy.yaml"
        self.policy.write_text(POLICY)

    def start_proxy(self) -> Daemon:
        return self.start_daemon("proxy", self.proxy_args())

    def start_hooks(self) -> Daemon:
        options = ("--enable", "stamp", "--policy", str(self.policy))
        args = self.hooks_args(HOOKS_CLI, self.workdir / "no-resctrl", *options)
        return self.start_daemon("hooks", args, {"PYTHONPATH": str(self.site)})


@pytest.fixture
def node(containerd: Containerd) -> Iterator[Node]:
    with closing(Node(containerd)) as made:
        yield made


def run_pod(cri: CriClient, bed: Containerd, kube_qos: str) -> str:
    """A pod of one container in the ``kube_qos`` cgroup (besteffort: BE, burstable: LS); its container id."""
    uid = str(uuid.uuid4())
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"stamp-{uid[:8]}", uid=uid, namespace="e2e"),
        log_directory=str(bed.root_dir / "pod-logs" / uid),
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=bed.cgroup_parent(uid, kube_qos),
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
        ),
    )
    pod_id = cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id
    container = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app"), image=pb.ImageSpec(image=bed.test_image), log_path="app.log"
    )
    request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container, sandbox_config=config)
    container_id: str = cri.runtime.CreateContainer(request, timeout=60).container_id
    cri.runtime.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=60)
    return container_id


def env_of(cri: CriClient, container_id: str, name: str) -> str:
    request = pb.ExecSyncRequest(container_id=container_id, cmd=["sh", "-c", f"echo ${name}"], timeout=10)
    reply = cri.runtime.ExecSync(request, timeout=30)
    assert reply.exit_code == 0, reply.stderr
    return str(reply.stdout.decode()).strip()


def started(record: dict[str, Any], *, value: str) -> bool:
    return record.get("event") == "stamp: container started" and record.get("value") == value


def test_a_plugins_own_settings_and_state_through_a_real_pod(node: Node, containerd: Containerd) -> None:
    proxy = node.start_proxy()
    hooks = node.start_hooks()
    serving = hooks.wait_record(lambda r: r.get("event") == "serving runtime hooks")
    assert serving["plugins"] == ["stamp"]
    proxy.wait_record(
        lambda r: r.get("event") == "hook server added" and r.get("server") == "runtime-hooks.json",
        timeout=REGISTRATION_LATENCY,
    )

    with CriClient(str(node.proxy_endpoint), timeout=30.0) as cri:
        be = run_pod(cri, containerd, "besteffort")
        be_started = hooks.wait_record(functools.partial(started, value="be-stamp"))
        ls = run_pod(cri, containerd, "burstable")
        ls_started = hooks.wait_record(functools.partial(started, value="ls-stamp"))
        assert env_of(cri, be, "STAMP") == "be-stamp"
        assert env_of(cri, ls, "STAMP") == "ls-stamp"

    # One state object for the server, shared by both handlers: it counted each PreCreateContainer.
    assert (be_started["calls"], ls_started["calls"]) == (1, 2)
    assert hooks.terminate() == 0, hooks.log()
    assert proxy.terminate() == 0, proxy.log()
