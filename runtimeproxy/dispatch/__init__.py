"""The proxy's hook layer: calling runtime-hook servers around CRI lifecycle calls. Registration
files (registry), hook calls with timeouts and failure policies (dispatcher), per-pod order
(sequencer), the pod store (store), and the interceptor the relay hands held calls to
(hook_interceptor), built and owned by layer.

May import runtimeproxy.api, hookapi, runtime_state, common, wire and relay (the seam it plugs
into); never runtimeproxy.proxy, runtime-hooks, play or testbed.
"""
