"""pytest fixtures of the hooks test kit.

Load them with ``pytest_plugins = ["runtimeproxy.hooks.testkit.fixtures"]`` (in the root
``conftest.py`` or in a test module); no entry point is registered, so nothing is loaded
into test runs that do not ask for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .resctrl import FakeResctrl, make_fake_resctrl

__all__ = ["fake_resctrl"]


@pytest.fixture
def fake_resctrl(tmp_path: Path) -> FakeResctrl:
    """A fake resctrl mount with the defaults of :func:`make_fake_resctrl` (two L3 caches, 11 ways,
    16 CLOSIDs, MBA with min 10 / granularity 10). ``fake_resctrl.fs()`` is a ResctrlFS bound to it."""
    return make_fake_resctrl(tmp_path / "resctrl")
