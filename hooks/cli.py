"""``runtime-hooks``: the hook server that applies QoS per pod class through its plugins.

``runtime-hooks serve`` serves RuntimeHookService for the proxy; ``runtime-hooks plugins``
lists the installed plugins. Every option of both can also be set through an environment
variable ``RUNTIME_HOOKS_<OPTION>`` (``RUNTIME_HOOKS_ENDPOINT``, ``RUNTIME_HOOKS_ENABLE``
with names separated by spaces...), shown in each help.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

import click
import structlog
from prometheus_client import CollectorRegistry

from runtimeproxy import __version__
from runtimeproxy.listener import AlreadyServing
from runtimeproxy.logs import configure_logging
from runtimeproxy.metrics import start_metrics_server
from runtimeproxy.sdnotify import Watchdog, notify

from .cgroups import CGROUP_ROOT, DRIVERS, CgroupDriver, CgroupFS
from .policy import DEFAULT_POLICY, PolicyError, PolicyWatcher, load_policy
from .resctrl import DEFAULT_ROOT as RESCTRL_ROOT
from .resctrl import ResctrlFS
from .sdk import DiscoveryResult, HookCallFailed, PluginRunner, ServerContext, discover_plugins
from .server import DEFAULT_ENDPOINT, DEFAULT_HOOK_CONFIG_DIR, RuntimeHooksServer, ServerSettings

__all__ = ["cli", "main"]

log = structlog.get_logger("runtimeproxy.hooks.cli")

_ENV_PREFIX = "RUNTIME_HOOKS"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="runtime-hooks")
def cli() -> None:
    """The runtime hook server of runtimeproxy.

    The proxy calls it around pod and container lifecycle calls; its plugins apply QoS
    settings per pod class. Plugins are installed Python packages (entry point group
    "runtimeproxy.hooks"). Every option can also be set through an environment variable,
    shown in each help.
    """


_enable_option = click.option(
    "--enable",
    multiple=True,
    show_envvar=True,
    help="Run only these plugins (repeatable; in the variable, separated by spaces).  [default: all]",
)
_disable_option = click.option(
    "--disable",
    multiple=True,
    show_envvar=True,
    help="Do not run these plugins (repeatable; in the variable, separated by spaces).",
)


@cli.command(context_settings={"auto_envvar_prefix": _ENV_PREFIX})
@click.option(
    "--endpoint",
    default=DEFAULT_ENDPOINT,
    show_default=True,
    show_envvar=True,
    help="Unix socket to serve on (a path, or unix:///path).",
)
@click.option(
    "--hook-config-dir",
    type=click.Path(file_okay=False),
    default=DEFAULT_HOOK_CONFIG_DIR,
    show_default=True,
    show_envvar=True,
    help="The proxy's hook config directory; runtime-hooks.json is written there while serving. Empty: none.",
)
@click.option(
    "--cgroup-root",
    type=click.Path(file_okay=False),
    default=CGROUP_ROOT,
    show_default=True,
    show_envvar=True,
    help="Where the cgroup hierarchy (v1 or v2) is mounted.",
)
@click.option(
    "--cgroup-driver",
    type=click.Choice(DRIVERS),
    default="cgroupfs",
    show_default=True,
    show_envvar=True,
    help="The kubelet's cgroup driver: decides how container cgroups are looked up first.",
)
@click.option(
    "--resctrl-root",
    type=click.Path(file_okay=False),
    default=str(RESCTRL_ROOT),
    show_default=True,
    show_envvar=True,
    help="Where resctrl is mounted; plugins get no resctrl handle when it is not.",
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False),
    default=None,
    envvar=f"{_ENV_PREFIX}_POLICY",  # named after the flag, not the parameter
    show_envvar=True,
    help="Per-class policy YAML, re-read when it changes.  [default: the built-in policy]",
)
@_enable_option
@_disable_option
@click.option(
    "--metrics-address",
    default="",
    show_envvar=True,
    help='host:port for Prometheus metrics at /metrics (":9317" listens on all addresses). Off when empty.',
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    show_envvar=True,
)
@click.option(
    "--log-format",
    type=click.Choice(["json", "console"], case_sensitive=False),
    default="json",
    show_default=True,
    show_envvar=True,
    help="json: one JSON object a line with a journald priority prefix; console: for people.",
)
def serve(
    endpoint: str,
    hook_config_dir: str,
    cgroup_root: str,
    cgroup_driver: CgroupDriver,
    resctrl_root: str,
    policy_file: str | None,
    enable: tuple[str, ...],
    disable: tuple[str, ...],
    metrics_address: str,
    log_level: str,
    log_format: str,
) -> None:
    """Serve runtime hooks on ENDPOINT and register them with the proxy."""
    configure_logging(log_level.lower(), log_format.lower())
    endpoint = _socket_path(endpoint)
    if policy_file is not None and os.path.exists(policy_file):
        try:
            load_policy(policy_file)  # a broken file at start is a configuration error, not a warning
        except PolicyError as exc:
            _refuse(str(exc))
    discovery = discover_plugins()
    for failure in discovery.failures:
        log.error("plugin not loaded", entry_point=failure.name, source=failure.source, reason=failure.reason)
    watcher = PolicyWatcher(policy_file) if policy_file else None
    resctrl = ResctrlFS(Path(resctrl_root))
    context = ServerContext(
        cgroups=CgroupFS(cgroup_root, cgroup_driver),
        resctrl=resctrl if resctrl.available() else None,
        policy=(lambda: watcher.current) if watcher is not None else (lambda: DEFAULT_POLICY),
        settings={
            "endpoint": endpoint,
            "hook_config_dir": hook_config_dir,
            "cgroup_root": cgroup_root,
            "cgroup_driver": cgroup_driver,
            "resctrl_root": resctrl_root,
            "policy_file": policy_file,
        },
    )
    registry = CollectorRegistry()
    try:
        runner = PluginRunner(
            discovery.plugins, enable=enable or None, disable=disable, context=context, registry=registry
        )
    except ValueError as exc:
        _refuse(str(exc))
    settings = ServerSettings(endpoint=endpoint, hook_config_dir=hook_config_dir or None)
    try:
        code = asyncio.run(_serve(runner, settings, watcher, registry, metrics_address))
    except (AlreadyServing, HookCallFailed, OSError, ValueError) as exc:
        _refuse(str(exc))
    sys.exit(code)


def _socket_path(endpoint: str) -> str:
    path = endpoint.removeprefix("unix://")
    if "://" in path or not path:
        raise click.BadParameter("only unix sockets: /path or unix:///path", param_hint="--endpoint")
    return os.path.abspath(path)


def _refuse(reason: str) -> NoReturn:
    log.error("refusing to start", reason=reason)
    click.echo(f"runtime-hooks: {reason}", err=True)
    sys.exit(1)


async def _serve(
    runner: PluginRunner,
    settings: ServerSettings,
    watcher: PolicyWatcher | None,
    registry: CollectorRegistry,
    metrics_address: str,
) -> int:
    if watcher is not None:
        await watcher.start()
    server = RuntimeHooksServer(runner, settings)
    try:
        await server.start()  # takes the socket's lock first: a second instance stops here
        metrics_server = start_metrics_server(metrics_address, registry) if metrics_address else None
    except BaseException:
        await server.stop(0)
        if watcher is not None:
            await watcher.stop()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    watchdog = Watchdog()
    watchdog.start()
    notify("READY=1\nSTATUS=serving runtime hooks")
    log.info("ready", metrics_address=metrics_server.address if metrics_server else None)
    await stop.wait()
    notify("STOPPING=1")
    await server.stop()
    watchdog.stop()
    if watcher is not None:
        await watcher.stop()
    if metrics_server is not None:
        metrics_server.close()
    return 0


@cli.command(context_settings={"auto_envvar_prefix": _ENV_PREFIX})
@_enable_option
@_disable_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
def plugins(enable: tuple[str, ...], disable: tuple[str, ...], as_json: bool) -> None:
    """List the installed plugins and the ones that failed to load.

    Exits 1 when a plugin failed to load or --enable names one that is not installed.
    """
    configure_logging("error", "console")
    discovery = discover_plugins()
    enabled, problem = _enabled(discovery, enable, disable)
    if as_json:
        data = {
            "plugins": [{**p.describe(), "enabled": p.name in enabled} for p in discovery.plugins],
            "failures": [{"name": f.name, "source": f.source, "reason": f.reason} for f in discovery.failures],
            "error": problem,
        }
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(_table(discovery, enabled))
        if discovery.failures:
            click.echo("\nnot loaded:")
            for failure in discovery.failures:
                click.echo(f"  {failure.name} ({failure.source}): {failure.reason}")
        if problem:
            click.echo(f"\nerror: {problem}")
    sys.exit(1 if discovery.failures or problem else 0)


def _enabled(discovery: DiscoveryResult, enable: tuple[str, ...], disable: tuple[str, ...]) -> tuple[set[str], str]:
    try:
        runner = PluginRunner(discovery.plugins, enable=enable or None, disable=disable)
    except ValueError as exc:
        return set(), str(exc)
    runner.close()
    return {plugin.name for plugin in runner.plugins}, ""


def _table(discovery: DiscoveryResult, enabled: set[str]) -> str:
    if not discovery.plugins:
        return "no plugins installed (entry point group runtimeproxy.hooks)"
    header = ("NAME", "VERSION", "ORDER", "ENABLED", "FAILURE-POLICY", "TIMEOUT", "POLICY", "HOOKS")
    rows = [header]
    for plugin in discovery.plugins:
        hooks = [point.value for point in plugin.hook_points_ordered]
        if plugin.reconcile_handler is not None:
            hooks.append("(reconcile)")
        rows.append(
            (
                plugin.name,
                plugin.version,
                str(plugin.order),
                "yes" if plugin.name in enabled else "no",
                plugin.failure_policy,
                f"{plugin.timeout:g}s",
                plugin.policy_section or "-",
                ",".join(hooks) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    )


def main() -> None:
    cli()
