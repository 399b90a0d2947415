"""Per-call state the relay keeps while a gRPC call (one HTTP/2 stream) is open."""

from __future__ import annotations

import asyncio

from runtimeproxy.relay.call_interceptor import CallContext
from runtimeproxy.relay.methods import MethodInfo
from runtimeproxy.wire.grpc_framing import MessageSizer


class Stream:
    """One relayed call: what every call needs, and no more (one is made per call).

    The message sizers are made only when a DATA frame is not exactly one whole message (see
    ``_oversized`` in frame_machine.py): a unary call never needs them.
    """

    __slots__ = ("call", "id", "limit", "method", "request_sizer", "response_headers_seen", "response_sizer", "started")

    def __init__(self, stream_id: int, method: MethodInfo, started: float, limit: int) -> None:
        self.id = stream_id
        self.method = method
        self.started = started
        self.limit = limit  # the largest message, either way
        self.request_sizer: MessageSizer | None = None
        self.response_sizer: MessageSizer | None = None
        self.response_headers_seen = False
        self.call: CallContext | None = None  # set for a call an interceptor claims (HeldStream)


class HeldStream(Stream):
    """A call an interceptor claims: it holds its request for the hooks and copies its response."""

    __slots__ = (
        "after_due",
        "before_task",
        "client_owed",
        "held_bytes",
        "held_request",
        "pending_out",
        "request",
        "response_body",
        "sending",
        "up_window",
    )

    def __init__(self, stream_id: int, method: MethodInfo, started: float, limit: int, call: CallContext) -> None:
        super().__init__(stream_id, method, started, limit)
        self.call = call
        # The request as received, then as sent on.
        self.held_request = bytearray()
        self.held_bytes = 0  # counted against the relay's held-request budget
        # Connection credit due to the client for the held request's last DATA frame, paid by
        # the backend's credit once it is sent on (RelayConnection._send_request).
        self.client_owed = 0
        self.request = b""
        self.response_body = bytearray()
        self.before_task: asyncio.Task[None] | None = None
        # Set once the request went on: ``after`` is then owed however the call ends.
        self.after_due = False
        # The part of a changed request still waiting for backend flow-control credit.
        self.pending_out = b""
        self.sending = False
        self.up_window = 0
