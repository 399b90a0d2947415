"""Fault injection: hook answers that look valid but that containerd,
runc or the kernel refuse, or that break the cgroup layout.

Against the real containerd, through the in-process proxy of hook_bed.py, a hook server
answers an env name with '=', a systemd slice as cgroup parent on this cgroupfs node, a
label over containerd's size limit, cpu_quota 2**62, a 1-byte memory limit, a CPU the node
does not have, 100,000 env vars or a 15 MB env value. Under Fail the call is refused with
a message naming the field and containerd never sees it; under Ignore the answer is
dropped whole and the pod or container runs as kubelet asked, which is checked on what
containerd has (its verbose status, the cgroup files). No log line carries such values.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hook_bed import CGROUP_CPU, HookBed, cgroup_file, rpc_error
from hook_servers import Custom
from structlog.testing import capture_logs

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.hookapi.value_bounds import NodeFacts, format_cpuset

pytestmark = pytest.mark.e2e

P = HookPoint
SERVER = "badout"
ENVS = [("KEEP", b"1"), ("A", b"x=y")]
RESOURCES = cri.LinuxContainerResources(cpu_shares=512, cpu_period=100000)
BIG = "x" * 5000  # a label value over containerd's 4096 bytes
MEMORY_CGROUP = Path("/sys/fs/cgroup/memory")


def slice_of_root(bed: HookBed) -> str:
    """The besteffort slice under the test bed's root, as kubelet would name it with systemd."""
    return bed.containerd.cgroup_prefix.replace("-", "_") + "-besteffort.slice"


def offline_cpu() -> str:
    return str(max(NodeFacts().online_cpus()) + 1)


def container_answer(**fields: Any) -> hook.ContainerResourceHookResponse:
    """An invalid answer with valid changes beside it: none of it may land under Ignore."""
    answer = hook.ContainerResourceHookResponse(container_annotations={"invalid-hook": "ran"}, **fields)
    answer.container_resources.cpu_shares = answer.container_resources.cpu_shares or 1024
    return answer


@dataclass(frozen=True)
class Case:
    field: str  # named in the error under Fail
    answer: Callable[[HookBed], Any]


CONTAINER_CASES = {
    "env name A=B": Case(
        "env name 'A=B'", lambda bed: container_answer(container_env_list=[hook.KeyValue(key="A=B", value=b"v")])
    ),
    "cpu_quota 2**62": Case(
        "cpu_quota", lambda bed: container_answer(container_resources=hook.LinuxContainerResources(cpu_quota=2**62))
    ),
    "1-byte memory limit": Case(
        "memory_limit_in_bytes",
        lambda bed: container_answer(container_resources=hook.LinuxContainerResources(memory_limit_in_bytes=1)),
    ),
    "a CPU the node lacks": Case(
        "cpuset_cpus",
        lambda bed: container_answer(container_resources=hook.LinuxContainerResources(cpuset_cpus=offline_cpu())),
    ),
    "100000 env vars": Case(
        "env would hold 100002 variables",
        lambda bed: container_answer(container_env_list=[hook.KeyValue(key=f"E{i}", value=b"v") for i in range(10**5)]),
    ),
    "15 MB env value": Case(
        "MAX_ARG_STRLEN",
        lambda bed: container_answer(container_env_list=[hook.KeyValue(key="HUGE", value=b"x" * (15 << 20))]),
    ),
    "slice parent on a cgroupfs node": Case(
        "pod_cgroup_parent", lambda bed: container_answer(pod_cgroup_parent=slice_of_root(bed))
    ),
}
POD_CASES = {
    "slice parent on a cgroupfs node": Case(
        "cgroup_parent", lambda bed: hook.PodSandboxHookResponse(cgroup_parent=slice_of_root(bed))
    ),
    "label over containerd's limit": Case("labels[big]", lambda bed: hook.PodSandboxHookResponse(labels={"big": BIG})),
}


async def verbose_container(bed: HookBed, container_id: str) -> dict[str, Any]:
    """What containerd has for the container: the CRI config it got, the OCI spec it made."""
    reply = await bed.direct.ContainerStatus(cri.ContainerStatusRequest(container_id=container_id, verbose=True))
    info: dict[str, Any] = json.loads(reply.info["info"])
    return info


def no_unbounded_values(logs: list[dict[str, Any]]) -> None:
    for entry in logs:
        text = repr(entry)
        assert len(text) < 8000, text[:300]
        assert "x" * 250 not in text, entry["event"]


def answer_with(case: Case, bed: HookBed) -> Custom:
    return Custom(lambda point, request, context: case.answer(bed))


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
@pytest.mark.parametrize("case", sorted(CONTAINER_CASES))
async def test_invalid_container_output(bed: HookBed, policy: str, case: str) -> None:
    server = await bed.server(SERVER)
    server.set(P.PRE_CREATE_CONTAINER, answer_with(CONTAINER_CASES[case], bed))
    await bed.register(server, policy=policy)
    pod = bed.pod_config("badout")
    sandbox_id = await bed.run_pod(pod)
    config = bed.container_config("main", envs=ENVS, resources=RESOURCES)
    with capture_logs() as logs:
        if policy == "Fail":
            error = await rpc_error(bed.create(sandbox_id, pod, config))
            details = error.details() or ""
            assert CONTAINER_CASES[case].field in details, details
            assert f"{SERVER}.json" in details and "PreCreateContainer" in details
            assert len(details) < 2000
            assert await bed.containers_of(sandbox_id) == []  # containerd never saw it
        else:
            container_id = await bed.create(sandbox_id, pod, config)
            await bed.start(container_id)
            await unchanged_container(bed, pod, container_id)
    assert bed.hook_calls(f"{SERVER}.json", "PreCreateContainer", "invalid") == 1
    no_unbounded_values(logs)


