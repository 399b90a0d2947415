"""How a CRI lifecycle call and a hook server's request and response map onto each other.

A call is seen through two views: the pod (sandbox id, runtime handler and its
``PodSandboxConfig``) and, for container calls, the container (id and ``ContainerConfig``).
For RunPodSandbox and CreateContainer the views are the request's own messages, so a
hook's changes land in the request directly; for the update calls they are copies whose
changed resources are written back into the request (``commit``). Start, Stop and Remove
requests carry only an id: hooks there are told about the call, and their output has
nothing to change (it is logged as ignored).

Each answer is checked whole before any of it is applied (``OutputRules``: the bounds in
``value_bounds.py``, the cgroup rules in ``merge_rules.py``), so an invalid answer leaves the request
exactly as it was. Merge rules live in ``merge_rules.py``; this module decides which field goes
where. Change descriptions carry values only through ``value_bounds.cut``, and environment
values never.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.hookapi import merge_rules, value_bounds


class InvalidHookOutput(ValueError):
    """A hook response that breaks the validation rules; it counts as that hook's failure."""


@dataclass
class PodView:
    sandbox_id: str
    runtime_handler: str
    config: Any  # cri.PodSandboxConfig


@dataclass
class ContainerView:
    container_id: str
    config: Any  # cri.ContainerConfig


@dataclass
class CallFrame:
    """One lifecycle call on its way through the hooks."""

    method: str
    request: Any
    pod: PodView | None = None
    container: ContainerView | None = None
    # Whether hook output can change this call's request at all.
    mutable: bool = False
    changes: list[str] = field(default_factory=list)
    # Container annotations before the hooks ran, for writing back only what they changed.
    baseline_annotations: dict[str, str] = field(default_factory=dict)
    # Whether the views' configs are the store's own messages: read-only, copied before a
    # hook answer is applied to them.
    shared: bool = False
    # The hook request built from the views as they are now, serialized; None once they change.
    # Every hook point of one CRI call is of one kind (hookpoints.HOOKS_BY_METHOD).
    hook_request: bytes | None = None


def copy_resources(target: Any, source: Any) -> None:
    """Give ``target``, an unset LinuxContainerResources of either API (runtime.v1 or the hook
    API: same fields under the same numbers), ``source``'s values, by re-encoding. Merging into
    an unset field marks it set, as CopyFrom would."""
    target.MergeFromString(source.SerializeToString())


def to_cri_resources(resources: Any) -> Any:
    return cri.LinuxContainerResources.FromString(resources.SerializeToString())


def pod_metadata(config: Any) -> Any:
    meta = config.metadata
    return hook.PodSandboxMetadata(name=meta.name, uid=meta.uid, namespace=meta.namespace, attempt=meta.attempt)


def follow_pod(config: Any, pod: Any) -> list[str]:
    """Give a new container its pod as the pod really is, pre-hook changes included.

    ``config`` is the sandbox config a CreateContainer request carries (changed in place),
    ``pod`` the pod's PodSandboxConfig as the PreRunPodSandbox hooks left it. kubelet sends
    the sandbox config as it first built it; when a hook moved the pod to another cgroup
    parent or added labels or annotations, the container must follow, or it would land
    outside its own pod's cgroup. Returns the changes made.
    """
    changes = []
    parent = pod.linux.cgroup_parent
    if parent and parent != config.linux.cgroup_parent:
        old = config.linux.cgroup_parent
        changes.append(f"pod cgroup_parent: {value_bounds.cut(old)} -> {value_bounds.cut(parent)} (as the pod has it)")
        config.linux.cgroup_parent = parent
    for field_name in ("labels", "annotations"):
        target = getattr(config, field_name)
        for key, value in getattr(pod, field_name).items():
            if target.get(key) != value:  # .get, not [], which would insert into a protobuf map
                was, now = value_bounds.cut(target.get(key)), value_bounds.cut(value)
                changes.append(
                    f"pod {field_name}[{value_bounds.cut(key, quote=False)}]: {was} -> {now} (as the pod has it)"
                )
                target[key] = value
    return changes


# -- building hook requests --------------------------------------------------------------


