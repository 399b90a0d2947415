"""What plugin handlers write: a HookResponse of ResourceChanges, EnvChanges, annotations,
labels and a cgroup parent, with the checks the proxy would apply (``problems``) and the merge
rule (later plugins win). The resource fields come from runtimeproxy/hookapi/resource_fields.py."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from runtimeproxy.hookapi import resource_fields, value_bounds
from runtimeproxy.hookapi.hookpoints import HookKind

from .convert import resources_to_proto
from .overwrites import ENV_KIND
from .views import HugepageLimit

__all__ = ["EnvChanges", "HookResponse", "ResourceChanges"]


@dataclass
class ResourceChanges:
    """Resource fields to set. As on the wire, 0 / "" / empty means "leave as it is": a
    plugin cannot set a field to zero. ``unified`` entries are added or replaced one by
    one; a non-empty ``hugepage_limits`` replaces the whole list."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit_in_bytes: int = 0
    oom_score_adj: int = 0
    cpuset_cpus: str = ""
    cpuset_mems: str = ""
    hugepage_limits: list[HugepageLimit] = field(default_factory=list)
    unified: dict[str, str] = field(default_factory=dict)
    memory_swap_limit_in_bytes: int = 0

    def is_empty(self) -> bool:
        return not (any(resource_fields.SCALAR_VALUES(self)) or self.hugepage_limits or self.unified)

    def update(self, other: ResourceChanges) -> None:
        """Lay ``other``'s set fields over these."""
        for name, value in zip(resource_fields.SCALARS, resource_fields.SCALAR_VALUES(other), strict=True):
            if value:
                setattr(self, name, value)
        if other.hugepage_limits:
            self.hugepage_limits = list(other.hugepage_limits)
        self.unified.update(other.unified)

    def problems(self) -> list[str]:
        """Why the proxy would refuse these changes (types first, then its own checks)."""
        values = resource_fields.SCALAR_VALUES(self)
        # Exactly int and str, as plugins set them: nothing to say; otherwise field by field.
        found = [] if tuple(map(type, values)) == _SCALAR_TYPES else self._scalar_type_problems()
        if not isinstance(self.unified, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.unified.items()
        ):
            found.append("resources.unified must be a dict of str to str")
        if not all(
            isinstance(h, HugepageLimit) and isinstance(h.page_size, str) and isinstance(h.limit, int)
            for h in self.hugepage_limits
        ):
            found.append("resources.hugepage_limits must be a list of HugepageLimit(page_size: str, limit: int)")
        if found:
            return found
        if not (any(values) or self.hugepage_limits or self.unified):  # nothing set (most plugins' answers)
            return []
        key = (values, tuple(self.hugepage_limits), tuple(self.unified.items()))
        known = _VALUE_PROBLEMS.get(key)
        if known is None:
            known = _VALUE_PROBLEMS[key] = _value_problems(self)
            if len(_VALUE_PROBLEMS) > _VALUE_PROBLEMS_MAX:
                del _VALUE_PROBLEMS[next(iter(_VALUE_PROBLEMS))]  # the oldest
        return list(known)

    def _scalar_type_problems(self) -> list[str]:
        found = []
        for name in resource_fields.INTS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                found.append(f"resources.{name} must be an int, got {type(value).__name__}")
        for name in resource_fields.STRINGS:
            if not isinstance(getattr(self, name), str):
                found.append(f"resources.{name} must be a str, got {type(getattr(self, name)).__name__}")
        return found


def _value_problems(changes: ResourceChanges) -> tuple[str, ...]:
    """The range checks of ``changes``, whose fields are of the right types."""
    try:
        message = resources_to_proto(changes)
    except (ValueError, TypeError) as exc:  # e.g. an int out of int64 range
        return (f"resources: {exc}",)
    return tuple(f"resources: {problem}" for problem in value_bounds.validate_resources(message))


# The range checks' answers by the values checked: a pure function of them, asked for the same few
# answers (a plugin answers alike for the pods of a class) at every hook call. Values of the right
# types only (checked first), so equal keys are equal values of the same types.
_VALUE_PROBLEMS: dict[tuple[Any, ...], tuple[str, ...]] = {}
_VALUE_PROBLEMS_MAX = 256


# The types of a new ResourceChanges' scalar fields (int and str): ResourceChanges.problems' fast path.
_SCALAR_TYPES = tuple(map(type, resource_fields.SCALAR_VALUES(ResourceChanges())))

# What a new ResourceChanges holds, attribute by attribute, and the very types of its values:
# HookResponse.untouched compares with both ("0 of type int": False or 0.0 are problems, not zeros).
_EMPTY_VALUES: dict[str, Any] = dict(vars(ResourceChanges()))
_EMPTY_TYPES = tuple(map(type, _EMPTY_VALUES.values()))


