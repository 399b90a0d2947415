"""Tests of the envstamp plugin, with the runtimeproxy hooks test kit: fake cgroup trees instead of
/sys/fs/cgroup (the ``fake_cgroup*`` fixtures), pods and containers built with defaults
(``pod``, ``container``), and the plugin run by the PluginRunner that ``runtime-hooks serve``
uses (``run_plugin``, ``plugin_runner``) or, in one test, by the gRPC server itself (``hook_server``)."""

from __future__ import annotations

from typing import Any

import pytest
from rtpx_plugin_envstamp import ANNOTATION, ENV_VAR, SOURCE_ANNOTATION, plugin
from runtimeproxy.hooks.sdk import CgroupVersion, HookPoint, discover_plugins, shares_to_weight, weight_to_shares
from runtimeproxy.hooks.testkit import (
    FakeCgroup,
    PolicyError,
    container,
    container_request,
    hook_server,
    plugin_runner,
    pod,
    run_plugin,
)
from structlog.testing import capture_logs

# The test kit's fixtures: fake_cgroup (v1 and v2, cgroupfs and systemd), fake_cgroup_v1,
# fake_cgroup_v2, fake_resctrl.
pytest_plugins = ["runtimeproxy.hooks.testkit.fixtures"]

CREATE = HookPoint.PRE_CREATE_CONTAINER
STARTED = HookPoint.POST_START_CONTAINER
CONTAINER_ID = "4f9d0c2b7e1a"


# --- the package ---------------------------------------------------------------------------------


def test_the_plugin_is_installed_as_an_entry_point() -> None:
    discovery = discover_plugins()
    assert [f for f in discovery.failures if f.name == "envstamp"] == []
    [found] = [p for p in discovery.plugins if p.name == "envstamp"]
    assert found is plugin
    assert found.describe()["hooks"] == ["PreCreateContainer", "PostStartContainer"]
    assert found.failure_policy == "ignore"
    assert found.describe()["settings"] == ["LSE", "LSR", "LS", "BE", "SYSTEM"]  # its policy section's keys


# --- PreCreateContainer: the stamp -------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod_fields", "qos", "source"),
    [
        ({"kube_qos": "besteffort"}, "BE", "kubernetes-cgroup-parent"),  # /kubepods/besteffort/pod<uid>
        ({"kube_qos": "burstable"}, "LS", "kubernetes-cgroup-parent"),
        ({"kube_qos": "guaranteed"}, "LSR", "kubernetes-cgroup-parent"),
        ({"qos": "LSE"}, "LSE", "koordinator-label"),  # labelled koordinator.sh/qosClass=LSE
    ],
)
async def test_the_container_gets_its_qos_class(pod_fields: dict[str, Any], qos: str, source: str) -> None:
    result = await run_plugin(plugin, CREATE, pod=pod(**pod_fields), container=container("app"))
    assert result.applied == ["envstamp"] and result.failures == []
    assert result.response.env.items() == [(ENV_VAR, qos)]
    assert result.response.annotations == {ANNOTATION: qos, SOURCE_ANNOTATION: source}
    assert result.response.resources.is_empty() and result.response.problems() == []


async def test_the_stamp_replaces_a_value_the_container_already_has() -> None:
    app = container(env={ENV_VAR: "forged", "A": "1"})
    result = await run_plugin(plugin, CREATE, pod=pod(kube_qos="besteffort"), container=app)
    assert result.response.env.items() == [(ENV_VAR, "BE")]  # the proxy sets it in place; A is untouched


async def test_through_the_hook_server() -> None:
    """The same call over gRPC, as the proxy makes it: what goes back on the wire."""
    async with hook_server(plugin) as served:
        request = container_request(pod=pod(kube_qos="burstable"))  # the request the proxy sends
        reply = await served.call("PreCreateContainerHook", request)
        # A hook point no plugin handles is not registered; called anyway, it answers "no change".
        unhandled = await served.call("PreStartContainerHook", request)
        assert served.hook_points == {HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER}
    assert [(kv.key, kv.value) for kv in reply.container_env_list] == [(ENV_VAR, b"LS")]
    assert dict(reply.container_annotations) == {ANNOTATION: "LS", SOURCE_ANNOTATION: "kubernetes-cgroup-parent"}
    assert not reply.HasField("container_resources")
    assert unhandled == type(unhandled)()


# --- settings and state ------------------------------------------------------------------------

POLICY = "envstamp:\n  BE: {variable: QOS_CLASS}\n  SYSTEM: {enabled: false}\n"


async def test_the_policy_file_sets_the_variable_per_class() -> None:
    be = await run_plugin(plugin, CREATE, pod=pod(kube_qos="besteffort"), policy=POLICY)
    ls = await run_plugin(plugin, CREATE, pod=pod(kube_qos="burstable"), policy=POLICY)
    assert be.response.env.items() == [("QOS_CLASS", "BE")]
    assert ls.response.env.items() == [(ENV_VAR, "LS")]  # not in the file: the default


