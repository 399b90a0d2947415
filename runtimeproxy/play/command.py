"""``runtime-proxy play POD.yaml``: act as kubelet for one Pod manifest.

Exit codes: 0 done, 1 a CRI call failed (the gRPC code and details are
printed), 2 the manifest or the command line is wrong.

With ``--output json`` stdout carries exactly one JSON object:

* play:   ``{"action": "play", "ok": true, "pod": {...plan summary...},
  "pod_sandbox_id": "...", "containers": [{"name", "container_id", "image",
  "image_ref", "kind"}]}``
* delete: ``{"action": "delete", "ok": true, "uid": "...",
  "pod_sandbox_ids": [...], "container_ids": [...]}``
* failure: ``{"action": ..., "ok": false, "error": {"step", "code",
  "details", "cleanup"}}`` (also written to stderr as text).

Progress lines go to stdout in text mode and to stderr in JSON mode.

The input may hold a DaemonSet instead of a Pod (its pod for ``--node-name`` plays) and
the ConfigMaps its volumes and variables name; ``--configmap FILE`` adds ConfigMaps from
other files. configMap and emptyDir volumes go below ``--kubelet-root``.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import TYPE_CHECKING, Any, NoReturn

import click

from runtimeproxy.common.cli_options import node_options

if TYPE_CHECKING:  # the kubernetes client is slow to import: only when play runs
    from runtimeproxy.kubelet_model.manifest import ManifestError
    from runtimeproxy.kubelet_model.pod_plan import CgroupDriver, PodPlan
    from runtimeproxy.play.runner import PlayError

__all__ = ["DEFAULT_ENDPOINT", "DEFAULT_LOG_DIR", "play_command"]

DEFAULT_ENDPOINT = "/var/run/runtimeproxy/runtimeproxy.sock"
DEFAULT_LOG_DIR = os.path.join(tempfile.gettempdir(), "runtimeproxy-play", "pods")
DEFAULT_KUBELET_ROOT = os.path.join(tempfile.gettempdir(), "runtimeproxy-play", "kubelet")


def _emit_json(obj: dict[str, Any]) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False))


def _fail(ctx: click.Context, code: int, message: str, json_obj: dict[str, Any] | None) -> NoReturn:
    if json_obj is not None:
        _emit_json(json_obj)
    click.echo(f"Error: {message}", err=True)
    ctx.exit(code)
    raise AssertionError("unreachable")  # ctx.exit raises


def _plan_dump(plan: PodPlan) -> dict[str, Any]:
    from google.protobuf import json_format

    return {
        "pod": plan.summary(),
        "run_pod_sandbox": json_format.MessageToDict(plan.sandbox_request, preserving_proto_field_name=True),
        "create_container": [
            json_format.MessageToDict(c.request, preserving_proto_field_name=True) for c in plan.containers
        ],
    }


@click.command("play")
@click.argument("manifest", metavar="POD.yaml")
@click.option(
    "--endpoint",
    envvar="RUNTIME_PROXY_ENDPOINT",
    default=DEFAULT_ENDPOINT,
    show_default=True,
    help="CRI endpoint to talk to: a socket path or unix:///path (environment: RUNTIME_PROXY_ENDPOINT).",
)
@click.option("--delete", "do_delete", is_flag=True, help="Stop and remove the Pod instead.")
@click.option("--pull", is_flag=True, help="Pull images that are not on the node.")
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False),
    default=DEFAULT_LOG_DIR,
    show_default=True,
    help="Root of the pod log directories (kubelet uses /var/log/pods).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Deadline in seconds for each CRI call (and for each init container to finish).",
)
@click.option(
    "--grace-period",
    type=click.IntRange(min=0),
    default=None,
    help="With --delete: seconds StopContainer waits before killing "
    "(default: the Pod's terminationGracePeriodSeconds, else 30).",
)
@click.option(
    "--cgroup-driver",
    type=click.Choice(["cgroupfs", "systemd"]),
    default="cgroupfs",
    show_default=True,
    help="How to spell the pod cgroup parent.",
)
@click.option(
    "--cgroup-root",
    default="/",
    show_default=True,
    help="Cgroup above kubepods, like kubelet's --cgroup-root.",
)
@click.option("--runtime-handler", default="", help="RuntimeClass handler for the sandbox.")
@click.option(
    "--kubelet-root",
    type=click.Path(file_okay=False),
    default=DEFAULT_KUBELET_ROOT,
    show_default=True,
    help="Where the pods' configMap and emptyDir volumes go (kubelet's --root-dir, /var/lib/kubelet).",
)
@node_options
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the CRI requests that would be sent and connect to nothing.",
)
@click.option(
    "--output",
    "-o",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format.",
)
@click.pass_context
def play_command(
    ctx: click.Context,
    manifest: str,
    endpoint: str,
    do_delete: bool,
    pull: bool,
    log_dir: str,
    timeout: float,
    grace_period: int | None,
    cgroup_driver: CgroupDriver,
    cgroup_root: str,
    runtime_handler: str,
    kubelet_root: str,
    node_name: str | None,
    node_ip: str,
    configmap_files: tuple[str, ...],
    dry_run: bool,
    output: str,
) -> None:
    """Act as kubelet for one Pod manifest: start it (or --delete it) through CRI.

    Sends RunPodSandbox, then CreateContainer and StartContainer for each
    container, with the cgroup parent, resources, labels and annotations
    kubelet would compute. Images must be on the node unless --pull is given.
    """
    from runtimeproxy.kubelet_model.manifest import ManifestError
    from runtimeproxy.kubelet_model.pod_input import load_pod_and_node
    from runtimeproxy.kubelet_model.pod_plan import build_plan
    from runtimeproxy.kubelet_model.volumes import PodSetupError
    from runtimeproxy.play.cri_client import CriClient
    from runtimeproxy.play.runner import PlayError, delete, play

    as_json = output == "json"
    action = "delete" if do_delete else "play"

    def say(line: str) -> None:
        click.echo(line, err=as_json)

    try:
        pod, node, derived_from = load_pod_and_node(manifest, configmap_files, node_name, node_ip)
        plan = build_plan(
            pod,
            log_dir_base=os.path.abspath(log_dir),
            cgroup_driver=cgroup_driver,
            cgroup_root=cgroup_root,
            runtime_handler=runtime_handler,
            kubelet_root=os.path.abspath(kubelet_root),
            node=node,
        )
    except PodSetupError as exc:
        _fail(
            ctx,
            2,
            f"{manifest}: {exc}",
            {"action": action, "ok": False, "error": {"step": "volumes", "details": str(exc)}} if as_json else None,
        )
    except ManifestError as exc:
        _fail(
            ctx,
            2,
            str(exc),
            {"action": action, "ok": False, "error": _manifest_error(exc)} if as_json else None,
        )
    except OSError as exc:  # /proc/meminfo
        _fail(
            ctx,
            1,
            f"cannot read machine memory: {exc}",
            {"action": action, "ok": False, "error": {"details": str(exc)}} if as_json else None,
        )

    if dry_run:
        if as_json:
            _emit_json({"action": action, "ok": True, "dry_run": True, **_plan_dump(plan)})
        else:
            click.echo(_plan_text(plan, action))
        return

    if derived_from:
        say(f"pod {plan.namespace}/{plan.name}: the pod of {derived_from} on node {node.node_name}")
    say(f"pod {plan.namespace}/{plan.name} uid={plan.uid} qos={plan.qos_class.value} endpoint={endpoint}")
    try:
        client = CriClient(endpoint, timeout=timeout)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param_hint="--endpoint") from exc
    with client:
        try:
            if do_delete:
                deleted = delete(plan, client, grace_period=grace_period, say=say)
                if as_json:
                    _emit_json({"action": "delete", "ok": True, **deleted.to_dict()})
                else:
                    say(
                        f"pod {plan.namespace}/{plan.name} deleted: "
                        f"{len(deleted.pod_sandbox_ids)} sandbox(es), "
                        f"{len(deleted.container_ids)} container(s)"
                    )
                return
            result = play(plan, client, pull=pull, say=say)
        except PlayError as exc:
            hint = _unavailable_hint(exc, endpoint)
            error = {**exc.to_dict(), "hint": hint} if hint else exc.to_dict()
            _fail(
                ctx,
                1,
                f"{exc}\n{hint}" if hint else str(exc),
                {"action": action, "ok": False, "error": error} if as_json else None,
            )
        except OSError as exc:  # the pod log directory
            _fail(
                ctx,
                1,
                f"cannot create the pod log directory: {exc}",
                {"action": action, "ok": False, "error": {"details": str(exc)}} if as_json else None,
            )
    if as_json:
        _emit_json({"action": "play", "ok": True, **result.to_dict()})
    else:
        say(f"pod {plan.namespace}/{plan.name} is running in sandbox {result.pod_sandbox_id}")
        for container in result.containers:
            say(f"  {container.name}\t{container.container_id}")




def _plan_text(plan: PodPlan, action: str) -> str:
    """The requests a dry run would send, as protobuf text (what ``-o json`` gives as JSON)."""
    from google.protobuf import text_format

    def block(title: str, message: Any) -> list[str]:
        body = text_format.MessageToString(message, as_utf8=True).rstrip("\n")
        return [f"{title}:", *(f"  {line}" for line in body.splitlines())]

    lines = [
        f"dry run ({action}): nothing is sent",
        f"pod {plan.namespace}/{plan.name} uid={plan.uid} qos={plan.qos_class.value}",
        *block("RunPodSandbox", plan.sandbox_request),
    ]
    for container in plan.containers:
        lines += block(f"CreateContainer {container.name} ({container.kind})", container.request)
    return "\n".join(lines)


def _unavailable_hint(exc: PlayError, endpoint: str) -> str:
    """What to check when nothing serves the endpoint (empty when something does, or for other
    failures: then the details come from the server, e.g. the proxy naming a backend it lost)."""
    import grpc

    from runtimeproxy.play.cri_client import unix_socket_served

    if exc.code is not grpc.StatusCode.UNAVAILABLE or unix_socket_served(endpoint) is not False:
        return ""
    return (
        f"hint: nothing serves {endpoint}: is `runtime-proxy serve` running, and is this its socket? "
        "Pass the socket it listens on with --endpoint (or RUNTIME_PROXY_ENDPOINT)."
    )


def _manifest_error(exc: ManifestError) -> dict[str, Any]:
    return {
        "step": "manifest",
        "code": None,
        "details": str(exc),
        "file": exc.source,
        "field": exc.field,
        "reason": exc.reason,
        "cleanup": [],
    }
