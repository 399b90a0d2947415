"""The network plugin: band arithmetic (pure), and the real tree and classification in network
namespaces this test creates (root only): HTB on a veth, a host-network BE pod classified by its
net_cls classid, a pod-network LS pod classified by its address, TCP flows shaped by band."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.cgroups import CgroupFS, CgroupVersion, PodRoots
from runtimeproxy.hooks.plugin_runner import PluginRunner
from runtimeproxy.hooks.plugins import network
from runtimeproxy.hooks.plugins.network import (
    FALLBACK_LINK_MBIT,
    NetworkConfig,
    NetworkQoS,
    NetworkSection,
    Shaper,
    band_classid,
    band_rates,
    bpf,
    explain,
    handlers,
    network_config,
    plan_tree,
    pods,
    tc_commands,
)
from runtimeproxy.hooks.policy import DEFAULT_POLICY
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.sdk import HookPoint, PodInfo, ServerContext
from runtimeproxy.hooks.testkit import policy_from
from strategies import network_bands

LOG = structlog.get_logger("test.network")
LINK_MBIT = 10
BE, LS, SYSTEM = band_classid("BE"), band_classid("LS"), band_classid("SYSTEM")
assert network.plugin.settings_spec is not None
DEFAULTS = DEFAULT_POLICY.section(network.plugin.settings_spec)  # the plugin's own defaults
DEFAULT_CONFIG = network_config(DEFAULTS.common, DEFAULTS.for_class)


# --- pure: the plan ------------------------------------------------------------------------------


@st.composite
def sections(draw: st.DrawFn) -> NetworkConfig:
    """Network sections the policy loader accepts: rate <= ceil, rates adding up to at most 100."""
    return NetworkConfig(interface="eth0", link_speed_mbit=0, **draw(network_bands()))


@given(sections(), st.integers(1, 400_000))
def test_band_rates_fit_the_link(section: NetworkConfig, link_mbit: int) -> None:
    assert section.SYSTEM.rate_percent + section.LS.rate_percent + section.BE.rate_percent <= 100
    plan = plan_tree(section, link_mbit)
    link = link_mbit * 125_000
    assert plan.parent.rate == plan.parent.ceil == link
    assert sum(band.rate for band in plan.bands) <= link
    for band in plan.bands:
        assert 0 < band.rate <= band.ceil <= link
        assert 1600 <= band.quantum <= 200_000
        entry = getattr(section, band.name)
        assert band.prio == entry.priority
        assert band.rate == link * entry.rate_percent // 100


@given(st.integers(1, 10**6), st.integers(1, 100), st.integers(1, 100))
def test_band_rates_ceil_never_below_rate(link_mbit: int, a: int, b: int) -> None:
    rate_percent, ceil_percent = min(a, b), max(a, b)
    rate, ceil = band_rates(link_mbit, rate_percent, ceil_percent)
    assert 0 < rate <= ceil <= link_mbit * 125_000


def test_band_rates_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        band_rates(0, 30, 100)
    with pytest.raises(ValueError):
        band_rates(10, 0, 100)


def test_default_plan_and_explain() -> None:
    section = replace(DEFAULT_CONFIG, interface="eth0")
    plan = plan_tree(section, 1000)
    assert [(b.name, b.classid, b.rate * 8, b.ceil * 8, b.prio) for b in plan.bands] == [
        ("SYSTEM", 0x10010, 400_000_000, 1_000_000_000, 1),
        ("LS", 0x10020, 300_000_000, 1_000_000_000, 2),
        ("BE", 0x10030, 300_000_000, 1_000_000_000, 3),
    ]
    assert plan.default_minor == 0x10
    assert tc_commands(plan)[:3] == [
        "tc qdisc replace dev eth0 root handle 1: htb default 10",
        "tc class replace dev eth0 parent 1: classid 1:1 htb rate 1Gbit ceil 1Gbit quantum 200000",
        "tc class replace dev eth0 parent 1:1 classid 1:10 htb rate 400Mbit ceil 1Gbit prio 1 quantum 200000",
    ]
    info = explain(section, 1000)
    assert info["enabled"] and info["root"] == "1: htb default 1:10 (SYSTEM)"
    assert [(b["band"], b["classes"], b["rate_bits"]) for b in info["bands"]] == [
        ("SYSTEM", ["SYSTEM"], 400_000_000),
        ("LS", ["LS", "LSE", "LSR"], 300_000_000),
        ("BE", ["BE"], 300_000_000),
    ]
    off = explain(DEFAULT_CONFIG)
    assert not off["enabled"] and off["link_speed_mbit"] is None and "tc" not in off
    assert "rate_bits" not in off["bands"][0]


def test_classes_map_to_bands() -> None:
    assert [network.band_of(q) for q in ("LSE", "LSR", "LS", "BE", "SYSTEM")] == ["LS", "LS", "LS", "BE", "SYSTEM"]
    assert (SYSTEM, LS, BE) == (0x10010, 0x10020, 0x10030)
    assert network.format_handle(BE) == "1:30"
    assert len(bpf.classid_program()) == 10 * 8


def test_link_speed_from_policy_sysfs_or_fallback(tmp_path: Path) -> None:
    (tmp_path / "class/net/up0").mkdir(parents=True)
    (tmp_path / "class/net/up0/speed").write_text("25000\n")
    (tmp_path / "class/net/virt0").mkdir(parents=True)
    (tmp_path / "class/net/virt0/speed").write_text("-1\n")
    assert network.link_speed_mbit("up0", sys_root=str(tmp_path)) == 25000
    assert network.link_speed_mbit("virt0", sys_root=str(tmp_path)) is None
    assert network.link_speed_mbit("missing0", sys_root=str(tmp_path)) is None
    assert network.link_speed_mbit("up0", netns="elsewhere", sys_root=str(tmp_path)) is None
    state = NetworkQoS()
    with structlog.testing.capture_logs() as logs:
        logger = structlog.get_logger()
        assert state.resolve_plan(replace(DEFAULT_CONFIG, interface="lo", link_speed_mbit=40), logger).link_mbit == 40
        plan = state.resolve_plan(replace(DEFAULT_CONFIG, interface="lo"), logger)  # lo has no speed
        state.resolve_plan(replace(DEFAULT_CONFIG, interface="lo"), logger)
    assert (plan.link_mbit, plan.link_source) == (FALLBACK_LINK_MBIT, "fallback")
    assert [entry["log_level"] for entry in logs] == ["warning"]  # once
    assert "link_speed_mbit" in logs[0]["event"]


def test_disabled_with_one_log_line() -> None:
    state = NetworkQoS()
    with structlog.testing.capture_logs() as logs:
        logger = structlog.get_logger()
        assert state.start(DEFAULT_CONFIG, logger) == []
        assert state.classify(PodInfo("p", "ns", "u1"), QoSClass.BE, None, logger) is None
    assert not state.active
    assert [entry["event"] for entry in logs] == ["network QoS disabled: policy network.interface is empty"]


def test_plugin_definition() -> None:
    plugin = network.plugin
    assert plugin.name == "network" and plugin.settings_spec is not None
    assert plugin.settings_spec.keys() == ("interface", "link_speed_mbit", "LS", "BE", "SYSTEM")
    assert plugin.state_factory is NetworkQoS
    assert plugin.hook_points == {
        HookPoint.PRE_CREATE_CONTAINER,
        HookPoint.POST_START_CONTAINER,
        HookPoint.POST_STOP_POD_SANDBOX,
    }
    assert plugin.start_handler and plugin.stop_handler and plugin.reconcile_handler


def _fake_net_cls(root: Path, pod: PodInfo, containers: list[str]) -> Path:
    """A net_cls hierarchy of plain files: enough for the classid walk."""
    (root / "net_cls").mkdir(parents=True, exist_ok=True)
    (root / "net_cls" / "net_cls.classid").write_text("0\n")
    top = root / "net_cls" / pod.cgroup_parent.strip("/")
    for directory in (top, *(top / name for name in containers)):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "net_cls.classid").write_text("0\n")
    return top


def test_pod_classid_written_on_the_pod_cgroup_and_below(tmp_path: Path) -> None:
    pod = PodInfo("p", "ns", "u1", sandbox_id="sb", cgroup_parent="/kubepods/besteffort/podu1")
    top = _fake_net_cls(tmp_path, pod, ["sb", "ctr"])
    cgroups = CgroupFS(tmp_path, version=CgroupVersion.V1)
    assert pods.net_cls_available(cgroups)
    assert pods.ensure_pod_classid(cgroups, pod.cgroup_parent, BE) == 3
    assert [int((d / "net_cls.classid").read_text()) for d in (top, top / "sb", top / "ctr")] == [BE] * 3
    assert pods.ensure_pod_classid(cgroups, pod.cgroup_parent, BE) == 0
    assert pods.ensure_pod_classid(cgroups, "/kubepods/besteffort/podgone", BE) == 0
    assert not pods.net_cls_available(CgroupFS(tmp_path / "none", version=CgroupVersion.V1))


def test_dry_run_touches_no_interface(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``runtime-hooks explain`` runs: no netlink at all (the interface does not even exist),
    classids only through the ``cgroups`` handle (which records them there)."""
    state = NetworkQoS()
    section = NetworkSection(interface="nosuch0", link_speed_mbit=100)
    given = {"section": section, "settings_for": DEFAULTS.for_class, "state": state, "dry_run": True}
    pod = PodInfo("p", "ns", "u1", sandbox_id="sb", cgroup_parent="/kubepods/besteffort/podu1")
    top = _fake_net_cls(tmp_path, pod, ["sb"])
    cgroups = CgroupFS(tmp_path, version=CgroupVersion.V1)
    logger = structlog.get_logger()
    handlers._start(server=ServerContext(), log=logger, **given)
    asyncio.run(handlers._classify(pod=pod, qos=QoSClass.BE, cgroups=cgroups, log=logger, **given))
    asyncio.run(handlers._forget(pod=pod, log=logger, **given))
    assert handlers._reconcile(pods=[pod], cgroups=cgroups, log=logger, **given) == 0
    assert not state.active
    assert int((top / "sb" / "net_cls.classid").read_text()) == BE


