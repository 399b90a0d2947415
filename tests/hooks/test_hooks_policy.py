"""The runtime-hooks QoS policy file: defaults, overlay, validation, dumping and the watcher."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from runtimeproxy.hooks.discovery import settings_specs
from runtimeproxy.hooks.plugins import cpu, cpuset, gpu, memory, network, resctrl
from runtimeproxy.hooks.plugins.cpu import CPUSection, CPUSettings
from runtimeproxy.hooks.plugins.cpuset import CPUSetSettings
from runtimeproxy.hooks.plugins.gpu import GPUSettings
from runtimeproxy.hooks.plugins.memory import MemorySettings
from runtimeproxy.hooks.plugins.network import NETWORK_BANDS, NetworkBandSettings, NetworkSection
from runtimeproxy.hooks.plugins.resctrl import ResctrlSettings
from runtimeproxy.hooks.policy import (
    DEFAULT_POLICY,
    DEFAULT_POLICY_FILE,
    Policy,
    PolicyError,
    PolicyWatcher,
    ReconcilerPolicy,
    TrustPolicy,
    default_policy,
    dump_policy,
    load_policy,
    loads_policy,
)
from runtimeproxy.hooks.qos import QoSClass
from runtimeproxy.hooks.sdk import Plugin, PluginDefinitionError
from runtimeproxy.hooks.settings import SectionSettings
from strategies import network_bands
from structlog.testing import capture_logs

LSE, LSR, LS, BE, SYSTEM = QoSClass
REPO = Path(__file__).resolve().parents[2]
BUILTINS = (cpu.plugin, cpuset.plugin, resctrl.plugin, memory.plugin, network.plugin, gpu.plugin)
SPECS = settings_specs(BUILTINS)
DEFAULTS = default_policy(SPECS)


def loads(text: str, file: str = "<string>", base: Policy | None = None) -> Policy:
    """A policy read against the built-ins' settings."""
    return loads_policy(text, file, base, SPECS)


class _Section:
    """A section with attribute access: entries by class name, section-wide keys by name."""

    def __init__(self, section: SectionSettings) -> None:
        self._section = section

    def __getattr__(self, name: str) -> Any:
        if name in self._section.entries:
            return self._section.entries[name]
        if name in QoSClass.__members__:
            return self._section.for_class(name)
        return getattr(self._section.common, name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Section) and other._section == self._section


