"""What runtime-hooks writes on a systemd-driver node is also set as the units' properties
(hooks/systemd_units.py, systemd_bus.py, systemd_sync.py; the systemd rules of hooks/cgroups.py).

The mapping is checked against systemd's arithmetic; the D-Bus side against a real
``dbus-daemon`` on a private address with a stand-in ``org.freedesktop.systemd1`` Manager
(dbus-fast, as the client) that records every SetUnitProperties call; the cgroups are fake
cgroup v2 trees (hooks/testkit)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import grpc
import pytest
from click.testing import CliRunner
from daemons import Daemon
from dbus_fast import DBusError, PropertyAccess
from dbus_fast.aio import MessageBus
from dbus_fast.annotations import DBusBool, DBusObjectPath, DBusSignature, DBusStr
from dbus_fast.service import ServiceInterface, dbus_method, dbus_property
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from runtimeproxy.hooks import cli as hooks_cli
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupUnsupported, parent_path
from runtimeproxy.hooks.plugins import cpu, memory
from runtimeproxy.hooks.sdk import HookPoint, Resources
from runtimeproxy.hooks.systemd_bus import SystemdBus
from runtimeproxy.hooks.systemd_sync import SystemdSync
from runtimeproxy.hooks.systemd_units import (
    PROPERTY_FILES,
    RESET_WITHOUT_PROPERTY,
    UINT64_MAX,
    UnitProperty,
    cpu_quota_per_sec,
    id_mask,
    unit_of_cgroup,
    unit_properties,
)
from runtimeproxy.hooks.testkit import (
    FakeCgroup,
    container,
    make_fake_cgroup_v1,
    make_fake_cgroup_v2,
    pod,
    pod_request,
    run_plugin,
)
from structlog.testing import capture_logs

from runtimeproxy.api.runtime.v1alpha1 import api_pb2_grpc as hook_grpc
from runtimeproxy.hookapi.value_bounds import parse_cpuset

CID = "4a5b6c7d8e9f"
BATCH = cpu.EXTENDED_RESOURCE_SPEC_ANNOTATION
MEMORY_POLICY = "memory:\n  LS: {min_percent: 50, low_percent: 80, throttling_percent: 60}\n"
UNREACHABLE = "cannot reach systemd"
HOOKS = [sys.executable, "-c", "from runtimeproxy.hooks.cli import main; main()"]


# --- a real bus and a stand-in systemd ----------------------------------------------------------


def start_dbus_daemon(socket: Path) -> subprocess.Popen[str]:
    """A private dbus-daemon listening on ``socket``; ready once it printed its address."""
    daemon = subprocess.Popen(
        ["dbus-daemon", "--session", f"--address=unix:path={socket}", "--nofork", "--nopidfile", "--print-address=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert daemon.stdout is not None
    printed = daemon.stdout.readline()
    assert printed.startswith(f"unix:path={socket}"), f"dbus-daemon did not start: {printed!r}"
    return daemon


def stop(daemon: subprocess.Popen[str]) -> None:
    daemon.terminate()
    daemon.wait(10)
    if daemon.stdout is not None:
        daemon.stdout.close()


@pytest.fixture
def bus_address(tmp_path: Path) -> Iterator[str]:
    daemon = start_dbus_daemon(tmp_path / "bus")
    yield f"unix:path={tmp_path / 'bus'}"
    stop(daemon)


@dataclass
class Call:
    unit: str
    runtime: bool
    properties: list[tuple[str, str, Any]]

    def values(self) -> dict[str, Any]:
        return {name: value for name, _, value in self.properties}


class FakeUnit(ServiceInterface):
    def __init__(self, transient: bool) -> None:
        super().__init__("org.freedesktop.systemd1.Unit")
        self._transient = transient

    @dbus_property(access=PropertyAccess.READ)
    def Transient(self) -> DBusBool:
        return self._transient


class FakeManager(ServiceInterface):
    """org.freedesktop.systemd1.Manager's GetUnit and SetUnitProperties, recording the latter."""

    def __init__(self, bus: MessageBus) -> None:
        super().__init__("org.freedesktop.systemd1.Manager")
        self.bus = bus
        self.units: dict[str, str] = {}
        self.calls: list[Call] = []
        self.refuse: dict[str, str] = {}
        self.answering = asyncio.Event()  # cleared: SetUnitProperties hangs until it is set
        self.answering.set()

    def add_unit(self, name: str, *, transient: bool = True) -> None:
        path = "/org/freedesktop/systemd1/unit/" + "".join(c if c.isalnum() else f"_{ord(c):02x}" for c in name)
        self.bus.export(path, FakeUnit(transient))
        self.units[name] = path

    @dbus_method()
    def GetUnit(self, name: DBusStr) -> DBusObjectPath:
        if name not in self.units:
            raise DBusError("org.freedesktop.systemd1.NoSuchUnit", f"Unit {name} not loaded.")
        return self.units[name]

    @dbus_method()
    async def SetUnitProperties(
        self, name: DBusStr, runtime: DBusBool, properties: Annotated[list[list[Any]], DBusSignature("a(sv)")]
    ):  # no return annotation: dbus-fast takes one for the reply's signature
        await self.answering.wait()
        if name in self.refuse:
            raise DBusError(self.refuse[name], f"refused for {name}")
        self.calls.append(Call(name, runtime, [(prop, value.signature, value.value) for prop, value in properties]))


