"""The real-node tier: one VM boot per session, whose facts every test here asserts on.

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

from runtimeproxy.testbed.noderun import NodeRun, run_node

from .plan import guest_files, scenario_plan

if os.environ.get("RUNTIMEPROXY_NODE_TIER") != "1":
    collect_ignore_glob = ["test_*.py"]

REPO = Path(__file__).resolve().parents[2]
# The whole VM run (boot, scenario, power-off), bounded; about 10 min on a busy 2-core host.
VM_TIMEOUT_S = float(os.environ.get("RUNTIMEPROXY_NODE_TIMEOUT", "2400"))


@pytest.fixture(scope="session")
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeRun]:
    if os.geteuid() != 0:
        pytest.fail("the real-node tier needs root (debootstrap, chroot, overlay mounts)")
    # Past output capture, straight to the terminal: building and booting take minutes.
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if terminal is not None:
            terminal.write_line(f"node: {line}")

    work = tmp_path_factory.mktemp("node")
    run = run_node(REPO, scenario_plan(), guest_files(), work, timeout=VM_TIMEOUT_S, log=say)
    (work / "facts.json").write_text(json.dumps(run.result.facts.data, indent=1, default=str))
    say(f"timings (s): {json.dumps(run.timings_s)}; facts in {work / 'facts.json'}")
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


def show(data: Any, limit: int = 4000) -> str:
    """Evidence for an assertion message."""
    text = json.dumps(data, indent=1, default=str)
    return text if len(text) <= limit else text[:limit] + "\n...(cut)"