class V:
    """``V(policy).cpu.LS``: a policy's built-in sections with attribute access, for short tests."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def __getattr__(self, name: str) -> Any:
        return _Section(self.policy.section(SPECS[name]))


# --- defaults ---------------------------------------------------------------------------
# Koordinator v1.8.0 (unchanged on master a7a1b76b), file and value named in each assertion.


def test_cpu_defaults_are_koordinators() -> None:
    cpu = V(DEFAULTS).cpu
    # pkg/util/sloconfig/nodeslo_config.go DefaultCPUQOS: GroupIdentity LSR 2, LS 2, BE -1, SYSTEM 0;
    # pkg/koordlet/runtimehooks/hooks/groupidentity/rule.go gives LSE the LSR value.
    assert [getattr(cpu, qos).group_identity for qos in QoSClass] == [2, 2, 2, -1, 0]
    # DefaultCPUQOS: SchedIdle 0 for every class, BE included (cpu.idle pins cpu.shares).
    assert not any(getattr(cpu, qos).cpu_idle for qos in QoSClass)
    # DefaultCPUBurstConfig: Policy "none", so koordlet's cpuburst strategy writes a burst of 0 for
    # every pod (its CPUBurstPercent 1000 applies only with policy cpuBurstOnly or auto).
    assert [getattr(cpu, qos).cfs_burst_percent for qos in QoSClass] == [0, 0, 0, 0, 0]
    # hooks/cpuset/cpuset.go unsets the CFS quota of cpuset pods (LSE, LSR).
    assert [getattr(cpu, qos).cfs_quota_enabled for qos in QoSClass] == [False, False, True, True, True]
    # hooks/batchresource: BE quota from the kubernetes.io/batch-cpu limit.
    assert cpu.be_quota_source == "batch"


def test_cpuset_defaults_are_koordinators() -> None:
    # hooks/cpuset/cpuset.go cpusetPodQOSConditions = LSE, LSR
    assert [qos for qos in QoSClass if DEFAULTS.section(SPECS["cpuset"]).for_class(qos).pinned] == [LSE, LSR]


def test_resctrl_defaults_are_koordinators() -> None:
    resctrl = V(DEFAULTS).resctrl
    # DefaultResctrlQOS: CATRangeStartPercent/CATRangeEndPercent/MBAPercent; LSE uses the LSR group
    # (qosmanager/plugins/resctrl/resctrl_reconcile.go getPodResctrlGroup).
    assert resctrl.LSR == resctrl.LS == resctrl.SYSTEM == ResctrlSettings((0, 100), 100)
    assert ResctrlSettings((0, 30), 100) == resctrl.BE
    assert resctrl.LSE == resctrl.LSR


def test_memory_defaults_are_koordinators() -> None:
    memory = V(DEFAULTS).memory
    # DefaultMemoryQOS: MinLimitPercent 0, LowLimitPercent 0, ThrottlingPercent 0 for all classes;
    # WmarkRatio 95 / WmarkScalePermill 20 / WmarkMinAdj -25 (LSR, LS), 50 (BE); SYSTEM 0 / 50 / 0.
    for qos in QoSClass:
        entry = getattr(memory, qos)
        assert (entry.min_percent, entry.low_percent, entry.throttling_percent) == (0, 0, 0)
        assert entry.v1_soft_limit == "unset"  # no Koordinator counterpart: leave the kernel's
    for qos, values in {"LSR": (95, 20, -25), "LS": (95, 20, -25), "BE": (95, 20, 50), "SYSTEM": (0, 50, 0)}.items():
        entry = getattr(memory, qos)
        assert (entry.wmark_ratio, entry.wmark_scale_permill, entry.wmark_min_adj) == values
    assert memory.LSE == memory.LSR  # qosmanager/helpers/property.go: LSE uses the LSR strategy


def test_network_defaults_are_koordinators() -> None:
    network = V(DEFAULTS).network
    assert (network.interface, network.link_speed_mbit) == ("", 0)  # off; Koordinator's interface is eth0
    # hooks/tc/tc_linux.go: *_CLASS_RATE_PERCENTAGE 40/30/30, CEIL_PERCENTAGE 100, *_CLASS_PRIO 1/2/3.
    assert NetworkBandSettings(40, 100, 1) == network.SYSTEM
    assert NetworkBandSettings(30, 100, 2) == network.LS
    assert NetworkBandSettings(30, 100, 3) == network.BE
    # hooks/tc/netqos_tc.go GetPodNetQoSClassByName: LSE, LSR, LS -> ls_class.
    assert dict(NETWORK_BANDS) == {LSE: LS, LSR: LS, LS: LS, BE: BE, SYSTEM: SYSTEM}


def test_reconciler_default_is_koordinators() -> None:
    # pkg/koordlet/runtimehooks/config.go RuntimeHookReconcileInterval: 10 * time.Second
    assert DEFAULT_POLICY.reconciler == ReconcilerPolicy(10.0)


def test_the_shipped_file_is_the_whole_default_policy() -> None:
    """The YAML in the package sets every key (it is the defaults' only source) and nothing else."""
    text = (resources.files("runtimeproxy.hooks.data") / DEFAULT_POLICY_FILE).read_text(encoding="utf-8")
    assert yaml.safe_load(text) == yaml.safe_load(dump_policy(DEFAULTS))
    assert text == (REPO / "hooks" / "data" / DEFAULT_POLICY_FILE).read_text(encoding="utf-8")


def test_the_defaults_file_may_not_leave_keys_out() -> None:
    """A built-in's settings have no defaults of their own: the file must set every key."""
    with pytest.raises(PluginDefinitionError, match=r"plugin cpu: its defaults: cpu.be_quota_source: missing"):
        Plugin("cpu", settings=CPUSettings, section=CPUSection, defaults={})


# --- overlay ----------------------------------------------------------------------------


def test_a_partial_file_keeps_every_other_default() -> None:
    policy = loads(
        """
        resctrl:
          BE: {l3_percent_range: [0, 20]}
        network:
          interface: eth0
        cpu:
          LS: {cfs_burst_percent: 500}
        """
    )
    assert ResctrlSettings((0, 20), 100) == V(policy).resctrl.BE  # mb_percent kept
    assert V(policy).network.interface == "eth0"
    assert dataclasses.replace(V(DEFAULTS).cpu.LS, cfs_burst_percent=500) == V(policy).cpu.LS
    changed = {name for name in SPECS if policy.section(SPECS[name]) != DEFAULTS.section(SPECS[name])}
    assert changed == {"resctrl", "network", "cpu"}
    assert (policy.reconciler, policy.trust) == (DEFAULTS.reconciler, DEFAULTS.trust)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}", "cpu:\n", "cpu: {LS: }\n", "cpu: {}\nmemory: {}\n"])