def pod_hook_request(pod: PodView) -> Any:
    config = pod.config
    request = hook.PodSandboxHookRequest(
        pod_meta=pod_metadata(config),
        runtime_handler=pod.runtime_handler,
        labels=config.labels,
        annotations=config.annotations,
        cgroup_parent=config.linux.cgroup_parent,
        pod_sandbox_id=pod.sandbox_id,
    )
    if config.linux.HasField("overhead"):
        copy_resources(request.overhead, config.linux.overhead)
    if config.linux.HasField("resources"):
        copy_resources(request.resources, config.linux.resources)
    return request


def container_hook_request(pod: PodView, container: ContainerView) -> Any:
    pod_config, config = pod.config, container.config
    envs = [(env.key, env.value) for env in config.envs]  # each protobuf field read once
    request = hook.ContainerResourceHookRequest(
        pod_meta=pod_metadata(pod_config),
        container_meta=hook.ContainerMetadata(
            name=config.metadata.name, attempt=config.metadata.attempt, id=container.container_id
        ),
        container_annotations=config.annotations,  # maps are copied in as they are, no dict needed
        pod_annotations=pod_config.annotations,
        pod_labels=pod_config.labels,
        pod_cgroup_parent=pod_config.linux.cgroup_parent,
        container_envs={key: value.decode("utf-8", "replace") for key, value in envs},  # KeyValue.value: bytes
        container_env_list=[hook.KeyValue(key=key, value=value) for key, value in envs],
        pod_sandbox_id=pod.sandbox_id,
        runtime_handler=pod.runtime_handler,
    )
    if config.linux.HasField("resources"):
        copy_resources(request.container_resources, config.linux.resources)
    if pod_config.linux.HasField("resources"):
        copy_resources(request.pod_resources, pod_config.linux.resources)
    if pod_config.linux.HasField("overhead"):
        copy_resources(request.pod_overhead, pod_config.linux.overhead)
    return request


# -- applying hook responses ---------------------------------------------------------------


@dataclass(frozen=True)
class OutputRules:
    """What hook output must respect on this node: cgroup roots and driver, online CPUs and memory nodes."""

    cgroup_roots: tuple[str, ...] = ("/kubepods",)
    cgroup_driver: merge_rules.CgroupDriver = "auto"
    node: value_bounds.NodeFacts = field(default_factory=value_bounds.NodeFacts)

    def __post_init__(self) -> None:
        for root in self.cgroup_roots:  # a malformed root is a configuration error, found at start
            merge_rules.root_forms(root)


def apply_pod_response(pod: PodView, response: Any, rules: OutputRules) -> list[str]:
    """Merge a PodSandboxHookResponse into the pod view; returns the changes made.

    The whole answer is checked first: an invalid one raises InvalidHookOutput and changes nothing.
    """
    config = pod.config
    parent = response.cgroup_parent
    _refuse(
        _parent_problems("cgroup_parent", parent, config.linux.cgroup_parent, rules)
        + value_bounds.label_problems(response.labels)
        + _total_problems("labels", config.labels, response.labels, value_bounds.LABELS_TOTAL_MAX)
        + _total_problems("annotations", config.annotations, response.annotations, value_bounds.ANNOTATIONS_TOTAL_MAX)
        + _resource_problems(response, "resources", config.linux.resources, rules)
    )
    changes = _map_changes("labels", merge_rules.merge_map(config.labels, dict(response.labels)))
    changes += _map_changes("annotations", merge_rules.merge_map(config.annotations, dict(response.annotations)))
    if parent and parent != config.linux.cgroup_parent:
        changes.append(f"cgroup_parent: {value_bounds.cut(config.linux.cgroup_parent)} -> {value_bounds.cut(parent)}")
        config.linux.cgroup_parent = parent
    if response.HasField("resources"):
        changes += _merge_resources("resources", config.linux.resources, response.resources)
    return changes


