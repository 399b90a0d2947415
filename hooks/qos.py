"""QoS class resolution: which of Koordinator's five classes a pod (and its containers) belongs to.

The runtime-hooks plugins apply their policy per class. The classes are Koordinator's
(``apis/extension/qos.go``): ``LSE`` (latency sensitive, exclusive cores), ``LSR``
(latency sensitive, reserved cores), ``LS`` (latency sensitive, shared cores), ``BE``
(best effort, runs on reclaimed resources) and ``SYSTEM`` (node system services).

``resolve_qos`` tries these sources in order; the first one that gives a class wins. K is
the label ``koordinator.sh/qosClass``, Q the annotation ``katalyst.kubewharf.io/qos_level``,
M the annotation ``katalyst.kubewharf.io/memory_enhancement`` (a JSON object).

====  ========================  ========================================================  ======
step  source                    when                                                      class
====  ========================  ========================================================  ======
1     koordinator-label         K is LSE, LSR, LS, BE or SYSTEM (exact, as Koordinator)   K
2     katalyst-annotation       Q is dedicated_cores and M has "numa_exclusive": "true"   LSE
                                Q is dedicated_cores otherwise                            LSR
                                Q is shared_cores                                         LS
                                Q is reclaimed_cores                                      BE
                                Q is system_cores                                         SYSTEM
3     kubernetes-cgroup-parent  kubepods, then besteffort                                 BE
                                kubepods, then burstable                                  LS
                                kubepods, then pod<uid> (Guaranteed)                      LSR
4     kubernetes-resources      cpu_shares <= 2, cpu_quota <= 0, memory limit <= 0        BE
                                otherwise                                                 LS
5     default                   nothing above applied                                     LS
====  ========================  ========================================================  ======

Any other value of K or Q is ignored, with a note in ``detail``, and the next step runs; so
does step 3 without a ``kubepods`` segment, and step 4 when the resources are absent or set
none of the three fields.

Step 3 finds the ``kubepods`` segment anywhere in the path, so a prefix such as kubelet's
``--cgroup-root`` (``/rtpx-1234/kubepods/burstable/pod…``) does not matter, and reads both
cgroup drivers: cgroupfs (``/kubepods/besteffort/pod…``) and systemd, where the slice name
carries the whole chain (``kubepods-besteffort-pod….slice``, also with a prefix as in
``rtpx_1234-kubepods-burstable-pod….slice``). The deepest segment that decides wins.
Guaranteed maps to ``LSR`` and Burstable to ``LS`` because Koordinator does the same for
a pod without a class label (``GetPodQoSClassWithKubeQoS``, ``QoSClassForGuaranteed =
QoSLSR`` in ``apis/extension/qos_utils.go``).

Step 4 is a guess from what kubelet writes: a BestEffort container gets the minimum 2 cpu
shares and no limits. A Burstable container with a tiny cpu request and no limits looks the
same and is taken for ``BE``; Guaranteed and Burstable cannot be told apart, so anything
that is not BestEffort is ``LS``. Step 4 only runs when nothing better is known.

Resolution is total: any labels, annotations and cgroup parent give a result, never an
exception. ``QoSResolution.detail`` says which rule decided and what was ignored on the way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final, Literal, Protocol

from runtimeproxy.hookapi.value_bounds import Resources as ResourcesMessage  # either API's resources message

__all__ = [
    "KATALYST_MEMORY_ENHANCEMENT_ANNOTATION",
    "KATALYST_QOS_LEVELS",
    "KATALYST_QOS_LEVEL_ANNOTATION",
    "KOORDINATOR_QOS_LABEL",
    "KUBERNETES_QOS_CLASSES",
    "KubernetesQoS",
    "QoSClass",
    "QoSResolution",
    "RequestedResources",
    "ResourcesMessage",
    "Source",
    "kubernetes_qos_from_cgroup_parent",
    "resolve_qos",
]


class QoSClass(StrEnum):
    """Koordinator's QoS classes; the values are the label values, in descending priority of latency."""

    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"
    SYSTEM = "SYSTEM"


