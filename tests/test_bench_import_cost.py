"""bench/import_cost.py: what the daemons' imports cost. Its runtime-hooks preset must name what
the daemon really loads, in an order where the libraries come before the project's code, or the
libraries' total it reports (what any daemon built on them holds) means nothing."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from types import ModuleType

import pytest
from bench_scripts import bench_module


@pytest.fixture(scope="module")
def import_cost() -> ModuleType:
    return bench_module("import_cost")


def top_level_modules(imports: str) -> set[str]:
    """The top-level packages a fresh interpreter holds after running ``imports``."""
    probe = f"{imports}; import sys; print(' '.join({{name.split('.')[0] for name in sys.modules}}))"
    return set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split())


def loaded_by_runtime_hooks() -> set[str]:
    """What runtime-hooks' CLI and its plugins load beyond what the interpreter starts with (site's .pth files)."""
    daemon = top_level_modules("import runtimeproxy.hooks.cli, runtimeproxy.hooks.discovery as d; d.discover_plugins()")
    return daemon - top_level_modules("pass")


def test_the_hooks_preset_lists_every_library_the_daemon_loads(import_cost: ModuleType) -> None:
    preset = import_cost.DAEMONS["hooks"]
    libraries = {name.split(".")[0] for name in preset if not name.startswith("runtimeproxy")}
    loaded = loaded_by_runtime_hooks()
    installed = importlib.metadata.packages_distributions()  # top-level name -> distributions
    third_party = {name for name in loaded if name in installed and name != "runtimeproxy"}
    # google (protobuf) and hpack come with the project's own modules (generated code, the HTTP/2
    # peer); the rest are libraries the daemon is built on and must head the list.
    assert third_party - {"google", "hpack"} <= libraries, third_party
    assert libraries <= loaded
    first_own = next(n for n, name in enumerate(preset) if name.startswith("runtimeproxy"))
    assert all(not name.startswith("runtimeproxy") for name in preset[:first_own])
    assert all(name.startswith("runtimeproxy") for name in preset[first_own:])
    assert preset[-1] == "runtimeproxy.hooks.discovery"


def test_measure_reports_what_each_import_adds(import_cost: ModuleType) -> None:
    report = import_cost.measure(["json", "asyncio"])
    assert report["interpreter_mib"] > 1
    rows = report["modules"]
    assert [row["module"] for row in rows] == ["json", "asyncio"]
    asyncio_row = rows[1]
    assert asyncio_row["alone_mib"] > 1  # ssl and the event loop: megabytes, never nothing
    assert asyncio_row["total_mib"] == pytest.approx(rows[0]["total_mib"] + asyncio_row["added_mib"])
    assert asyncio_row["import_ms"] > 0


def test_the_daemon_option_picks_the_preset(import_cost: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    measured: list[tuple[str, ...]] = []
    monkeypatch.setattr(import_cost, "measure", lambda modules: measured.append(tuple(modules)) or {})
    monkeypatch.setattr(import_cost, "print_report", lambda report: None)
    import_cost.main(["--daemon", "hooks"])
    import_cost.main([])
    import_cost.main(["json"])
    assert measured == [import_cost.HOOKS_MODULES, import_cost.MODULES, ("json",)]
