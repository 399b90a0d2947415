"""``runtime-proxy``: the command line of the CRI proxy daemon and its tools."""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import click
import structlog
import uvloop

import runtimeproxy
from runtimeproxy.common.cli_options import (
    hook_config_dir_option,
    logging_options,
    max_message_size_option,
    metrics_address_option,
    optional_size_callback,
)
from runtimeproxy.common.endpoints import EndpointError, socket_path
from runtimeproxy.common.extras import TOOLS, missing_modules, unavailable_command
from runtimeproxy.common.listener import AlreadyServing
from runtimeproxy.common.logs import configure_logging
from runtimeproxy.common.malloc import return_large_blocks_to_the_kernel, trim_every
from runtimeproxy.common.metrics_export import parse_address
from runtimeproxy.common.sdnotify import Watchdog, notify
from runtimeproxy.dispatch.hook_interceptor import DEFAULT_SKIP_LABEL
from runtimeproxy.dispatch.layer import HookLayer, HookSettings
from runtimeproxy.hookapi.defaults import DEFAULT_CGROUP_ROOTS
from runtimeproxy.hookapi.merge_rules import CgroupDriver
from runtimeproxy.proxy.host_install import HOOKS, PROXY, InstallError, InstallOptions, install, uninstall
from runtimeproxy.proxy.host_systemd import SystemdError
from runtimeproxy.proxy.metrics import CallMetrics
from runtimeproxy.proxy.server import ProxyServer, ProxySettings
from runtimeproxy.wire.peer_limit_metrics import start_metrics_server

log = structlog.get_logger("runtimeproxy.proxy.cli")

_F = TypeVar("_F", bound=Callable[..., Any])


def _endpoint_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return socket_path(value)
    except EndpointError as exc:
        raise click.BadParameter(str(exc)) from exc


def _socket_option(flag: str, default: str | None, help_text: str) -> Callable[[_F], _F]:
    """A unix socket option (a path or unix:///path, taken as the path); its default shown
    when it has one."""
    return click.option(
        flag,
        callback=_endpoint_option,
        default=default,
        show_default=default is not None,
        show_envvar=True,
        help=help_text,
    )


