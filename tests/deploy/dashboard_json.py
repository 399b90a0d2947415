"""The committed Grafana dashboard (deploy/grafana/runtimeproxy.json) as the tests read it: its
generator, its panels and their queries."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GENERATOR = REPO / "deploy" / "grafana" / "dashboard.py"
DASHBOARD = REPO / "deploy" / "grafana" / "runtimeproxy.json"


def generator() -> ModuleType:
    """deploy/grafana/dashboard.py, imported from its path (deploy/ is no package)."""
    spec = importlib.util.spec_from_file_location("runtimeproxy_dashboard", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def committed() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel but the rows, also those inside a collapsed row."""
    for panel in board["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in board["templating"]["list"]}


def expressions(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL expression) of every query of every panel."""
    for panel in panels(board):
        for target in panel["targets"]:
            yield panel["title"], target["expr"]
