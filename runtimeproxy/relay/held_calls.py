"""Claimed calls on a relayed connection: holding the request, the interceptor's ``before`` and
``after``, sending the changed request on, refusing.

A call the interceptor claims (RelayOptions.intercepts) has its request DATA held here, under
the held-request budget shared by every connection (options.HeldBytes); once the request is
whole, ``before`` runs in a task and its answer is sent on in place of the request (or the call
is refused with the status it chose); when the call ends, ``after`` is told its outcome with a
copy of the response. ``HeldCalls`` supplies these steps to the frame state machine
(frame_machine.RelayMachine), and takes the event loop and the parked credit write from the
I/O side (connection.RelayConnection) that derives from it.

May import the standard library, asyncio, structlog, runtimeproxy.common, runtimeproxy.wire and
the relay's frame_machine, streams, methods, call_interceptor and options modules; never
connection.py or sockets.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from runtimeproxy.common import trace
from runtimeproxy.relay.call_interceptor import CallContext, CallOutcome, RejectCall
from runtimeproxy.relay.frame_machine import RelayMachine, _HeldHeaders, _oversized, _too_large
from runtimeproxy.relay.methods import MethodInfo
from runtimeproxy.relay.options import RelayOptions
from runtimeproxy.relay.streams import HeldStream, Stream
from runtimeproxy.wire import frames, grpc_framing

log = structlog.get_logger("runtimeproxy.relay")


class HeldCalls(RelayMachine):
    """The claimed calls of one connection; see the module docstring."""

    def __init__(self, options: RelayOptions) -> None:
        super().__init__(options)
        self.tasks: set[asyncio.Task[None]] = set()  # cancelled when the connection goes

    def _open_held(self, sid: int, method: MethodInfo, held: _HeldHeaders) -> HeldStream:
        seconds = held.timeout
        deadline = None if seconds is None else self._loop().time() + seconds
        call = CallContext(method, held.metadata, deadline, held.encoding)
        self.claimed = True
        stream = HeldStream(sid, method, time.perf_counter(), self.options.max_message_size, call)
        stream.up_window = self.up_initial_window
        return stream

    def _hold_request(self, stream: HeldStream, flags: int, data: bytes, start: int, end: int) -> bytes:
        length = end - start
        if stream.before_task is not None:
            # DATA after END_STREAM: forwarding it could hand the backend a request the hooks
            # never saw, so the call ends here.
            self.client_credit += length
            self._end_by_relay(stream, grpc_framing.INVALID_ARGUMENT, "DATA after the end of the request")
            return b""
        too_big = _oversized(stream, False, flags, data, start, end)
        if too_big is not None:
            self.client_credit += length
            self._end_by_relay(stream, grpc_framing.RESOURCE_EXHAUSTED, _too_large("request", too_big, stream))
            return b""
        lo, hi = frames.data_bounds(flags, data, start, end)
        if not self._hold(stream, hi - lo):
            self.client_credit += length
            return b""
        stream.held_request += data[lo:hi]
        if flags & frames.FLAG_END_STREAM:
            # The client waits for the answer now, not for credit: the backend's credit for
            # the request sent on pays for these bytes (see _send_request), or _finish does.
            stream.client_owed = length
            self._start_before(stream)
        elif length:
            # The client may still be waiting for credit to send the rest: now, both levels.
            self.client_credit += length
            self.u2c.inject(frames.window_update(stream.id, length))
        return b""

    def _hold(self, stream: HeldStream, size: int) -> bool:
        """Count ``size`` more held bytes against the budget, or refuse the call."""
        held = self.options.held
        if held.take(size):
            stream.held_bytes += size
            return True
        used, budget = held.used, held.budget
        log.warning("held-request budget exhausted; call refused", method=stream.method.path, held=used, budget=budget)
        self._end_by_relay(
            stream,
            grpc_framing.RESOURCE_EXHAUSTED,
            f"the proxy already holds {used} bytes of requests for its hooks, and this one would "
            f"exceed its budget of {budget} bytes (--held-request-budget); try again",
        )
        return False

    def _start_before(self, stream: HeldStream) -> None:
        task = self._loop().create_task(self._run_before(stream))
        stream.before_task = task
        self._keep(task)

    async def _run_before(self, stream: HeldStream) -> None:
        assert stream.call is not None
        try:
            request = self._held_message(stream)
            request = await self.options.interceptor.before(stream.call, request)
        except grpc_framing.BadRequest as bad:
            # The hooks could not see such a request, so it must not reach the runtime past them.
            log.warning("request refused", method=stream.method.path, reason=str(bad))
            self._refuse_open(stream, grpc_framing.INVALID_ARGUMENT, f"{stream.method.path}: {bad}")
            return
        except RejectCall as reject:
            self._refuse_open(stream, reject.code, reject.message)
            return
        except Exception as exc:
            # The interceptor applies the failure policies itself; an error escaping it (or
            # this code) is a bug in that very code, so nothing can say the call may pass
            # unhooked: refuse it.
            log.exception("interceptor failed; call refused", method=stream.method.path)
            self._refuse_open(stream, grpc_framing.INTERNAL, f"proxy hook layer failed: {type(exc).__name__}: {exc}")
            return
        if stream.id in self.streams:
            stream.request = request
            stream.after_due = True
            if trace.ON:
                trace.event("proxy.sent", call=stream.call.serial)
            self._send_request(stream, grpc_framing.encode_message(request))

    def _held_message(self, stream: HeldStream) -> bytes:
        """The held request's one message (BadRequest if it is not one). The held copy goes at
        once: large requests are budgeted, and the hooks must not hold two copies."""
        assert stream.call is not None
        received = bytes(stream.held_request)
        stream.held_request.clear()
        return grpc_framing.single_request(received, stream.call.encoding, self.options.max_message_size)

    def _refuse_open(self, stream: Stream, code: int, message: str) -> None:
        if stream.id in self.streams:  # not ended meanwhile (by the client, or the connection)
            self._refuse(stream, code, message)

    def _refuse(self, stream: Stream, code: int, message: str) -> None:
        """End a held call from its hook task (between reads): the status and the credit for
        the held bytes go to the client in one write."""
        u2c = self.u2c
        u2c.out = []
        try:
            self._end_by_relay(stream, code, message)
            self._flush_credit()
        finally:
            u2c.write_out()

    def _send_request(self, stream: HeldStream, body: bytes) -> None:
        stream.pending_out = body
        stream.sending = True
        self.sending_calls += 1
        # The backend credits ``body`` as it reads it; the client is owed what it sent.
        self._settle(stream.client_owed - len(body))
        stream.client_owed = 0
        if self.client_credit:  # sent on smaller: the relay's share can wait for the answer
            self._flush_credit_parked()
        self._send_pending(stream)

    def _finish_held(self, stream: HeldStream, code: int, message: str) -> None:
        if stream.held_bytes:
            self.options.held.give_back(stream.held_bytes)
            stream.held_bytes = 0
        if stream.client_owed:  # held and never sent on: the relay pays for it
            self._settle(stream.client_owed)
            stream.client_owed = 0
        if stream.sending:
            # Never sent, so the backend will never credit these bytes back.
            self._settle(len(stream.pending_out))
            stream.pending_out = b""
            stream.sending = False
            self.sending_calls -= 1
        seconds = time.perf_counter() - stream.started
        self.options.observer(stream.method, code, message, seconds, stream.before_task is not None)
        if stream.after_due:
            stream.after_due = False
            self._start_after(stream, code, message)

    def _start_after(self, stream: HeldStream, code: int, message: str) -> None:
        assert stream.call is not None
        response = None
        if stream.response_body:
            messages = grpc_framing.split_messages(bytes(stream.response_body))
            if messages and not messages[0].compressed:
                response = messages[0].body
        outcome = CallOutcome(code=code, message=message, response=response)
        if trace.ON:
            trace.event("proxy.answered", call=stream.call.serial, code=code)
        coro = self.options.interceptor.after(stream.call, stream.request, outcome)
        task = self._loop().create_task(_guarded(coro, stream.method.path))
        self.options.after_tasks.add(task)
        task.add_done_callback(self.options.after_tasks.discard)

    # -- header blocks -----------------------------------------------------------------------

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- supplied by the I/O side --------------------------------------------------------------

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running event loop (RuntimeError outside one)."""
        raise NotImplementedError

    def _flush_credit_parked(self) -> None:
        """Send the credit owed to the client now, in a write that may wait for the next one."""
        raise NotImplementedError


async def _guarded(coro: Any, method: str) -> None:
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("interceptor after-call failed", method=method)
