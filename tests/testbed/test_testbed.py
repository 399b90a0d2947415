"""The containerd test bed itself: raw gRPC bytes against a real containerd."""

from __future__ import annotations

import ipaddress
import os
import shutil
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from google.protobuf.message import Message

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.testbed import Containerd, ContainerdError
from runtimeproxy.testbed.containerd import decode_fields, encode_field, processes_referencing
from runtimeproxy.testbed.runtimes import series_of, upstream_version

pytestmark = pytest.mark.e2e

R = TypeVar("R", bound=Message)


def rpc(bed: Containerd, method: str, request: Message, response_type: type[R]) -> R:
    """One CRI call through the test bed's byte-level channel."""
    return response_type.FromString(bed.call(method, request.SerializeToString()))


def pod_config(bed: Containerd, *, host_network: bool = True) -> pb.PodSandboxConfig:
    uid = uuid.uuid4().hex
    mode = pb.NODE if host_network else pb.POD
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"tb-{uid[:8]}", uid=uid, namespace="testbed"),
        # Kubelet sends no hostname for host-network pods: runc refuses to set one
        # without a private UTS namespace.
        hostname="" if host_network else f"tb-{uid[:8]}",
        log_directory=str(bed.root_dir / "pod-logs" / uid),
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=bed.cgroup_parent(uid),
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=mode)),
        ),
    )


def run_pod(bed: Containerd, config: pb.PodSandboxConfig) -> str:
    request = pb.RunPodSandboxRequest(config=config)
    response = rpc(bed, "RuntimeService/RunPodSandbox", request, pb.RunPodSandboxResponse)
    return response.pod_sandbox_id


def start_container(bed: Containerd, pod_id: str, config: pb.PodSandboxConfig) -> str:
    container = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="sleeper"),
                                   image=pb.ImageSpec(image=bed.test_image), log_path="sleeper.log")
    request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container,
                                        sandbox_config=config)
    created = rpc(bed, "RuntimeService/CreateContainer", request, pb.CreateContainerResponse)
    cid = created.container_id
    rpc(bed, "RuntimeService/StartContainer", pb.StartContainerRequest(container_id=cid),
        pb.StartContainerResponse)
    return cid


def container_state(bed: Containerd, cid: str) -> int:
    request = pb.ContainerStatusRequest(container_id=cid)
    response = rpc(bed, "RuntimeService/ContainerStatus", request, pb.ContainerStatusResponse)
    return response.status.state


@pytest.fixture
def bed(containerd: Containerd) -> Iterator[Containerd]:
    """The session's containerd (running again if a test stopped it), emptied of
    pods after each test."""
    containerd.start()
    yield containerd
    containerd.remove_all_pods()


def test_version_answers(bed: Containerd) -> None:
    version = rpc(bed, "RuntimeService/Version", pb.VersionRequest(), pb.VersionResponse)
    assert version.runtime_name == "containerd"
    assert version.runtime_api_version == "v1"


def test_each_series_runs_its_own_binaries(bed: Containerd, request: pytest.FixtureRequest) -> None:
    """The daemon, and the shim it starts for a pod, come from the build of the series the
    test was parametrized with: 1.7's containerd must not find the system's 1.6 shim."""
    series = request.node.callspec.params["containerd"]
    version = rpc(bed, "RuntimeService/Version", pb.VersionRequest(), pb.VersionResponse)
    assert series_of(version.runtime_version) == bed.build.series == series
    assert upstream_version(version.runtime_version) == bed.build.version
    config = pod_config(bed)
    run_pod(bed, config)
    path = bed.build.env()["PATH"]
    binaries = ("containerd", "containerd-shim-runc-v2")
    expected = {Path(str(shutil.which(name, path=path))).resolve() for name in binaries}
    running = {Path(os.readlink(f"/proc/{pid}/exe")) for pid in processes_referencing(bed.root_dir)}
    assert running == expected


def test_wire_helpers_match_protobuf() -> None:
    """The wire helpers agree with protobuf's own encoding."""
    message = pb.ImageStatusRequest(image=pb.ImageSpec(image="x/y:1"))
    assert encode_field(1, encode_field(1, "x/y:1")) == message.SerializeToString()
    pod = pb.PodSandbox(id="abc", state=pb.SANDBOX_NOTREADY)
    assert list(decode_fields(pod.SerializeToString())) == [(1, b"abc"), (3, 1)]


