"""What ``runtime-hooks serve`` does before it registers with NRI: it loads only what registration
and the events need (the reconciler, its CRI client, the metrics server and the other commands'
modules come after, or never), reads each plugin distribution's metadata once, and reads the
built-in policy defaults with libyaml, so that the runtime gets its plugin as soon as possible."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_dists import make_distribution
from runtimeproxy.hooks import data, policy
from runtimeproxy.hooks.discovery import discover_plugins
from runtimeproxy.hooks.testkit import make_fake_cgroup_v2

# serve with NRI's start replaced by one that prints the loaded modules and refuses
STOPPED_AT_REGISTRATION = """
import json, sys
import runtimeproxy.hooks.cli as cli

async def start_nri(*args, **kwargs):
    print("MODULES " + json.dumps(sorted(sys.modules)), flush=True)
    raise ValueError("stopped at registration")

cli.start_nri = start_nri
sys.argv[0] = "runtime-hooks"
cli.main()
"""

#: Needed only once registered (the reconciler and its CRI client, container repair by CRI
#: update, the metrics server, the heap trimmer) or by other commands and setups.
LOADED_LATER = (
    "runtimeproxy.hooks.reconciler",
    "runtimeproxy.hooks.live_pods",
    "runtimeproxy.runtime_state",
    "runtimeproxy.wire.grpc_client",
    "runtimeproxy.wire.peer_limit_metrics",
    "runtimeproxy.common.malloc",
    "runtimeproxy.hooks.systemd_sync",
    "runtimeproxy.hooks.explain",
    "runtimeproxy.hooks.koordinator_config",
    "runtimeproxy.kubelet_model",
)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: unix socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _modules_at_registration(short_dir: Path, tmp_path: Path) -> tuple[list[str], str]:
    """The modules loaded when serve starts registering with NRI (all plugins enabled, the
    reconciler and the metrics server on, as deployed), and what serve said on stderr."""
    make_fake_cgroup_v2(tmp_path / "cgroup")
    args = [
        "serve",
        "--endpoint", str(short_dir / "hooks.sock"),
        "--nri-socket", str(short_dir / "nri.sock"),
        "--cgroup-root", str(tmp_path / "cgroup"),
        "--resctrl-root", str(tmp_path / "no-resctrl"),
        "--runtime-endpoint", f"unix://{short_dir / 'containerd.sock'}",
        "--metrics-address", "127.0.0.1:0",
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", STOPPED_AT_REGISTRATION, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    listed = [line for line in done.stdout.splitlines() if line.startswith("MODULES ")]
    return json.loads(listed[0].removeprefix("MODULES ")), done.stderr


def test_nri_registration_starts_before_the_reconciler_and_metrics_server_are_loaded(
    short_dir: Path, tmp_path: Path
) -> None:
    modules, stderr = _modules_at_registration(short_dir, tmp_path)
    assert "runtime-hooks: stopped at registration" in stderr  # refused with the reason, as any failure
    assert "runtimeproxy.hooks.nri.service" in modules  # what registration needs is there
    early = [name for name in modules if name.startswith(LOADED_LATER)]
    assert early == []


PLUGIN_MODULE = """
from runtimeproxy.hooks.sdk import Plugin

plugin = Plugin("{name}")  # version left at "0": the distribution's is taken

@plugin.on("PreCreateContainer")
def handler(response, **kwargs):
    pass
"""


def test_discovery_reads_a_distributions_metadata_once(site: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    path, prefix = site
    names = [f"{prefix}-{n}" for n in range(3)]
    modules = {f"{prefix}_{n}": PLUGIN_MODULE.format(name=name) for n, name in enumerate(names)}
    entry_points = {name: f"{module}:plugin" for name, module in zip(names, modules, strict=True)}
    make_distribution(path, f"{prefix}-dist", entry_points, modules, version="3.1")
    reads: list[str] = []
    metadata = importlib.metadata.PathDistribution.metadata

    def counted(dist: importlib.metadata.PathDistribution) -> Any:
        found = metadata.fget(dist)  # type: ignore[attr-defined]
        reads.append(found["Name"])
        return found

    monkeypatch.setattr(importlib.metadata.PathDistribution, "metadata", property(counted))
    result = discover_plugins()
    ours = [plugin for plugin in result.plugins if plugin.name in names]
    assert [(p.name, p.version) for p in ours] == [(name, "3.1") for name in names]
    failures = [f for f in result.failures if f.name in names]
    assert failures == []
    assert reads.count(f"{prefix}-dist") == 1


def test_the_built_in_defaults_read_the_same_with_libyaml() -> None:
    text = resources.files(data).joinpath(policy.DEFAULT_POLICY_FILE).read_text(encoding="utf-8")
    assert dict(policy._default_data()) == yaml.load(text, Loader=policy._Loader)  # PyYAML's own parser


def test_the_defaults_loader_refuses_a_key_given_twice() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="found key 'cpu' twice"):
        yaml.load("cpu: {}\ncpu: {}\n", Loader=policy._DefaultsLoader)
