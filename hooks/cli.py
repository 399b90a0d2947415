"""``runtime-hooks``: the hook server that applies QoS per pod class through its plugins.

``runtime-hooks serve`` serves RuntimeHookService for the proxy and reconciles the live pods
every interval; ``runtime-hooks plugins`` lists the installed plugins; ``runtime-hooks
explain POD.yaml`` rehearses what the plugins would do for a Pod without doing it;
``runtime-hooks policy show|check`` prints the effective policy or checks a policy file, and
``runtime-hooks policy from-koordinator`` turns Koordinator's SLO configuration into a policy.
Every option of serve, plugins and explain can also be set through an environment variable
``RUNTIME_HOOKS_<OPTION>`` (``RUNTIME_HOOKS_ENDPOINT``, ``RUNTIME_HOOKS_ENABLE`` with names
separated by spaces...), shown in each help.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
import structlog
import uvloop
from prometheus_client import CollectorRegistry

from runtimeproxy import __version__
from runtimeproxy.common.cli_options import (
    hook_config_dir_option,
    logging_options,
    max_message_size_option,
    metrics_address_option,
    node_options,
)
from runtimeproxy.common.endpoints import DEFAULT_RUNTIME_ENDPOINT
from runtimeproxy.common.extras import KUBERNETES, require_tools
from runtimeproxy.common.listener import AlreadyServing
from runtimeproxy.common.logs import configure_logging
from runtimeproxy.common.sdnotify import Watchdog, notify
from runtimeproxy.hookapi.defaults import DEFAULT_CGROUP_ROOTS

from .cgroups import CGROUP_ROOT, DRIVERS, CgroupDriver, CgroupFS, CgroupVersion, PodRoots, WeightConversion
from .container_repair import CgroupWrites, ContainerRepair, RepairApplier, RepairMetrics
from .discovery import DiscoveryResult, discover_plugins, settings_specs
from .nri.modes import mode_lines, modes_of
from .nri.plugin import DEFAULT_PLUGIN_INDEX, DEFAULT_PLUGIN_NAME, NriPlugin, NriSettings
from .nri.serving import start_nri
from .plugin_runner import HookCallFailed, PluginRunner
from .policy import Policy, PolicyError, PolicyWatcher, Specs, default_policy, dump_policy, load_policy
from .policy_metrics import PolicyMetrics
from .resctrl_fs import DEFAULT_ROOT as RESCTRL_ROOT
from .resctrl_fs import ResctrlFS
from .server import (
    DEFAULT_DEREGISTER_GRACE,
    DEFAULT_ENDPOINT,
    RuntimeHooksServer,
    ServerSettings,
)
from .views import ServerContext

# Imported where used: once registered with NRI (or serving the proxy), the metrics server, the
# reconciler and its CRI client, so that registration does not wait for them; systemd_sync only
# where it is on (dbus_fast costs 3 MiB and 25 modules).
if TYPE_CHECKING:
    from runtimeproxy.common.metrics_export import MetricsServer

    from .reconciler import Reconciler
    from .systemd_sync import SystemdSync

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
_F = TypeVar("_F", bound=Callable[..., Any])


def _policy_option(help_text: str) -> Callable[[_F], _F]:
    return click.option(
        "--policy",
        "policy_file",
        type=click.Path(dir_okay=False),
        default=None,
        envvar=f"{_ENV_PREFIX}_POLICY",  # named after the flag, not the parameter
        show_envvar=True,
        help=help_text,
    )


_cgroup_root_option = click.option(
    "--cgroup-root",
    type=click.Path(file_okay=False),
    default=CGROUP_ROOT,
    show_default=True,
    show_envvar=True,
    help="Where the cgroup hierarchy (v1 or v2) is mounted.",
)
_cgroup_driver_option = click.option(
    "--cgroup-driver",
    type=click.Choice(DRIVERS),
    default="cgroupfs",
    show_default=True,
    show_envvar=True,
    help="The kubelet's cgroup driver: decides how container cgroups are looked up first. With systemd, "
    "serve never creates a pod cgroup and, on cgroup v2, also sets what plugins write as unit properties.",
)


def _pod_roots(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> PodRoots:
    try:
        return PodRoots(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


_cpu_weight_conversion_option = click.option(
    "--cpu-weight-conversion",
    type=click.Choice([c.value for c in WeightConversion]),
    default=WeightConversion.LINEAR.value,
    show_default=True,
    show_envvar=True,
    help="On cgroup v2, how the node's OCI runtime turns CPU shares into cpu.weight, so that plugin "
    "weights rank with the ones it writes for kubelet: linear for runc before 1.3.2 and crun before "
    "1.23, log-quadratic for runc 1.3.2+ and crun 1.23+ (docs/runtime-hooks.md).",
)
_pod_roots_option = click.option(
    "--cgroup-parent-root",
    "cgroup_parent_roots",
    multiple=True,
    default=DEFAULT_CGROUP_ROOTS,
    callback=_pod_roots,
    show_default=True,
    show_envvar=True,
    help="kubelet's pods have their cgroups below these (kubelet's --cgroup-root, then kubepods; "
    "repeatable): only pod and container cgroups there are written, never a QoS-class or other cgroup.",
)
_resctrl_root_option = click.option(
    "--resctrl-root",
    type=click.Path(file_okay=False),
    default=str(RESCTRL_ROOT),
    show_default=True,
    show_envvar=True,
    help="Where resctrl is mounted; plugins get no resctrl handle when it is not.",
)


@cli.command(context_settings={"auto_envvar_prefix": _ENV_PREFIX})
@click.option(
    "--endpoint",
    default=DEFAULT_ENDPOINT,
    show_default=True,
    show_envvar=True,
    help="Unix socket to serve on (a path, or unix:///path).",
)
@hook_config_dir_option(
    "The proxy's hook config directory; runtime-hooks.json is written there while serving. Empty: none."
)
@_cgroup_root_option
@_cgroup_driver_option
@_cpu_weight_conversion_option
@_pod_roots_option
@_resctrl_root_option
@_policy_option("Per-class policy YAML, re-read when it changes.  [default: the built-in policy]")
@_enable_option
@_disable_option
@click.option(
    "--runtime-endpoint",
    default=DEFAULT_RUNTIME_ENDPOINT,
    show_default=True,
    show_envvar=True,
    help="The CRI runtime (containerd) the reconciler lists the live pods from every "
    "reconciler.interval_seconds of the policy. Empty: no reconciling.",
)
@max_message_size_option("Largest hook request or response; give the proxy's --max-message-size.")
@click.option(
    "--deregister-grace",
    type=click.FloatRange(min=0),
    default=DEFAULT_DEREGISTER_GRACE,
    show_default=True,
    show_envvar=True,
    help="Seconds served on SIGTERM after removing the registration: the proxy sees the removal "
    "through inotify at once, or at its next poll of its hook config directory (every 0.2 s) when "
    "it cannot watch it, and must notice before calls go unanswered.",
)
@click.option(
    "--systemd-bus-address",
    default="",
    show_envvar=True,
    help="With --cgroup-driver systemd on cgroup v2, what plugins write into pod slices and container "
    "scopes is also set as the units' properties, so that systemd keeps it: the D-Bus address to "
    "reach systemd at.  [default: the system bus]",
)
@click.option(
    "--nri-socket",
    default="",
    show_envvar=True,
    help="Serve the plugins as an NRI plugin of the runtime at this socket (containerd 1.7+ with NRI enabled; "
    "docs/nri.md). A proxy registration is then written only when --hook-config-dir is given too.  [default: off]",
)
@click.option(
    "--nri-plugin-name", default=DEFAULT_PLUGIN_NAME, show_default=True, show_envvar=True, help="Our NRI plugin name."
)
@click.option(
    "--nri-plugin-index",
    type=click.IntRange(0, 99),
    default=DEFAULT_PLUGIN_INDEX,
    show_default=True,
    show_envvar=True,
    help="Our place among the runtime's NRI plugins (called in ascending order).",
)
@metrics_address_option(9317)
@logging_options()
def serve(
    endpoint: str,
    hook_config_dir: str,
    cgroup_root: str,
    cgroup_driver: CgroupDriver,
    cpu_weight_conversion: str,
    cgroup_parent_roots: PodRoots,
    resctrl_root: str,
    policy_file: str | None,
    enable: tuple[str, ...],
    disable: tuple[str, ...],
    runtime_endpoint: str,
    max_message_size: int,
    deregister_grace: float,
    systemd_bus_address: str,
    nri_socket: str,
    nri_plugin_name: str,
    nri_plugin_index: int,
    metrics_address: str,
    log_level: str,
    log_format: str,
) -> None:
    """Serve runtime hooks on ENDPOINT and register them with the proxy.

    Every reconciler.interval_seconds (policy) the plugins also re-apply what they own to
    the pods the CRI runtime at RUNTIME_ENDPOINT runs, and containers whose CPU and memory
    values differ from what the plugins set are set back.
    """
    configure_logging(log_level.lower(), log_format.lower())
    endpoint = _socket_path(endpoint)
    discovery = discover_plugins()
    for failure in discovery.failures:
        log.error("plugin not loaded", entry_point=failure.name, source=failure.source, reason=failure.reason)
    specs = settings_specs(discovery.plugins)  # the sections the policy file may have
    if policy_file is not None and os.path.exists(policy_file):
        try:
            load_policy(policy_file, specs=specs)  # a broken file at start is a configuration error, not a warning
        except PolicyError as exc:
            _refuse(str(exc))
    defaults = default_policy(specs)
    registry = CollectorRegistry()
    policy_metrics = PolicyMetrics(registry, specs, defaults)  # the file's policy once the watcher has read it
    policy_listeners: list[Callable[[Policy], object]] = []
    watcher = (
        PolicyWatcher(policy_file, on_change=_fan_out(policy_listeners), specs=specs, observer=policy_metrics)
        if policy_file
        else None
    )
    resctrl = ResctrlFS(Path(resctrl_root))
    cgroups = CgroupFS(cgroup_root, cgroup_driver, pod_roots=cgroup_parent_roots,
                       weight_conversion=WeightConversion(cpu_weight_conversion))
    systemd = _systemd_sync(cgroups, systemd_bus_address, registry)
    context = ServerContext(
        cgroups=cgroups,
        resctrl=resctrl if resctrl.available() else None,
        policy=(lambda: watcher.current) if watcher is not None else (lambda: defaults),
        settings={
            "endpoint": endpoint,
            "hook_config_dir": hook_config_dir,
            "cgroup_root": cgroup_root,
            "cgroup_driver": cgroup_driver,
            "cpu_weight_conversion": cpu_weight_conversion,
            "cgroup_parent_roots": cgroup_parent_roots.roots,
            "resctrl_root": resctrl_root,
            "policy_file": policy_file,
            "runtime_endpoint": runtime_endpoint,
            "systemd_bus_address": systemd_bus_address,
        },
    )
    try:
        runner = PluginRunner(
            discovery.plugins, enable=enable or None, disable=disable, context=context, registry=registry
        )
    except ValueError as exc:
        _refuse(str(exc))
    nri = NriSettings(os.path.abspath(nri_socket), nri_plugin_name, nri_plugin_index) if nri_socket else None
    if nri is not None and click.get_current_context().get_parameter_source("hook_config_dir") is (
        click.core.ParameterSource.DEFAULT
    ):
        hook_config_dir = ""  # NRI mode alone: no registration for a proxy
        # still bound: its <endpoint>.lock keeps a second instance from registering with NRI too (docs/nri.md)
        log.info("NRI mode alone: hook endpoint served unregistered, as the one-instance lock", endpoint=endpoint)
    settings = ServerSettings(
        endpoint=endpoint,
        hook_config_dir=hook_config_dir or None,
        deregister_grace=deregister_grace,
        max_message_size=max_message_size,
    )
    serving = _Serving(
        runner, settings, watcher, policy_listeners, registry, metrics_address, runtime_endpoint, systemd, nri
    )
    try:
        code = uvloop.run(_serve(serving))  # as the proxy: its socket I/O costs less on libuv
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


def _systemd_sync(cgroups: CgroupFS, address: str, registry: CollectorRegistry) -> SystemdSync | None:
    """Under the systemd driver on cgroup v2, what makes systemd keep the plugins' values in its
    units (hooks/systemd_sync.py), attached to ``cgroups``; None elsewhere."""
    if cgroups.driver != "systemd":
        return None
    if not cgroups.available() or cgroups.version is not CgroupVersion.V2:
        log.info("systemd unit properties off: the cgroup root is no cgroup v2 mount", cgroup_root=str(cgroups.root))
        return None
    from .systemd_bus import SystemdBus
    from .systemd_sync import SystemdSync

    sync = SystemdSync(SystemdBus(address, registry=registry), registry=registry)
    cgroups.listener = sync
    log.info("systemd unit properties on", bus=address or "the system bus")
    return sync


def _fan_out(listeners: list[Callable[[Policy], object]]) -> Callable[[Policy], None]:
    """One PolicyWatcher on_change that calls every listener added to ``listeners`` since."""

    def changed(policy: Policy) -> None:
        for listener in listeners:
            listener(policy)

    return changed


@dataclass
class _Serving:
    """What _serve needs: the runner and server settings, the policy watcher and its
    listeners, metrics, the runtime the reconciler reads ("" for none), and the systemd sync."""

    runner: PluginRunner
    settings: ServerSettings
    watcher: PolicyWatcher | None
    policy_listeners: list[Callable[[Policy], object]]
    registry: CollectorRegistry
    metrics_address: str
    runtime_endpoint: str
    systemd: SystemdSync | None = None
    nri: NriSettings | None = None


def _start_metrics_server(serving: _Serving) -> MetricsServer | None:
    if not serving.metrics_address:
        return None
    from runtimeproxy.wire.peer_limit_metrics import start_metrics_server

    return start_metrics_server(serving.metrics_address, serving.registry)


def _repair_applier(serving: _Serving, nri: NriPlugin | None) -> RepairApplier | None:
    """How container repair sets values: the runtime's CRI update in NRI mode, else the container cgroups."""
    if nri is not None:
        from .nri.repair import CriUpdates

        return CriUpdates(serving.runtime_endpoint, nri.hooks.synchronized)
    cgroups = serving.runner.context.cgroups
    return CgroupWrites(cgroups) if cgroups is not None and cgroups.available() else None


