"""What kubelet would send to the runtime for one Pod, computed without I/O.

Everything here is a pure function of the ``V1Pod`` (as returned by
:func:`runtimeproxy.kubelet_model.manifest.load_pod`) plus a few node facts that the
caller passes in: machine memory (read from ``/proc/meminfo`` only when not
given), the pod log root, the cgroup driver and the runtime handler.

The formulas follow kubelet (checked against kubernetes/kubernetes); the resource
arithmetic has modules of its own: requests and limits in
:mod:`runtimeproxy.kubelet_model.pod_resources`, the QoS class in :mod:`runtimeproxy.kubelet_model.kube_qos`,
shares, quota, memory limit and oom_score_adj in :mod:`runtimeproxy.kubelet_model.cri_resources`.
Here:

* cgroup parent: ``pkg/kubelet/cm/pod_container_manager_linux.go`` and
  ``cgroup_manager_linux.go`` (cgroupfs and systemd names).
* sandbox config, labels, annotations: ``pkg/kubelet/kuberuntime/
  kuberuntime_sandbox.go``, ``labels.go``, ``security_context.go``.

* volumes (hostPath, configMap, emptyDir): :mod:`runtimeproxy.kubelet_model.volumes`;
  environment from the downward API (``fieldRef``) and ConfigMap keys as
  ``pkg/kubelet/kubelet_pods.go`` makeEnvironmentVariables resolves them.

Accepted and left to others, as on a node: probes (kubelet runs them itself, never
through CRI; play runs none), ``priorityClassName``, tolerations, node selectors and
affinity (scheduling).

Not modelled (kubelet does these, play does not): hugepage limits, swap
settings (``memory_swap_limit_in_bytes`` / ``unified``), the managed
``/etc/hosts`` and ``/dev/termination-log`` mounts, volumes other than
hostPath, configMap and emptyDir, fsGroup ownership of volumes,
service-link environment variables, DNS other than
``dnsPolicy: None`` (without a DNSConfig the runtime copies the node's
resolv.conf), AppArmor, SELinux, user namespaces and device plugins.  The
``io.kubernetes.container.hash`` annotation is our own hash of the same
fields, not kubelet's value.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kubernetes.client import ApiClient

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.hookapi.merge_rules import CgroupForm
from runtimeproxy.kubelet_model.cri_resources import (
    LinuxResources,
    container_resources,
    read_machine_memory,
    sandbox_overhead,
    sandbox_resources,
)
from runtimeproxy.kubelet_model.kube_qos import KubeQoSClass, pod_qos_class
from runtimeproxy.kubelet_model.manifest import ConfigMap
from runtimeproxy.kubelet_model.pod_resources import is_sidecar, pod_containers, pod_init_containers
from runtimeproxy.kubelet_model.volumes import (
    DEFAULT_KUBELET_ROOT,
    PodSetupError,
    VolumePlan,
    plan_volumes,
    pod_directory,
)

__all__ = [
    "CONTAINER_NAME_LABEL",
    "DEFAULT_MASKED_PATHS",
    "DEFAULT_READONLY_PATHS",
    "POD_NAMESPACE_LABEL",
    "POD_NAME_LABEL",
    "POD_UID_LABEL",
    "CgroupDriver",
    "ContainerPlan",
    "NodeFacts",
    "PodPlan",
    "build_plan",
    "container_annotations",
    "container_labels",
    "expand_vars",
    "pod_cgroup_parent",
    "pod_identity_labels",
    "pod_log_directory",
    "pod_sandbox_annotations",
    "pod_sandbox_labels",
]

POD_NAME_LABEL = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
POD_UID_LABEL = "io.kubernetes.pod.uid"
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"

CONTAINER_HASH_ANNOTATION = "io.kubernetes.container.hash"
CONTAINER_RESTART_COUNT_ANNOTATION = "io.kubernetes.container.restartCount"
CONTAINER_TERMINATION_MESSAGE_PATH_ANNOTATION = "io.kubernetes.container.terminationMessagePath"
CONTAINER_TERMINATION_MESSAGE_POLICY_ANNOTATION = "io.kubernetes.container.terminationMessagePolicy"
CONTAINER_PORTS_ANNOTATION = "io.kubernetes.container.ports"
CONTAINER_PRESTOP_ANNOTATION = "io.kubernetes.container.preStopHandler"
CONTAINER_TYPE_ANNOTATION = "io.kubernetes.container.type"
POD_TERMINATION_GRACE_PERIOD_ANNOTATION = "io.kubernetes.pod.terminationGracePeriod"

# API defaults (pkg/apis/core/v1/defaults.go)
DEFAULT_TERMINATION_GRACE_PERIOD = 30
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
DEFAULT_TERMINATION_MESSAGE_POLICY = "File"

# pkg/securitycontext/util.go: what a container gets unless procMount is Unmasked.
DEFAULT_MASKED_PATHS: tuple[str, ...] = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
DEFAULT_READONLY_PATHS: tuple[str, ...] = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)

_MOUNT_PROPAGATION = {
    None: cri.PROPAGATION_PRIVATE,
    "None": cri.PROPAGATION_PRIVATE,
    "HostToContainer": cri.PROPAGATION_HOST_TO_CONTAINER,
    "Bidirectional": cri.PROPAGATION_BIDIRECTIONAL,
}
_PROTOCOLS = {"TCP": cri.TCP, "UDP": cri.UDP, "SCTP": cri.SCTP}

_ENV_VALUE_IS_BYTES = (
    cri.KeyValue.DESCRIPTOR.fields_by_name["value"].type == cri.KeyValue.DESCRIPTOR.fields_by_name["value"].TYPE_BYTES
)
_API: Any = ApiClient()

CgroupDriver = CgroupForm  # kubelet's --cgroup-driver is the form of the cgroup names it makes
ContainerKind = Literal["init", "sidecar", "container"]


def _spec(pod: Any) -> Any:
    return pod.spec


# --------------------------------------------------------------------------
# cgroup parent


def pod_cgroup_parent(qos: KubeQoSClass, uid: str, driver: CgroupDriver = "cgroupfs", cgroup_root: str = "/") -> str:
    """The pod cgroup that kubelet passes as ``LinuxPodSandboxConfig.cgroup_parent``.

    cgroupfs: ``/kubepods/pod<uid>`` (Guaranteed), ``/kubepods/burstable/pod<uid>``,
    ``/kubepods/besteffort/pod<uid>``.  systemd: the same names turned into
    nested slices, e.g. ``/kubepods.slice/kubepods-burstable.slice/
    kubepods-burstable-pod<uid with _ for ->.slice``.  ``cgroup_root`` is
    kubelet's ``--cgroup-root`` (default ``/``), put in front of ``kubepods``.
    """
    parts = [part for part in cgroup_root.split("/") if part]
    parts.append("kubepods")
    if qos is not KubeQoSClass.GUARANTEED:
        parts.append(qos.value.lower())
    parts.append(f"pod{uid}")
    if driver == "cgroupfs":
        return "/" + "/".join(parts)
    if driver != "systemd":
        raise ValueError(f"unknown cgroup driver {driver!r} (expected cgroupfs or systemd)")
    escaped = [part.replace("-", "_") for part in parts]
    slices = ["-".join(escaped[: index + 1]) + ".slice" for index in range(len(escaped))]
    return "/" + "/".join(slices)


# --------------------------------------------------------------------------
# labels, annotations, names


def pod_sandbox_labels(pod: Any) -> dict[str, str]:
    """newPodLabels: the pod's labels plus pod name, namespace and uid."""
    meta = pod.metadata
    labels = dict(meta.labels or {})
    labels[POD_NAME_LABEL] = meta.name
    labels[POD_NAMESPACE_LABEL] = meta.namespace
    labels[POD_UID_LABEL] = meta.uid
    return labels


