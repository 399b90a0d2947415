"""envstamp: a small runtime-hooks plugin that tells each container its QoS class.

* At **PreCreateContainer** it adds the environment variable ``RTPX_QOS=<class>`` (``LSE``,
  ``LSR``, ``LS``, ``BE`` or ``SYSTEM``) and the container annotations
  ``envstamp.example.com/qos`` and ``envstamp.example.com/qos-source`` (which rule decided the
  class). The proxy applies both before containerd creates the container.
* At **PostStartContainer** it reads the started container's CPU shares back from its cgroup
  and logs them (``envstamp: container started``, field ``cpu_shares``). Post hooks change
  nothing; this one only shows how a plugin reaches the node's cgroups.

Installed as the entry point ``envstamp = rtpx_plugin_envstamp:plugin`` of group
``runtimeproxy.hooks``; see ``docs/writing-a-plugin.md`` of runtimeproxy.
"""

from __future__ import annotations

from typing import Any

from runtimeproxy.hooks.cgroups import CgroupError, CgroupFS
from runtimeproxy.hooks.qos import QoSClass, QoSResolution
from runtimeproxy.hooks.sdk import ContainerInfo, HookPoint, HookResponse, Plugin, PodInfo
from structlog.typing import FilteringBoundLogger

__all__ = ["ANNOTATION", "ENV_VAR", "SOURCE_ANNOTATION", "__version__", "plugin"]

__version__ = "1.0.0"

ENV_VAR = "RTPX_QOS"
ANNOTATION = "envstamp.example.com/qos"
SOURCE_ANNOTATION = "envstamp.example.com/qos-source"

plugin = Plugin(
    "envstamp",
    version=__version__,
    order=200,  # runs after plugins left at the default order (100)
    failure_policy="ignore",  # a missing stamp must never stop a pod
    timeout=0.5,
    description=f"sets {ENV_VAR}=<QoS class> in every container and logs its cpu shares once started",
)


@plugin.on(HookPoint.PRE_CREATE_CONTAINER)
async def stamp(*, qos: QoSClass, qos_resolution: QoSResolution, response: HookResponse, **kwargs: Any) -> None:
    """No I/O, nothing to wait for: async def, so it runs on the server's event loop (no thread)."""
    response.env.set(ENV_VAR, str(qos))
    response.annotations[ANNOTATION] = str(qos)
    response.annotations[SOURCE_ANNOTATION] = qos_resolution.source


@plugin.on(HookPoint.POST_START_CONTAINER)
def report_shares(
    *, pod: PodInfo, container: ContainerInfo, cgroups: CgroupFS | None, log: FilteringBoundLogger, **kwargs: Any
) -> None:
    """Reads a cgroup file (blocking I/O): a plain def, which the server runs in a worker thread."""
    if cgroups is None or not container.id:
        return
    try:
        shares = cgroups.cpu_shares(pod.cgroup_parent, container_id=container.id)
    except (OSError, CgroupError, ValueError) as exc:  # cgroup gone already, or not a cgroup mount
        log.warning("envstamp: cannot read cpu shares", error=str(exc))
        return
    log.info("envstamp: container started", cpu_shares=shares, cgroup_version=int(cgroups.version))