async def unchanged_container(bed: HookBed, pod: cri.PodSandboxConfig, container_id: str) -> None:
    """The container runs exactly as kubelet asked: none of the answer landed."""
    info = await verbose_container(bed, container_id)
    assert info["config"]["envs"] == [{"key": k, "value": v.decode()} for k, v in ENVS]
    assert "annotations" not in info["config"]  # not even the answer's valid annotation
    assert info["config"]["linux"]["resources"] == {"cpu_period": 100000, "cpu_shares": 512}
    spec = info["runtimeSpec"]
    assert [item for item in spec["process"]["env"] if item.split("=", 1)[0] in ("KEEP", "A", "A=B", "HUGE")] == [
        "KEEP=1",
        "A=x=y",
    ]
    parent = pod.linux.cgroup_parent
    assert spec["linux"]["cgroupsPath"] == f"{parent}/{container_id}"
    assert cgroup_file(parent, container_id, "cpu.cfs_quota_us") == "-1"
    assert cgroup_file(parent, container_id, "cpu.shares") == "512"
    memory = (MEMORY_CGROUP / parent.lstrip("/") / container_id / "memory.limit_in_bytes").read_text()
    assert int(memory) > 1 << 40  # unlimited
    assert "cpus" not in spec["linux"]["resources"].get("cpu", {})


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
@pytest.mark.parametrize("case", sorted(POD_CASES))
async def test_invalid_pod_output(bed: HookBed, policy: str, case: str) -> None:
    server = await bed.server(SERVER)
    server.set(P.PRE_RUN_POD_SANDBOX, answer_with(POD_CASES[case], bed))
    await bed.register(server, policy=policy)
    pod = bed.pod_config("badpod", annotations={"kept": "1"})
    with capture_logs() as logs:
        if policy == "Fail":
            error = await rpc_error(bed.run_pod(pod))
            details = error.details() or ""
            assert POD_CASES[case].field in details and f"{SERVER}.json" in details, details
            assert len(details) < 2000
            assert await bed.sandboxes_of(pod.metadata.uid) == []
        else:
            sandbox_id = await bed.run_pod(pod)
            status = (await bed.direct.PodSandboxStatus(cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id))).status
            assert status.state == cri.SANDBOX_READY
            assert dict(status.labels) == dict(pod.labels)
            assert dict(status.annotations) == {"kept": "1"}
            # The pause container's cgroup is where kubelet put the pod, and nowhere else.
            assert (CGROUP_CPU / pod.linux.cgroup_parent.lstrip("/") / sandbox_id).is_dir()
            assert not (CGROUP_CPU / slice_of_root(bed)).exists()
    assert bed.hook_calls(f"{SERVER}.json", "PreRunPodSandbox", "invalid") == 1
    no_unbounded_values(logs)


async def test_a_slice_parent_is_refused_before_any_containerd_call(bed: HookBed) -> None:
    """The error says why: the slice is the other driver's form."""
    server = await bed.server(SERVER)
    server.set(P.PRE_RUN_POD_SANDBOX, answer_with(POD_CASES["slice parent on a cgroupfs node"], bed))
    await bed.register(server, policy="Fail")
    error = await rpc_error(bed.run_pod(bed.pod_config("slice")))
    assert "is a systemd slice, but this node's pods use the cgroupfs cgroup driver" in (error.details() or "")


async def test_valid_env_is_applied_and_its_values_are_not_logged(bed: HookBed) -> None:
    secret = b"s3cret-" + b"v" * 500
    server = await bed.server(SERVER)
    server.set(
        P.PRE_CREATE_CONTAINER,
        hook.ContainerResourceHookResponse(
            container_env_list=[hook.KeyValue(key="TOKEN", value=secret)],
            container_annotations={"note": "n" * 1000},
        ),
    )
    await bed.register(server, policy="Fail")
    pod = bed.pod_config("envlog")
    sandbox_id = await bed.run_pod(pod)
    with capture_logs() as logs:
        container_id = await bed.create(sandbox_id, pod, bed.container_config("main", envs=ENVS))
    info = await verbose_container(bed, container_id)
    assert {"key": "TOKEN", "value": secret.decode()} in info["config"]["envs"]
    (line,) = [entry for entry in logs if entry["event"] == "lifecycle call"]
    assert "env[TOKEN] set" in line["changes"]
    assert "s3cret" not in repr(logs)
    [note] = [change for change in line["changes"] if change.startswith("annotations[note]")]
    assert note.endswith("...(+800 chars)")


async def test_a_cpuset_the_node_has_is_applied(bed: HookBed) -> None:
    """The node check refuses only what the node lacks."""
    online = format_cpuset(NodeFacts().online_cpus())
    server = await bed.server(SERVER)
    server.set(
        P.PRE_CREATE_CONTAINER,
        hook.ContainerResourceHookResponse(container_resources=hook.LinuxContainerResources(cpuset_cpus=online)),
    )
    await bed.register(server, policy="Fail")
    pod = bed.pod_config("cpuset")
    sandbox_id = await bed.run_pod(pod)
    container_id = await bed.create(sandbox_id, pod, bed.container_config("main"))
    info = await verbose_container(bed, container_id)
    assert info["runtimeSpec"]["linux"]["resources"]["cpu"]["cpus"] == online
