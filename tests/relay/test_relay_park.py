"""Parked frames: a write that can wait goes out with the next write towards that peer.

A claimed call's HEADERS are of no use to the backend before the hooks release its DATA, and
the relay's own flow-control credit (WINDOW_UPDATE) can wait for the next frame to its peer:
both are parked instead of written, so a hooked call costs a write and a backend wake-up less.
Parked bytes always go first (order never changes), at most ``PARK_DELAY`` later (a timer),
and nothing is parked when the read writes other frames to that peer anyway. Answers to the
backend's BDP pings wait ``BDP_ANSWER_DELAY`` whatever else goes to the backend, so that grpc-go
sends no further BDP ping (and WINDOW_UPDATE before it) after each request. A held request's
last frame is credited to the client by the backend's own credit for the request sent on
(test_relay_credit.py has the rest).
"""

from __future__ import annotations

import asyncio

import hpack
import pytest
from fake_runtime import grpc_request_headers
from relay_pair import VERSION, Pair, message

from runtimeproxy.relay import connection
from runtimeproxy.relay.call_interceptor import CallContext, CallOutcome, RejectCall
from runtimeproxy.relay.methods import MethodInfo
from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import encode_message

LIST = "/runtime.v1.RuntimeService/ListContainers"
BDP_PING = bytes.fromhex("02 04 10 10 09 0e 07 07")  # grpc-go's BDP ping payload


class Gate:
    """Claims Version calls; each ``before`` waits until the test answers it."""

    def __init__(self) -> None:
        self.waiting: asyncio.Queue[asyncio.Future[bytes]] = asyncio.Queue()

    def intercepts(self, method: MethodInfo) -> bool:
        return method.path == VERSION

    async def before(self, call: CallContext, request: bytes) -> bytes:
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiting.put_nowait(answer)
        return await answer

    async def after(self, call: CallContext, request: bytes, outcome: CallOutcome) -> None:
        return None


