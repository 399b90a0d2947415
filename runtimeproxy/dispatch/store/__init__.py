"""What the proxy remembers about each pod sandbox and container, and how it relearns it.

Hooks need more than the CRI call in hand: StartContainer names only a container ID, yet
the PreStartContainer hook is sent the pod's metadata, labels, cgroup parent and resources
and the container's resources and environment. `PodStore` keeps those, filled from the
RunPodSandbox / CreateContainer requests the proxy relays (`sandbox_from_request`,
`container_from_request`) and updated on resource updates and removals.

A restarted proxy has an empty store. `RuntimeLoader` rebuilds it from the runtime
(ListPodSandbox, ListContainers, then each object's verbose status, whose info holds the
CRI config it was created with, as Go JSON); `StoreRebuilder` runs that load in the
background, retrying while the runtime is down, and loads single unknown objects on
demand. Objects the runtime has but protobuf cannot decode are skipped and reported; for
the hook layer they raise `UnreadableObjectError` (the interceptor handles it as a failure
of the hook layer: under a Fail server at the call's hook point the call is refused, else
it is relayed without hooks).

One job a module:

* ``entries``: `SandboxEntry`, `ContainerEntry`, built from relayed requests;
* ``pod_store``: `PodStore`, the store itself (single-threaded by design, see there);
* ``go_json``: `message_from_go_json`, containerd's verbose info to protobuf;
* ``from_runtime``: entries from the runtime's Status / List answers, `current_resources`;
* ``unreadable``: objects protobuf cannot decode, and how they are reported;
* ``loader``: `RuntimeLoader`, reading everything back from the runtime;
* ``rebuilder``: `StoreRebuilder`, the background rebuild and on-demand loads.

This package re-exports their public names; import them from here.
"""

from __future__ import annotations

from .entries import ContainerEntry, SandboxEntry, container_from_request, sandbox_from_request
from .from_runtime import (
    container_from_list_item,
    container_from_status,
    current_resources,
    sandbox_from_list_item,
    sandbox_from_status,
)
from .go_json import message_from_go_json
from .loader import RUNTIME_DOWN, LoadResult, RuntimeLoader
from .pod_store import PodStore
from .rebuilder import StoreRebuilder
from .unreadable import Listing, Undecodable, UnreadableObjectError, UnreadableObjects, describe_error

__all__ = [
    "RUNTIME_DOWN",
    "ContainerEntry",
    "Listing",
    "LoadResult",
    "PodStore",
    "RuntimeLoader",
    "SandboxEntry",
    "StoreRebuilder",
    "Undecodable",
    "UnreadableObjectError",
    "UnreadableObjects",
    "container_from_list_item",
    "container_from_request",
    "container_from_status",
    "current_resources",
    "describe_error",
    "message_from_go_json",
    "sandbox_from_list_item",
    "sandbox_from_request",
    "sandbox_from_status",
]