async def serve_fake_systemd(address: str) -> tuple[MessageBus, FakeManager]:
    bus = await MessageBus(bus_address=address).connect()
    manager = FakeManager(bus)
    bus.export("/org/freedesktop/systemd1", manager)
    await bus.request_name("org.freedesktop.systemd1")
    return bus, manager


@pytest.fixture
async def systemd(bus_address: str) -> AsyncIterator[FakeManager]:
    bus, manager = await serve_fake_systemd(bus_address)
    yield manager
    bus.disconnect()


@dataclass
class Node:
    """A fake cgroup v2 tree with the systemd driver, its CgroupFS with a SystemdSync, the metrics."""

    tree: FakeCgroup
    sync: SystemdSync
    registry: CollectorRegistry
    fs: CgroupFS = field(init=False)

    def __post_init__(self) -> None:
        self.fs = CgroupFS(self.tree.root, "systemd", listener=self.sync)

    def sets(self, result: str) -> float:
        return self.registry.get_sample_value("runtimehooks_systemd_property_sets_total", {"result": result}) or 0.0


def make_node(
    tmp_path: Path, address: str = "", retry: tuple[float, float] = (0.5, 30.0), timeout: float = 5.0
) -> Node:
    registry = CollectorRegistry()
    bus = SystemdBus(address, registry=registry, timeout=timeout, retry=retry)
    tree = make_fake_cgroup_v2(tmp_path / "cgroup", driver="systemd")
    return Node(tree, SystemdSync(bus, registry=registry), registry)


@contextlib.asynccontextmanager
async def running(sync: SystemdSync) -> AsyncIterator[None]:
    task = asyncio.get_running_loop().create_task(sync.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually(what: Any, timeout: float = 20.0) -> None:
    """Wait until ``what()`` holds (the bus retries on its own schedule); fails after ``timeout``."""
    async with asyncio.timeout(timeout):
        while not what():
            await asyncio.sleep(0.02)


def be_pod(tree: FakeCgroup, limit: str = "1500") -> Any:
    spec = json.dumps({"containers": {"app": {"requests": {cpu.BATCH_CPU: "500"}, "limits": {cpu.BATCH_CPU: limit}}}})
    return pod("batch", qos="BE", annotations={BATCH: spec}, cgroups=tree)


def slice_of(parent: str) -> str:
    return parent_path(parent).rsplit("/", 1)[-1]


# --- units and properties: the pure part ----------------------------------------------------------


@pytest.mark.parametrize(
    ("relative", "unit"),
    [
        ("kubepods.slice", "kubepods.slice"),
        (
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1_2.slice",
            "kubepods-besteffort-pod1_2.slice",
        ),
        ("kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope", "cri-containerd-abc.scope"),
        ("init.scope", "init.scope"),  # a scope in -.slice sits at the root
        ("kubepods-besteffort-pod1.slice", None),  # not where systemd puts that slice
        ("kubepods.slice/kubepods-pod1.slice/abc", None),  # a cgroupfs-named container
        ("kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope/sub", None),  # inside a scope
        ("other.slice/kubepods-pod1.slice", None),
        ("kubepods.slice/x.scope/y.scope", None),
        ("kubepods/besteffort/pod1", None),
        ("", None),
        ("a--b.slice", None),
        ("kubepods.slice/kubepods-a@b.slice", None),  # no templates
    ],
)
def test_the_unit_of_a_cgroup_is_where_systemd_puts_that_name(relative: str, unit: str | None) -> None:
    assert unit_of_cgroup(relative) == unit


_PART = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)


@given(parts=st.lists(_PART, min_size=1, max_size=5), scope=_PART)
def test_every_slice_and_scope_is_found_at_its_path_and_nowhere_else(parts: list[str], scope: str) -> None:
    name = "-".join(parts) + ".slice"
    relative = parent_path(name)
    assert unit_of_cgroup(relative) == name
    assert unit_of_cgroup(f"{relative}/{scope}.scope") == f"{scope}.scope"
    assert unit_of_cgroup(f"{relative}/{scope}") is None
    if len(parts) > 1:
        assert unit_of_cgroup(relative.split("/", 1)[1]) is None  # the top slice left out
        assert unit_of_cgroup(f"{relative.split('/', 1)[1]}/{scope}.scope") is None


