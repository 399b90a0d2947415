"""pytest fixtures of the hooks test kit.

Load them with ``pytest_plugins = ["runtimeproxy.hooks.testkit.fixtures"]`` (in the root
``conftest.py`` or in a test module); no entry point is registered, so nothing is loaded
into test runs that do not ask for it.

* ``fake_cgroup_v1`` / ``fake_cgroup_v2``: a fake cgroup tree of that version (cgroupfs driver,
  kubelet's kubepods cgroups made) under ``tmp_path``.
* ``fake_cgroup``: the same, once per version and driver: ``v1-cgroupfs``, ``v1-systemd``,
  ``v2-cgroupfs``, ``v2-systemd`` (the test ids). A test that wants fewer names them:
  ``@pytest.mark.parametrize("fake_cgroup", ["v2-systemd"], indirect=True)``.
* ``fake_resctrl``: a fake resctrl mount under ``tmp_path``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

from ..cgroups import CgroupDriver
from .fake_cgroups import FakeCgroup, make_fake_cgroup_v1, make_fake_cgroup_v2
from .fake_resctrl import FakeResctrl, make_fake_resctrl

__all__ = ["FAKE_CGROUP_KINDS", "fake_cgroup", "fake_cgroup_v1", "fake_cgroup_v2", "fake_resctrl"]

#: The parameters of ``fake_cgroup``: "<version>-<driver>".
FAKE_CGROUP_KINDS: Final = ("v1-cgroupfs", "v1-systemd", "v2-cgroupfs", "v2-systemd")


def _make(kind: str, root: Path) -> FakeCgroup:
    version, _, driver = kind.partition("-")
    drivers: dict[str, CgroupDriver] = {"cgroupfs": "cgroupfs", "systemd": "systemd"}
    if version not in ("v1", "v2") or driver not in drivers:
        raise ValueError(f"fake_cgroup takes one of {', '.join(FAKE_CGROUP_KINDS)}, got {kind!r}")
    make = make_fake_cgroup_v1 if version == "v1" else make_fake_cgroup_v2
    return make(root, driver=drivers[driver])


@pytest.fixture
def fake_cgroup_v1(tmp_path: Path) -> FakeCgroup:
    """A fake cgroup v1 tree (``cpu,cpuacct`` with its ``cpu``/``cpuacct`` links, ``memory``,
    ``cpuset``... each with its root files) with kubelet's kubepods cgroups; cgroupfs driver.
    ``fake_cgroup_v1.fs()`` is a CgroupFS on it."""
    return make_fake_cgroup_v1(tmp_path / "cgroup-v1")


@pytest.fixture
def fake_cgroup_v2(tmp_path: Path) -> FakeCgroup:
    """A fake cgroup v2 tree (``cgroup.controllers``, ``cgroup.subtree_control``...) with
    kubelet's kubepods cgroups; cgroupfs driver. ``fake_cgroup_v2.fs()`` is a CgroupFS on it."""
    return make_fake_cgroup_v2(tmp_path / "cgroup-v2")


@pytest.fixture(params=FAKE_CGROUP_KINDS)
def fake_cgroup(request: pytest.FixtureRequest, tmp_path: Path) -> FakeCgroup:
    """A fake cgroup tree for each of v1 and v2 with the cgroupfs and the systemd driver (kubelet's
    kubepods cgroups made): the test runs four times. ``.version`` and ``.driver`` say which."""
    return _make(str(request.param), tmp_path / "cgroup")


@pytest.fixture
def fake_resctrl(tmp_path: Path) -> FakeResctrl:
    """A fake resctrl mount with the defaults of :func:`make_fake_resctrl` (two L3 caches, 11 ways,
    16 CLOSIDs, MBA with min 10 / granularity 10). ``fake_resctrl.fs()`` is a ResctrlFS bound to it."""
    return make_fake_resctrl(tmp_path / "resctrl")
