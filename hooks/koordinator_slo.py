"""Koordinator's node SLO configuration, read as koord-manager and koordlet read it.

Two inputs carry it: the ``slo-controller-config`` ConfigMap, whose data keys each hold a JSON
document (``resource-qos-config``, ``cpu-burst-config``, ``system-config``,
``resource-threshold-config``: a ``clusterStrategy`` and ``nodeStrategies``, each of those with a
``name``, a ``nodeSelector`` and the cluster strategy's fields), and the NodeSLO object koord-manager
writes per node (``spec.resourceQOSStrategy``, ``spec.cpuBurstStrategy``, ...).

This module knows the fields of each strategy (``SCHEMAS``: types and the ranges Koordinator's
validation accepts, from ``apis/slo/v1alpha1/nodeslo_types.go``), Koordinator's defaults
(``pkg/util/sloconfig/nodeslo_config.go``) and how layers are merged (a node strategy over the
cluster strategy over the defaults: objects merged key by key, lists replaced, ``null`` meaning
unset, as Go's JSON decoding into the merged struct does). Values of the wrong type or outside
Koordinator's ranges raise ``SLOInputError`` naming the field; unknown fields are collected, not
refused (Koordinator ignores them).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .extended_resources import quantity_value

__all__ = [
    "CONFIG_KEYS",
    "DEFAULTS",
    "NONE_VALUES",
    "SCHEMAS",
    "Opaque",
    "SLOInputError",
    "Scalar",
    "check_strategy",
    "leaf_paths",
    "leaves",
    "merged",
    "parse_config_key",
]


class SLOInputError(ValueError):
    """Input that Koordinator would refuse: where (a dotted path) and why."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path else reason)


@dataclass(frozen=True)
class Scalar:
    """A leaf: ``kind`` int, bool, enum, quantity or intorstr; ``low``/``high`` bound ints, ``choices`` enums."""

    kind: str
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Opaque:
    """A field read as a whole (a list of blocks, a map): any JSON value."""


def _int(low: int | None = None, high: int | None = None) -> Scalar:
    return Scalar("int", low, high)


_BOOL: Final = Scalar("bool")
_PERCENT: Final = _int(0, 100)
_OPAQUE: Final = Opaque()

Schema = Mapping[str, Any]  # field name -> Scalar | Opaque | Schema

_CPU_QOS: Final[Schema] = {
    "enable": _BOOL,
    "groupIdentity": _int(-1, 2),
    "schedIdle": _int(0, 1),
    "coreExpeller": _BOOL,
}
_MEMORY_QOS: Final[Schema] = {
    "enable": _BOOL,
    "minLimitPercent": _PERCENT,
    "lowLimitPercent": _PERCENT,
    "throttlingPercent": _PERCENT,
    "wmarkRatio": _PERCENT,
    "wmarkScalePermill": _int(1, 1000),
    "wmarkMinAdj": _int(-25, 50),
    "priorityEnable": _int(0, 1),
    "priority": _int(0, 12),
    "oomKillGroup": _int(0, 1),
    "pageCacheEnable": _BOOL,
    "pageCacheLimitPercent": _PERCENT,
    "pageCacheLimitSize": _int(),
    "pageCacheReclaimSync": _BOOL,
}
_RESCTRL_QOS: Final[Schema] = {
    "enable": _BOOL,
    "catRangeStartPercent": _PERCENT,
    "catRangeEndPercent": _PERCENT,
    "mbaPercent": _PERCENT,
}
_NETWORK_QOS: Final[Schema] = {
    "enable": _BOOL,
    "ingressRequest": Scalar("intorstr"),
    "ingressLimit": Scalar("intorstr"),
    "egressRequest": Scalar("intorstr"),
    "egressLimit": Scalar("intorstr"),
}
_RESOURCE_QOS: Final[Schema] = {
    "cpuQOS": _CPU_QOS,
    "memoryQOS": _MEMORY_QOS,
    "blkioQOS": {"enable": _BOOL, "blocks": _OPAQUE},
    "resctrlQOS": _RESCTRL_QOS,
    "networkQOS": _NETWORK_QOS,
}
#: Koordinator's class keys in a ResourceQOSStrategy.
CLASS_KEYS: Final = ("lsrClass", "lsClass", "beClass", "systemClass")