def test_file_values_become_properties_of_systemds_types() -> None:
    assert unit_properties("cpu.max", "150000 100000\n") == (
        UnitProperty("CPUQuotaPerSecUSec", "t", 1_500_000),
        UnitProperty("CPUQuotaPeriodUSec", "t", 100_000),
    )
    assert unit_properties("cpu.max", "max 50000") == (
        UnitProperty("CPUQuotaPerSecUSec", "t", UINT64_MAX),
        UnitProperty("CPUQuotaPeriodUSec", "t", 50_000),
    )
    assert unit_properties("cpu.weight", "39") == (UnitProperty("CPUWeight", "t", 39),)
    assert unit_properties("memory.min", "536870912") == (UnitProperty("MemoryMin", "t", 536870912),)
    assert unit_properties("memory.low", "0") == (UnitProperty("MemoryLow", "t", 0),)
    assert unit_properties("memory.high", "max") == (UnitProperty("MemoryHigh", "t", UINT64_MAX),)
    assert unit_properties("memory.max", "1073741824") == (UnitProperty("MemoryMax", "t", 1073741824),)
    assert unit_properties("cpuset.cpus", "0-3,8") == (UnitProperty("AllowedCPUs", "ay", bytes([0x0F, 0x01])),)
    assert unit_properties("cpuset.mems", "1") == (UnitProperty("AllowedMemoryNodes", "ay", bytes([0x02])),)
    assert unit_properties("cpuset.cpus", "") == (UnitProperty("AllowedCPUs", "ay", b""),)
    for file in ("cpu.idle", "cpu.max.burst", "cpu.bvt_warp_ns", "memory.wmark_ratio"):
        assert unit_properties(file, "1") == ()
    assert set(RESET_WITHOUT_PROPERTY) == {"cpu.idle"} and not PROPERTY_FILES & set(RESET_WITHOUT_PROPERTY)


