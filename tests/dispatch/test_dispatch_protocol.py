"""dispatch/protocol.py: a new container follows its pod (`follow_pod`), as the proxy applies
it to CreateContainer and `runtime-hooks explain` rehearses it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.dispatch.protocol import follow_pod

keys = st.sampled_from(["app", "tier", "koordinator.sh/qosClass", "x"])
values = st.sampled_from(["", "a", "b", "LS", "BE"])
maps = st.dictionaries(keys, values, max_size=4)
parents = st.sampled_from(["", "/kubepods/podu", "/kubepods/besteffort/podu"])


def config(
    parent: str = "", labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> cri.PodSandboxConfig:
    return cri.PodSandboxConfig(
        labels=labels or {}, annotations=annotations or {}, linux=cri.LinuxPodSandboxConfig(cgroup_parent=parent)
    )


def test_the_container_takes_the_pods_parent_labels_and_annotations() -> None:
    container = config("/kubepods/podu", {"app": "web", "keep": "1"}, {"note": "old"})
    pod = config("/kubepods/besteffort/podu", {"app": "web", "qos": "BE"}, {"note": "new"})
    changes = follow_pod(container, pod)
    assert container.linux.cgroup_parent == "/kubepods/besteffort/podu"
    assert dict(container.labels) == {"app": "web", "keep": "1", "qos": "BE"}
    assert dict(container.annotations) == {"note": "new"}
    assert changes == [
        "pod cgroup_parent: '/kubepods/podu' -> '/kubepods/besteffort/podu' (as the pod has it)",
        "pod labels[qos]: None -> 'BE' (as the pod has it)",
        "pod annotations[note]: 'old' -> 'new' (as the pod has it)",
    ]


def test_a_pod_without_a_parent_leaves_the_containers() -> None:
    container = config("/kubepods/podu")
    assert follow_pod(container, config("")) == []
    assert container.linux.cgroup_parent == "/kubepods/podu"


def test_the_pod_is_only_read() -> None:
    pod = config("/kubepods/podu", {"a": "1"}, {"b": "2"})
    before = pod.SerializeToString(deterministic=True)
    follow_pod(config(), pod)
    assert pod.SerializeToString(deterministic=True) == before


@given(parents, maps, maps, parents, maps, maps)
def test_following_twice_changes_nothing_more(
    c_parent: str,
    c_labels: dict[str, str],
    c_notes: dict[str, str],
    parent: str,
    labels: dict[str, str],
    notes: dict[str, str],
) -> None:
    container, pod = config(c_parent, c_labels, c_notes), config(parent, labels, notes)
    changes = follow_pod(container, pod)
    assert dict(container.labels) == c_labels | labels
    assert dict(container.annotations) == c_notes | notes
    assert container.linux.cgroup_parent == (parent or c_parent)
    assert len(changes) == (parent not in ("", c_parent)) + sum(c_labels.get(k) != v for k, v in labels.items()) + sum(
        c_notes.get(k) != v for k, v in notes.items()
    )
    assert follow_pod(container, pod) == []