def test_empty_files_and_sections_are_the_defaults(text: str) -> None:
    assert loads(text) == DEFAULTS


def test_overlay_on_another_base() -> None:
    base = loads("reconciler: {interval_seconds: 3}\nresctrl: {BE: {mb_percent: 50}}")
    policy = loads("resctrl: {BE: {l3_percent_range: [10, 40]}}", base=base)
    assert policy.reconciler.interval_seconds == 3.0
    assert ResctrlSettings((10, 40), 50) == V(policy).resctrl.BE


def test_load_policy_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("cpuset: {LS: {pinned: true}}\n")
    assert CPUSetSettings(True) == V(load_policy(path, specs=SPECS)).cpuset.LS
    assert load_policy(str(path), specs=SPECS) == load_policy(path, specs=SPECS)


def test_yaml_anchors_and_merge_keys_work() -> None:
    policy = loads(
        """
        memory:
          LS: &tuned {min_percent: 10, low_percent: 20}
          LSR: *tuned
          BE: {<<: *tuned, low_percent: 0}
        """
    )
    assert V(policy).memory.LS.min_percent == V(policy).memory.LSR.min_percent == V(policy).memory.BE.min_percent == 10
    assert (V(policy).memory.LS.low_percent, V(policy).memory.BE.low_percent) == (20, 0)


# --- validation -------------------------------------------------------------------------

