"""runtimeproxy: a CRI proxy that calls runtime-hook servers around pod and container lifecycle calls."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("runtimeproxy")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
