"""The ``gpu`` plugin: a container sees the GPUs Koordinator's scheduler allocated to its pod.

koord-scheduler writes the devices it allocated to a pod into the pod annotation
``scheduling.koordinator.sh/device-allocated`` (Koordinator ``apis/extension/device_share.go``
``AnnotationDeviceAllocated``, ``DeviceAllocations``), a JSON object of device type -> list::

    {"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "100", ...}}, {"minor": 1}],
     "rdma": [{"minor": 0, "id": "0000:09:00.0", "resources": {...}}]}

As koordlet's gpu hook (``pkg/koordlet/runtimehooks/hooks/gpu/gpu.go``, feature gate
GPUEnvInject, off by default), at PreCreateContainer every container of such a pod gets
``NVIDIA_VISIBLE_DEVICES`` = the ``minor`` of each ``gpu`` entry, in order, joined by ``,``
(the NVIDIA container runtime exposes those devices). It replaces a value the container
already has. No annotation, ``null``, no ``gpu`` key, or an empty/``null`` list: nothing set.

Reading the annotation follows Go ``encoding/json`` into ``map[DeviceType][]*DeviceAllocation``
(``apiext.GetDeviceAllocations``): any decode error, for any device type, drops the whole
annotation; the hook then sets nothing and the container starts (koordlet's failure policy is
Ignore). Here that is a logged warning naming the cause. Decode errors: not JSON (an empty
annotation too), not an object, a device list that is not an array, an entry not an object,
``minor`` not an integer within int32 (``1.0`` and ``1e0`` too), ``id`` not a string, a
``resources`` quantity ``resource.ParseQuantity`` refuses, ``extension`` of the wrong shape.
As Go: map keys match exactly, a key given twice keeps the last; struct fields match
case-insensitively; ``null`` leaves a ``minor`` as it was (0 when absent); unknown keys are
ignored. Deliberate difference: a ``null`` entry in the ``gpu`` list is refused (koordlet
dereferences it and panics).

Not done: the HAMi-core part (pod label ``koordinator.sh/gpu-isolation-provider: HAMi-core``:
``CUDA_DEVICE_MEMORY_LIMIT``, ``CUDA_DEVICE_SM_LIMIT``, ``LD_PRELOAD`` of the vGPU library)
comes with bind mounts of that library into the container, and a hook answer carries no
mounts (docs/hook-api.md); without them those variables would point at nothing, so such a pod
gets ``NVIDIA_VISIBLE_DEVICES`` only, with a warning.

Switched on per class by ``gpu.<class>.enabled`` (off for every class by default, as koordlet's
gate): a pod that could write the annotation itself would choose its own GPUs, so admission
control must keep pods from setting it (docs/security.md), as Koordinator assumes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .. import annotation_json
from ..annotation_json import GoObject, json_kind, merged_map, struct_fields
from ..extended_resources import quantity_at
from ..policy import builtin_defaults
from ..sdk import ContainerInfo, HookPoint, HookResponse, Plugin, PodInfo
from ..settings import boolean, parsed_by

__all__ = [
    "DEVICE_ALLOCATED_ANNOTATION",
    "GPU_ISOLATION_PROVIDER_LABEL",
    "VISIBLE_DEVICES_ENV",
    "GPUSettings",
    "gpu_minors",
    "plugin",
]

# apis/extension: SchedulingDomainPrefix + "/device-allocated"; DomainPrefix + "gpu-isolation-provider".
DEVICE_ALLOCATED_ANNOTATION: Final = "scheduling.koordinator.sh/device-allocated"
GPU_ISOLATION_PROVIDER_LABEL: Final = "koordinator.sh/gpu-isolation-provider"
HAMI_CORE: Final = "HAMi-core"
VISIBLE_DEVICES_ENV: Final = "NVIDIA_VISIBLE_DEVICES"  # gpu.go GpuAllocEnv
_GPU: Final = "gpu"  # apis/scheduling/v1alpha1 DeviceType GPU
_INT32: Final = (-(1 << 31), (1 << 31) - 1)  # DeviceAllocation.Minor is int32
_INT64: Final = (-(1 << 63), (1 << 63) - 1)  # VirtualFunction.Minor is int


@dataclass(frozen=True)
class GPUSettings:
    """``enabled``: containers of the class get ``NVIDIA_VISIBLE_DEVICES`` from the pod's device allocation."""

    enabled: bool = field(metadata=parsed_by(boolean))


plugin = Plugin(
    "gpu",
    version="1.0",
    order=70,
    failure_policy="ignore",
    timeout=1.0,
    description="sets NVIDIA_VISIBLE_DEVICES to the GPUs koord-scheduler allocated to the pod",
    settings=GPUSettings,
    defaults=builtin_defaults("gpu"),
)