_RESOURCE_QOS_STRATEGY: Final[Schema] = {
    "policies": {
        "cpuPolicy": Scalar("enum", choices=("groupIdentity", "coreSched")),
        "netQOSPolicy": Scalar("enum", choices=("tc", "terway-qos")),
    },
    **{key: _RESOURCE_QOS for key in CLASS_KEYS},
    "cgroupRoot": _RESOURCE_QOS,
}
_CPU_BURST_STRATEGY: Final[Schema] = {
    "policy": Scalar("enum", choices=("none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto")),
    "cpuBurstPercent": _int(1, 10000),
    "cfsQuotaBurstPercent": _int(100),
    "cfsQuotaBurstPeriodSeconds": _int(-1),
    "sharePoolThresholdPercent": _PERCENT,
}
_SYSTEM_STRATEGY: Final[Schema] = {
    "minFreeKbytesFactor": _int(1),
    "watermarkScaleFactor": _int(1, 400),
    "memcgReapBackGround": _int(0, 1),
    "schedGroupIdentityEnabled": _int(),
    "schedIdleSaverWmark": _int(),
    "schedFeatures": _OPAQUE,
    "pageCacheLimitEnabled": _int(0, 1),
    "totalNetworkBandwidth": Scalar("quantity"),
}
#: ResourceThresholdStrategy: the CPU suppress fields, then the eviction ones.
SUPPRESS_FIELDS: Final = ("enable", "cpuSuppressThresholdPercent", "cpuSuppressMinPercent", "cpuSuppressPolicy")
_THRESHOLD_STRATEGY: Final[Schema] = {
    "enable": _BOOL,
    "cpuSuppressThresholdPercent": _PERCENT,
    "cpuSuppressMinPercent": _PERCENT,
    "cpuSuppressPolicy": Scalar("enum", choices=("cpuset", "cfsQuota")),
    "memoryEvictThresholdPercent": _PERCENT,
    "memoryEvictLowerPercent": _PERCENT,
    "memoryAllocatableEvictThresholdPercent": _int(0),
    "memoryAllocatableEvictLowerPercent": _int(0),
    "cpuEvictBESatisfactionUpperPercent": _PERCENT,
    "cpuEvictBESatisfactionLowerPercent": _PERCENT,
    "cpuEvictBEUsageThresholdPercent": _PERCENT,
    "cpuEvictTimeWindowSeconds": _int(1),
    "cpuEvictThresholdPercent": _PERCENT,
    "cpuEvictLowerPercent": _PERCENT,
    "cpuAllocatableEvictThresholdPercent": _int(0),
    "cpuAllocatableEvictLowerPercent": _int(0),
    "cpuEvictPolicy": Scalar("enum", choices=("evictByRealLimit", "evictByAllocatable")),
    "evictEnabledPriorityThreshold": _int(),
    "allocatableEvictPriorityThreshold": _int(0, 7999),
}

#: Each strategy's fields, by its NodeSLO spec field.
SCHEMAS: Final[Mapping[str, Schema]] = {
    "resourceQOSStrategy": _RESOURCE_QOS_STRATEGY,
    "cpuBurstStrategy": _CPU_BURST_STRATEGY,
    "systemStrategy": _SYSTEM_STRATEGY,
    "resourceUsedThresholdWithBE": _THRESHOLD_STRATEGY,
}
#: ConfigMap data key -> the NodeSLO spec field its strategies fill.
CONFIG_KEYS: Final[Mapping[str, str]] = {
    "resource-qos-config": "resourceQOSStrategy",
    "cpu-burst-config": "cpuBurstStrategy",
    "system-config": "systemStrategy",
    "resource-threshold-config": "resourceUsedThresholdWithBE",
}

# --- Koordinator's defaults (DefaultNodeSLOSpecConfig) and its "none" values -----------------


def _class_defaults(group_identity: int, expeller: bool, wmark: tuple[int, int, int], cat_end: int) -> dict[str, Any]:
    ratio, permill, adj = wmark
    return {
        "cpuQOS": {
            "enable": False,
            "groupIdentity": group_identity,
            "schedIdle": 0,
            "coreExpeller": expeller,
        },
        "resctrlQOS": {"enable": False, "catRangeStartPercent": 0, "catRangeEndPercent": cat_end, "mbaPercent": 100},
        "memoryQOS": {
            "enable": False,
            "minLimitPercent": 0,
            "lowLimitPercent": 0,
            "throttlingPercent": 0,
            "wmarkRatio": ratio,
            "wmarkScalePermill": permill,
            "wmarkMinAdj": adj,
            "priorityEnable": 0,
            "priority": 0,
            "oomKillGroup": 0,
        },
        "blkioQOS": {"enable": False},
        "networkQOS": {"enable": False, "ingressRequest": 0, "ingressLimit": 0, "egressRequest": 0, "egressLimit": 0},
    }


