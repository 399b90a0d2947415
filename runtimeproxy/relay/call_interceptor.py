"""The seam where the hook layer meets the relay.

The relay moves bytes. For a unary method that an interceptor claims, it holds the request
message back, hands it to ``before`` (which may return a changed request or reject the
call), sends the result to the backend, and once the call has ended hands request and
response to ``after``. The relay itself never applies policy.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from runtimeproxy.relay.methods import MethodInfo


@dataclass(slots=True)
class CallContext:
    method: MethodInfo
    # Request metadata as sent by the caller (pseudo-headers left out).
    metadata: Sequence[tuple[str, str]] = ()
    # Absolute deadline on the event loop's clock, from grpc-timeout; None when unset.
    deadline: float | None = None
    # The request's message encoding (grpc-encoding), "identity" when none was named.
    encoding: str = "identity"
    # Unique for the process's life (trace events name calls by it: an id() is reused).
    serial: int = field(default_factory=itertools.count(1).__next__)


@dataclass(frozen=True, slots=True)
class CallOutcome:
    code: int
    message: str
    # The response message; None when the call ended without one.
    response: bytes | None


class RejectCall(Exception):
    """Raised by ``before`` to end the call with a gRPC status instead of relaying it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CallInterceptor(Protocol):
    def intercepts(self, method: MethodInfo) -> bool:
        """Whether calls of ``method`` go through ``before`` and ``after``; asked once per method."""
        ...

    async def before(self, call: CallContext, request: bytes) -> bytes:
        """Return the request to send on (``request`` itself when unchanged)."""
        ...

    async def after(self, call: CallContext, request: bytes, outcome: CallOutcome) -> None:
        """Runs once the call has ended, for every call ``before`` let through (also when the
        call was cancelled or its connection lost); it cannot change the response."""
        ...


class PassThrough:
    """The interceptor of a proxy with no hooks: it claims no method."""

    def intercepts(self, method: MethodInfo) -> bool:
        return False

    async def before(self, call: CallContext, request: bytes) -> bytes:
        return request

    async def after(self, call: CallContext, request: bytes, outcome: CallOutcome) -> None:
        return None