def pod_sandbox_annotations(pod: Any) -> dict[str, str]:
    """newPodAnnotations: the pod's annotations as they are."""
    return dict(pod.metadata.annotations or {})


def container_labels(pod: Any, container: Any) -> dict[str, str]:
    """newContainerLabels: pod name, namespace, uid and container name."""
    meta = pod.metadata
    return {
        POD_NAME_LABEL: meta.name,
        POD_NAMESPACE_LABEL: meta.namespace,
        POD_UID_LABEL: meta.uid,
        CONTAINER_NAME_LABEL: container.name,
    }


def container_hash(container: Any) -> str:
    """A hex FNV-1a 32-bit hash of the container's name and image.

    kubelet hashes the same two fields, but through Go's spew printer, so
    the value differs from kubelet's; it only serves to mark the container.
    """
    data = json.dumps({"image": container.image, "name": container.name}, sort_keys=True).encode()
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return format(value, "x")


def container_annotations(
    pod: Any, container: Any, *, restart_count: int = 0, kind: ContainerKind = "container"
) -> dict[str, str]:
    """newContainerAnnotations (without device plugin annotations)."""
    grace = _spec(pod).termination_grace_period_seconds
    annotations = {
        CONTAINER_HASH_ANNOTATION: container_hash(container),
        CONTAINER_RESTART_COUNT_ANNOTATION: str(restart_count),
        CONTAINER_TERMINATION_MESSAGE_PATH_ANNOTATION: container.termination_message_path
        or DEFAULT_TERMINATION_MESSAGE_PATH,
        CONTAINER_TERMINATION_MESSAGE_POLICY_ANNOTATION: container.termination_message_policy
        or DEFAULT_TERMINATION_MESSAGE_POLICY,
        POD_TERMINATION_GRACE_PERIOD_ANNOTATION: str(DEFAULT_TERMINATION_GRACE_PERIOD if grace is None else grace),
        CONTAINER_TYPE_ANNOTATION: "container" if kind == "container" else "init",
    }
    lifecycle = container.lifecycle
    if lifecycle is not None and lifecycle.pre_stop is not None:
        annotations[CONTAINER_PRESTOP_ANNOTATION] = _to_json(lifecycle.pre_stop)
    if container.ports:
        ports = []
        for port in container.ports:
            body = _API.sanitize_for_serialization(port)
            body.setdefault("protocol", "TCP")
            ports.append(body)
        annotations[CONTAINER_PORTS_ANNOTATION] = json.dumps(ports, separators=(",", ":"))
    return annotations


