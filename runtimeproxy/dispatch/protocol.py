"""How a CRI lifecycle call and a hook server's request and response map onto each other.

A call is seen through two views: the pod (sandbox id, runtime handler and its
``PodSandboxConfig``) and, for container calls, the container (id and ``ContainerConfig``).
For RunPodSandbox and CreateContainer the views are the request's own messages, so a
hook's changes land in the request directly; for the update calls they are copies whose
changed resources are written back into the request (``commit``). Start, Stop and Remove
requests carry only an id: hooks there are told about the call, and their output has
nothing to change (it is logged as ignored).

Merge rules live in ``merge.py``; this module only decides which field goes where.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.dispatch import merge


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


def to_hook_resources(resources: Any) -> Any:
    """runtime.v1 LinuxContainerResources as the hook API's message: same fields, same numbers."""
    return hook.LinuxContainerResources.FromString(resources.SerializeToString())


def to_cri_resources(resources: Any) -> Any:
    return cri.LinuxContainerResources.FromString(resources.SerializeToString())


def pod_metadata(config: Any) -> Any:
    meta = config.metadata
    return hook.PodSandboxMetadata(name=meta.name, uid=meta.uid, namespace=meta.namespace, attempt=meta.attempt)


# -- building hook requests --------------------------------------------------------------


def pod_hook_request(pod: PodView) -> Any:
    config = pod.config
    request = hook.PodSandboxHookRequest(
        pod_meta=pod_metadata(config),
        runtime_handler=pod.runtime_handler,
        labels=dict(config.labels),
        annotations=dict(config.annotations),
        cgroup_parent=config.linux.cgroup_parent,
        pod_sandbox_id=pod.sandbox_id,
    )
    if config.linux.HasField("overhead"):
        request.overhead.CopyFrom(to_hook_resources(config.linux.overhead))
    if config.linux.HasField("resources"):
        request.resources.CopyFrom(to_hook_resources(config.linux.resources))
    return request


def container_hook_request(pod: PodView, container: ContainerView) -> Any:
    pod_config, config = pod.config, container.config
    request = hook.ContainerResourceHookRequest(
        pod_meta=pod_metadata(pod_config),
        container_meta=hook.ContainerMetadata(
            name=config.metadata.name, attempt=config.metadata.attempt, id=container.container_id
        ),
        container_annotations=dict(config.annotations),
        pod_annotations=dict(pod_config.annotations),
        pod_labels=dict(pod_config.labels),
        pod_cgroup_parent=pod_config.linux.cgroup_parent,
        container_envs={env.key: _text(env.value) for env in config.envs},
        container_env_list=[hook.KeyValue(key=env.key, value=env.value) for env in config.envs],
        pod_sandbox_id=pod.sandbox_id,
        runtime_handler=pod.runtime_handler,
    )
    if config.linux.HasField("resources"):
        request.container_resources.CopyFrom(to_hook_resources(config.linux.resources))
    if pod_config.linux.HasField("resources"):
        request.pod_resources.CopyFrom(to_hook_resources(pod_config.linux.resources))
    if pod_config.linux.HasField("overhead"):
        request.pod_overhead.CopyFrom(to_hook_resources(pod_config.linux.overhead))
    return request


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


# -- applying hook responses ---------------------------------------------------------------


def apply_pod_response(pod: PodView, response: Any, cgroup_roots: Sequence[str]) -> list[str]:
    """Merge a PodSandboxHookResponse into the pod view; returns the changes made."""
    _check_resources(response, "resources")
    parent = response.cgroup_parent
    if parent:
        problem = merge.validate_cgroup_parent(parent, cgroup_roots)
        if problem:
            raise InvalidHookOutput(f"cgroup_parent: {problem}")
    config = pod.config
    changes = _map_changes("labels", merge.merge_map(config.labels, dict(response.labels)))
    changes += _map_changes("annotations", merge.merge_map(config.annotations, dict(response.annotations)))
    if parent and parent != config.linux.cgroup_parent:
        changes.append(f"cgroup_parent: {config.linux.cgroup_parent!r} -> {parent!r}")
        config.linux.cgroup_parent = parent
    if response.HasField("resources"):
        changes += _merge_resources("resources", config.linux.resources, response.resources)
    return changes


def apply_container_response(
    pod: PodView, container: ContainerView, response: Any, cgroup_roots: Sequence[str]
) -> list[str]:
    """Merge a ContainerResourceHookResponse into the views; returns the changes made."""
    _check_resources(response, "container_resources")
    parent = response.pod_cgroup_parent
    if parent:
        problem = merge.validate_cgroup_parent(parent, cgroup_roots)
        if problem:
            raise InvalidHookOutput(f"pod_cgroup_parent: {problem}")
    config = container.config
    changes = _map_changes(
        "annotations", merge.merge_map(config.annotations, dict(response.container_annotations))
    )
    if response.HasField("container_resources"):
        changes += _merge_resources("resources", config.linux.resources, response.container_resources)
    if parent and parent != pod.config.linux.cgroup_parent:
        changes.append(f"pod cgroup_parent: {pod.config.linux.cgroup_parent!r} -> {parent!r}")
        pod.config.linux.cgroup_parent = parent
    changes += _merge_env(config, response)
    return changes


def _check_resources(response: Any, name: str) -> None:
    if response.HasField(name):
        problems = merge.validate_resources(getattr(response, name))
        if problems:
            raise InvalidHookOutput(f"{name}: " + "; ".join(problems))


def _merge_resources(label: str, target: Any, changes: Any) -> list[str]:
    update = to_cri_resources(changes)
    made = merge.merge_resources(target, update)
    return [f"{label}.{name}: {old!r} -> {new!r}" for name, (old, new) in made.items()]


def _map_changes(label: str, made: dict[str, tuple[str | None, str]]) -> list[str]:
    return [f"{label}[{key}]: {old!r} -> {new!r}" for key, (old, new) in made.items()]


def _merge_env(config: Any, response: Any) -> list[str]:
    """A non-empty ordered env list wins; otherwise Koordinator's env map is merged."""
    if response.container_env_list:
        wanted = [(env.key, bytes(env.value)) for env in response.container_env_list]
    elif response.container_envs:
        wanted = [(key, value.encode()) for key, value in response.container_envs.items()]
    else:
        return []
    current = [(env.key, bytes(env.value)) for env in config.envs]
    merged, made = merge.merge_env(current, wanted)
    if not made:
        return []
    del config.envs[:]
    config.envs.extend(cri.KeyValue(key=key, value=value) for key, value in merged)
    return [f"env[{key}]: {old!r} -> {new!r}" for key, (old, new) in made.items()]
