"""Where kubelet puts a pod's volumes on the node, and what goes in them, computed without I/O.

kubelet (pkg/volume, pkg/kubelet/volumemanager) gives every volume that is not a host path a
directory ``<root>/pods/<uid>/volumes/<plugin>/<volume name>`` (``root`` is kubelet's
``--root-dir``, ``/var/lib/kubelet``); the container mounts that directory:

* ``configMap`` (plugin ``kubernetes.io~configmap``): the keys as files, written the way
  kubelet's atomic writer does (``runtimeproxy.play.volumes`` materialises them): a
  timestamped directory ``..<time>`` holding the files, a ``..data`` symlink to it and one
  symlink per top-level name into ``..data``. ``items`` picks keys and names their paths,
  ``defaultMode`` (0644) and ``mode`` set the file modes; a key that ``items`` names but the
  ConfigMap lacks, or a ConfigMap the input lacks, fails unless ``optional``. The mount is
  read-only whatever the pod says, as kubelet makes it.
* ``emptyDir`` (plugin ``kubernetes.io~empty-dir``): an empty directory; with ``medium:
  Memory`` a tmpfs whose size is the ``sizeLimit`` (none: the tmpfs default).
* ``hostPath``: the path itself; its ``type`` is checked (or the path created) before the
  sandbox starts, as kubelet's hostPath type checker does.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from runtimeproxy.kubelet_model.manifest import ConfigMap, parse_quantity_value

__all__ = [
    "CONFIGMAP_PLUGIN",
    "DEFAULT_CONFIGMAP_MODE",
    "DEFAULT_KUBELET_ROOT",
    "EMPTY_DIR_PLUGIN",
    "PodSetupError",
    "VolumePlan",
    "plan_volumes",
    "pod_directory",
]

DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
CONFIGMAP_PLUGIN = "kubernetes.io~configmap"
EMPTY_DIR_PLUGIN = "kubernetes.io~empty-dir"
DEFAULT_CONFIGMAP_MODE = 0o644

VolumeKind = Literal["hostPath", "configMap", "emptyDir"]


class PodSetupError(ValueError):
    """A volume or environment variable kubelet could not set up (a ConfigMap or key missing):
    kubelet would keep the pod waiting; play says why and starts nothing."""


@dataclass(frozen=True)
class VolumePlan:
    """One volume: its kind, the node path containers mount, and what to put there.

    ``files`` (configMap) maps a relative path to (content, mode); ``host_path_type`` is the
    hostPath ``type`` ("" checks nothing); ``memory`` and ``size_limit`` (bytes, None: no
    limit) are an emptyDir's medium.
    """

    name: str
    kind: VolumeKind
    path: str
    host_path_type: str = ""
    files: Mapping[str, tuple[bytes, int]] = field(default_factory=dict)
    memory: bool = False
    size_limit: int | None = None

    @property
    def read_only(self) -> bool:
        """Mounted read-only whatever the volume mount says."""
        return self.kind == "configMap"


def pod_directory(kubelet_root: str, uid: str) -> str:
    """``<root>/pods/<uid>``: where kubelet keeps a pod's volumes."""
    return posixpath.join(kubelet_root, "pods", uid)


def plan_volumes(
    pod: Any, kubelet_root: str = DEFAULT_KUBELET_ROOT, config_maps: Mapping[str, ConfigMap] | None = None
) -> tuple[VolumePlan, ...]:
    """Every volume of the pod (in spec order), or :class:`PodSetupError` for one that cannot be set up."""
    maps = config_maps or {}
    volumes_dir = posixpath.join(pod_directory(kubelet_root, pod.metadata.uid), "volumes")
    plans = []
    for volume in pod.spec.volumes or []:
        if volume.host_path is not None:
            plans.append(VolumePlan(volume.name, "hostPath", volume.host_path.path, volume.host_path.type or ""))
        elif volume.config_map is not None:
            path = posixpath.join(volumes_dir, CONFIGMAP_PLUGIN, volume.name)
            plans.append(VolumePlan(volume.name, "configMap", path, files=_config_map_files(volume, maps)))
        elif volume.empty_dir is not None:
            path = posixpath.join(volumes_dir, EMPTY_DIR_PLUGIN, volume.name)
            limit = volume.empty_dir.size_limit
            plans.append(
                VolumePlan(
                    volume.name,
                    "emptyDir",
                    path,
                    memory=volume.empty_dir.medium == "Memory",
                    size_limit=None if limit is None else int(parse_quantity_value(limit)),
                )
            )
        else:  # the manifest check lets no other source through
            raise PodSetupError(f"volume {volume.name!r}: source not supported by play")
    return tuple(plans)


def _config_map_files(volume: Any, maps: Mapping[str, ConfigMap]) -> dict[str, tuple[bytes, int]]:
    source = volume.config_map
    default_mode = DEFAULT_CONFIGMAP_MODE if source.default_mode is None else source.default_mode
    config_map = maps.get(source.name)
    if config_map is None:
        if source.optional:
            return {}
        raise PodSetupError(
            f"volume {volume.name!r}: configmap {source.name!r} not found "
            "(put the ConfigMap in the input or pass it with --configmap)"
        )
    if not source.items:
        return {key: (data, default_mode) for key, data in config_map.files.items()}
    files = {}
    for item in source.items:
        if item.key not in config_map.files:
            if source.optional:
                continue
            raise PodSetupError(f"volume {volume.name!r}: configmap {source.name!r} has no key {item.key!r}")
        files[item.path] = (config_map.files[item.key], default_mode if item.mode is None else item.mode)
    return files