# --- the annotation (Go encoding/json rules; see the module doc) ----------------------------------


def _integer(value: object, where: str, bounds: tuple[int, int]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an integer, got {json_kind(value) if value is not None else 'null'}")
    if not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{where}: {value} is out of range")
    return value


def _string(value: object, where: str) -> None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {json_kind(value)}")


def _object(value: object, where: str) -> GoObject:
    if not isinstance(value, GoObject):
        raise ValueError(f"{where} must be an object, got {json_kind(value)}")
    return value


def _check_vf(value: object, where: str) -> None:
    if value is None:
        return
    found = struct_fields(_object(value, where), ("minor", "busID"))
    for minor in found["minor"]:
        if minor is not None:
            _integer(minor, f"{where}.minor", _INT64)
    for bus in found["busID"]:
        _string(bus, f"{where}.busID")


def _check_extension(value: object, where: str) -> None:
    """DeviceAllocationExtension: only its shape matters (Go fails the decode on a wrong one)."""
    if value is None:
        return
    found = struct_fields(_object(value, where), ("vfs", "gpuSharedResourceTemplate"))
    for vfs in found["vfs"]:
        if vfs is None:
            continue
        if isinstance(vfs, GoObject) or not isinstance(vfs, list):  # GoObject is a list of pairs
            raise ValueError(f"{where}.vfs must be an array, got {json_kind(vfs)}")
        for index, item in enumerate(vfs):
            _check_vf(item, f"{where}.vfs[{index}]")
    for template in found["gpuSharedResourceTemplate"]:
        _string(template, f"{where}.gpuSharedResourceTemplate")


def _minor(value: object, where: str) -> int:
    """One DeviceAllocation, checked whole; its minor (the last non-null one, 0 without)."""
    found = struct_fields(_object(value, where), ("minor", "resources", "id", "extension"))
    minor = 0
    for raw in found["minor"]:
        if raw is not None:  # Go: null into an int32 leaves it as it was
            minor = _integer(raw, f"{where}.minor", _INT32)
    merged_map(found["resources"], f"{where}.resources", quantity_at)
    for raw in found["id"]:
        _string(raw, f"{where}.id")
    for raw in found["extension"]:
        _check_extension(raw, f"{where}.extension")
    return minor


def _device_list(key: str, value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, GoObject) or not isinstance(value, list):  # GoObject is a list of pairs
        raise ValueError(f"{key} must be an array, got {json_kind(value)}")
    minors = []
    for index, item in enumerate(value):
        if item is None:
            if key == _GPU:
                raise ValueError(f"{key}[{index}] is null")
            continue
        minors.append(_minor(item, f"{key}[{index}]"))
    return tuple(minors)


def _decode(text: str) -> tuple[int, ...]:
    data = annotation_json.loads(text)
    if data is None:
        return ()
    devices: dict[str, tuple[int, ...]] = {}
    for key, value in _object(data, "the annotation"):
        devices[key] = _device_list(key, value)  # every type is decoded; a key given twice: the last wins
    return devices.get(_GPU, ())


def gpu_minors(annotations: Mapping[str, str]) -> tuple[tuple[int, ...] | None, str]:
    """The minors of the pod's allocated GPUs and a problem ("" when none).

    ``(None, "")`` without the annotation, ``(None, reason)`` when it is ignored, else the
    minors in order (``()`` when no GPU is allocated)."""
    text = annotations.get(DEVICE_ALLOCATED_ANNOTATION)
    if text is None:
        return None, ""
    try:
        return _decode(text), ""
    except json.JSONDecodeError as exc:
        return None, f"annotation {DEVICE_ALLOCATED_ANNOTATION} ignored: not JSON ({exc.msg})"
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        return None, f"annotation {DEVICE_ALLOCATED_ANNOTATION} ignored: {reason}"


# --- the hook ------------------------------------------------------------------------------------


@plugin.on(HookPoint.PRE_CREATE_CONTAINER)
async def inject_visible_devices(
    *, pod: PodInfo, container: ContainerInfo | None, response: HookResponse, log: Any, **kwargs: Any
) -> None:
    """Set NVIDIA_VISIBLE_DEVICES from the allocation; log and skip an annotation that does not decode."""
    if container is None:
        return
    minors, problem = gpu_minors(pod.annotations)
    if problem:
        log.warning("GPU allocation unusable; no GPU env set", error=problem)
        return
    if not minors:
        return
    response.env.set(VISIBLE_DEVICES_ENV, ",".join(str(minor) for minor in minors))
    if pod.labels.get(GPU_ISOLATION_PROVIDER_LABEL) == HAMI_CORE:
        log.warning(
            "HAMi-core GPU isolation needs bind mounts a hook answer cannot carry; only the visible devices are set",
            label=GPU_ISOLATION_PROVIDER_LABEL,
        )
