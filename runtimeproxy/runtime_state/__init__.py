"""What the runtime has, read back over CRI: the pod sandboxes and containers, with the
configs they were created with, for the proxy's pod store and for runtime-hooks alike.

Hooks need more than the CRI call in hand: StartContainer names only a container ID, yet
the PreStartContainer hook is sent the pod's metadata, labels, cgroup parent and resources
and the container's resources and environment. An entry (`SandboxEntry`, `ContainerEntry`)
holds those, built from a relayed RunPodSandbox / CreateContainer request or read back from
the runtime. `RuntimeLoader` reads them (ListPodSandbox, ListContainers, then each object's
verbose status, whose info holds the CRI config it was created with, as Go JSON), into a
store when given one (the proxy's `runtimeproxy.dispatch.store.PodStore`). Objects the
runtime has but protobuf cannot decode are skipped and reported; asked for by name they
raise `UnreadableObjectError`.

One job a module:

* ``entries``: `SandboxEntry`, `ContainerEntry`, built from relayed requests;
* ``verbose_info``: `message_from_go_json`, containerd's verbose info to protobuf;
* ``from_runtime``: entries from the runtime's Status / List answers, `current_resources`;
* ``unreadable``: objects protobuf cannot decode, and how they are reported;
* ``loader``: `RuntimeLoader`, reading everything back from the runtime.

This package re-exports their public names; import them from here.

May import the standard library, third-party libraries, runtimeproxy.api, runtimeproxy.hookapi,
runtimeproxy.common and runtimeproxy.wire; never the relay, the proxy's hook layer
(runtimeproxy.dispatch), runtimeproxy.proxy or runtime-hooks.
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
from .loader import RUNTIME_DOWN, EntryStore, LoadResult, RuntimeLoader
from .unreadable import Listing, Undecodable, UnreadableObjectError, UnreadableObjects, describe_error
from .verbose_info import message_from_go_json

__all__ = [
    "RUNTIME_DOWN",
    "ContainerEntry",
    "EntryStore",
    "Listing",
    "LoadResult",
    "RuntimeLoader",
    "SandboxEntry",
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
