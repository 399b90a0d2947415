"""``runtime-hooks explain``: what the plugins would do for one Pod, rehearsed without doing it.

The Pod manifest goes through :mod:`runtimeproxy.play` -- ``load_pod`` and ``build_plan`` --
into the CRI requests kubelet would send (RunPodSandbox, then CreateContainer and
StartContainer per container). Each request becomes the hook request the proxy would build
(:mod:`runtimeproxy.hookapi.cri_mapping`) and then the PodInfo / ContainerInfo the hook server
would hand its plugins (:mod:`runtimeproxy.hooks.server`), so the plugins see exactly what
they would see on the node. Every enabled plugin then runs, through a
:class:`~runtimeproxy.hooks.sdk.PluginRunner` as in the server: its ``on_start``, then its
handlers of the creation path, in kubelet's order::

    PreRunPodSandbox
    per container: PreCreateContainer, PostCreateContainer, PreStartContainer, PostStartContainer

Responses of the Pre hooks the proxy applies (PreRunPodSandbox, PreCreateContainer) are
merged and applied to the requests as the proxy does, so later hooks see the changed pod.

**Nothing is written.** The plugins get a :class:`DryRunCgroupFS` and a
:class:`DryRunResctrlFS` and ``dry_run=True``: every write, mkdir and rmdir is recorded
(with the file it targets) instead of made; reads go to the real files. Cgroups that do not
exist yet are simulated: the pod's cgroup exists from the start (kubelet creates it before
RunPodSandbox), a container's from PostCreateContainer on, seeded with the CRI resources
kubelet sends (what runc would write there); their other files are those of the nearest
existing ancestor cgroup. On cgroup v2 CPU shares become cpu.weight as the node's runtime
converts them (``weight_conversion``, serve's ``--cpu-weight-conversion``), in the seeded
values and in the plugins' writes alike. Plugins must reach the node through these handles, or honour
``dry_run`` for anything else (netlink, sysctl): explain cannot intercept that.

Sandbox and container ids are placeholders derived from the pod's uid (shown in the output).
"""

from __future__ import annotations

import contextvars
import errno
import hashlib
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from runtimeproxy.hookapi import cri_mapping, resource_fields
from runtimeproxy.hookapi.defaults import DEFAULT_CGROUP_ROOTS
from runtimeproxy.hookapi.hookpoints import HookPoint
from runtimeproxy.kubelet_model.kube_qos import KubeQoSClass
from runtimeproxy.kubelet_model.pod_input import load_pod_and_node
from runtimeproxy.kubelet_model.pod_plan import CgroupDriver as KubeletCgroupDriver
from runtimeproxy.kubelet_model.pod_plan import PodPlan, build_plan

from . import server as server_mod
from .cgroups import (
    CGROUP_ROOT,
    CgroupDriver,
    CgroupError,
    CgroupFS,
    CgroupVersion,
    PodRoots,
    WeightConversion,
    parent_path,
    shares_to_weight,
)
from .changes import HookResponse
from .convert import qos_of
from .definition import Plugin
from .extended_resources import EXTENDED_RESOURCE_SPEC_ANNOTATION
from .plugin_runner import HookCallFailed, PluginRunner, filtered_reason
from .plugins import cpu as cpu_plugin
from .plugins import cpuset as cpuset_plugin
from .plugins import memory as memory_plugin
from .plugins import network as network_plugin
from .plugins.cpuset import cpuset_from_annotations
from .podview import RESOURCE_STATUS_ANNOTATION
from .policy import DEFAULT_POLICY, Policy
from .qos import QoSClass, QoSResolution
from .resctrl_fs import DEFAULT_ROOT as RESCTRL_ROOT
from .resctrl_fs import AddTasksResult, ResctrlError, ResctrlFS, parse_schemata
from .settings import SettingsSpec
from .views import ContainerInfo, PodInfo, ServerContext

__all__ = [
    "CREATION_PATH",
    "CallResult",
    "DryRunCgroupFS",
    "DryRunResctrlFS",
    "Explanation",
    "NodeWrite",
    "PluginReport",
    "Step",
    "WriteRecorder",
    "explain_manifest",
    "explain_plan",
    "idle_reasons",
    "kubelet_seed",
    "render_text",
    "response_fields",
]

#: The hook points explain rehearses, in kubelet's order (container ones once per container).
CREATION_PATH: Final = (
    HookPoint.PRE_RUN_POD_SANDBOX,
    HookPoint.PRE_CREATE_CONTAINER,
    HookPoint.POST_CREATE_CONTAINER,
    HookPoint.PRE_START_CONTAINER,
    HookPoint.POST_START_CONTAINER,
)
# The hook points whose responses the proxy applies to the CRI request (interceptor: mutable frames).
_APPLIED: Final = frozenset({HookPoint.PRE_RUN_POD_SANDBOX, HookPoint.PRE_CREATE_CONTAINER})
_LOG_DIR_BASE: Final = "/var/log/pods"

Handle = Literal["cgroups", "resctrl"]
Action = Literal["write", "mkdir", "rmdir"]


# --- recording ------------------------------------------------------------------------------------

# (plugin, hook, container) the writes being made belong to; copied into sync handlers' threads.
_TAG: contextvars.ContextVar[tuple[str, str, str]] = contextvars.ContextVar(
    "runtime_hooks_explain_tag", default=("", "", "")
)