def test_imported_images_are_listed(bed: Containerd) -> None:
    images = rpc(bed, "ImageService/ListImages", pb.ListImagesRequest(), pb.ListImagesResponse)
    tags = {tag for image in images.images for tag in image.repo_tags}
    assert {bed.pause_image, bed.test_image} <= tags


def test_host_network_pod_runs_a_container_in_its_cgroup(bed: Containerd) -> None:
    config = pod_config(bed)
    pod_id = run_pod(bed, config)
    cid = start_container(bed, pod_id, config)
    assert container_state(bed, cid) == pb.CONTAINER_RUNNING
    pod_cgroup = Path("/sys/fs/cgroup/cpu") / config.linux.cgroup_parent.lstrip("/") / cid
    assert (pod_cgroup / "cpu.cfs_quota_us").exists()
    # The test image stops on SIGKILL: `sleep` as PID 1 would ignore SIGTERM.
    began = time.monotonic()
    rpc(bed, "RuntimeService/StopContainer", pb.StopContainerRequest(container_id=cid, timeout=30),
        pb.StopContainerResponse)
    assert time.monotonic() - began < 5
    assert container_state(bed, cid) == pb.CONTAINER_EXITED


def test_pod_network_assigns_an_address(bed: Containerd) -> None:
    pod_id = run_pod(bed, pod_config(bed, host_network=False))
    request = pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id)
    status = rpc(bed, "RuntimeService/PodSandboxStatus", request, pb.PodSandboxStatusResponse)
    address = ipaddress.ip_address(status.status.network.ip)
    assert address in ipaddress.ip_network(bed.pod_subnet)


def test_restart_keeps_pods_and_containers(bed: Containerd) -> None:
    config = pod_config(bed)
    pod_id = run_pod(bed, config)
    cid = start_container(bed, pod_id, config)
    old_pid = bed.pid
    bed.restart()
    assert bed.pid != old_pid
    pods = rpc(bed, "RuntimeService/ListPodSandbox", pb.ListPodSandboxRequest(),
               pb.ListPodSandboxResponse)
    assert {pod.id: pod.state for pod in pods.items}[pod_id] == pb.SANDBOX_READY
    assert container_state(bed, cid) == pb.CONTAINER_RUNNING


def test_stop_leaves_nothing_behind(containerd: Containerd) -> None:
    """A second, private test bed of the same build with a running pod is torn down
    completely (host paths such as shim sockets are where each series puts them)."""
    other = Containerd(build=containerd.build)
    other.start()
    try:
        config = pod_config(other, host_network=False)
        start_container(other, run_pod(other, config), config)
        other.stop_daemon()  # an abrupt end: cleanup must not rely on CRI
    finally:
        other.stop()
    assert other.leftovers() == []
    assert not other.root_dir.exists()


def test_nri_is_off_unless_asked(bed: Containerd) -> None:
    """A test bed made without NRI never serves it: 2.x, whose NRI is on by default on the
    host's socket, gets it switched off in its config; 1.x (off by default; 1.6 has no NRI)
    no section."""
    config = tomllib.loads(bed.config_path.read_text())
    nri = config.get("plugins", {}).get("io.containerd.nri.v1.nri")
    assert nri == (None if bed.build.major == 1 else {"disable": True})
    assert "created NRI interface" not in bed.log_path.read_text()
    assert not bed.nri_socket.exists()


def test_config_format_follows_the_major_version(bed: Containerd) -> None:
    """1.x reads config version 2 with one CRI plugin; 2.x reads version 3, whose CRI
    settings are split into a runtime and an images plugin."""
    config = tomllib.loads(bed.config_path.read_text())
    plugins = set(config["plugins"])
    if bed.build.major >= 2:
        assert config["version"] == 3
        assert {"io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"} <= plugins
        assert "sandbox_image" not in config["plugins"]["io.containerd.grpc.v1.cri"]
    else:
        assert config["version"] == 2
        assert not plugins & {"io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"}


def test_failed_start_reports_the_log_tail(containerd: Containerd) -> None:
    bed = Containerd(build=containerd.build)
    bed.prepare()
    bed.config_path.write_text("version = 2\nthis is not toml\n")
    try:
        with pytest.raises(ContainerdError, match=r"exited with status[\s\S]*toml"):
            bed.start()
    finally:
        bed.stop()
