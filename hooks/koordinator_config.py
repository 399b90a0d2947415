"""Koordinator's node SLO configuration as a runtime-hooks policy and Helm chart values.

``convert(document)`` takes Koordinator's ``slo-controller-config`` ConfigMap or a NodeSLO object
(already parsed from YAML or JSON) and returns a ``Conversion``: the policy of nodes no node
strategy matches (``policy``), one ``Group`` per node strategy, in order, with its node selector
and whole policy (``groups``: the chart's ``groups`` value, first match wins, as Koordinator's
``nodeStrategies``), and a ``Finding`` for every leaf field of the input: mapped (and to what),
unsupported (in effect in Koordinator, but not done here), or inactive (not done here, but not
in effect in the input either, e.g. its feature's ``enable`` is false). ``SLOInputError`` for
input Koordinator would refuse.

Values are read as koordlet reads them: each strategy is laid over Koordinator's defaults, a node
strategy over the cluster strategy, and an LSR, LS or BE feature whose ``enable`` is false takes
Koordinator's "none" values (what koordlet then writes). The policy therefore describes what a
node under that configuration gets, including for fields the input leaves out.

When several ConfigMap keys have node strategies, a node takes the first match in each key's
list independently; the groups are then every combination, in order, with the selectors joined
(a node matching none of one key's strategies falls through to that key's cluster strategy).

The field-by-field correspondence is in docs/koordinator-parity.md and docs/operating.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import yaml

from .extended_resources import quantity_value
from .koordinator_slo import (
    CLASS_KEYS,
    CONFIG_KEYS,
    DEFAULTS,
    NONE_VALUES,
    SCHEMAS,
    SUPPRESS_FIELDS,
    SLOInputError,
    check_strategy,
    leaf_paths,
    leaves,
    merged,
    parse_config_key,
)
from .policy import Specs, builtin_defaults, loads_policy

__all__ = [
    "MAX_GROUPS",
    "UNDECIDED",
    "Conversion",
    "Finding",
    "Group",
    "SLOInputError",
    "check_policies",
    "convert",
    "dump_yaml",
    "read_document",
]

Status = Literal["mapped", "unsupported", "inactive"]

#: The reason given for a field no rule here covers (none should reach it: tests check).
UNDECIDED: Final = "not modelled here"
#: More combinations of node strategies than this is refused: the values would be unreadable.
MAX_GROUPS: Final = 256
#: What the Helm chart's values.schema.json takes (deploy/helm/runtimeproxy): groups, name length,
#: and per nodeSelector the matchLabels and matchExpressions (at least one requirement).
CHART_MAX_GROUPS: Final = 4
CHART_NAME_LENGTH: Final = 20
CHART_MAX_LABELS: Final = 2
CHART_MAX_EXPRESSIONS: Final = 2
_CHART_RESERVED: Final = "default"  # the chart's DaemonSet of nodes no group matches


@dataclass(frozen=True)
class Finding:
    """What became of one field of the input (``path``: its full dotted path)."""

    path: str
    status: Status
    detail: str

    def line(self) -> str:
        if self.status == "mapped":
            return f"{self.path}: mapped: {self.detail}"
        if self.status == "unsupported":
            return f"{self.path}: not supported ({self.detail})"
        return f"{self.path}: not supported, not in effect ({self.detail})"


@dataclass(frozen=True)
class Group:
    """One entry of the chart's ``groups``: a DNS-label name, a LabelSelector, a whole policy."""

    name: str
    node_selector: dict[str, Any]
    policy: dict[str, Any]
    sources: tuple[str, ...] = ()  # the node strategies it stands for, by input path

    def values(self) -> dict[str, Any]:
        return {"name": self.name, "nodeSelector": self.node_selector, "policy": self.policy}


@dataclass
class Conversion:
    kind: str  # "ConfigMap" or "NodeSLO"
    policy: dict[str, Any]
    groups: list[Group]
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)

    def values(self) -> dict[str, Any]:
        """The Helm chart values ``policy`` and ``groups``."""
        return {"policy": self.policy, "groups": [group.values() for group in self.groups]}

    def unsupported(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.status == "unsupported"]


# --- one strategy's mapping ------------------------------------------------------------------


@dataclass
class _Mapped:
    """A strategy's policy fragment and, per field path inside the strategy, what became of it."""

    policy: dict[str, Any] = field(default_factory=dict)
    status: dict[str, tuple[Status, str]] = field(default_factory=dict)

    def put(self, section: str, entries: Iterable[str], key: str, value: Any) -> str:
        """Set ``section.<entry>.key`` for each entry; the assignment as text."""
        names = list(entries)
        for name in names:
            self.policy.setdefault(section, {}).setdefault(name, {})[key] = value
        return f"{section}.{'/'.join(names)}.{key} = {_shown(value)}"

    def mark(self, path: str, status: Status, detail: str) -> None:
        self.status[path] = (status, detail)


def _shown(value: object) -> str:
    """A policy value as the policy file writes it (``true``, ``[0, 30]``)."""
    return json.dumps(value)