@dataclass(frozen=True)
class NodeWrite:
    """One change a plugin would make on the node: which handle, what, where, which value."""

    plugin: str
    hook: str  # "start" or a hook point
    container: str  # the container's name, "" for pod-level calls
    handle: Handle
    action: Action
    target: str  # the file or directory
    value: str = ""


class WriteRecorder:
    """Collects NodeWrites, tagged with the plugin and hook point in progress (thread-safe)."""

    def __init__(self) -> None:
        self._writes: list[NodeWrite] = []
        self._lock = threading.Lock()

    def record(self, handle: Handle, action: Action, target: Path | str, value: str = "") -> None:
        plugin, hook, container = _TAG.get()
        with self._lock:
            self._writes.append(NodeWrite(plugin, hook, container, handle, action, str(target), value))

    @property
    def writes(self) -> list[NodeWrite]:
        with self._lock:
            return list(self._writes)

    def of(self, plugin: str, hook: str, container: str = "") -> list[NodeWrite]:
        return [w for w in self.writes if (w.plugin, w.hook, w.container) == (plugin, hook, container)]


@contextmanager
def _tagged(plugin: str, hook: str, container: str = "") -> Iterator[None]:
    token = _TAG.set((plugin, hook, container))
    try:
        yield
    finally:
        _TAG.reset(token)


def _cgroup_text(value: str | int | bytes) -> str:
    """A value as CgroupFS.write would send it (same type rules)."""
    if isinstance(value, bool):
        raise TypeError("cgroup values are numbers or strings, not booleans (write 1 or 0)")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    raise TypeError(f"cgroup values are str, int or bytes, got {type(value).__name__}")


# Files most cgroups have, for a simulated cgroup when no existing one can stand in.
_COMMON_FILES: Final[Mapping[CgroupVersion, frozenset[str]]] = {
    CgroupVersion.V1: frozenset(
        {
            "cpu.shares",
            "cpu.cfs_quota_us",
            "cpu.cfs_period_us",
            "cpuset.cpus",
            "cpuset.mems",
            "memory.limit_in_bytes",
            "memory.soft_limit_in_bytes",
            "cgroup.procs",
            "tasks",
        }
    ),
    CgroupVersion.V2: frozenset(
        {
            "cpu.max",
            "cpu.weight",
            "cpuset.cpus",
            "cpuset.mems",
            "memory.max",
            "memory.high",
            "memory.low",
            "memory.min",
            "cgroup.procs",
            "cgroup.threads",
        }
    ),
}


class DryRunCgroupFS(CgroupFS):
    """A CgroupFS that reads the real hierarchy and records writes instead of making them.

    ``simulate(parent, container_id, seed)`` makes a cgroup that does not exist yet count as
    existing (with its ancestors): ``exists`` and ``has_file`` answer for it as the node will
    once kubelet or runc created it, and ``read`` returns what was written in the dry run,
    else the ``seed`` values, else the file of the nearest existing ancestor cgroup.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = CGROUP_ROOT,
        driver: CgroupDriver = "cgroupfs",
        *,
        recorder: WriteRecorder,
        version: CgroupVersion | None = None,
        pod_roots: PodRoots | None = None,
        weight_conversion: WeightConversion = WeightConversion.LINEAR,
    ) -> None:
        super().__init__(root, driver, version=version, pod_roots=pod_roots, weight_conversion=weight_conversion)
        self.recorder = recorder
        self._simulated: set[str] = set()  # relative cgroup paths (ancestors included), all hierarchies
        self._seeded: dict[tuple[str, str], str] = {}  # (relative cgroup, file) -> content
        self._written: dict[Path, str] = {}

    def __repr__(self) -> str:
        return f"DryRunCgroupFS(root={str(self.root)!r}, driver={self.driver!r})"

    # -- simulated cgroups --

    def _relative(self, parent: str, container_id: str | None) -> str:
        relative = parent_path(parent)
        if container_id is not None:
            relative = f"{relative}/{self.container_dir_names(container_id)[0]}".lstrip("/")
        return relative

    def simulate(self, parent: str, container_id: str | None = None, seed: Mapping[str, str] | None = None) -> None:
        relative = self._relative(parent, container_id)
        parts = relative.split("/") if relative else []
        for end in range(1, len(parts) + 1):
            self._simulated.add("/".join(parts[:end]))
        for file, content in (seed or {}).items():
            self._seeded[(relative, file)] = content

    def _base(self, directory: Path) -> tuple[Path, str] | None:
        """The hierarchy base of ``directory`` and the cgroup's path relative to it."""
        try:
            relative = directory.relative_to(self.root)
        except ValueError:
            return None
        parts = relative.parts
        if self.version is CgroupVersion.V1:
            if not parts:
                return None
            return self.root / parts[0], "/".join(parts[1:])
        return self.root, "/".join(parts)

    def _dir_exists(self, directory: Path) -> bool:
        if directory.is_dir():
            return True
        located = self._base(directory)
        return located is not None and located[1] in self._simulated

    def _template(self, directory: Path) -> Path | None:
        """The existing cgroup whose files a simulated one has: its nearest existing ancestor,
        else (when only the hierarchy root exists, which lacks many files) any child of the root."""
        located = self._base(directory)
        if located is None:
            return None
        base = located[0]
        for ancestor in directory.parents:
            if ancestor == base or base not in ancestor.parents:
                break
            if ancestor.is_dir():
                return ancestor
        try:
            children = sorted(entry for entry in base.iterdir() if entry.is_dir() and (entry / "cgroup.procs").exists())
        except OSError:
            return None
        return children[0] if children else None

    def _file_exists(self, path: Path) -> bool:
        if path in self._written or path.is_file():
            return True
        directory = path.parent
        if directory.is_dir() or not self._dir_exists(directory):
            return False
        located = self._base(directory)
        if located is not None and (located[1], path.name) in self._seeded:
            return True
        template = self._template(directory)
        if template is not None:
            return (template / path.name).is_file()
        return path.name in _COMMON_FILES[self.version]

    # -- CgroupFS --

    def exists(self, parent: str, container_id: str | None = None, controller: str = "cpu") -> bool:
        return self._dir_exists(self.path(controller, parent, container_id))

    def has_file(self, controller: str, file: str, parent: str, container_id: str | None = None) -> bool:
        return self._file_exists(self.path(controller, parent, container_id, file))

    def read(self, controller: str, file: str, parent: str, container_id: str | None = None) -> str:
        path = self.path(controller, parent, container_id, file)
        if path in self._written:
            return self._written[path].strip()
        if path.is_file() or path.parent.is_dir():
            return super().read(controller, file, parent, container_id)
        located = self._base(path.parent)
        if located is not None and located[1] in self._simulated:
            seeded = self._seeded.get((located[1], file))
            if seeded is not None:
                return seeded.strip()
            template = self._template(path.parent)
            if template is not None and (template / file).is_file():
                return (template / file).read_text(encoding="utf-8", errors="replace").strip()
        raise FileNotFoundError(errno.ENOENT, "no such cgroup file", str(path))

    def write(
        self, controller: str, file: str, value: str | int | bytes, parent: str, container_id: str | None = None
    ) -> None:
        text = _cgroup_text(value)
        path = self.pod_path(controller, parent, container_id, file)  # refused where the real write is
        if not self._file_exists(path):  # as os.open without O_CREAT would fail
            raise FileNotFoundError(errno.ENOENT, "no such cgroup file", str(path))
        self.recorder.record("cgroups", "write", path, text)
        self._written[path] = text