ERRORS = [
    # (file text, YAML path, part of the reason)
    ("resctrl: {BE: {l3_percent_range: [30, 20]}}", "resctrl.BE.l3_percent_range", "start (30) must be below end (20)"),
    ("resctrl: {BE: {l3_percent_range: [10, 10]}}", "resctrl.BE.l3_percent_range", "must be below end"),
    ("resctrl: {BE: {l3_percent_range: [0, 101]}}", "resctrl.BE.l3_percent_range", "from 0 to 100, got 101"),
    ("resctrl: {BE: {l3_percent_range: [-1, 50]}}", "resctrl.BE.l3_percent_range", "got -1"),
    ("resctrl: {BE: {l3_percent_range: [0, 30, 60]}}", "resctrl.BE.l3_percent_range", "[start, end]"),
    ("resctrl: {BE: {l3_percent_range: 30}}", "resctrl.BE.l3_percent_range", "[start, end]"),
    ("resctrl: {BE: {l3_percent_range: [0, 2.5]}}", "resctrl.BE.l3_percent_range", "[start, end]"),
    ("resctrl: {LS: {mb_percent: 0}}", "resctrl.LS.mb_percent", "from 1 to 100, got 0"),
    ("resctrl: {LS: {mb_percent: 150}}", "resctrl.LS.mb_percent", "got 150"),
    ("resctrl: {LS: {mb_percent: '50'}}", "resctrl.LS.mb_percent", "got '50'"),
    ("resctrl: {XX: {}}", "resctrl.XX", "unknown QoS class 'XX' (valid keys: LSE, LSR, LS, BE, SYSTEM)"),
    ("resctrl: {GUARANTEED: {}}", "resctrl.GUARANTEED", "unknown QoS class"),
    ("resctrl: {be: {}}", "resctrl.be", "did you mean 'BE'?"),
    ("resctrl: {BE: {l3: [0, 10]}}", "resctrl.BE.l3", "unknown key 'l3' (valid keys: l3_percent_range, mb_percent)"),
    ("resctrl: [BE]", "resctrl", "must be a mapping with keys LSE, LSR, LS, BE, SYSTEM, got a list"),
    ("resctrl: {BE: 3}", "resctrl.BE", "must be a mapping"),
    ("cpu: {be_quota_source: limits}", "cpu.be_quota_source", "one of batch, kubelet, got 'limits'"),
    ("cpu: {LS: {cfs_burst_percent: 10001}}", "cpu.LS.cfs_burst_percent", "from 0 to 10000"),
    ("cpu: {LS: {cfs_quota_burst_percent: 300}}", "cpu.LS.cfs_quota_burst_percent", "unknown key"),  # removed
    ("cpu: {BE: {group_identity: -2}}", "cpu.BE.group_identity", "from -1 to 2"),
    ("cpu: {BE: {cpu_idle: yes please}}", "cpu.BE.cpu_idle", "true or false, got 'yes please'"),
    ("cpu: {BE: {cpu_idle: 1}}", "cpu.BE.cpu_idle", "true or false, got 1"),
    ("cpu: {LS: {cfs_quota_enabled: null}}", "cpu.LS.cfs_quota_enabled", "got null"),
    ("cpu: {LS: {group_identity: true}}", "cpu.LS.group_identity", "got true"),
    ("cpuset: {LS: {pinned: true, exclusive: true}}", "cpuset.LS.exclusive", "valid keys: pinned"),
    ("memory: {LS: {min_percent: 101}}", "memory.LS.min_percent", "a percentage from 0 to 100"),
    ("memory: {LS: {min_percent: 50, low_percent: 20}}", "memory.LS.low_percent", "below min_percent (50)"),
    ("memory: {BE: {wmark_scale_permill: 0}}", "memory.BE.wmark_scale_permill", "from 1 to 1000"),
    ("memory: {BE: {wmark_min_adj: 51}}", "memory.BE.wmark_min_adj", "from -25 to 50"),
    ("memory: {BE: {v1_soft_limit: half}}", "memory.BE.v1_soft_limit", "one of unset, request, zero"),
    ("network: {interface: eth0/1}", "network.interface", "not a valid interface name"),
    ("network: {interface: abcdefghijklmnop}", "network.interface", "at most 15 bytes"),
    ("network: {interface: 'a b'}", "network.interface", "not a valid interface name"),
    ("network: {interface: 7}", "network.interface", "got 7"),
    ("network: {link_speed_mbit: -1}", "network.link_speed_mbit", "of at least 0"),
    ("network: {LSR: {rate_percent: 10}}", "network.LSR", "LSR has no entry of its own: LSE, LSR, LS pods share LS's"),
    ("network: {BE: {rate_percent: 0}}", "network.BE.rate_percent", "from 1 to 100"),
    ("network: {BE: {rate_percent: 50}}", "network", "add up to 120 (LS 30 + BE 50 + SYSTEM 40), more than 100"),
    ("network: {LS: {rate_percent: 60, ceil_percent: 50}}", "network.LS.rate_percent", "above ceil_percent (50)"),
    ("network: {SYSTEM: {priority: 8}}", "network.SYSTEM.priority", "from 0 to 7"),
    ("reconciler: {interval_seconds: 0}", "reconciler.interval_seconds", "from 0.1 to 86400, got 0"),
    ("reconciler: {interval_seconds: .nan}", "reconciler.interval_seconds", "got nan"),
    ("reconciler: {interval_seconds: 10s}", "reconciler.interval_seconds", "got '10s'"),
    ("reconciler: {interval: 10}", "reconciler.interval", "valid keys: interval_seconds"),
    ("cpuburst: {}", "cpuburst", "unknown section 'cpuburst': no installed plugin defines it (plugin sections: cpu, "),
    ("1: {}", "1", "unknown section 1"),
    ("- cpu", "", "the policy must be a mapping with keys reconciler, trust, cpu, cpuset"),
    ("cpu: {}\ncpu: {}\n", "", "found key 'cpu' twice (line 2, column 1)"),
    ("resctrl: {BE: {mb_percent: 10, mb_percent: 20}}", "", "found key 'mb_percent' twice"),
    ("cpu: [\n", "", "not valid YAML"),
    ("a: 1\n---\nb: 2\n", "", "not valid YAML"),
]


@pytest.mark.parametrize(("text", "path", "reason"), ERRORS)
def test_each_error_names_the_file_and_path(text: str, path: str, reason: str) -> None:
    with pytest.raises(PolicyError) as caught:
        loads(text, "/etc/runtime-hooks/policy.yaml")
    error = caught.value
    assert (error.file, error.path) == ("/etc/runtime-hooks/policy.yaml", path)
    assert reason in error.reason
    prefix = f"/etc/runtime-hooks/policy.yaml: {path}: " if path else "/etc/runtime-hooks/policy.yaml: "
    assert str(error) == prefix + error.reason


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(tmp_path / "absent.yaml")
    assert caught.value.file == str(tmp_path / "absent.yaml")
    assert "cannot read the file: No such file or directory" in str(caught.value)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"cpu: {}\n\xff\n")
    with pytest.raises(PolicyError, match=r"not UTF-8 text \(byte 8\)"):
        load_policy(binary)


