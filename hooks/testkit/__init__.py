"""Test helpers for runtime-hooks plugin authors: fake kernel interfaces that behave like the real ones.

* :mod:`runtimeproxy.hooks.testkit.resctrl` -- a fake resctrl mount (:func:`make_fake_resctrl`).
* :mod:`runtimeproxy.hooks.testkit.fixtures` -- pytest fixtures over them; load with
  ``pytest_plugins = ["runtimeproxy.hooks.testkit.fixtures"]`` in a root ``conftest.py`` or test module.
"""

from __future__ import annotations

from .resctrl import FakeKernelError, FakeResctrl, make_fake_resctrl

__all__ = ["FakeKernelError", "FakeResctrl", "make_fake_resctrl"]