def _start_reconciler(serving: _Serving, repair: ContainerRepair, nri: NriPlugin | None) -> Reconciler | None:
    """The reconciler, started, unless there is no runtime to read or nothing to reconcile (no
    plugin reconciles, and none answers for container repair or it has no way to set values)."""
    if not serving.runtime_endpoint:
        log.info("reconciler off: no --runtime-endpoint")
        return None
    applier = _repair_applier(serving, nri) if repair.enabled else None
    if applier is None and not any(plugin.reconcile_handler is not None for plugin in serving.runner.plugins):
        log.info("reconciler off: no enabled plugin reconciles or repairs containers")
        return None
    from .reconciler import Reconciler

    reconciler = Reconciler.for_endpoint(
        serving.runner, serving.runtime_endpoint, registry=serving.registry, repair=repair, applier=applier
    )
    serving.policy_listeners.append(reconciler.poke)  # an interval change takes effect at once
    reconciler.start()
    return reconciler


async def _serve(serving: _Serving) -> int:
    watcher = serving.watcher
    if watcher is not None:
        await watcher.start()
    mode = "nri" if serving.nri is not None else "proxy"
    repair = ContainerRepair(serving.runner, RepairMetrics(serving.registry, mode))  # hooks/container_repair.py
    server = RuntimeHooksServer(serving.runner, serving.settings)
    serving.policy_listeners.append(server.policy_changed)  # the registration follows the policy
    try:
        await server.start()  # takes the socket's lock first: a second instance stops here
        # registered, configured and synchronized, or refused with the reason (hooks/nri/)
        nri = await start_nri(serving.runner, serving.nri, serving.registry, repair) if serving.nri else None
        metrics_server = _start_metrics_server(serving)
    except BaseException:
        await server.stop(0, 0)  # nothing was served yet: no one to wait for
        if watcher is not None:
            await watcher.stop()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    watchdog = Watchdog()  # WATCHDOG=1 every WatchdogSec/2 from this loop: a wedged loop gets restarted
    watchdog.start()
    reconciler = _start_reconciler(serving, repair, nri)
    systemd = loop.create_task(serving.systemd.run(), name="runtime-hooks-systemd") if serving.systemd else None
    notify("READY=1\nSTATUS=serving runtime hooks")
    log.info("ready", metrics_address=metrics_server.address if metrics_server else None)
    from runtimeproxy.common.malloc import trim_every

    trimmer = loop.create_task(trim_every())  # as the proxy: free heap pages back to the kernel
    await stop.wait()
    trimmer.cancel()
    notify("STOPPING=1")
    if reconciler is not None:
        await reconciler.stop()  # before the plugins' on_stop: no round may run on stopped plugins
    if nri is not None:
        await nri.stop()
    await server.stop()
    if systemd is not None and serving.systemd is not None:  # after the server: its last writes still go out
        with contextlib.suppress(TimeoutError):
            await serving.systemd.bus.flush(2.0)
        systemd.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await systemd
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
            "plugins": [
                {**p.describe(), "enabled": p.name in enabled, "modes": modes_of(p.hook_points)}
                for p in discovery.plugins
            ],
            "failures": [{"name": f.name, "source": f.source, "reason": f.reason} for f in discovery.failures],
            "error": problem,
        }
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(_table(discovery, enabled))
        if discovery.plugins:  # proxy mode: the HOOKS column; NRI mode: hooks/nri/modes.py
            click.echo("\n" + "\n".join(mode_lines((p.name, p.hook_points) for p in discovery.plugins)))
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
                plugin.name if plugin.settings_spec is not None else "-",
                ",".join(hooks) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    )


