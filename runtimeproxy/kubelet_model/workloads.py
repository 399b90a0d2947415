"""The Pod a workload controller would create on this node, and the ConfigMaps beside it.

``runtime-proxy play`` takes what ``helm template`` renders: a DaemonSet whose pod
template is the pod to run, and the ConfigMaps its volumes name. The API server and the
DaemonSet controller are not here, so this module plays their part for one node:

* name: ``<daemonset name>-<5 characters>``, as the API server completes the controller's
  ``generateName`` (the base cut to 58 characters); the 5 characters come from the API server's alphabet
  (``bcdfghjklmnpqrstvwxz2456789``) but are derived from the namespace, the DaemonSet's
  name and the node name instead of drawn at random, so the same input finds the same pod
  again (``--delete``);
* uid: derived from namespace and name (:func:`~runtimeproxy.kubelet_model.manifest.derive_pod_uid`);
* labels: the template's, plus ``controller-revision-hash`` and ``pod-template-generation``
  as the DaemonSet controller adds them. The revision hash is this module's own FNV-1a hash of
  the template (the controller hashes its Go structure): it changes when the template does,
  but its value differs from a cluster's;
* annotations: the template's; ``ownerReferences``: the DaemonSet (no uid: none was assigned);
* ``spec.nodeName``: the node, as the scheduler binds it.

The node affinity and the tolerations the controller adds only steer scheduling and are
left out: nothing of them reaches the runtime.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "GENERATED_NAME_ALPHABET",
    "POD_TEMPLATE_KINDS",
    "daemonset_pod",
    "generated_name",
    "generated_suffix",
    "template_hash",
]

# What the API server picks generateName suffixes from (k8s.io/apimachinery/pkg/util/rand).
GENERATED_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# Workloads whose pod template play can run (others are refused by name).
POD_TEMPLATE_KINDS = {"DaemonSet": "apps/v1"}
# names.SimpleNameGenerator: a generated name stays within 63 characters.
_MAX_GENERATED_BASE = 63 - 5
REVISION_HASH_LABEL = "controller-revision-hash"
TEMPLATE_GENERATION_LABEL = "pod-template-generation"


def generated_suffix(*parts: str, length: int = 5) -> str:
    """``length`` characters of the API server's alphabet, derived from ``parts``."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()
    return "".join(GENERATED_NAME_ALPHABET[byte % len(GENERATED_NAME_ALPHABET)] for byte in digest[:length])


def generated_name(base: str, *seed: str) -> str:
    """``generateName`` completed as the API server does: the base cut to 58 characters, then
    five characters (derived from the base and ``seed`` here, random there)."""
    return base[:_MAX_GENERATED_BASE] + generated_suffix(base, *seed)


def template_hash(template: Mapping[str, Any]) -> str:
    """FNV-1a (32 bit) of the template's canonical JSON, spelled in the generated-name alphabet."""
    value = 0x811C9DC5
    for byte in json.dumps(template, sort_keys=True, separators=(",", ":"), default=str).encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "".join(GENERATED_NAME_ALPHABET[int(digit) % len(GENERATED_NAME_ALPHABET)] for digit in str(value))


def daemonset_pod(daemonset: Mapping[str, Any], node_name: str, namespace: str) -> dict[str, Any]:
    """The raw Pod object the DaemonSet's controller would create on ``node_name``.

    ``daemonset`` is already checked to have a ``metadata.name`` (a string) and a
    ``spec.template`` mapping; the pod's own fields are checked by the caller.
    """
    name = str(daemonset["metadata"]["name"])
    template = daemonset["spec"]["template"]
    template_meta = template.get("metadata") or {}
    pod_name = generated_name(f"{name}-", namespace, node_name)
    labels = dict(template_meta.get("labels") or {})
    labels[REVISION_HASH_LABEL] = template_hash(template)
    labels[TEMPLATE_GENERATION_LABEL] = str(daemonset.get("metadata", {}).get("generation") or 1)
    metadata: dict[str, Any] = {
        "name": pod_name,
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": "",
                             "controller": True, "blockOwnerDeletion": True}],
    }
    if template_meta.get("annotations") is not None:
        metadata["annotations"] = template_meta["annotations"]
    spec = dict(template.get("spec") or {})
    spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
