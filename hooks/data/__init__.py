"""Package data of runtimeproxy.hooks: the default QoS policy (``default-policy.yaml``). No code,
so it imports nothing."""
