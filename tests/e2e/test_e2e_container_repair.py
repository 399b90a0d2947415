"""Container repair in proxy mode, end to end: runtime-hooks behind ``runtime-proxy serve`` in front of
the real containerd test bed, the values read back from the REAL cgroup v1 files of the containers.

The reconciler keeps container values as koordlet does, writing the container cgroups: a BE
container created while the (Ignore) hook server was down, which kept kubelet's CFS quota and
shares, gets the plugins' values once runtime-hooks is back; a value changed behind the runtime's
back is set back at the next round. The daemons and the pods are those of tests/hooks_node.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from daemons import eventually
from hooks_node import BE_BATCH, BE_VALUES, Node, be_values, policy_text, run_be_pod
from pods import CALL_TIMEOUT, Pod, cgroup_dir

from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

INTERVAL = 0.5


@pytest.fixture
def node(containerd: Containerd) -> Iterator[Node]:
    with closing(Node(containerd)) as made:
        yield made


def repairs(node: Node) -> list[dict[str, Any]]:
    assert node.hooks is not None
    return [r for r in node.hooks.records() if r.get("event") == "container repaired"]


def test_a_container_created_while_the_hook_server_was_down_gets_the_plugins_values(node: Node) -> None:
    node.start(policy_text(interval=INTERVAL))
    assert node.hooks is not None
    node.hooks.kill()  # down, still registered: the proxy passes calls unhooked (Ignore)
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        be = run_be_pod(node, cri)
    assert be_values(be) == {name: (-1, 2) for name in BE_BATCH}  # kubelet's: no quota, 2 shares
    args, env = node.hooks_command()
    node.hooks = node.start_daemon("hooks-again", args, env)
    ready = node.hooks.wait_record(lambda r: r.get("event") == "ready")
    node.metrics_url = f"http://{ready['metrics_address']}/metrics"
    eventually(lambda: be_values(be) == BE_VALUES, 5.0, node.hooks_log)
    eventually(lambda: len(repairs(node)) == len(BE_BATCH), 5.0, node.hooks_log)  # logged once written
    found = {r["container"]: r for r in repairs(node)}
    assert set(found) == set(BE_BATCH), node.hooks_log()
    for name, (quota, shares) in BE_VALUES.items():
        line = found[name]
        assert (line["mode"], line["reason"], line["how"]) == ("proxy", "unhooked", "cgroup write")
        assert (line["pod"], line["container_id"]) == (f"e2e-hooks/{be_pod_name(node, be)}", be.containers[name])
        assert line["values"] == [f"cpu_quota: -1 -> {quota}", f"cpu_shares: 2 -> {shares}"]
    assert node.hooks_metric("runtimeproxy_hooks_containers_repaired_total", mode="proxy", reason="unhooked") == 2


def be_pod_name(node: Node, pod: Pod) -> str:
    """The pod's metadata name as run_pod gave it ("be-<first 8 of its uid>")."""
    return f"be-{pod.uid[:8]}"


def test_a_container_value_changed_behind_the_runtimes_back_is_set_back(node: Node) -> None:
    node.start(policy_text(interval=INTERVAL))
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        be = run_be_pod(node, cri)
    assert be_values(be) == BE_VALUES
    side = be.containers["side"]
    (cgroup_dir("cpu", be.parent, side) / "cpu.shares").write_text("2")
    # the next round sets it back; the bound leaves room for a loaded machine, not a time asserted
    eventually(lambda: be_values(be) == BE_VALUES, 2 * INTERVAL + 5.0, node.hooks_log)
    assert node.hooks is not None  # the line comes once the write is made
    line = node.hooks.wait_record(lambda r: r.get("event") == "container repaired")
    assert len(repairs(node)) == 1
    assert (line["container"], line["mode"], line["reason"]) == ("side", "proxy", "drifted")
    assert line["values"] == [f"cpu_shares: 2 -> {BE_VALUES['side'][1]}"]
    assert node.hooks_metric("runtimeproxy_hooks_containers_repaired_total", mode="proxy", reason="drifted") == 1
    assert node.hooks_metric("runtimeproxy_hooks_container_repairs_failed_total", mode="proxy") == 0
