"""runtimeproxy: a CRI proxy that calls runtime-hook servers around pod and container lifecycle calls.

Packages, those the others build on first: api (generated protobuf), common (what both daemons
are built from), hookapi (the hook vocabulary both ends share), wire (HTTP/2 and gRPC),
runtime_state (the runtime's pods read back over CRI), kubelet_model (what kubelet sends for a
manifest); relay (the data path), dispatch (the proxy's hook layer), proxy (the runtime-proxy
daemon); play and testbed (kubelet's and containerd's stand-ins); hooks (runtime-hooks,
installed from the hooks/ folder). Each says in its docstring what it may import; this module
imports nothing of them.
"""

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
