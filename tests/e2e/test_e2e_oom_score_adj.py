"""Koordinator's ``koordinator.sh/oom-score-adj(-spec)`` annotations, end to end.

The proxy and ``runtime-hooks`` run in front of the real containerd test bed with
``memory.LS.pod_oom_score_adj`` on: the memory plugin answers PreCreateContainer with the
container's value from the annotations, runc writes it for the container's process, and the
kernel shows it in ``/proc/<pid>/oom_score_adj``. The test bed's containerd has
``restrict_oom_score_adj`` on, which only raises values below containerd's own score; the
values used here are above it.
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from hooks_node import Node
from pods import CALL_TIMEOUT, QOS_LABEL, ContainerSpec, threads

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.play.cri_client import CriClient
from runtimeproxy.testbed import Containerd

pytestmark = pytest.mark.e2e

SPEC = "koordinator.sh/oom-score-adj-spec"
POD_WIDE = "koordinator.sh/oom-score-adj"
KUBELET = 900  # kubelet's score for a Burstable container with a small memory request
POLICY = textwrap.dedent(
    """\
    reconciler:
      interval_seconds: 600
    memory:
      LS: {pod_oom_score_adj: true}
    network:
      interface: ""
    """
)


@pytest.fixture
def node(containerd: Containerd) -> Iterator[Node]:
    with closing(Node(containerd)) as made:
        yield made


def scores(parent: str, container_id: str) -> set[str]:
    return {Path(f"/proc/{pid}/oom_score_adj").read_text().strip() for pid in threads(parent, container_id)}


def test_the_annotations_set_each_containers_oom_score_adj(node: Node) -> None:
    own = int(Path(f"/proc/{os.getpid()}/oom_score_adj").read_text())
    assert own < 321  # containerd inherits ours: restrict_oom_score_adj would raise values below it
    node.start(POLICY)
    kubelet = pb.LinuxContainerResources(cpu_period=100_000, cpu_shares=2, oom_score_adj=KUBELET)
    with CriClient(str(node.proxy_endpoint), timeout=CALL_TIMEOUT) as cri:
        ls = node.run_pod(
            cri,
            "oom",
            qos_parent="burstable",
            labels={QOS_LABEL: "LS"},
            annotations={SPEC: json.dumps({"app": 321}), POD_WIDE: "654"},
            containers=[ContainerSpec("app", kubelet), ContainerSpec("side", kubelet)],
        )
        # A pod whose annotation is out of range keeps kubelet's value; the plugin logs why.
        bad = node.run_pod(
            cri,
            "oom-bad",
            qos_parent="burstable",
            labels={QOS_LABEL: "LS"},
            annotations={POD_WIDE: "5000"},
            containers=[ContainerSpec("app", kubelet)],
        )
    assert scores(ls.parent, ls.containers["app"]) == {"321"}  # its entry in the spec
    assert scores(ls.parent, ls.containers["side"]) == {"654"}  # not in the spec: the pod-wide value
    assert scores(bad.parent, bad.containers["app"]) == {str(KUBELET)}
    assert node.hooks is not None
    record = node.hooks.wait_record(lambda r: r.get("event") == "oom_score_adj annotation not used")
    assert "5000 is out of range" in record["reason"]
