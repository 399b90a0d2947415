"""runtime-hooks as an NRI plugin (``runtime-hooks serve --nri-socket``): docs/nri.md.

ttrpc framing (ttrpc.py), NRI's connection multiplexing (mux.py), unary ttrpc endpoints
(rpc.py), the connection to the runtime's socket (runtime_link.py), registration and
reconnection (plugin.py), the Plugin service answered by the plugin runner (service.py),
per-pod order for notifications answered before their hooks run (ordering.py), the OOM score
written to the started container's process (oom.py), NRI data as the plugins see it
(mapping.py), which hook points run in which mode (modes.py), container repair in NRI mode
(repair.py), NRI mode's metrics (nri_metrics.py), what `serve` starts (serving.py).

Follows the imports of runtimeproxy.hooks.
"""