@pytest.fixture
def long_park(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a write may end a park in these tests, however slow the machine."""
    monkeypatch.setattr(connection, "PARK_DELAY", 3600.0)
    monkeypatch.setattr(connection, "BDP_ANSWER_DELAY", 3600.0)


async def turns(count: int = 5) -> None:
    """Let the loop run ready callbacks and tasks (a hook task finishing, a due timer)."""
    for _ in range(count):
        await asyncio.sleep(0)


async def hooked_pair() -> tuple[Pair, Gate]:
    gate = Gate()
    return Pair(interceptor=gate), gate


def credit(body: bytes) -> bytes:
    """Connection credit for a request of ``body`` in one DATA frame."""
    return frames.window_update(0, len(encode_message(body)))


def response(encoder: hpack.Encoder, sid: int, body: bytes) -> bytes:
    head = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
    trailers = encoder.encode([("grpc-status", "0")])
    return (
        frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, head)
        + message(sid, body, end_stream=False)
        + frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS | frames.FLAG_END_STREAM, sid, trailers)
    )


@pytest.mark.usefixtures("long_park")
@pytest.mark.parametrize("one_read", [True, False], ids=["one-read", "headers-then-data"])
async def test_a_claimed_call_reaches_the_backend_in_one_write_once_released(one_read: bool) -> None:
    pair, gate = await hooked_pair()
    headers, data = pair.headers(1), message(1, b"asked")
    if one_read:
        pair.conn.client_data(headers + data)
    else:
        pair.conn.client_data(headers)
        pair.conn.client_data(data)
    answer = await gate.waiting.get()
    assert pair.backend.writes == []
    assert pair.client.writes == []  # no credit for the held DATA: the client waits for its answer
    answer.set_result(b"changed")
    await turns()
    assert pair.backend.writes == [headers + message(1, b"changed")]
    reply = response(hpack.Encoder(), 1, b"reply")
    # The backend's credit for the larger request passes, less what the hooks added.
    pair.conn.upstream_data(credit(b"changed") + reply)
    assert pair.client.writes == [credit(b"asked") + reply]
    assert pair.observed == [(VERSION, grpc_framing.OK)]


@pytest.mark.usefixtures("long_park")
async def test_a_refused_call_sends_its_parked_headers_then_the_reset_in_one_write() -> None:
    pair, gate = await hooked_pair()
    headers = pair.headers(1)
    pair.conn.client_data(headers + message(1, b"asked"))
    (await gate.waiting.get()).set_exception(RejectCall(grpc_framing.UNAVAILABLE, "no"))
    await turns()
    assert pair.backend.writes == [headers + frames.rst_stream(1, frames.CANCEL)]
    status = grpc_framing.status_frame(1, grpc_framing.UNAVAILABLE, "no", trailers_only=True)
    assert pair.client.writes == [status + credit(b"asked")]  # never sent on: the relay credits it


@pytest.mark.usefixtures("long_park")
async def test_a_client_reset_follows_the_parked_headers() -> None:
    pair, gate = await hooked_pair()
    headers = pair.headers(1)
    pair.conn.client_data(headers + message(1, b"asked"))
    answer = await gate.waiting.get()
    reset = frames.rst_stream(1, frames.CANCEL)
    pair.conn.client_data(reset)
    assert pair.backend.writes == [headers + reset]
    await turns()
    assert answer.cancelled()  # the hook task went with the call
    assert pair.backend.writes == [headers + reset]
    assert pair.observed == [(VERSION, grpc_framing.CANCELLED)]


@pytest.mark.usefixtures("long_park")
async def test_nothing_is_parked_when_the_read_writes_to_that_peer_anyway() -> None:
    pair, gate = await hooked_pair()
    claimed, other = pair.request(1, b"asked"), pair.request(3, path=LIST)
    pair.conn.client_data(claimed + other)
    claimed_headers = claimed[: -len(message(1, b"asked"))]
    assert pair.backend.writes == [claimed_headers + other]
    (await gate.waiting.get()).set_result(b"asked")
    await turns()
    assert pair.backend.writes[1:] == [message(1, b"asked")]


@pytest.mark.usefixtures("long_park")
async def test_the_relays_credit_to_the_backend_waits_for_the_next_client_frames() -> None:
    """DATA the backend sends on a call the relay ended is dropped and credited back."""
    pair = Pair(max_message_size=10)
    big = pair.request(1, b"x" * 11)
    pair.conn.client_data(big)
    assert len(pair.backend.writes) == 1  # the HEADERS and the RST_STREAM
    late = message(1, b"late")
    pair.conn.upstream_data(late)
    assert pair.backend.writes[1:] == []
    call = pair.request(3)
    pair.conn.client_data(call)
    assert pair.backend.writes[1:] == [frames.window_update(0, len(late) - frames.HEADER_LEN) + call]


async def test_the_timer_sends_what_no_write_took(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "PARK_DELAY", 0.0)
    pair, gate = await hooked_pair()
    headers = pair.headers(1)
    pair.conn.client_data(headers + message(1, b"asked"))
    answer = await gate.waiting.get()
    await turns()
    assert pair.backend.writes == [headers]
    assert pair.client.writes == []
    assert pair.conn.c2u.timer is None and pair.conn.u2c.timer is None
    answer.set_result(b"asked")
    await turns()
    assert pair.backend.writes == [headers, message(1, b"asked")]


async def test_a_write_stops_the_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "PARK_DELAY", 0.0)
    pair = Pair(max_message_size=10)
    pair.conn.client_data(pair.request(1, b"x" * 11))  # over the limit: ended by the relay
    late = message(1, b"late")  # the backend's answer to it: dropped, credited back (parked)
    pair.conn.upstream_data(late)
    assert pair.conn.c2u.timer is not None
    call = pair.request(3)
    pair.conn.client_data(call)  # a write towards the backend, before the loop runs the timer
    assert pair.conn.c2u.timer is None
    await turns()
    assert pair.backend.writes[1:] == [frames.window_update(0, len(late) - frames.HEADER_LEN) + call]


@pytest.mark.usefixtures("long_park")
async def test_close_with_parked_frames_writes_the_goaway_after_them_and_nothing_later() -> None:
    pair, gate = await hooked_pair()
    pair.conn.client_data(pair.request(1, b"asked"))
    await gate.waiting.get()
    pair.conn.close()
    assert pair.client.writes == [frames.goaway(1)]
    assert pair.backend.writes == []  # the HEADERS of a call that is never sent on: dropped
    assert pair.conn.c2u.timer is None and pair.conn.u2c.timer is None
    pair.conn.side_lost(True, None)
    await turns()
    assert pair.client.writes == [frames.goaway(1)]
    assert pair.backend.writes == []


@pytest.mark.usefixtures("long_park")
@pytest.mark.parametrize("client_lost", [True, False], ids=["client-lost", "backend-lost"])
async def test_connection_loss_with_parked_frames(client_lost: bool) -> None:
    pair, gate = await hooked_pair()
    pair.conn.client_data(pair.request(1, b"asked"))
    answer = await gate.waiting.get()
    (pair.client if client_lost else pair.backend).closed = True
    pair.conn.side_lost(client_lost, None)
    await turns()
    assert answer.cancelled()
    assert pair.conn.c2u.timer is None and pair.conn.u2c.timer is None
    pair.conn.c2u.flush_parked()  # what a timer that survived would do: nothing is left to write
    pair.conn.u2c.flush_parked()
    assert pair.backend.writes == []
    # The backend gone, the client is told at once (credit no longer matters).
    assert pair.client.writes == ([] if client_lost else [frames.goaway(1)])


def ping(payload: bytes, ack: bool = False) -> bytes:
    return frames.frame(frames.PING, frames.FLAG_ACK if ack else 0, 0, payload)


@pytest.mark.usefixtures("long_park")
async def test_the_answer_to_a_backend_bdp_ping_lets_the_next_requests_pass_without_it() -> None:
    """grpc-go sends a BDP ping on the first DATA it reads while none is out: answered with the
    next request, every request would cost the backend a PING (and a WINDOW_UPDATE) more."""
    pair = Pair()
    window = frames.window_update(0, 100)
    pair.conn.upstream_data(window + ping(BDP_PING))
    assert pair.backend.writes == []
    assert pair.client.writes == [window]
    first, second = pair.request(1), pair.request(3)
    pair.conn.client_data(first)
    pair.conn.client_data(second)
    assert pair.backend.writes == [first, second]
    assert pair.conn.c2u.late == [ping(BDP_PING, ack=True)]


async def test_the_answer_to_a_bdp_ping_goes_when_its_time_is_up_with_what_is_parked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection, "PARK_DELAY", 3600.0)
    monkeypatch.setattr(connection, "BDP_ANSWER_DELAY", 0.0)
    pair = Pair(max_message_size=10)
    pair.conn.client_data(pair.request(1, b"x" * 11))  # over the limit: ended by the relay
    dropped = message(1, b"late")  # the backend's answer to it: dropped, its credit parked
    pair.conn.upstream_data(dropped)
    pair.conn.upstream_data(ping(BDP_PING))
    assert pair.backend.writes[1:] == []
    await turns()
    credit = frames.window_update(0, len(dropped) - frames.HEADER_LEN)
    assert pair.backend.writes[1:] == [credit + ping(BDP_PING, ack=True)]  # one write, order kept
    assert pair.conn.c2u.late_timer is None and pair.conn.c2u.timer is None


@pytest.mark.parametrize("payload", [BDP_PING, bytes(8)], ids=["bdp", "keepalive"])
async def test_the_timer_sends_a_parked_ping_answer_alone(monkeypatch: pytest.MonkeyPatch, payload: bytes) -> None:
    monkeypatch.setattr(connection, "PARK_DELAY", 0.0)
    monkeypatch.setattr(connection, "BDP_ANSWER_DELAY", 0.0)
    pair = Pair()
    pair.conn.upstream_data(ping(payload))
    assert pair.backend.writes == []
    await turns()
    assert pair.backend.writes == [ping(payload, ack=True)]
    assert pair.conn.c2u.timer is None


async def test_only_the_answer_to_a_bdp_ping_waits_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """It only feeds grpc-go's BDP estimate; any other answer (a keepalive's, whose sender closes
    the connection when it comes too late) keeps PARK_DELAY."""
    monkeypatch.setattr(connection, "PARK_DELAY", 0.0)
    monkeypatch.setattr(connection, "BDP_ANSWER_DELAY", 3600.0)
    pair = Pair()
    pair.conn.upstream_data(ping(BDP_PING))
    await turns()
    assert pair.backend.writes == []
    assert pair.conn.c2u.late_timer is not None
    pair.conn.upstream_data(ping(bytes(8)))
    await turns()
    assert pair.backend.writes == [ping(bytes(8), ack=True)]
    assert pair.conn.c2u.timer is None
    pair.conn.close()  # the answer still held is of no use to a backend that is going
    assert pair.conn.c2u.late == [] and pair.conn.c2u.late_timer is None
    await turns()
    assert pair.backend.writes == [ping(bytes(8), ack=True)]


@pytest.mark.usefixtures("long_park")
async def test_the_answer_to_a_client_ping_goes_at_once_unless_it_is_a_bdp_ping() -> None:
    """kubelet (grpc-go) sends a BDP ping after each response while none is unanswered: held,
    the next responses cost it neither that ping nor the WINDOW_UPDATE before it. Any other
    PING a client may time: it is answered at once, and takes the held answer along."""
    pair = Pair()
    pair.conn.client_data(ping(BDP_PING))
    assert pair.client.writes == []
    assert pair.conn.u2c.late == [ping(BDP_PING, ack=True)]
    pair.conn.client_data(ping(b"client-1") + ping(BDP_PING))
    assert pair.client.writes == [ping(b"client-1", ack=True) + ping(BDP_PING, ack=True)]
    assert pair.conn.u2c.late == [ping(BDP_PING, ack=True)]  # the first one's, still held


@pytest.mark.usefixtures("long_park")
@pytest.mark.parametrize(
    "bad",
    [
        frames.frame(frames.PING, frames.FLAG_ACK, 1, b"stream 1"),
        frames.frame(frames.PING, frames.FLAG_ACK, 0, b"seven.."),
    ],
    ids=["on-a-stream", "short"],
)
async def test_a_malformed_ping_ack_is_forwarded_at_once_even_behind_parked_headers(bad: bytes) -> None:
    """Only the relay's own answers wait: a malformed frame reaches its receiver as it came."""
    pair, _gate = await hooked_pair()
    headers = pair.headers(1)
    pair.conn.client_data(headers + bad)
    assert pair.backend.writes == [headers + bad]