# --- real: network namespaces ---------------------------------------------------------------------

# Fails (never skips) without root or iproute2: network namespaces need both.
needs_root = pytest.mark.usefixtures("require_root")


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=10).stdout


@dataclass
class Lab:
    """node (interface ``uplink`` shaped, toward ``peer``), peer, and pod (routed through node)."""

    node: str
    peer: str
    pod: str
    uplink: str
    cg_root: Path
    prefix: str  # cgroup path of this test's pods
    procs: list[subprocess.Popen[bytes]]

    @property
    def cgroups(self) -> CgroupFS:
        return CgroupFS(self.cg_root, version=CgroupVersion.V1, pod_roots=PodRoots((self.prefix,)))

    def pod_info(self, name: str, qos: str) -> PodInfo:
        parent = f"{self.prefix}/{'besteffort' if qos == 'BE' else 'burstable'}/pod{name}"
        return PodInfo(name, "default", f"uid-{name}", sandbox_id=f"sandbox{name}", cgroup_parent=parent)

    def cgroup(self, pod: PodInfo, container: str) -> Path:
        path = self.cg_root / "net_cls" / pod.cgroup_parent.strip("/") / container
        path.mkdir(parents=True, exist_ok=True)
        return path

    def spawn(self, netns: str, cgroup: Path | None, argv: list[str]) -> subprocess.Popen[bytes]:
        """``argv`` in ``netns``, put in ``cgroup`` before it starts."""
        enter = f"echo $$ > {cgroup / 'cgroup.procs'} && " if cgroup is not None else ""
        command = ["sh", "-c", f'{enter}exec ip netns exec {netns} "$@"', "sh", *argv]
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(proc)
        return proc