_ENTRIES: Final[Mapping[str, tuple[str, ...]]] = {
    "lsrClass": ("LSE", "LSR"),  # koordlet gives LSE pods the LSR values
    "lsClass": ("LS",),
    "beClass": ("BE",),
    "systemClass": ("SYSTEM",),
}
#: Classes whose features koordlet replaces by the "none" values when ``enable`` is false.
_SWITCHED: Final = ("lsrClass", "lsClass", "beClass")
_MEMORY_KEYS: Final = {
    "minLimitPercent": "min_percent",
    "lowLimitPercent": "low_percent",
    "throttlingPercent": "throttling_percent",
    "wmarkRatio": "wmark_ratio",
    "wmarkScalePermill": "wmark_scale_permill",
    "wmarkMinAdj": "wmark_min_adj",
}
_MEMORY_KERNEL_DEFAULTS: Final = ("priorityEnable", "priority", "oomKillGroup")
_PAGE_CACHE: Final = ("pageCacheEnable", "pageCacheLimitPercent", "pageCacheLimitSize", "pageCacheReclaimSync")


@dataclass(frozen=True)
class _Options:
    #: The installed cpu plugin has ``group_identity_enabled`` (Koordinator's CPUQOS enable).
    group_identity_switch: bool


def _enabled(qos: Mapping[str, Any], class_key: str, feature: str) -> tuple[bool, str]:
    """Whether koordlet applies the class's feature values, and why not."""
    if class_key not in _SWITCHED:
        return True, ""
    if qos.get(feature, {}).get("enable") is True:
        return True, ""
    return False, f"{class_key}.{feature}.enable is false"


def _values(qos: Mapping[str, Any], class_key: str, feature: str) -> tuple[Mapping[str, Any], bool, str]:
    """The feature's values as koordlet uses them (the none values when disabled), and whether enabled."""
    on, why = _enabled(qos, class_key, feature)
    given = qos.get(feature, {})
    return (given if on else {**given, **NONE_VALUES.get(feature, {})}), on, why


def _map_enable(out: _Mapped, path: str, class_key: str, on: bool, why: str, assigned: list[str]) -> None:
    if class_key in _SWITCHED:
        what = "the feature's values" if on else "Koordinator's values for a disabled feature"
        out.mark(path, "mapped", f"{what}: {'; '.join(assigned)}" if assigned else what)
    else:
        out.mark(path, "inactive", "koordlet does not switch systemClass features by enable; values mapped as given")


def _map_cpu_qos(out: _Mapped, qos: Mapping[str, Any], class_key: str, cpu_policy: str, options: _Options) -> None:
    entries = _ENTRIES[class_key]
    base = f"{class_key}.cpuQOS"
    values, on, why = _values(qos, class_key, "cpuQOS")
    assigned: list[str] = []
    identity_on = on and cpu_policy == "groupIdentity"
    not_identity = "" if cpu_policy == "groupIdentity" else f"policies.cpuPolicy is {cpu_policy}"
    off = why or not_identity
    if options.group_identity_switch:
        assigned.append(out.put("cpu", entries, "group_identity_enabled", identity_on))
        given = qos.get("cpuQOS", {}).get("groupIdentity", 0)
        text = out.put("cpu", entries, "group_identity", given)
        out.mark(f"{base}.groupIdentity", "mapped", text + (f" (switched off: {off})" if off else ""))
    else:
        text = out.put("cpu", entries, "group_identity", values["groupIdentity"] if identity_on else 0)
        out.mark(f"{base}.groupIdentity", "mapped", text + (f" ({off})" if off else ""))
    assigned.append(text)
    idle_on = on and cpu_policy == "coreSched"
    idle = out.put("cpu", entries, "cpu_idle", bool(values["schedIdle"]) if idle_on else False)
    idle_off = why or ("" if idle_on else "schedIdle takes effect only with policies.cpuPolicy coreSched")
    out.mark(f"{base}.schedIdle", "mapped", idle + (f" ({idle_off})" if idle_off else " (pod level)"))
    expeller = "core scheduling is not done: the kernel needs CONFIG_SCHED_CORE"
    if idle_on and values.get("coreExpeller"):
        out.mark(f"{base}.coreExpeller", "unsupported", expeller)
    else:
        out.mark(f"{base}.coreExpeller", "inactive", f"{expeller}; {why or 'off here'}")
    _map_enable(out, f"{base}.enable", class_key, on, why, [*assigned, idle])


