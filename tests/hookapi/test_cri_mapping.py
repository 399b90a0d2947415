"""hookapi/cri_mapping.py: a new container follows its pod (`follow_pod`), as the proxy applies
it to CreateContainer and `runtime-hooks explain` rehearses it; what a container hook request
carries, and which answers are held to the env limits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.hookapi import value_bounds
from runtimeproxy.hookapi.cri_mapping import (
    ContainerView,
    InvalidHookOutput,
    OutputRules,
    PodView,
    apply_container_response,
    apply_pod_response,
    container_hook_request,
    follow_pod,
)

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


# -- hook requests and answers ---------------------------------------------------------------

env_lists = st.lists(st.tuples(st.sampled_from(["A", "B", "PATH", "é"]), st.binary(max_size=6)), max_size=5)


@given(maps, maps, maps, env_lists)
def test_a_container_hook_request_carries_the_views_as_they_are(
    labels: dict[str, str], notes: dict[str, str], c_notes: dict[str, str], envs: list[tuple[str, bytes]]
) -> None:
    pod_config = config("/kubepods/podu", labels, notes)
    container = cri.ContainerConfig(annotations=c_notes, envs=[cri.KeyValue(key=k, value=v) for k, v in envs])
    request = container_hook_request(PodView("s", "runc", pod_config), ContainerView("c", container))
    assert (dict(request.pod_labels), dict(request.pod_annotations)) == (labels, notes)
    assert dict(request.container_annotations) == c_notes
    assert [(e.key, e.value) for e in request.container_env_list] == envs
    assert dict(request.container_envs) == {k: v.decode("utf-8", "replace") for k, v in envs}  # the last one wins
    pod_config.labels["added"] = "later"
    container.annotations["added"] = "later"
    assert "added" not in request.pod_labels and "added" not in request.container_annotations  # copies


def test_an_answer_without_env_leaves_an_env_over_the_limits_alone() -> None:
    """Only an answer that changes the environment is held to its limits: kubelet's own env,
    however large, is neither refused nor touched when the hook server says nothing about it."""
    big = [
        cri.KeyValue(key=f"V{n}", value=b"x" * (value_bounds.ENV_ENTRY_MAX // 2)) for n in range(10)
    ]  # over the total
    container = ContainerView("c", cri.ContainerConfig(envs=big))
    answer = hook.ContainerResourceHookResponse(container_annotations={"a": "1"})
    changes = apply_container_response(PodView("s", "", config()), container, answer, OutputRules())
    assert changes == ["annotations[a]: None -> '1'"]
    assert list(container.config.envs) == big
    growing = hook.ContainerResourceHookResponse(container_env_list=[hook.KeyValue(key="NEW", value=b"1")])
    with pytest.raises(InvalidHookOutput, match="env would hold"):
        apply_container_response(PodView("s", "", config()), container, growing, OutputRules())


# -- the empty answer: the dispatcher takes it as "ok, no changes" without decoding or merging --

resources = st.builds(
    cri.LinuxContainerResources, cpu_shares=st.integers(0, 4096), cpuset_cpus=st.sampled_from(["", "0-1"])
)


@given(parents, maps, maps, maps, env_lists, resources)
def test_an_empty_answer_changes_nothing_and_is_valid(
    parent: str,
    labels: dict[str, str],
    notes: dict[str, str],
    c_notes: dict[str, str],
    envs: list[tuple[str, bytes]],
    current: cri.LinuxContainerResources,
) -> None:
    """What Dispatcher.run's shortcut for b"" assumes: the full path finds no problem and
    changes nothing, whatever the views hold."""
    pod = PodView("s", "runc", config(parent, labels, notes))
    pod.config.linux.resources.CopyFrom(current)
    container = ContainerView(
        "c", cri.ContainerConfig(annotations=c_notes, envs=[cri.KeyValue(key=k, value=v) for k, v in envs])
    )
    container.config.linux.resources.CopyFrom(current)
    before = (pod.config.SerializeToString(deterministic=True), container.config.SerializeToString(deterministic=True))
    assert apply_pod_response(pod, hook.PodSandboxHookResponse.FromString(b""), OutputRules()) == []
    empty = hook.ContainerResourceHookResponse.FromString(b"")
    assert apply_container_response(pod, container, empty, OutputRules()) == []
    after = (pod.config.SerializeToString(deterministic=True), container.config.SerializeToString(deterministic=True))
    assert after == before
