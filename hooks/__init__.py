"""runtimeproxy.hooks: the runtime-hooks server and its QoS plugins (installed as ``runtimeproxy.hooks``).

May import the standard library, third-party libraries, runtimeproxy.api, hookapi,
runtime_state, wire, common and kubelet_model; never the relay, the proxy's hook layer
(runtimeproxy.dispatch), runtimeproxy.proxy, play or testbed. The plugin SDK (sdk) and the
test kit (testkit) load none of those.
"""
