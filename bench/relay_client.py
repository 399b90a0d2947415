"""Load generator for relay_bench.py, run as its own process.

It reads one JSON job a line on stdin and answers each with one JSON line on stdout,
until stdin closes. A job names a CRI socket, a method, how many callers share one
grpc.aio channel, how many calls to time and how many warm-up calls to make first.
The answer holds every timed call's latency and the CPU time that this process and
the watched processes (the proxy, containerd) used during the timed calls only.

Calls carry raw bytes (no serializers) to keep this process's own CPU cost per call
low; the first warm-up response is decoded once to check what the target answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from runtimeproxy.api.runtime.v1 import api_pb2 as pb

SERVICE = "/runtime.v1.RuntimeService/"
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
MAX_MESSAGE = 16 * 1024 * 1024

# Request bytes, and how to summarise the response, for each method the bench times.
REQUESTS: dict[str, bytes] = {
    "Version": pb.VersionRequest(version="v1").SerializeToString(),
    "ListContainers": pb.ListContainersRequest().SerializeToString(),
}


def describe_response(method: str, data: bytes) -> str:
    """A short check of a response, e.g. 'containerd 1.6.20' or '50 containers'."""
    if method == "Version":
        version = pb.VersionResponse.FromString(data)
        return f"{version.runtime_name} {version.runtime_version}"
    return f"{len(pb.ListContainersResponse.FromString(data).containers)} containers"


def process_cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime, stime) of every thread of `pid`, from /proc/<pid>/stat (clock-tick resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()  # fields[0] is field 3 of proc_pid_stat(5)
    return int(fields[11]) / CLOCK_TICK, int(fields[12]) / CLOCK_TICK  # fields 14 and 15


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds summed over all CPUs, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values)
    return (total - idle) / CLOCK_TICK, total / CLOCK_TICK


@dataclass
class Job:
    socket: str
    method: str
    concurrency: int
    calls: int
    warmup: int
    watch: dict[str, int]  # name -> pid whose CPU time to sample around the timed calls


async def run_calls(call: Any, request: bytes, concurrency: int, calls: int) -> tuple[list[float], float]:
    """`calls` calls from `concurrency` callers sharing one channel: latencies and wall time."""
    latencies: list[float] = []
    left = calls
    clock = time.perf_counter

    async def caller() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            began = clock()
            await call(request, timeout=30.0)
            latencies.append(clock() - began)

    began = clock()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return latencies, clock() - began


async def run_job(job: Job) -> dict[str, Any]:
    options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
    async with grpc.aio.insecure_channel(f"unix://{job.socket}", options=options) as channel:
        call = channel.unary_unary(SERVICE + job.method, request_serializer=None, response_deserializer=None)
        request = REQUESTS[job.method]
        checked = describe_response(job.method, await call(request, timeout=30.0))
        await run_calls(call, request, job.concurrency, job.warmup)

        watched_before = {name: process_cpu_seconds(pid) for name, pid in job.watch.items()}
        machine_before = machine_cpu_seconds()
        cpu_before = time.process_time()  # all threads of this process, gRPC's included
        latencies, wall = await run_calls(call, request, job.concurrency, job.calls)
        client_cpu = time.process_time() - cpu_before
        machine_after = machine_cpu_seconds()
        watched_after = {name: process_cpu_seconds(pid) for name, pid in job.watch.items()}

    # name -> [user, system] CPU seconds used during the timed calls
    watched = {name: [after - before for after, before in zip(watched_after[name], watched_before[name], strict=True)]
               for name in job.watch}

    return {
        "latencies": latencies,
        "wall": wall,
        "client_cpu": client_cpu,
        "watched_cpu": watched,
        "machine_busy_cpu": machine_after[0] - machine_before[0],
        "machine_total_cpu": machine_after[1] - machine_before[1],
        "checked": checked,
    }


JobHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def serve_jobs(handle: JobHandler) -> None:
    """The client protocol every bench client speaks: one JSON job a line on stdin, one JSON answer
    a line on stdout (an "error" answer when the job failed), until stdin closes."""
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        try:
            answer = await handle(json.loads(line))
        except grpc.RpcError as err:
            answer = {"error": f"{err.code()}: {err.details()}"}
        except Exception as err:  # reported to the parent, which stops the bench
            answer = {"error": f"{type(err).__name__}: {err}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def by_op(ops: dict[str, JobHandler]) -> JobHandler:
    """A handler that hands each job to ops[job["op"]] (an unknown op answers an error)."""

    async def handle(job: dict[str, Any]) -> dict[str, Any]:
        return await ops[job["op"]](job)

    return handle


async def run_job_line(job: dict[str, Any]) -> dict[str, Any]:
    return await run_job(Job(**job))


if __name__ == "__main__":
    asyncio.run(serve_jobs(run_job_line))
