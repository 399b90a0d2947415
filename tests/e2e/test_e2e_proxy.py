"""The real daemon (`runtime-proxy serve` as a subprocess) in front of a real containerd.

Every test talks CRI through the proxy's socket and, where it matters, compares what it
sees with a direct call to containerd or with the host (cgroup files, the socket file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from daemons import Daemon
from google.protobuf.message import Message

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

T = TypeVar("T")

DAEMON = [sys.executable, "-c", "from runtimeproxy.proxy.cli import main; main()"]
REPO = Path(__file__).resolve().parents[2]
PODS = REPO / "tests" / "data" / "pods"
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
VERSION_PATH = "/runtime.v1.RuntimeService/Version"
READY_TIMEOUT = 15.0
MiB = 1024 * 1024


# -- the daemon under test -------------------------------------------------------------------


class ProxyDaemon(Daemon):
    """`runtime-proxy serve` as a child process, with its own sd_notify socket and log files.

    It gets this process's whole environment (RUNTIME_PROXY_* included) but the watchdog's;
    stdout and stderr go to separate files.
    """

    def __init__(
        self,
        workdir: Path,
        backend: str,
        *,
        endpoint: Path | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        use_endpoint_flag: bool = True,
        name: str = "d",
    ) -> None:
        self.endpoint = endpoint or workdir / f"{name}.sock"
        assert len(os.fsencode(str(self.endpoint))) < 100, self.endpoint
        args = [*DAEMON, "serve", "--remote-runtime-endpoint", backend, "--drain-grace", "10"]
        if use_endpoint_flag:
            args += ["--endpoint", f"unix://{self.endpoint}"]
        args += extra_args or []
        super().__init__(workdir, name, args, env, drop_env=("WATCHDOG_USEC", "WATCHDOG_PID"), split_output=True)

    def log_records(self) -> list[tuple[str, dict[str, Any]]]:
        """Every stdout line as (priority prefix, JSON object); fails on a line that is neither."""
        records = []
        for line in self.stdout().splitlines():
            match = re.fullmatch(r"(<\d>)(\{.*\})", line)
            assert match is not None, f"log line is not <N>{{json}}: {line!r}"
            records.append((match.group(1), json.loads(match.group(2))))
        return records


class Daemons:
    """Starts daemons in one short temp directory; kills whatever is left at the end."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.workdir = Path(tempfile.mkdtemp(prefix="rtpxe2e-", dir="/tmp"))
        self.started: list[ProxyDaemon] = []

    def start(self, *, ready: bool = True, backend: str | None = None, **kwargs: Any) -> ProxyDaemon:
        kwargs.setdefault("name", f"d{len(self.started)}")
        daemon = ProxyDaemon(self.workdir, backend or self.backend, **kwargs)
        self.started.append(daemon)
        if ready:
            daemon.wait_ready(READY_TIMEOUT)
        return daemon

    def close(self) -> None:
        for daemon in self.started:
            daemon.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture
def daemons(containerd: Containerd) -> Iterator[Daemons]:
    """For tests that start (and stop) daemons of their own."""
    pool = Daemons(containerd.address)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def proxy(containerd: Containerd) -> Iterator[ProxyDaemon]:
    """One daemon for the module, in front of the test bed; it must drain and exit 0."""
    pool = Daemons(containerd.address)
    try:
        daemon = pool.start(name="proxy")
        yield daemon
        code = daemon.terminate()
        assert code == 0, f"proxy exited with {code} on SIGTERM\n{daemon.log()}"
        assert "STOPPING=1" in _drain_notifications(daemon)
        assert not daemon.endpoint.exists(), "the socket file outlived the daemon"
    finally:
        pool.close()


def _drain_notifications(daemon: ProxyDaemon) -> str:
    daemon.notify.settimeout(0.2)
    with contextlib.suppress(TimeoutError):
        while True:
            daemon.notifications.append(daemon.notify.recv(4096).decode())
    return "\n".join(daemon.notifications)


@pytest.fixture
def client(proxy: ProxyDaemon) -> Iterator[CriClient]:
    with CriClient(str(proxy.endpoint), timeout=30.0) as cri:
        yield cri