async def test_a_class_switched_off_is_not_stamped() -> None:
    result = await run_plugin(plugin, CREATE, pod=pod(qos="SYSTEM"), policy=POLICY)
    assert result.applied == [] and result.response.is_empty()
    assert result.skipped == {"envstamp": "envstamp.SYSTEM.enabled is false"}


async def test_a_bad_policy_is_refused_with_its_path() -> None:
    with pytest.raises(PolicyError, match=r"envstamp\.BE\.enabled: must be true or false, got 1"):
        await run_plugin(plugin, CREATE, pod=pod(), policy="envstamp: {BE: {enabled: 1}}")


async def test_the_state_counts_stamped_containers_for_the_whole_server(fake_cgroup_v2: FakeCgroup) -> None:
    async with plugin_runner(plugin, cgroups=fake_cgroup_v2) as runner:
        for kube_qos in ("besteffort", "besteffort", "burstable"):
            await runner.run(CREATE, pod=pod(kube_qos=kube_qos), container=container())
        web = pod(kube_qos="burstable", cgroups=fake_cgroup_v2)
        app = container(id=CONTAINER_ID, pod=web, cgroups=fake_cgroup_v2)
        with capture_logs() as logs:
            await runner.run(STARTED, pod=web, container=app)
    assert runner.state_of("envstamp") == {"BE": 2, "LS": 1}
    [record] = [r for r in logs if r["event"] == "envstamp: container started"]
    assert record["stamped"] == 3


# --- PostStartContainer: reading the container's cgroup --------------------------------------


async def test_the_started_container_cpu_shares_are_logged(fake_cgroup: FakeCgroup) -> None:
    """Runs for cgroup v1 and v2, each with the cgroupfs and the systemd driver."""
    web = pod("web", "shop", kube_qos="burstable", cgroups=fake_cgroup)  # creates the pod's cgroup
    app = container("app", id=CONTAINER_ID, pod=web, cgroups=fake_cgroup)  # and the container's
    fake_cgroup.fs().set_cpu_shares(web.cgroup_parent, 512, container_id=app.id)  # what runc did at create
    with capture_logs() as logs:
        result = await run_plugin(plugin, STARTED, pod=web, container=app, cgroups=fake_cgroup)
    assert result.applied == ["envstamp"] and result.response.is_empty()
    # v2 keeps cpu.weight (1..10000), a coarser scale: 512 shares come back as the smallest
    # shares value with the same weight.
    expected = 512 if fake_cgroup.version is CgroupVersion.V1 else weight_to_shares(shares_to_weight(512))
    [record] = [r for r in logs if r["event"] == "envstamp: container started"]
    assert record["cpu_shares"] == expected
    assert record["cgroup_version"] == fake_cgroup.version
    assert (record["plugin"], record["hook"], record["pod"], record["container"]) == (
        "envstamp",
        "PostStartContainer",
        "shop/web",
        "app",
    )


async def test_a_container_without_a_cgroup_is_logged_not_an_error(fake_cgroup: FakeCgroup) -> None:
    web = pod(kube_qos="besteffort", cgroups=fake_cgroup)
    gone = container(id=CONTAINER_ID)  # no container cgroup: it is gone already
    with capture_logs() as logs:
        result = await run_plugin(plugin, STARTED, pod=web, container=gone, cgroups=fake_cgroup)
    assert result.failures == []
    [record] = [r for r in logs if r["plugin"] == "envstamp"]
    assert record["event"] == "envstamp: cannot read cpu shares" and record["log_level"] == "warning"


async def test_a_parent_outside_the_pod_cgroups_is_withheld(fake_cgroup_v2: FakeCgroup) -> None:
    escaping = pod(cgroup_parent="/kubepods/../../etc")
    with capture_logs() as logs:
        result = await run_plugin(
            plugin, STARTED, pod=escaping, container=container(id=CONTAINER_ID), cgroups=fake_cgroup_v2
        )
    assert result.failures == []
    # The runner hides it from the plugin (pod.cgroup_parent is ""), saying why...
    [withheld] = [r for r in logs if r["event"] == "withheld from the plugins"]
    assert "'..' segment" in withheld["reason"]
    # ...so the plugin finds no container cgroup, and says so.
    [record] = [r for r in logs if r.get("plugin") == "envstamp"]
    assert record["event"] == "envstamp: cannot read cpu shares" and record["log_level"] == "warning"


async def test_without_cgroups_the_hook_does_nothing() -> None:
    with capture_logs() as logs:
        result = await run_plugin(plugin, STARTED, pod=pod(), container=container(id=CONTAINER_ID), cgroups=None)
    assert result.applied == ["envstamp"] and [r for r in logs if r.get("plugin") == "envstamp"] == []
