"""envstamp: a small runtime-hooks plugin that tells each container its QoS class.

* At **PreCreateContainer** it adds the environment variable ``RTPX_QOS=<class>`` (``LSE``,
  ``LSR``, ``LS``, ``BE`` or ``SYSTEM``; the variable's name is a setting) and the container
  annotations ``envstamp.example.com/qos`` and ``envstamp.example.com/qos-source`` (which rule
  decided the class). The proxy applies both before containerd creates the container.
* At **PostStartContainer** it reads the started container's CPU shares back from its cgroup
  and logs them (``envstamp: container started``, fields ``cpu_shares`` and ``stamped``, how
  many containers this server has stamped). Post hooks change nothing; this one only shows how
  a plugin reaches the node's cgroups.

**Settings** (section ``envstamp`` of the runtime-hooks policy file, one entry per QoS class)::

    envstamp:
      BE: {variable: QOS_CLASS}     # BE containers get QOS_CLASS=BE instead of RTPX_QOS=BE
      SYSTEM: {enabled: false}      # SYSTEM pods are left alone: the plugin is not called for them

**State**: a ``collections.Counter`` of stamped containers per class, made once per server
(``state=Counter``) and shared by both handlers.

Installed as the entry point ``envstamp = rtpx_plugin_envstamp:plugin`` of group
``runtimeproxy.hooks``; see ``docs/writing-a-plugin.md`` of runtimeproxy.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from runtimeproxy.hooks.sdk import (
    CgroupError,
    CgroupFS,
    ContainerInfo,
    HookPoint,
    HookResponse,
    Plugin,
    PodInfo,
    QoSClass,
    QoSResolution,
)
from structlog.typing import FilteringBoundLogger

__all__ = ["ANNOTATION", "ENV_VAR", "SOURCE_ANNOTATION", "EnvstampSettings", "__version__", "plugin"]

__version__ = "1.1.0"

ENV_VAR = "RTPX_QOS"
ANNOTATION = "envstamp.example.com/qos"
SOURCE_ANNOTATION = "envstamp.example.com/qos-source"


@dataclass(frozen=True)
class EnvstampSettings:
    """The settings of one QoS class. Plain typed fields: runtime-hooks checks the policy file
    against the type hints (``enabled: 1`` is refused, naming the file and the YAML path).

    ``enabled``: false and the plugin is not called for pods of the class.
    ``variable``: the environment variable that gets the class.
    """

    enabled: bool = True
    variable: str = ENV_VAR


plugin = Plugin(
    "envstamp",
    version=__version__,
    order=200,  # runs after plugins left at the default order (100)
    failure_policy="ignore",  # a missing stamp must never stop a pod
    timeout=0.5,
    description="sets RTPX_QOS=<QoS class> in every container and logs its cpu shares once started",
    settings=EnvstampSettings,
    state=Counter,
)


@plugin.on(HookPoint.PRE_CREATE_CONTAINER)
async def stamp(
    *,
    qos: QoSClass,
    qos_resolution: QoSResolution,
    settings: EnvstampSettings,
    state: Counter[str],
    response: HookResponse,
    **kwargs: Any,
) -> None:
    """No I/O, nothing to wait for: async def, so it runs on the server's event loop (no thread)."""
    response.env.set(settings.variable, str(qos))
    response.annotations[ANNOTATION] = str(qos)
    response.annotations[SOURCE_ANNOTATION] = qos_resolution.source
    state[str(qos)] += 1


@plugin.on(HookPoint.POST_START_CONTAINER)
def report_shares(
    *,
    pod: PodInfo,
    container: ContainerInfo,
    cgroups: CgroupFS | None,
    state: Counter[str],
    log: FilteringBoundLogger,
    **kwargs: Any,
) -> None:
    """Reads a cgroup file (blocking I/O): a plain def, which the server runs in a worker thread."""
    if cgroups is None or not container.id:
        return
    try:
        shares = cgroups.cpu_shares(pod.cgroup_parent, container_id=container.id)
    except (OSError, CgroupError, ValueError) as exc:  # cgroup gone already, or not a cgroup mount
        log.warning("envstamp: cannot read cpu shares", error=str(exc))
        return
    log.info(
        "envstamp: container started",
        cpu_shares=shares,
        cgroup_version=int(cgroups.version),
        stamped=sum(state.values()),
    )