@pytest.fixture
def direct(containerd: Containerd) -> Iterator[CriClient]:
    with CriClient(containerd.address, timeout=30.0) as cri:
        yield cri


@pytest.fixture(autouse=True)
def _no_pods_left(containerd: Containerd) -> Iterator[None]:
    yield
    if not containerd.running:  # a test that stopped it failed before starting it again
        containerd.start()
    containerd.remove_all_pods()


# -- CRI helpers -----------------------------------------------------------------------------


def pod_config(bed: Containerd, name: str = "e2e") -> pb.PodSandboxConfig:
    uid = str(uuid.uuid4())
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"{name}-{uid[:8]}", uid=uid, namespace="e2e"),
        # Host network: no CNI, and no hostname (runc cannot set one without a UTS namespace).
        log_directory=str(bed.root_dir / "pod-logs" / uid),
        labels={"test": name},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=bed.cgroup_parent(uid),
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
        ),
    )


def run_pod_with_container(cri: CriClient, bed: Containerd, name: str = "e2e") -> tuple[str, str, pb.PodSandboxConfig]:
    """RunPodSandbox + CreateContainer + StartContainer of the (sleeping) test image."""
    config = pod_config(bed, name)
    pod_id = cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id
    container = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app"), image=pb.ImageSpec(image=bed.test_image), log_path="app.log"
    )
    created = cri.runtime.CreateContainer(
        pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container, sandbox_config=config), timeout=60
    )
    cri.runtime.StartContainer(pb.StartContainerRequest(container_id=created.container_id), timeout=60)
    return pod_id, created.container_id, config


def in_id_order(response: Message) -> Message:
    """A copy of a List response with its one repeated field of messages sorted by id."""
    copy = type(response)()
    copy.CopyFrom(response)
    for field, value in copy.ListFields():
        if field.is_repeated and field.message_type is not None:
            ordered = sorted(value, key=lambda item: item.id)
            items = [type(item)() for item in ordered]
            for target, source in zip(items, ordered, strict=True):
                target.CopyFrom(source)
            del value[:]
            value.extend(items)
    return copy


def rpc_error(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def retry(call: Callable[[], T], seconds: float = 5.0) -> tuple[T, int]:
    """The first successful result of `call` within `seconds`, and how many attempts failed."""
    deadline = time.monotonic() + seconds
    failures = 0
    while True:
        try:
            return call(), failures
        except grpc.RpcError:
            failures += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def calls_total(text: str, method: str, code: str) -> float | None:
    """The runtimeproxy_cri_calls_total sample for (method, code) in a scrape, if any."""
    for line in text.splitlines():
        match = re.fullmatch(r"runtimeproxy_cri_calls_total\{(.*)\} (\S+)", line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if labels == {"method": method, "code": code}:
            return float(match.group(2))
    return None


def play(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DAEMON, "play", *args], capture_output=True, text=True, timeout=120, check=False)


# -- relaying CRI to containerd ----------------------------------------------------------


def test_pod_lifecycle_through_the_proxy(client: CriClient, direct: CriClient, containerd: Containerd) -> None:
    rt = client.runtime
    pod_id, cid, config = run_pod_with_container(client, containerd, "life")

    status = rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10).status
    assert status.state == pb.CONTAINER_RUNNING
    assert status.id == cid
    assert status.metadata.name == "app"

    hello = rt.ExecSync(pb.ExecSyncRequest(container_id=cid, cmd=["echo", "hello"], timeout=10), timeout=20)
    assert (hello.stdout, hello.stderr, hello.exit_code) == (b"hello\n", b"", 0)
    failing = rt.ExecSync(
        pb.ExecSyncRequest(container_id=cid, cmd=["sh", "-c", "echo oops >&2; exit 7"], timeout=10), timeout=20
    )
    assert (failing.stderr, failing.exit_code) == (b"oops\n", 7)

    # The container's real cgroup, and a resource update through the proxy that changes it.
    cgroup = CGROUP_CPU / config.linux.cgroup_parent.lstrip("/") / cid
    assert cgroup.is_dir(), f"no cgroup {cgroup}\n{containerd.describe()}"
    quota_file = cgroup / "cpu.cfs_quota_us"
    assert quota_file.read_text().strip() == "-1"
    resources = pb.LinuxContainerResources(cpu_period=100_000, cpu_quota=50_000, cpu_shares=512)
    rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(container_id=cid, linux=resources), timeout=20)
    assert quota_file.read_text().strip() == "50000"
    assert (cgroup / "cpu.shares").read_text().strip() == "512"

    rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=0), timeout=30)
    stopped = direct.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10).status
    assert stopped.state == pb.CONTAINER_EXITED
    rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=30)
    assert not direct.runtime.ListContainers(pb.ListContainersRequest(), timeout=10).containers
    rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
    pod = direct.runtime.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=10).status
    assert pod.state == pb.SANDBOX_NOTREADY
    rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
    assert not direct.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items
    assert not cgroup.exists()


