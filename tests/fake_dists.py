"""Installed distributions made by hand, for plugin discovery by entry point (a pytest plugin:
conftest.py loads it, so its `site` fixture is everyone's)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtimeproxy.hooks.sdk import ENTRY_POINT_GROUP


def make_distribution(
    site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str], version: str = "1.0"
) -> None:
    """An installed distribution as importlib.metadata sees one: a dist-info directory in `site`
    naming `entry_points` of the runtime-hooks group, and `modules` as source files beside it."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"  # wheel naming: the first dash ends the name
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A directory on sys.path for fake distributions, and a unique module name prefix (its
    modules leave sys.modules afterwards)."""
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    prefix = f"rh_{uuid.uuid4().hex[:8]}"
    yield path, prefix
    for name in [m for m in sys.modules if m.startswith(prefix)]:
        del sys.modules[name]
