"""A pod's group identity (``cpu.bvt_warp_ns``) as koordlet's ``groupidentity`` hook chooses it.

koordlet (``pkg/koordlet/runtimehooks/hooks/groupidentity``) picks a pod's value this way, and
so does :func:`pod_group_identity`:

1. **By class**, for a pod labelled ``koordinator.sh/qosClass`` LSE, LSR, LS or BE: the
   class's value (LSE takes LSR's), or 0 when the class's group identity is switched off
   (``group_identity_enabled: false``; Koordinator's CPUQOS ``enable: false``).
2. **By Kubernetes QoS**, for a pod without a class label (its QoS read from the cgroup
   parent): BestEffort takes BE's value, Burstable LS's, and Guaranteed LSR's when LSR's is
   switched on, else LS's when LS's is, else 0.
3. **The pod's own override**, for a pod *labelled* LS only: the annotation
   ``koordinator.sh/cpuQOS`` (``apis/slo/v1alpha1/pod.go``, a JSON object read into
   Koordinator's ``CPUQOSCfg``): its ``groupIdentity`` replaces the class's value, and unless
   its ``enable`` is ``true`` the pod gets 0. So ``{"enable": true, "groupIdentity": -1}``
   runs an LS pod as BE does, ``{}`` or ``{"enable": false}`` turns group identity off for it,
   and ``{"enable": true}`` keeps LS's value.

The annotation is decoded by Go's ``encoding/json`` rules (:mod:`..annotation_json`): field
names match case-insensitively, a field given twice keeps the last, ``null`` (for the whole
annotation or a field) leaves it unset, unknown fields are ignored; ``groupIdentity`` and
``schedIdle`` must be integers (no fraction or exponent) within int64, ``enable`` and
``coreExpeller`` booleans, and ``groupIdentity`` within -1..2. Where koordlet's decoding fails,
its hook returns the error and leaves the cgroup as it is; here the annotation is ignored
with the reason (logged by the plugin) and the pod gets its class's value.

**The QoS tiers** (:func:`tier_group_identity`): kubelet's ``burstable`` cgroup takes LS's
value and ``besteffort`` BE's (0 where the class's is off), as koordlet keeps them.

The annotation is honoured only while ``trust.pod_cpu_qos`` is true (hooks/podview.py withholds it
otherwise; docs/security.md). This module is pure: values and reasons, no I/O, no logging.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

from .. import annotation_json
from ..annotation_json import GoObject, json_kind, struct_fields
from ..cgroups import KubeTier
from ..podview import CPU_QOS_ANNOTATION
from ..qos import QoSClass, QoSResolution, kubernetes_qos_from_cgroup_parent

__all__ = [
    "CPU_QOS_ANNOTATION",
    "GROUP_IDENTITY_OFF",
    "CpuQoSOverride",
    "GroupIdentityChoice",
    "GroupIdentitySettings",
    "class_group_identity",
    "pod_group_identity",
    "read_cpu_qos",
    "tier_group_identity",
]

#: The value of a pod whose group identity is off (Koordinator's NoneCPUQOS).
GROUP_IDENTITY_OFF: Final = 0
_INT64: Final = range(-(1 << 63), 1 << 63)
_FIELDS: Final = ("enable", "groupIdentity", "schedIdle", "coreExpeller")
_T = TypeVar("_T")


class GroupIdentitySettings(Protocol):
    """What is read of a class's cpu settings."""

    @property
    def group_identity(self) -> int: ...

    @property
    def group_identity_enabled(self) -> bool: ...


@dataclass(frozen=True)
class CpuQoSOverride:
    """The annotation as decoded: ``enable`` and ``group_identity`` (None: not given)."""

    enable: bool | None
    group_identity: int | None

    def apply(self, class_value: int) -> int:
        """The pod's value given its class's (see the module doc, step 3)."""
        if self.enable is not True:
            return GROUP_IDENTITY_OFF
        return class_value if self.group_identity is None else self.group_identity


def read_cpu_qos(annotations: Mapping[str, str]) -> tuple[CpuQoSOverride | None, str]:
    """The pod's ``koordinator.sh/cpuQOS``: ``(override, "")``, ``(None, "")`` without the
    annotation, ``(None, reason)`` when it does not decode as koordlet decodes it."""
    text = annotations.get(CPU_QOS_ANNOTATION)
    if text is None:
        return None, ""
    try:
        return _decode(text), ""
    except ValueError as exc:
        return None, f"annotation {CPU_QOS_ANNOTATION} ignored: {exc}"


