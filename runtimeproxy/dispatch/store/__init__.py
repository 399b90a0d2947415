"""What the proxy remembers about each pod sandbox and container, and how it relearns it.

`PodStore` keeps the entries hooks are told about (runtimeproxy.runtime_state), filled from
the RunPodSandbox / CreateContainer requests the proxy relays and updated on resource
updates and removals. A restarted proxy has an empty store: `StoreRebuilder` fills it from
the runtime (runtime_state's `RuntimeLoader`) in the background, retrying while the runtime
is down, and loads single unknown objects on demand. For the hook layer an object the
runtime has but protobuf cannot decode raises `UnreadableObjectError` (the interceptor
handles it as a failure of the hook layer: under a Fail server at the call's hook point the
call is refused, else it is relayed without hooks).

One job a module:

* ``pod_store``: `PodStore`, the store itself (single-threaded by design, see there);
* ``rebuilder``: `StoreRebuilder`, the background rebuild and on-demand loads;
* ``store_metrics``: `StoreMetrics`, the store's Prometheus counter.

This package re-exports their public names; import them from here. It follows the imports
of runtimeproxy.dispatch.
"""

from __future__ import annotations

from .pod_store import PodStore
from .rebuilder import StoreRebuilder
from .store_metrics import StoreMetrics

__all__ = ["PodStore", "StoreMetrics", "StoreRebuilder"]
