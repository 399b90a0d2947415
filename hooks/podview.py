"""What the plugins see of a pod: the pod as the proxy or the runtime describes it, less what
runtime-hooks does not act on (docs/security.md).

The plugin runner passes every pod through :func:`plugin_view` before its handlers see it,
in hook calls and reconcile rounds alike, so no plugin (built in or not) has to repeat these
rules:

* **A cgroup parent that is no pod cgroup under the pod roots** (``--cgroup-parent-root``,
  :class:`~runtimeproxy.hooks.cgroups.PodRoots`): the root cgroup, ``/system.slice``, a
  QoS-class cgroup... The plugins see ``""``, which they read as "cgroup unknown": they write
  no cgroup file for the pod and move none of its threads (resctrl). ``CgroupFS.write``
  refuses such a cgroup anyway; withholding it keeps plugins from reading one to act on.
* **The pod's own cpuset**, when the policy says ``trust.pod_cpuset: false``: the annotation
  ``scheduling.koordinator.sh/resource-status`` is removed from the view, so the cpuset
  plugin pins no container and the cpu plugin does not lift the CFS quota of the pinned
  classes (it does so only for a pod pinned to CPUs of its own).
* **The pod's own CPU QoS**, when the policy says ``trust.pod_cpu_qos: false``: the annotation
  ``koordinator.sh/cpuQOS`` is removed from the view, so an LS pod keeps its class's group
  identity.

The QoS class is resolved from the pod as it was sent, before this view is taken.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .cgroups import CgroupFS
    from .policy import Policy
    from .views import PodInfo

__all__ = ["CPU_QOS_ANNOTATION", "RESOURCE_STATUS_ANNOTATION", "plugin_view"]

# koordinator-sh/koordinator apis/extension: AnnotationResourceStatus = SchedulingDomainPrefix + "/resource-status".
RESOURCE_STATUS_ANNOTATION: Final = "scheduling.koordinator.sh/resource-status"
# koordinator-sh/koordinator apis/slo/v1alpha1/pod.go: AnnotationPodCPUQoS = DomainPrefix + "cpuQOS".
CPU_QOS_ANNOTATION: Final = "koordinator.sh/cpuQOS"


def plugin_view(pod: PodInfo, cgroups: CgroupFS | None, policy: Policy) -> tuple[PodInfo, tuple[str, ...]]:
    """``pod`` as the plugins may see it (see the module doc), and why each withheld part was."""
    view = pod
    reasons: list[str] = []
    if pod.cgroup_parent and cgroups is not None:
        problem = cgroups.pod_roots.problem(pod.cgroup_parent)
        if problem is not None:
            view = dataclasses.replace(view, cgroup_parent="")
            reasons.append(f"{problem}: no cgroup of this pod is written")
    withheld: list[str] = []
    if not policy.trust.pod_cpuset and RESOURCE_STATUS_ANNOTATION in pod.annotations:
        withheld.append(RESOURCE_STATUS_ANNOTATION)
        reasons.append(f"policy trust.pod_cpuset is false: {RESOURCE_STATUS_ANNOTATION} ignored, no CPUs pinned")
    if not policy.trust.pod_cpu_qos and CPU_QOS_ANNOTATION in pod.annotations:
        withheld.append(CPU_QOS_ANNOTATION)
        reasons.append(f"policy trust.pod_cpu_qos is false: {CPU_QOS_ANNOTATION} ignored, the class's group identity")
    if withheld:
        kept = {key: value for key, value in pod.annotations.items() if key not in withheld}
        view = dataclasses.replace(view, annotations=MappingProxyType(kept))
    return view, tuple(reasons)
