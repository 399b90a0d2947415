"""Per-call state the relay keeps while a gRPC call (one HTTP/2 stream) is open."""

from __future__ import annotations

import asyncio

from runtimeproxy.relay.grpc_wire import MessageSizer
from runtimeproxy.relay.interceptor import CallContext
from runtimeproxy.relay.methods import MethodInfo


class Stream:
    """One relayed call. Calls an interceptor claims also hold their request and response."""

    __slots__ = (
        "after_due",
        "before_task",
        "call",
        "client_owed",
        "held_bytes",
        "held_request",
        "id",
        "intercepted",
        "method",
        "pending_out",
        "request",
        "request_sizer",
        "response_body",
        "response_headers_seen",
        "response_sizer",
        "sending",
        "started",
        "up_window",
    )

    def __init__(
        self,
        stream_id: int,
        method: MethodInfo,
        started: float,
        max_message: int,
        call: CallContext | None,
    ) -> None:
        self.id = stream_id
        self.method = method
        self.started = started
        self.call = call
        self.intercepted = call is not None
        self.request_sizer = MessageSizer(max_message)
        self.response_sizer = MessageSizer(max_message)
        self.response_headers_seen = False
        # Intercepted calls only: the request as received, then as sent on.
        self.held_request = bytearray() if call is not None else None
        self.held_bytes = 0  # counted against the relay's held-request budget
        # Connection credit due to the client for the held request's last DATA frame, paid by
        # the backend's credit once it is sent on (RelayConnection._send_request).
        self.client_owed = 0
        self.request = b""
        self.response_body = bytearray() if call is not None else None
        self.before_task: asyncio.Task[None] | None = None
        # Set once the request went on: ``after`` is then owed however the call ends.
        self.after_due = False
        # The part of a changed request still waiting for backend flow-control credit.
        self.pending_out = b""
        self.sending = False
        self.up_window = 0
