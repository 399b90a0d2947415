"""The hook API <-> plugin view conversions the server does on every hook call (hooks/convert.py,
hooks/server.py), against plain re-statements of what they must give."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.convert import frozen_map, qos_of, resources_from_proto
from runtimeproxy.hooks.qos import QoSClass, resolve_qos
from runtimeproxy.hooks.server import container_from_request, pod_from_container_request, pod_from_request
from runtimeproxy.hooks.settings import SettingsSpec
from runtimeproxy.hooks.testkit.builders import container, container_request, pod, pod_request
from runtimeproxy.hooks.views import HugepageLimit, Resources

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.hookapi import resource_fields

texts = st.text(max_size=12)
maps = st.dictionaries(texts, texts, max_size=6)
int64s = st.integers(-(2**63), 2**63 - 1)
resources = st.builds(
    Resources,
    cpu_period=int64s,
    cpu_quota=int64s,
    cpu_shares=int64s,
    memory_limit_in_bytes=int64s,
    oom_score_adj=int64s,
    cpuset_cpus=texts,
    cpuset_mems=texts,
    hugepage_limits=st.lists(st.builds(HugepageLimit, texts, st.integers(0, 2**64 - 1)), max_size=3).map(tuple),
    unified=maps.map(MappingProxyType),
    memory_swap_limit_in_bytes=int64s,
)


@given(maps)
def test_frozen_map_copies_a_protobuf_map_read_only(entries: dict[str, str]) -> None:
    message = hook_pb.PodSandboxHookRequest(labels=entries)
    copied = frozen_map(message.labels)
    assert dict(copied) == entries
    message.labels.clear()  # a copy: the request changing afterwards does not show
    assert dict(copied) == entries
    with pytest.raises(TypeError):
        copied["new"] = "x"  # type: ignore[index]


@given(resources)
def test_resources_round_trip_through_the_hook_api_message(given_resources: Resources) -> None:
    message = resource_fields.fill(hook_pb.LinuxContainerResources(), given_resources)
    for name in resource_fields.SCALARS:
        assert getattr(message, name) == getattr(given_resources, name)
    assert resources_from_proto(message) == given_resources


@given(labels=maps, annotations=maps, pod_resources=st.none() | resources, env=st.lists(st.tuples(texts, texts)))
def test_requests_read_back_as_the_pod_and_container_they_were_built_from(
    labels: dict[str, str], annotations: dict[str, str], pod_resources: Resources | None, env: list[tuple[str, str]]
) -> None:
    info = pod(labels=labels, annotations=annotations, resources=pod_resources, cgroup_parent="/kubepods/pod1")
    assert pod_from_request(pod_request(info)) == info
    made = container(annotations=annotations, env=tuple(env), resources=pod_resources)
    request = container_request(made, pod=info)
    assert container_from_request(request) == made
    assert pod_from_container_request(request) == info


@given(shares=int64s, quota=int64s, memory=int64s, with_container=st.booleans())
def test_qos_of_reads_the_resources_as_the_message_would_give_them(
    shares: int, quota: int, memory: int, with_container: bool
) -> None:
    """qos_of passes the SDK's Resources to resolve_qos as they are: the same answer as the message."""
    given_resources = Resources(cpu_shares=shares, cpu_quota=quota, memory_limit_in_bytes=memory)
    message = hook_pb.LinuxContainerResources(cpu_shares=shares, cpu_quota=quota, memory_limit_in_bytes=memory)
    if with_container:
        result = qos_of(pod(cgroup_parent="/elsewhere"), container(resources=given_resources))
    else:
        result = qos_of(pod(cgroup_parent="/elsewhere", resources=given_resources))
    assert result == resolve_qos({}, {}, "/elsewhere", message)


@dataclass(frozen=True)
class Band:
    weight: int = 1


def _spec() -> SettingsSpec:
    return SettingsSpec("bands", settings=Band, class_entry={"LSE": "LS", "LSR": "LS"})


@given(st.sampled_from(list(QoSClass)))
def test_for_class_takes_a_class_or_its_name(qos: QoSClass) -> None:
    section = _spec().defaults
    assert section.for_class(qos) is section.for_class(qos.value) is section.entries[section.class_entry[qos]]


@given(st.one_of(texts.filter(lambda text: text not in set(QoSClass)), st.none(), st.integers(), st.just([])))
def test_for_class_refuses_what_is_no_class(value: Any) -> None:
    with pytest.raises(ValueError):
        _spec().defaults.for_class(value)
