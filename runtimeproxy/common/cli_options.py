"""Command-line options the two commands share (runtime-proxy serve and runtime-hooks serve; play and
explain)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final, TypeVar

import click

from runtimeproxy.common.logs import FORMATS
from runtimeproxy.common.message_size import DEFAULT_MAX_MESSAGE_SIZE, MIN_MESSAGE_SIZE

_F = TypeVar("_F", bound=Callable[..., Any])

# Where hook servers register and the proxy reads their registrations.
DEFAULT_HOOK_CONFIG_DIR: Final = "/etc/runtime/hookserver.d"

_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]i?)?B?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1024, "mi": 1024**2, "gi": 1024**3}


def parse_size(text: str) -> int:
    """Bytes from "16777216", "16Mi", "16MiB" or "16M"."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size (examples: 16777216, 16Mi, 32MiB)")
    return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").lower()]


def size_callback(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A click callback turning a size option's text into bytes (parse_size)."""
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def optional_size_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """`size_callback` for an option whose default is None (unset)."""
    return None if value is None else size_callback(ctx, param, value)


def _message_size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    size = size_callback(ctx, param, value)
    if size < MIN_MESSAGE_SIZE:
        raise click.BadParameter(f"must be at least {MIN_MESSAGE_SIZE} bytes (4Mi), got {size}")
    return size


def max_message_size_option(help_text: str) -> Callable[[_F], _F]:
    """--max-message-size: the same option, default and parsing in both daemons, so that the
    proxy never hands a hook server a request the hook server refuses."""
    return click.option(
        "--max-message-size",
        callback=_message_size,
        default=str(DEFAULT_MAX_MESSAGE_SIZE),
        show_default="16Mi",
        show_envvar=True,
        help=help_text,
    )


def hook_config_dir_option(help_text: str) -> Callable[[_F], _F]:
    """--hook-config-dir: the same option and default in both daemons, so that runtime-hooks
    registers where the proxy looks."""
    return click.option(
        "--hook-config-dir",
        type=click.Path(file_okay=False),
        default=DEFAULT_HOOK_CONFIG_DIR,
        show_default=True,
        show_envvar=True,
        help=help_text,
    )


def metrics_address_option(example_port: int) -> Callable[[_F], _F]:
    return click.option(
        "--metrics-address",
        default="",
        show_envvar=True,
        help=f'host:port for Prometheus metrics at /metrics (":{example_port}" listens on all addresses). '
        "Off when empty.",
    )


def logging_options(level_help: str = "") -> Callable[[_F], _F]:
    """--log-level and --log-format, as logs.configure_logging takes them."""

    def apply(fn: _F) -> _F:
        fn = click.option(
            "--log-format",
            type=click.Choice(list(FORMATS), case_sensitive=False),
            default="json",
            show_default=True,
            show_envvar=True,
            help="json: one JSON object a line with a journald priority prefix; console: for people.",
        )(fn)
        return click.option(
            "--log-level",
            type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
            default="info",
            show_default=True,
            show_envvar=True,
            help=level_help or None,
        )(fn)

    return apply


def node_options(command: _F) -> _F:
    """The options of play and explain that give ``load_pod_and_node``
    (runtimeproxy/kubelet_model/pod_input.py) what it reads besides the manifest: ``node_name``,
    ``node_ip`` and ``configmap_files``."""
    options = (
        click.option(
            "--node-name",
            default=None,
            help="The node's name: spec.nodeName, and the node a DaemonSet's pod is made for [default: the host name].",
        ),
        click.option("--node-ip", default="", help="The node's address, for status.hostIP in the environment."),
        click.option(
            "--configmap",
            "configmap_files",
            multiple=True,
            type=click.Path(dir_okay=False),
            help="A file with ConfigMaps the pod's volumes or variables name (repeatable).",
        ),
    )
    for option in reversed(options):
        command = option(command)
    return command
