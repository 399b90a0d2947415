"""Test helpers for runtime-hooks plugin authors: fake kernel interfaces that behave like the real
ones, builders for what a handler gets, and a one-call plugin runner.

* :mod:`runtimeproxy.hooks.testkit.fake_cgroups` -- fake cgroup v1 / v2 trees
  (:func:`make_fake_cgroup_v1`, :func:`make_fake_cgroup_v2`, :class:`FakeCgroup`).
* :mod:`runtimeproxy.hooks.testkit.fake_resctrl` -- a fake resctrl mount (:func:`make_fake_resctrl`).
* :mod:`runtimeproxy.hooks.testkit.builders` -- :func:`pod`, :func:`container` (PodInfo /
  ContainerInfo with defaults), :func:`pod_request`, :func:`container_request` (the hook
  requests the proxy sends), :func:`policy_from` (a policy from YAML text, read against the
  plugins' settings; a bad one raises :class:`PolicyError`), :func:`run_plugin` (one hook call,
  as the server makes it) and :func:`plugin_runner` (several calls sharing the plugins' state).
* :mod:`runtimeproxy.hooks.testkit.serving` -- :func:`hook_server`: the plugins served over gRPC
  on a socket of their own, for wire-level tests.
* :mod:`runtimeproxy.hooks.testkit.fixtures` -- pytest fixtures ``fake_cgroup_v1``,
  ``fake_cgroup_v2``, ``fake_cgroup`` (v1/v2 x cgroupfs/systemd) and ``fake_resctrl``; load with
  ``pytest_plugins = ["runtimeproxy.hooks.testkit.fixtures"]`` in a root ``conftest.py`` or test module.
* :mod:`runtimeproxy.hooks.testkit.attach` -- :func:`attach_fake_resctrl`: a ``runtime-hooks``
  subprocess drives a fake resctrl tree made by the test as it would the kernel.

Everything listed in ``__all__`` can be imported from here. Nothing here imports pytest
(except the fixtures module). Follows the imports of runtimeproxy.hooks: importing the test kit
loads nothing of the proxy (relay, hook layer, daemon).
"""

from __future__ import annotations

from ..policy import PolicyError
from .attach import attach_fake_resctrl, attached_fake_resctrl, detach_fake_resctrl
from .builders import (
    DEFAULT_UID,
    container,
    container_request,
    kube_qos_of,
    kubelet_cgroup_parent,
    plugin_runner,
    pod,
    pod_request,
    policy_from,
    run_plugin,
)
from .fake_cgroups import FakeCgroup, make_fake_cgroup_v1, make_fake_cgroup_v2
from .fake_resctrl import FakeKernelError, FakeResctrl, make_fake_resctrl
from .serving import ServedHooks, hook_server

__all__ = [
    "DEFAULT_UID",
    "FakeCgroup",
    "FakeKernelError",
    "FakeResctrl",
    "PolicyError",
    "ServedHooks",
    "attach_fake_resctrl",
    "attached_fake_resctrl",
    "container",
    "container_request",
    "detach_fake_resctrl",
    "hook_server",
    "kube_qos_of",
    "kubelet_cgroup_parent",
    "make_fake_cgroup_v1",
    "make_fake_cgroup_v2",
    "make_fake_resctrl",
    "plugin_runner",
    "pod",
    "pod_request",
    "policy_from",
    "run_plugin",
]
