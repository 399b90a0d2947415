"""runtimeproxy: a CRI proxy that calls runtime-hook servers around pod and container lifecycle calls."""

from typing import Any


def __getattr__(name: str) -> Any:
    """``__version__``, read from the installed metadata on first use: importlib.metadata (and the
    email and zipfile modules it loads) costs the daemon about 2 MiB it never needs otherwise."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("runtimeproxy")
    except PackageNotFoundError:  # running from a source tree that is not installed
        found = "0.0.0+source"
    globals()["__version__"] = found
    return found
