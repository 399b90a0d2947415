"""Fault injection: large intercepted requests cannot take the node's memory.

The proxy daemon in front of the real containerd gets 16 concurrent 15 MiB lifecycle
requests (the hook layer holds, decodes and re-encodes each one). Past its held-request
budget calls end with RESOURCE_EXHAUSTED and a message that says why; the daemon's RSS stays
bounded while they run and falls back once they are over.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from daemons import Daemon, ProxyAndHooks

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1 import api_pb2_grpc as cri_grpc
from runtimeproxy.testbed import Containerd

# About the proxy, not the runtime: one series (what production runs) is enough.
pytestmark = [pytest.mark.e2e, pytest.mark.containerd_series("1.7")]

MiB = 1 << 20
CALLERS = 16
REQUEST_BYTES = 15 * MiB
# What one 15 MiB call may cost while held (copies, decoded message, re-encoded request)
# times the two the default budget (2 x 16 MiB) admits at once, plus the daemon itself.
PEAK_LIMIT = 300 * MiB
# Back near where it started once the calls are over.
AFTER_LIMIT = 30 * MiB


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def proxy(containerd: Containerd) -> Iterator[tuple[ProxyAndHooks, Daemon]]:
    layout = ProxyAndHooks(containerd, "rpm-")
    layout.config_dir.mkdir()
    try:
        yield layout, layout.start_daemon("proxy", layout.proxy_args())
    finally:
        layout.kill_daemons()
        shutil.rmtree(layout.workdir, ignore_errors=True)


def big_update(i: int) -> cri.UpdateContainerResourcesRequest:
    return cri.UpdateContainerResourcesRequest(
        container_id=f"no-such-container-{i}",
        linux=cri.LinuxContainerResources(cpu_shares=512),
        annotations={"payload": "x" * REQUEST_BYTES},
    )


def test_large_requests_are_budgeted_and_memory_comes_back(proxy: tuple[ProxyAndHooks, Daemon]) -> None:
    layout, daemon = proxy
    pid = daemon.proc.pid
    options = [("grpc.max_send_message_length", 32 * MiB), ("grpc.max_receive_message_length", 32 * MiB)]
    channel = grpc.insecure_channel(f"unix://{layout.proxy_endpoint}", options=options)
    stub = cri_grpc.RuntimeServiceStub(channel)
    stub.Version(cri.VersionRequest(), timeout=10)
    before = rss(pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], rss(pid))

    def call(i: int) -> tuple[grpc.StatusCode, str]:
        try:
            stub.UpdateContainerResources(big_update(i), timeout=120)
        except grpc.RpcError as error:
            return error.code(), error.details() or ""
        return grpc.StatusCode.OK, ""

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(CALLERS) as pool:
            outcomes = list(pool.map(call, range(CALLERS)))
    finally:
        done.set()
        sampler.join()
    stub.Version(cri.VersionRequest(), timeout=10)
    after = rss(pid)
    channel.close()

    print(f"proxy RSS {before / MiB:.1f} MiB, peak {peak[0] / MiB:.1f} MiB, after {after / MiB:.1f} MiB")
    codes = [code for code, _ in outcomes]
    # The runtime answers NOT_FOUND for the ones that reached it; the rest were held back.
    assert set(codes) <= {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED}, outcomes
    assert grpc.StatusCode.NOT_FOUND in codes
    refused = [details for code, details in outcomes if code == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert refused and all("--held-request-budget" in details for details in refused)
    assert peak[0] - before < PEAK_LIMIT, f"RSS {before / MiB:.0f} MiB -> peak {peak[0] / MiB:.0f} MiB"
    assert after - before < AFTER_LIMIT, f"RSS {before / MiB:.0f} MiB -> {after / MiB:.0f} MiB after the calls"
    assert daemon.alive
