"""PodInfos (hooks/nri/pod_infos.py): a pod's PodInfo is made once while the runtime describes the
pod alike, made anew as soon as anything of the pod's message differs, never taken from another
pod, and the number of pods remembered stays bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runtimeproxy.hooks.nri import pod_infos
from runtimeproxy.hooks.nri.mapping import pod_from_nri
from runtimeproxy.hooks.nri.pod_infos import PodInfos

from runtimeproxy.api.nri.v1alpha1 import api_pb2 as nri


def _pod(pod_id: str = "sb1", **labels: str) -> nri.PodSandbox:
    pod = nri.PodSandbox(id=pod_id, name="web", namespace="default", uid="u-" + pod_id)
    pod.labels.update(labels or {"app": "web"})
    pod.annotations["node.koordinator.sh/extended-resource-spec"] = "{}"
    pod.linux.cgroup_parent = f"/kubepods/besteffort/pod{pod_id}"
    return pod


def test_a_pod_described_alike_is_converted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    def counting(pod: nri.PodSandbox) -> object:
        made.append(pod.id)
        return pod_from_nri(pod)

    monkeypatch.setattr(pod_infos, "pod_from_nri", counting)
    infos = PodInfos()
    first = infos.of(_pod())
    again = nri.PodSandbox.FromString(_pod().SerializeToString())  # the next event's own message
    assert infos.of(again) is first
    assert made == ["sb1"]


# Every field of PodSandbox the conversion reads, each changed on its own.
CHANGES = {
    "name": lambda pod: setattr(pod, "name", "other"),
    "namespace": lambda pod: setattr(pod, "namespace", "other"),
    "uid": lambda pod: setattr(pod, "uid", "other"),
    "runtime_handler": lambda pod: setattr(pod, "runtime_handler", "kata"),
    "label value": lambda pod: pod.labels.update({"app": "api"}),
    "label added": lambda pod: pod.labels.update({"tier": "x"}),
    "annotation": lambda pod: pod.annotations.update({"node.koordinator.sh/extended-resource-spec": "[]"}),
    "cgroup parent": lambda pod: setattr(pod.linux, "cgroup_parent", "/kubepods/pod-other"),
    "pod resources": lambda pod: setattr(pod.linux.pod_resources.cpu.shares, "value", 2),
    "overhead": lambda pod: setattr(pod.linux.pod_overhead.memory.limit, "value", 1 << 20),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_pod_whose_message_differs_is_converted_anew(change: str) -> None:
    infos = PodInfos()
    infos.of(_pod())
    changed = _pod()
    CHANGES[change](changed)
    assert infos.of(changed) == pod_from_nri(changed) != pod_from_nri(_pod())
    assert infos.of(_pod()) == pod_from_nri(_pod())  # and back


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y"])), min_size=1, max_size=12))
def test_each_answer_is_the_conversion_of_the_message_given(events: list[tuple[str, str]]) -> None:
    infos = PodInfos(limit=2)
    for pod_id, app in events:
        pod = _pod(pod_id, app=app)
        assert infos.of(pod) == pod_from_nri(pod)
        assert len(infos) <= 2


def test_the_least_recently_used_pod_is_forgotten_first_and_removed_pods_are_forgotten() -> None:
    infos = PodInfos(limit=2)
    a, b = infos.of(_pod("a")), infos.of(_pod("b"))
    assert infos.of(_pod("a")) is a  # a used last: b goes first
    infos.of(_pod("c"))
    assert len(infos) == 2
    assert infos.of(_pod("a")) is a
    assert infos.of(_pod("b")) is not b
    infos.forget("b")
    infos.forget("never-seen")
    assert len(infos) == 1
    with pytest.raises(ValueError, match="not positive"):
        PodInfos(limit=0)