Source = Literal[
    "koordinator-label", "katalyst-annotation", "kubernetes-cgroup-parent", "kubernetes-resources", "default"
]
KubernetesQoS = Literal["Guaranteed", "Burstable", "BestEffort"]

# koordinator-sh/koordinator apis/extension/constants.go: LabelPodQoS = DomainPrefix + "qosClass".
KOORDINATOR_QOS_LABEL: Final = "koordinator.sh/qosClass"
# kubewharf/katalyst-api pkg/consts/qos.go: PodAnnotationQoSLevelKey, PodAnnotationMemoryEnhancementKey.
KATALYST_QOS_LEVEL_ANNOTATION: Final = "katalyst.kubewharf.io/qos_level"
KATALYST_MEMORY_ENHANCEMENT_ANNOTATION: Final = "katalyst.kubewharf.io/memory_enhancement"
# The memory_enhancement key (a JSON object of string values) that makes a dedicated_cores pod LSE.
KATALYST_NUMA_EXCLUSIVE: Final = "numa_exclusive"

KATALYST_QOS_LEVELS: Final[Mapping[str, QoSClass]] = MappingProxyType(
    {
        "dedicated_cores": QoSClass.LSR,  # LSE when numa_exclusive, see resolve_qos
        "shared_cores": QoSClass.LS,
        "reclaimed_cores": QoSClass.BE,
        "system_cores": QoSClass.SYSTEM,
    }
)

# Kubernetes QoS -> class, as Koordinator maps a pod without a class label.
KUBERNETES_QOS_CLASSES: Final[Mapping[KubernetesQoS, QoSClass]] = MappingProxyType(
    {"Guaranteed": QoSClass.LSR, "Burstable": QoSClass.LS, "BestEffort": QoSClass.BE}
)

DEFAULT_CLASS: Final = QoSClass.LS
_CLASS_VALUES: Final = frozenset(QoSClass)
_MIN_SHARES: Final = 2  # kubelet's MinShares: what a BestEffort container gets
_SHOWN_CHARS: Final = 64


class RequestedResources(Protocol):
    """What step 4 reads: either API's resources message (ResourcesMessage) or the plugin SDK's
    Resources (hooks/views.py), which the runner passes as it is rather than as a new message."""

    @property
    def cpu_shares(self) -> int: ...

    @property
    def cpu_quota(self) -> int: ...

    @property
    def memory_limit_in_bytes(self) -> int: ...


@dataclass(frozen=True)
class QoSResolution:
    """The resolved class, the source that decided it, and a human-readable why."""

    qos_class: QoSClass
    source: Source
    detail: str


def resolve_qos(
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    cgroup_parent: str = "",
    resources: RequestedResources | None = None,
) -> QoSResolution:
    """The QoS class of a pod from its labels, annotations, cgroup parent and resources (see the module doc)."""
    notes: list[str] = []

    value = labels.get(KOORDINATOR_QOS_LABEL)
    if value is not None:
        if value in _CLASS_VALUES:
            return _result(QoSClass(value), "koordinator-label", f"label {KOORDINATOR_QOS_LABEL}={value}", notes)
        notes.append(f"ignored label {KOORDINATOR_QOS_LABEL}={_show(value)} (not one of {', '.join(QoSClass)})")

    level = annotations.get(KATALYST_QOS_LEVEL_ANNOTATION)
    if level is not None:
        qos = KATALYST_QOS_LEVELS.get(level)
        if qos is not None:
            why = f"annotation {KATALYST_QOS_LEVEL_ANNOTATION}={level}"
            if qos is QoSClass.LSR:
                exclusive, note = _numa_exclusive(annotations)
                if note:
                    notes.append(note)
                if exclusive:
                    qos = QoSClass.LSE
                    why += f" with {KATALYST_NUMA_EXCLUSIVE}=true in {KATALYST_MEMORY_ENHANCEMENT_ANNOTATION}"
            return _result(qos, "katalyst-annotation", why, notes)
        levels = ", ".join(KATALYST_QOS_LEVELS)
        notes.append(f"ignored annotation {KATALYST_QOS_LEVEL_ANNOTATION}={_show(level)} (not one of {levels})")

    kube_qos = kubernetes_qos_from_cgroup_parent(cgroup_parent)
    if kube_qos is not None:
        why = f"cgroup parent {_show(cgroup_parent)}: Kubernetes {kube_qos}"
        return _result(KUBERNETES_QOS_CLASSES[kube_qos], "kubernetes-cgroup-parent", why, notes)
    if cgroup_parent:
        notes.append(f"cgroup parent {_show(cgroup_parent)} has no kubepods QoS segment")

    if resources is not None:
        shares, quota, memory = resources.cpu_shares, resources.cpu_quota, resources.memory_limit_in_bytes
        if shares == 0 and quota == 0 and memory == 0:
            notes.append("resources set no cpu shares, cpu quota or memory limit")
        else:
            values = f"cpu_shares={shares}, cpu_quota={quota}, memory_limit_in_bytes={memory}"
            if shares <= _MIN_SHARES and quota <= 0 and memory <= 0:
                return _result(QoSClass.BE, "kubernetes-resources", f"resources {values}: Kubernetes BestEffort", notes)
            return _result(QoSClass.LS, "kubernetes-resources", f"resources {values}: not BestEffort", notes)

    return _result(DEFAULT_CLASS, "default", "no QoS label, annotation, kubepods cgroup parent or resources", notes)