def test_client_window_updates_are_dropped_only_for_calls_the_relay_ended() -> None:
    pair = Pair(max_message_size=4)
    updates = frames.window_update(1, 100) + frames.window_update(0, 100)
    pair.conn.client_data(updates)
    assert pair.backend.data == updates  # no call ended by the relay yet: all pass
    pair.conn.client_data(pair.request(3, b"too large"))
    assert pair.observed == [(VERSION, grpc_framing.RESOURCE_EXHAUSTED)]
    pair.backend.writes.clear()
    pair.conn.client_data(frames.window_update(3, 50) + frames.window_update(1, 100) + frames.window_update(0, 100))
    assert pair.backend.data == frames.window_update(1, 100) + frames.window_update(0, 100)


@pytest.mark.usefixtures("long_park")
async def test_a_changed_request_held_up_by_the_connection_window_resumes_on_its_credit() -> None:
    """Only a connection WINDOW_UPDATE lets it go on (its stream window is ample)."""
    pair, gate = await hooked_pair()
    pair.conn.upstream_data(frames.settings({frames.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 20}))
    pair.conn.client_data(pair.request(1, b"asked"))
    grown = b"g" * 70_000
    (await gate.waiting.get()).set_result(grown)
    await turns()
    assert pair.conn.sending_calls == 1
    sent = len(pair.backend.data)
    pair.conn.upstream_data(frames.window_update(0, 10_000))
    assert pair.conn.sending_calls == 0
    assert pair.backend.data[sent:].endswith(grown[-(len(grown) + 5 - frames.DEFAULT_WINDOW) :])


