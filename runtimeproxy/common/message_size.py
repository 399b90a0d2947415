"""Limits the proxy and runtime-hooks share, so that the two ends of a hook call agree."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_MAX_MESSAGE_SIZE", "MIN_MESSAGE_SIZE"]

#: The largest gRPC message either daemon sends or accepts unless configured otherwise:
#: kubelet's and containerd's CRI limit, so that a request kubelet may send is relayed whole
#: and handed whole to the hook servers.
DEFAULT_MAX_MESSAGE_SIZE: Final = 16 * 1024 * 1024
#: gRPC's own default receive limit: a smaller limit would refuse what plain gRPC peers accept.
MIN_MESSAGE_SIZE: Final = 4 * 1024 * 1024
