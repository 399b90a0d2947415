"""The built wheel and sdist: hooks/ ships as runtimeproxy.hooks with no package list to keep.

Built with the project's own build backend from a copy of the tree that holds one more
sub-package than the repository, standing for one added later: it must ship with no edit.
"""

from __future__ import annotations

import ast
import configparser
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import HeaderParser
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Source folder -> its place in the wheel (hooks/ stays at the top level by design; systemd/ ships
# as package data for `runtime-proxy install`).
ROOTS = {"runtimeproxy": "runtimeproxy", "hooks": "runtimeproxy/hooks", "systemd": "runtimeproxy/data/systemd"}
# What the build needs besides the package folders.
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
# A sub-package with a data file and a namespace (no __init__.py) package below it.
ADDED = {
    "hooks/added_later/__init__.py": '"""Stands for a sub-package added after the test."""\n',
    "hooks/added_later/settings.yaml": "value: 1\n",
    "hooks/added_later/deeper/module.py": "VALUE = 1\n",
}


def _source_tree(dest: Path) -> Path:
    for name in BUILD_FILES:
        shutil.copy2(REPO / name, dest / name)
    for folder in ROOTS:
        shutil.copytree(REPO / folder, dest / folder, ignore=_IGNORE)
    for relative, text in ADDED.items():
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        (dest / relative).write_text(text)
    return dest


def _build(kind: str, source: Path, out: Path) -> Path:
    """Build a wheel or an sdist from `source` with the backend pyproject.toml names."""
    backend = tomllib.loads((source / "pyproject.toml").read_text())["build-system"]["build-backend"]
    out.mkdir(parents=True, exist_ok=True)
    code = f"import sys, {backend} as b; b.build_{kind}(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=source, capture_output=True,
                          text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [artifact] = out.glob("*.whl" if kind == "wheel" else "*.tar.gz")
    return artifact


def _expected_files(source: Path) -> set[str]:
    """Every file of the package and data folders, at its place in the wheel."""
    expected = set()
    for folder, target in ROOTS.items():
        for path in (source / folder).rglob("*"):
            relative = path.relative_to(source / folder)
            if path.is_file() and "__pycache__" not in relative.parts and path.suffix != ".pyc":
                expected.add(f"{target}/{relative.as_posix()}")
    return expected


def _payload(wheel: zipfile.ZipFile) -> set[str]:
    return {name for name in wheel.namelist() if ".dist-info/" not in name}


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    [path] = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(source copy, the wheel built from it)."""
    source = _source_tree(tmp_path_factory.mktemp("source"))
    return source, _build("wheel", source, tmp_path_factory.mktemp("wheel"))


def test_wheel_ships_every_file_of_both_folders_under_runtimeproxy(built: tuple[Path, Path]) -> None:
    source, wheel_path = built
    with zipfile.ZipFile(wheel_path) as wheel:
        shipped = _payload(wheel)
        top_level = _dist_info(wheel, "top_level.txt").split()
    assert shipped == _expected_files(source)
    assert {f"runtimeproxy/{path}" for path in ADDED} <= shipped  # hooks/... -> runtimeproxy/hooks/...
    assert {name.split("/")[0] for name in shipped} == {"runtimeproxy"}  # no bare `hooks`
    assert top_level == ["runtimeproxy"]
    assert "runtimeproxy/hooks/data/default-policy.yaml" in shipped
    assert "runtimeproxy/py.typed" in shipped


def test_entry_points_name_modules_the_wheel_ships(built: tuple[Path, Path]) -> None:
    source, wheel_path = built
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    with zipfile.ZipFile(wheel_path) as wheel:
        shipped = _payload(wheel)
        entry_points = configparser.ConfigParser(delimiters=("=",))
        entry_points.read_string(_dist_info(wheel, "entry_points.txt"))
    declared = {"console_scripts": project["scripts"], **project["entry-points"]}
    found = {group: dict(entry_points[group]) for group in entry_points.sections()}
    assert found == declared
    assert set(found["runtimeproxy.hooks"]) >= {"cpu", "cpuset", "memory", "resctrl", "network", "gpu"}
    for group in found.values():
        for target in group.values():
            module = target.split(":")[0].replace(".", "/")
            assert f"{module}.py" in shipped or f"{module}/__init__.py" in shipped, target


def _imported_names(wheel: zipfile.ZipFile) -> set[str]:
    """Top-level names of absolute imports in the shipped modules."""
    names: set[str] = set()
    for name in _payload(wheel):
        if name.endswith(".py"):
            for node in ast.walk(ast.parse(wheel.read(name))):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names


def _normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _requirement_name(requirement: str) -> str:
    return _normalized(re.split(r"[\s;<>=!~\[]", requirement, maxsplit=1)[0])


def test_every_runtime_dependency_is_imported_by_shipped_code(built: tuple[Path, Path]) -> None:
    """Only what runs is a runtime dependency (grpcio-tools generates code: an extra)."""
    _, wheel_path = built
    with zipfile.ZipFile(wheel_path) as wheel:
        metadata = HeaderParser().parsestr(_dist_info(wheel, "METADATA"))
        imported = _imported_names(wheel)
    runtime = [r for r in metadata.get_all("Requires-Dist", []) if "extra ==" not in r]
    names = {_requirement_name(requirement) for requirement in runtime}
    providers = packages_distributions()  # import name -> distributions, from this environment
    used = {_normalized(dist) for name in imported for dist in providers.get(name, [])}
    assert "grpcio-tools" not in names
    assert names, "no runtime dependencies found in METADATA"
    assert names <= used, f"declared but never imported: {sorted(names - used)}"


def test_sdist_builds_the_same_wheel(built: tuple[Path, Path], tmp_path: Path) -> None:
    source, wheel_path = built
    sdist = _build("sdist", source, tmp_path / "sdist")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    [unpacked] = (tmp_path / "unpacked").iterdir()
    from_sdist = _build("wheel", unpacked, tmp_path / "wheel")
    with zipfile.ZipFile(wheel_path) as direct, zipfile.ZipFile(from_sdist) as rebuilt:
        assert _payload(rebuilt) == _payload(direct)


# --- The tools' extra: the daemons run without it, the tools name it when it is missing. ---

#: Modules only the tools load (play, demo, explain, the test bed, the generated gRPC stubs and
#: the code generator): everything else must import with the tools' extra absent.
TOOL_ONLY = (
    "runtimeproxy.play",
    "runtimeproxy.testbed",
    "runtimeproxy.proxy.demo",
    "runtimeproxy.kubelet_model",  # the manifest reader and what builds on it
    "runtimeproxy.hooks.explain",
    "runtimeproxy.hooks.demo_table",
    "runtimeproxy.api.generate",
)

# Run in the child: refuse every package of the tools' extra, as a node install without it would.
REFUSE_TOOLS = """
import sys
class RefuseTools:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused by the test)", name=name)
        return None