def test_list_and_version_answers_equal_direct_ones(
    client: CriClient, direct: CriClient, containerd: Containerd
) -> None:
    run_pod_with_container(client, containerd, "list-a")
    run_pod_with_container(client, containerd, "list-b")
    calls: list[tuple[str, Callable[[CriClient], Any]]] = [
        ("ListContainers", lambda c: c.runtime.ListContainers(pb.ListContainersRequest(), timeout=10)),
        ("ListPodSandbox", lambda c: c.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10)),
        ("ListImages", lambda c: c.image.ListImages(pb.ListImagesRequest(), timeout=10)),
        ("Version", lambda c: c.runtime.Version(pb.VersionRequest(), timeout=10)),
    ]
    for name, call in calls:
        through, straight = call(client), call(direct)
        # containerd lists in Go map order, which differs from call to call: sort by id.
        assert in_id_order(through) == in_id_order(straight), name
    listed = client.runtime.ListContainers(pb.ListContainersRequest(), timeout=10).containers
    assert len(listed) == 2
    images = {
        tag for image in client.image.ListImages(pb.ListImagesRequest(), timeout=10).images for tag in image.repo_tags
    }
    assert {containerd.pause_image, containerd.test_image} <= images
    assert client.runtime.Version(pb.VersionRequest(), timeout=10).runtime_name == "containerd"


def test_six_mib_exec_output_arrives_intact(client: CriClient, containerd: Containerd) -> None:
    _pod, cid, _config = run_pod_with_container(client, containerd, "big")
    size = 6 * MiB
    request = pb.ExecSyncRequest(container_id=cid, cmd=["head", "-c", str(size), "/dev/urandom"], timeout=30)
    response = client.runtime.ExecSync(request, timeout=60)
    assert response.exit_code == 0
    assert len(response.stdout) == size
    # Same bytes as a hash computed inside the container would be, checked with a second
    # command that prints the output and its checksum from the same file.
    both = pb.ExecSyncRequest(
        container_id=cid,
        timeout=30,
        cmd=["sh", "-c", f"head -c {size} /dev/urandom > /tmp/blob; md5sum /tmp/blob >&2; cat /tmp/blob"],
    )
    response = client.runtime.ExecSync(both, timeout=60)
    assert response.exit_code == 0
    assert len(response.stdout) == size
    assert hashlib.md5(response.stdout).hexdigest() == response.stderr.split()[0].decode()


def test_error_statuses_equal_direct_ones(client: CriClient, direct: CriClient, containerd: Containerd) -> None:
    missing = pb.ContainerStatusRequest(container_id="no-such-container-0123456789")
    through = rpc_error(lambda: client.runtime.ContainerStatus(missing, timeout=10))
    straight = rpc_error(lambda: direct.runtime.ContainerStatus(missing, timeout=10))
    assert through.code() == straight.code() == grpc.StatusCode.NOT_FOUND
    assert through.details() == straight.details()
    assert "no-such-container-0123456789" in (through.details() or "")

    def no_such_method(cri: CriClient) -> Any:
        call = cri.channel.unary_unary(
            "/runtime.v1.RuntimeService/NoSuchMethod", request_serializer=None, response_deserializer=None
        )
        return lambda: call(b"", timeout=10)

    through = rpc_error(no_such_method(client))
    straight = rpc_error(no_such_method(direct))
    assert through.code() == straight.code() == grpc.StatusCode.UNIMPLEMENTED
    assert through.details() == straight.details()

    def events(cri: CriClient) -> Callable[[], Any]:
        return lambda: list(cri.runtime.GetContainerEvents(pb.GetEventsRequest(), timeout=10))

    if containerd.build.series != "1.6":
        return  # 1.7 and 2.x stream events: tests/e2e/test_e2e_events.py
    through = rpc_error(events(client))
    straight = rpc_error(events(direct))
    assert through.code() == straight.code() == grpc.StatusCode.UNIMPLEMENTED
    assert through.details() == straight.details()


