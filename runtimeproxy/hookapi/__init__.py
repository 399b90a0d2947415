"""The hook vocabulary the proxy and runtime-hooks share: the hook points (hookpoints), the
fields of a container's resources (resource_fields), what the kernel and the runtime accept
from hook output (value_bounds), how an answer merges into a CRI request and where a pod's
cgroup may go (merge_rules), how a CRI call and a hook request and response map onto each
other (cri_mapping), and the defaults both ends start from (defaults).

May import the standard library, protobuf and runtimeproxy.api only.
"""