sys.meta_path.insert(0, RefuseTools())
"""


def _tools_extra() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tools"]


def _without_tools(code: str, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    from runtimeproxy.common.extras import TOOLS

    script = REFUSE_TOOLS.format(blocked=sorted(TOOLS)) + code
    return subprocess.run([sys.executable, "-c", script, *argv], cwd=cwd, capture_output=True, text=True,
                          check=False, timeout=120)


def _daemon_modules() -> list[str]:
    from test_import_rules import source_modules

    return [name for name, _ in source_modules()
            if not name.startswith(TOOL_ONLY) and not name.endswith(("_pb2_grpc", ".__main__"))]


def test_tools_extra_names_the_packages_the_tools_check_for() -> None:
    from runtimeproxy.common.extras import TOOLS, TOOLS_EXTRA

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    declared = {_requirement_name(r) for r in optional[TOOLS_EXTRA]}
    assert declared == set(TOOLS.values())
    assert not declared & {_requirement_name(r) for r in project["dependencies"]}
    assert f"runtimeproxy[{TOOLS_EXTRA}]" in optional["test"]  # CI installs the tools


def test_daemon_modules_import_without_the_tools_extra(tmp_path: Path) -> None:
    """Both daemons' module trees (proxy, relay, dispatch, hook server, plugins, NRI) load with
    grpc and kubernetes refused."""
    modules = _daemon_modules()
    assert {"runtimeproxy.proxy.cli", "runtimeproxy.hooks.cli", "runtimeproxy.hooks.nri.plugin",
            "runtimeproxy.hooks.plugins.network", "runtimeproxy.hooks.testkit"} <= set(modules)
    code = """
import importlib
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        failed.append(f"{name}: {exc}")
print("\\n".join(failed))
"""
    done = _without_tools(code, tmp_path, *modules)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "", f"need the tools' extra:\n{done.stdout}"


def test_the_refusal_is_real(tmp_path: Path) -> None:
    """The tool-only modules do fail under the same refusal (the test above can fail)."""
    done = _without_tools("import runtimeproxy.play.cri_client", tmp_path)
    assert done.returncode != 0 and "refused by the test" in done.stderr


RUN_CLI = """
from importlib import import_module
sys.argv = sys.argv[1:]
import_module(sys.argv[0]).main()
"""


@pytest.mark.parametrize(
    ("cli", "argv", "command"),
    [
        ("runtimeproxy.proxy.cli", ["play", "pod.yaml"], "runtime-proxy play"),
        ("runtimeproxy.proxy.cli", ["play", "--delete", "pod.yaml"], "runtime-proxy play"),
        ("runtimeproxy.proxy.cli", ["demo"], "runtime-proxy demo"),
        ("runtimeproxy.hooks.cli", ["explain", "pod.yaml"], "runtime-hooks explain"),
    ],
)
def test_a_tool_without_its_extra_names_the_extra(tmp_path: Path, cli: str, argv: list[str], command: str) -> None:
    (tmp_path / "pod.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n")
    done = _without_tools(RUN_CLI, tmp_path, cli, *argv)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{command} needs" in done.stderr
    assert "pip install 'runtimeproxy[tools]'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("cli", "argv"), [("runtimeproxy.proxy.cli", ["--help"]),
                                           ("runtimeproxy.proxy.cli", ["serve", "--help"]),
                                           ("runtimeproxy.hooks.cli", ["--help"]),
                                           ("runtimeproxy.hooks.cli", ["serve", "--help"])])
def test_the_daemons_commands_work_without_the_tools_extra(tmp_path: Path, cli: str, argv: list[str]) -> None:
    done = _without_tools(RUN_CLI, tmp_path, cli, *argv)
    assert done.returncode == 0, done.stderr[-3000:]
    if cli.endswith("proxy.cli") and argv == ["--help"]:
        assert "play" in done.stdout and "not installed" in done.stdout


def test_the_node_image_gets_the_daemons_and_the_tools_dependencies(
        built: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The real-node tier plays pods in the guest, so its image installs the tools' extra too,
    read from the wheel's own metadata; the test extra stays out."""
    import importlib.metadata

    from runtimeproxy.testbed import noderoot

    _, wheel_path = built
    with zipfile.ZipFile(wheel_path) as wheel:
        requires = HeaderParser().parsestr(_dist_info(wheel, "METADATA")).get_all("Requires-Dist", [])
    monkeypatch.setattr(importlib.metadata, "requires", lambda distribution: requires)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert set(noderoot.project_requirements()) == {*project["dependencies"], *_tools_extra()}
    assert set(noderoot.project_requirements(extras=())) == set(project["dependencies"])