# --- settings for a class --------------------------------------------------------------


def test_settings_for_every_plugin_and_class() -> None:
    policy = loads("memory: {BE: {v1_soft_limit: zero}}")
    for qos in QoSClass:
        for name in ("cpu", "cpuset", "resctrl", "memory", "gpu"):
            assert policy.section(SPECS[name]).for_class(qos) is policy.sections[name].entries[qos.value]
        band = NETWORK_BANDS[qos].value
        assert policy.section(SPECS["network"]).for_class(qos) is policy.sections["network"].entries[band]
    assert policy.section(SPECS["memory"]).for_class(BE).v1_soft_limit == "zero"
    assert policy.section(SPECS["resctrl"]).for_class("BE") is V(policy).resctrl.BE
    assert set(policy.sections) == set(SPECS) == {"cpu", "cpuset", "resctrl", "memory", "network", "gpu"}
    with pytest.raises(ValueError):
        policy.section(SPECS["cpu"]).for_class("GUARANTEED")


# --- dumping ----------------------------------------------------------------------------


def test_dump_is_plain_yaml_in_a_stable_order() -> None:
    text = dump_policy(DEFAULTS)
    assert list(yaml.safe_load(text)) == ["cpu", "cpuset", "gpu", "memory", "network", "resctrl", "reconciler", "trust"]
    assert "  BE:\n    l3_percent_range: [0, 30]\n    mb_percent: 100\n" in text
    assert "  interface: ''\n" in text
    assert loads(text) == DEFAULTS
    assert dump_policy(loads(text)) == text


def test_pod_cpu_qos_is_trusted_unless_the_policy_says_not() -> None:
    assert DEFAULT_POLICY.trust.pod_cpu_qos is True  # Koordinator's behaviour
    assert loads("trust: {pod_cpu_qos: false}").trust == TrustPolicy(pod_cpuset=True, pod_cpu_qos=False)
    with pytest.raises(PolicyError, match=r"trust\.pod_cpu_qos: must be true or false"):
        loads("trust: {pod_cpu_qos: 1}")


def test_pod_cpusets_are_trusted_unless_the_policy_says_not() -> None:
    assert DEFAULT_POLICY.trust.pod_cpuset is True  # Koordinator's behaviour
    assert loads("trust: {pod_cpuset: false}").trust == TrustPolicy(pod_cpuset=False, pod_cpu_qos=True)
    with pytest.raises(PolicyError, match=r"trust\.pod_cpuset: must be true or false, got 'no'"):
        loads("trust: {pod_cpuset: 'no'}")
    with pytest.raises(PolicyError, match=r"trust\.pod_cpusets"):
        loads("trust: {pod_cpusets: false}")


def test_round_trip_of_an_edited_policy() -> None:
    policy = loads("network: {interface: 'yes', link_speed_mbit: 25000}\nreconciler: {interval_seconds: 0.25}")
    assert V(policy).network.interface == "yes"  # quoted on the way out, or it would come back as true
    assert loads(dump_policy(policy), base=None) == policy


# Any valid policy (hypothesis): every leaf drawn from its whole valid range.
cpu_classes = st.builds(
    CPUSettings,
    cfs_quota_enabled=st.booleans(),
    cfs_burst_percent=st.integers(0, 10000),
    cpu_idle=st.booleans(),
    group_identity=st.integers(-1, 2),
    group_identity_enabled=st.booleans(),
)
cpuset_classes = st.builds(CPUSetSettings, pinned=st.booleans())
gpu_classes = st.builds(GPUSettings, enabled=st.booleans())
l3_ranges = st.integers(0, 99).flatmap(lambda start: st.tuples(st.just(start), st.integers(start + 1, 100)))
resctrl_classes = st.builds(ResctrlSettings, l3_percent_range=l3_ranges, mb_percent=st.integers(1, 100))


@st.composite
def memory_classes(draw: st.DrawFn) -> MemorySettings:
    minimum = draw(st.integers(0, 100))
    return MemorySettings(
        min_percent=minimum,
        low_percent=draw(st.one_of(st.just(0), st.integers(minimum, 100))),
        throttling_percent=draw(st.integers(0, 100)),
        wmark_ratio=draw(st.integers(0, 100)),
        wmark_scale_permill=draw(st.integers(1, 1000)),
        wmark_min_adj=draw(st.integers(-25, 50)),
        v1_soft_limit=draw(st.sampled_from(["unset", "request", "zero"])),
        batch_memory_limit=draw(st.booleans()),
        pod_oom_score_adj=draw(st.booleans()),
    )