def kubelet_seed(
    version: CgroupVersion, resources: Any, conversion: WeightConversion = WeightConversion.LINEAR
) -> dict[str, str]:
    """What kubelet (pod cgroup) or runc (container cgroup) writes for CRI ``resources``; on v2
    the weight as the node's runtime converts the shares (``conversion``)."""
    seed: dict[str, str] = {}
    if resources is None:
        return seed
    quota, period = resources.cpu_quota, resources.cpu_period or 100000
    shares, memory = resources.cpu_shares, resources.memory_limit_in_bytes
    if version is CgroupVersion.V2:
        seed["cpu.max"] = f"{quota if quota > 0 else 'max'} {period}"
        if shares:
            seed["cpu.weight"] = str(shares_to_weight(shares, conversion))
        seed["memory.max"] = str(memory) if memory > 0 else "max"
    else:
        seed["cpu.cfs_quota_us"] = str(quota if quota > 0 else -1)
        seed["cpu.cfs_period_us"] = str(period)
        if shares:
            seed["cpu.shares"] = str(shares)
        if memory > 0:
            seed["memory.limit_in_bytes"] = str(memory)
    if resources.cpuset_cpus:
        seed["cpuset.cpus"] = resources.cpuset_cpus
    if resources.cpuset_mems:
        seed["cpuset.mems"] = resources.cpuset_mems
    return seed


class _RecordingOps:
    """ResctrlOps that record: a safety net, in case a ResctrlFS method not overridden mutates."""

    def __init__(self, recorder: WriteRecorder) -> None:
        self.recorder = recorder

    def mkdir(self, path: Path) -> None:
        self.recorder.record("resctrl", "mkdir", path)

    def rmdir(self, path: Path) -> None:
        self.recorder.record("resctrl", "rmdir", path)

    def write(self, path: Path, data: bytes) -> None:
        self.recorder.record("resctrl", "write", path, data.decode("ascii", "backslashreplace"))


