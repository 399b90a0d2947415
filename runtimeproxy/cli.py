"""``runtime-proxy``: the command line of the CRI proxy daemon and its tools."""

from __future__ import annotations

import asyncio
import importlib
import re
import signal
import sys
from typing import ClassVar

import click
import structlog
import uvloop

from runtimeproxy import __version__
from runtimeproxy.cli_options import logging_options, metrics_address_option
from runtimeproxy.dispatch.interceptor import DEFAULT_SKIP_LABEL
from runtimeproxy.dispatch.layer import DEFAULT_CGROUP_ROOTS, HookLayer, HookSettings
from runtimeproxy.endpoints import EndpointError, socket_path
from runtimeproxy.listener import AlreadyServing
from runtimeproxy.logs import configure_logging
from runtimeproxy.metrics import CallMetrics, start_metrics_server
from runtimeproxy.sdnotify import Watchdog, notify
from runtimeproxy.server import DEFAULT_MAX_MESSAGE, ProxyServer, ProxySettings

log = structlog.get_logger("runtimeproxy.cli")

_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]i?)?B?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1024, "mi": 1024**2, "gi": 1024**3}
MIN_MESSAGE_SIZE = 4 * 1024 * 1024


def parse_size(text: str) -> int:
    """Bytes from "16777216", "16Mi", "16MiB" or "16M"."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size (examples: 16777216, 16Mi, 32MiB)")
    return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").lower()]


def _size_option(ctx: click.Context, param: click.Parameter, value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _endpoint_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return socket_path(value)
    except EndpointError as exc:
        raise click.BadParameter(str(exc)) from exc


class LazyGroup(click.Group):
    """Imports a tool's module only when it runs, so the daemon never loads them."""

    LAZY: ClassVar[dict[str, str]] = {
        "play": "runtimeproxy.play.command:play_command",
        "demo": "runtimeproxy.demo:demo_command",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.LAZY.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, name = target.partition(":")
        command: click.Command = getattr(importlib.import_module(module), name)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="runtime-proxy")
def cli() -> None:
    """A CRI proxy for Kubernetes nodes.

    It sits between kubelet and the container runtime, relays every CRI call unchanged,
    and calls runtime-hook servers around pod and container lifecycle calls.
    Every option can also be set through an environment variable, shown in each help.
    """


# Each option of serve reads RUNTIME_PROXY_<OPTION>, e.g. RUNTIME_PROXY_ENDPOINT.
@cli.command(context_settings={"auto_envvar_prefix": "RUNTIME_PROXY"})
@click.option(
    "--endpoint",
    callback=_endpoint_option,
    default="/var/run/runtimeproxy/runtimeproxy.sock",
    show_default=True,
    show_envvar=True,
    help="Unix socket the proxy serves; point kubelet's --container-runtime-endpoint here.",
)
@click.option(
    "--remote-runtime-endpoint",
    callback=_endpoint_option,
    default="unix:///run/containerd/containerd.sock",
    show_default=True,
    show_envvar=True,
    help="The container runtime's CRI socket.",
)
@click.option(
    "--remote-image-endpoint",
    callback=_endpoint_option,
    default=None,
    show_envvar=True,
    help="The image service's CRI socket, when it is not the runtime's.  [default: the runtime endpoint]",
)
@click.option(
    "--hook-config-dir",
    type=click.Path(file_okay=False),
    default="/etc/runtime/hookserver.d",
    show_default=True,
    show_envvar=True,
    help="Directory of hook server registration files.",
)
@click.option(
    "--skip-hook-label",
    default=f"{DEFAULT_SKIP_LABEL}=true",
    show_default=True,
    show_envvar=True,
    help="Pods with this label (KEY=VALUE) and their containers bypass every hook.",
)
@click.option(
    "--cgroup-parent-root",
    "cgroup_parent_roots",
    multiple=True,
    default=DEFAULT_CGROUP_ROOTS,
    show_default=True,
    show_envvar=True,
    help="Cgroup parents a hook may set must stay under one of these (repeatable).",
)
@metrics_address_option(9316)
@logging_options("debug also logs every relayed call that is not a lifecycle call.")
@click.option(
    "--socket-group",
    default=None,
    show_envvar=True,
    help="Group (name or gid) owning the socket; members may call the proxy.  [default: root's]",
)
@click.option(
    "--max-message-size",
    callback=_size_option,
    default=str(DEFAULT_MAX_MESSAGE),
    show_default="16Mi",
    show_envvar=True,
    help="Largest request or response message relayed; larger ones end with RESOURCE_EXHAUSTED.",
)
@click.option(
    "--drain-grace",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    show_envvar=True,
    help="Seconds that calls in flight get to finish on SIGTERM.",
)
def serve(
    endpoint: str,
    remote_runtime_endpoint: str,
    remote_image_endpoint: str | None,
    hook_config_dir: str,
    skip_hook_label: str,
    cgroup_parent_roots: tuple[str, ...],
    metrics_address: str,
    log_level: str,
    log_format: str,
    socket_group: str | None,
    max_message_size: int,
    drain_grace: float,
) -> None:
    """Serve the CRI on ENDPOINT and relay it to the runtime."""
    if max_message_size < MIN_MESSAGE_SIZE:
        raise click.BadParameter(f"must be at least {MIN_MESSAGE_SIZE} bytes", param_hint="--max-message-size")
    configure_logging(log_level.lower(), log_format.lower())
    settings = ProxySettings(
        endpoint=endpoint,
        runtime_backend=remote_runtime_endpoint,
        image_backend=remote_image_endpoint,
        max_message_size=max_message_size,
        drain_grace=drain_grace,
        socket_group=socket_group,
    )
    key, sep, value = skip_hook_label.partition("=")
    if not sep or not key:
        raise click.BadParameter("expected KEY=VALUE", param_hint="--skip-hook-label")
    hooks = HookSettings(
        config_dir=hook_config_dir,
        runtime_backend=remote_runtime_endpoint,
        skip_label=key,
        skip_value=value,
        cgroup_roots=cgroup_parent_roots,
    )
    try:
        code = uvloop.run(_serve(settings, hooks, metrics_address))
    except (AlreadyServing, OSError, ValueError) as exc:
        # Socket taken, metrics port in use, bad metrics address: say so and stop.
        log.error("refusing to start", reason=str(exc))
        click.echo(f"runtime-proxy: {exc}", err=True)
        sys.exit(1)
    sys.exit(code)


async def _serve(settings: ProxySettings, hook_settings: HookSettings, metrics_address: str) -> int:
    metrics = CallMetrics()
    hooks = HookLayer(hook_settings)
    server = ProxyServer(settings, interceptor=hooks.interceptor, metrics=metrics)
    await hooks.start()  # registrations are read before the first call can arrive
    try:
        await server.start()  # takes the socket's lock first: a second instance stops here
        metrics_server = start_metrics_server(metrics_address) if metrics_address else None
    except BaseException:
        await server.shutdown(0)
        await hooks.stop()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    watchdog = Watchdog()
    watchdog.start()
    notify("READY=1\nSTATUS=relaying CRI calls")
    log.info("ready", metrics_address=metrics_server.address if metrics_server else None)
    await stop.wait()
    notify("STOPPING=1")
    log.info("draining", grace_seconds=settings.drain_grace, calls_in_flight=server.active_calls)
    await server.shutdown()
    await hooks.stop()
    watchdog.stop()
    if metrics_server is not None:
        metrics_server.close()
    return 0




def main() -> None:
    cli()