@cli.command(context_settings={"auto_envvar_prefix": _ENV_PREFIX})
@click.argument("manifest", metavar="POD.yaml", type=click.Path(dir_okay=False))
@_policy_option("Per-class policy YAML laid over the defaults.  [default: the built-in policy]")
@_cgroup_root_option
@_cgroup_driver_option
@_cpu_weight_conversion_option
@_pod_roots_option
@_resctrl_root_option
@_enable_option
@_disable_option
@node_options
@click.option(
    "--output",
    type=click.Choice(["text", "json"], case_sensitive=False),
    default="text",
    show_default=True,
    help="text: for people; json: one JSON object.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error", "critical"], case_sensitive=False),
    default="critical",
    show_default=True,
    help="The plugins' own log lines, on stderr (their failures are in the output anyway).",
)
def explain(
    manifest: str,
    policy_file: str | None,
    cgroup_root: str,
    cgroup_driver: CgroupDriver,
    cpu_weight_conversion: str,
    cgroup_parent_roots: PodRoots,
    resctrl_root: str,
    enable: tuple[str, ...],
    disable: tuple[str, ...],
    node_name: str | None,
    node_ip: str,
    configmap_files: tuple[str, ...],
    output: str,
    log_level: str,
) -> None:
    """Show what the plugins would do for the Pod in POD.yaml, without doing it.

    The manifest becomes the CRI requests kubelet would send (as `runtime-proxy play`
    computes them); the plugins then run at PreRunPodSandbox and, per container,
    PreCreateContainer, PostCreateContainer, PreStartContainer and PostStartContainer, with
    cgroup and resctrl handles that record writes instead of making them. Printed: the
    pod's QoS class and why, and per plugin every response field and node write (with
    its target file). Nothing on the node is changed. Exits 1 when the manifest, the policy
    or --enable is unusable.
    """
    configure_logging(log_level.lower(), "console")
    # stdout is the explanation; a one-shot command needs no logger caching.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr), cache_logger_on_first_use=False)
    require_tools("runtime-hooks explain", KUBERNETES)
    from runtimeproxy.kubelet_model.manifest import ManifestError  # imports kubernetes: only here
    from runtimeproxy.kubelet_model.volumes import PodSetupError

    from .explain import explain_manifest, render_text

    discovery = discover_plugins()
    specs = settings_specs(discovery.plugins)
    try:
        policy = load_policy(policy_file, specs=specs) if policy_file else default_policy(specs)
    except PolicyError as exc:
        _fail(str(exc))
    try:
        runner = PluginRunner(discovery.plugins, enable=enable or None, disable=disable)
    except ValueError as exc:
        _fail(str(exc))
    runner.close()
    try:
        explanation = asyncio.run(
            explain_manifest(
                manifest,
                runner.plugins,
                policy=policy,
                policy_source=f"{policy_file} over the defaults" if policy_file else "built-in defaults",
                cgroup_root=cgroup_root,
                cgroup_driver=cgroup_driver,
                weight_conversion=WeightConversion(cpu_weight_conversion),
                resctrl_root=resctrl_root,
                cgroup_parent_roots=cgroup_parent_roots.roots,
                configmap_files=configmap_files,
                node_name=node_name,
                node_ip=node_ip,
            )
        )
    except ManifestError as exc:
        _fail(str(exc))
    except PodSetupError as exc:  # e.g. a ConfigMap neither in the input nor given with --configmap
        _fail(f"{manifest}: {exc}")
    explanation.notes += [f"plugin {f.name} not loaded ({f.source}): {f.reason}" for f in discovery.failures]
    explanation.notes += mode_lines((p.name, p.hook_points) for p in runner.plugins)
    if output.lower() == "json":
        click.echo(json.dumps(explanation.to_dict(), indent=2))
    else:
        click.echo(render_text(explanation))


