"""Fake cgroup trees of every version and driver, for tests that run a plugin on each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtimeproxy.hooks.testkit.fake_cgroups import FakeCgroup, make_fake_cgroup_v1, make_fake_cgroup_v2

#: (cgroup version, driver) of each tree: ``@pytest.fixture(params=TREES, ids=tree_id)``.
TREES = [(v, d) for v in (1, 2) for d in ("cgroupfs", "systemd")]


def tree_id(param: tuple[int, str]) -> str:
    return f"v{param[0]}-{param[1]}"


def fake_tree(param: tuple[int, str], root: Path, **options: Any) -> FakeCgroup:
    """The fake tree of `param` (one of TREES) at `root`; `options` as make_fake_cgroup_v1/v2 take them."""
    version, driver = param
    make = make_fake_cgroup_v1 if version == 1 else make_fake_cgroup_v2
    return make(root, driver=driver, **options)