def _map_resctrl(out: _Mapped, qos: Mapping[str, Any], class_key: str, where: str) -> None:
    entries = _ENTRIES[class_key]
    base = f"{class_key}.resctrlQOS"
    values, on, why = _values(qos, class_key, "resctrlQOS")
    start, end = values["catRangeStartPercent"], values["catRangeEndPercent"]
    if start >= end:
        raise SLOInputError(
            f"{where}.{base}", f"catRangeStartPercent ({start}) must be below catRangeEndPercent ({end})"
        )
    note = f" ({why})" if why else ""
    text = out.put("resctrl", entries, "l3_percent_range", [start, end])
    out.mark(f"{base}.catRangeStartPercent", "mapped", text + note)
    out.mark(f"{base}.catRangeEndPercent", "mapped", text + note)
    assigned = [text]
    if values["mbaPercent"] >= 1:
        assigned.append(out.put("resctrl", entries, "mb_percent", values["mbaPercent"]))
        out.mark(f"{base}.mbaPercent", "mapped", assigned[-1] + note)
    else:
        out.mark(
            f"{base}.mbaPercent",
            "unsupported",
            "0 would stop the class's memory traffic; the minimum here is 1, so resctrl.mb_percent keeps its default",
        )
    _map_enable(out, f"{base}.enable", class_key, on, why, assigned)


def _map_memory(out: _Mapped, qos: Mapping[str, Any], class_key: str) -> None:
    entries = _ENTRIES[class_key]
    base = f"{class_key}.memoryQOS"
    values, on, why = _values(qos, class_key, "memoryQOS")
    note = f" ({why})" if why else ""
    assigned: list[str] = []
    for koord, ours in _MEMORY_KEYS.items():
        if koord == "lowLimitPercent" and 0 < values[koord] < values["minLimitPercent"]:
            out.mark(
                f"{base}.{koord}",
                "unsupported",
                f"{values[koord]} is below minLimitPercent "
                f"({values['minLimitPercent']}); memory.low must not be below memory.min here, so "
                "memory.low_percent keeps its default",
            )
            continue
        assigned.append(out.put("memory", entries, ours, values[koord]))
        out.mark(f"{base}.{koord}", "mapped", assigned[-1] + note)
    for koord in _MEMORY_KERNEL_DEFAULTS:
        reason = "Anolis OS memcg OOM priority / oom.group files are not written by runtime-hooks"
        if on and values.get(koord):
            out.mark(f"{base}.{koord}", "unsupported", reason)
        else:
            out.mark(f"{base}.{koord}", "inactive", f"{reason}; {why or '0 is the kernel default'}")
    page_cache_on = on and bool(
        values.get("pageCacheEnable") or values.get("pageCacheLimitPercent") or values.get("pageCacheLimitSize")
    )
    for koord in _PAGE_CACHE:
        reason = "the Anolis OS memcg page cache limit is not done"
        if page_cache_on:
            out.mark(f"{base}.{koord}", "unsupported", reason)
        else:
            out.mark(f"{base}.{koord}", "inactive", f"{reason}; {why or 'no page cache limit set'}")
    _map_enable(out, f"{base}.enable", class_key, on, why, assigned)


def _map_blkio(out: _Mapped, qos: Mapping[str, Any], class_key: str) -> None:
    base = f"{class_key}.blkioQOS"
    blkio = qos.get("blkioQOS", {})
    reason = "blkio QoS (throttling, io weight, blk-iocost) is not done"
    if blkio.get("enable") is True and blkio.get("blocks"):
        out.mark(base, "unsupported", reason)
    else:
        out.mark(base, "inactive", f"{reason}; {'no blocks' if blkio.get('enable') else 'enable is false'}")


