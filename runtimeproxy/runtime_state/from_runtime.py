"""Entries built from the runtime's answers: a verbose PodSandboxStatus / ContainerStatus,
whose ``info["info"]`` JSON (containerd) holds the CRI config the object was created with
(decoded by verbose_info.py), or a List item alone when the status call fails.

What survives that round trip through containerd 1.6.20 and 1.7.24 (Debian's builds, whose
verbose info has the same shape; checked against both real daemons by
tests/dispatch/test_dispatch_store.py): every field of `SandboxEntry` and `ContainerEntry` -
metadata, labels, annotations, cgroup parent, runtime handler, the pod's
``linux.resources`` and ``linux.overhead`` (hugepages, unified and swap included), the
container's resources, env order and values (``=``, empty, non-ASCII) and image. Lost
are only fields newer than the cri-api the containerd was built with, which appear in
``config`` alone: with 1.6.20 e.g. ``ContainerConfig.stop_signal`` / ``CDI_devices``,
``ImageSpec.user_specified_image`` / ``image_ref``, ``Mount.mount_options`` and the
security contexts' ``supplemental_groups_policy``; Debian's 1.7.24 (cri-api 0.32.3) keeps
``CDI_devices``, ``user_specified_image`` and ``supplemental_groups_policy``. The runtime
keeps the create-time config, not later UpdateContainerResources: a container's current
resources are the create-time ones with the values ContainerStatus reports (from the OCI
spec, which updates change) laid over them; see `current_resources`.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, TypeVar

import structlog
from google.protobuf.message import Message

from runtimeproxy.api.runtime.v1 import api_pb2 as pb
from runtimeproxy.hookapi import resource_fields

from .entries import (
    ContainerEntry,
    SandboxEntry,
    container_entry,
    container_from_request,
    copy_message,
    sandbox_entry,
    sandbox_from_request,
)
from .verbose_info import message_from_go_json

log = structlog.get_logger(__package__)

M = TypeVar("M", bound=Message)

# Values the OCI spec holds and UpdateContainerResources changes; ContainerStatus reports
# them from the spec, so they are current where the info config is create-time.
# oom_score_adj and the swap limit are not among them: each has its own rule below.
_UPDATABLE_SCALARS = tuple(
    name for name in resource_fields.SCALARS if name not in ("oom_score_adj", "memory_swap_limit_in_bytes")
)


def current_resources(
    configured: pb.LinuxContainerResources | None,
    reported: pb.LinuxContainerResources | None,
    *,
    config_known: bool = True,
) -> pb.LinuxContainerResources | None:
    """A container's current resources from its create-time config and ContainerStatus.

    Values the status reports as set replace the configured ones (containerd applies an
    update's non-zero values only, so a zero there means "unchanged"). ``oom_score_adj``
    stays as configured: containerd may raise it (restrict_oom_score_adj) and updates do
    not change it. The status's swap limit equal to the memory limit is containerd's
    default when none was asked for; it is taken only when one was configured or it
    differs. Without a config (`config_known` False) the status alone is used.
    """
    if reported is None or not reported.ListFields():
        return copy_message(configured) if configured is not None else None
    swap = reported.memory_swap_limit_in_bytes
    asked_swap = configured is not None and configured.memory_swap_limit_in_bytes != 0
    derived_swap = swap == reported.memory_limit_in_bytes and not asked_swap
    if not config_known:
        merged = copy_message(reported)
        if derived_swap:
            merged.memory_swap_limit_in_bytes = 0
        return merged
    merged = pb.LinuxContainerResources()
    if configured is not None:
        merged.CopyFrom(configured)
    changed = False
    for name in _UPDATABLE_SCALARS:
        value = getattr(reported, name)
        if value and value != getattr(merged, name):
            setattr(merged, name, value)
            changed = True
    if reported.hugepage_limits and list(reported.hugepage_limits) != list(merged.hugepage_limits):
        del merged.hugepage_limits[:]
        merged.hugepage_limits.extend(reported.hugepage_limits)
        changed = True
    if reported.unified and dict(reported.unified) != dict(merged.unified):
        merged.unified.clear()
        merged.unified.update(reported.unified)
        changed = True
    if swap and not derived_swap and swap != merged.memory_swap_limit_in_bytes:
        merged.memory_swap_limit_in_bytes = swap
        changed = True
    if configured is None and not changed:
        return None
    return merged


def _info_json(info: Any, kind: str, object_id: str) -> dict[str, Any] | None:
    """The verbose-status info document (containerd: key "info") or None, with a warning."""
    raw = info.get("info")
    if raw is None:  # another runtime may use another key: take any JSON with a config
        for value in info.values():
            with contextlib.suppress(ValueError):
                doc = json.loads(value)
                if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
                    return doc
        log.warning(
            "runtime gave no config for the store; using list/status data only",
            kind=kind,
            id=object_id,
            info_keys=sorted(info),
        )
        return None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        log.warning("unparseable status info; using list/status data only", kind=kind, id=object_id, error=str(exc))
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        log.warning("status info holds no config; using list/status data only", kind=kind, id=object_id)
        return None
    return doc


def _parse_config(doc: dict[str, Any] | None, message: M, kind: str, object_id: str) -> M | None:
    if doc is None:
        return None
    problems = message_from_go_json(doc["config"], message)
    if problems:
        log.warning("parts of the runtime's config skipped", kind=kind, id=object_id, skipped=problems[:20])
    return message


def sandbox_from_status(status: pb.PodSandboxStatus, info: Any, listed: pb.PodSandbox | None = None) -> SandboxEntry:
    """A sandbox entry from a verbose PodSandboxStatus (and its List item, if any)."""
    doc = _info_json(info, "sandbox", status.id)
    config = _parse_config(doc, pb.PodSandboxConfig(), "sandbox", status.id)
    handler = status.runtime_handler or (listed.runtime_handler if listed is not None else "")
    if not handler and doc is not None and isinstance(doc.get("runtimeHandler"), str):
        handler = doc["runtimeHandler"]
    if config is None:
        meta = status.metadata if status.HasField("metadata") or listed is None else listed.metadata
        return sandbox_entry(
            status.id,
            meta,
            status.labels or (listed.labels if listed is not None else {}),
            status.annotations or (listed.annotations if listed is not None else {}),
            runtime_handler=handler,
            partial=True,
        )
    entry = sandbox_from_request(status.id, pb.RunPodSandboxRequest(config=config, runtime_handler=handler))
    if not config.HasField("metadata"):  # keep what Status knows
        entry.name, entry.namespace = status.metadata.name, status.metadata.namespace
        entry.uid, entry.attempt = status.metadata.uid, status.metadata.attempt
    return entry


def sandbox_from_list_item(item: pb.PodSandbox) -> SandboxEntry:
    """A sandbox entry from its ListPodSandbox item alone (partial)."""
    return sandbox_entry(
        item.id, item.metadata, item.labels, item.annotations, runtime_handler=item.runtime_handler, partial=True
    )


def container_from_status(status: pb.ContainerStatus, info: Any, listed: pb.Container | None = None) -> ContainerEntry:
    """A container entry from a verbose ContainerStatus (and its List item, if any)."""
    doc = _info_json(info, "container", status.id)
    config = _parse_config(doc, pb.ContainerConfig(), "container", status.id)
    sandbox_id = listed.pod_sandbox_id if listed is not None else ""
    if not sandbox_id and doc is not None and isinstance(doc.get("sandboxID"), str):
        sandbox_id = doc["sandboxID"]
    reported = status.resources.linux if status.resources.HasField("linux") else None
    if config is None:
        return container_entry(
            status.id,
            sandbox_id,
            status.metadata,
            status.labels,
            status.annotations,
            resources=current_resources(None, reported, config_known=False),
            image=status.image.image,
            partial=True,
        )
    configured = config.linux.resources if config.linux.HasField("resources") else None
    resources = current_resources(configured, reported)
    if resources is not None:
        config.linux.resources.CopyFrom(resources)
    entry = container_from_request(status.id, pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config))
    if not config.HasField("metadata"):
        entry.name, entry.attempt = status.metadata.name, status.metadata.attempt
    return entry


def container_from_list_item(item: pb.Container) -> ContainerEntry:
    """A container entry from its ListContainers item alone (partial)."""
    return container_entry(
        item.id,
        item.pod_sandbox_id,
        item.metadata,
        item.labels,
        item.annotations,
        image=item.image.image,
        partial=True,
    )
