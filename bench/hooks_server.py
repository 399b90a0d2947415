"""No-op hook server for hooks_bench.py, run as its own process.

    python bench/hooks_server.py SOCKET

Serves every RPC of runtime.v1alpha1.RuntimeHookService (grpc.aio, the project's
generated stubs) on the unix socket SOCKET: each decodes its request and answers an
empty response, so the proxy changes nothing. It sends READY=1 to $NOTIFY_SOCKET once it
serves. It counts calls per hook point; calls that carry the PROBE_KEY metadata (the bench
client's direct round-trip probes) are counted apart. On SIGTERM or SIGINT it stops and prints
the counts as one JSON line on stdout: {"calls": {"PreRunPodSandbox": 41, ...}, "probes": {...}}.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections import Counter
from typing import Any

import grpc.aio

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.api.runtime.v1alpha1 import api_pb2_grpc as hook_grpc
from runtimeproxy.sdnotify import notify

PROBE_KEY = "x-hooks-bench-probe"
SERVICE = hook.DESCRIPTOR.services_by_name["RuntimeHookService"]


def noop_servicer(calls: Counter[str], probes: Counter[str]) -> hook_grpc.RuntimeHookServiceServicer:
    """A servicer whose every RPC counts the call and answers an empty response."""

    def handler(point: str, response_type: Any) -> Any:
        async def rpc(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            metadata = context.invocation_metadata() or ()
            counter = probes if any(item[0] == PROBE_KEY for item in metadata) else calls
            counter[point] += 1
            return response_type()

        return rpc

    methods = {m.name: handler(m.name.removesuffix("Hook"), getattr(hook, m.output_type.name)) for m in SERVICE.methods}
    servicer_type = type("NoopHooks", (hook_grpc.RuntimeHookServiceServicer,), methods)
    servicer: hook_grpc.RuntimeHookServiceServicer = servicer_type()
    return servicer


async def serve(socket_path: str) -> dict[str, dict[str, int]]:
    calls: Counter[str] = Counter()
    probes: Counter[str] = Counter()
    server = grpc.aio.server()
    hook_grpc.add_RuntimeHookServiceServicer_to_server(noop_servicer(calls, probes), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    notify("READY=1")  # the bench waits for it, as for the daemons (runtimeproxy/testbed/daemons.py)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(1.0)
    return {"calls": dict(sorted(calls.items())), "probes": dict(sorted(probes.items()))}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} SOCKET")
    counts = asyncio.run(serve(sys.argv[1]))
    sys.stdout.write(json.dumps(counts) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