class DryRunResctrlFS(ResctrlFS):
    """A ResctrlFS that reads the real mount and records mkdir, rmdir and writes instead.

    Groups it "created" exist for the rest of the dry run (with the kernel's defaults for a new
    group: full cache mask, 100% bandwidth), and what it "wrote" to a schemata or tasks file
    is what reading them gives.
    """

    def __init__(self, root: Path = RESCTRL_ROOT, *, recorder: WriteRecorder) -> None:
        super().__init__(root, ops=_RecordingOps(recorder))
        self.recorder = recorder
        self._created: set[str] = set()
        self._removed: set[str] = set()
        self._schemata: dict[str, dict[str, dict[int, int]]] = {}
        self._tasks: dict[str, set[int]] = {}
        self._state_lock = threading.RLock()

    def __repr__(self) -> str:
        return f"DryRunResctrlFS(root={str(self.root)!r})"

    def _has(self, name: str) -> bool:
        return name in self._created or (name not in self._removed and (self.root / name).is_dir())

    def groups(self) -> list[str]:
        with self._state_lock:
            return sorted((set(super().groups()) - self._removed) | self._created)

    def ensure_group(self, name: str) -> Path:
        path = self.group_path(name)
        with self._state_lock:
            if self._has(name):
                return path
            self.check_room_for(name)
            self.recorder.record("resctrl", "mkdir", path)
            self._created.add(name)
            self._removed.discard(name)
        return path

    def remove_group(self, name: str) -> bool:
        path = self.group_path(name)
        with self._state_lock:
            if not self._has(name):
                return False
            self.recorder.record("resctrl", "rmdir", path)
            self._created.discard(name)
            self._removed.add(name)
            self._schemata.pop(name, None)
            self._tasks.pop(name, None)
        return True

    def _new_group_schemata(self) -> dict[str, dict[int, int]]:
        info = self.info()
        schemata: dict[str, dict[int, int]] = {}
        if info.l3 is not None:
            for resource in info.l3.schema_names:
                schemata[resource] = dict.fromkeys(info.l3.cache_ids, info.l3.cbm_mask)
        if info.mb is not None:
            schemata["MB"] = dict.fromkeys(info.mb.domain_ids, 100)
        return schemata

    def schemata(self, name: str) -> dict[str, dict[int, int]]:
        self.group_path(name)
        with self._state_lock:
            if name in self._schemata:
                return {resource: dict(values) for resource, values in self._schemata[name].items()}
            if name in self._created:
                return self._new_group_schemata()
        return super().schemata(name)

    def write_schemata(self, name: str, text: str) -> None:
        if not text.strip():
            raise ValueError("empty schemata text")
        if not text.endswith("\n"):
            text += "\n"
        text.encode("ascii")
        path = self.group_path(name) / "schemata"
        with self._state_lock:
            if not self._has(name):
                raise ResctrlError(f"{path} does not exist; call ensure_group() first")
            current = self.schemata(name)
            self.recorder.record("resctrl", "write", path, text)
            for resource, values in parse_schemata(text).items():  # the kernel keeps what a write leaves out
                current.setdefault(resource, {}).update(values)
            self._schemata[name] = current

    def add_tasks(self, name: str, pids: Iterable[int]) -> AddTasksResult:
        tasks_path = self.group_path(name) / "tasks"
        ids = list(pids)
        for pid in ids:
            if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
                raise ValueError(f"task ids must be positive integers, got {pid!r}")
        with self._state_lock:
            if not self._has(name):
                raise ResctrlError(f"resctrl group {name!r} does not exist; call ensure_group() first")
            for pid in ids:
                self.recorder.record("resctrl", "write", tasks_path, f"{pid}\n")
            self._tasks.setdefault(name, set()).update(ids)
        return AddTasksResult(moved=tuple(ids))

    def tasks(self, name: str) -> set[int]:
        self.group_path(name)
        with self._state_lock:
            added = set(self._tasks.get(name, ()))
            real = name not in self._created and name not in self._removed and (self.root / name).is_dir()
        return (super().tasks(name) if real else set()) | added


# --- the rehearsal ----------------------------------------------------------------------------------


@dataclass
class Step:
    """One plugin at one hook point (or its on_start): outcome, response and node writes."""

    hook: str
    container: str = ""
    outcome: str = "ok"  # the runner's outcome: ok, error, timeout, invalid, busy
    reason: str = ""
    response: dict[str, Any] = field(default_factory=dict)
    applied: bool = False  # whether the proxy applies this hook point's response to the CRI call
    writes: list[NodeWrite] = field(default_factory=list)


@dataclass
class PluginReport:
    name: str
    version: str
    order: int
    failure_policy: str
    section: str | None  # its section of the policy file (its name), None without settings
    status: str = "ran"  # ran, disabled (on_start failed, "ignore"), refuses-start (on_start failed, "fail")
    steps: list[Step] = field(default_factory=list)
    #: Why the runner does not call it for this pod ("" when it does): a node handle it needs is
    #: missing, or its settings switch it off for the pod's class.
    not_called: str = ""


@dataclass
class CallResult:
    """A CRI call after the hook server's merged answer at its Pre hook: what the proxy changes."""

    call: str  # RunPodSandbox, CreateContainer
    hook: str
    container: str = ""
    changes: list[str] = field(default_factory=list)
    error: str = ""


