"""The relay's own CPU per call, counted in instructions: record real traffic once, replay it.

    python bench/relay_replay.py record FILE [--method ListContainers] [--calls 2000]
    python bench/relay_replay.py replay FILE [--events N]
    python bench/relay_replay.py callgrind FILE

`record` starts the test bed's containerd with 50 containers and a proxy in this process, sends
`--calls` calls from 16 callers through it (bench/relay_client.py) and writes every read the
relay got from either side, in order, to FILE. `replay` feeds those reads to a RelayConnection
between two in-memory transports (no sockets, no event-loop turns: the relay's frame handling,
header decoding and metrics only) and prints digests of what it wrote, so two versions of the
code can be checked to write the same bytes. The digests leave PING frames out and count them
apart: the relay answers PINGs itself rather than relaying them, so they are not part of the
traffic it forwards. `callgrind` runs the replay under valgrind twice, with every read and with
none, and prints the difference per relayed call: instructions do not
depend on what else the machine is doing, unlike the CPU times of bench/relay_bench.py. The
replay runs on uvloop, as the daemon does, with the cyclic GC off while the reads are fed: the
daemon makes a handful of collections after start-up, and in a replay they land at different
points for two versions of the code, a few thousand instructions per call of noise.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop
from prometheus_client import CollectorRegistry
from relay_bench import CLIENT_SCRIPT, fill, require_root  # bench/ is on sys.path when run as a script

from runtimeproxy.proxy.metrics import CallMetrics
from runtimeproxy.proxy.server import CallLog, ProxyServer, ProxySettings
from runtimeproxy.relay.call_interceptor import PassThrough
from runtimeproxy.relay.connection import Backends, RelayConnection, RelayOptions
from runtimeproxy.relay.methods import MethodInfo, MethodTable
from runtimeproxy.testbed import Containerd
from runtimeproxy.wire import frames

EVENT = struct.Struct(">cL")  # side (b"c": from the client, b"u": from the backend), length
Events = list[tuple[bytes, bytes]]


# -- recording ------------------------------------------------------------------------------------


def record(path: Path, method: str, calls: int) -> None:
    events: Events = []
    client_data, upstream_data = RelayConnection.client_data, RelayConnection.upstream_data

    def from_client(conn: RelayConnection, data: bytes) -> None:
        if conn.early is None:  # reads held until the backend connection was made come again
            events.append((b"c", bytes(data)))
        client_data(conn, data)

    def from_backend(conn: RelayConnection, data: bytes) -> None:
        events.append((b"u", bytes(data)))
        upstream_data(conn, data)

    RelayConnection.client_data = from_client  # type: ignore[method-assign,assignment]
    RelayConnection.upstream_data = from_backend  # type: ignore[method-assign,assignment]
    bed = Containerd(pod_network=False)
    try:
        bed.start()
        print(f"{fill(bed, 10, 5)} containers", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="rtpx-replay-") as work:
            asyncio.run(_load(Path(work) / "proxy.sock", str(bed.socket), method, calls))
    finally:
        bed.stop()
    with path.open("wb") as out:
        for side, data in events:
            out.write(EVENT.pack(side, len(data)) + data)
    print(f"{len(events)} reads written to {path}", file=sys.stderr)


async def _load(socket: Path, backend: str, method: str, calls: int) -> None:
    server = ProxyServer(ProxySettings(endpoint=str(socket), runtime_backend=backend),
                         metrics=CallMetrics(CollectorRegistry()))
    await server.start()
    client = await asyncio.create_subprocess_exec(sys.executable, str(CLIENT_SCRIPT), stdin=subprocess.PIPE,
                                                  stdout=subprocess.PIPE)
    assert client.stdin is not None and client.stdout is not None
    job = {"socket": str(socket), "method": method, "concurrency": 16, "calls": calls, "warmup": 0, "watch": {}}
    client.stdin.write((json.dumps(job) + "\n").encode())
    answer = json.loads(await client.stdout.readline())
    client.stdin.close()
    await client.wait()
    await server.shutdown(1.0)
    if "error" in answer:
        raise RuntimeError(answer["error"])


# -- replaying ------------------------------------------------------------------------------------


def load(path: Path) -> Events:
    data, events, pos = path.read_bytes(), [], 0
    while pos < len(data):
        side, length = EVENT.unpack_from(data, pos)
        pos += EVENT.size
        events.append((side, data[pos : pos + length]))
        pos += length
    return events


class Sink:
    """An asyncio transport stand-in: hashes what the relay writes to it, PING frames left out."""

    def __init__(self, digest: bool, preface: bool = False) -> None:
        self.digest = hashlib.sha256() if digest else None
        self.size = self.writes = self.pings = 0
        self.skip = len(frames.PREFACE) if preface else 0  # not a frame: hashed as it is
        self.unparsed = bytearray()

    def write(self, data: bytes | memoryview) -> None:
        if self.digest is not None:  # off under callgrind: hashing would swamp the count
            self.unparsed += data
            self._hash_frames()
        self.size += len(data)
        self.writes += 1

    def writelines(self, pieces: list[bytes | memoryview]) -> None:
        """One call, one syscall (a writev on uvloop): counted as one write."""
        for piece in pieces:
            self.write(piece)
        self.writes -= len(pieces) - 1

    def _hash_frames(self) -> None:
        assert self.digest is not None
        buf, pos = self.unparsed, self.skip
        if pos:
            if len(buf) < pos:
                return
            self.digest.update(buf[:pos])
            self.skip = 0
        while len(buf) - pos >= frames.HEADER_LEN:
            high, low, ftype, _flags, _sid = frames.FRAME_HEADER.unpack_from(buf, pos)
            end = pos + frames.HEADER_LEN + ((high << 8) | low)
            if end > len(buf):
                break
            if ftype == frames.PING:
                self.pings += 1
            else:
                self.digest.update(buf[pos:end])
            pos = end
        del buf[:pos]

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def __str__(self) -> str:
        digest = self.digest.hexdigest()[:16] if self.digest is not None else "-"
        return f"{self.size} bytes in {self.writes} writes, {self.pings} PINGs, sha256 without PINGs {digest}"


def replay(events: Events, digest: bool) -> dict[str, Any]:
    calls = 0
    log = CallLog(CallMetrics(CollectorRegistry()))

    def observe(method: MethodInfo, code: int, message: str, seconds: float, hooked: bool) -> None:
        nonlocal calls
        calls += 1
        log(method, code, message, seconds, hooked)

    options = RelayOptions(Backends("/unused"), MethodTable(), PassThrough(), observe, 16 << 20)
    conn = RelayConnection(options, lambda _conn: None)
    to_client, to_backend = Sink(digest), Sink(digest, preface=True)
    conn.side_made(False, to_backend)  # type: ignore[arg-type]
    conn.client_transport = conn.u2c.transport = to_client  # type: ignore[assignment]
    conn.early = None  # as once the backend connection is made

    async def run() -> float:
        handlers: dict[bytes, Callable[[bytes], None]] = {b"c": conn.client_data, b"u": conn.upstream_data}
        gc.disable()  # see the module doc
        try:
            began = time.process_time()
            for side, data in events:
                handlers[side](data)
            return time.process_time() - began
        finally:
            gc.enable()

    cpu = uvloop.run(run())
    return {"calls": calls, "cpu_s": cpu, "to_client": str(to_client), "to_backend": str(to_backend)}


def instructions(path: Path, events: int) -> int:
    """Instructions callgrind counts for the whole process replaying the first ``events`` reads."""
    return callgrind_instructions([__file__, "replay", str(path), "--events", str(events), "--no-digest"])


def callgrind_instructions(script_args: list[str]) -> int:
    """Instructions callgrind counts for a whole ``python script_args...`` process (hash seed fixed:
    a random one moves dict and set work between runs)."""
    with tempfile.TemporaryDirectory() as work:
        env = os.environ | {"PYTHONHASHSEED": "0"}
        done = subprocess.run(["valgrind", "--tool=callgrind", "--cache-sim=no", f"--callgrind-out-file={work}/out",
                               sys.executable, *script_args], capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("action", choices=["record", "replay", "callgrind"])
    parser.add_argument("file", type=Path)
    parser.add_argument("--method", default="ListContainers", choices=["Version", "ListContainers"])
    parser.add_argument("--calls", type=int, default=2000, help="calls to record (default 2000)")
    parser.add_argument("--events", type=int, help="replay only the first N reads")
    parser.add_argument("--no-digest", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.action == "record":
        require_root("relay_replay.py")
        record(args.file, args.method, args.calls)
        return
    events = load(args.file)
    if args.action == "replay":
        timed = replay(events[: args.events], digest=False)
        if args.no_digest:  # under callgrind
            return
        result = replay(events[: args.events], digest=True)
        print(f"{result['calls']} calls, {timed['cpu_s'] * 1e6 / max(timed['calls'], 1):.1f} us CPU per call; "
              f"to the client {result['to_client']}; to the backend {result['to_backend']}")
        return
    calls = replay(events, digest=False)["calls"]
    full, empty = instructions(args.file, len(events)), instructions(args.file, 0)
    print(f"{calls} calls: {full:,} instructions replaying them, {empty:,} without; "
          f"{(full - empty) / calls:,.0f} instructions per relayed call")


if __name__ == "__main__":
    main()
