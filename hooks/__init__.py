"""runtimeproxy.hooks: the runtime-hooks server and its QoS plugins (installed as ``runtimeproxy.hooks``)."""
