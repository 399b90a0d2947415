"""QoS class resolution for the runtime-hooks plugins (runtimeproxy.hooks.qos)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.qos import (
    KATALYST_MEMORY_ENHANCEMENT_ANNOTATION,
    KATALYST_QOS_LEVEL_ANNOTATION,
    KOORDINATOR_QOS_LABEL,
    QoSClass,
    QoSResolution,
    Source,
    kubernetes_qos_from_cgroup_parent,
    resolve_qos,
)

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.kubelet_model import pod_plan
from runtimeproxy.kubelet_model.cri_resources import linux_resources
from runtimeproxy.kubelet_model.kube_qos import KubeQoSClass

KOORD = KOORDINATOR_QOS_LABEL
KATALYST = KATALYST_QOS_LEVEL_ANNOTATION
ENHANCEMENT = KATALYST_MEMORY_ENHANCEMENT_ANNOTATION
EXCLUSIVE = json.dumps({"numa_binding": "true", "numa_exclusive": "true"})


def test_the_classes_are_koordinators() -> None:
    # koordinator-sh/koordinator apis/extension/qos.go: QoSLSE.."SYSTEM", case as written there.
    assert [str(qos) for qos in QoSClass] == ["LSE", "LSR", "LS", "BE", "SYSTEM"]
    assert KOORD == "koordinator.sh/qosClass"
    # kubewharf/katalyst-api pkg/consts/qos.go
    assert KATALYST == "katalyst.kubewharf.io/qos_level"
    assert ENHANCEMENT == "katalyst.kubewharf.io/memory_enhancement"


# (labels, annotations, cgroup parent, expected class, expected source)
TABLE = [
    # 1. Koordinator's label, exact values only
    ({KOORD: "LSE"}, {}, "", QoSClass.LSE, "koordinator-label"),
    ({KOORD: "LSR"}, {}, "", QoSClass.LSR, "koordinator-label"),
    ({KOORD: "LS"}, {}, "", QoSClass.LS, "koordinator-label"),
    ({KOORD: "BE"}, {}, "", QoSClass.BE, "koordinator-label"),
    ({KOORD: "SYSTEM"}, {}, "", QoSClass.SYSTEM, "koordinator-label"),
    ({KOORD: "BE"}, {KATALYST: "dedicated_cores"}, "/kubepods/pod1", QoSClass.BE, "koordinator-label"),
    ({KOORD: "be"}, {}, "/kubepods/besteffort/pod1", QoSClass.BE, "kubernetes-cgroup-parent"),
    ({KOORD: "System"}, {KATALYST: "system_cores"}, "", QoSClass.SYSTEM, "katalyst-annotation"),
    ({KOORD: ""}, {}, "/kubepods/pod1", QoSClass.LSR, "kubernetes-cgroup-parent"),
    # 2. Katalyst's annotation
    ({}, {KATALYST: "dedicated_cores"}, "", QoSClass.LSR, "katalyst-annotation"),
    ({}, {KATALYST: "dedicated_cores", ENHANCEMENT: EXCLUSIVE}, "", QoSClass.LSE, "katalyst-annotation"),
    ({}, {KATALYST: "dedicated_cores", ENHANCEMENT: '{"numa_exclusive": "false"}'}, "", QoSClass.LSR,
     "katalyst-annotation"),
    ({}, {KATALYST: "dedicated_cores", ENHANCEMENT: '{"numa_binding": "true"}'}, "", QoSClass.LSR,
     "katalyst-annotation"),
    # Katalyst decodes the object as map[string]string: a JSON true is not "true".
    ({}, {KATALYST: "dedicated_cores", ENHANCEMENT: '{"numa_exclusive": true}'}, "", QoSClass.LSR,
     "katalyst-annotation"),
    ({}, {KATALYST: "dedicated_cores", ENHANCEMENT: "{not json"}, "", QoSClass.LSR, "katalyst-annotation"),
    ({}, {KATALYST: "shared_cores", ENHANCEMENT: EXCLUSIVE}, "", QoSClass.LS, "katalyst-annotation"),
    ({}, {KATALYST: "shared_cores"}, "/kubepods/besteffort/pod1", QoSClass.LS, "katalyst-annotation"),
    ({}, {KATALYST: "reclaimed_cores"}, "", QoSClass.BE, "katalyst-annotation"),
    ({}, {KATALYST: "system_cores"}, "", QoSClass.SYSTEM, "katalyst-annotation"),
    ({}, {KATALYST: "Shared_Cores"}, "/kubepods/burstable/pod1", QoSClass.LS, "kubernetes-cgroup-parent"),
    ({KATALYST: "reclaimed_cores"}, {}, "", QoSClass.LS, "default"),  # a label, not the annotation
    ({}, {KOORD: "BE"}, "", QoSClass.LS, "default"),  # an annotation, not the label
    # 3. the cgroup parent: cgroupfs
    ({}, {}, "/kubepods/besteffort/pod0b5a", QoSClass.BE, "kubernetes-cgroup-parent"),
    ({}, {}, "/kubepods/burstable/pod0b5a", QoSClass.LS, "kubernetes-cgroup-parent"),
    ({}, {}, "/kubepods/pod0b5a", QoSClass.LSR, "kubernetes-cgroup-parent"),
    ({}, {}, "/kubepods/burstable", QoSClass.LS, "kubernetes-cgroup-parent"),
    ({}, {}, "/rtpx-1234/kubepods/besteffort/pod0b5a", QoSClass.BE, "kubernetes-cgroup-parent"),
    ({}, {}, "rtpx-1234/kubepods/pod0b5a/ctr1", QoSClass.LSR, "kubernetes-cgroup-parent"),
    ({}, {}, "/kubepods/burstable/pod0b5a/kubepods", QoSClass.LS, "kubernetes-cgroup-parent"),
    # systemd
    ({}, {}, "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0b5a_11.slice", QoSClass.BE,
     "kubernetes-cgroup-parent"),
    ({}, {}, "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b5a_11.slice", QoSClass.LS,
     "kubernetes-cgroup-parent"),
    ({}, {}, "/kubepods.slice/kubepods-pod0b5a_11.slice", QoSClass.LSR, "kubernetes-cgroup-parent"),
    ({}, {}, "kubepods-besteffort-pod0b5a_11.slice", QoSClass.BE, "kubernetes-cgroup-parent"),
    ({}, {}, "kubepods-pod0b5a_11.slice", QoSClass.LSR, "kubernetes-cgroup-parent"),
    ({}, {}, "/rtpx_1234.slice/rtpx_1234-kubepods.slice/rtpx_1234-kubepods-burstable.slice/"
     "rtpx_1234-kubepods-burstable-pod0b5a.slice", QoSClass.LS, "kubernetes-cgroup-parent"),
    # no kubepods QoS segment
    ({}, {}, "/kubepods", QoSClass.LS, "default"),
    ({}, {}, "kubepods.slice", QoSClass.LS, "default"),
    ({}, {}, "/kubepods/pod", QoSClass.LS, "default"),
    ({}, {}, "/kubepods/guaranteed/pod1", QoSClass.LS, "default"),
    ({}, {}, "/kubepodsX/besteffort/pod1", QoSClass.LS, "default"),
    ({}, {}, "/kubepods-x/besteffort/pod1", QoSClass.LS, "default"),
    ({}, {}, "/system.slice/containerd.service", QoSClass.LS, "default"),
    ({}, {}, "/besteffort/pod1", QoSClass.LS, "default"),
    # 5. nothing at all
    ({}, {}, "", QoSClass.LS, "default"),
]


@pytest.mark.parametrize(("labels", "annotations", "parent", "qos", "source"), TABLE)
def test_resolution_table(
    labels: dict[str, str], annotations: dict[str, str], parent: str, qos: QoSClass, source: Source
) -> None:
    result = resolve_qos(labels, annotations, parent)
    assert (result.qos_class, result.source) == (qos, source), result.detail


def test_details_say_what_decided_and_what_was_ignored() -> None:
    result = resolve_qos({KOORD: "ls"}, {KATALYST: "turbo_cores"}, "/kubepods/burstable/pod1")
    assert result == QoSResolution(
        QoSClass.LS,
        "kubernetes-cgroup-parent",
        "cgroup parent '/kubepods/burstable/pod1': Kubernetes Burstable ("
        "ignored label koordinator.sh/qosClass='ls' (not one of LSE, LSR, LS, BE, SYSTEM); "
        "ignored annotation katalyst.kubewharf.io/qos_level='turbo_cores' "
        "(not one of dedicated_cores, shared_cores, reclaimed_cores, system_cores))",
    )
    assert resolve_qos({KOORD: "BE"}, {}).detail == "label koordinator.sh/qosClass=BE"
    exclusive = resolve_qos({}, {KATALYST: "dedicated_cores", ENHANCEMENT: EXCLUSIVE})
    assert "numa_exclusive=true" in exclusive.detail
    unreadable = resolve_qos({}, {KATALYST: "dedicated_cores", ENHANCEMENT: "[1]"})
    assert unreadable.qos_class is QoSClass.LSR
    assert "ignored annotation katalyst.kubewharf.io/memory_enhancement='[1]' (not a JSON object)" in unreadable.detail
    nothing = resolve_qos({}, {}, "/system.slice/x.service")
    assert nothing.detail.startswith("no QoS label")
    assert "has no kubepods QoS segment" in nothing.detail
    long = resolve_qos({KOORD: "x" * 1000}, {})
    assert len(long.detail) < 300


# --- the cgroup parents kubelet actually sends ------------------------------------------

KUBE_TO_CLASS = {
    KubeQoSClass.GUARANTEED: QoSClass.LSR,  # Koordinator: QoSClassForGuaranteed = QoSLSR
    KubeQoSClass.BURSTABLE: QoSClass.LS,
    KubeQoSClass.BEST_EFFORT: QoSClass.BE,
}


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
@pytest.mark.parametrize("root", ["/", "/rtpx-1234", "/a/b-c"])
@pytest.mark.parametrize("kube_qos", list(KubeQoSClass))
def test_parents_from_the_kubelet_emulation(
    kube_qos: KubeQoSClass, root: str, driver: pod_plan.CgroupDriver
) -> None:
    uid = "0b5a3c1e-8d2f-4b6a-9c7d-1e2f3a4b5c6d"
    parent = pod_plan.pod_cgroup_parent(kube_qos, uid, driver, root)
    assert kubernetes_qos_from_cgroup_parent(parent) == kube_qos.value
    result = resolve_qos({}, {}, parent)
    assert (result.qos_class, result.source) == (KUBE_TO_CLASS[kube_qos], "kubernetes-cgroup-parent")


@given(
    kube_qos=st.sampled_from(list(KubeQoSClass)),
    uid=st.uuids().map(str),
    driver=st.sampled_from(["cgroupfs", "systemd"]),
    root=st.lists(st.from_regex(r"[a-z0-9][a-z0-9_-]{0,8}", fullmatch=True), max_size=3).map(
        lambda parts: "/" + "/".join(parts)
    ),
)
def test_any_kubelet_parent_resolves_to_its_class(
    kube_qos: KubeQoSClass, uid: str, driver: pod_plan.CgroupDriver, root: str
) -> None:
    parent = pod_plan.pod_cgroup_parent(kube_qos, uid, driver, root)
    assert resolve_qos({}, {}, parent).qos_class is KUBE_TO_CLASS[kube_qos]


# --- resources --------------------------------------------------------------------------

GIB = 1 << 30


@pytest.mark.parametrize(
    ("resources", "qos", "source"),
    [
        (hook.LinuxContainerResources(cpu_period=100000, cpu_shares=2), QoSClass.BE, "kubernetes-resources"),
        (hook.LinuxContainerResources(cpu_shares=2, cpu_quota=-1), QoSClass.BE, "kubernetes-resources"),
        (hook.LinuxContainerResources(cpu_shares=2, memory_limit_in_bytes=GIB), QoSClass.LS, "kubernetes-resources"),
        (hook.LinuxContainerResources(cpu_shares=2, cpu_quota=50000), QoSClass.LS, "kubernetes-resources"),
        (hook.LinuxContainerResources(cpu_shares=1024), QoSClass.LS, "kubernetes-resources"),
        (hook.LinuxContainerResources(cpu_shares=1024, cpu_quota=100000, memory_limit_in_bytes=GIB), QoSClass.LS,
         "kubernetes-resources"),
        (cri.LinuxContainerResources(cpu_shares=2), QoSClass.BE, "kubernetes-resources"),
        (cri.LinuxContainerResources(cpu_shares=512), QoSClass.LS, "kubernetes-resources"),
        (hook.LinuxContainerResources(), QoSClass.LS, "default"),  # nothing set: nothing known
        (hook.LinuxContainerResources(cpuset_cpus="0-3", oom_score_adj=1000), QoSClass.LS, "default"),
        (None, QoSClass.LS, "default"),
    ],
)
def test_resources(resources: hook.LinuxContainerResources | None, qos: QoSClass, source: Source) -> None:
    result = resolve_qos({}, {}, "", resources)
    assert (result.qos_class, result.source) == (qos, source), result.detail


def test_resources_come_after_the_cgroup_parent() -> None:
    best_effort = hook.LinuxContainerResources(cpu_shares=2)
    assert resolve_qos({}, {}, "/kubepods/pod1", best_effort).qos_class is QoSClass.LSR
    assert resolve_qos({KOORD: "LS"}, {}, "", best_effort).qos_class is QoSClass.LS
    assert resolve_qos({}, {}, "/elsewhere", best_effort).source == "kubernetes-resources"


@pytest.mark.parametrize(
    ("cpu_request", "cpu_limit", "memory_limit", "qos"),
    [
        (None, None, None, QoSClass.BE),  # BestEffort
        (Decimal("0.5"), None, None, QoSClass.LS),  # Burstable, cpu request only
        (None, None, Decimal(GIB), QoSClass.LS),  # Burstable, memory limit only
        (Decimal(1), Decimal(1), Decimal(GIB), QoSClass.LS),  # Guaranteed: not told apart from Burstable
    ],
)
def test_resources_as_kubelet_computes_them(
    cpu_request: Decimal | None, cpu_limit: Decimal | None, memory_limit: Decimal | None, qos: QoSClass
) -> None:
    resources = linux_resources(cpu_request, cpu_limit, memory_limit).to_proto()
    assert resolve_qos({}, {}, "", resources).qos_class is qos


# --- totality ---------------------------------------------------------------------------

interesting_keys = st.sampled_from([KOORD, KATALYST, ENHANCEMENT])
interesting_values = st.sampled_from(
    [*QoSClass, "dedicated_cores", "shared_cores", "reclaimed_cores", "system_cores", EXCLUSIVE, "[" * 5000, "{}"]
)
texts = st.one_of(st.text(), interesting_values)
attrs = st.dictionaries(st.one_of(st.text(), interesting_keys), texts, max_size=6)
segments = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["kubepods", "besteffort", "burstable", "pod1", "pod", "kubepods.slice", "kubepods-pod1.slice",
                     "kubepods-burstable.slice", "-kubepods-.slice", ".slice", "kubepods-kubepods.slice"]),
)
parents = st.one_of(st.text(), st.lists(segments, max_size=6).map("/".join))
ints = st.integers(-(2**63), 2**63 - 1)
resources = st.one_of(
    st.none(),
    st.builds(hook.LinuxContainerResources, cpu_shares=ints, cpu_quota=ints, memory_limit_in_bytes=ints),
    st.builds(cri.LinuxContainerResources, cpu_shares=ints, cpu_quota=ints, memory_limit_in_bytes=ints),
)


@given(labels=attrs, annotations=attrs, parent=parents, res=resources)
def test_resolution_is_total(
    labels: dict[str, str],
    annotations: dict[str, str],
    parent: str,
    res: hook.LinuxContainerResources | cri.LinuxContainerResources | None,
) -> None:
    result = resolve_qos(labels, annotations, parent, res)
    assert isinstance(result.qos_class, QoSClass)
    assert result.source in get_args(Source)
    assert isinstance(result.detail, str) and result.detail
    if labels.get(KOORD) in set(QoSClass):
        assert (result.qos_class, result.source) == (QoSClass(labels[KOORD]), "koordinator-label")
    elif result.source == "koordinator-label":
        pytest.fail("the label decided with a value that is not a class")


@given(labels=attrs, annotations=attrs, parent=parents)
def test_protobuf_maps_work_like_dicts(labels: dict[str, str], annotations: dict[str, str], parent: str) -> None:
    request = hook.PodSandboxHookRequest(labels=labels, annotations=annotations, cgroup_parent=parent)
    assert resolve_qos(request.labels, request.annotations, request.cgroup_parent) == resolve_qos(
        labels, annotations, parent
    )
    assert dict(request.labels) == labels  # looking up a missing key added nothing
