"""Fake cgroup v1 and v2 trees in a plain directory, with the kernel's file names and initial values.

    tree = make_fake_cgroup_v2(tmp_path / "cgroup", driver="systemd")
    parent = tree.add_pod("1234-5678", qos="burstable")     # "kubepods-burstable-pod1234_5678.slice"
    tree.add_container(parent, "abc123")                    # .../cri-containerd-abc123.scope
    fs = tree.fs()                                          # a CgroupFS on the tree
    fs.set_cpu_quota(parent, 50000, container_id="abc123")
    assert tree.read(parent, "cpu.max", container_id="abc123") == "50000 100000"

What is faithful: directory layout (v1: one hierarchy per controller, ``cpu`` and ``cpuacct``
links to ``cpu,cpuacct`` as systemd mounts them; v2: one tree), which files a new cgroup
gets (v2: only those of the controllers its parent enables in ``cgroup.subtree_control``;
the root has no ``cpu.max``, ``cpu.weight``, ``memory.min``... as in the kernel), and the
values a fresh cgroup reads (``cpu.max`` "max 100000", ``cpu.weight`` "100",
``memory.high`` "max", v1 ``cpu.shares`` "1024", ``cpu.cfs_quota_us`` "-1",
``memory.soft_limit_in_bytes`` "9223372036854771712"...). Kubelet's pod and QoS
cgroups and the runtimes' container cgroups are named as on a node (cgroupfs and systemd).

What is not: the files are regular files, so a write replaces the content verbatim --
the kernel's parsing, validation and normalisation (``cpu.max`` "50000" keeping the
period, ``cpu.weight`` range checks) do not happen.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from ..cgroups import CgroupDriver, CgroupFS, CgroupVersion, parent_path

__all__ = [
    "V1_HIERARCHIES",
    "V1_UNLIMITED",
    "V2_CONTROLLERS",
    "FakeCgroup",
    "make_fake_cgroup_v1",
    "make_fake_cgroup_v2",
]

KubeQoS = Literal["guaranteed", "burstable", "besteffort"]
Runtime = Literal["containerd", "crio", "docker"]

#: What the v1 memory controller prints for "no limit": PAGE_COUNTER_MAX * 4 KiB pages.
V1_UNLIMITED: Final = "9223372036854771712"

#: v2 controllers of the root's cgroup.controllers, in the kernel's order.
V2_CONTROLLERS: Final = ("cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc")
# What systemd enables for its children on a typical node (cgroup.subtree_control of the root).
_V2_ROOT_SUBTREE: Final = ("cpuset", "cpu", "io", "memory", "hugetlb", "pids")

#: v1 hierarchy directories and the links systemd adds next to co-mounted ones.
V1_HIERARCHIES: Final[Mapping[str, tuple[str, ...]]] = {
    "cpu,cpuacct": ("cpu", "cpuacct"),
    "cpuset": (),
    "memory": (),
    "blkio": (),
    "pids": (),
    "hugetlb": (),
    "freezer": (),
    "devices": (),
    "net_cls,net_prio": ("net_cls", "net_prio"),
    "perf_event": (),
    "systemd": (),
}

_CPUS: Final = "0-3"
_MEMS: Final = "0"

# -- file contents, by controller -------------------------------------------------------------

# A pressure (PSI) file with no stalls recorded.
_PSI: Final = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"

_V2_CORE: Final[Mapping[str, str]] = {
    "cgroup.events": "populated 0\nfrozen 0\n",
    "cgroup.freeze": "0\n",
    "cgroup.kill": "",
    "cgroup.max.depth": "max\n",
    "cgroup.max.descendants": "max\n",
    "cgroup.procs": "",
    "cgroup.stat": "nr_descendants 0\nnr_dying_descendants 0\n",
    "cgroup.threads": "",
    "cgroup.type": "domain\n",
    "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0\n",
    "cpu.pressure": _PSI,
    "io.pressure": _PSI,
    "memory.pressure": _PSI,
}
_V2_ROOT_CORE: Final[Mapping[str, str]] = {
    "cgroup.max.depth": "max\n",
    "cgroup.max.descendants": "max\n",
    "cgroup.procs": "",
    "cgroup.stat": "nr_descendants 0\nnr_dying_descendants 0\n",
    "cgroup.threads": "",
    "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0\n",
    "cpu.pressure": _PSI,
    "io.pressure": _PSI,
    "memory.pressure": _PSI,
    "cpuset.cpus.effective": f"{_CPUS}\n",
    "cpuset.mems.effective": f"{_MEMS}\n",
    "memory.stat": "anon 0\nfile 0\n",
    "io.stat": "",
}
_V2_FILES: Final[Mapping[str, Mapping[str, str]]] = {
    "cpu": {
        "cpu.max": "max 100000\n",
        "cpu.max.burst": "0\n",
        "cpu.weight": "100\n",
        "cpu.weight.nice": "0\n",
        "cpu.idle": "0\n",
        "cpu.uclamp.min": "0.00\n",
        "cpu.uclamp.max": "max\n",
    },
    "memory": {
        "memory.current": "0\n",
        "memory.min": "0\n",
        "memory.low": "0\n",
        "memory.high": "max\n",
        "memory.max": "max\n",
        "memory.peak": "0\n",
        "memory.oom.group": "0\n",
        "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
        "memory.stat": "anon 0\nfile 0\n",
        "memory.swap.current": "0\n",
        "memory.swap.high": "max\n",
        "memory.swap.max": "max\n",
    },
    "cpuset": {
        "cpuset.cpus": "\n",
        "cpuset.mems": "\n",
        "cpuset.cpus.effective": f"{_CPUS}\n",
        "cpuset.mems.effective": f"{_MEMS}\n",
        "cpuset.cpus.partition": "member\n",
    },
    "io": {"io.max": "", "io.stat": "", "io.weight": "default 100\n"},
    "hugetlb": {
        "hugetlb.2MB.current": "0\n",
        "hugetlb.2MB.max": "max\n",
        "hugetlb.1GB.current": "0\n",
        "hugetlb.1GB.max": "max\n",
    },
    "pids": {"pids.current": "0\n", "pids.max": "max\n", "pids.events": "max 0\n"},
    "rdma": {"rdma.max": "", "rdma.current": ""},
    "misc": {"misc.max": "", "misc.current": ""},
}
# Anolis OS (Alibaba Cloud Linux) additions; written only with anolis=True.
_ANOLIS_FILES: Final[Mapping[str, Mapping[str, str]]] = {
    "cpu": {"cpu.bvt_warp_ns": "0\n"},
    "memory": {"memory.wmark_ratio": "0\n", "memory.wmark_scale_factor": "50\n", "memory.wmark_min_adj": "0\n"},
}

_V1_COMMON: Final[Mapping[str, str]] = {
    "cgroup.procs": "",
    "tasks": "",
    "cgroup.clone_children": "0\n",
    "notify_on_release": "0\n",
}
_V1_ROOT_ONLY: Final[Mapping[str, str]] = {"release_agent": "\n", "cgroup.sane_behavior": "0\n"}
_V1_FILES: Final[Mapping[str, Mapping[str, str]]] = {
    "cpu,cpuacct": {
        "cpu.shares": "1024\n",
        "cpu.cfs_quota_us": "-1\n",
        "cpu.cfs_period_us": "100000\n",
        "cpu.cfs_burst_us": "0\n",
        "cpu.idle": "0\n",
        "cpu.rt_period_us": "1000000\n",
        "cpu.rt_runtime_us": "0\n",
        "cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n",
        "cpuacct.usage": "0\n",
        "cpuacct.stat": "user 0\nsystem 0\n",
        "cpuacct.usage_percpu": "0 0 0 0 \n",
    },
    "memory": {
        "memory.limit_in_bytes": f"{V1_UNLIMITED}\n",
        "memory.soft_limit_in_bytes": f"{V1_UNLIMITED}\n",
        "memory.usage_in_bytes": "0\n",
        "memory.max_usage_in_bytes": "0\n",
        "memory.failcnt": "0\n",
        "memory.swappiness": "60\n",
        "memory.use_hierarchy": "1\n",
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
        "memory.stat": "cache 0\nrss 0\n",
    },
    "cpuset": {
        "cpuset.cpus": "\n",
        "cpuset.mems": "\n",
        "cpuset.effective_cpus": "\n",
        "cpuset.effective_mems": "\n",
        "cpuset.cpu_exclusive": "0\n",
        "cpuset.mem_exclusive": "0\n",
        "cpuset.sched_load_balance": "1\n",
    },
    "blkio": {"blkio.throttle.read_bps_device": "", "blkio.throttle.write_bps_device": ""},
    "pids": {"pids.current": "0\n", "pids.max": "max\n"},
    "hugetlb": {
        "hugetlb.2MB.limit_in_bytes": f"{V1_UNLIMITED}\n",
        "hugetlb.2MB.usage_in_bytes": "0\n",
        "hugetlb.1GB.limit_in_bytes": f"{V1_UNLIMITED}\n",
        "hugetlb.1GB.usage_in_bytes": "0\n",
    },
    "freezer": {"freezer.state": "THAWED\n"},
    "devices": {"devices.list": "a *:* rwm\n"},
    "net_cls,net_prio": {"net_cls.classid": "0\n", "net_prio.prioidx": "1\n"},
    "perf_event": {},
    "systemd": {},
}
_V1_ANOLIS: Final[Mapping[str, Mapping[str, str]]] = {
    "cpu,cpuacct": {"cpu.bvt_warp_ns": "0\n"},
    "memory": {"memory.wmark_ratio": "0\n", "memory.wmark_scale_factor": "50\n", "memory.wmark_min_adj": "0\n"},
}
# Files the kernel leaves out of a v1 hierarchy's root cgroup.
_V1_NOT_IN_ROOT: Final = frozenset({"pids.max", "freezer.state"})
_V1_ROOT_VALUES: Final[Mapping[str, str]] = {
    "cpuset.cpus": f"{_CPUS}\n",
    "cpuset.mems": f"{_MEMS}\n",
    "cpuset.effective_cpus": f"{_CPUS}\n",
    "cpuset.effective_mems": f"{_MEMS}\n",
    "cpu.rt_runtime_us": "950000\n",
}

_CONTAINER_DIRS: Final[Mapping[tuple[Runtime, CgroupDriver], str]] = {
    ("containerd", "cgroupfs"): "{id}",
    ("containerd", "systemd"): "cri-containerd-{id}.scope",
    ("crio", "cgroupfs"): "crio-{id}",
    ("crio", "systemd"): "crio-{id}.scope",
    ("docker", "cgroupfs"): "{id}",
    ("docker", "systemd"): "docker-{id}.scope",
}


def _write_files(directory: Path, files: Mapping[str, str], *, overwrite: bool = False) -> None:
    for name, content in files.items():
        path = directory / name
        if overwrite or not path.exists():
            path.write_text(content)


@dataclass
class FakeCgroup:
    """A fake cgroup mount at ``root``; build it with make_fake_cgroup_v1 / make_fake_cgroup_v2."""

    root: Path
    version: CgroupVersion
    driver: CgroupDriver
    anolis: bool = False

    def fs(self) -> CgroupFS:
        """A CgroupFS on this tree, with the tree's driver."""
        return CgroupFS(self.root, self.driver)

    # -- building --

    def mkdir(self, relative: str, *, leaf: bool = False) -> list[Path]:
        """Create the cgroup ``relative`` (a path below the hierarchy root) and any missing
        ancestors, each with the files the kernel gives a new cgroup; returns its directories
        (one per v1 hierarchy, one on v2). On v2 a non-``leaf`` cgroup enables all of its
        controllers for its children (as kubelet and systemd do for kubepods), a leaf none."""
        parts = [part for part in relative.split("/") if part]
        if self.version is CgroupVersion.V2:
            return [self._mkdir_v2(parts, leaf)]
        return [self._mkdir_v1(hierarchy, parts) for hierarchy in V1_HIERARCHIES]

    def _mkdir_v2(self, parts: list[str], leaf: bool) -> Path:
        directory = self.root
        for index, part in enumerate(parts):
            parent, directory = directory, directory / part
            if directory.is_dir():
                continue
            directory.mkdir()
            controllers = (parent / "cgroup.subtree_control").read_text().split()
            _write_files(directory, _V2_CORE)
            for controller in controllers:
                _write_files(directory, _V2_FILES.get(controller, {}))
                if self.anolis:
                    _write_files(directory, _ANOLIS_FILES.get(controller, {}))
            (directory / "cgroup.controllers").write_text(" ".join(controllers) + "\n")
            enabled = "" if leaf and index == len(parts) - 1 else " ".join(controllers)
            (directory / "cgroup.subtree_control").write_text(enabled + "\n" if enabled else "")
        return directory

    def _mkdir_v1(self, hierarchy: str, parts: list[str]) -> Path:
        directory = self.root / hierarchy
        for part in parts:
            directory = directory / part
            if directory.is_dir():
                continue
            directory.mkdir()
            _write_files(directory, _V1_COMMON)
            _write_files(directory, _V1_FILES[hierarchy])
            if self.anolis:
                _write_files(directory, _V1_ANOLIS.get(hierarchy, {}))
        return directory

    def kubepods(self) -> None:
        """kubelet's QoS cgroups: kubepods, kubepods/burstable, kubepods/besteffort (or their slices)."""
        if self.driver == "systemd":
            for name in ("kubepods-burstable.slice", "kubepods-besteffort.slice"):
                self.mkdir(parent_path(name))
        else:
            for path in ("kubepods/burstable", "kubepods/besteffort"):
                self.mkdir(path)

    def pod_parent(self, uid: str, qos: KubeQoS = "burstable") -> str:
        """The CRI cgroup_parent kubelet sends for a pod: ``/kubepods/<qos>/pod<uid>`` or
        ``kubepods-<qos>-pod<uid>.slice`` (systemd, dashes in the uid escaped to ``_``);
        Guaranteed pods sit directly under kubepods."""
        if qos not in ("guaranteed", "burstable", "besteffort"):
            raise ValueError(f"qos must be guaranteed, burstable or besteffort, got {qos!r}")
        if self.driver == "systemd":
            middle = "" if qos == "guaranteed" else f"-{qos}"
            return f"kubepods{middle}-pod{uid.replace('-', '_')}.slice"
        middle = "" if qos == "guaranteed" else f"/{qos}"
        return f"/kubepods{middle}/pod{uid}"

    def add_pod(self, uid: str, qos: KubeQoS = "burstable") -> str:
        """Create a pod's cgroup (and kubepods above it); returns its CRI cgroup parent."""
        parent = self.pod_parent(uid, qos)
        self.mkdir(parent_path(parent))
        return parent

    def container_dir_name(self, container_id: str, runtime: Runtime = "containerd") -> str:
        return _CONTAINER_DIRS[(runtime, self.driver)].format(id=container_id)

    def add_container(self, parent: str, container_id: str, runtime: Runtime = "containerd") -> list[Path]:
        """Create a container's cgroup under the pod ``parent`` as ``runtime`` names it; its directories."""
        relative = parent_path(parent)
        return self.mkdir(f"{relative}/{self.container_dir_name(container_id, runtime)}", leaf=True)

    # -- looking --

    def dir(self, parent: str = "", container_id: str | None = None, controller: str = "cpu") -> Path:
        """The directory of the pod (``""``: the root) or container, in ``controller``'s hierarchy on v1."""
        return self.fs().path(controller, parent, container_id)

    def read(self, parent: str, file: str, container_id: str | None = None, controller: str | None = None) -> str:
        """A file's content, stripped. The v1 hierarchy is taken from the file name unless given."""
        return self.fs().read(controller or _controller_of(file), file, parent, container_id)

    def files(self, parent: str = "", container_id: str | None = None, controller: str = "cpu") -> list[str]:
        return sorted(os.listdir(self.dir(parent, container_id, controller)))