@dataclass
class Explanation:
    pod: dict[str, str]
    kubernetes_qos: str
    qos_class: str
    qos_source: str
    qos_reason: str
    cgroup_parent: str
    policy: str
    node: dict[str, str]
    ids: dict[str, str]
    plugins: list[PluginReport] = field(default_factory=list)
    calls: list[CallResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Per built-in plugin: why it may do nothing for this pod, from the policy, pod and node.
    idle_reasons: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def response_fields(response: HookResponse) -> dict[str, Any]:
    """The changes in a HookResponse as plain data, only what is set."""
    fields: dict[str, Any] = {}
    changes = response.resources
    resources: dict[str, Any] = {}
    for name in resource_fields.SCALARS:
        value = getattr(changes, name)
        if value:
            resources[name] = value
    if changes.hugepage_limits:
        resources["hugepage_limits"] = {h.page_size: h.limit for h in changes.hugepage_limits}
    if changes.unified:
        resources["unified"] = dict(changes.unified)
    if resources:
        fields["resources"] = resources
    for name in ("annotations", "labels"):
        if getattr(response, name):
            fields[name] = dict(getattr(response, name))
    if len(response.env):
        fields["env"] = dict(response.env.items())
    if response.cgroup_parent:
        fields["cgroup_parent"] = response.cgroup_parent
    return fields


def _placeholder(*parts: str) -> str:
    return hashlib.sha256("\0".join(("runtime-hooks-explain", *parts)).encode()).hexdigest()


def _copy(message: Any) -> Any:
    duplicate = type(message)()
    duplicate.CopyFrom(message)
    return duplicate


def _pod_info(pod: cri_mapping.PodView) -> PodInfo:
    return server_mod.pod_from_request(cri_mapping.pod_hook_request(pod))


def _container_infos(pod: cri_mapping.PodView, container: cri_mapping.ContainerView) -> tuple[PodInfo, ContainerInfo]:
    request = cri_mapping.container_hook_request(pod, container)
    return server_mod.pod_from_container_request(request), server_mod.container_from_request(request)


class _Rehearsal:
    def __init__(
        self,
        plugins: Sequence[Plugin],
        context: ServerContext,
        recorder: WriteRecorder,
        cgroup_roots: Sequence[str],
    ) -> None:
        self.runners = [(plugin, PluginRunner([plugin], context=context)) for plugin in plugins]
        self.reports = {
            plugin.name: PluginReport(
                plugin.name,
                plugin.version,
                plugin.order,
                plugin.failure_policy,
                plugin.name if plugin.settings_spec is not None else None,
                not_called=runner.skip_reason(plugin),
            )
            for plugin, runner in self.runners
        }
        self.recorder = recorder
        self.output_rules = cri_mapping.OutputRules(tuple(cgroup_roots))
        self.fail_policy = any(plugin.failure_policy == "fail" for plugin in plugins)
        self.calls: list[CallResult] = []

    async def start(self) -> None:
        for plugin, runner in self.runners:
            report = self.reports[plugin.name]
            step = Step(hook="start")
            with _tagged(plugin.name, "start"):
                try:
                    failures = await runner.start()
                except HookCallFailed as exc:
                    failures = [exc.failure]
                    report.status = "refuses-start"
            if failures:
                step.outcome, step.reason = failures[0].outcome, failures[0].reason
                if report.status == "ran":
                    report.status = "disabled"
            step.writes = self.recorder.of(plugin.name, "start")
            if plugin.start_handler is not None:
                report.steps.append(step)

    async def stop(self) -> None:
        for plugin, runner in reversed(self.runners):
            with _tagged(plugin.name, "stop"):
                await runner.stop()

    async def run(self, point: HookPoint, pod: PodInfo, container: ContainerInfo | None) -> tuple[HookResponse, str]:
        """Every plugin's handler at ``point``; the merged response, and why the call would fail ("" if not)."""
        merged = HookResponse(point.kind)
        failed = ""
        name = container.name if container is not None else ""
        for plugin, runner in self.runners:
            report = self.reports[plugin.name]
            if report.status != "ran" or not runner.plugins_for(point):
                continue
            step = Step(hook=point.value, container=name, applied=point in _APPLIED)
            with _tagged(plugin.name, point.value, name):
                try:
                    result = await runner.run(point, pod=pod, container=container)
                except HookCallFailed as exc:
                    step.outcome, step.reason = exc.failure.outcome, exc.failure.reason
                    failed = failed or str(exc)
                else:
                    skip = result.skipped.get(plugin.name, "")
                    if skip != filtered_reason(plugin.handler(point)):  # a when= filter: this call only
                        report.not_called = report.not_called or skip
                    if result.failures:
                        step.outcome, step.reason = result.failures[0].outcome, result.failures[0].reason
                    else:
                        step.response = response_fields(result.response)
                        merged.merge(result.response)
            step.writes = self.recorder.of(plugin.name, point.value, name)
            report.steps.append(step)
        return merged, failed

    def refused(self, call: CallResult, failed: str) -> None:
        if self.fail_policy:
            call.error = f"the proxy would fail {call.call}: {failed}"
        else:
            call.error = f"the hook server would answer an error ({failed}); the proxy relays {call.call} unchanged"

    async def pod_sandbox(self, pod: cri_mapping.PodView) -> None:
        call = CallResult("RunPodSandbox", HookPoint.PRE_RUN_POD_SANDBOX.value)
        merged, failed = await self.run(HookPoint.PRE_RUN_POD_SANDBOX, _pod_info(pod), None)
        if failed:
            self.refused(call, failed)
        elif not merged.is_empty():
            try:
                call.changes = cri_mapping.apply_pod_response(pod, server_mod.pod_response(merged), self.output_rules)
            except cri_mapping.InvalidHookOutput as exc:
                call.error = f"the proxy would refuse the hook server's answer ({exc}) and relay the call unchanged"
        self.calls.append(call)

    async def container(self, pod: cri_mapping.PodView, container: cri_mapping.ContainerView, name: str) -> None:
        call = CallResult("CreateContainer", HookPoint.PRE_CREATE_CONTAINER.value, name)
        merged, failed = await self.run(HookPoint.PRE_CREATE_CONTAINER, *_container_infos(pod, container))
        if failed:
            self.refused(call, failed)
        elif not merged.is_empty():
            response = server_mod.container_response(merged)
            try:
                call.changes = cri_mapping.apply_container_response(pod, container, response, self.output_rules)
            except cri_mapping.InvalidHookOutput as exc:
                call.error = f"the proxy would refuse the hook server's answer ({exc}) and relay the call unchanged"
        self.calls.append(call)

    async def started(self, pod: cri_mapping.PodView, container: cri_mapping.ContainerView) -> None:
        for point in CREATION_PATH[2:]:
            await self.run(point, *_container_infos(pod, container))


def _spec(plugin: Plugin) -> SettingsSpec:
    spec = plugin.settings_spec
    assert spec is not None  # the built-ins all declare settings
    return spec


def _entry(policy: Policy, plugin: Plugin, qos: QoSClass) -> Any:
    """A built-in plugin's settings for ``qos`` in ``policy`` (its defaults where the policy has none)."""
    return policy.section(_spec(plugin)).for_class(qos)


def _cpu_reasons(policy: Policy, qos: QoSClass, annotations: Mapping[str, str], pinned: bool) -> list[str]:
    entry = _entry(policy, cpu_plugin.plugin, qos)
    reasons: list[str] = []
    batch = qos is QoSClass.BE and policy.section(_spec(cpu_plugin.plugin)).common.be_quota_source == "batch"
    if batch and EXTENDED_RESOURCE_SPEC_ANNOTATION not in annotations:
        reasons.append(f"BE batch resources need the {EXTENDED_RESOURCE_SPEC_ANNOTATION} annotation, the pod has none")
    if batch:
        reasons.append("a container without batch-cpu in the annotation keeps kubelet's quota and shares")
    elif entry.cfs_quota_enabled:
        reasons.append(f"cpu.{qos.value}.cfs_quota_enabled is true: the quota is kubelet's")
    elif not pinned:
        reasons.append(f"cpu.{qos.value}.cfs_quota_enabled is false, but the pod is not pinned: the quota is kubelet's")
    if entry.cfs_burst_percent == 0:
        reasons.append(f"cpu.{qos.value}.cfs_burst_percent is 0 (no burst)")
    else:
        reasons.append("no burst without a CFS quota, or the burst is already as planned")
    return reasons


def _memory_reasons(policy: Policy, qos: QoSClass, version: CgroupVersion | None, besteffort: bool) -> list[str]:
    entry = _entry(policy, memory_plugin.plugin, qos)
    reasons: list[str] = []
    if version is CgroupVersion.V1:
        if entry.v1_soft_limit == "unset":
            reasons.append(f"cgroup v1 and memory.{qos.value}.v1_soft_limit is unset")
    else:
        off = [name for name in ("min_percent", "low_percent", "throttling_percent") if getattr(entry, name) == 0]
        if off:
            reasons.append(f"memory.{qos.value}.{'/'.join(off)} {'is' if len(off) == 1 else 'are'} 0 (off)")
    reasons.append("memory.wmark_* exist only on Alibaba Cloud Linux kernels")
    if not entry.batch_memory_limit:
        reasons.append(f"memory.{qos.value}.batch_memory_limit is false: no limit from batch-memory")
    else:
        reasons.append("no batch-memory limit in the pod's annotation, or it is not tighter than the current limit")
    if entry.pod_oom_score_adj:
        reasons.append(
            f"memory.{qos.value}.pod_oom_score_adj is true, but no koordinator.sh/oom-score-adj(-spec) value"
            " applies to the container (none, refused, out of range, or 0)"
        )
    else:
        switch = f"memory.{qos.value}.pod_oom_score_adj is false: the pod's oom-score-adj annotations are not read"
        if qos is not QoSClass.BE:
            reasons.append(f"the OOM order is raised for BE only, the pod is {qos.value}; {switch}")
        elif besteffort:
            reasons.append(f"kubelet already gives BestEffort containers oom_score_adj 1000; {switch}")
    return reasons


def idle_reasons(
    policy: Policy,
    qos: QoSClass,
    annotations: Mapping[str, str],
    *,
    version: CgroupVersion | None,
    resctrl: bool,
    besteffort: bool = False,
) -> dict[str, str]:
    """Why each built-in plugin may do nothing for a pod of class ``qos`` with ``annotations``, on a
    node with cgroup ``version`` (None: none) and resctrl or not; what the plugins' plans test."""
    try:
        pinned = policy.trust.pod_cpuset and bool(cpuset_from_annotations(annotations))
    except ValueError:
        pinned = False
    if not _entry(policy, cpuset_plugin.plugin, qos).pinned:
        cpuset = f"cpuset.{qos.value}.pinned is false (shared pool)"
    elif not policy.trust.pod_cpuset:
        cpuset = "trust.pod_cpuset is false: the pod's cpuset annotation is ignored"
    elif not pinned:
        cpuset = f"{qos.value} is pinned, but the pod has no cpuset in {RESOURCE_STATUS_ANNOTATION}"
    else:
        cpuset = "the cpuset is already as assigned"
    if resctrl:
        band = "the class's resctrl group already holds the container, or its tasks could not be read"
    else:
        band = "no resctrl handle: resctrl is not mounted on this node"
    network = (
        'network.interface is "" (network QoS off)'
        if not policy.section(_spec(network_plugin.plugin)).common.interface
        else f"the {network_plugin.NETWORK_BANDS[qos].value} band is already set up"
    )
    reasons = {
        "cpu": "; ".join(_cpu_reasons(policy, qos, annotations, pinned)),
        "cpuset": cpuset,
        "resctrl": band,
        "memory": "; ".join(_memory_reasons(policy, qos, version, besteffort)),
        "network": network,
    }
    if version is None:
        reasons = {name: f"no cgroup hierarchy; {reason}" for name, reason in reasons.items()}
    return reasons


def _why_idle(reports: Mapping[str, PluginReport], reasons: Mapping[str, str]) -> dict[str, str]:
    """Per plugin, why it may do nothing: not called at all (grouped by that reason), else the
    built-ins' reasons from policy, pod and node."""
    why = {name: f"not called: {report.not_called}" for name, report in reports.items() if report.not_called}
    return why | {name: reasons[name] for name in reports if name in reasons and name not in why}


def _node(cgroups: DryRunCgroupFS, resctrl: DryRunResctrlFS | None) -> tuple[dict[str, str], list[str]]:
    notes: list[str] = []
    try:
        version = f"v{int(cgroups.version)}"
    except CgroupError as exc:
        version = "none"
        notes.append(f"no cgroup hierarchy at {cgroups.root} ({exc}): plugins' cgroup calls fail as on such a node")
    node = {
        "cgroup_root": str(cgroups.root),
        "cgroup_version": version,
        "cgroup_driver": cgroups.driver,
        "cpu_weight_conversion": str(cgroups.weight_conversion),
        "resctrl": str(resctrl.root) if resctrl is not None else "not mounted (plugins get resctrl=None)",
    }
    return node, notes


async def explain_plan(
    plan: PodPlan,
    plugins: Sequence[Plugin],
    *,
    policy: Policy = DEFAULT_POLICY,
    policy_source: str = "built-in defaults",
    cgroup_root: str | os.PathLike[str] = CGROUP_ROOT,
    cgroup_driver: CgroupDriver = "cgroupfs",
    weight_conversion: WeightConversion = WeightConversion.LINEAR,
    resctrl_root: str | os.PathLike[str] = RESCTRL_ROOT,
    cgroup_parent_roots: Sequence[str] = DEFAULT_CGROUP_ROOTS,
) -> Explanation:
    """Rehearse ``plan`` with ``plugins`` (enabled ones, any order) against the node's cgroups
    and resctrl, read-only; see the module doc."""
    recorder = WriteRecorder()
    cgroups = DryRunCgroupFS(
        cgroup_root,
        cgroup_driver,
        recorder=recorder,
        pod_roots=PodRoots(cgroup_parent_roots),
        weight_conversion=weight_conversion,
    )
    probe = DryRunResctrlFS(Path(resctrl_root), recorder=recorder)
    resctrl = probe if probe.available() else None
    node, notes = _node(cgroups, resctrl)
    context = ServerContext(
        cgroups=cgroups,
        resctrl=resctrl,
        policy=lambda: policy,
        settings={
            "cgroup_root": str(cgroup_root),
            "cgroup_driver": cgroup_driver,
            "cpu_weight_conversion": str(weight_conversion),
            "resctrl_root": str(resctrl_root),
        },
        dry_run=True,
    )
    ordered = sorted(plugins, key=lambda p: (p.order, p.name))
    rehearsal = _Rehearsal(ordered, context, recorder, cgroup_parent_roots)

    sandbox_request = _copy(plan.sandbox_request)
    sandbox_config = sandbox_request.config
    sandbox_id = _placeholder("sandbox", plan.uid)
    ids = {"sandbox": sandbox_id}
    pod_view = cri_mapping.PodView("", sandbox_request.runtime_handler, sandbox_config)
    qos: QoSResolution = qos_of(_pod_info(pod_view))
    version_known = node["cgroup_version"] != "none"
    if version_known:  # kubelet creates the pod's cgroup before RunPodSandbox
        seed = kubelet_seed(cgroups.version, sandbox_config.linux.resources, weight_conversion)
        cgroups.simulate(plan.cgroup_parent, seed=seed)

    await rehearsal.start()
    try:
        await rehearsal.pod_sandbox(pod_view)
        pod_view.sandbox_id = sandbox_id
        if version_known and sandbox_config.linux.cgroup_parent != plan.cgroup_parent:
            cgroups.simulate(sandbox_config.linux.cgroup_parent)
        for container in plan.containers:
            container_id = _placeholder("container", plan.uid, container.name)
            ids[container.name] = container_id
            request = container.for_sandbox(sandbox_id)
            cri_mapping.follow_pod(request.sandbox_config, sandbox_config)  # as the proxy does at CreateContainer
            creating = cri_mapping.PodView(sandbox_id, sandbox_request.runtime_handler, request.sandbox_config)
            view = cri_mapping.ContainerView("", request.config)
            await rehearsal.container(creating, view, container.name)
            view.container_id = container_id
            if version_known:  # runc creates the container's cgroup at CreateContainer
                seed = kubelet_seed(cgroups.version, request.config.linux.resources, weight_conversion)
                cgroups.simulate(request.sandbox_config.linux.cgroup_parent, container_id, seed)
            await rehearsal.started(pod_view, view)
    finally:
        await rehearsal.stop()

    notes.append("sandbox and container ids are placeholders; nothing was written to the node")
    reasons = idle_reasons(
        policy,
        qos.qos_class,
        sandbox_config.annotations,
        version=cgroups.version if version_known else None,
        resctrl=resctrl is not None,
        besteffort=plan.qos_class is KubeQoSClass.BEST_EFFORT,
    )
    return Explanation(
        pod={"name": plan.name, "namespace": plan.namespace, "uid": plan.uid},
        kubernetes_qos=str(plan.qos_class),
        qos_class=str(qos.qos_class),
        qos_source=qos.source,
        qos_reason=qos.detail,
        cgroup_parent=plan.cgroup_parent,
        policy=policy_source,
        node=node,
        ids=ids,
        plugins=[rehearsal.reports[plugin.name] for plugin in ordered],
        calls=rehearsal.calls,
        notes=notes,
        idle_reasons=_why_idle(rehearsal.reports, reasons),
    )


async def explain_manifest(
    manifest: str | os.PathLike[str],
    plugins: Sequence[Plugin],
    *,
    cgroup_driver: CgroupDriver = "cgroupfs",
    machine_memory: int | None = None,
    kubelet_cgroup_root: str = "/",
    runtime_handler: str = "",
    configmap_files: Sequence[str] = (),
    node_name: str | None = None,
    node_ip: str = "",
    **options: Any,
) -> Explanation:
    """Load the Pod manifest (ManifestError when invalid) with the ConfigMaps and node facts it
    needs (:func:`~runtimeproxy.kubelet_model.pod_input.load_pod_and_node`: those in its input and
    in ``configmap_files``), plan it as kubelet would (PodSetupError for a volume or variable
    that cannot be resolved), and :func:`explain_plan` it; ``options`` go to explain_plan."""
    pod, node, _ = load_pod_and_node(os.fspath(manifest), configmap_files, node_name, node_ip)
    driver: KubeletCgroupDriver = cgroup_driver
    plan = build_plan(
        pod,
        log_dir_base=_LOG_DIR_BASE,
        machine_memory=machine_memory,
        cgroup_driver=driver,
        cgroup_root=kubelet_cgroup_root,
        runtime_handler=runtime_handler,
        node=node,
    )
    return await explain_plan(plan, plugins, cgroup_driver=cgroup_driver, **options)


# --- text ----------------------------------------------------------------------------------------------


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{key}={_value(item)}" for key, item in value.items())
    return str(value)


def _where(step: Step) -> str:
    return f"{step.hook} {step.container}".rstrip()


def _write_line(write: NodeWrite) -> str:
    if write.action == "write":
        return f"{write.handle}: write {write.target} = {write.value.rstrip()!r}"
    return f"{write.handle}: {write.action} {write.target}"


def _did_nothing(step: Step) -> bool:
    return step.outcome == "ok" and not step.response and not step.writes


def _idle_lines(plugins: Sequence[str], reasons: Mapping[str, str]) -> list[str]:
    """One line per reason, naming every plugin it holds for; plugins without a known reason share one."""
    if not plugins:
        return []
    groups: dict[str, list[str]] = {}
    for name in plugins:
        groups.setdefault(reasons.get(name, ""), []).append(name)
    lines = ["", "plugins that do nothing (at all, or at the hooks listed above), and why:"]
    for reason, names in groups.items():
        lines.append(f"  {', '.join(names)}: {reason or 'no reason known (not a built-in plugin)'}")
    return lines


def _weights_note(node: Mapping[str, str]) -> str:
    """How shares become weights, where they do (cgroup v2)."""
    return f", {node['cpu_weight_conversion']} shares-to-weight" if node["cgroup_version"] == "v2" else ""


def render_text(explanation: Explanation) -> str:
    """The explanation for people: the pod and its class, then per plugin every value it would set."""
    e = explanation
    lines = [
        f"pod {e.pod['namespace']}/{e.pod['name']} (uid {e.pod['uid']})",
        f"  QoS class:      {e.qos_class}  ({e.qos_source}: {e.qos_reason})",
        f"  Kubernetes QoS: {e.kubernetes_qos}, cgroup parent {e.cgroup_parent}",
        f"  policy:         {e.policy}",
        f"  node:           cgroup {e.node['cgroup_version']} at {e.node['cgroup_root']} "
        f"({e.node['cgroup_driver']} driver{_weights_note(e.node)}), resctrl {e.node['resctrl']}",
        "  ids:            " + ", ".join(f"{name} {value[:12]}" for name, value in e.ids.items()),
    ]
    if not e.plugins:
        lines += ["", "no plugin enabled: the hook server would change nothing"]
    idle_plugins: list[str] = []
    for report in e.plugins:
        lines += [
            "",
            f"plugin {report.name} {report.version} (order {report.order}, failure policy {report.failure_policy}, "
            f"policy section {report.section or '-'})",
        ]
        if report.status == "disabled":
            lines.append("  on_start failed: the server runs without this plugin")
        elif report.status == "refuses-start":
            lines.append("  on_start failed: the server would refuse to start (failure policy fail)")
        if not report.steps:
            lines.append("  handles none of these hook points")
        idle = [step for step in report.steps if _did_nothing(step)]
        if idle and len(idle) == len(report.steps) and report.status == "ran":
            del lines[-2:]  # its header: the grouped lines below name it
            idle_plugins.append(report.name)
            continue
        for step in report.steps:
            if _did_nothing(step):
                continue
            lines.append(f"  {_where(step)}:")
            if step.outcome != "ok":
                lines.append(f"    {step.outcome}: {step.reason} (its changes are discarded)")
            if step.response:
                how = "applied by the proxy" if step.applied else "not applied: the proxy ignores this hook's response"
                lines.append(f"    response ({how}):")
                lines += [f"      {name}: {_value(value)}" for name, value in step.response.items()]
            lines += [f"    {_write_line(write)}" for write in step.writes]
        if idle:
            lines.append("  nothing at " + ", ".join(_where(step) for step in idle))
            idle_plugins.append(report.name)
    lines += _idle_lines(idle_plugins, e.idle_reasons)
    lines += ["", "what the proxy sends on:"]
    for call in e.calls:
        head = f"  {call.call} {call.container}".rstrip()
        if call.error:
            lines.append(f"{head}: {call.error}")
        elif call.changes:
            lines.append(f"{head}:")
            lines += [f"    {change}" for change in call.changes]
        else:
            lines.append(f"{head}: unchanged")
    lines += ["", *(f"note: {note}" for note in e.notes)]
    return "\n".join(lines)
