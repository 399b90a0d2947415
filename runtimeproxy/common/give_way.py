"""Giving the CPU to the process an answer just woke, before the work that can wait.

A server that answers a caller who waits (containerd at an NRI event, the proxy at a hook call)
often has more to do right after writing the answer: its log lines and metrics, and for an NRI
notification answered on arrival, the plugins' hooks. On a node with few cores the caller's
thread, woken by the answer, may be queued on the CPU this process holds, and then waits for
all of that. One sched_yield(2) after the write lets it run first; when nothing else is ready
to run on this CPU it returns at once (under a microsecond). When a busy thread shares the CPU,
the work after the answer may wait for its time slice (milliseconds): nothing waits on that work.
"""

from __future__ import annotations

import os

__all__ = ["give_way"]


def give_way() -> None:
    """Let a runnable thread of another process go first on this CPU, once (module doc)."""
    os.sched_yield()