def test_containerd_restart_under_the_proxy(client: CriClient, containerd: Containerd) -> None:
    pod_id, cid, _config = run_pod_with_container(client, containerd, "restart")
    client.runtime.Version(pb.VersionRequest(), timeout=10)  # the channel is connected
    old_pid = containerd.pid
    containerd.restart()
    assert containerd.pid != old_pid

    listed, _failures = retry(lambda: client.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=2))
    assert pod_id in {pod.id for pod in listed.items}
    # Once one call got through, the next ones do too, with no retry.
    status = client.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10).status
    assert status.state == pb.CONTAINER_RUNNING
    assert client.runtime.Version(pb.VersionRequest(), timeout=10).runtime_name == "containerd"


def test_containerd_down_gives_unavailable_then_recovers(
    client: CriClient, proxy: ProxyDaemon, containerd: Containerd
) -> None:
    client.runtime.Version(pb.VersionRequest(), timeout=10)
    containerd.stop_daemon()
    try:
        for attempt in range(4):
            began = time.monotonic()
            err = rpc_error(lambda: client.runtime.Version(pb.VersionRequest(), timeout=10))
            took = time.monotonic() - began
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            assert took < 2.0, f"UNAVAILABLE took {took:.2f}s"
            # The first call may race the proxy closing the connection whose backend went
            # away (grpc then reports a broken pipe of its own); later ones meet the proxy.
            if attempt:
                assert str(containerd.socket) in (err.details() or ""), err.details()
        with CriClient(str(proxy.endpoint), timeout=10) as fresh:
            err = rpc_error(lambda: fresh.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10))
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            assert str(containerd.socket) in (err.details() or "")
    finally:
        containerd.start()
    version, _failures = retry(lambda: client.runtime.Version(pb.VersionRequest(), timeout=2))
    assert version.runtime_name == "containerd"
    client.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10)
    assert proxy.proc.poll() is None, "the proxy should have kept running"


# -- runtime-proxy play through the proxy ---------------------------------------------------


def test_play_creates_and_deletes_a_pod(proxy: ProxyDaemon, direct: CriClient, containerd: Containerd) -> None:
    common = [
        "--endpoint",
        str(proxy.endpoint),
        "--cgroup-root",
        f"/{containerd.cgroup_prefix}",
        "--log-dir",
        str(containerd.root_dir / "play-logs"),
        "--output",
        "json",
    ]
    manifest = str(PODS / "ls-pod.yaml")
    done = play(manifest, *common)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ok"] is True
    pod_id = result["pod_sandbox_id"]
    assert [c["name"] for c in result["containers"]] == ["app"]

    for container in result["containers"]:
        status = direct.runtime.ContainerStatus(
            pb.ContainerStatusRequest(container_id=container["container_id"]), timeout=10
        ).status
        assert status.state == pb.CONTAINER_RUNNING, status
    sandbox = direct.runtime.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=10).status
    assert sandbox.state == pb.SANDBOX_READY
    assert sandbox.metadata.name == "ls-pod"
    assert sandbox.labels["app"] == "ls-pod"
    assert sandbox.labels["koordinator.sh/qosClass"] == "LS"
    assert sandbox.labels["io.kubernetes.pod.name"] == "ls-pod"
    uid = sandbox.metadata.uid
    cgroup = CGROUP_CPU / containerd.cgroup_parent(uid, "burstable").lstrip("/")
    assert cgroup.is_dir(), cgroup

    deleted = play(manifest, *common, "--delete")
    assert deleted.returncode == 0, deleted.stderr
    summary = json.loads(deleted.stdout)
    assert summary["ok"] is True
    assert summary["pod_sandbox_ids"] == [pod_id]
    assert not direct.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items
    assert not direct.runtime.ListContainers(pb.ListContainersRequest(), timeout=10).containers


