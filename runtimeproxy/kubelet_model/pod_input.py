"""A pod manifest with what kubelet would know of its node: the ConfigMaps its volumes and
variables name (those in the manifest's input and in ``--configmap`` files, of the pod's
namespace), the node's name and address. What `runtime-proxy play` and `runtime-hooks explain`
read before planning the pod (their command-line options: runtimeproxy.common.cli_options
``node_options``)."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

from runtimeproxy.kubelet_model.manifest import ConfigMap, ManifestError, load_pod_input, parse_config_maps_text
from runtimeproxy.kubelet_model.pod_plan import NodeFacts

__all__ = ["load_pod_and_node"]


def load_pod_and_node(
    manifest: str, configmap_files: Sequence[str] = (), node_name: str | None = None, node_ip: str = ""
) -> tuple[Any, NodeFacts, str]:
    """The pod, the node facts with every ConfigMap of the input and of ``configmap_files``, and
    what the pod was derived from ("" for a Pod). ``node_name`` defaults to the host name.
    ManifestError for an unreadable or invalid file."""
    node = node_name or socket.gethostname()
    loaded = load_pod_input(manifest, node_name=node)
    config_maps = dict(loaded.config_maps)
    namespace = str(getattr(loaded.pod.metadata, "namespace", ""))
    for path in configmap_files:
        config_maps.update(_config_maps_in(path, namespace))
    return loaded.pod, NodeFacts(node_name=node, node_ip=node_ip, config_maps=config_maps), loaded.derived_from


def _config_maps_in(path: str, namespace: str) -> dict[str, ConfigMap]:
    """The ConfigMaps of one ``--configmap`` file that are in the pod's namespace."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(path, "", f"cannot read ConfigMaps: {exc}") from exc
    return {name: cm for name, cm in parse_config_maps_text(text, path).items() if cm.namespace == namespace}
