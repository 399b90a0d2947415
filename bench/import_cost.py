"""What each import costs the daemons: resident memory and import time.

    python bench/import_cost.py [--daemon proxy|hooks] [--json FILE] [MODULE ...]

For each module the daemon loads (in the order it loads them), a fresh interpreter of this
environment imports it alone and reports its RSS before and after (`alone`), and one more
interpreter imports them one after another, reporting what each adds to what came before
(`added`: a shared dependency is charged to the first module that loads it). Import time is
`python -X importtime`'s cumulative figure for the module in that second interpreter.
``--daemon hooks`` measures runtime-hooks' imports instead of runtime-proxy's: its libraries
first, so that their total is what any Python daemon built on them holds before its own code.
See bench/README.md ("Import cost").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The daemon's imports by weight, dependencies first, ending with the CLI (everything). grpc is
# not among them: the store rebuild and hook calls use runtimeproxy.wire.grpc_client (measure it with
# `python bench/import_cost.py grpc` for comparison).
MODULES = (
    "asyncio",
    "uvloop",
    "structlog",
    "click",
    "hpack",
    "runtimeproxy.api.runtime.v1.api_pb2",
    "runtimeproxy.api.runtime.v1alpha1.api_pb2",
    "prometheus_client",
    "runtimeproxy.relay.connection",
    "runtimeproxy.wire.grpc_client",
    "runtimeproxy.proxy.metrics",
    "runtimeproxy.proxy.server",
    "runtimeproxy.dispatch.layer",
    "runtimeproxy.proxy.cli",
)

# runtime-hooks' imports as an NRI plugin: the third-party libraries it cannot start without (the
# event loop, logging, the CLI, metrics, the policy file's YAML), then its NRI service and its CLI
# (which loads the rest, plugins included: runtimeproxy.hooks.discovery imports them).
HOOKS_MODULES = (
    "asyncio",
    "uvloop",
    "structlog",
    "click",
    "prometheus_client",
    "yaml",
    "runtimeproxy.hooks.nri.plugin",
    "runtimeproxy.hooks.cli",
    "runtimeproxy.hooks.discovery",
)
DAEMONS = {"proxy": MODULES, "hooks": HOOKS_MODULES}

# Run in the child: RSS (KiB, /proc/self/status) before and after each import, as JSON.
PROBE = """
import json, sys
def rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
rows = [["", rss()]]
for name in sys.argv[1:]:
    module = __import__(name)  # not importlib.import_module: -X importtime times only the C import path
    if name == "runtimeproxy.hooks.discovery":  # the plugins are imported when discovered
        module.hooks.discovery.discover_plugins()
    rows.append([name, rss()])
print(json.dumps(rows))
"""


def probe(modules: Sequence[str], importtime: bool = False) -> tuple[list[tuple[str, int]], str]:
    """(module, RSS KiB after it) with "" first for the bare interpreter, and -X importtime's stderr."""
    flags = ["-X", "importtime"] if importtime else []
    done = subprocess.run([sys.executable, *flags, "-c", PROBE, *modules], capture_output=True, text=True,
                          check=True)
    return [(name, kib) for name, kib in json.loads(done.stdout)], done.stderr


def cumulative_ms(importtime: str) -> dict[str, float]:
    """Cumulative import time (ms) by module from -X importtime lines ("self | cumulative | name")."""
    times: dict[str, float] = {}
    for line in importtime.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if cumulative.strip().isdigit():
                times[name.strip()] = int(cumulative) / 1000
    return times


def measure(modules: Sequence[str]) -> dict[str, Any]:
    alone = {}
    for name in modules:
        rows, _ = probe([name])
        alone[name] = (rows[1][1] - rows[0][1]) / 1024
    rows, importtime = probe(modules, importtime=True)
    times = cumulative_ms(importtime)
    table = [{"module": name, "alone_mib": alone[name], "added_mib": (kib - rows[n][1]) / 1024,
              "total_mib": kib / 1024, "import_ms": times.get(name, 0.0)}
             for n, (name, kib) in enumerate(rows[1:])]
    return {"python": sys.version.split()[0], "interpreter_mib": rows[0][1] / 1024, "modules": table}


def print_report(report: dict[str, Any]) -> None:
    print(f"Python {report['python']}: the bare interpreter is {report['interpreter_mib']:.1f} MiB resident")
    head = f"{'module':<45}{'alone':>8}{'added':>8}{'total':>8}{'import ms':>11}"
    print(head)
    print("-" * len(head))
    for row in report["modules"]:
        print(f"{row['module']:<45}{row['alone_mib']:>8.1f}{row['added_mib']:>+8.1f}{row['total_mib']:>8.1f}"
              f"{row['import_ms']:>11.1f}")
    print("MiB: alone = RSS added by importing only that module; added = by importing it after the rows above")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--daemon", choices=sorted(DAEMONS), default="proxy",
                        help="whose imports to measure when no MODULE is given (default: proxy)")
    parser.add_argument("modules", nargs="*", help="modules to measure (default: the daemon's)")
    args = parser.parse_args(argv)
    report = measure(args.modules or DAEMONS[args.daemon])
    print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
