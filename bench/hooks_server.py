"""No-op hook server for hooks_bench.py, run as its own process.

    python bench/hooks_server.py SOCKET

Serves every RPC of runtime.v1alpha1.RuntimeHookService on the unix socket SOCKET with the
project's own gRPC server (runtimeproxy.wire.grpc_server, as runtime-hooks): each decodes its request
(the generated messages) and answers an empty response, so the proxy changes nothing. It
runs on uvloop, as runtime-hooks and the proxy do, so that what it costs is the protocol's,
not a slower event loop's. It sends READY=1 to $NOTIFY_SOCKET once it serves. It counts
calls per hook point; calls that carry the PROBE_KEY metadata (the bench client's direct
round-trip probes) are counted apart.
On SIGTERM or SIGINT it stops and prints the counts as one JSON line on stdout:
{"calls": {"PreRunPodSandbox": 41, ...}, "probes": {...}}.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections import Counter
from typing import Any

import uvloop

from runtimeproxy.api.runtime.v1alpha1 import api_pb2 as hook
from runtimeproxy.common.listener import open_unix_listener
from runtimeproxy.common.message_size import DEFAULT_MAX_MESSAGE_SIZE
from runtimeproxy.common.sdnotify import notify
from runtimeproxy.wire.grpc_server import CallInfo, H2Server, UnaryHandler

PROBE_KEY = "x-hooks-bench-probe"
SERVICE = hook.DESCRIPTOR.services_by_name["RuntimeHookService"]


def noop_handlers(calls: Counter[str], probes: Counter[str]) -> dict[str, UnaryHandler]:
    """":path" to a handler that decodes the request, counts the call and answers an empty response."""

    def handler(point: str, request_type: Any, response_type: Any) -> UnaryHandler:
        empty: bytes = response_type().SerializeToString()

        async def rpc(raw: bytes, info: CallInfo) -> bytes:
            request_type.FromString(raw)
            probe = info.metadata and any(key == PROBE_KEY for key, _ in info.metadata)  # the proxy sends none
            counter = probes if probe else calls
            counter[point] += 1
            return empty

        return rpc

    return {
        f"/{SERVICE.full_name}/{m.name}": handler(
            m.name.removesuffix("Hook"), getattr(hook, m.input_type.name), getattr(hook, m.output_type.name)
        )
        for m in SERVICE.methods
    }


async def serve(socket_path: str) -> dict[str, dict[str, int]]:
    calls: Counter[str] = Counter()
    probes: Counter[str] = Counter()
    listener = open_unix_listener(socket_path)
    server = H2Server(noop_handlers(calls, probes), max_message_size=DEFAULT_MAX_MESSAGE_SIZE, name="no-op hooks")
    await server.start(listener.sock)
    notify("READY=1")  # the bench waits for it, as for the daemons (runtimeproxy/testbed/daemons.py)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(1.0)
    listener.close()
    return {"calls": dict(sorted(calls.items())), "probes": dict(sorted(probes.items()))}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} SOCKET")
    counts = uvloop.run(serve(sys.argv[1]))
    sys.stdout.write(json.dumps(counts) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
