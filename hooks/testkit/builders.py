"""Builders for plugin tests: the PodInfo / ContainerInfo a handler gets, the hook requests the
proxy sends, and one call of a plugin as the server makes it.

    p = pod(qos="BE")                          # labelled koordinator.sh/qosClass=BE, in kubepods/besteffort
    c = container(env={"GREETING": "hello"})
    result = await run_plugin(plugin, HookPoint.PRE_CREATE_CONTAINER, pod=p, container=c)
    assert result.failures == [] and result.response.env.items() == [...]

    request = container_request(c, pod=p)      # the same pod and container as a ContainerResourceHookRequest

Every default is what a plain pod would have, so a test names only what matters to it.
:func:`pod` and :func:`container` give exactly what the server derives from the requests
:func:`pod_request` and :func:`container_request` build from them
(``pod_from_request(pod_request(p)) == p``), so a test may start from either side.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from prometheus_client import CollectorRegistry

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook_pb
from runtimeproxy.hookapi import resource_fields
from runtimeproxy.hookapi.hookpoints import HookKind, HookPoint, parse_hook_point

from .. import policy as policy_mod
from ..cgroups import CgroupDriver, CgroupFS, CgroupVersion, parent_path
from ..definition import Plugin
from ..discovery import settings_specs
from ..plugin_runner import PluginRunner, RunResult
from ..qos import KOORDINATOR_QOS_LABEL, QoSClass
from ..resctrl_fs import ResctrlFS
from ..views import ContainerInfo, PodInfo, Resources, ServerContext
from .fake_cgroups import FakeCgroup, KubeQoS, Runtime
from .fake_resctrl import FakeResctrl

__all__ = [
    "DEFAULT_UID",
    "container",
    "container_request",
    "kube_qos_of",
    "kubelet_cgroup_parent",
    "plugin_runner",
    "pod",
    "pod_request",
    "run_plugin",
]

#: The uid of ``pod()`` with the default name and namespace (uids are derived from both).
DEFAULT_UID: Final = str(uuid.uuid5(uuid.NAMESPACE_URL, "runtimeproxy-testkit/default/web"))

_KUBE_QOS: Final[tuple[KubeQoS, ...]] = ("guaranteed", "burstable", "besteffort")
# The Kubernetes QoS a pod of each Koordinator class usually has: batch resources are extended
# resources (so BE pods are BestEffort to kubelet), LSR/LSE need whole cpus requested = limited.
_KUBE_QOS_OF_CLASS: Final[Mapping[QoSClass, KubeQoS]] = MappingProxyType(
    {
        QoSClass.LSE: "guaranteed",
        QoSClass.LSR: "guaranteed",
        QoSClass.LS: "burstable",
        QoSClass.BE: "besteffort",
        QoSClass.SYSTEM: "burstable",
    }
)
_DEFAULT_PERIOD: Final = 100_000  # kubelet's CFS period, in µs
_MIN_SHARES: Final = 2


def kubelet_cgroup_parent(uid: str, kube_qos: KubeQoS = "burstable", driver: CgroupDriver = "cgroupfs") -> str:
    """The CRI cgroup parent kubelet gives a pod: ``/kubepods/<qos>/pod<uid>`` (Guaranteed:
    ``/kubepods/pod<uid>``), or with the systemd driver ``kubepods-<qos>-pod<uid_>.slice``.
    The same name :meth:`FakeCgroup.pod_parent` creates."""
    return FakeCgroup(Path("/"), CgroupVersion.V2, driver).pod_parent(uid, _kube_qos(kube_qos))


def _kube_qos(value: str) -> KubeQoS:
    """A Kubernetes QoS class in either spelling ("Burstable", "burstable")."""
    lowered = value.lower() if isinstance(value, str) else value
    for known in _KUBE_QOS:
        if lowered == known:
            return known
    raise ValueError(f"kube_qos must be guaranteed, burstable or besteffort, got {value!r}")


def kube_qos_of(resources: Resources | None) -> KubeQoS | None:
    """The Kubernetes QoS class kubelet gives a pod whose total resources are ``resources`` (the
    CRI values it derived from the requests and limits), or None when they are unknown.

    BestEffort: no limits and the minimum 2 cpu shares. Guaranteed: a cpu quota and a memory
    limit, and shares that come from the same milli-cpus as the quota (request = limit).
    Burstable: anything else.
    """
    if resources is None:
        return None
    shares, quota, memory = resources.cpu_shares, resources.cpu_quota, resources.memory_limit_in_bytes
    if shares <= _MIN_SHARES and quota <= 0 and memory <= 0:
        return "besteffort"
    if quota > 0 and memory > 0:
        milli_cpu = quota * 1000 // (resources.cpu_period or _DEFAULT_PERIOD)
        if max(_MIN_SHARES, milli_cpu * 1024 // 1000) == shares:
            return "guaranteed"
    return "burstable"


def pod(
    name: str = "web",
    namespace: str = "default",
    uid: str | None = None,
    *,
    qos: QoSClass | str | None = None,
    kube_qos: KubeQoS | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    cgroup_parent: str | None = None,
    driver: CgroupDriver | None = None,
    resources: Resources | None = None,
    overhead: Resources | None = None,
    sandbox_id: str = "",
    attempt: int = 0,
    runtime_handler: str = "",
    cgroups: FakeCgroup | None = None,
) -> PodInfo:
    """A pod as a handler gets it (``PodInfo``).

    * ``uid``: by default derived from namespace and name (stable across runs; :data:`DEFAULT_UID`
      for the defaults).
    * ``qos``: a Koordinator class (``"BE"``, ``QoSClass.LSR``...): sets the label
      ``koordinator.sh/qosClass`` on top of ``labels``.
    * ``cgroup_parent``: used as given; by default kubelet's for the pod's Kubernetes QoS, with ``driver``
      (default: ``cgroups``' driver, else cgroupfs). That QoS is ``kube_qos`` when given, else
      what kubelet makes of ``resources`` (:func:`kube_qos_of`), else the usual one of the
      ``qos`` class (BE: besteffort; LSR, LSE: guaranteed; others: burstable), else burstable.
    * ``sandbox_id``: "" as in PreRunPodSandbox; set it for the hooks after.
    * ``resources`` / ``overhead``: the pod's totals as the proxy sends them; None: not sent.
    * ``cgroups``: a fake cgroup tree in which to create the pod's cgroup (and kubepods).
    """
    if uid is None:
        uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"runtimeproxy-testkit/{namespace}/{name}"))
    all_labels = dict(labels or {})
    klass = None if qos is None else QoSClass(qos)
    if klass is not None:
        all_labels[KOORDINATOR_QOS_LABEL] = klass.value
    if cgroup_parent is None:
        if kube_qos is not None:
            wanted = _kube_qos(kube_qos)
        else:
            wanted = kube_qos_of(resources) or (_KUBE_QOS_OF_CLASS[klass] if klass else "burstable")
        cgroup_parent = kubelet_cgroup_parent(uid, wanted, driver or (cgroups.driver if cgroups else "cgroupfs"))
    if cgroups is not None:
        if driver is not None and driver != cgroups.driver:
            raise ValueError(f"driver {driver!r} differs from the fake tree's {cgroups.driver!r}")
        cgroups.mkdir(parent_path(cgroup_parent))
    return PodInfo(
        name=name,
        namespace=namespace,
        uid=uid,
        attempt=attempt,
        sandbox_id=sandbox_id,
        labels=MappingProxyType(all_labels),
        annotations=MappingProxyType(dict(annotations or {})),
        cgroup_parent=cgroup_parent,
        runtime_handler=runtime_handler,
        resources=resources,
        overhead=overhead,
    )


_new_pod = pod  # for functions with a ``pod`` parameter


def container(
    name: str = "app",
    *,
    id: str = "",
    attempt: int = 0,
    annotations: Mapping[str, str] | None = None,
    resources: Resources | None = None,
    env: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
    pod: PodInfo | None = None,
    cgroups: FakeCgroup | None = None,
    runtime: Runtime = "containerd",
) -> ContainerInfo:
    """A container as a handler gets it (``ContainerInfo``).

    * ``id``: "" as in PreCreateContainer (not created yet); set it for the hooks after.
    * ``env``: a mapping or (name, value) pairs, in CRI order.
    * ``resources``: what the CRI request sets; None: not sent.
    * ``cgroups`` (with ``pod`` and ``id``): a fake cgroup tree in which to create the
      container's cgroup under the pod's, named as ``runtime`` names it.
    """
    pairs = env.items() if isinstance(env, Mapping) else env or ()
    if cgroups is not None:
        if pod is None or not id:
            raise ValueError("creating the container's cgroup needs the pod (pod=...) and the container id (id=...)")
        cgroups.add_container(pod.cgroup_parent, id, runtime)
    return ContainerInfo(
        name=name,
        id=id,
        attempt=attempt,
        annotations=MappingProxyType(dict(annotations or {})),
        resources=resources,
        env=tuple((key, value) for key, value in pairs),
    )


_new_container = container


# --- hook requests, as the proxy sends them ------------------------------------------------------


def _resources_message(resources: Resources) -> Any:
    return resource_fields.fill(hook_pb.LinuxContainerResources(), resources)


def _pod_meta(info: PodInfo) -> Any:
    return hook_pb.PodSandboxMetadata(name=info.name, uid=info.uid, namespace=info.namespace, attempt=info.attempt)


def _set_resources(request: Any, field: str, resources: Resources | None) -> None:
    if resources is not None:
        getattr(request, field).CopyFrom(_resources_message(resources))


def _set_pod(request: Any, info: PodInfo, prefix: str) -> None:
    """The pod fields of a hook request as the server reads them back (hooks/server.py
    ``_pod_info``): container requests name them ``pod_labels`` etc."""
    request.pod_meta.CopyFrom(_pod_meta(info))
    request.runtime_handler = info.runtime_handler
    request.pod_sandbox_id = info.sandbox_id
    getattr(request, prefix + "labels").update(info.labels)
    getattr(request, prefix + "annotations").update(info.annotations)
    setattr(request, prefix + "cgroup_parent", info.cgroup_parent)
    _set_resources(request, prefix + "resources", info.resources)
    _set_resources(request, prefix + "overhead", info.overhead)


def pod_request(info: PodInfo | None = None, /, **fields: Any) -> Any:
    """The PodSandboxHookRequest the proxy sends for the pod ``info`` (default: ``pod(**fields)``)."""
    if info is None:
        info = _new_pod(**fields)
    elif fields:
        raise TypeError("pod_request takes a PodInfo or pod() arguments, not both")
    request = hook_pb.PodSandboxHookRequest()
    _set_pod(request, info, "")
    return request


def container_request(info: ContainerInfo | None = None, /, *, pod: PodInfo | None = None, **fields: Any) -> Any:
    """The ContainerResourceHookRequest the proxy sends for the container ``info`` (default:
    ``container(**fields)``) of ``pod`` (default: ``pod()``).

    The environment goes both ways the proxy sends it: ``container_env_list`` (ordered, bytes)
    and Koordinator's ``container_envs`` map (bytes not valid UTF-8 replaced).
    """
    if info is None:
        info = _new_container(pod=pod, **fields)
    elif fields:
        raise TypeError("container_request takes a ContainerInfo or container() arguments, not both")
    encoded = [(key, value.encode("utf-8", "surrogateescape")) for key, value in info.env]
    request = hook_pb.ContainerResourceHookRequest(
        container_meta=hook_pb.ContainerMetadata(name=info.name, attempt=info.attempt, id=info.id),
        container_annotations=dict(info.annotations),
        container_envs={key: value.decode("utf-8", errors="replace") for key, value in encoded},
        container_env_list=[hook_pb.KeyValue(key=key, value=value) for key, value in encoded],
    )
    _set_resources(request, "container_resources", info.resources)
    _set_pod(request, pod if pod is not None else _new_pod(), "pod_")
    return request


# --- policies ------------------------------------------------------------------------------------


def policy_from(text: str, *plugins: Plugin) -> policy_mod.Policy:
    """The policy in YAML ``text`` laid over the defaults, read against ``plugins``' settings
    (none given: the built-in plugins'). PolicyError as ``runtime-hooks policy check`` says it."""
    if not plugins:
        from ..plugins import cpu, cpuset, gpu, memory, network, resctrl  # only when asked: network loads libc

        plugins = (cpu.plugin, cpuset.plugin, resctrl.plugin, memory.plugin, network.plugin, gpu.plugin)
    return policy_mod.loads_policy(text, specs=settings_specs(plugins))


# --- running a plugin ----------------------------------------------------------------------------


def _hook_point(point: HookPoint | str) -> HookPoint:
    if isinstance(point, HookPoint):
        return point
    return parse_hook_point(point.removesuffix("Hook") if point.endswith("Hook") else point)


async def run_plugin(
    plugin: Plugin | Iterable[Plugin],
    point: HookPoint | str,
    *,
    pod: PodInfo,
    container: ContainerInfo | None = None,
    cgroups: CgroupFS | FakeCgroup | None = None,
    resctrl: ResctrlFS | FakeResctrl | None = None,
    policy: policy_mod.Policy | str | None = None,
    dry_run: bool = False,
) -> RunResult:
    """Run ``point``'s handler of ``plugin`` (or of several plugins, in the server's order) once,
    as ``runtime-hooks serve`` would: a PluginRunner with a fresh metrics registry, closed after.

    * ``container``: for container hooks; left out, ``container()``. Pod hooks take none.
    * ``cgroups`` / ``resctrl``: the node handles (a fake tree stands for its ``.fs()``); None as
      on a node without them.
    * ``policy``: the policy in force: a Policy, or YAML text laid over the defaults and read
      against the plugins' settings (``"cpu:\n  BE: {cfs_burst_percent: 0}\n"``); None: the
      defaults (each plugin's own).

    Returns the RunResult: the merged ``response``, the ``applied`` plugins and the ignored
    ``failures``. A failing plugin with ``failure_policy="fail"`` raises HookCallFailed instead.
    """
    hook = _hook_point(point)
    if hook.kind is HookKind.CONTAINER:
        container = container if container is not None else _new_container()
    elif container is not None:
        raise ValueError(f"{hook.value} is a pod hook: it gets no container")
    async with plugin_runner(plugin, cgroups=cgroups, resctrl=resctrl, policy=policy, dry_run=dry_run) as runner:
        return await runner.run(hook, pod=pod, container=container)


@contextlib.asynccontextmanager
async def plugin_runner(
    plugin: Plugin | Iterable[Plugin],
    *,
    cgroups: CgroupFS | FakeCgroup | None = None,
    resctrl: ResctrlFS | FakeResctrl | None = None,
    policy: policy_mod.Policy | str | None = None,
    dry_run: bool = False,
) -> AsyncIterator[PluginRunner]:
    """The plugins run as ``runtime-hooks serve`` runs them, for several calls sharing one state
    (the arguments as for :func:`run_plugin`): ``await runner.run(point, pod=..., container=...)``
    answers a RunResult, ``runner.state_of(name)`` is a plugin's state. Closed on leaving."""
    plugins = [plugin] if isinstance(plugin, Plugin) else list(plugin)
    if isinstance(policy, str):
        policy = policy_mod.loads_policy(policy, specs=settings_specs(plugins))
    in_force = policy if policy is not None else policy_mod.DEFAULT_POLICY
    context = ServerContext(
        cgroups=cgroups.fs() if isinstance(cgroups, FakeCgroup) else cgroups,
        resctrl=resctrl.fs() if isinstance(resctrl, FakeResctrl) else resctrl,
        policy=lambda: in_force,
        dry_run=dry_run,
    )
    runner = PluginRunner(plugins, context=context, registry=CollectorRegistry(auto_describe=True))
    try:
        yield runner
    finally:
        runner.close()
