"""What every HTTP/2 peer of ours may send, and what happens when it sends more.

Every HTTP/2 connection end of the project holds its peer to the same limits, kept here: the
relay's client side (kubelet and other CRI clients) and backend side (the runtime), our gRPC
client (calls to hook servers and to the runtime) and our gRPC server (runtime-hooks' hook
endpoint); the last two through h2_peer. They bound the HTTP/2 floods that make an endpoint
work or buffer for frames that carry no call: PING and SETTINGS floods answered into a peer
that does not read (CVE-2019-9512, CVE-2019-9515), empty frames (CVE-2019-9518), rapid reset
(CVE-2023-44487) and CONTINUATION floods (CVE-2024-27316). docs/security.md ("HTTP/2 limits")
gives each value and why.

* Frames per unit of time: a token bucket per kind (`Allowance`): ``burst`` at once, refilled
  at ``per_second``. PINGs also earn one token per write of call data to the peer: grpc-go
  sends a BDP ping when data arrives and none of its pings is unanswered, and our answer comes
  after everything we wrote before it, so such a peer pings at most once per write of ours.
* CONTINUATION frames per header block, SETTINGS entries per frame, header block bytes.
* The write buffer towards a peer: above ``write_buffer_high`` bytes the endpoint stops reading
  from that peer (asyncio's pause_writing), so a peer that does not read what it asks for gets
  no further answers; control answers (PING and SETTINGS ACKs, RST_STREAM) made while the
  buffer is over its mark are capped (``queued_answers``).

A peer over a limit gets GOAWAY with ENHANCE_YOUR_CALM and its connection is closed (aborted
after CLOSE_GRACE seconds if it does not read the GOAWAY): one log line names the peer and the
limit, and ``runtimeproxy_h2_peer_limit_exceeded_total{peer,limit}`` counts it. Counting costs
a decrement per counted frame; the clock is read only when a bucket runs empty.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from dataclasses import dataclass
from typing import Final

import structlog

__all__ = [
    "CLOSE_GRACE",
    "CRI_CLIENT",
    "DEFAULT_LIMITS",
    "GRPC_CLIENT",
    "GRPC_SERVER",
    "LIMIT_NAMES",
    "OPENING_BYTES",
    "PEER_KINDS",
    "RUNTIME",
    "Allowance",
    "LimitSettings",
    "PeerLimits",
    "PeerOverLimit",
    "Rate",
    "exceeded_counts",
    "header_block_over",
    "peer_pid",
]

log = structlog.get_logger("runtimeproxy.wire.peer_limits")

# Who the peer is, the metric's ``peer`` label: a client of the proxy's socket (kubelet), the
# runtime behind the relay, a gRPC server our client calls (a hook server, or the runtime for
# the proxy's store), a gRPC client of our server (the proxy calling runtime-hooks).
CRI_CLIENT: Final = "cri_client"
RUNTIME: Final = "runtime"
GRPC_SERVER: Final = "grpc_server"
GRPC_CLIENT: Final = "grpc_client"
PEER_KINDS: Final = (CRI_CLIENT, RUNTIME, GRPC_SERVER, GRPC_CLIENT)

# The limits, the metric's ``limit`` label.
PING: Final = "ping"
SETTINGS: Final = "settings"
SETTINGS_ENTRIES: Final = "settings_entries"
RST_STREAM: Final = "rst_stream"
EMPTY_FRAMES: Final = "empty_frames"
CONTINUATION: Final = "continuation"
CONTINUATIONS_PER_BLOCK: Final = "continuations_per_block"
HEADER_BLOCK: Final = "header_block"
QUEUED_ANSWERS: Final = "queued_answers"
OPENING_BYTES: Final = "opening_bytes"
LIMIT_NAMES: Final = (
    PING, SETTINGS, SETTINGS_ENTRIES, RST_STREAM, EMPTY_FRAMES, CONTINUATION, CONTINUATIONS_PER_BLOCK,
    HEADER_BLOCK, QUEUED_ANSWERS, OPENING_BYTES,
)  # fmt: skip

#: Seconds a peer cut off has to read its GOAWAY before its connection is aborted.
CLOSE_GRACE: Final = 1.0


@dataclass(frozen=True)
class Rate:
    """``burst`` frames at once, ``per_second`` more each second."""

    burst: int
    per_second: float


@dataclass(frozen=True)
class LimitSettings:
    """The limits, in one place (docs/security.md, "HTTP/2 limits", says why each value)."""

    pings: Rate = Rate(1000, 1000.0)  # plus one per write of call data to the peer
    settings: Rate = Rate(100, 10.0)
    settings_entries: int = 32  # per SETTINGS frame
    resets: Rate = Rate(1000, 100.0)
    empty_frames: Rate = Rate(1000, 100.0)  # DATA ending nothing, HEADERS with an empty block
    continuations: Rate = Rate(1000, 100.0)
    continuations_per_block: int = 64
    queued_answers: int = 1000  # control answers made while the write buffer is over its mark
    write_buffer_high: int = 64 * 1024
    write_buffer_low: int = 16 * 1024


DEFAULT_LIMITS: Final = LimitSettings()

# Limits exceeded since the process started, by (peer kind, limit): written by the event loop,
# read by the metrics server's thread (metrics.PeerLimitMetrics).
_exceeded: dict[tuple[str, str], int] = {}


def exceeded_counts() -> dict[tuple[str, str], int]:
    """How often each peer kind went over each limit in this process: a copy, made in one
    C-level call (atomic under the GIL), so another thread may take it without a lock."""
    return dict(_exceeded)


class PeerOverLimit(Exception):
    """The peer went over ``limit`` (one of LIMIT_NAMES): its connection ends with GOAWAY
    ENHANCE_YOUR_CALM."""

    def __init__(self, limit: str, reason: str) -> None:
        super().__init__(reason)
        self.limit = limit


class Allowance:
    """A token bucket refilled lazily: the clock is read only when it runs empty. What it
    allows over any time T is at most burst + per_second * T (+ what it ``earned``)."""

    __slots__ = ("burst", "earned", "per_second", "stamp", "tokens")

    def __init__(self, rate: Rate) -> None:
        self.burst = rate.burst
        self.per_second = rate.per_second
        self.tokens: float = rate.burst
        self.earned = 0  # tokens given since the last refill for other reasons (PeerLimits.data_sent)
        self.stamp = time.monotonic()

    def take(self) -> bool:
        """One frame: False when the bucket is empty even after its refill."""
        self.tokens -= 1
        return self.tokens >= 0 or self._refill()

    def _refill(self) -> bool:
        now = time.monotonic()
        gained = (now - self.stamp) * self.per_second + self.earned
        self.stamp, self.earned = now, 0
        self.tokens = min(float(self.burst), self.tokens + gained)
        return self.tokens >= 0


class PeerLimits:
    """What one peer (of kind ``peer``, one of PEER_KINDS) has used of its limits on one
    connection. Each method counts one frame and raises `PeerOverLimit` past a limit."""

    __slots__ = (
        "_continuations",
        "_empty",
        "_pings",
        "_resets",
        "_settings",
        "peer",
        "queued",
        "values",
        "writing_paused",
    )

    def __init__(self, peer: str, values: LimitSettings = DEFAULT_LIMITS) -> None:
        self.peer = peer
        self.values = values
        self._pings = Allowance(values.pings)
        self._settings = Allowance(values.settings)
        self._resets = Allowance(values.resets)
        self._empty = Allowance(values.empty_frames)
        self._continuations = Allowance(values.continuations)
        self.writing_paused = False  # the write buffer towards the peer is over its mark
        self.queued = 0  # control answers made since it went over

    def data_sent(self) -> None:
        """Call data went out to the peer in one write: it may ping once more (module doc)."""
        self._pings.earned += 1

    def ping(self) -> None:
        if not self._pings.take():
            raise PeerOverLimit(PING, _over_rate("PING frames", self.values.pings) + " beyond one per write")

    def settings(self, payload_length: int) -> None:
        """A SETTINGS frame (ACK or not) of ``payload_length`` bytes (6 per entry)."""
        if payload_length > 6 * self.values.settings_entries:
            raise PeerOverLimit(SETTINGS_ENTRIES, f"a SETTINGS frame of over {self.values.settings_entries} entries")
        if not self._settings.take():
            raise PeerOverLimit(SETTINGS, _over_rate("SETTINGS frames", self.values.settings))

    def reset(self) -> None:
        if not self._resets.take():
            raise PeerOverLimit(RST_STREAM, _over_rate("RST_STREAM frames", self.values.resets))

    def empty_frame(self) -> None:
        """A DATA frame without data or END_STREAM, or a HEADERS frame with no header block
        bytes that does not end its stream."""
        if not self._empty.take():
            raise PeerOverLimit(EMPTY_FRAMES, _over_rate("empty DATA or HEADERS frames", self.values.empty_frames))

    def continuation(self, in_block: int) -> None:
        """A CONTINUATION frame, the ``in_block``-th of its header block (0: none open)."""
        most = self.values.continuations_per_block
        if in_block > most:
            raise PeerOverLimit(CONTINUATIONS_PER_BLOCK, f"over {most} CONTINUATION frames in one header block")
        if not self._continuations.take():
            raise PeerOverLimit(CONTINUATION, _over_rate("CONTINUATION frames", self.values.continuations))

    def answered(self) -> None:
        """A control answer (PING or SETTINGS ACK, RST_STREAM) is written: capped while the write
        buffer is over its mark (the peer does not read)."""
        if self.writing_paused:
            self.queued += 1
            most = self.values.queued_answers
            if self.queued > most:
                raise PeerOverLimit(QUEUED_ANSWERS, f"over {most} control answers queued to a peer that does not read")

    def pause(self, paused: bool) -> None:
        """The write buffer towards the peer went over its high-water mark (True) or back
        under its low one (False)."""
        self.writing_paused = paused
        self.queued = 0

    def report(self, exc: PeerOverLimit, name: str, pid: int | None = None) -> None:
        """The one log line of a peer cut off for ``exc``, and its count in the metric."""
        key = (self.peer, exc.limit)
        _exceeded[key] = _exceeded.get(key, 0) + 1
        log.warning(
            "closing the HTTP/2 connection: the peer went over a limit",
            peer_kind=self.peer, peer=name, limit=exc.limit, reason=str(exc), h2_error="ENHANCE_YOUR_CALM",
            **({"peer_pid": pid} if pid is not None else {}),
        )  # fmt: skip


def header_block_over(limit: int, size: int | None = None) -> PeerOverLimit:
    """A header block of ``size`` bytes over ``limit`` (None: its decoded header list is)."""
    if size is None:
        return PeerOverLimit(HEADER_BLOCK, f"header list over the {limit} bytes allowed")
    return PeerOverLimit(HEADER_BLOCK, f"header block of {size} bytes over the {limit} allowed")


def _over_rate(what: str, rate: Rate) -> str:
    return f"{what} over {rate.burst} at once or {rate.per_second:g} a second"


_PEERCRED: Final = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_pid(transport: asyncio.BaseTransport | None) -> int | None:
    """The process id at the other end of a unix socket (SO_PEERCRED), for the log line of a
    peer cut off; None when it cannot be known."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return None
    try:
        pid, _uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except (OSError, AttributeError, struct.error):
        return None
    return int(pid) or None
