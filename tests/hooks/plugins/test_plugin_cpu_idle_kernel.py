"""cpu.idle and the shares, on this kernel's cgroup v1 cpu hierarchy (a fake tree cannot show it).

The kernel pins an idle group's shares (3; cpu.weight 0 on v2) and refuses to write them
(EINVAL); making the group not idle again resets them to 1024. So the cpu plugin writes a pod's
shares while its group is not idle: before making it idle, after making it not idle, never while
it is and stays idle, where every reconcile round would otherwise log a refused write.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runtimeproxy.hooks.cgroups import CgroupFS, PodRoots
from runtimeproxy.hooks.extended_resources import BATCH_CPU, EXTENDED_RESOURCE_SPEC_ANNOTATION
from runtimeproxy.hooks.plugins import cpu
from runtimeproxy.hooks.sdk import HookPoint
from runtimeproxy.hooks.testkit.builders import pod as make_pod
from runtimeproxy.hooks.testkit.builders import run_plugin
from structlog.testing import capture_logs

CPU = Path("/sys/fs/cgroup/cpu")
SPEC = json.dumps({"containers": {"main": {"requests": {BATCH_CPU: "500"}, "limits": {BATCH_CPU: "1000"}}}})
BATCH_SHARES = "512"  # 500m of batch-cpu requests
IDLE = "cpu: {BE: {cpu_idle: true}}"
NOT_IDLE = "cpu: {BE: {cpu_idle: false}}"


@pytest.fixture
def pod_dir() -> Iterator[tuple[CgroupFS, str, Path]]:
    """A BE pod cgroup in the real cpu hierarchy, under a root of its own; removed after."""
    if os.geteuid() != 0 or not (CPU / "cpu.idle").is_file():
        pytest.fail("needs root and a cgroup v1 cpu hierarchy with cpu.idle (Linux 5.15+), as CI has")
    prefix = f"rtpx-idle-{uuid.uuid4().hex[:8]}"
    parent = f"/{prefix}/kubepods/besteffort/pod{uuid.uuid4()}"
    directory = CPU / parent.lstrip("/")
    directory.mkdir(parents=True)
    try:
        yield CgroupFS("/sys/fs/cgroup", pod_roots=PodRoots([f"/{prefix}/kubepods"])), parent, directory
    finally:
        for path in (directory, *list(directory.parents)[:3]):
            with contextlib.suppress(OSError):
                path.rmdir()


async def apply(fs: CgroupFS, parent: str, point: HookPoint, policy: str) -> list[dict[str, Any]]:
    """Run the cpu plugin's pod handler at ``point`` under ``policy``; the lines it logged."""
    pod = make_pod(
        "batch", qos="BE", uid=parent[-36:], cgroup_parent=parent, annotations={EXTENDED_RESOURCE_SPEC_ANNOTATION: SPEC}
    )
    with capture_logs() as logs:
        result = await run_plugin(cpu.plugin, point, pod=pod, cgroups=fs, policy=policy)
    assert result.failures == []
    return logs


def refused(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] == "cgroup write failed"]


async def test_an_idle_pod_gets_its_shares_first_and_they_are_not_written_again(
    pod_dir: tuple[CgroupFS, str, Path],
) -> None:
    fs, parent, directory = pod_dir
    logs = await apply(fs, parent, HookPoint.PRE_RUN_POD_SANDBOX, IDLE)
    assert refused(logs) == []
    assert (directory / "cpu.idle").read_text().strip() == "1"
    assert (directory / "cpu.shares").read_text().strip() == "3"  # the kernel's, for an idle group
    for _ in range(2):  # what each reconcile round does: the pinned shares are no drift
        logs = await apply(fs, parent, HookPoint.PRE_UPDATE_POD_SANDBOX_RESOURCES, IDLE)
        assert refused(logs) == [], refused(logs)
        assert not [line for line in logs if line["event"] == "cgroup written"]


async def test_a_pod_made_not_idle_gets_its_shares_back_at_once(pod_dir: tuple[CgroupFS, str, Path]) -> None:
    fs, parent, directory = pod_dir
    await apply(fs, parent, HookPoint.PRE_RUN_POD_SANDBOX, IDLE)
    logs = await apply(fs, parent, HookPoint.PRE_UPDATE_POD_SANDBOX_RESOURCES, NOT_IDLE)
    assert refused(logs) == [], refused(logs)
    assert (directory / "cpu.idle").read_text().strip() == "0"
    assert (directory / "cpu.shares").read_text().strip() == BATCH_SHARES  # not the kernel's 1024
    written = [Path(line["file"]).name for line in logs if line["event"] == "cgroup written"]
    assert written == ["cpu.idle", "cpu.shares"]


async def test_a_pod_made_idle_later_keeps_the_shares_it_had(pod_dir: tuple[CgroupFS, str, Path]) -> None:
    fs, parent, directory = pod_dir
    await apply(fs, parent, HookPoint.PRE_RUN_POD_SANDBOX, NOT_IDLE)
    assert (directory / "cpu.shares").read_text().strip() == BATCH_SHARES
    logs = await apply(fs, parent, HookPoint.PRE_UPDATE_POD_SANDBOX_RESOURCES, IDLE)
    assert refused(logs) == []
    assert (directory / "cpu.idle").read_text().strip() == "1"
