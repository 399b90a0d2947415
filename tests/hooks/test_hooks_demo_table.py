"""runtime-proxy demo's before/after cgroup table: kubelet's values against the node's, changes marked."""

from __future__ import annotations

from pathlib import Path

from runtimeproxy.hooks.cgroups import CgroupVersion
from runtimeproxy.hooks.demo_table import NEW_CGROUP, CgroupTable, CgroupValue, format_tables, read_table
from runtimeproxy.hooks.testkit.fake_cgroups import make_fake_cgroup_v1

from runtimeproxy.api.runtime.v1 import api_pb2 as cri

CID = "c" * 64


def test_format_marks_only_changed_values_and_aligns_columns() -> None:
    tables = [
        CgroupTable(
            "web",
            "/sys/fs/cgroup/cpu/kubepods/pod1/" + CID,
            (
                CgroupValue("cpu.cfs_quota_us", "50000", "50000"),
                CgroupValue("cpu.cfs_burst_us", "0", "50000"),
                CgroupValue("memory.soft_limit_in_bytes", "0", "-"),
            ),
        )
    ]
    lines = format_tables(tables).splitlines()
    assert lines[0] == f"web: /sys/fs/cgroup/cpu/kubepods/pod1/{CID}"
    assert lines[1].split() == ["file", "before", "after"]
    assert lines[2].split() == ["cpu.cfs_quota_us", "50000", "50000"]
    assert lines[3].split() == ["cpu.cfs_burst_us", "0", "50000", "<-", "changed"]
    assert lines[4].split() == ["memory.soft_limit_in_bytes", "0", "-"]  # missing after: not a change
    assert len({len(line) for line in lines[1:3]}) == 1  # right-aligned columns end together


def test_read_table_compares_kubelet_values_with_the_node(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v1(tmp_path / "cgroup")
    parent = tree.add_pod("u1")
    tree.add_container(parent, CID)
    fs = tree.fs()
    fs.write("cpu", "cpu.cfs_quota_us", 50000, parent, CID)
    fs.write("cpu", "cpu.cfs_burst_us", 25000, parent, CID)  # what a plugin sets
    resources = cri.LinuxContainerResources(cpu_quota=50000, cpu_period=100000, cpu_shares=256)
    table = read_table(fs, "web", parent, CID, resources)
    values = {value.file: value for value in table.values}
    assert table.where == str(fs.path("cpu", parent, CID))
    assert values["cpu.cfs_quota_us"].before == "50000" and not values["cpu.cfs_quota_us"].changed
    assert values["cpu.cfs_burst_us"].before == NEW_CGROUP[CgroupVersion.V1]["cpu.cfs_burst_us"]
    assert values["cpu.cfs_burst_us"].after == "25000" and values["cpu.cfs_burst_us"].changed
    assert values["cpu.shares"].before == "256"


def test_read_table_shows_missing_cgroup_as_dash(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v1(tmp_path / "cgroup")
    table = read_table(tree.fs(), "pod", tree.pod_parent("gone"), None, cri.LinuxContainerResources())
    assert {value.after for value in table.values} == {"-"}
    assert not any(value.changed for value in table.values)
