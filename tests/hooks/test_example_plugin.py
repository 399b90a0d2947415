"""The example third-party plugin (examples/rtpx-plugin-envstamp) as its users would run it.

The package is pip-installed into this interpreter (uninstalled afterwards), then found by
``runtime-hooks plugins`` and served by ``runtime-hooks serve`` as a subprocess, which
registers with a ``runtime-proxy serve`` subprocess in front of the real containerd test bed.
A pod run through the proxy must see the plugin's work: the environment variable in the
container, the annotations on it, and the cpu shares it read from the container's real cgroup
in the hook server's log. The example's own test suite runs against the installed package too.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemons import Daemon, ProxyAndHooks
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupVersion, shares_to_weight, weight_to_shares

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "rtpx-plugin-envstamp"
DIST = "rtpx-plugin-envstamp"
HOOKS = [sys.executable, "-c", "from runtimeproxy.hooks.cli import main; main()"]
# The proxy polls its hook config directory every 0.2 s; allow for a loaded machine.
REGISTRATION_LATENCY = 5.0
CONTAINER_SHARES = 512


# -- installing the example ---------------------------------------------------------------------


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "--no-input"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def _installed() -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        return None


def _reinstall_args(dist: importlib.metadata.Distribution) -> list[str] | None:
    """pip install arguments that put back an installation found before the tests (None: unknown origin)."""
    raw = dist.read_text("direct_url.json")
    if not raw:
        return None
    origin = json.loads(raw)
    url = origin.get("url", "")
    if not url.startswith("file://"):
        return None
    path = urllib.request.url2pathname(url.removeprefix("file://"))
    return ["-e", path] if origin.get("dir_info", {}).get("editable") else [path]


@pytest.fixture(scope="module")
def envstamp_package() -> Iterator[Path]:
    """The example installed with ``pip install --no-deps --no-build-isolation``; its source copy.

    pip builds in the source tree (build/, *.egg-info), so it builds a copy, not examples/.
    An installation that was there before is put back afterwards.
    """
    before = _installed()
    restore = _reinstall_args(before) if before is not None else None
    workdir = Path(tempfile.mkdtemp(prefix="rtpx-envstamp-"))
    source = workdir / "rtpx-plugin-envstamp"
    shutil.copytree(
        EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache")
    )
    try:
        done = _pip("install", "--no-deps", "--no-build-isolation", "--force-reinstall", str(source))
        assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
        installed = _installed()
        assert installed is not None and installed.version == "1.1.0"
        yield source
    finally:
        done = _pip("uninstall", "--yes", DIST)
        if restore is not None:
            _pip("install", "--no-deps", "--no-build-isolation", *restore)
        shutil.rmtree(workdir, ignore_errors=True)
    assert done.returncode == 0, f"pip uninstall failed:\n{done.stdout}\n{done.stderr}"
    if before is None:
        assert _installed() is None, "the example is still installed after the tests"


def test_the_plugins_command_lists_envstamp(envstamp_package: Path) -> None:
    table = subprocess.run([*HOOKS, "plugins"], capture_output=True, text=True, timeout=60, check=False)
    listing = subprocess.run([*HOOKS, "plugins", "--json"], capture_output=True, text=True, timeout=60, check=False)
    data = json.loads(listing.stdout)
    # Exit 1 only for plugins of other packages that failed to load, never for this one.
    assert not [f for f in data["failures"] if f["name"] == "envstamp"], data["failures"]
    assert listing.returncode == table.returncode == (1 if data["failures"] else 0), table.stdout + table.stderr
    [plugin] = [p for p in data["plugins"] if p["name"] == "envstamp"]
    assert plugin["version"] == "1.1.0"
    assert plugin["hooks"] == ["PreCreateContainer", "PostStartContainer"]
    assert (plugin["enabled"], plugin["failure_policy"], plugin["order"]) == (True, "ignore", 200)
    [row] = [line.split() for line in table.stdout.splitlines() if line.startswith("envstamp ")]
    assert row == [
        "envstamp",
        "1.1.0",
        "200",
        "yes",
        "ignore",
        "0.5s",
        "envstamp",
        "PreCreateContainer,PostStartContainer",
    ]


def test_the_example_test_suite_passes_against_the_installed_package(envstamp_package: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=envstamp_package,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"\b\d+ passed\b", run.stdout) and "failed" not in run.stdout, run.stdout


# -- the daemons ------------------------------------------------------------------------------------


class Node(ProxyAndHooks):
    """The proxy and the hook server in one short temporary directory (socket paths are limited)."""

    def __init__(self, containerd: Containerd) -> None:
        super().__init__(containerd, "rtpxex-")

    def start_proxy(self) -> Daemon:
        return self.start_daemon("proxy", self.proxy_args())

    def start_hooks(self, *options: str) -> Daemon:
        args = self.hooks_args(HOOKS, self.workdir / "no-resctrl", *options)
        # A server that reconciles lists the live pods from the CRI runtime: the test bed's.
        # (An environment variable, not --runtime-endpoint: a server without it ignores it.)
        return self.start_daemon("hooks", args, {"RUNTIME_HOOKS_RUNTIME_ENDPOINT": self.containerd.address})

    def close(self) -> None:
        try:
            self.kill_daemons()
        finally:
            self.containerd.remove_all_pods()
            shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture
def node(containerd: Containerd, envstamp_package: Path) -> Iterator[Node]:
    made = Node(containerd)
    try:
        yield made
    finally:
        made.close()


# -- the pod -------------------------------------------------------------------------------------------


def run_pod(cri: CriClient, bed: Containerd) -> tuple[str, str, str]:
    """RunPodSandbox, CreateContainer (cpu shares 512) and StartContainer through ``cri``: (pod, container, parent)."""
    uid = str(uuid.uuid4())
    parent = bed.cgroup_parent(uid, "besteffort")
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=f"envstamp-{uid[:8]}", uid=uid, namespace="e2e"),
        log_directory=str(bed.root_dir / "pod-logs" / uid),
        labels={"app": "envstamp"},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=parent,
            # Host network: no CNI needed.
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
        ),
    )
    pod_id = cri.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id
    container = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app"),
        image=pb.ImageSpec(image=bed.test_image),
        log_path="app.log",
        envs=[pb.KeyValue(key="GREETING", value=b"hello")],
        linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(cpu_shares=CONTAINER_SHARES)),
    )
    request = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=container, sandbox_config=config)
    container_id = cri.runtime.CreateContainer(request, timeout=60).container_id
    cri.runtime.StartContainer(pb.StartContainerRequest(container_id=container_id), timeout=60)
    return pod_id, container_id, parent


def exec_output(cri: CriClient, container_id: str, script: str) -> str:
    request = pb.ExecSyncRequest(container_id=container_id, cmd=["sh", "-c", script], timeout=10)
    reply = cri.runtime.ExecSync(request, timeout=30)
    assert reply.exit_code == 0, reply.stderr
    return str(reply.stdout.decode())


def is_call(record: dict[str, Any], *, method: str) -> bool:
    return record.get("event") == "lifecycle call" and record.get("method") == method


def test_envstamp_in_a_real_pod(node: Node, containerd: Containerd) -> None:
    proxy = node.start_proxy()
    hooks = node.start_hooks("--enable", "envstamp")
    hooks.wait_record(lambda r: r.get("event") == "ready")

    # The hook server registered the hook points of its enabled plugins, and the proxy took it up.
    registration = json.loads((node.config_dir / "runtime-hooks.json").read_text())
    assert registration["remote-endpoint"] == str(node.hooks_endpoint)
    assert registration["runtime-hooks"] == ["PreCreateContainer", "PostStartContainer"]
    assert registration["failure-policy"] == "Ignore"
    serving = hooks.wait_record(lambda r: r.get("event") == "serving runtime hooks")
    assert serving["plugins"] == ["envstamp"]
    added = proxy.wait_record(
        lambda r: r.get("event") == "hook server added" and r.get("server") == "runtime-hooks.json",
        timeout=REGISTRATION_LATENCY,
    )
    assert added["hooks"] == ["PostStartContainer", "PreCreateContainer"]
    assert added["endpoint"] == str(node.hooks_endpoint)

    with CriClient(str(node.proxy_endpoint), timeout=30.0) as cri:
        _, container_id, parent = run_pod(cri, containerd)

        # PreCreateContainer: the variable is in the container, next to its own, and the
        # annotations are on it.
        assert exec_output(cri, container_id, "echo $RTPX_QOS") == "BE\n"  # besteffort cgroup parent
        assert exec_output(cri, container_id, "echo $GREETING") == "hello\n"
        status = cri.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=container_id), timeout=30)
        annotations = dict(status.status.annotations)
        assert annotations["envstamp.example.com/qos"] == "BE"
        assert annotations["envstamp.example.com/qos-source"] == "kubernetes-cgroup-parent"

    # PostStartContainer: the plugin read the container's real cgroup.
    started = hooks.wait_record(lambda r: r.get("event") == "envstamp: container started")
    host = CgroupFS("/sys/fs/cgroup", "cgroupfs")
    on_v1 = host.version is CgroupVersion.V1
    expected = CONTAINER_SHARES if on_v1 else weight_to_shares(shares_to_weight(CONTAINER_SHARES))
    assert started["cpu_shares"] == expected == host.cpu_shares(parent, container_id=container_id)
    assert (started["plugin"], started["hook"], started["container"]) == ("envstamp", "PostStartContainer", "app")
    assert started["cgroup_version"] == int(host.version)

    # The proxy's record of the calls: the hook server answered both hook points.
    for method in ("CreateContainer", "StartContainer"):
        call = proxy.wait_record(functools.partial(is_call, method=method))
        assert call["hooks"] == ["runtime-hooks.json:ok"], call
        assert call["code"] == "OK", call
        if method == "CreateContainer":
            assert "env[RTPX_QOS] set" in call["changes"], call

    # Stopping the hook server unregisters it, and the proxy drops it.
    assert hooks.terminate() == 0, hooks.log()
    assert not (node.config_dir / "runtime-hooks.json").exists()
    assert not node.hooks_endpoint.exists()
    proxy.wait_record(
        lambda r: r.get("event") == "hook server removed" and r.get("server") == "runtime-hooks.json",
        timeout=REGISTRATION_LATENCY,
    )
    assert proxy.terminate() == 0, proxy.log()
    problems = [r for r in hooks.records() if r.get("level") in ("warning", "error") and "envstamp" in json.dumps(r)]
    assert problems == [], problems