def apply_container_response(pod: PodView, container: ContainerView, response: Any, rules: OutputRules) -> list[str]:
    """Merge a ContainerResourceHookResponse into the views; returns the changes made.

    The whole answer is checked first: an invalid one raises InvalidHookOutput and changes nothing.
    """
    config = container.config
    parent = response.pod_cgroup_parent
    env_field, wanted = _wanted_env(response)
    merged: list[tuple[str, bytes]] = []
    made_env: dict[str, tuple[bytes | None, bytes]] = {}
    env_problems: list[str] = []
    if wanted:  # an answer without env leaves it as it is: nothing to merge or check
        current = [(env.key, bytes(env.value)) for env in config.envs]
        merged, made_env = merge_rules.merge_env(current, wanted)
        env_problems = _labelled(
            env_field, value_bounds.validate_env(wanted) + value_bounds.env_total_problems(current, merged)
        )
    _refuse(
        _parent_problems("pod_cgroup_parent", parent, pod.config.linux.cgroup_parent, rules)
        + _total_problems(
            "container_annotations",
            config.annotations,
            response.container_annotations,
            value_bounds.ANNOTATIONS_TOTAL_MAX,
        )
        + _resource_problems(response, "container_resources", config.linux.resources, rules)
        + env_problems
    )
    changes = _map_changes(
        "annotations", merge_rules.merge_map(config.annotations, dict(response.container_annotations))
    )
    if response.HasField("container_resources"):
        changes += _merge_resources("resources", config.linux.resources, response.container_resources)
    if parent and parent != pod.config.linux.cgroup_parent:
        changes.append(
            f"pod cgroup_parent: {value_bounds.cut(pod.config.linux.cgroup_parent)} -> {value_bounds.cut(parent)}"
        )
        pod.config.linux.cgroup_parent = parent
    if made_env:
        del config.envs[:]
        config.envs.extend(cri.KeyValue(key=key, value=value) for key, value in merged)
    # Names only: values may be secrets, and are unbounded.
    return changes + [f"env[{value_bounds.cut(key, quote=False)}] set" for key in made_env]


# At most this many problems are spelled out in one error; the rest are counted.
_PROBLEMS_SHOWN = 3


def _refuse(problems: list[str]) -> None:
    if problems:
        more = len(problems) - _PROBLEMS_SHOWN
        raise InvalidHookOutput("; ".join(problems[:_PROBLEMS_SHOWN]) + (f"; and {more} more" if more > 0 else ""))


def _labelled(name: str, problems: list[str]) -> list[str]:
    return [f"{name}: {problem}" for problem in problems]


def _parent_problems(name: str, parent: str, pod_parent: str, rules: OutputRules) -> list[str]:
    if not parent:
        return []
    driver = merge_rules.pod_cgroup_driver(rules.cgroup_driver, pod_parent)
    problem = merge_rules.validate_cgroup_parent(parent, rules.cgroup_roots, driver)
    return [f"{name}: {problem}"] if problem else []


def _total_problems(name: str, current: Mapping[str, str], answer: Mapping[str, str], total_max: int) -> list[str]:
    if not answer:
        return []
    after = value_bounds.map_bytes(dict(current) | dict(answer))
    problem = value_bounds.growth_problem(name, value_bounds.map_bytes(current), after, total_max, "bytes")
    return [problem] if problem else []


def _resource_problems(response: Any, name: str, current: Any, rules: OutputRules) -> list[str]:
    if not response.HasField(name):
        return []
    return _labelled(name, value_bounds.validate_resources(getattr(response, name), rules.node, over=current))


def _merge_resources(label: str, target: Any, changes: Any) -> list[str]:
    update = to_cri_resources(changes)
    made = merge_rules.merge_resources(target, update)
    return [f"{label}.{name}: {value_bounds.cut(old)} -> {value_bounds.cut(new)}" for name, (old, new) in made.items()]


def _map_changes(label: str, made: dict[str, tuple[str | None, str]]) -> list[str]:
    return [
        f"{label}[{value_bounds.cut(key, quote=False)}]: {value_bounds.cut(old)} -> {value_bounds.cut(new)}"
        for key, (old, new) in made.items()
    ]


def _wanted_env(response: Any) -> tuple[str, list[tuple[str, bytes]]]:
    """The answer's env field and its variables: a non-empty ordered list wins over Koordinator's map."""
    if response.container_env_list:
        return "container_env_list", [(env.key, bytes(env.value)) for env in response.container_env_list]
    return "container_envs", [(key, value.encode()) for key, value in response.container_envs.items()]