class LazyGroup(click.Group):
    """Imports a tool's module only when it runs, so the daemon never loads them (nor needs the
    tools' extra installed)."""

    LAZY: ClassVar[dict[str, str]] = {
        "play": "runtimeproxy.play.command:play_command",
        "demo": "runtimeproxy.proxy.demo:demo_command",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.LAZY.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        missing = missing_modules(TOOLS)
        if missing:
            return unavailable_command(cmd_name, f"runtime-proxy {cmd_name}", missing)
        module, _, name = target.partition(":")
        command: click.Command = getattr(importlib.import_module(module), name)
        return command


def _show_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """click's --version, with the version read only when asked for (see runtimeproxy.__getattr__)."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"runtime-proxy, version {runtimeproxy.__version__}")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and exit.",
)
def cli() -> None:
    """A CRI proxy for Kubernetes nodes.

    It sits between kubelet and the container runtime, relays every CRI call unchanged,
    and calls runtime-hook servers around pod and container lifecycle calls.
    Every option can also be set through an environment variable, shown in each help.
    """


# Each option of serve reads RUNTIME_PROXY_<OPTION>, e.g. RUNTIME_PROXY_ENDPOINT.
@cli.command(context_settings={"auto_envvar_prefix": "RUNTIME_PROXY"})
@_socket_option(
    "--endpoint",
    "/var/run/runtimeproxy/runtimeproxy.sock",
    "Unix socket the proxy serves; point kubelet's --container-runtime-endpoint here.",
)
@_socket_option(
    "--remote-runtime-endpoint", "unix:///run/containerd/containerd.sock", "The container runtime's CRI socket."
)
@_socket_option(
    "--remote-image-endpoint",
    None,
    "The image service's CRI socket, when it is not the runtime's.  [default: the runtime endpoint]",
)
@hook_config_dir_option("Directory of hook server registration files.")
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
@click.option(
    "--cgroup-driver",
    type=click.Choice(["auto", "systemd", "cgroupfs"]),
    default="auto",
    show_default=True,
    show_envvar=True,
    help="The form of cgroup parent a hook may set: systemd slices or cgroupfs paths. auto: the form kubelet "
    "used for the pod (a pod without a cgroup parent then accepts none).",
)
@metrics_address_option(9316)
@logging_options("debug also logs every relayed call that is not a lifecycle call.")
@click.option(
    "--socket-group",
    default=None,
    show_envvar=True,
    help="Group (name or gid) owning the socket; members may call the proxy.  [default: root's]",
)
@max_message_size_option(
    "Largest request or response message relayed, and sent to or accepted from a hook server; "
    "a larger one ends its call with RESOURCE_EXHAUSTED. Give runtime-hooks the same."
)
@click.option(
    "--held-request-budget",
    callback=optional_size_callback,
    default=None,
    show_default="twice --max-message-size",
    show_envvar=True,
    help="Bytes of requests held for the hooks at once; calls past it end with RESOURCE_EXHAUSTED.",
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
    cgroup_driver: CgroupDriver,
    metrics_address: str,
    log_level: str,
    log_format: str,
    socket_group: str | None,
    max_message_size: int,
    held_request_budget: int | None,
    drain_grace: float,
) -> None:
    """Serve the CRI on ENDPOINT and relay it to the runtime."""
    configure_logging(log_level.lower(), log_format.lower())
    if metrics_address:  # refused before anything is bound or logged as serving
        try:
            parse_address(metrics_address)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--metrics-address") from None
    _prepare_hook_config_dir(hook_config_dir)
    settings = ProxySettings(
        endpoint=endpoint,
        runtime_backend=remote_runtime_endpoint,
        image_backend=remote_image_endpoint,
        max_message_size=max_message_size,
        held_request_budget=held_request_budget,
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
        cgroup_driver=cgroup_driver,
        max_message_size=max_message_size,
    )
    try:
        code = uvloop.run(_serve(settings, hooks, metrics_address))
    except (AlreadyServing, OSError, ValueError) as exc:
        # Socket taken, metrics port in use, bad metrics address: say so and stop.
        log.error("refusing to start", reason=str(exc))
        click.echo(f"runtime-proxy: {exc}", err=True)
        sys.exit(1)
    sys.exit(code)


def _prepare_hook_config_dir(path: str) -> None:
    """Create the registration directory when missing (0750: registrations say which servers
    see every pod), so that hook servers can register later; warn when it cannot be read."""
    if not os.path.exists(path):
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            os.mkdir(path, 0o750)
            os.chmod(path, 0o750)  # mkdir's mode went through the umask
        except OSError as exc:
            if isinstance(exc, FileExistsError) and os.path.isdir(path):
                return  # made meanwhile by someone else: theirs, left as it is
            log.warning("cannot create the hook config directory; no hooks until it exists", path=path, error=str(exc))
            return
        else:
            log.info("created the hook config directory", path=path, mode="0750")
    try:
        os.listdir(path)
    except OSError as exc:
        log.warning(
            "hook config directory is not readable; hook servers registered there are not called",
            path=path,
            error=str(exc),
        )


async def _serve(settings: ProxySettings, hook_settings: HookSettings, metrics_address: str) -> int:
    return_large_blocks_to_the_kernel()
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
    trimmer = loop.create_task(trim_every())  # once now, when start-up's garbage is free, then periodically
    await stop.wait()
    trimmer.cancel()
    notify("STOPPING=1")
    log.info("draining", grace_seconds=settings.drain_grace, calls_in_flight=server.active_calls)
    await server.shutdown()
    await hooks.stop()
    watchdog.stop()
    if metrics_server is not None:
        metrics_server.close()
    return 0


def _root_option(command: _F) -> _F:
    return click.option(
        "--root",
        type=click.Path(file_okay=False, path_type=Path),
        default="/",
        show_default=True,
        help="The host's filesystem root (the installer pod mounts the host at /host, its /run included).",
    )(command)


def _dry_run_option(command: _F) -> _F:
    return click.option("--dry-run", is_flag=True, help="Print each change and systemctl call; make none.")(command)


def _run_host_change(action: Callable[[InstallOptions, Callable[[str], None]], int], options: InstallOptions,
                     name: str) -> None:
    try:
        action(options, click.echo)
    except InstallError as exc:
        click.echo(f"runtime-proxy {name}: {exc}", err=True)
        sys.exit(1)
    except (OSError, SystemdError) as exc:
        click.echo(f"runtime-proxy {name}: stopped: {exc} (what was done is recorded; run it again or "
                   "`runtime-proxy uninstall`)", err=True)
        sys.exit(1)


@cli.command("install")
@_root_option
@_dry_run_option
@click.option(
    "--from",
    "bundle",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="A runtimeproxy bundle (python -m runtimeproxy.proxy.artifact) to install as /opt/runtimeproxy, its "
    "launchers linked into /usr/local/bin.  [default: use the runtime-proxy and runtime-hooks already there]",
)
@click.option("--proxy-setting", multiple=True, metavar="RUNTIME_PROXY_NAME=VALUE",
              help="A setting for /etc/default/runtime-proxy (repeatable).")
@click.option("--hooks-setting", multiple=True, metavar="RUNTIME_HOOKS_NAME=VALUE",
              help="A setting for /etc/default/runtime-hooks (repeatable).")
@click.option("--kubelet/--no-kubelet", default=True, show_default=True,
              help="Point kubelet at the proxy (its drop-in, then a restart) once the proxy answers.")
@click.option("--hooks/--no-hooks", default=True, show_default=True,
              help="Also run runtime-hooks as a systemd unit. --no-hooks where runtime-hooks runs as the Helm "
              "chart's DaemonSet: only the proxy is installed (and a runtime-hooks unit an earlier install "
              "enabled is stopped).")
@click.option("--ready-timeout", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds to wait for the proxy to answer a CRI Version call before kubelet is switched over.")
def install_command(root: Path, dry_run: bool, bundle: Path | None, proxy_setting: tuple[str, ...],
                    hooks_setting: tuple[str, ...], kubelet: bool, hooks: bool, ready_timeout: float) -> None:
    """Install runtime-proxy and runtime-hooks as systemd units on this host and point kubelet at the proxy.

    Does what systemd/INSTALL.md describes; idempotent; every change is recorded for `uninstall`.
    """
    options = InstallOptions(root=root, dry_run=dry_run, bundle=bundle,
                             settings={PROXY: proxy_setting, HOOKS: hooks_setting}, kubelet=kubelet,
                             hooks=hooks, ready_timeout=ready_timeout)
    _run_host_change(install, options, "install")


@cli.command("uninstall")
@_root_option
@_dry_run_option
def uninstall_command(root: Path, dry_run: bool) -> None:
    """Undo what `runtime-proxy install` did: kubelet back on its previous runtime endpoint first, then the
    units stopped and removed, the host's files as they were."""
    _run_host_change(uninstall, InstallOptions(root=root, dry_run=dry_run), "uninstall")


def main() -> None:
    cli()