def _valid_interface(name: str) -> bool:
    bad = any(c in "/:" or c.isspace() or not c.isprintable() for c in name)
    return len(name.encode()) < 16 and name not in (".", "..") and not bad


tricky_names = st.sampled_from(["eth0", "yes", "null", "0", "~", "-", "é"])
interfaces = st.one_of(st.just(""), tricky_names, st.text(min_size=1, max_size=15))


NO_COMMON: st.SearchStrategy[Any] = st.none()


def section(name: str, entries: st.SearchStrategy[Any], common: st.SearchStrategy[Any] = NO_COMMON) -> Any:
    """Any valid section of plugin ``name``: an entry per class from ``entries``."""
    spec = SPECS[name]
    drawn = st.fixed_dictionaries(dict.fromkeys(spec.entry_names, entries))
    return st.builds(lambda found, shared: SectionSettings(found, shared, spec.class_entry), drawn, common)


@st.composite
def networks(draw: st.DrawFn) -> SectionSettings:
    bands = draw(network_bands())
    interface = draw(interfaces.filter(_valid_interface))
    common = NetworkSection(interface=interface, link_speed_mbit=draw(st.integers(0, 2**40)))
    return SectionSettings(bands, common, SPECS["network"].class_entry)


policies = st.builds(
    Policy,
    reconciler=st.builds(ReconcilerPolicy, st.floats(0.1, 86400.0)),
    trust=st.builds(TrustPolicy, st.booleans()),
    sections=st.fixed_dictionaries(
        {
            "cpu": section("cpu", cpu_classes, st.builds(CPUSection, st.sampled_from(["batch", "kubelet"]))),
            "cpuset": section("cpuset", cpuset_classes),
            "gpu": section("gpu", gpu_classes),
            "memory": section("memory", memory_classes()),
            "network": networks(),
            "resctrl": section("resctrl", resctrl_classes),
        }
    ),
)


@settings(deadline=None)  # a YAML dump and load per example: no timing asserted
@given(policies)
def test_any_valid_policy_survives_dump_and_load(policy: Policy) -> None:
    text = dump_policy(policy)
    assert loads(text) == policy
    assert dump_policy(loads(text)) == text


@settings(deadline=None)
@given(policies, st.sets(st.sampled_from([*SPECS, "reconciler", "trust"])))
def test_dumped_sections_overlay_the_rest(policy: Policy, sections: set[str]) -> None:
    full = yaml.safe_load(dump_policy(policy))
    partial = yaml.safe_dump({name: full[name] for name in sections})
    loaded = loads(partial)
    for name in SPECS:
        assert loaded.sections[name] == (policy if name in sections else DEFAULTS).sections[name]
    for name in ("reconciler", "trust"):
        assert getattr(loaded, name) == getattr(policy if name in sections else DEFAULTS, name)


# --- the watcher ------------------------------------------------------------------------