def _to_json(model: Any) -> str:
    return json.dumps(_API.sanitize_for_serialization(model), separators=(",", ":"))


def pod_log_directory(base: str, namespace: str, name: str, uid: str) -> str:
    """BuildPodLogsDirectory: ``<base>/<namespace>_<name>_<uid>``."""
    return posixpath.join(base, f"{namespace}_{name}_{uid}")


def _pod_hostname(pod: Any) -> str:
    """GeneratePodHostNameAndDomain: spec.hostname or the pod name, cut to 63."""
    hostname = _spec(pod).hostname or pod.metadata.name
    if len(hostname) > 63:
        hostname = hostname[:63].rstrip("-.")
    return str(hostname)


def expand_vars(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes ``$(VAR)`` expansion.

    ``$(NAME)`` becomes the variable's value when it is defined and stays as
    written otherwise; ``$$`` stands for a literal ``$``; any other ``$`` is
    kept.
    """
    out: list[str] = []
    index = 0
    length = len(text)
    while index < length:
        char = text[index]
        if char != "$" or index + 1 >= length:
            out.append(char)
            index += 1
            continue
        following = text[index + 1]
        if following == "$":
            out.append("$")
            index += 2
        elif following == "(":
            close = text.find(")", index + 2)
            if close < 0:
                out.append("$(")
                index += 2
                continue
            name = text[index + 2 : close]
            value = lookup(name)
            out.append(f"$({name})" if value is None else value)
            index = close + 1
        else:
            out.append("$" + following)
            index += 2
    return "".join(out)


@dataclass(frozen=True)
class NodeFacts:
    """What kubelet knows of its node and the API objects a pod refers to."""

    node_name: str = ""
    node_ip: str = ""
    config_maps: Mapping[str, ConfigMap] = field(default_factory=dict)


def _field_value(pod: Any, path: str, node: NodeFacts) -> str:
    """A downward API field as kubelet's podFieldSelectorRuntimeValue gives it."""
    meta = pod.metadata
    for prefix, values in (("metadata.labels", meta.labels), ("metadata.annotations", meta.annotations)):
        if path.startswith(f"{prefix}['"):
            return str((values or {}).get(path[len(prefix) + 2 : -2], ""))
    simple = {
        "metadata.name": meta.name,
        "metadata.namespace": meta.namespace,
        "metadata.uid": meta.uid,
        "spec.nodeName": _spec(pod).node_name or node.node_name,
        "spec.serviceAccountName": _spec(pod).service_account_name or "",
    }
    if path in simple:
        return str(simple[path])
    if path.startswith(("status.hostIP", "status.podIP")):  # podIP: hostNetwork only (checked)
        if not node.node_ip:
            raise PodSetupError(f"{path} needs the node's address (--node-ip)")
        return node.node_ip
    raise PodSetupError(f"field {path!r} is not supported by play")


def _env_source_value(pod: Any, source: Any, node: NodeFacts) -> str | None:
    """The value of a valueFrom (None: an optional ConfigMap key that is missing)."""
    if source.field_ref is not None:
        return _field_value(pod, source.field_ref.field_path, node)
    ref = source.config_map_key_ref
    config_map = node.config_maps.get(ref.name)
    data = None if config_map is None else config_map.files.get(ref.key)
    if data is None:
        if ref.optional:
            return None
        raise PodSetupError(f"environment: configmap {ref.name!r} key {ref.key!r} not found")
    return data.decode("utf-8", errors="replace")


def _container_env(pod: Any, container: Any, node: NodeFacts) -> list[tuple[str, str]]:
    """Environment in declaration order; a repeated name keeps its first
    position and its last value; values may refer to earlier variables."""
    values: dict[str, str] = {}
    for env in container.env or []:
        if env.value_from is not None:
            value = _env_source_value(pod, env.value_from, node)
            if value is not None:
                values[env.name] = value
            continue
        values[env.name] = expand_vars(env.value or "", values.get)
    return list(values.items())


# --------------------------------------------------------------------------
# security and namespaces


def _namespace_options(pod: Any) -> cri.NamespaceOption:
    spec = _spec(pod)
    if spec.host_pid:
        pid = cri.NODE
    elif spec.share_process_namespace:
        pid = cri.POD
    else:
        pid = cri.CONTAINER
    return cri.NamespaceOption(
        network=cri.NODE if spec.host_network else cri.POD,
        pid=pid,
        ipc=cri.NODE if spec.host_ipc else cri.POD,
    )


def _seccomp(profile: Any) -> cri.SecurityProfile:
    kind = getattr(profile, "type", None) if profile is not None else None
    if kind == "RuntimeDefault":
        return cri.SecurityProfile(profile_type=cri.SecurityProfile.RuntimeDefault)
    if kind == "Localhost":
        ref = posixpath.join("/var/lib/kubelet/seccomp", profile.localhost_profile or "")
        return cri.SecurityProfile(profile_type=cri.SecurityProfile.Localhost, localhost_ref=ref)
    return cri.SecurityProfile(profile_type=cri.SecurityProfile.Unconfined)


def _supplemental_groups(pod_sc: Any) -> list[int]:
    if pod_sc is None:
        return []
    groups = list(pod_sc.supplemental_groups or [])
    if pod_sc.fs_group is not None:
        groups.append(pod_sc.fs_group)
    return groups


def _sandbox_security_context(pod: Any) -> cri.LinuxSandboxSecurityContext:
    pod_sc = _spec(pod).security_context
    context = cri.LinuxSandboxSecurityContext(
        namespace_options=_namespace_options(pod),
        privileged=any(
            c.security_context is not None and bool(c.security_context.privileged)
            for c in pod_init_containers(pod) + pod_containers(pod)
        ),
        supplemental_groups=_supplemental_groups(pod_sc),
        seccomp=_seccomp(pod_sc.seccomp_profile if pod_sc is not None else None),
    )
    if pod_sc is not None and pod_sc.run_as_user is not None:
        context.run_as_user.value = pod_sc.run_as_user
    if pod_sc is not None and pod_sc.run_as_group is not None:
        context.run_as_group.value = pod_sc.run_as_group
    return context


def _container_security_context(pod: Any, container: Any) -> cri.LinuxContainerSecurityContext:
    pod_sc = _spec(pod).security_context
    sc = container.security_context

    def pick(attr: str) -> Any:
        own = getattr(sc, attr, None) if sc is not None else None
        if own is not None:
            return own
        return getattr(pod_sc, attr, None) if pod_sc is not None else None

    unmasked = sc is not None and sc.proc_mount == "Unmasked"
    context = cri.LinuxContainerSecurityContext(
        namespace_options=_namespace_options(pod),
        privileged=bool(sc is not None and sc.privileged),
        readonly_rootfs=bool(sc is not None and sc.read_only_root_filesystem),
        no_new_privs=bool(sc is not None and sc.allow_privilege_escalation is False),
        supplemental_groups=_supplemental_groups(pod_sc),
        masked_paths=[] if unmasked else list(DEFAULT_MASKED_PATHS),
        readonly_paths=[] if unmasked else list(DEFAULT_READONLY_PATHS),
        seccomp=_seccomp(pick("seccomp_profile")),
    )
    if sc is not None and sc.capabilities is not None:
        context.capabilities.add_capabilities.extend(sc.capabilities.add or [])
        context.capabilities.drop_capabilities.extend(sc.capabilities.drop or [])
    run_as_user = pick("run_as_user")
    if run_as_user is not None:
        context.run_as_user.value = run_as_user
    run_as_group = pick("run_as_group")
    if run_as_group is not None:
        context.run_as_group.value = run_as_group
    return context


# --------------------------------------------------------------------------
# the plan


@dataclass(frozen=True)
class ContainerPlan:
    """One container to create: ``request`` is a template whose
    ``pod_sandbox_id`` is filled by :meth:`for_sandbox`."""

    name: str
    image: str
    kind: ContainerKind
    request: cri.CreateContainerRequest

    @property
    def config(self) -> cri.ContainerConfig:
        return self.request.config

    def for_sandbox(self, pod_sandbox_id: str, image_ref: str | None = None) -> cri.CreateContainerRequest:
        """A copy of the template for the given sandbox.

        ``image_ref`` (the image id from ImageStatus/PullImage) replaces the
        image name the way kubelet does; ``user_specified_image`` keeps the
        name from the manifest.
        """
        request = cri.CreateContainerRequest()
        request.CopyFrom(self.request)
        request.pod_sandbox_id = pod_sandbox_id
        if image_ref:
            request.config.image.image = image_ref
        return request


@dataclass(frozen=True)
class PodPlan:
    """Everything ``play`` sends for one Pod, in kubelet's order."""

    name: str
    namespace: str
    uid: str
    qos_class: KubeQoSClass
    cgroup_parent: str
    log_directory: str
    machine_memory: int
    termination_grace_period: int
    sandbox_request: cri.RunPodSandboxRequest
    containers: tuple[ContainerPlan, ...] = field(default_factory=tuple)
    volumes: tuple[VolumePlan, ...] = field(default_factory=tuple)
    # kubelet's <root>/pods/<uid>: the configMap and emptyDir volumes live below it.
    pod_directory: str = ""

    @property
    def sandbox_config(self) -> cri.PodSandboxConfig:
        return self.sandbox_request.config

    @property
    def images(self) -> list[str]:
        """Distinct images in first-use order."""
        return list(dict.fromkeys(container.image for container in self.containers))

    def container(self, name: str) -> ContainerPlan:
        for container in self.containers:
            if container.name == name:
                return container
        raise KeyError(name)

    def summary(self) -> dict[str, Any]:
        """A JSON-ready description (used by ``--output json``)."""
        return {
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
            "qos_class": self.qos_class.value,
            "cgroup_parent": self.cgroup_parent,
            "log_directory": self.log_directory,
            "containers": [
                {
                    "name": c.name,
                    "image": c.image,
                    "kind": c.kind,
                    **{name: getattr(c.config.linux.resources, name) for name in LinuxResources.field_names()},
                }
                for c in self.containers
            ],
        }


def _port_mappings(containers: Iterable[Any]) -> list[cri.PortMapping]:
    mappings = []
    for container in containers:
        for port in container.ports or []:
            mappings.append(
                cri.PortMapping(
                    protocol=_PROTOCOLS.get(port.protocol or "TCP", cri.TCP),
                    container_port=port.container_port or 0,
                    host_port=port.host_port or 0,
                    host_ip=port.host_ip or "",
                )
            )
    return mappings


def _dns_config(pod: Any) -> cri.DNSConfig | None:
    """Only for dnsPolicy None: every other policy needs the node's or the
    cluster's resolver, and without a DNSConfig the runtime copies the
    node's /etc/resolv.conf (the Default policy)."""
    spec = _spec(pod)
    config = spec.dns_config
    if spec.dns_policy != "None" or config is None:
        return None
    options = []
    for option in config.options or []:
        options.append(option.name if option.value is None else f"{option.name}:{option.value}")
    return cri.DNSConfig(
        servers=list(config.nameservers or []),
        searches=list(config.searches or []),
        options=options,
    )


def _mounts(container: Any, volumes: Mapping[str, VolumePlan]) -> list[cri.Mount]:
    mounts = []
    for mount in container.volume_mounts or []:
        volume = volumes[mount.name]
        host_path = volume.path
        if mount.sub_path:
            host_path = posixpath.join(host_path, mount.sub_path)
        mounts.append(
            cri.Mount(
                container_path=mount.mount_path,
                host_path=host_path,
                readonly=bool(mount.read_only) or volume.read_only,
                propagation=_MOUNT_PROPAGATION.get(mount.mount_propagation, cri.PROPAGATION_PRIVATE),
            )
        )
    return mounts


def _key_value(key: str, value: str) -> cri.KeyValue:
    # Upstream declares KeyValue.value a string; our generated module may carry
    # it as bytes (the wire format is the same).  Follow whatever it says.
    message = cri.KeyValue(key=key)
    setattr(message, "value", value.encode() if _ENV_VALUE_IS_BYTES else value)  # noqa: B010
    return message


def _container_config(
    pod: Any,
    container: Any,
    kind: ContainerKind,
    resources: LinuxResources,
    attempt: int,
    volumes: Mapping[str, VolumePlan],
    node: NodeFacts,
) -> cri.ContainerConfig:
    env = _container_env(pod, container, node)
    env_map = dict(env)
    command = [expand_vars(arg, env_map.get) for arg in container.command or []]
    args = [expand_vars(arg, env_map.get) for arg in container.args or []]
    return cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=container.name, attempt=attempt),
        image=cri.ImageSpec(image=container.image, user_specified_image=container.image),
        command=command,
        args=args,
        working_dir=container.working_dir or "",
        envs=[_key_value(key, value) for key, value in env],
        mounts=_mounts(container, volumes),
        labels=container_labels(pod, container),
        annotations=container_annotations(pod, container, restart_count=attempt, kind=kind),
        log_path=posixpath.join(container.name, f"{attempt}.log"),
        stdin=bool(container.stdin),
        stdin_once=bool(container.stdin_once),
        tty=bool(container.tty),
        linux=cri.LinuxContainerConfig(
            resources=resources.to_proto(),
            security_context=_container_security_context(pod, container),
        ),
    )


