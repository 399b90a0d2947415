"""Package data of runtimeproxy.hooks: the default QoS policy (``default-policy.yaml``)."""