def kubernetes_qos_from_cgroup_parent(cgroup_parent: str) -> KubernetesQoS | None:
    """The Kubernetes QoS class kubelet encoded in a pod's cgroup parent, or None.

    cgroupfs: the segment after ``kubepods`` is ``besteffort``, ``burstable`` or
    ``pod<uid>`` (Guaranteed). systemd: a slice name's ``-`` separated parts after
    ``kubepods`` say the same (``kubepods-burstable-pod<uid>.slice``). Segments are read
    from the deepest up; the first that decides wins.
    """
    segments = [segment for segment in cgroup_parent.split("/") if segment]
    for index in range(len(segments) - 1, -1, -1):
        segment = segments[index]
        if segment.endswith(".slice"):
            parts = segment[: -len(".slice")].split("-")
            if "kubepods" not in parts:
                continue
            after = len(parts) - parts[::-1].index("kubepods")
            following = parts[after] if after < len(parts) else None
        elif segment == "kubepods":
            following = segments[index + 1] if index + 1 < len(segments) else None
        else:
            continue
        if following is not None:
            kube_qos = _kube_qos_segment(following)
            if kube_qos is not None:
                return kube_qos
    return None


def _kube_qos_segment(segment: str) -> KubernetesQoS | None:
    if segment == "besteffort":
        return "BestEffort"
    if segment == "burstable":
        return "Burstable"
    if segment.startswith("pod") and len(segment) > len("pod"):
        return "Guaranteed"
    return None


def _numa_exclusive(annotations: Mapping[str, str]) -> tuple[bool, str | None]:
    """Whether Katalyst's memory_enhancement annotation asks for an exclusive NUMA node; and a note if unreadable."""
    raw = annotations.get(KATALYST_MEMORY_ENHANCEMENT_ANNOTATION)
    if raw is None:
        return False, None
    try:
        enhancement = json.loads(raw)
    except (ValueError, TypeError, RecursionError):
        enhancement = None
    if not isinstance(enhancement, dict):
        return False, f"ignored annotation {KATALYST_MEMORY_ENHANCEMENT_ANNOTATION}={_show(raw)} (not a JSON object)"
    # Katalyst reads the object as map[string]string: only the string "true" enables it.
    return enhancement.get(KATALYST_NUMA_EXCLUSIVE) == "true", None


def _result(qos: QoSClass, source: Source, why: str, notes: list[str]) -> QoSResolution:
    return QoSResolution(qos, source, f"{why} ({'; '.join(notes)})" if notes else why)


def _show(value: str) -> str:
    """A value for a detail message: quoted, and cut short if long."""
    value = str(value)  # a str subclass (an enum member) shows as its text
    if len(value) > _SHOWN_CHARS:
        return repr(value[:_SHOWN_CHARS]) + "…"
    return repr(value)