def test_play_rejects_a_malformed_manifest(proxy: ProxyDaemon, direct: CriClient) -> None:
    done = play(str(PODS / "bad-quantity.yaml"), "--endpoint", str(proxy.endpoint))
    assert done.returncode == 2, done
    assert "spec.containers[1].resources.limits.cpu" in done.stderr
    assert not direct.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items


# -- the daemon itself ----------------------------------------------------------------------


def test_socket_and_directory_permissions(daemons: Daemons) -> None:
    endpoint = daemons.workdir / "made-by-daemon" / "p.sock"
    daemon = daemons.start(endpoint=endpoint)
    assert stat.S_ISSOCK(endpoint.lstat().st_mode)
    assert stat.S_IMODE(endpoint.lstat().st_mode) == 0o660
    assert stat.S_IMODE(endpoint.parent.stat().st_mode) == 0o750
    with CriClient(str(endpoint)) as cri:
        assert cri.runtime.Version(pb.VersionRequest(), timeout=10).runtime_name == "containerd"
    assert daemon.terminate() == 0
    assert not endpoint.exists()


def test_second_daemon_on_the_same_socket_refuses_to_start(daemons: Daemons) -> None:
    first = daemons.start(name="first")
    second = daemons.start(name="second", endpoint=first.endpoint, ready=False)
    try:
        code = second.proc.wait(15)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"second daemon kept running\n{second.log()}") from None
    assert code == 1, second.log()
    assert str(first.endpoint) in second.stderr()
    assert "READY=1" not in _drain_notifications(second)
    assert first.proc.poll() is None
    assert first.endpoint.exists()
    with CriClient(str(first.endpoint)) as cri:
        assert cri.runtime.Version(pb.VersionRequest(), timeout=10).runtime_name == "containerd"
    assert first.terminate() == 0


def test_stale_socket_of_a_killed_daemon_is_replaced(daemons: Daemons) -> None:
    killed = daemons.start(name="killed")
    killed.kill()
    assert stat.S_ISSOCK(killed.endpoint.lstat().st_mode), "SIGKILL should leave the socket file behind"
    with socket.socket(socket.AF_UNIX) as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(str(killed.endpoint))  # stale indeed: nobody accepts on it
    successor = daemons.start(name="successor", endpoint=killed.endpoint)
    with CriClient(str(successor.endpoint)) as cri:
        assert cri.runtime.Version(pb.VersionRequest(), timeout=10).runtime_name == "containerd"
    assert successor.terminate() == 0


def test_sigterm_lets_an_exec_in_flight_finish(daemons: Daemons, containerd: Containerd) -> None:
    daemon = daemons.start()
    with CriClient(str(daemon.endpoint)) as cri:
        _pod, cid, _config = run_pod_with_container(cri, containerd, "drain")
        request = pb.ExecSyncRequest(container_id=cid, cmd=["sh", "-c", "sleep 2; echo done"], timeout=20)
        began = time.monotonic()
        future = cri.runtime.ExecSync.future(request, timeout=30)
        time.sleep(0.5)
        assert not future.done()
        daemon.proc.send_signal(signal.SIGTERM)
        response = future.result(timeout=30)
        assert (response.stdout, response.exit_code) == (b"done\n", 0)
        assert time.monotonic() - began >= 2.0
    code = daemon.terminate()
    assert code == 0, daemon.log()
    draining = [r for _p, r in daemon.log_records() if r.get("event") == "draining"]
    assert draining and draining[0]["calls_in_flight"] == 1, daemon.stdout()
    drained = [r for _p, r in daemon.log_records() if r.get("event") == "stopped"]
    assert drained and drained[0]["calls_cut_off"] == 0, daemon.stdout()


def test_metrics_count_relayed_calls(daemons: Daemons) -> None:
    port = free_port()
    daemon = daemons.start(extra_args=["--metrics-address", f"127.0.0.1:{port}"])
    calls = 5
    with CriClient(str(daemon.endpoint)) as cri:
        for _ in range(calls):
            cri.runtime.Version(pb.VersionRequest(), timeout=10)
        rpc_error(lambda: cri.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id="nope"), timeout=10))
    text = scrape(port)
    assert calls_total(text, VERSION_PATH, "OK") == calls, text
    assert calls_total(text, "/runtime.v1.RuntimeService/ContainerStatus", "NOT_FOUND") == 1, text
    assert daemon.terminate() == 0


