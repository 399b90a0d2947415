"""pod_response / container_response fill the response's maps only when the plugins set entries
(a protobuf map's update is Python code): the messages must be exactly what handing every map to
the constructor made, empty maps and all."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.changes import HookResponse
from runtimeproxy.hooks.server import container_response, pod_response

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.hookapi.hookpoints import HookKind

entries = st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)
parents = st.sampled_from(["", "/kubepods/burstable/pod1"])


def _filled(kind: HookKind, labels: dict[str, str], annotations: dict[str, str], parent: str) -> HookResponse:
    response = HookResponse(kind)
    response.labels.update(labels)
    response.annotations.update(annotations)
    response.cgroup_parent = parent
    return response


@given(entries, entries, parents, st.integers(min_value=0, max_value=10**6))
def test_a_pod_response_is_the_message_of_all_its_maps(
    labels: dict[str, str], annotations: dict[str, str], parent: str, shares: int
) -> None:
    response = _filled(HookKind.POD, labels, annotations, parent)
    response.resources.cpu_shares = shares
    expected: Any = hook_pb.PodSandboxHookResponse(labels=labels, annotations=annotations, cgroup_parent=parent)
    if shares:
        expected.resources.cpu_shares = shares
    assert pod_response(response) == expected
    assert pod_response(response).SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    )


@given(entries, parents, st.dictionaries(st.sampled_from(["A", "B"]), st.text(max_size=4), max_size=2))
def test_a_container_response_is_the_message_of_all_its_maps(
    annotations: dict[str, str], parent: str, env: dict[str, str]
) -> None:
    response = _filled(HookKind.CONTAINER, {}, annotations, parent)
    response.env.update(env)
    expected: Any = hook_pb.ContainerResourceHookResponse(
        container_annotations=annotations,
        pod_cgroup_parent=parent,
        container_env_list=[hook_pb.KeyValue(key=k, value=v.encode()) for k, v in env.items()],
        container_envs=env,
    )
    assert container_response(response) == expected