def _fail(message: str) -> NoReturn:
    click.echo(f"runtime-hooks: {message}", err=True)
    sys.exit(1)


@cli.group()
def policy() -> None:
    """Show the effective policy, check a policy file, or convert Koordinator's configuration."""


@policy.command("show")
@_policy_option("Policy file to lay over the defaults.  [default: none, the built-in policy]")
def policy_show(policy_file: str | None) -> None:
    """Print the effective policy as YAML: the defaults with FILE laid over them.

    Every key is printed, those the file leaves out with their default value: the server's
    sections and those of every installed plugin that has settings. A file that does not
    exist gives the defaults (as `serve` does until it appears), with a warning; an invalid
    one exits 1 with the error.
    """
    specs = _installed_specs()
    if policy_file is None:
        effective, source = default_policy(specs), "the built-in defaults"
    elif not os.path.exists(policy_file):
        click.echo(f"runtime-hooks: {policy_file} does not exist; serve would use the defaults until it does", err=True)
        effective, source = default_policy(specs), f"the built-in defaults ({policy_file} does not exist)"
    else:
        try:
            effective = load_policy(policy_file, specs=specs)
        except PolicyError as exc:
            _fail(str(exc))
        source = f"the defaults with {policy_file} laid over them"
    click.echo(f"# effective runtime-hooks policy: {source}")
    click.echo(dump_policy(effective, specs), nl=False)