@pytest.mark.parametrize(
    ("file", "text"),
    [
        ("cpu.max", "50000"),  # no period: systemd's would be a guess
        ("cpu.max", "50000 100000 1"),
        ("cpu.max", "-1 100000"),
        ("cpu.max", "0 100000"),
        ("cpu.max", "50000 999"),  # the kernel's periods are 1 ms..1 s
        ("cpu.max", "50000 1000001"),
        ("cpu.max", f"{1 << 44} 100000"),
        ("cpu.max", "max max"),
        ("cpu.weight", "0"),
        ("cpu.weight", "10001"),
        ("memory.min", "-4096"),
        ("memory.low", "1.5"),
        ("memory.high", "١٢"),  # non-ASCII digits
        ("memory.max", str(UINT64_MAX)),
        ("cpuset.cpus", "3-1"),
        ("cpuset.cpus", "0 1"),
    ],
)
def test_content_no_property_can_hold_is_refused_with_the_reason(file: str, text: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        unit_properties(file, text)


@given(file=st.sampled_from(sorted(PROPERTY_FILES | set(RESET_WITHOUT_PROPERTY))), text=st.text(max_size=40))
def test_any_content_gives_properties_or_a_value_error(file: str, text: str) -> None:
    try:
        properties = unit_properties(file, text)
    except ValueError:
        return
    for prop in properties:
        assert prop.signature in ("t", "ay")
        assert isinstance(prop.value, bytes) if prop.signature == "ay" else 0 <= int(prop.value) <= UINT64_MAX


def _systemd_cpu_max_quota(per_sec: int, period: int) -> int:
    """What systemd writes into cpu.max for CPUQuotaPerSecUSec (src/core/cgroup.c)."""
    return max(per_sec * period // 1_000_000, 1000)


def _after_daemon_reload(per_sec: int) -> int:
    """systemd keeps the property as CPUQuota=<per_sec / 10000>.<two decimals>% and reads it back."""
    return per_sec // 10000 * 10000 + per_sec % 10000 // 100 * 100


@given(quota=st.integers(1000, (1 << 44) - 1), period=st.integers(1000, 1_000_000))
def test_systemd_writes_back_at_least_the_quota_and_exactly_it_when_it_can(quota: int, period: int) -> None:
    per_sec = cpu_quota_per_sec(quota, period)
    assert _systemd_cpu_max_quota(per_sec, period) >= quota
    if quota * 1_000_000 % period == 0:
        assert _systemd_cpu_max_quota(per_sec, period) == quota
    if quota * 10_000 % period == 0:
        assert _systemd_cpu_max_quota(_after_daemon_reload(per_sec), period) == quota


@given(milli=st.integers(1, 10_000_000))
def test_every_batch_quota_survives_a_daemon_reload_unchanged(milli: int) -> None:
    quota = cpu.milli_cpu_to_quota(milli)
    per_sec = cpu_quota_per_sec(quota, cpu.CFS_PERIOD_US)
    assert _systemd_cpu_max_quota(_after_daemon_reload(per_sec), cpu.CFS_PERIOD_US) == quota


@given(ids=st.frozensets(st.integers(0, 1023), max_size=64))
def test_the_id_mask_has_bit_n_percent_8_of_byte_n_div_8(ids: frozenset[int]) -> None:
    mask = id_mask(",".join(map(str, sorted(ids))))
    assert {8 * index + bit for index, byte in enumerate(mask) for bit in range(8) if byte >> bit & 1} == ids
    assert len(mask) == (max(ids) // 8 + 1 if ids else 0)
    assert parse_cpuset(",".join(map(str, sorted(ids)))) == ids


# --- what reaches systemd -------------------------------------------------------------------------


async def test_a_be_pods_batch_quota_and_shares_are_set_on_its_slice(
    tmp_path: Path, bus_address: str, systemd: FakeManager
) -> None:
    node = make_node(tmp_path, bus_address)
    p = be_pod(node.tree, limit="1500")
    systemd.add_unit(slice_of(p.cgroup_parent))
    async with running(node.sync):
        result = await run_plugin(cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=p, cgroups=node.fs)
        assert result.failures == []
        assert await node.sync.bus.flush()
    assert node.tree.read(p.cgroup_parent, "cpu.max") == "150000 100000"
    assert systemd.calls == [
        Call(
            slice_of(p.cgroup_parent),
            True,
            # batch-cpu: limit 1500m as the quota; request 500m as shares 512, cpu.weight 20.
            [("CPUQuotaPerSecUSec", "t", 1_500_000), ("CPUQuotaPeriodUSec", "t", 100_000), ("CPUWeight", "t", 20)],
        )
    ]
    assert node.sets("ok") == 1 and node.sets("unreachable") == 0


async def test_memory_values_are_set_on_the_pod_slice_and_the_container_scope(
    tmp_path: Path, bus_address: str, systemd: FakeManager
) -> None:
    node = make_node(tmp_path, bus_address)
    spec = json.dumps({"containers": {"app": {"requests": {"memory": "512Mi"}, "limits": {"memory": "1Gi"}}}})
    p = pod(
        "web",
        qos="LS",
        annotations={BATCH: spec},
        resources=Resources(memory_limit_in_bytes=1 << 30),
        cgroups=node.tree,
    )
    c = container("app", id=CID, pod=p, cgroups=node.tree, resources=Resources(memory_limit_in_bytes=1 << 30))
    scope = f"cri-containerd-{CID}.scope"
    systemd.add_unit(slice_of(p.cgroup_parent))
    systemd.add_unit(scope)
    async with running(node.sync):
        await run_plugin(memory.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=p, cgroups=node.fs, policy=MEMORY_POLICY)
        await run_plugin(
            memory.plugin, HookPoint.POST_START_CONTAINER, pod=p, container=c, cgroups=node.fs, policy=MEMORY_POLICY
        )
        assert await node.sync.bus.flush()
    names = {"memory.min": "MemoryMin", "memory.low": "MemoryLow", "memory.high": "MemoryHigh"}
    for unit, container_id in ((slice_of(p.cgroup_parent), None), (scope, CID)):
        sent: dict[str, Any] = {}
        for call in systemd.calls:
            if call.unit == unit:
                assert call.runtime is True and all(sig == "t" for _, sig, _ in call.properties)
                sent.update(call.values())
        files = {names[f]: int(node.tree.read(p.cgroup_parent, f, container_id)) for f in names}
        assert sent == files and set(sent) == set(names.values()) and files["MemoryMin"] == 256 << 20


async def test_writes_in_a_row_go_out_as_one_call_with_the_latest_values(
    tmp_path: Path, bus_address: str, systemd: FakeManager
) -> None:
    node = make_node(tmp_path, bus_address)
    parent = node.tree.add_pod("u1", "besteffort")
    systemd.add_unit(slice_of(parent))
    async with running(node.sync):
        node.fs.set_cpu_quota(parent, 50_000)
        node.fs.set_memory_protection(parent, min_bytes=4096)
        node.fs.set_cpu_quota(parent, 70_000, 50_000)
        assert await node.sync.bus.flush()
    assert [(call.unit, call.values()) for call in systemd.calls] == [
        (slice_of(parent), {"CPUQuotaPerSecUSec": 1_400_000, "CPUQuotaPeriodUSec": 50_000, "MemoryMin": 4096})
    ]


async def test_units_not_loaded_or_not_transient_get_nothing(
    tmp_path: Path, bus_address: str, systemd: FakeManager
) -> None:
    node = make_node(tmp_path, bus_address)
    loose, implicit, other = (node.tree.add_pod(uid, "besteffort") for uid in ("u1", "u2", "u3"))
    systemd.add_unit(slice_of(implicit), transient=False)  # made by systemd around a scope, not by kubelet
    with capture_logs() as logs:
        async with running(node.sync):
            for parent in (loose, implicit):
                node.fs.set_cpu_quota(parent, 50_000)
            assert await node.sync.bus.flush()
            node.fs.set_cpu_quota(other, 50_000)
            assert await node.sync.bus.flush()
    assert systemd.calls == []
    assert node.tree.read(loose, "cpu.max") == node.tree.read(implicit, "cpu.max") == "50000 100000"
    assert node.sets("not_loaded") == 2 and node.sets("not_transient") == 1
    warnings = [log["event"] for log in logs if log["log_level"] == "warning"]
    assert sorted(warnings) == sorted(
        [
            "unit not loaded by systemd: no properties set (its cgroup was not made through systemd)",
            "unit is not transient: no properties set (systemd would keep them after the pod)",
        ]
    )


async def test_properties_systemd_refuses_are_logged_once_and_dropped(
    tmp_path: Path, bus_address: str, systemd: FakeManager
) -> None:
    node = make_node(tmp_path, bus_address)
    parents = [node.tree.add_pod(uid, "besteffort") for uid in ("u1", "u2")]
    for parent in parents:
        systemd.add_unit(slice_of(parent))
        systemd.refuse[slice_of(parent)] = "org.freedesktop.DBus.Error.InvalidArgs"
    with capture_logs() as logs:
        async with running(node.sync):
            for parent in parents:
                node.fs.set_cpu_quota(parent, 50_000)
                assert await node.sync.bus.flush()  # nothing kept for a retry
    assert node.sets("refused") == 2 and systemd.calls == []
    refused = [log for log in logs if log["event"].startswith("systemd refused")]
    # Once as a warning; a repeat is at most a debug line (which a level filter configured by
    # an earlier test may drop before capture_logs sees it).
    assert [log["log_level"] for log in refused if log["log_level"] != "debug"] == ["warning"]
    assert refused[0]["cause"] == "org.freedesktop.DBus.Error.InvalidArgs"


async def test_with_the_bus_down_files_are_written_the_failure_logged_once_and_sent_when_it_is_back(
    tmp_path: Path,
) -> None:
    socket = tmp_path / "late-bus"
    node = make_node(tmp_path, f"unix:path={socket}", retry=(0.05, 0.05))
    parent = node.tree.add_pod("u1", "besteffort")
    with capture_logs() as logs:
        async with running(node.sync):
            node.fs.set_cpu_quota(parent, 50_000)
            assert node.tree.read(parent, "cpu.max") == "50000 100000"  # at once, whatever systemd does
            assert await node.sync.bus.flush() is False  # kept for a retry
            await eventually(lambda: node.sets("unreachable") >= 3)
            assert node.sync.bus.pending() == {
                slice_of(parent): (
                    UnitProperty("CPUQuotaPerSecUSec", "t", 500_000),
                    UnitProperty("CPUQuotaPeriodUSec", "t", 100_000),
                )
            }
            daemon = start_dbus_daemon(socket)
            try:
                bus, manager = await serve_fake_systemd(f"unix:path={socket}")
                manager.add_unit(slice_of(parent))
                await eventually(lambda: not node.sync.bus.pending())
                # Taken off pending when the send starts: wait for it to end before the bus goes.
                assert await node.sync.bus.flush()
                bus.disconnect()
            finally:
                stop(daemon)
    unreachable = [log for log in logs if log["event"].startswith(UNREACHABLE)]
    assert [log["log_level"] for log in unreachable].count("warning") == 1
    assert unreachable[0]["cause"] == "FileNotFoundError" and str(socket) in unreachable[0]["error"]
    assert [call.values() for call in manager.calls] == [{"CPUQuotaPerSecUSec": 500_000, "CPUQuotaPeriodUSec": 100_000}]
    assert any(log["event"] == "systemd takes unit properties again" for log in logs)
    assert node.sets("ok") == 1


async def test_a_restarted_bus_is_connected_again(tmp_path: Path) -> None:
    socket = tmp_path / "bus"
    node = make_node(tmp_path, f"unix:path={socket}", retry=(0.05, 0.05))
    parent = node.tree.add_pod("u1", "besteffort")
    calls: list[Call] = []
    async with running(node.sync):
        for quota in (50_000, 60_000):  # the second one after the daemon was restarted
            daemon = start_dbus_daemon(socket)
            try:
                bus, manager = await serve_fake_systemd(f"unix:path={socket}")
                manager.add_unit(slice_of(parent))
                node.fs.set_cpu_quota(parent, quota)
                await eventually(lambda: not node.sync.bus.pending())
                assert await node.sync.bus.flush()  # the send taken off pending has ended too
                calls += manager.calls
                bus.disconnect()
            finally:
                stop(daemon)
    assert [call.values()["CPUQuotaPerSecUSec"] for call in calls] == [500_000, 600_000]
    assert node.sets("ok") == 2


async def test_a_systemd_that_does_not_answer_is_given_up_on_and_asked_again(
    tmp_path: Path, bus_address: str, systemd: FakeManager
) -> None:
    node = make_node(tmp_path, bus_address, retry=(0.05, 0.05), timeout=0.3)
    parent = node.tree.add_pod("u1", "besteffort")
    systemd.add_unit(slice_of(parent))
    systemd.answering.clear()
    with capture_logs() as logs:
        async with running(node.sync):
            node.fs.set_cpu_quota(parent, 50_000)
            await eventually(lambda: node.sets("unreachable") >= 1)
            systemd.answering.set()
            await eventually(lambda: not node.sync.bus.pending() and node.sets("ok") >= 1)
    [warning] = [log for log in logs if log["event"].startswith(UNREACHABLE) and log["log_level"] == "warning"]
    assert warning["cause"] == "timeout" and "SetUnitProperties" in warning["error"]
    assert {call.values()["CPUQuotaPerSecUSec"] for call in systemd.calls} == {500_000}


async def test_writes_from_other_threads_reach_systemd(tmp_path: Path, bus_address: str, systemd: FakeManager) -> None:
    node = make_node(tmp_path, bus_address)
    parents = [node.tree.add_pod(f"u{n}", "besteffort") for n in range(4)]
    for parent in parents:
        systemd.add_unit(slice_of(parent))
    async with running(node.sync):
        await asyncio.gather(*(asyncio.to_thread(node.fs.set_cpu_quota, parent, 20_000) for parent in parents))
        await eventually(lambda: len(systemd.calls) == len(parents))
    assert sorted(call.unit for call in systemd.calls) == sorted(slice_of(parent) for parent in parents)


async def test_an_answer_that_cannot_be_read_costs_only_its_unit(
    tmp_path: Path, bus_address: str, systemd: FakeManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = make_node(tmp_path, bus_address)
    odd, fine = (node.tree.add_pod(uid, "besteffort") for uid in ("u1", "u2"))
    systemd.add_unit(slice_of(fine))
    apply = node.sync.bus._apply

    async def reads_badly(unit: str, properties: Any) -> str:
        if unit == slice_of(odd):
            raise IndexError("tuple index out of range")  # e.g. a reply with no body
        return await apply(unit, properties)

    monkeypatch.setattr(node.sync.bus, "_apply", reads_badly)
    async with running(node.sync):
        node.fs.set_cpu_quota(odd, 50_000)
        node.fs.set_cpu_quota(fine, 50_000)
        assert await node.sync.bus.flush()
    assert [call.unit for call in systemd.calls] == [slice_of(fine)]
    assert node.sets("refused") == 1 and node.sets("ok") == 1


# --- what is left alone ---------------------------------------------------------------------------


def test_writes_outside_systemds_units_are_not_sent(tmp_path: Path) -> None:
    bus = SystemdBus("unix:path=/nonexistent")
    sync = SystemdSync(bus)
    cgroupfs_tree = make_fake_cgroup_v2(tmp_path / "v2", driver="cgroupfs")
    parent = cgroupfs_tree.add_pod("u1")
    CgroupFS(cgroupfs_tree.root, "cgroupfs", listener=sync).set_cpu_quota(parent, 50_000)
    systemd_tree = make_fake_cgroup_v2(tmp_path / "sd", driver="systemd")
    slice_parent = systemd_tree.add_pod("u2")
    systemd_tree.mkdir(f"{parent_path(slice_parent)}/{CID}", leaf=True)  # a container not named as a scope
    CgroupFS(systemd_tree.root, "systemd", listener=sync).set_cpu_quota(slice_parent, 50_000, container_id=CID)
    v1_tree = make_fake_cgroup_v1(tmp_path / "v1", driver="systemd")
    v1_parent = v1_tree.add_pod("u3")
    CgroupFS(v1_tree.root, "systemd", listener=sync).set_cpu_quota(v1_parent, 50_000)
    assert bus.pending() == {}
    CgroupFS(systemd_tree.root, "systemd", listener=sync).set_cpu_quota(slice_parent, 50_000)
    assert list(bus.pending()) == [slice_of(slice_parent)]


def test_a_qos_tier_write_goes_to_its_slice_unit_too(tmp_path: Path) -> None:
    """Values kept on kubelet's tier cgroups (kubepods-burstable.slice...) reach systemd as the
    tier slice's properties, as a pod slice's do; a file systemd never writes stays direct."""
    bus = SystemdBus("unix:path=/nonexistent")
    tree = make_fake_cgroup_v2(tmp_path / "sd", driver="systemd", anolis=True)
    tree.mkdir("kubepods.slice/kubepods-burstable.slice")
    fs = CgroupFS(tree.root, "systemd", listener=SystemdSync(bus))
    fs.set_group_identity("kubepods-burstable.slice", 2)
    assert bus.pending() == {}  # cpu.bvt_warp_ns: no property, systemd leaves it alone
    fs.set_cpu_shares("kubepods-burstable.slice", 2048)
    assert list(bus.pending()) == ["kubepods-burstable.slice"]
    assert tree.read("kubepods-burstable.slice", "cpu.bvt_warp_ns") == "2"


def test_content_no_property_can_hold_is_written_counted_and_logged_once(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    parent = node.tree.add_pod("u1", "besteffort")
    with capture_logs() as logs:
        node.fs.write("cpu", "cpu.max", "50000", parent)
        node.fs.write("cpu", "cpu.max", "60000", parent)
    assert node.tree.read(parent, "cpu.max") == "60000"
    assert node.registry.get_sample_value("runtimehooks_systemd_unmapped_writes_total", {"file": "cpu.max"}) == 2
    unmapped = [log["log_level"] for log in logs if log["event"].startswith("no unit property")]
    assert [level for level in unmapped if level != "debug"] == ["warning"]  # once (see above)
    assert node.sync.bus.pending() == {}


def test_a_failing_listener_never_fails_the_write(tmp_path: Path) -> None:
    class BrokenBus(SystemdBus):
        def set_properties(self, unit: str, properties: Any) -> None:
            raise RuntimeError("bug")

    tree = make_fake_cgroup_v2(tmp_path / "cg", driver="systemd")
    parent = tree.add_pod("u1")
    with capture_logs() as logs:
        CgroupFS(tree.root, "systemd", listener=SystemdSync(BrokenBus())).set_cpu_quota(parent, 50_000)
    assert tree.read(parent, "cpu.max") == "50000 100000"
    assert [log["event"] for log in logs if log["log_level"] == "error"] == ["cannot pass a cgroup write on to systemd"]


# --- values with no property: re-applied ------------------------------------------------------------


async def test_cpu_idle_that_systemd_resets_is_written_again(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    p = be_pod(node.tree)
    idle_policy = "cpu:\n  BE: {cpu_idle: true}\n"
    await run_plugin(cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=p, cgroups=node.fs, policy=idle_policy)
    cgroup = parent_path(p.cgroup_parent)
    assert node.sync.guarded() == {(cgroup, "cpu.idle"): b"1"}
    idle = node.tree.dir(p.cgroup_parent) / "cpu.idle"
    assert node.sync.check() == 0
    idle.write_text("0\n")  # what systemd writes when it realizes the slice
    assert node.sync.check() == 1 and idle.read_text() == "1"
    assert node.sync.check() == 0
    assert node.registry.get_sample_value("runtimehooks_systemd_reapplied_total", {"file": "cpu.idle"}) == 1
    node.fs.set_cpu_idle(p.cgroup_parent, False)  # back to systemd's own value: nothing to keep
    assert node.sync.guarded() == {}
    node.fs.set_cpu_idle(p.cgroup_parent, True)
    shutil.rmtree(node.tree.dir(p.cgroup_parent))  # the pod is gone
    assert node.sync.check() == 0 and node.sync.guarded() == {}


async def test_the_re_apply_loop_runs_beside_the_bus(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    parent = node.tree.add_pod("u1", "besteffort")
    node.fs.set_cpu_idle(parent, True)
    idle = node.tree.dir(parent) / "cpu.idle"
    idle.write_text("0\n")
    async with running(node.sync):
        await eventually(lambda: idle.read_text() == "1")


# --- no pod cgroups made beside kubelet --------------------------------------------------------------


@pytest.mark.parametrize("make", [make_fake_cgroup_v1, make_fake_cgroup_v2])
def test_no_pod_cgroup_is_made_under_the_systemd_driver(tmp_path: Path, make: Any) -> None:
    tree = make(tmp_path / "cg", driver="systemd")
    fs = tree.fs()
    missing = tree.pod_parent("new", "besteffort")
    with pytest.raises(CgroupUnsupported, match="systemd"):
        fs.create_pod_cgroup(missing)
    assert not fs.exists(missing)
    assert fs.create_pod_cgroup(tree.add_pod("old", "besteffort")) == []  # kubelet's: nothing to make


async def test_pre_run_pod_sandbox_leaves_a_missing_slice_missing_and_says_so(tmp_path: Path) -> None:
    tree = make_fake_cgroup_v2(tmp_path / "cg", driver="systemd")
    before = sorted(path.relative_to(tree.root) for path in tree.root.rglob("*") if path.is_dir())
    spec = json.dumps({"containers": {"app": {"limits": {cpu.BATCH_CPU: "1000"}}}})
    p = pod("batch", qos="BE", annotations={BATCH: spec}, driver="systemd")
    with capture_logs() as logs:
        result = await run_plugin(cpu.plugin, HookPoint.PRE_RUN_POD_SANDBOX, pod=p, cgroups=tree)
    assert result.failures == []
    assert sorted(path.relative_to(tree.root) for path in tree.root.rglob("*") if path.is_dir()) == before
    [warning] = [log for log in logs if log["log_level"] == "warning"]
    assert warning["event"] == "pod cgroup not created" and "systemd" in warning["error"]


# --- the daemon's options -------------------------------------------------------------------------------


def test_systemd_sync_is_on_only_for_the_systemd_driver_on_cgroup_v2(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    v2 = make_fake_cgroup_v2(tmp_path / "v2", driver="systemd")
    fs = CgroupFS(v2.root, "systemd")
    sync = hooks_cli._systemd_sync(fs, "unix:path=/run/x", registry)
    assert sync is not None and fs.listener is sync and sync.bus.address == "unix:path=/run/x"
    assert hooks_cli._systemd_sync(CgroupFS(v2.root, "cgroupfs"), "", CollectorRegistry()) is None
    v1 = make_fake_cgroup_v1(tmp_path / "v1", driver="systemd")
    with capture_logs() as logs:
        assert hooks_cli._systemd_sync(CgroupFS(v1.root, "systemd"), "", CollectorRegistry()) is None
    assert [log["event"] for log in logs] == ["systemd unit properties off: the cgroup root is no cgroup v2 mount"]


def test_serve_takes_the_bus_address_option_and_its_variable() -> None:
    text = CliRunner().invoke(hooks_cli.cli, ["serve", "--help"], terminal_width=200).output
    assert "--systemd-bus-address" in text and "RUNTIME_HOOKS_SYSTEMD_BUS_ADDRESS" in text


async def test_runtime_hooks_serve_sets_the_properties_of_what_its_plugins_write(bus_address: str) -> None:

    bus, manager = await serve_fake_systemd(bus_address)
    with tempfile.TemporaryDirectory(prefix="rh-sd-", dir="/tmp") as work:  # short: a socket path
        workdir = Path(work)
        tree = make_fake_cgroup_v2(workdir / "cg", driver="systemd")
        p = be_pod(tree, limit="2000")
        manager.add_unit(slice_of(p.cgroup_parent))
        endpoint = workdir / "hooks.sock"
        args = [
            *HOOKS,
            "serve",
            "--endpoint",
            str(endpoint),
            "--hook-config-dir",
            "",
            "--runtime-endpoint",
            "",
            "--cgroup-root",
            str(tree.root),
            "--cgroup-driver",
            "systemd",
            "--cgroup-parent-root",
            "kubepods.slice",
            "--resctrl-root",
            str(workdir / "no-resctrl"),
            "--enable",
            "cpu",
            "--systemd-bus-address",
            bus_address,
            "--log-format",
            "json",
            "--log-level",
            "debug",
        ]
        daemon = Daemon(workdir, "runtime-hooks", args)
        try:
            await asyncio.to_thread(daemon.wait_ready)

            def call() -> None:
                with grpc.insecure_channel(f"unix://{endpoint}") as channel:
                    hook_grpc.RuntimeHookServiceStub(channel).PreRunPodSandboxHook(pod_request(p), timeout=10)

            await asyncio.to_thread(call)
            await eventually(lambda: bool(manager.calls))
            assert await asyncio.to_thread(daemon.terminate) == 0
        finally:
            daemon.kill()
            bus.disconnect()
        assert tree.read(p.cgroup_parent, "cpu.max") == "200000 100000"
        assert [(call.unit, call.runtime, call.values()) for call in manager.calls] == [
            (
                slice_of(p.cgroup_parent),
                True,
                {"CPUQuotaPerSecUSec": 2_000_000, "CPUQuotaPeriodUSec": 100_000, "CPUWeight": 20},
            )
        ]
        events = [record.get("event") for record in daemon.records()]
        assert "systemd unit properties on" in events and "unit properties set" in events, daemon.log()