DEFAULTS: Final[Mapping[str, Mapping[str, Any]]] = {
    "resourceQOSStrategy": {
        "policies": {"cpuPolicy": "groupIdentity", "netQOSPolicy": "tc"},
        "lsrClass": _class_defaults(2, True, (95, 20, -25), 100),
        "lsClass": _class_defaults(2, True, (95, 20, -25), 100),
        "beClass": _class_defaults(-1, False, (95, 20, 50), 30),
        "systemClass": _class_defaults(0, False, (0, 50, 0), 100),
        "cgroupRoot": {"blkioQOS": {"enable": False}},
    },
    "cpuBurstStrategy": {
        "policy": "none",
        "cpuBurstPercent": 1000,
        "cfsQuotaBurstPercent": 300,
        "cfsQuotaBurstPeriodSeconds": -1,
        "sharePoolThresholdPercent": 50,
    },
    "systemStrategy": {"totalNetworkBandwidth": "0"},
    "resourceUsedThresholdWithBE": {
        "enable": False,
        "cpuSuppressThresholdPercent": 65,
        "cpuSuppressPolicy": "cpuset",
        "memoryEvictThresholdPercent": 70,
        "cpuEvictPolicy": "evictByRealLimit",
    },
}
#: What koordlet uses for an LSR, LS or BE feature whose ``enable`` is false
#: (statesinformer ``mergeNoneResourceQOSIfDisabled``; NoneCPUQOS, NoneResctrlQOS, NoneMemoryQOS).
NONE_VALUES: Final[Mapping[str, Mapping[str, Any]]] = {
    "cpuQOS": {"groupIdentity": 0, "schedIdle": 0, "coreExpeller": False},
    "resctrlQOS": {"catRangeStartPercent": 0, "catRangeEndPercent": 100, "mbaPercent": 100},
    "memoryQOS": {
        "minLimitPercent": 0,
        "lowLimitPercent": 0,
        "throttlingPercent": 0,
        "wmarkRatio": 0,
        "wmarkScalePermill": 50,
        "wmarkMinAdj": 0,
        "priorityEnable": 0,
        "priority": 0,
        "oomKillGroup": 0,
    },
}

# --- checking ---------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_scalar(spec: Scalar, value: object, path: str) -> None:
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise SLOInputError(path, f"must be true or false, got {value!r}")
    elif spec.kind == "int":
        if not _is_int(value):
            raise SLOInputError(path, f"must be an integer, got {value!r}")
        if (spec.low is not None and value < spec.low) or (spec.high is not None and value > spec.high):  # type: ignore[operator]
            bounds = f"{spec.low if spec.low is not None else '-inf'}..{spec.high if spec.high is not None else 'inf'}"
            raise SLOInputError(path, f"must be within {bounds}, got {value}")
    elif spec.kind == "enum":
        if value not in spec.choices:
            raise SLOInputError(path, f"must be one of {', '.join(spec.choices)}, got {value!r}")
    elif spec.kind == "quantity":
        try:
            quantity_value(value)
        except ValueError as exc:
            raise SLOInputError(path, str(exc)) from None
    elif spec.kind == "intorstr" and not (_is_int(value) or isinstance(value, str)):
        raise SLOInputError(path, f"must be an integer (percent) or a quantity string, got {value!r}")


def check_strategy(schema: Schema, data: object, path: str, unknown: list[str]) -> dict[str, Any]:
    """``data`` checked against ``schema``, with ``null`` fields dropped; unknown fields are kept
    out of the result and their paths added to ``unknown``. SLOInputError on a wrong value."""
    if not isinstance(data, dict):
        raise SLOInputError(path, f"must be an object, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        spec = schema.get(key) if isinstance(key, str) else None
        if spec is None:
            unknown.append(where)
        elif value is None:
            continue
        elif isinstance(spec, Scalar):
            _check_scalar(spec, value, where)
            out[key] = value
        elif isinstance(spec, Opaque):
            out[key] = copy.deepcopy(value)
        else:
            out[key] = check_strategy(spec, value, where, unknown)
    return out


def merged(base: Mapping[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    """``layer`` over ``base``: objects merged key by key, anything else replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in layer.items():
        old = out.get(key)
        out[key] = merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else copy.deepcopy(value)
    return out


def leaves(data: object, path: str = "") -> Iterator[tuple[str, object]]:
    """The dotted paths of ``data``'s leaves (list items as ``[i]``; an empty object or list is a
    leaf), with their values."""
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list) and data:
        for index, value in enumerate(data):
            yield from leaves(value, f"{path}[{index}]")
    else:
        yield path, data


def leaf_paths(data: object, path: str = "") -> Iterator[str]:
    """The paths of ``leaves``."""
    return (where for where, _value in leaves(data, path))


def parse_config_key(key: str, text: object) -> dict[str, Any]:
    """One ConfigMap data value: a JSON object (Koordinator decodes it with encoding/json)."""
    if not isinstance(text, str):
        raise SLOInputError(key, f"a ConfigMap data value must be a string, got {type(text).__name__}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SLOInputError(key, f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise SLOInputError(key, "not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise SLOInputError(key, f"must hold a JSON object, got {type(data).__name__}")
    return data