@policy.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
def policy_check(file: str) -> None:
    """Check a policy file against the installed plugins' settings: "ok" and exit 0, or the
    error (file, YAML path, reason) and exit 1."""
    try:
        load_policy(file, specs=_installed_specs())
    except PolicyError as exc:
        _fail(str(exc))
    click.echo("ok")


@policy.command("from-koordinator")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--values-out", type=click.Path(dir_okay=False), help="Write the Helm chart values (policy, groups).")
@click.option("--policy-out", type=click.Path(dir_okay=False), help="Write the policy of nodes no group matches.")
@click.option("--strict", is_flag=True, help="Exit 1, writing nothing, when a field in effect is not supported.")
@click.option("-v", "--verbose", is_flag=True, help="Also say what each mapped field became.")
def policy_from_koordinator(
    file: str, values_out: str | None, policy_out: str | None, strict: bool, verbose: bool
) -> None:
    """Turn Koordinator's slo-controller-config ConfigMap or a NodeSLO (YAML or JSON; - for stdin)
    into a runtime-hooks policy and Helm chart values.

    Each node strategy becomes a chart group, in order, with its nodeSelector. Every field of the
    input is reported on stderr unless mapped (-v: those too): "not supported" when it takes
    effect in Koordinator, "not supported, not in effect" when it does not there either. Without
    --values-out or --policy-out, the values (ConfigMap) or the policy (NodeSLO) go to stdout.
    Exits 1 when the input is unreadable or invalid, or with --strict and a field not supported.
    """
    from .koordinator_config import SLOInputError, check_policies, convert, dump_yaml, read_document

    specs = _installed_specs()
    try:
        conversion = convert(read_document(file), specs)
        check_policies(conversion, specs)
    except (SLOInputError, PolicyError) as exc:
        _fail(f"{file}: {exc}")
    for finding in conversion.findings:
        if verbose or finding.status != "mapped":
            click.echo(finding.line(), err=True)
    for note in conversion.notes:
        click.echo(f"note: {note}", err=True)
    if strict and conversion.unsupported():
        _fail(f"{len(conversion.unsupported())} field(s) in effect are not supported (--strict); nothing written")
    header = f"# runtime-hooks policy from-koordinator {os.path.basename(file)}\n"
    outputs = {values_out: conversion.values(), policy_out: conversion.policy}
    if values_out is None and policy_out is None:
        click.echo(header + dump_yaml(conversion.values() if conversion.kind == "ConfigMap" else conversion.policy),
                   nl=False)
    for path, data in outputs.items():
        if path is not None:
            _write_atomically(path, header + dump_yaml(data))


def _write_atomically(path: str, text: str) -> None:
    """``text`` into ``path`` by a rename, so a watcher never reads half of it."""
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        _fail(f"cannot write {path}: {exc.strerror or exc}")


def _installed_specs() -> Specs:
    """The sections the installed plugins define; plugins that fail to load are said on stderr."""
    discovery = discover_plugins()
    for failure in discovery.failures:
        click.echo(f"runtime-hooks: plugin {failure.name} not loaded ({failure.source}): {failure.reason}", err=True)
    return settings_specs(discovery.plugins)


def main() -> None:
    cli()
