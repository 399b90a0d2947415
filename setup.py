"""The package layout for setuptools, derived from the tree; everything else is in pyproject.toml.

hooks/ stays at the top level (the design fixes it) and installs as runtimeproxy.hooks. setuptools
maps a folder to a sub-package for the wheel and for an editable install alike (package_dir), but
wants every package named: they are found here, under each root, so a new sub-package needs no
edit. hatchling's `sources` maps the folder for the wheel but refuses an editable install when a
rewrite adds a prefix (editables' import hook maps top-level names only: pfmoore/editables#20),
and with `force-include` an editable install holds a stale copy of hooks/ that the working tree's
runtimeproxy/ never finds, and puts the repository root, hence a bare `hooks`, on sys.path.
"""

from __future__ import annotations

from setuptools import find_namespace_packages, setup

# Import name -> folder. A folder without __init__.py (runtimeproxy/data/) is a namespace package.
ROOTS = {"runtimeproxy": "runtimeproxy", "runtimeproxy.hooks": "hooks"}
# Data-only packages kept in folders of their own: systemd/ (the units, their settings files and
# kubelet's drop-in) ships as runtimeproxy.data.systemd, which `runtime-proxy install` writes out.
DATA_ROOTS = {"runtimeproxy.data.systemd": "systemd"}


def packages_under(name: str, folder: str) -> list[str]:
    """`name` and every package below `folder`, named under `name`."""
    found = find_namespace_packages(folder, exclude=["__pycache__", "*.__pycache__"])
    return [name, *(f"{name}.{package}" for package in found)]


setup(
    package_dir={**ROOTS, **DATA_ROOTS},
    packages=[*(package for name, folder in ROOTS.items() for package in packages_under(name, folder)), *DATA_ROOTS],
)
