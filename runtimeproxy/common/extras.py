"""The tools' extra: what `runtime-proxy play`, `runtime-proxy demo` and `runtime-hooks explain`
need beyond the daemons, and the error their commands give when it is not installed.

A node runs the daemons only; the tools read Pod manifests with the kubernetes client and talk
CRI through grpcio, which the daemons never load (see docs/dependencies.md).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

import click

__all__ = ["KUBERNETES", "TOOLS", "TOOLS_EXTRA", "missing_modules", "require_tools", "unavailable_command"]

TOOLS_EXTRA = "tools"
#: Import name -> the distribution that provides it, for each package of the tools' extra.
KUBERNETES = {"kubernetes": "kubernetes"}
TOOLS = {**KUBERNETES, "grpc": "grpcio"}


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The import names among ``modules`` that cannot be imported here (found without importing)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError:  # an import hook that refuses the name
            found = False
        if not found:
            missing.append(name)
    return missing


def _message(command: str, missing: Iterable[str]) -> str:
    distributions = ", ".join(sorted({TOOLS.get(name, name) for name in missing}))
    return f"{command} needs {distributions}, not installed here: pip install 'runtimeproxy[{TOOLS_EXTRA}]'"


def require_tools(command: str, modules: Iterable[str] = TOOLS) -> None:
    """Raise a click error naming the extra to install when any of ``modules`` is missing."""
    missing = missing_modules(modules)
    if missing:
        raise click.ClickException(_message(command, missing))


def unavailable_command(name: str, command: str, missing: Iterable[str]) -> click.Command:
    """A stand-in for a tool whose extra is not installed: listed in --help, failing clearly when run."""
    message = _message(command, missing)

    def fail(**_: object) -> None:
        raise click.ClickException(message)

    return click.Command(
        name,
        callback=fail,
        short_help=f"(not installed: pip install 'runtimeproxy[{TOOLS_EXTRA}]')",
        help=message,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