def _mount_net_cls(where: Path) -> Path | None:
    """A net_cls cgroup hierarchy: the host's if it has one, else one mounted at ``where``."""
    host = Path("/sys/fs/cgroup/net_cls")
    if (host / "net_cls.classid").is_file():
        return None
    where.mkdir(parents=True)
    result = subprocess.run(["mount", "-t", "cgroup", "-o", "net_cls", "rp-test-net_cls", str(where)], check=False)
    if result.returncode != 0:
        pytest.fail("cannot mount a net_cls cgroup hierarchy")
    return where


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    tag = uuid.uuid4().hex[:6]
    node, peer, pod = f"rpq{tag}n", f"rpq{tag}p", f"rpq{tag}d"
    mounted = _mount_net_cls(tmp_path / "cg" / "net_cls")
    cg_root = tmp_path / "cg" if mounted else Path("/sys/fs/cgroup")
    prefix = f"/rp-network-test-{tag}"
    made: list[str] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name in (node, peer, pod):
            sh("ip", "netns", "add", name)
            made.append(name)
        sh("ip", "link", "add", "up0", "netns", node, "type", "veth", "peer", "name", "up1", "netns", peer)
        sh("ip", "link", "add", "pod0", "netns", pod, "type", "veth", "peer", "name", "vpod", "netns", node)
        for ns, dev, address in (
            (node, "up0", "10.99.0.1/24"),
            (peer, "up1", "10.99.0.2/24"),
            (pod, "pod0", "10.99.1.2/24"),
            (node, "vpod", "10.99.1.1/24"),
        ):
            sh("ip", "-n", ns, "addr", "add", address, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        for ns in (node, peer, pod):
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", pod, "route", "add", "default", "via", "10.99.1.1")
        sh("ip", "-n", peer, "route", "add", "10.99.1.0/24", "via", "10.99.0.1")
        sh("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        yield Lab(node, peer, pod, "up0", cg_root, prefix, procs)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        for name in made:
            subprocess.run(["ip", "netns", "del", name], check=False)
        top = cg_root / "net_cls" / prefix.strip("/")
        if top.is_dir():
            for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                directory.rmdir()
            top.rmdir()
        if mounted is not None:
            # Unmounted while removed cgroups are still being freed, the hierarchy would outlive
            # the mount (and keep net_cls bound to it): wait until only its root is left.
            deadline = time.monotonic() + 5
            while _net_cls_cgroups() > 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            subprocess.run(["umount", str(mounted)], check=False)


def _net_cls_cgroups() -> int:
    for line in Path("/proc/cgroups").read_text().splitlines():
        fields = line.split()
        if fields and fields[0] == "net_cls":
            return int(fields[2])
    return 0


RECEIVER = r"""
import socket, sys, threading
ports = [int(p) for p in sys.argv[1:]]
socks = []
for port in ports:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(8); socks.append(s)
def drain(server):
    while True:
        conn, _ = server.accept()
        threading.Thread(target=lambda c=conn: [None for _ in iter(lambda: c.recv(1 << 16), b"")], daemon=True).start()
for s in socks:
    threading.Thread(target=drain, args=(s,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""

SENDER = r"""
import socket, struct, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)  # little left queued when it stops
s.connect((host, port))
end, chunk = time.monotonic() + seconds, b"x" * (1 << 16)
while time.monotonic() < end:
    s.send(chunk)
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # drop what is unsent
s.close()
"""


def _rates(shaper: Shaper, warmup: float, window: float) -> dict[int, float]:
    """Mbit/s each class sent over ``window`` seconds, starting ``warmup`` seconds from now."""
    time.sleep(warmup)
    before, start = shaper.class_bytes(), time.monotonic()
    time.sleep(window)
    after, elapsed = shaper.class_bytes(), time.monotonic() - start
    return {c: (after[c] - before.get(c, 0)) * 8 / elapsed / 1e6 for c in after}


def _section(lab: Lab) -> NetworkConfig:
    return replace(DEFAULT_CONFIG, interface=lab.uplink, link_speed_mbit=LINK_MBIT)


@needs_root
def test_bands_shape_real_tcp_flows(lab: Lab) -> None:
    state = NetworkQoS()
    section = _section(lab)
    changes = state.start(section, LOG, netns=lab.node)
    assert "cgroup filter added" in changes, changes
    assert state.shaper is not None
    shaper = state.shaper

    # A host-network BE pod: its sandbox and container run in the node's namespace.
    be_pod = lab.pod_info("be", "BE")
    lab.spawn(lab.node, lab.cgroup(be_pod, be_pod.sandbox_id), ["sleep", "60"])
    be_ctr = lab.cgroup(be_pod, "ctrbe")
    # A pod-network LS pod: its sandbox lives in its own namespace, routed through the node.
    ls_pod = lab.pod_info("ls", "LS")
    lab.spawn(lab.pod, lab.cgroup(ls_pod, ls_pod.sandbox_id), ["sleep", "60"])
    ls_ctr = lab.cgroup(ls_pod, "ctrls")
    time.sleep(0.2)  # the sandboxes have entered their namespaces

    be = state.classify(be_pod, QoSClass.BE, lab.cgroups, LOG)
    ls = state.classify(ls_pod, QoSClass.LSR, lab.cgroups, LOG)
    assert be is not None and ls is not None
    assert (be.band, be.addresses) == ("BE", ())  # host network: classid only
    assert (ls.band, ls.addresses) == ("LS", ("10.99.1.2",))
    assert int((be_ctr / "net_cls.classid").read_text()) == BE
    assert int((lab.cg_root / "net_cls" / be_pod.cgroup_parent.strip("/") / "net_cls.classid").read_text()) == BE
    assert int((ls_ctr / "net_cls.classid").read_text()) == LS
    snap = shaper.snapshot()
    assert [(f.address, f.classid) for f in snap.ip_filters] == [("10.99.1.2", LS)]

    receiver = lab.spawn(lab.peer, None, [sys.executable, "-c", RECEIVER, "5001", "5002"])
    assert receiver.stdout is not None and receiver.stdout.readline().strip() == b"ready"

    # LS alone borrows up to its ceil (the whole link).
    lab.spawn(lab.pod, ls_ctr, [sys.executable, "-c", SENDER, "10.99.0.2", "5001", "2.2"])
    alone = _rates(shaper, 0.6, 1.4)
    time.sleep(0.6)  # the flow ends and what it left queued drains
    # BE and LS together: BE is held to its rate (30 % of the link), LS takes the rest.
    lab.spawn(lab.node, be_ctr, [sys.executable, "-c", SENDER, "10.99.0.2", "5002", "2.2"])
    lab.spawn(lab.pod, ls_ctr, [sys.executable, "-c", SENDER, "10.99.0.2", "5001", "2.2"])
    both = _rates(shaper, 0.6, 1.4)
    print(
        f"\nlink {LINK_MBIT} Mbit, BE rate 3 Mbit ceil 10, LS rate 3 Mbit ceil 10 (prio 2 < BE's 3):"
        f"\n  LS alone:      LS {alone[LS]:.2f} Mbit/s, BE {alone[BE]:.2f}, SYSTEM {alone[SYSTEM]:.2f}"
        f"\n  LS + BE:       LS {both[LS]:.2f} Mbit/s, BE {both[BE]:.2f}, SYSTEM {both[SYSTEM]:.2f}"
    )
    assert alone[LS] >= 0.7 * LINK_MBIT, alone
    assert alone[LS] <= 1.15 * LINK_MBIT, alone
    assert alone[BE] < 0.2, alone
    assert 0.3 * 3 <= both[BE] <= 1.35 * 3, both  # held to its band's rate (3 Mbit/s)
    assert both[LS] >= 1.5 * both[BE], both
    assert both[LS] + both[BE] <= 1.15 * LINK_MBIT, both
    assert both[SYSTEM] < 0.5, both  # nothing leaked into the default class


@needs_root
def test_idempotent_reapply_drift_repair_and_teardown(lab: Lab) -> None:
    state = NetworkQoS()
    section = _section(lab)
    assert state.start(section, LOG, netns=lab.node)
    shaper = state.shaper
    assert shaper is not None
    first = shaper.snapshot()
    assert state.start(section, LOG, netns=lab.node) == []  # again: nothing to do
    again = shaper.snapshot()
    assert again.classes.keys() == first.classes.keys() == {0x10001, SYSTEM, LS, BE}
    assert [c.rate for c in again.classes.values()] == [c.rate for c in first.classes.values()]
    assert again.cgroup_filters == first.cgroup_filters and len(again.cgroup_filters) == 1
    assert again.default_minor == 0x10
    plan = state.plan
    assert plan is not None and shaper.ensure_tree(plan) == []

    ls_pod = lab.pod_info("ls", "LS")
    lab.spawn(lab.pod, lab.cgroup(ls_pod, ls_pod.sandbox_id), ["sleep", "60"])
    be_pod = lab.pod_info("be", "BE")
    lab.spawn(lab.node, lab.cgroup(be_pod, be_pod.sandbox_id), ["sleep", "60"])
    time.sleep(0.2)
    # BE comes from the pod's labels in reconcile (qos_of), as it does in hook calls.
    be_pod = replace(be_pod, labels={"koordinator.sh/qosClass": "BE"})
    pods = [replace(ls_pod, labels={"koordinator.sh/qosClass": "LS"}), be_pod]
    found = state.reconcile(pods, section, lab.cgroups, LOG)
    assert found == {}  # classifying pods for the first time is not drift
    assert state.reconcile(pods, section, lab.cgroups, LOG) == {}

    # Drift: a class changed, the cgroup filter gone, a stray address filter, a classid reset.
    tc = ["ip", "netns", "exec", lab.node, "tc"]
    sh(*tc, "class", "change", "dev", lab.uplink, "parent", "1:1", "classid", "1:30", "htb", "rate", "5mbit")
    sh(*tc, "filter", "del", "dev", lab.uplink, "parent", "1:", "prio", "1")
    sh(*tc, "filter", "add", "dev", lab.uplink, "parent", "1:", "prio", "2", "protocol", "ip", "u32",
       "match", "ip", "src", "10.99.7.7/32", "classid", "1:20")  # fmt: skip
    be_dir = lab.cg_root / "net_cls" / be_pod.cgroup_parent.strip("/")
    (be_dir / be_pod.sandbox_id / "net_cls.classid").write_text("0")
    with structlog.testing.capture_logs() as logs:
        found = state.reconcile(pods, section, lab.cgroups, LOG)
    assert found == {"tree": 2, "address": 1, "classid": 1}, (found, logs)
    assert state.drift == found
    snap = shaper.snapshot()
    assert snap.classes[BE].rate == 375_000 and len(snap.cgroup_filters) == 1
    assert [(f.address, f.classid) for f in snap.ip_filters] == [("10.99.1.2", LS)]
    assert int((be_dir / be_pod.sandbox_id / "net_cls.classid").read_text()) == BE
    assert state.reconcile(pods, section, lab.cgroups, LOG) == {}

    # A policy change is applied, and is not drift.
    smaller = replace(section, LS=replace(section.LS, rate_percent=20), BE=replace(section.BE, rate_percent=10))
    assert state.reconcile(pods, smaller, lab.cgroups, LOG) == {}
    snap = shaper.snapshot()
    assert (snap.classes[LS].rate, snap.classes[BE].rate) == (250_000, 125_000)
    assert state.reconcile(pods, section, lab.cgroups, LOG) == {}
    assert shaper.snapshot().classes[BE].rate == 375_000

    # A pod that is gone loses its address filter (its address may go to the next pod).
    assert state.reconcile([be_pod], section, lab.cgroups, LOG) == {"address": 1}
    assert shaper.snapshot().ip_filters == ()

    # A foreign root qdisc is replaced by the tree.
    sh(*tc, "qdisc", "replace", "dev", lab.uplink, "root", "handle", "7:", "tbf", "rate", "1mbit", "burst", "10k",
       "latency", "50ms")  # fmt: skip
    found = state.reconcile([be_pod], section, lab.cgroups, LOG)
    assert found["tree"] == 6, found  # root, 4 classes, cgroup filter
    assert shaper.snapshot().ours

    assert network.teardown(lab.uplink, lab.node) is True
    snap = shaper.snapshot()
    assert not snap.ours and snap.classes == {}
    assert network.teardown(lab.uplink, lab.node) is False
    out = subprocess.run(
        [sys.executable, "-m", "runtimeproxy.hooks.plugins.network", "show", lab.uplink, "--netns", lab.node],
        check=True,
        capture_output=True,
        text=True,
        timeout=20,
    ).stdout
    assert json.loads(out)["ours"] is False


@needs_root
async def test_plugin_lifecycle_through_the_runner(lab: Lab) -> None:
    """on_start / a hook call / reconcile / on_stop as the server runs them (sync handlers in threads)."""
    policy = policy_from(f"network: {{interface: {lab.uplink}, link_speed_mbit: {LINK_MBIT}}}", network.plugin)
    context = ServerContext(cgroups=lab.cgroups, policy=lambda: policy, settings={"network_netns": lab.node})
    runner = PluginRunner([network.plugin], context=context)
    try:
        assert await runner.start() == []
        state: Any = runner.state_of("network")  # the one NetworkQoS of this runner
        assert state.active and state.shaper.snapshot().ours
        pod = replace(lab.pod_info("ls", "LS"), labels={"koordinator.sh/qosClass": "LS"})
        lab.spawn(lab.pod, lab.cgroup(pod, pod.sandbox_id), ["sleep", "60"])
        time.sleep(0.2)
        result = await runner.run(HookPoint.PRE_CREATE_CONTAINER, pod=pod)
        assert result.applied == ["network"] and result.failures == []
        assert [f.address for f in state.shaper.snapshot().ip_filters] == ["10.99.1.2"]
        assert await runner.reconcile(pods=[pod]) == []
        loaded = policy.sections["network"]
        given = {"section": loaded.common, "settings_for": loaded.for_class, "state": state}
        assert handlers._reconcile(pods=[pod], cgroups=lab.cgroups, log=LOG, **given) == 0
        result = await runner.run(HookPoint.POST_STOP_POD_SANDBOX, pod=pod)
        assert result.failures == [] and state.shaper.snapshot().ip_filters == ()
        assert await runner.stop() == []
        assert state.shaper.snapshot().ours  # on_stop leaves the tree
    finally:
        runner.close()
        network.teardown(lab.uplink, lab.node)
