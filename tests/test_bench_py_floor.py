"""bench/nri_py_floor.py, the bare Python NRI plugin the peer benchmark measures beside the Go
peer: it must make the Go peer's BestEffort adjustments, or the comparison is void."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import ModuleType

import pytest
from bench_scripts import bench_module
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri_pb

SPEC = {
    "containers": {
        "main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1500"}},
        "side": {"requests": {"kubernetes.io/batch-cpu": "250"}, "limits": {}},
    }
}


@pytest.fixture(scope="module")
def floor() -> ModuleType:
    return bench_module("nri_py_floor")


def be_pod(parent: str = "/kubepods/besteffort/pod1", qos: str = "BE") -> nri_pb.PodSandbox:
    pod = nri_pb.PodSandbox(
        labels={"koordinator.sh/qosClass": qos},
        annotations={"node.koordinator.sh/extended-resource-spec": json.dumps(SPEC)},
    )
    pod.linux.cgroup_parent = parent
    return pod


def pod_dir(root: Path, parent: str) -> Path:
    directory = root / "cpu" / parent.strip("/")
    directory.mkdir(parents=True)
    for name in ("cpu.cfs_quota_us", "cpu.shares"):
        (directory / name).write_text("-1\n" if "quota" in name else "1024\n")
    return directory


def test_a_be_pod_gets_the_sum_of_its_containers_quota_and_shares(floor: ModuleType, tmp_path: Path) -> None:
    directory = pod_dir(tmp_path, "/kubepods/besteffort/pod1")
    floor.FloorPlugin(str(tmp_path)).run_pod(be_pod())
    assert (directory / "cpu.cfs_quota_us").read_text() == "150000"  # 1500m of a 100 ms period
    assert (directory / "cpu.shares").read_text() == str(750 * 1024 // 1000)


def test_other_pods_are_left_alone(floor: ModuleType, tmp_path: Path) -> None:
    directory = pod_dir(tmp_path, "/kubepods/burstable/pod2")
    floor.FloorPlugin(str(tmp_path)).run_pod(be_pod("/kubepods/burstable/pod2", qos="LS"))
    assert (directory / "cpu.shares").read_text() == "1024\n"


def test_a_cgroup_parent_cannot_lead_out_of_the_cpu_root(floor: ModuleType, tmp_path: Path) -> None:
    inside = pod_dir(tmp_path / "root", "/etc")
    (tmp_path / "etc").mkdir()
    floor.FloorPlugin(str(tmp_path / "root")).run_pod(be_pod("/../../etc"))
    assert (inside / "cpu.shares").read_text() == str(750 * 1024 // 1000)
    assert list((tmp_path / "etc").iterdir()) == []


def test_create_container_adjusts_the_containers_cpu_as_the_go_peer(floor: ModuleType) -> None:
    container = nri_pb.Container(name="main")
    request = nri_pb.CreateContainerRequest(pod=be_pod(), container=container).SerializeToString()
    plugin = floor.FloorPlugin("/nonexistent")
    answer = nri_pb.CreateContainerResponse.FromString(asyncio.run(plugin.create(request, None)))
    cpu = answer.adjust.linux.resources.cpu
    assert (cpu.shares.value, cpu.quota.value, cpu.period.value) == (512, 150000, 100000)
    unknown = nri_pb.CreateContainerRequest(pod=be_pod(), container=nri_pb.Container(name="other"))
    empty = asyncio.run(plugin.create(unknown.SerializeToString(), None))
    assert not nri_pb.CreateContainerResponse.FromString(empty).HasField("adjust")


def test_it_subscribes_the_three_measured_events_only(floor: ModuleType) -> None:
    answer = asyncio.run(floor.FloorPlugin("/nonexistent").configure(b"", None))
    mask = nri_pb.ConfigureResponse.FromString(answer).events
    subscribed = {event for event in range(1, 14) if mask & (1 << (event - 1))}
    assert subscribed == {nri_pb.RUN_POD_SANDBOX, nri_pb.CREATE_CONTAINER, nri_pb.POST_START_CONTAINER}


@given(st.integers(min_value=-(10**6), max_value=10**9))
def test_shares_stay_within_the_kernels_range(floor: ModuleType, milli: int) -> None:
    shares = floor.shares(milli)
    assert 2 <= shares <= 262144
    if 2 * 1000 // 1024 + 2 <= milli <= 262144 * 1000 // 1024:
        assert shares == milli * 1024 // 1000