class EnvChanges:
    """Environment variables to set, in order. As the proxy applies them, a name the
    container already has takes the new value where it stands (at every repeat), a new name
    is appended; variables are never removed. Setting a name twice keeps its first position
    and the last value."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    def set(self, name: str, value: str) -> None:
        self._values[name] = value

    __setitem__ = set

    def update(self, pairs: Mapping[str, str] | Iterable[tuple[str, str]]) -> None:
        for name, value in pairs.items() if isinstance(pairs, Mapping) else pairs:
            self.set(name, value)

    def items(self) -> list[tuple[str, str]]:
        return list(self._values.items())

    def __getitem__(self, name: str) -> str:
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __repr__(self) -> str:
        return f"EnvChanges({self._values!r})"

    def problems(self) -> list[str]:
        if not self._values:  # most answers set no variable: nothing to encode or check
            return []
        found: list[str] = []
        for name, value in self._values.items():
            if not isinstance(name, str) or not isinstance(value, str):
                found.append(f"env: names and values must be str, got {name!r}={value!r}")
        if found:
            return found
        return [f"env: {problem}" for problem in value_bounds.validate_env(self.encoded())]

    def encoded(self) -> list[tuple[str, bytes]]:
        """The changes with values as bytes (surrogateescape undone)."""
        return [(name, value.encode("utf-8", "surrogateescape")) for name, value in self._values.items()]


class HookResponse:
    """One handler's changes (and, after merging, a whole call's).

    * ``resources``: ResourceChanges for the pod (pod hooks) or the container (container hooks).
    * ``annotations``: added to / replacing the pod's (pod hooks) or the container's annotations.
    * ``labels``: added to / replacing the pod's labels; pod hooks only.
    * ``env``: EnvChanges for the container; container hooks only.
    * ``cgroup_parent``: a new pod cgroup parent ("" = unchanged).

    Which of these the proxy applies depends on the hook point (docs/hook-api.md): Post
    hooks' responses are never applied, PreStartContainer applies nothing, and so on.
    """

    def __init__(self, kind: HookKind) -> None:
        self.kind = kind
        self.resources = ResourceChanges()
        self.annotations: dict[str, str] = {}
        self.labels: dict[str, str] = {}
        self.env = EnvChanges()
        self.cgroup_parent = ""
        self._made = (self.resources, self.annotations, self.labels, self.env)  # see untouched

    def untouched(self) -> bool:
        """Exactly as made: the same field objects, each still empty (of its own type), no cgroup
        parent. Most handlers answer so; such a response has no problems and merges as nothing,
        and this check is much cheaper than ``problems()``."""
        resources, annotations, labels, env = self._made
        parent = self.cgroup_parent
        return (
            self.resources is resources
            and self.annotations is annotations
            and self.labels is labels
            and self.env is env
            and type(parent) is str
            and not parent
            and not annotations
            and not labels
            and type(env._values) is dict
            and not env._values
            # resources as new: the same attributes, equal values of the same types (_EMPTY_VALUES)
            and (values := vars(resources)) == _EMPTY_VALUES
            and tuple(map(type, values.values())) == _EMPTY_TYPES
        )

    def __repr__(self) -> str:
        fields = {
            "resources": None if self.resources.is_empty() else self.resources,
            "annotations": self.annotations or None,
            "labels": self.labels or None,
            "env": self.env.items() or None,
            "cgroup_parent": self.cgroup_parent or None,
        }
        shown = ", ".join(f"{name}={value!r}" for name, value in fields.items() if value is not None)
        return f"HookResponse({self.kind.value}{', ' if shown else ''}{shown})"

    def is_empty(self) -> bool:
        changes = (self.annotations, self.labels, len(self.env), self.cgroup_parent)
        return self.resources.is_empty() and not any(changes)

    def set_fields(self) -> Iterator[tuple[str, str, Any]]:
        """(field, kind, value) of every field these changes set. A map entry is a field of its
        own (``annotations[key]``, ``env[NAME]``) whose kind is the map's name, so kinds are few."""
        for name, value in zip(resource_fields.SCALARS, resource_fields.SCALAR_VALUES(self.resources), strict=True):
            if value:  # 0 / "" means "leave as it is"
                yield f"resources.{name}", f"resources.{name}", value
        if self.resources.hugepage_limits:
            yield "resources.hugepage_limits", "resources.hugepage_limits", list(self.resources.hugepage_limits)
        maps = (
            ("resources.unified", self.resources.unified),
            ("annotations", self.annotations),
            ("labels", self.labels),
        )
        for kind, mapping in (*maps, (ENV_KIND, dict(self.env.items()))):
            for key, value in mapping.items():
                yield f"{kind}[{key}]", kind, value
        if self.cgroup_parent:
            yield "cgroup_parent", "cgroup_parent", self.cgroup_parent

    def merge(self, other: HookResponse) -> None:
        """Lay ``other``'s changes over these (later plugins win)."""
        self.resources.update(other.resources)
        self.annotations.update(other.annotations)
        self.labels.update(other.labels)
        self.env.update(other.env.items())
        if other.cgroup_parent:
            self.cgroup_parent = other.cgroup_parent

    def problems(self) -> list[str]:
        """Why these changes cannot be sent (or the proxy would refuse them); empty when fine."""
        found = self.resources.problems()
        for name in ("annotations", "labels"):
            mapping = getattr(self, name)
            if not isinstance(mapping, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
            ):
                found.append(f"{name} must be a dict of str to str")
        if not isinstance(self.cgroup_parent, str):
            found.append(f"cgroup_parent must be a str, got {type(self.cgroup_parent).__name__}")
        elif "\0" in self.cgroup_parent:
            found.append("cgroup_parent contains NUL")
        if not isinstance(self.env, EnvChanges):
            found.append("env must stay an EnvChanges (use response.env.set(name, value))")
        else:
            found += self.env.problems()
            if self.kind is HookKind.POD and len(self.env):
                found.append("env: pod hooks cannot change a container's environment")
        if self.kind is HookKind.CONTAINER and self.labels:
            found.append("labels: container hooks cannot change pod labels")
        return found