@pytest.mark.usefixtures("long_park")
async def test_a_bug_reading_the_held_request_refuses_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our own error before the hooks even ran: nothing may pass unhooked (and the client is not
    left waiting for its deadline)."""

    def broken(*args: object) -> bytes:
        raise KeyError("a bug")

    monkeypatch.setattr(grpc_framing, "single_request", broken)
    pair, gate = await hooked_pair()
    headers = pair.headers(1)
    pair.conn.client_data(headers + message(1, b"asked"))
    await turns()
    assert gate.waiting.empty()  # the hooks never got it
    assert pair.backend.writes == [headers + frames.rst_stream(1, frames.CANCEL)]
    assert pair.observed == [(VERSION, grpc_framing.INTERNAL)]
    assert b"proxy hook layer failed: KeyError" in pair.client.writes[0]


async def test_each_call_of_a_repeated_header_block_gets_its_own_deadline_and_the_same_metadata() -> None:
    """What the hooks are told of a request's headers is derived once per header block (a client
    repeats the same bytes call after call), except the deadline, which starts with each call."""
    seen: list[CallContext] = []

    class Recorder(Gate):
        async def before(self, call: CallContext, request: bytes) -> bytes:
            seen.append(call)
            return request

    pair = Pair(interceptor=Recorder())
    encoder = hpack.Encoder()
    extra = [("grpc-timeout", "20S"), ("x-trace", "a"), ("grpc-encoding", "identity")]
    block = encoder.encode(grpc_request_headers(VERSION, extra))
    again = encoder.encode(grpc_request_headers(VERSION, extra))  # indexed now: other bytes, same headers
    loop = asyncio.get_running_loop()
    for sid, headers in ((1, block), (3, again), (5, again)):
        pair.conn.client_data(frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, headers) + message(sid, b"q"))
        await turns()
        assert 19.9 < seen[-1].deadline - loop.time() <= 20.0  # type: ignore[operator]
        await asyncio.sleep(0.01)
    sent = (("content-type", "application/grpc"), ("te", "trailers"), *extra)  # all but pseudo-headers
    assert [call.metadata for call in seen] == [sent] * 3
    assert [call.encoding for call in seen] == ["identity"] * 3
    assert seen[0].deadline < seen[1].deadline < seen[2].deadline  # type: ignore[operator]
