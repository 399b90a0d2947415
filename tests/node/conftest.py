"""The real-node tier: one VM boot per node flavour and session, whose facts every test here
asserts on, once per flavour (`nodeflavour.FLAVOURS`: trixie's containerd 1.7 with runc 1.1, and
sid's containerd 2.x with runc 1.3; the ids are the flavours' names).

Collected only when RUNTIMEPROXY_NODE_TIER=1 (`tox -e node` sets it): a boot takes
minutes of emulated CPU, and the default run must stay as fast as it is. When it is
collected it fails, never skips, if the VM cannot be built or booted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runtimeproxy.hooks.cgroups import WeightConversion

from runtimeproxy.testbed.nodeflavour import FLAVOURS, NodeFlavour
from runtimeproxy.testbed.noderun import NodeRun, run_node

from .plan import conversion_of, guest_files, scenario_plan

if os.environ.get("RUNTIMEPROXY_NODE_TIER") != "1":
    collect_ignore_glob = ["test_*.py"]

REPO = Path(__file__).resolve().parents[2]
# The whole VM run (boot, scenario, power-off), bounded; about 10 min on a busy 2-core host.
VM_TIMEOUT_S = float(os.environ.get("RUNTIMEPROXY_NODE_TIMEOUT", "2400"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``chart_pod`` assert on the chart's pod step, which only flavours that play
    it run (``NodeFlavour.plays_chart``): their other flavours' items are deselected, not
    skipped, since no such test exists for them."""
    kept, dropped = [], []
    for item in items:
        flavour = getattr(item, "callspec", None) and item.callspec.params.get("node")
        unplayed = isinstance(flavour, NodeFlavour) and not flavour.plays_chart
        (dropped if unplayed and item.get_closest_marker("chart_pod") else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session", params=FLAVOURS, ids=[flavour.name for flavour in FLAVOURS])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeRun]:
    flavour: NodeFlavour = request.param
    if os.geteuid() != 0:
        pytest.fail("the real-node tier needs root (debootstrap, chroot, overlay mounts)")
    # Past output capture, straight to the terminal: building and booting take minutes.
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if terminal is not None:
            terminal.write_line(f"node {flavour.name}: {line}")

    work = tmp_path_factory.mktemp(f"node-{flavour.name}")
    run = run_node(REPO, scenario_plan(flavour), guest_files(), work, timeout=VM_TIMEOUT_S, log=say,
                   flavour=flavour)
    (work / "facts.json").write_text(json.dumps(run.result.facts.data, indent=1, default=str))
    say(f"timings (s): {json.dumps(run.timings_s)}; runtimes: {run.runtimes or 'the image'}; "
        f"facts in {work / 'facts.json'}")
    yield run


class Evidence:
    """Access to the guest's facts that fails with the guest's own evidence."""

    def __init__(self, run: NodeRun) -> None:
        self.run = run

    def __call__(self, name: str) -> Any:
        facts = self.run.result.facts
        if name not in facts:
            error = facts.get(f"{name}/error")
            detail = json.dumps(error, indent=1)[:6000] if error else "(the guest never got there)"
            pytest.fail(f"the guest reported no {name!r}: {detail}\n--- console (tail) ---\n"
                        f"{self.run.result.console_tail()}")
        return facts[name]


@pytest.fixture(scope="session")
def fact(node: NodeRun) -> Evidence:
    return Evidence(node)


@pytest.fixture(scope="session")
def conversion(node: NodeRun) -> WeightConversion:
    """The shares->weight conversion of the node's runc, which its runtime-hooks was given."""
    return conversion_of(node.flavour)


def show(data: Any, limit: int = 4000) -> str:
    """Evidence for an assertion message."""
    text = json.dumps(data, indent=1, default=str)
    return text if len(text) <= limit else text[:limit] + "\n...(cut)"