def _decode(text: str) -> CpuQoSOverride:
    try:
        raw = annotation_json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    except RecursionError:
        raise ValueError("not JSON (nested too deeply)") from None
    if raw is None:
        return CpuQoSOverride(None, None)
    if not isinstance(raw, GoObject):
        raise ValueError(f"must be a JSON object, got {json_kind(raw)}")
    fields = struct_fields(raw, _FIELDS)
    enable = _last(fields["enable"], "enable", _boolean)
    group_identity = _last(fields["groupIdentity"], "groupIdentity", _int64)
    _last(fields["schedIdle"], "schedIdle", _int64)  # decoded only for its errors, as Go does
    _last(fields["coreExpeller"], "coreExpeller", _boolean)
    if group_identity is not None and group_identity not in range(-1, 3):
        raise ValueError(f"groupIdentity {group_identity} is out of range [-1, 2]")
    return CpuQoSOverride(enable, group_identity)


def _last(values: list[object], name: str, parse: Callable[[object, str], _T]) -> _T | None:
    """A pointer field given ``values`` in order: each one decoded, the last kept, null unsets it."""
    result: _T | None = None
    for value in values:
        result = None if value is None else parse(value, name)
    return result


def _boolean(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a boolean, got {json_kind(value)}")
    return value


def _int64(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        shown = value if json_kind(value) == "a number" else json_kind(value)
        raise ValueError(f"{name} must be an integer, got {shown}")
    if value not in _INT64:
        raise ValueError(f"{name} {value} is out of the int64 range")
    return value


@dataclass(frozen=True)
class GroupIdentityChoice:
    """A pod's group identity, the notes saying why, and why its annotation was refused ("" if not)."""

    value: int
    notes: tuple[str, ...] = ()
    problem: str = ""


def pod_group_identity(
    resolution: QoSResolution,
    cgroup_parent: str,
    annotations: Mapping[str, str],
    settings_for: Callable[[QoSClass], GroupIdentitySettings],
) -> GroupIdentityChoice:
    """The pod's group identity (see the module doc)."""
    notes: list[str] = []
    value = _class_value(resolution, cgroup_parent, settings_for, notes)
    problem = ""
    if resolution.source == "koordinator-label" and resolution.qos_class is QoSClass.LS:
        override, problem = read_cpu_qos(annotations)
        if problem:
            notes.append(problem)
        elif override is not None:
            value = override.apply(value)
            notes.append(f"annotation {CPU_QOS_ANNOTATION}: group identity {value}")
    return GroupIdentityChoice(value, tuple(notes), problem)


def _class_value(
    resolution: QoSResolution,
    cgroup_parent: str,
    settings_for: Callable[[QoSClass], GroupIdentitySettings],
    notes: list[str],
) -> int:
    qos = resolution.qos_class
    if (
        resolution.source == "kubernetes-cgroup-parent"
        and kubernetes_qos_from_cgroup_parent(cgroup_parent) == "Guaranteed"
    ):
        for candidate in (QoSClass.LSR, QoSClass.LS):
            settings = settings_for(candidate)
            if settings.group_identity_enabled:
                notes.append(f"Guaranteed without a class label: {candidate.value}'s group identity")
                return settings.group_identity
        notes.append("Guaranteed without a class label, LSR's and LS's group identity off: 0")
        return GROUP_IDENTITY_OFF
    settings = settings_for(qos)
    if not settings.group_identity_enabled:
        notes.append(f"{qos.value}: group identity off: 0")
    return class_group_identity(settings)


def class_group_identity(settings: GroupIdentitySettings) -> int:
    """A class's value: its ``group_identity``, or 0 when its ``group_identity_enabled`` is false."""
    return settings.group_identity if settings.group_identity_enabled else GROUP_IDENTITY_OFF


#: Whose value each QoS-tier cgroup takes (koordlet: burstable from LS, besteffort from BE).
_TIER_CLASS: Final[dict[KubeTier, QoSClass]] = {"burstable": QoSClass.LS, "besteffort": QoSClass.BE}


def tier_group_identity(tier: KubeTier, settings_for: Callable[[QoSClass], GroupIdentitySettings]) -> int:
    """The group identity of kubelet's ``tier`` cgroup: LS's for burstable, BE's for besteffort,
    0 where that class's is off. (koordlet also writes 0 into the pod root, the Guaranteed
    tier; the root is not written here, and 0 is what a new cgroup has.)"""
    return class_group_identity(settings_for(_TIER_CLASS[tier]))