def test_logs_are_json_lines_with_priority_and_lifecycle_calls(
    client: CriClient, proxy: ProxyDaemon, containerd: Containerd
) -> None:
    config = pod_config(containerd, "logged")
    began_wall = datetime.now(UTC)
    began = time.monotonic()
    pod_id = client.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id
    took_ms = (time.monotonic() - began) * 1000
    assert pod_id
    # Ours is the one RunPodSandbox line logged after the call began. The line may come just
    # after the response (the hook layer logs once its after-call step is done): poll briefly.
    deadline = time.monotonic() + 5.0
    while True:
        records = proxy.log_records()
        runs = [
            (p, r)
            for p, r in records
            if r.get("method") == "RunPodSandbox" and datetime.fromisoformat(r["timestamp"]) >= began_wall
        ]
        if runs or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    ready = [(p, r) for p, r in records if r.get("event") == "ready"]
    assert ready and ready[0][0] == "<6>" and ready[0][1]["level"] == "info"
    assert len(runs) == 1, (began_wall, proxy.stdout())
    prefix, record = runs[0]
    assert prefix == "<6>"
    assert record["level"] == "info"
    assert record["code"] == "OK"
    assert datetime.fromisoformat(record["timestamp"]) <= datetime.now(UTC)
    # Milliseconds, and about what the client saw (the hook layer's measure may include its
    # after-call step, so allow some time beyond the client's).
    assert took_ms * 0.5 <= record["duration_ms"] <= took_ms + 1000, (took_ms, record)
    # Non-lifecycle calls stay at debug, which the default level does not show.
    client.runtime.Version(pb.VersionRequest(), timeout=10)
    assert not [r for _p, r in proxy.log_records() if r.get("method") == VERSION_PATH]


def test_endpoint_from_the_environment(daemons: Daemons) -> None:
    endpoint = daemons.workdir / "env.sock"
    daemon = daemons.start(
        endpoint=endpoint, use_endpoint_flag=False, env={"RUNTIME_PROXY_ENDPOINT": f"unix://{endpoint}"}
    )
    assert stat.S_ISSOCK(endpoint.lstat().st_mode)
    with CriClient(str(endpoint)) as cri:
        assert cri.runtime.Version(pb.VersionRequest(), timeout=10).runtime_name == "containerd"
    assert daemon.terminate() == 0


def test_second_daemon_with_the_same_metrics_address_names_the_socket(daemons: Daemons) -> None:
    args = ["--metrics-address", f"127.0.0.1:{free_port()}"]
    first = daemons.start(name="first", extra_args=args)
    second = daemons.start(name="second", endpoint=first.endpoint, extra_args=args, ready=False)
    try:
        code = second.proc.wait(15)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"second daemon kept running\n{second.log()}") from None
    assert first.proc.poll() is None
    assert first.terminate() == 0
    assert code == 1, second.log()
    assert str(first.endpoint) in second.stderr(), second.stderr()
    assert "Traceback" not in second.stderr()


def test_calls_failing_while_the_runtime_is_down_are_counted_and_logged(daemons: Daemons) -> None:
    port = free_port()
    missing = daemons.workdir / "no-runtime.sock"
    daemon = daemons.start(backend=f"unix://{missing}", extra_args=["--metrics-address", f"127.0.0.1:{port}"])
    calls = 3
    with CriClient(str(daemon.endpoint)) as cri:
        for _ in range(calls):
            err = rpc_error(lambda: cri.runtime.Version(pb.VersionRequest(), timeout=10))
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            assert str(missing) in (err.details() or "")
        err = rpc_error(lambda: cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(), timeout=10))
        assert err.code() == grpc.StatusCode.UNAVAILABLE
    text = scrape(port)
    assert daemon.terminate() == 0
    runs = [r for _p, r in daemon.log_records() if r.get("method") == "RunPodSandbox"]
    assert runs and runs[0]["code"] == "UNAVAILABLE", daemon.stdout()
    assert calls_total(text, VERSION_PATH, "UNAVAILABLE") == calls, text
