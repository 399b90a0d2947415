"""Command-line options both daemons share (runtime-proxy serve and runtime-hooks serve)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from runtimeproxy.logs import FORMATS

_F = TypeVar("_F", bound=Callable[..., Any])


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