def write(path: Path, text: str) -> None:
    """Replace the file atomically, as the watcher's doc asks."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def events(logs: Sequence[Mapping[str, Any]]) -> list[str]:
    return [entry["event"] for entry in logs]


def test_watcher_reloads_on_change_and_keeps_the_last_good_policy(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    write(path, "resctrl: {BE: {l3_percent_range: [0, 20]}}\n")
    seen: list[Policy] = []
    watcher = PolicyWatcher(path, seen.append, specs=SPECS)
    assert watcher.current == DEFAULTS

    with capture_logs() as logs:
        assert watcher.check() is True
    first = watcher.current
    assert V(first).resctrl.BE.l3_percent_range == (0, 20)
    assert seen == [first]
    assert logs == [{"event": "policy loaded", "log_level": "info", "path": str(path), "changed": ["resctrl"]}]

    with capture_logs() as logs:
        assert watcher.check() is False  # unchanged file: not even re-read
    assert logs == []

    write(path, "resctrl: {BE: {l3_percent_range: [20, 10]}}\n")
    with capture_logs() as logs:
        assert watcher.check() is False
        assert watcher.check() is False  # the same bad version is reported once
    assert watcher.current is first
    assert seen == [first]
    assert logs == [
        {
            "event": "policy file invalid; keeping the current policy",
            "log_level": "error",
            "path": str(path),
            "yaml_path": "resctrl.BE.l3_percent_range",
            "reason": "start (20) must be below end (10)",
            "error": f"{path}: resctrl.BE.l3_percent_range: start (20) must be below end (10)",
            "cause": "invalid",
        }
    ]

    write(path, "resctrl: {BE: {l3_percent_range: [0, 10]}}\nnetwork: {interface: eth0}\n")
    with capture_logs() as logs:
        assert watcher.check() is True
    assert V(watcher.current).resctrl.BE.l3_percent_range == (0, 10)
    assert V(watcher.current).network.interface == "eth0"
    assert seen[-1] is watcher.current
    assert logs[0]["changed"] == ["network", "resctrl"]

    write(path, "resctrl: {BE: {l3_percent_range: [0, 10]}}\nnetwork: {interface: eth0}\n# a comment\n")
    with capture_logs() as logs:
        assert watcher.check() is False  # read again, same policy: no callback
    assert events(logs) == ["policy file read; policy unchanged"]
    assert len(seen) == 2

    write(path, "network: {interface: eth0}\n")  # a key removed from the file goes back to its default
    assert watcher.check() is True
    assert watcher.current.sections["resctrl"] == DEFAULTS.sections["resctrl"]


def test_watcher_without_a_file_uses_the_defaults_and_keeps_a_removed_ones_policy(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    watcher = PolicyWatcher(path, specs=SPECS)
    with capture_logs() as logs:
        assert watcher.check() is False
        assert watcher.check() is False
    assert watcher.current == DEFAULTS
    assert events(logs) == ["no policy file; using the defaults"]

    write(path, "cpu: {be_quota_source: kubelet}\n")
    assert watcher.check() is True
    loaded = watcher.current
    path.unlink()
    with capture_logs() as logs:
        assert watcher.check() is False
    assert watcher.current is loaded
    assert logs == [{"event": "policy file removed; keeping the current policy", "log_level": "warning",
                     "path": str(path)}]


def test_watcher_starts_on_an_invalid_file_with_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    write(path, "cpu: {LS: {cfs_burst_percent: -5}}\n")
    watcher = PolicyWatcher(path, specs=SPECS)
    with capture_logs() as logs:
        assert watcher.check() is False
    assert watcher.current == DEFAULTS
    assert logs[0]["yaml_path"] == "cpu.LS.cfs_burst_percent"


def test_a_failing_callback_is_logged_and_the_policy_still_changes(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    write(path, "cpuset: {BE: {pinned: true}}\n")

    def broken(policy: Policy) -> None:
        raise RuntimeError("consumer bug")

    watcher = PolicyWatcher(path, broken, specs=SPECS)
    with capture_logs() as logs:
        assert watcher.check() is True
    assert V(watcher.current).cpuset.BE.pinned
    assert events(logs) == ["policy loaded", "policy change callback failed"]


def test_watcher_argument_checks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="poll_interval"):
        PolicyWatcher(tmp_path / "p.yaml", poll_interval=0)
    assert PolicyWatcher(tmp_path / "p.yaml").poll_interval == 0.5


async def test_watcher_polls_in_the_background(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    write(path, "reconciler: {interval_seconds: 5}\n")
    changes: asyncio.Queue[Policy] = asyncio.Queue()
    watcher = PolicyWatcher(path, changes.put_nowait, poll_interval=0.02)
    await watcher.start()
    try:
        assert (await asyncio.wait_for(changes.get(), 5)).reconciler.interval_seconds == 5.0  # read by start
        await watcher.start()  # a second start does nothing
        write(path, "reconciler: {interval_seconds: 2}\n")
        assert (await asyncio.wait_for(changes.get(), 5)).reconciler.interval_seconds == 2.0
        with capture_logs() as logs:
            write(path, "reconciler: {interval_seconds: -2}\n")
            while not logs:
                await asyncio.sleep(0.01)
        assert logs[0]["yaml_path"] == "reconciler.interval_seconds"
        assert watcher.current.reconciler.interval_seconds == 2.0
    finally:
        await watcher.stop()
    await watcher.stop()  # stopping twice is fine
    write(path, "reconciler: {interval_seconds: 7}\n")
    await asyncio.sleep(0.1)
    assert watcher.current.reconciler.interval_seconds == 2.0  # stopped: no more reloads
    assert changes.empty()