def _percent(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _map_network(out: _Mapped, strategy: Mapping[str, Any], net_policy: str, where: str) -> None:
    """Koordinator's tc hook: LS and BE classes get egressRequest / egressLimit (percent of the link),
    SYSTEM the rest, when the class's networkQOS is enabled; ingress is shaped by neither."""
    defaults = builtin_defaults("network")
    rates: dict[str, int] = {band: defaults[band]["rate_percent"] for band in ("LS", "BE")}
    mapped_any = False
    for class_key in CLASS_KEYS:
        base = f"{class_key}.networkQOS"
        network = strategy.get(class_key, {}).get("networkQOS", {})
        on = network.get("enable") is True
        if net_policy != "tc":
            status: Status = "unsupported" if on else "inactive"
            for key in ("enable", "egressRequest", "egressLimit", "ingressRequest", "ingressLimit"):
                out.mark(f"{base}.{key}", status, "terway-qos is not done" + ("" if on else "; enable is false"))
            continue
        for direction in ("ingressRequest", "ingressLimit"):
            out.mark(f"{base}.{direction}", "inactive", "ingress is not shaped (nor by Koordinator's tc)")
        if class_key not in ("lsClass", "beClass") or not on:
            why = (
                "Koordinator's tc reads lsClass and beClass only"
                if on or class_key not in ("lsClass", "beClass")
                else "enable is false; the band keeps its default"
            )
            for key in ("enable", "egressRequest", "egressLimit"):
                out.mark(f"{base}.{key}", "inactive", why)
            continue
        band = _ENTRIES[class_key][0]
        request, limit = _percent(network.get("egressRequest")), _percent(network.get("egressLimit"))
        if request is None or limit is None or not 1 <= request <= limit <= 100:
            reason = (
                "an absolute bandwidth; network bands take percentages of the link"
                if request is None or limit is None
                else f"request {network.get('egressRequest')} / limit "
                f"{network.get('egressLimit')} %: a band needs 1 <= rate <= ceil <= 100"
            )
            for key in ("enable", "egressRequest", "egressLimit"):
                out.mark(f"{base}.{key}", "unsupported", f"{reason}; network.{band} keeps its default")
            continue
        rates[band] = request
        mapped_any = True
        out.mark(f"{base}.egressRequest", "mapped", out.put("network", [band], "rate_percent", request))
        out.mark(f"{base}.egressLimit", "mapped", out.put("network", [band], "ceil_percent", limit))
        out.mark(f"{base}.enable", "mapped", f"network.{band} from egressRequest and egressLimit")
    if mapped_any:
        system = 100 - rates["LS"] - rates["BE"]
        if system < 1:
            raise SLOInputError(
                f"{where}.lsClass/beClass.networkQOS.egressRequest",
                f"LS and BE egress requests add up to {100 - system} %: the SYSTEM band would get nothing",
            )
        out.put("network", ["SYSTEM"], "rate_percent", system)


def _map_resource_qos(strategy: Mapping[str, Any], where: str, options: _Options) -> _Mapped:
    out = _Mapped()
    policies = strategy.get("policies", {})
    cpu_policy, net_policy = policies.get("cpuPolicy", "groupIdentity"), policies.get("netQOSPolicy", "tc")
    if cpu_policy == "groupIdentity":
        out.mark("policies.cpuPolicy", "mapped", "group identity: cpu.<class>.group_identity")
    else:
        out.mark(
            "policies.cpuPolicy",
            "unsupported",
            "core scheduling cookies are not done (the kernel needs "
            "CONFIG_SCHED_CORE); group identity is off and schedIdle maps to cpu.<class>.cpu_idle, as koordlet does",
        )
    if net_policy == "tc":
        out.mark(
            "policies.netQOSPolicy",
            "mapped",
            "the network plugin (tc); set network.interface, which Koordinator's config does not carry",
        )
    else:
        out.mark("policies.netQOSPolicy", "unsupported", "terway-qos is not done; the network plugin shapes with tc")
    for class_key in CLASS_KEYS:
        qos = strategy.get(class_key, {})
        _map_cpu_qos(out, qos, class_key, cpu_policy, options)
        _map_resctrl(out, qos, class_key, where)
        _map_memory(out, qos, class_key)
        _map_blkio(out, qos, class_key)
    _map_blkio(out, strategy.get("cgroupRoot", {}), "cgroupRoot")
    for feature in ("cpuQOS", "memoryQOS", "resctrlQOS", "networkQOS"):
        out.mark(f"cgroupRoot.{feature}", "inactive", "koordlet reads only blkioQOS for the cgroup root")
    _map_network(out, strategy, net_policy, where)
    return out


_BURSTABLE: Final = ("LS", "SYSTEM")  # koordlet's util.IsPodCPUBurstable: not LSE, LSR, BE
_QUOTA_BURST: Final = ("cfsQuotaBurstPercent", "cfsQuotaBurstPeriodSeconds", "sharePoolThresholdPercent")


def _map_cpu_burst(strategy: Mapping[str, Any], where: str, options: _Options) -> _Mapped:
    out = _Mapped()
    policy = strategy["policy"]
    burst_on = policy in ("cpuBurstOnly", "auto")
    percent = strategy["cpuBurstPercent"] if burst_on else 0
    text = out.put("cpu", _BURSTABLE, "cfs_burst_percent", percent)
    never = out.put("cpu", ("LSE", "LSR", "BE"), "cfs_burst_percent", 0)
    quota_on = policy in ("cfsQuotaBurstOnly", "auto")
    quota_reason = "CFS quota burst is not done: it needs throttling and usage history (docs/koordinator-parity.md)"
    if quota_on:
        out.mark("policy", "unsupported", f"{quota_reason}; the CPU burst part: {text}; {never}")
    else:
        out.mark("policy", "mapped", f"{text}; {never}")
    out.mark("cpuBurstPercent", "mapped", text + ("" if burst_on else f" (not in effect with policy {policy})"))
    for key in _QUOTA_BURST:
        out.mark(
            key, "unsupported" if quota_on else "inactive", quota_reason + ("" if quota_on else f"; policy {policy}")
        )
    return out


_SYSCTL_REASON: Final = "a node-wide kernel setting; runtime-hooks writes no sysctls"


def _map_system(strategy: Mapping[str, Any], where: str, options: _Options) -> _Mapped:
    out = _Mapped()
    speed = quantity_value(strategy.get("totalNetworkBandwidth", "0"))
    if speed < 0:
        raise SLOInputError(f"{where}.totalNetworkBandwidth", f"must not be negative, got {speed}")
    text = _put_section(out, "network", "link_speed_mbit", speed)
    out.mark("totalNetworkBandwidth", "mapped", text + (" (0: read the interface's speed)" if speed == 0 else ""))
    for key in SCHEMAS["systemStrategy"]:
        if key == "totalNetworkBandwidth":
            continue
        given = strategy.get(key)
        out.mark(key, "unsupported" if given not in (None, {}) else "inactive", _SYSCTL_REASON)
    return out


def _put_section(out: _Mapped, section: str, key: str, value: Any) -> str:
    out.policy.setdefault(section, {})[key] = value
    return f"{section}.{key} = {_shown(value)}"


def _map_threshold(strategy: Mapping[str, Any], where: str, options: _Options) -> _Mapped:
    out = _Mapped()
    suppress_on = strategy.get("enable") is True
    suppress = "CPU suppress needs node usage metrics, which runtime-hooks does not collect"
    if suppress_on and strategy.get("cpuSuppressPolicy") == "cfsQuota":
        suppress += "; koordlet also lifts BE pods' batch CFS quota under this policy, runtime-hooks keeps it"
    evict = (
        "eviction needs node usage metrics and the API server; in effect where koordlet's eviction feature gates are on"
    )
    for key in SCHEMAS["resourceUsedThresholdWithBE"]:
        if key in SUPPRESS_FIELDS:
            out.mark(
                key,
                "unsupported" if suppress_on else "inactive",
                suppress + ("" if suppress_on else "; enable is false"),
            )
        else:
            out.mark(key, "unsupported", evict)
    return out


_Mapper = Callable[[Mapping[str, Any], str, _Options], _Mapped]
_MAPPERS: Final[Mapping[str, _Mapper]] = {
    "resourceQOSStrategy": _map_resource_qos,
    "cpuBurstStrategy": _map_cpu_burst,
    "systemStrategy": _map_system,
    "resourceUsedThresholdWithBE": _map_threshold,
}


# --- findings -----------------------------------------------------------------------------


def _parent(path: str) -> str | None:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else None


def _status_of(status: Mapping[str, tuple[Status, str]], rel: str, value: object) -> tuple[Status, str]:
    """The status of ``rel`` or of its nearest ancestor that has one."""
    path: str | None = rel
    while path is not None:
        if path in status:
            return status[path]
        path = _parent(path)
    if value in ({}, []):
        return "inactive", "empty: Koordinator's defaults apply"
    return "unsupported", UNDECIDED


def _findings(given: Mapping[str, Any], prefix: str, mapped: _Mapped, unknown: Iterable[str]) -> list[Finding]:
    status = dict(mapped.status)
    unknown_reason: tuple[Status, str] = ("unsupported", "not a field Koordinator reads here (ignored there; a typo?)")
    status.update((rel, unknown_reason) for rel in unknown)
    found = [(rel, value) for rel, value in leaves(given) if rel] + [(rel, None) for rel in unknown]
    if not found:  # an empty strategy
        return [Finding(prefix, "inactive", "empty: Koordinator's defaults apply")]
    return [Finding(f"{prefix}.{rel}", *_status_of(status, rel, value)) for rel, value in found]


def _deep_merge(*fragments: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fragment in fragments:
        out = merged(out, fragment)
    return out


# --- label selectors and groups --------------------------------------------------------------

_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")
# Kubernetes' label syntax: an optional DNS subdomain prefix and "/", then a name of at most 63
# characters; a value is such a name or empty.
_LABEL_NAME: Final = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY: Final = re.compile(
    rf"(?:(?=.{{1,253}}/)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}"
)
_LABEL_VALUE: Final = re.compile(f"(?:{_LABEL_NAME})?")


def _label(key: object, value: object, where: str) -> None:
    if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
        raise SLOInputError(where, f"not a valid label key: {key!r}")
    if value is not None and (not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value)):
        raise SLOInputError(where, f"not a valid label value: {value!r}")


def _selector(raw: object, where: str) -> dict[str, Any]:
    """A LabelSelector, checked, as the chart takes it (empty parts left out)."""
    if not isinstance(raw, dict):
        raise SLOInputError(where, f"must be a LabelSelector object, got {type(raw).__name__}")
    extra = set(raw) - {"matchLabels", "matchExpressions"}
    if extra:
        raise SLOInputError(where, f"unknown LabelSelector field(s): {', '.join(sorted(map(str, extra)))}")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise SLOInputError(f"{where}.matchLabels", "must map label keys to string values")
    for key, value in labels.items():
        _label(key, value, f"{where}.matchLabels")
    expressions = raw.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise SLOInputError(f"{where}.matchExpressions", "must be a list")
    checked = [_expression(item, f"{where}.matchExpressions[{i}]") for i, item in enumerate(expressions)]
    out: dict[str, Any] = {}
    if labels:
        out["matchLabels"] = dict(labels)
    if checked:
        out["matchExpressions"] = checked
    return out


def _expression(item: object, where: str) -> dict[str, Any]:
    if not isinstance(item, dict) or set(item) - {"key", "operator", "values"}:
        raise SLOInputError(where, "must be an object with key, operator and values")
    key, operator, values = item.get("key"), item.get("operator"), item.get("values") or []
    if not isinstance(key, str) or not key:
        raise SLOInputError(f"{where}.key", "must be a label key")
    if operator not in _OPERATORS:
        raise SLOInputError(f"{where}.operator", f"must be one of {', '.join(_OPERATORS)}, got {operator!r}")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise SLOInputError(f"{where}.values", "must be a list of strings")
    _label(key, None, f"{where}.key")
    for value in values:
        _label(key, value, f"{where}.values")
    if (operator in ("In", "NotIn")) != bool(values):
        raise SLOInputError(f"{where}.values", f"operator {operator} needs {'values' if values == [] else 'no values'}")
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def _joined(selectors: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The selector matching what all of ``selectors`` match; None when none can match."""
    labels: dict[str, str] = {}
    expressions: list[dict[str, Any]] = []
    for selector in selectors:
        for key, value in selector.get("matchLabels", {}).items():
            if labels.setdefault(key, value) != value:
                return None
        expressions += [e for e in selector.get("matchExpressions", []) if e not in expressions]
    out: dict[str, Any] = {}
    if labels:
        out["matchLabels"] = labels
    if expressions:
        out["matchExpressions"] = expressions
    return out


_DNS_LABEL_BAD: Final = re.compile(r"[^a-z0-9-]+")


def _dns_label(text: str, fallback: str, taken: set[str]) -> str:
    """A DNS label of at most CHART_NAME_LENGTH characters made of ``text``, not in ``taken``."""
    base = _DNS_LABEL_BAD.sub("-", text.lower()).strip("-")[:CHART_NAME_LENGTH].strip("-") or fallback
    name, n = base, 1
    while name in taken:
        n += 1
        suffix = f"-{n}"
        name = base[: CHART_NAME_LENGTH - len(suffix)].rstrip("-") + suffix
    taken.add(name)
    return name


@dataclass(frozen=True)
class _NodeStrategy:
    where: str  # its input path
    name: str
    selector: dict[str, Any]
    fragment: dict[str, Any]


def _groups(dimensions: list[list[_NodeStrategy]], cluster: list[dict[str, Any]], notes: list[str]) -> list[Group]:
    """Every combination of one node strategy (or none) per key, in order; see the module doc."""
    options: list[list[_NodeStrategy | None]] = [[*strategies, None] for strategies in dimensions]
    total = 1
    for choices in options:
        total *= len(choices)
    if total - 1 > MAX_GROUPS:
        raise SLOInputError(
            "nodeStrategies",
            f"{total - 1} combinations of node strategies across the keys; at most "
            f"{MAX_GROUPS} groups are made (give the keys the same node selectors)",
        )
    groups: list[Group] = []
    seen: list[dict[str, Any]] = []
    taken = {_CHART_RESERVED}
    for combination in itertools.product(*options):
        chosen = [strategy for strategy in combination if strategy is not None]
        if not chosen:
            continue
        same = all(strategy.selector == chosen[0].selector for strategy in chosen)
        label = chosen[0].name if same else "-".join(strategy.name for strategy in chosen)
        selector = _joined(strategy.selector for strategy in chosen)
        if selector is None:
            notes.append(f"no group for {label}: its node selectors contradict each other")
            continue
        if selector in seen:
            continue  # an earlier group has the same selector: no node would reach this one
        seen.append(selector)
        fragments = [
            strategy.fragment if strategy else base for strategy, base in zip(combination, cluster, strict=True)
        ]
        name = _dns_label(label, f"group-{len(groups) + 1}", taken)
        groups.append(Group(name, selector, _deep_merge(*fragments), tuple(s.where for s in chosen)))
    return groups


def _chart_problem(group: Group, kept: int) -> str:
    """Why the chart cannot take ``group`` after ``kept`` others ("" if it can)."""
    if kept >= CHART_MAX_GROUPS:
        return f"the chart takes at most {CHART_MAX_GROUPS} groups"
    labels = len(group.node_selector.get("matchLabels", {}))
    expressions = len(group.node_selector.get("matchExpressions", []))
    if labels > CHART_MAX_LABELS or expressions > CHART_MAX_EXPRESSIONS or not labels + expressions:
        return (
            f"the chart takes a nodeSelector of 1 to {CHART_MAX_LABELS} matchLabels and {CHART_MAX_EXPRESSIONS} "
            f"matchExpressions; group {group.name} has {labels} and {expressions}"
        )
    return ""


def _fit_chart(groups: list[Group], findings: list[Finding]) -> list[Group]:
    """The groups the chart takes, in order; a node strategy behind one it cannot take has its
    nodeSelector reported unsupported (its nodes fall through to a later group or the default)."""
    kept: list[Group] = []
    dropped: dict[str, str] = {}
    for group in groups:
        problem = _chart_problem(group, len(kept))
        if problem:
            dropped.update((f"{where}.nodeSelector", problem) for where in group.sources)
        else:
            kept.append(group)
    findings[:] = [f for f in findings if f.path not in dropped]
    fall = "; no group made: its nodes take the next group that matches them, or the default policy"
    findings += [Finding(path, "unsupported", problem + fall) for path, problem in dropped.items()]
    return kept


# --- the inputs ---------------------------------------------------------------------------

_OTHER_KEYS: Final[Mapping[str, tuple[Status, str]]] = {
    "colocation-config": (
        "inactive",
        "koord-manager's batch resource calculation; runtime-hooks reads its result, the pods' batch resources",
    ),
    "resource-amplification-config": ("inactive", "koord-manager's node allocatable amplification"),
    "cpu-normalization-config": ("unsupported", "CPU normalization is not done (docs/koordinator-parity.md)"),
    "host-application-config": ("unsupported", "QoS for host applications is not done"),
}
_PROFILE: Final = ("name", "nodeSelector")


def _from_config_map(document: Mapping[str, Any], options: _Options) -> Conversion:
    data = document.get("data") or {}
    if not isinstance(data, dict):
        raise SLOInputError("data", "must be a mapping of keys to JSON strings")
    findings: list[Finding] = []
    notes: list[str] = []
    name = (document.get("metadata") or {}).get("name") if isinstance(document.get("metadata"), dict) else None
    if name != "slo-controller-config":
        notes.append(f"the ConfigMap is named {name!r}; Koordinator reads slo-controller-config")
    for key in data:
        if key not in CONFIG_KEYS:
            status, reason = _OTHER_KEYS.get(key, ("unsupported", "not a key Koordinator's slo-controller reads"))
            findings.append(Finding(str(key), status, reason))
    cluster_fragments: list[dict[str, Any]] = []
    dimensions: list[list[_NodeStrategy]] = []
    for key, spec_field in CONFIG_KEYS.items():
        cluster, strategies = _config_key(key, spec_field, data, findings, notes, options)
        cluster_fragments.append(cluster)
        dimensions.append(strategies)
    groups = _fit_chart(_groups(dimensions, cluster_fragments, notes), findings)
    return Conversion("ConfigMap", _deep_merge(*cluster_fragments), groups, findings, notes)


def _config_key(
    key: str, spec_field: str, data: Mapping[str, Any], findings: list[Finding], notes: list[str], options: _Options
) -> tuple[dict[str, Any], list[_NodeStrategy]]:
    """One data key: its cluster strategy's policy fragment and its node strategies (findings added)."""
    mapper, schema = _MAPPERS[spec_field], SCHEMAS[spec_field]
    if key not in data:
        notes.append(f"{key}: not in the ConfigMap; Koordinator's defaults apply")
        return mapper(DEFAULTS[spec_field], key, options).policy, []
    raw = parse_config_key(key, data[key])
    unknown = [f"{key}.{k}" for k in raw if k not in ("clusterStrategy", "nodeStrategies")]
    findings += [Finding(path, "unsupported", "not a field Koordinator reads here") for path in unknown]
    cluster_given, cluster_unknown = _checked(schema, raw.get("clusterStrategy"), f"{key}.clusterStrategy")
    cluster = merged(DEFAULTS[spec_field], cluster_given)
    cluster_mapped = mapper(cluster, f"{key}.clusterStrategy", options)
    if raw.get("clusterStrategy") is not None:
        findings += _findings(cluster_given, f"{key}.clusterStrategy", cluster_mapped, cluster_unknown)
    nodes = raw.get("nodeStrategies") or []
    if not isinstance(nodes, list):
        raise SLOInputError(f"{key}.nodeStrategies", "must be a list")
    if "nodeStrategies" in raw and not nodes:
        findings.append(Finding(f"{key}.nodeStrategies", "inactive", "empty: no groups"))
    strategies = []
    for index, node in enumerate(nodes):
        where = f"{key}.nodeStrategies[{index}]"
        if not isinstance(node, dict):
            raise SLOInputError(where, f"must be an object, got {type(node).__name__}")
        fields = {k: v for k, v in node.items() if k not in _PROFILE}
        given, node_unknown = _checked(schema, fields, where)
        node_mapped = mapper(merged(cluster, given), where, options)
        strategy_name = node.get("name")
        if strategy_name is not None and not isinstance(strategy_name, str):
            raise SLOInputError(f"{where}.name", "must be a string")
        if node.get("nodeSelector") is None:
            reason = "the strategy has no nodeSelector, which matches no node in Koordinator; no group is made"
            findings += [
                Finding(f"{where}.{rel}", "inactive", reason) for rel in (*leaf_paths(given), *node_unknown) if rel
            ]
            continue
        selector = _selector(node["nodeSelector"], f"{where}.nodeSelector")
        if given or node_unknown:
            findings += _findings(given, where, node_mapped, node_unknown)
        findings.append(Finding(f"{where}.nodeSelector", "mapped", "the group's nodeSelector"))
        if strategy_name is not None:
            findings.append(Finding(f"{where}.name", "mapped", "the group's name"))
        if spec_field != "resourceUsedThresholdWithBE":  # maps to nothing: no group needed
            strategies.append(
                _NodeStrategy(
                    where, strategy_name or f"{key.removesuffix('-config')}-{index}", selector, node_mapped.policy
                )
            )
    return cluster_mapped.policy, strategies


def _checked(schema: Mapping[str, Any], raw: object, where: str) -> tuple[dict[str, Any], list[str]]:
    if raw is None:
        return {}, []
    unknown: list[str] = []
    try:
        return check_strategy(schema, raw, "", unknown), unknown
    except SLOInputError as exc:
        raise SLOInputError(f"{where}.{exc.path}" if exc.path else where, exc.reason) from None


def _from_node_slo(document: Mapping[str, Any], options: _Options) -> Conversion:
    spec = document.get("spec") or {}
    if not isinstance(spec, dict):
        raise SLOInputError("spec", "must be an object")
    findings: list[Finding] = []
    fragments: list[dict[str, Any]] = []
    for key, value in spec.items():
        if key in ("extensions", "hostApplications"):
            empty = value in (None, {}, [], {"Object": {}})
            findings.append(
                Finding(
                    f"spec.{key}",
                    "inactive" if empty else "unsupported",
                    "third-party NodeSLO extensions are not read"
                    if key == "extensions"
                    else "QoS for host applications is not done",
                )
            )
        elif key not in SCHEMAS:
            findings.append(Finding(f"spec.{key}", "unsupported", "not a NodeSLO spec field Koordinator reads"))
    for spec_field, schema in SCHEMAS.items():
        given, unknown = _checked(schema, spec.get(spec_field), f"spec.{spec_field}")
        mapped = _MAPPERS[spec_field](merged(DEFAULTS[spec_field], given), f"spec.{spec_field}", options)
        if spec.get(spec_field) is not None:
            findings += _findings(given, f"spec.{spec_field}", mapped, unknown)
        fragments.append(mapped.policy)
    return Conversion("NodeSLO", _deep_merge(*fragments), [], findings)


def convert(document: object, specs: Specs | None = None) -> Conversion:
    """``document`` (a ConfigMap or NodeSLO, as parsed YAML/JSON) as a policy, groups and findings.

    ``specs``: the installed plugins' settings; the cpu plugin's ``group_identity_enabled``
    receives Koordinator's CPUQOS ``enable`` where it has that key."""
    if not isinstance(document, dict):
        raise SLOInputError("", f"expected a Kubernetes object (a mapping), got {type(document).__name__}")
    cpu = (specs or {}).get("cpu")
    switch = (
        cpu is not None
        and cpu.settings is not None
        and any(f.name == "group_identity_enabled" for f in dataclasses.fields(cpu.settings))
    )
    options = _Options(group_identity_switch=switch)
    kind = document.get("kind")
    if kind == "ConfigMap":
        return _from_config_map(document, options)
    if kind == "NodeSLO":
        return _from_node_slo(document, options)
    raise SLOInputError("kind", f"expected ConfigMap (slo-controller-config) or NodeSLO, got {kind!r}")


class _Dumper(yaml.SafeDumper):
    """Block style down to mappings of scalars, which are written on one line, as the default
    policy file writes a class's settings; no aliases for repeated values."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _is_flat(value: object) -> bool:
    if isinstance(value, dict):
        return all(not isinstance(item, dict) and _is_flat(item) for item in value.values())
    if isinstance(value, list):
        return all(not isinstance(item, dict | list) for item in value)
    return True


def _represent_dict(dumper: _Dumper, data: dict[Any, Any]) -> yaml.MappingNode:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=bool(data) and _is_flat(data))


def _represent_list(dumper: _Dumper, data: list[Any]) -> yaml.SequenceNode:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=bool(data) and _is_flat(data))


_Dumper.add_representer(dict, _represent_dict)
_Dumper.add_representer(list, _represent_list)


def dump_yaml(data: Any) -> str:
    """``data`` as YAML for people: block style, a class's settings on one line."""
    text: str = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=120)
    return text


def check_policies(conversion: Conversion, specs: Specs) -> None:
    """Every policy document of ``conversion`` read as ``runtime-hooks policy check`` reads a file;
    PolicyError (file naming the document: ``policy`` or ``groups[i].policy``) if one is refused."""
    loads_policy(dump_yaml(conversion.policy), "policy", specs=specs)
    for index, group in enumerate(conversion.groups):
        loads_policy(dump_yaml(group.policy), f"groups[{index}].policy", specs=specs)


def read_document(path: str) -> object:
    """The YAML or JSON document at ``path`` (``-``: stdin); SLOInputError if unreadable."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as file:
                text = file.read()
    except OSError as exc:
        raise SLOInputError("", f"cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SLOInputError("", f"not UTF-8 text (byte {exc.start})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SLOInputError("", f"not valid YAML or JSON: {exc}") from None
    except RecursionError:
        raise SLOInputError("", "not valid YAML or JSON: nested too deeply") from None
