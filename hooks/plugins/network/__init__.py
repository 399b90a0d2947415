"""Network QoS: egress bandwidth bands (SYSTEM, LS, BE) on one interface with HTB.

The tree (policy section ``network``; ``interface: ""`` switches the plugin off)::

    root qdisc 1: htb default 10            unclassified traffic goes to SYSTEM (1:10)
    └── class 1:1   rate = ceil = link speed
        ├── class 1:10  SYSTEM  rate SYSTEM.rate_percent of the link, ceil ceil_percent, prio
        ├── class 1:20  LS      (LSE, LSR and LS pods)
        └── class 1:30  BE

**Default class: SYSTEM.** What no filter classifies is the node's own traffic (kubelet,
the container runtime, sshd, node agents) plus pods not classified yet. Node traffic is what
the SYSTEM band exists for, and sending it to BE would let batch pods starve the kubelet's
heartbeats; Koordinator makes the same choice. The cost: a pod that escapes classification
runs in the best band until the next reconcile classifies it.

**Link speed**: ``link_speed_mbit``, or ``/sys/class/net/<interface>/speed`` when it is 0.
When neither is known (virtio NICs report none) the tree is sized for
:data:`FALLBACK_LINK_MBIT` and a warning says to set ``link_speed_mbit``: an over-estimate
only means the bands take effect late, an under-estimate would throttle the node.

**How a pod's packets find their band** (two mechanisms, both always on):

1. *cgroup classid* (every pod, effective for host-network pods): the pod's cgroup in the
   cgroup v1 ``net_cls`` hierarchy gets ``net_cls.classid`` = its band's class (0x10030 is
   1:30), written on the pod directory (children created later inherit it) and on every
   directory below it. The kernel stamps the classid on the sockets of the processes in
   it. This kernel has no ``cls_cgroup`` (``tc filter ... cgroup`` fails with "TC
   classifier not found"), so the root qdisc gets a ``cls_bpf`` filter instead: a 10
   instruction program calling ``bpf_get_cgroup_classid`` that returns the classid when
   its major is 1 and its minor non-zero, and 0 (no match) otherwise. It only sees
   traffic that still carries its socket when it is queued on the interface: traffic of
   processes in the interface's own network namespace, i.e. host-network pods. Needs the
   ``net_cls`` hierarchy mounted at ``<cgroup root>/net_cls`` (before containers start:
   runc creates container cgroups only in mounted hierarchies); when it is not, the
   plugin says so once and classifies by address only.
2. *source address* (pod-network pods): hook requests carry no pod IP, so the plugin
   finds a process of the pod's sandbox container (``cgroup.procs`` of its cgroup), and
   when that process lives in another network namespace than the shaped interface, reads
   that namespace's global addresses. Each address gets a ``u32`` filter on the root
   qdisc matching the IPv4 (prio 2) or IPv6 (prio 3) source address. Routed pod traffic
   loses its socket when it leaves the pod's namespace, so mechanism 1 cannot see it.
   Limits: traffic source-NATed before the qdisc (masquerade to the node address) is
   seen with the node's address and lands in the default class; overlay traffic is
   matched on the outer header (the node's address); u32 filters are a linear list, fine
   for a node's ~100 pods.

The plugin owns filter priorities 1-3 under ``1:``; filters there that it did not make
are removed, other priorities are left alone.

**Idempotent**: every step reads what is there first. A root qdisc that is not ``htb 1:
default 10`` is replaced (which drops whatever tree hung below it); missing classes are
added, classes whose rate, ceil, prio or quantum differ are changed in place; classes it
does not plan are left alone; the cgroup filter is added once; address filters are
added, corrected or removed one by one. ``reconcile`` re-runs all of it and re-writes
pod classids, counting each repair (:attr:`NetworkQoS.drift`). ``on_stop`` leaves the
tree in place (traffic stays shaped while the daemon restarts); remove it with
:func:`teardown` or ``python -m runtimeproxy.hooks.plugins.network teardown IFACE``.

The pure planning (:func:`plan_tree`, :func:`band_rates`, :func:`explain`,
:func:`tc_commands`) does no I/O; ``runtime-hooks explain`` can show it.

Setting ``network_netns`` in the server's settings shapes an interface in that network
namespace (a name under /run/netns or a path) instead of the daemon's own; tests use it.

The modules, one job each: :mod:`.config` (the policy section), :mod:`.plan` (the tree, pure),
:mod:`.netns` (network namespaces), :mod:`.bpf` (the classid program), :mod:`.snapshot`
(reading the tree), :mod:`.tc` (changing it: :class:`Shaper`), :mod:`.pods` (net_cls classids
and pod addresses), :mod:`.state` (:class:`NetworkQoS`), :mod:`.handlers` (the plugin) and
:mod:`.cli` (``python -m``). They import what runtimeproxy.hooks may.
"""

from __future__ import annotations

from .cli import main
from .config import NETWORK_BANDS, NetworkBandSettings, NetworkConfig, NetworkSection, network_config
from .handlers import plugin
from .netns import link_speed_mbit, run_in_netns
from .plan import (
    BANDS,
    CGROUP_FILTER_NAME,
    DEFAULT_BAND,
    FALLBACK_LINK_MBIT,
    ClassPlan,
    TreePlan,
    band_classid,
    band_of,
    band_rates,
    explain,
    format_handle,
    plan_tree,
    tc_commands,
)
from .snapshot import IPFilter, TcSnapshot
from .state import NetworkQoS, teardown
from .tc import Shaper

__all__ = [
    "BANDS",
    "CGROUP_FILTER_NAME",
    "DEFAULT_BAND",
    "FALLBACK_LINK_MBIT",
    "NETWORK_BANDS",
    "ClassPlan",
    "IPFilter",
    "NetworkBandSettings",
    "NetworkConfig",
    "NetworkQoS",
    "NetworkSection",
    "Shaper",
    "TcSnapshot",
    "TreePlan",
    "band_classid",
    "band_of",
    "band_rates",
    "explain",
    "format_handle",
    "link_speed_mbit",
    "main",
    "network_config",
    "plan_tree",
    "plugin",
    "run_in_netns",
    "tc_commands",
    "teardown",
]