def build_plan(
    pod: Any,
    *,
    log_dir_base: str,
    machine_memory: int | None = None,
    meminfo_path: str = "/proc/meminfo",
    cgroup_driver: CgroupDriver = "cgroupfs",
    cgroup_root: str = "/",
    runtime_handler: str = "",
    cpu_cfs_quota: bool = True,
    attempt: int = 0,
    kubelet_root: str = DEFAULT_KUBELET_ROOT,
    node: NodeFacts | None = None,
) -> PodPlan:
    """Compute the RunPodSandbox request and the CreateContainer templates.

    ``log_dir_base`` replaces kubelet's ``/var/log/pods``; ``cgroup_root``
    is kubelet's ``--cgroup-root``; ``kubelet_root`` its ``--root-dir`` (where
    the pod's configMap and emptyDir volumes go).  Machine memory
    is read from ``meminfo_path`` only when ``machine_memory`` is None.
    ``node`` names the node and holds the ConfigMaps the pod refers to; a volume
    or variable that cannot be resolved raises :class:`PodSetupError`.
    """
    node = node or NodeFacts()
    volumes = plan_volumes(pod, kubelet_root, node.config_maps)
    by_name = {volume.name: volume for volume in volumes}
    if machine_memory is None:
        machine_memory = read_machine_memory(meminfo_path)
    meta = pod.metadata
    spec = _spec(pod)
    qos = pod_qos_class(pod)
    cgroup_parent = pod_cgroup_parent(qos, meta.uid, cgroup_driver, cgroup_root)
    log_directory = pod_log_directory(os.fspath(log_dir_base), meta.namespace, meta.name, meta.uid)

    linux = cri.LinuxPodSandboxConfig(
        cgroup_parent=cgroup_parent,
        security_context=_sandbox_security_context(pod),
        sysctls={
            sysctl.name: sysctl.value
            for sysctl in (spec.security_context.sysctls or [] if spec.security_context else [])
        },
        overhead=sandbox_overhead(pod, cpu_cfs_quota=cpu_cfs_quota).to_proto(),
        resources=sandbox_resources(pod, cpu_cfs_quota=cpu_cfs_quota).to_proto(),
    )
    config = cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=meta.name, uid=meta.uid, namespace=meta.namespace, attempt=attempt),
        hostname="" if spec.host_network else _pod_hostname(pod),
        log_directory=log_directory,
        port_mappings=_port_mappings(pod_init_containers(pod) + pod_containers(pod)),
        labels=pod_sandbox_labels(pod),
        annotations=pod_sandbox_annotations(pod),
        linux=linux,
    )
    dns = _dns_config(pod)
    if dns is not None:
        config.dns_config.CopyFrom(dns)
    sandbox_request = cri.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler)

    ordered: list[tuple[Any, ContainerKind]] = [
        (c, "sidecar" if is_sidecar(c) else "init") for c in pod_init_containers(pod)
    ]
    ordered += [(c, "container") for c in pod_containers(pod)]
    plans = []
    for container, kind in ordered:
        resources = container_resources(pod, container, machine_memory, qos=qos, cpu_cfs_quota=cpu_cfs_quota)
        container_config = _container_config(pod, container, kind, resources, 0, by_name, node)
        if runtime_handler:
            container_config.image.runtime_handler = runtime_handler
        request = cri.CreateContainerRequest(pod_sandbox_id="", config=container_config, sandbox_config=config)
        plans.append(ContainerPlan(name=container.name, image=container.image, kind=kind, request=request))

    grace = spec.termination_grace_period_seconds
    return PodPlan(
        name=meta.name,
        namespace=meta.namespace,
        uid=meta.uid,
        qos_class=qos,
        cgroup_parent=cgroup_parent,
        log_directory=log_directory,
        machine_memory=machine_memory,
        termination_grace_period=DEFAULT_TERMINATION_GRACE_PERIOD if grace is None else int(grace),
        sandbox_request=sandbox_request,
        containers=tuple(plans),
        volumes=volumes,
        pod_directory=pod_directory(kubelet_root, meta.uid),
    )


def pod_identity_labels(uid: str) -> dict[str, str]:
    """The label selector that finds a pod's sandboxes (used by delete)."""
    return {POD_UID_LABEL: uid}
