"""``python -m runtimeproxy.hooks.plugins.network {plan,show,teardown}``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

from ... import policy as policy_mod
from ...settings import SettingsSpec
from .config import NetworkConfig, network_config
from .handlers import plugin
from .plan import ROOT_HANDLE, explain, format_handle, format_rate
from .state import teardown
from .tc import NoSuchInterface, Shaper

assert plugin.settings_spec is not None
_SPEC: Final[SettingsSpec] = plugin.settings_spec


def _section(policy_file: str | None, interface: str | None, link_mbit: int | None) -> NetworkConfig:
    specs = {plugin.name: _SPEC}
    policy = policy_mod.load_policy(policy_file, specs=specs) if policy_file else policy_mod.default_policy(specs)
    loaded = policy.section(_SPEC)
    config = network_config(loaded.common, loaded.for_class)
    changes: dict[str, Any] = {}
    if interface is not None:
        changes["interface"] = interface
    if link_mbit is not None:
        changes["link_speed_mbit"] = link_mbit
    return replace(config, **changes) if changes else config


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m runtimeproxy.hooks.plugins.network {plan,show,teardown} ...``"""
    parser = argparse.ArgumentParser(
        prog="python -m runtimeproxy.hooks.plugins.network", description="runtimeproxy network QoS (HTB bands)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    plan_cmd = commands.add_parser("plan", help="print the tree the policy asks for (no changes)")
    plan_cmd.add_argument("--policy", help="policy YAML (default: the built-in policy)")
    plan_cmd.add_argument("--interface")
    plan_cmd.add_argument("--link-speed", type=int, help="Mbit/s (default: the policy's)")
    for name, text in (("show", "print the tree on an interface"), ("teardown", "remove the tree from an interface")):
        cmd = commands.add_parser(name, help=text)
        cmd.add_argument("interface")
        cmd.add_argument("--netns", help="network namespace (name under /run/netns or a path)")
    args = parser.parse_args(argv)
    if args.command == "plan":
        section = _section(args.policy, args.interface, args.link_speed)
        print(json.dumps(explain(section), indent=2))
        return 0
    try:
        if args.command == "teardown":
            removed = teardown(args.interface, args.netns)
            print(f"{args.interface}: tree removed" if removed else f"{args.interface}: no runtimeproxy tree")
            return 0
        snap = Shaper(args.interface, args.netns).snapshot()
    except (NoSuchInterface, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "root": f"{snap.root_kind} {format_handle(snap.root_handle)}" if snap.root_kind else None,
                "ours": snap.ours,
                "default": format_handle(ROOT_HANDLE | snap.default_minor) if snap.default_minor else None,
                "classes": {
                    format_handle(c.classid): {"rate": format_rate(c.rate), "ceil": format_rate(c.ceil), "prio": c.prio}
                    for c in snap.classes.values()
                },
                "cgroup_filter": [name for _, name in snap.cgroup_filters],
                "address_filters": {f.address or f"?{f.handle:#x}": format_handle(f.classid) for f in snap.ip_filters},
            },
            indent=2,
        )
    )
    return 0
