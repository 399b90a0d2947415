"""Which package may import which: the rules each package's docstring states, checked on every
module's import statements, and the plugin SDK and test kit loading nothing of the proxy."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import runtimeproxy.hooks

import runtimeproxy

API = "runtimeproxy.api"
COMMON = "runtimeproxy.common"
HOOKAPI = "runtimeproxy.hookapi"
WIRE = "runtimeproxy.wire"
RUNTIME_STATE = "runtimeproxy.runtime_state"
KUBELET_MODEL = "runtimeproxy.kubelet_model"
RELAY = "runtimeproxy.relay"
DISPATCH = "runtimeproxy.dispatch"
PROXY = "runtimeproxy.proxy"
PLAY = "runtimeproxy.play"
TESTBED = "runtimeproxy.testbed"
HOOKS = "runtimeproxy.hooks"

#: The runtimeproxy packages each package may import besides itself (and the root package,
#: which imports none of them). The other daemon's parts are never among them.
MAY_IMPORT: dict[str, frozenset[str]] = {
    API: frozenset(),
    COMMON: frozenset(),
    HOOKAPI: frozenset({API}),
    WIRE: frozenset({COMMON}),
    RUNTIME_STATE: frozenset({API, COMMON, HOOKAPI, WIRE}),
    KUBELET_MODEL: frozenset({API, HOOKAPI}),
    RELAY: frozenset({API, COMMON, WIRE}),
    DISPATCH: frozenset({API, COMMON, HOOKAPI, WIRE, RUNTIME_STATE, RELAY}),
    PLAY: frozenset({API, COMMON, HOOKAPI, KUBELET_MODEL}),
    TESTBED: frozenset({API, COMMON, HOOKAPI, KUBELET_MODEL, PLAY}),
    PROXY: frozenset({API, COMMON, HOOKAPI, WIRE, RUNTIME_STATE, KUBELET_MODEL, RELAY, DISPATCH, PLAY, TESTBED}),
    HOOKS: frozenset({API, COMMON, HOOKAPI, WIRE, RUNTIME_STATE, KUBELET_MODEL}),
}

#: What importing the plugin SDK and the test kit must not load: the relay, the proxy's hook
#: layer, the proxy daemon and its tools.
NOT_FOR_PLUGINS = (RELAY, DISPATCH, PROXY, PLAY, TESTBED)


def package_of(module: str) -> str | None:
    """The package of MAY_IMPORT that holds ``module`` (None: the root package itself)."""
    found = [name for name in MAY_IMPORT if module == name or module.startswith(name + ".")]
    return max(found, key=len) if found else None


def source_modules() -> Iterator[tuple[str, Path]]:
    """Every module of the installed package, by dotted name (runtimeproxy.hooks comes from its
    own folder)."""
    roots = [("runtimeproxy", Path(runtimeproxy.__file__).parent), (HOOKS, Path(runtimeproxy.hooks.__file__).parent)]
    for name, root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if name == "runtimeproxy" and parts[0] == "hooks":
                continue  # an editable install may hold no hooks/ here; a wheel's is the one below
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join((name, *parts)), path


def imported(module: str, source: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, module) for every runtimeproxy module an import statement of ``source`` names,
    lazy imports inside functions and TYPE_CHECKING blocks included."""
    here = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # "from runtimeproxy import common" names the package runtimeproxy.common
            names = [f"{base}.{alias.name}" if base == "runtimeproxy" else base for alias in node.names]
        else:
            continue
        for name in names:
            if name == "runtimeproxy" or name.startswith("runtimeproxy."):
                yield node.lineno, name


def broken_rules(module: str, source: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` (its source given) that its package's rule forbids."""
    owner = package_of(module)
    if owner is None:
        return []
    allowed = MAY_IMPORT[owner] | {owner}
    problems = []
    for line, name in imported(module, source, is_package):
        target = package_of(name)
        if target is not None and target not in allowed:
            problems.append(f"{module}:{line} imports {name} ({owner} may import {', '.join(sorted(allowed))})")
    return problems


def test_every_module_keeps_its_package_import_rules() -> None:
    modules = list(source_modules())
    assert {package_of(name) for name, _ in modules} >= set(MAY_IMPORT)  # every package was read
    problems = [
        problem
        for name, path in modules
        for problem in broken_rules(name, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    ]
    assert problems == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("runtimeproxy.hooks.server", "from runtimeproxy.relay.connection import RelayConnection"),
        ("runtimeproxy.hooks.testkit.attach", "def run():\n    from runtimeproxy.dispatch import layer\n"),
        ("runtimeproxy.hooks.explain", "from runtimeproxy.play import runner"),
        ("runtimeproxy.hooks.cli", "import runtimeproxy.proxy.cli"),
        ("runtimeproxy.hooks.nri.plugin", "from runtimeproxy.testbed import Containerd"),
        ("runtimeproxy.wire.h2_peer", "from runtimeproxy.relay import connection"),
        ("runtimeproxy.wire.grpc_client", "from runtimeproxy.hooks import sdk"),
        ("runtimeproxy.hookapi.cri_mapping", "from runtimeproxy.common import logs"),
        ("runtimeproxy.common.logs", "from runtimeproxy.common import trace\nfrom runtimeproxy import wire"),
        ("runtimeproxy.relay.connection", "from runtimeproxy.dispatch.hook_interceptor import HookInterceptor"),
        ("runtimeproxy.relay.streams", "from ..hooks import sdk"),
        ("runtimeproxy.dispatch.layer", "from runtimeproxy.proxy.metrics import CallMetrics"),
        ("runtimeproxy.proxy.server", "from runtimeproxy.hooks.server import RuntimeHooksServer"),
    ],
)
def test_a_forbidden_import_is_named(module: str, source: str) -> None:
    """The check itself: an import its package may not make is reported with the module and line."""
    problems = broken_rules(module, source)
    assert problems and all(problem.startswith(f"{module}:") for problem in problems), problems


def test_allowed_imports_pass_the_check() -> None:
    source = "from runtimeproxy import __version__\nfrom runtimeproxy.hookapi import hookpoints\nfrom . import qos\n"
    assert broken_rules("runtimeproxy.hooks.sdk", source) == []
    assert broken_rules("runtimeproxy.common.trace", "from runtimeproxy.common import logs\nfrom . import malloc") == []


def test_the_plugin_sdk_and_test_kit_load_nothing_of_the_proxy(tmp_path: Path) -> None:
    """A plugin (and its tests) imports the SDK and the test kit: neither loads the relay, the
    proxy's hook layer, the proxy daemon or its tools. In a fresh interpreter, outside the
    checkout, so that only these imports count."""
    code = "import sys, runtimeproxy.hooks.sdk, runtimeproxy.hooks.testkit; print(*sorted(sys.modules), sep='\\n')"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    loaded = set(done.stdout.split())
    assert {"runtimeproxy.hooks.sdk", "runtimeproxy.hooks.testkit"} <= loaded
    assert sorted(name for name in loaded if package_of(name) in NOT_FOR_PLUGINS) == []


def test_every_package_says_what_it_is_for_and_may_import() -> None:
    packages = [(name, path) for name, path in source_modules() if path.name == "__init__.py"]
    generated = [f"{API}.runtime", f"{API}.nri"]  # protobuf's output, written by api/generate.py
    missing = []
    for name, path in packages:
        if any(name == g or name.startswith(g + ".") for g in generated):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if "import" not in doc.lower():
            missing.append(name)
    assert missing == []
