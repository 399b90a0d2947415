"""Send a :class:`~runtimeproxy.kubelet_model.pod_plan.PodPlan` to a CRI runtime.

:func:`play` does what kubelet does to start a Pod: make sure the images are
there, create the pod log directory, RunPodSandbox, then CreateContainer and
StartContainer for every container (init containers first, each waited for
until it exits successfully, sidecars just started).  When a step fails it
undoes what it created, says so, and raises :class:`PlayError`.

:func:`delete` finds a Pod's sandboxes by the ``io.kubernetes.pod.uid``
label, so it needs only the manifest, and stops and removes their
containers and then the sandboxes, then the pod's configMap and emptyDir
volumes (:mod:`runtimeproxy.play.volumes`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from runtimeproxy.api.runtime.v1 import api_pb2 as cri
from runtimeproxy.kubelet_model.pod_plan import POD_UID_LABEL, ContainerPlan, PodPlan
from runtimeproxy.play import volumes
from runtimeproxy.play.cri_client import CriClient

__all__ = [
    "ContainerResult",
    "DeleteResult",
    "PlayError",
    "PlayResult",
    "delete",
    "play",
]

Say = Callable[[str], None]
_INIT_POLL_SECONDS = 0.1


class PlayError(RuntimeError):
    """A CRI call (or an init container) failed.

    ``step`` names what was being done, ``code`` is the gRPC status code
    (None when the failure is not a gRPC error), ``details`` the status
    details, and ``cleanup`` lists what was undone (or failed to be).
    """

    def __init__(
        self,
        step: str,
        details: str,
        code: grpc.StatusCode | None = None,
        cleanup: list[str] | None = None,
    ) -> None:
        self.step = step
        self.details = details
        self.code = code
        self.cleanup = list(cleanup or [])
        where = f"{code.name}: " if code is not None else ""
        super().__init__(f"{step} failed: {where}{details}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "code": self.code.name if self.code is not None else None,
            "details": self.details,
            "cleanup": self.cleanup,
        }


@dataclass
class ContainerResult:
    name: str
    container_id: str
    image: str
    image_ref: str
    kind: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "container_id": self.container_id,
            "image": self.image,
            "image_ref": self.image_ref,
            "kind": self.kind,
        }


@dataclass
class PlayResult:
    pod_sandbox_id: str
    plan: PodPlan
    containers: list[ContainerResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.plan.summary(),
            "pod_sandbox_id": self.pod_sandbox_id,
            "containers": [container.to_dict() for container in self.containers],
        }


@dataclass
class DeleteResult:
    uid: str
    pod_sandbox_ids: list[str] = field(default_factory=list)
    container_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "pod_sandbox_ids": self.pod_sandbox_ids,
            "container_ids": self.container_ids,
        }


def _quiet(_: str) -> None:
    pass


def _grpc_error(step: str, exc: grpc.RpcError) -> PlayError:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return PlayError(step, details or "", code)


def _call(step: str, method: Any, request: Any, timeout: float) -> Any:
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as exc:
        raise _grpc_error(step, exc) from exc


def _ensure_images(plan: PodPlan, client: CriClient, pull: bool, say: Say) -> dict[str, str]:
    """Image name -> image id (what kubelet calls the image ref)."""
    refs: dict[str, str] = {}
    for image in plan.images:
        spec = cri.ImageSpec(image=image, user_specified_image=image)
        status = _call(
            f"ImageStatus {image}",
            client.image.ImageStatus,
            cri.ImageStatusRequest(image=spec),
            client.timeout,
        )
        if status.HasField("image") and status.image.id:
            refs[image] = status.image.id
            say(f"image {image}: present ({status.image.id})")
            continue
        if not pull:
            raise PlayError(
                f"ImageStatus {image}",
                f"image {image!r} is not present on the node (pass --pull to pull it)",
                grpc.StatusCode.NOT_FOUND,
            )
        say(f"image {image}: pulling")
        pulled = _call(
            f"PullImage {image}",
            client.image.PullImage,
            cri.PullImageRequest(image=spec, sandbox_config=plan.sandbox_config),
            client.timeout,
        )
        refs[image] = pulled.image_ref or image
        say(f"image {image}: pulled ({refs[image]})")
    return refs


def _wait_for_exit(client: CriClient, container_id: str, name: str, deadline: float) -> None:
    step = f"init container {name}"
    while True:
        response = _call(
            f"ContainerStatus {name}",
            client.runtime.ContainerStatus,
            cri.ContainerStatusRequest(container_id=container_id),
            client.timeout,
        )
        status = response.status
        if status.state == cri.CONTAINER_EXITED:
            if status.exit_code != 0:
                reason = f" ({status.reason})" if status.reason else ""
                raise PlayError(step, f"exited with code {status.exit_code}{reason}")
            return
        if time.monotonic() >= deadline:
            raise PlayError(step, "did not finish in time", grpc.StatusCode.DEADLINE_EXCEEDED)
        time.sleep(_INIT_POLL_SECONDS)


def play(
    plan: PodPlan,
    client: CriClient,
    *,
    pull: bool = False,
    say: Say | None = None,
    make_log_dirs: bool = True,
) -> PlayResult:
    """Start the Pod described by ``plan``; returns the sandbox and container ids.

    ``say`` receives one line of progress per step.  Images must already be
    on the node unless ``pull`` is true.  On failure everything created so
    far is stopped and removed before :class:`PlayError` is raised.
    """
    say = say or _quiet
    refs = _ensure_images(plan, client, pull, say)
    fresh_pod_directory = bool(plan.pod_directory) and not os.path.exists(plan.pod_directory)
    try:
        for line in volumes.set_up(plan.volumes):
            say(line)
    except volumes.VolumeSetupError as exc:
        notes = volumes.tear_down(plan.pod_directory) if fresh_pod_directory else []
        raise PlayError("volumes", str(exc), cleanup=notes) from exc
    if make_log_dirs:
        os.makedirs(plan.log_directory, mode=0o755, exist_ok=True)
        for container in plan.containers:
            os.makedirs(os.path.join(plan.log_directory, container.name), mode=0o755, exist_ok=True)

    try:
        response = _call("RunPodSandbox", client.runtime.RunPodSandbox, plan.sandbox_request, client.timeout)
    except PlayError as error:
        if fresh_pod_directory:  # a pod already running with this uid keeps its volumes
            error.cleanup = volumes.tear_down(plan.pod_directory)
        raise
    result = PlayResult(pod_sandbox_id=response.pod_sandbox_id, plan=plan)
    say(f"sandbox {result.pod_sandbox_id}: running (cgroup parent {plan.cgroup_parent})")
    try:
        for container in plan.containers:
            _start_container(plan, client, container, refs, result, say)
    except PlayError as error:
        error.cleanup = _rollback(client, result, say)
        if fresh_pod_directory:
            error.cleanup += volumes.tear_down(plan.pod_directory)
        raise
    except BaseException:
        _rollback(client, result, say)
        raise
    return result


def _start_container(
    plan: PodPlan,
    client: CriClient,
    container: ContainerPlan,
    refs: dict[str, str],
    result: PlayResult,
    say: Say,
) -> None:
    ref = refs.get(container.image, container.image)
    created = _call(
        f"CreateContainer {container.name}",
        client.runtime.CreateContainer,
        container.for_sandbox(result.pod_sandbox_id, ref),
        client.timeout,
    )
    container_id = created.container_id
    result.containers.append(ContainerResult(container.name, container_id, container.image, ref, container.kind))
    say(f"container {container.name}: created {container_id}")
    _call(
        f"StartContainer {container.name}",
        client.runtime.StartContainer,
        cri.StartContainerRequest(container_id=container_id),
        client.timeout,
    )
    say(f"container {container.name}: started")
    if container.kind == "init":
        _wait_for_exit(client, container_id, container.name, time.monotonic() + client.timeout)
        say(f"container {container.name}: completed")


def _try(client: CriClient, what: str, method: Any, request: Any, notes: list[str]) -> None:
    try:
        method(request, timeout=client.timeout)
    except grpc.RpcError as exc:
        error = _grpc_error(what, exc)
        notes.append(f"{what}: FAILED ({error})")
    else:
        notes.append(what)


def _rollback(client: CriClient, result: PlayResult, say: Say) -> list[str]:
    """Stop and remove what ``play`` created; returns one note per call."""
    notes: list[str] = []
    for container in reversed(result.containers):
        _try(
            client,
            f"StopContainer {container.name} {container.container_id}",
            client.runtime.StopContainer,
            cri.StopContainerRequest(container_id=container.container_id, timeout=0),
            notes,
        )
        _try(
            client,
            f"RemoveContainer {container.name} {container.container_id}",
            client.runtime.RemoveContainer,
            cri.RemoveContainerRequest(container_id=container.container_id),
            notes,
        )
    sandbox = result.pod_sandbox_id
    _try(
        client,
        f"StopPodSandbox {sandbox}",
        client.runtime.StopPodSandbox,
        cri.StopPodSandboxRequest(pod_sandbox_id=sandbox),
        notes,
    )
    _try(
        client,
        f"RemovePodSandbox {sandbox}",
        client.runtime.RemovePodSandbox,
        cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox),
        notes,
    )
    for note in notes:
        say(f"cleanup: {note}")
    return notes


def delete(
    target: PodPlan | str,
    client: CriClient,
    *,
    grace_period: int | None = None,
    say: Say | None = None,
) -> DeleteResult:
    """Stop and remove every sandbox labelled with the pod's uid.

    ``target`` is a plan or a pod uid.  Containers are stopped with
    ``grace_period`` seconds (default: the plan's
    terminationGracePeriodSeconds, else 30) and removed before the
    sandbox is stopped and removed.  Finding nothing is not an error.
    """
    say = say or _quiet
    if isinstance(target, PodPlan):
        uid = target.uid
        grace = target.termination_grace_period if grace_period is None else grace_period
    else:
        uid = target
        grace = 30 if grace_period is None else grace_period
    result = DeleteResult(uid=uid)
    listed = _call(
        "ListPodSandbox",
        client.runtime.ListPodSandbox,
        cri.ListPodSandboxRequest(filter=cri.PodSandboxFilter(label_selector={POD_UID_LABEL: uid})),
        client.timeout,
    )
    if not listed.items:
        say(f"no sandbox found for pod uid {uid}")
    for sandbox in listed.items:
        containers = _call(
            "ListContainers",
            client.runtime.ListContainers,
            cri.ListContainersRequest(filter=cri.ContainerFilter(pod_sandbox_id=sandbox.id)),
            client.timeout,
        )
        for container in containers.containers:
            name = container.metadata.name
            _call(
                f"StopContainer {name}",
                client.runtime.StopContainer,
                cri.StopContainerRequest(container_id=container.id, timeout=grace),
                client.timeout + grace,
            )
            say(f"container {name}: stopped {container.id}")
            _call(
                f"RemoveContainer {name}",
                client.runtime.RemoveContainer,
                cri.RemoveContainerRequest(container_id=container.id),
                client.timeout,
            )
            say(f"container {name}: removed {container.id}")
            result.container_ids.append(container.id)
        _call(
            "StopPodSandbox",
            client.runtime.StopPodSandbox,
            cri.StopPodSandboxRequest(pod_sandbox_id=sandbox.id),
            client.timeout,
        )
        say(f"sandbox {sandbox.id}: stopped")
        _call(
            "RemovePodSandbox",
            client.runtime.RemovePodSandbox,
            cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id),
            client.timeout,
        )
        say(f"sandbox {sandbox.id}: removed")
        result.pod_sandbox_ids.append(sandbox.id)
    # Only a pod with volumes play makes has a directory of play's to remove.
    if isinstance(target, PodPlan) and any(volume.kind != "hostPath" for volume in target.volumes):
        for line in volumes.tear_down(target.pod_directory):
            say(f"volumes: {line}")
    return result