def _controller_of(file: str) -> str:
    return file.split(".", 1)[0]


def make_fake_cgroup_v2(
    root: str | os.PathLike[str],
    *,
    driver: CgroupDriver = "cgroupfs",
    kubepods: bool = True,
    anolis: bool = False,
    controllers: Iterable[str] = V2_CONTROLLERS,
    subtree_control: Iterable[str] = _V2_ROOT_SUBTREE,
) -> FakeCgroup:
    """A cgroup v2 (unified) tree at ``root``; with ``kubepods``, kubelet's QoS cgroups too."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    available = list(controllers)
    enabled = [name for name in subtree_control if name in available]
    _write_files(base, _V2_ROOT_CORE, overwrite=True)
    (base / "cgroup.controllers").write_text(" ".join(available) + "\n")
    (base / "cgroup.subtree_control").write_text(" ".join(enabled) + "\n" if enabled else "")
    tree = FakeCgroup(base, CgroupVersion.V2, driver, anolis)
    if kubepods:
        tree.kubepods()
    return tree


def make_fake_cgroup_v1(
    root: str | os.PathLike[str],
    *,
    driver: CgroupDriver = "cgroupfs",
    kubepods: bool = True,
    anolis: bool = False,
) -> FakeCgroup:
    """A cgroup v1 tree at ``root``: one directory per hierarchy (``cpu,cpuacct`` with ``cpu`` and
    ``cpuacct`` links to it, ``memory``, ``cpuset``...), each with its root cgroup's files."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    for hierarchy, links in V1_HIERARCHIES.items():
        directory = base / hierarchy
        directory.mkdir(exist_ok=True)
        files = {name: text for name, text in _V1_FILES[hierarchy].items() if name not in _V1_NOT_IN_ROOT}
        files.update({name: _V1_ROOT_VALUES[name] for name in files if name in _V1_ROOT_VALUES})
        if anolis:
            files.update(_V1_ANOLIS.get(hierarchy, {}))
        _write_files(directory, {**_V1_COMMON, **_V1_ROOT_ONLY, **files}, overwrite=True)
        for link in links:
            if not (base / link).exists():
                (base / link).symlink_to(hierarchy)
    tree = FakeCgroup(base, CgroupVersion.V1, driver, anolis)
    if kubepods:
        tree.kubepods()
    return tree
