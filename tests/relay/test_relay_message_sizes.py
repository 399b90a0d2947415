"""The message size limit, both ways, whatever the DATA frames look like.

A call whose DATA frames are each one whole message within the limit (nearly every CRI call)
is checked without a per-call sizer; the first frame that is anything else starts one, at the
message boundary the call is at. Either way the relay must end a call exactly when one of its
messages is over the limit, naming that message's size, and relay every other byte unchanged.
"""

from __future__ import annotations

import itertools

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st
from relay_pair import VERSION, Pair

from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import encode_message

LIMIT = 40


def data_frames(sid: int, body: bytes, cuts: list[int], pad: bool) -> bytes:
    """``body`` cut at ``cuts`` into DATA frames (padded ones when ``pad``), no END_STREAM."""
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    out = b""
    for a, b in itertools.pairwise(points):
        if pad:
            out += frames.frame(frames.DATA, frames.FLAG_PADDED, sid, b"\x02" + body[a:b] + b"\x00\x00")
        else:
            out += frames.frame(frames.DATA, 0, sid, body[a:b])
    return out


def first_over(sizes: list[int]) -> int | None:
    return next((size for size in sizes if size > LIMIT), None)


def over_limit(what: str, size: int) -> str:
    return f"{what} message of {size} bytes for {VERSION} is over the proxy's limit of {LIMIT}"


sizes = st.lists(st.integers(0, 2 * LIMIT), min_size=1, max_size=6)
cuts = st.lists(st.integers(0, 1000), max_size=8)
# Often exactly at message boundaries: the frames that need no sizer.
whole = st.booleans()


def body_and_cuts(sizes: list[int], extra_cuts: list[int], at_boundaries: bool) -> tuple[bytes, list[int]]:
    body = b"".join(encode_message(b"m" * size) for size in sizes)
    boundaries = list(itertools.accumulate(grpc_framing.PREFIX_LEN + size for size in sizes))
    return body, (boundaries if at_boundaries else []) + extra_cuts


@settings(max_examples=200, deadline=None)
@given(sizes=sizes, extra_cuts=cuts, at_boundaries=whole, pad=st.booleans())
def test_a_request_is_ended_exactly_when_one_of_its_messages_is_over_the_limit(
    sizes: list[int], extra_cuts: list[int], at_boundaries: bool, pad: bool
) -> None:
    pair = Pair(max_message_size=LIMIT)
    body, points = body_and_cuts(sizes, extra_cuts, at_boundaries)
    sent = pair.headers(1) + data_frames(1, body, points, pad)
    pair.conn.client_data(sent)
    too_big = first_over(sizes)
    if too_big is None:
        assert pair.backend.data == sent
        assert pair.observed == []
        assert pair.conn.active_calls == 1
    else:
        assert pair.observed == [(VERSION, grpc_framing.RESOURCE_EXHAUSTED)]
        status = grpc_framing.status_frame(1, grpc_framing.RESOURCE_EXHAUSTED, over_limit("request", too_big), True)
        assert status in pair.client.data
        assert frames.rst_stream(1, frames.CANCEL) in pair.backend.data
        assert pair.conn.active_calls == 0


@settings(max_examples=200, deadline=None)
@given(sizes=sizes, extra_cuts=cuts, at_boundaries=whole, pad=st.booleans())
def test_a_response_is_ended_exactly_when_one_of_its_messages_is_over_the_limit(
    sizes: list[int], extra_cuts: list[int], at_boundaries: bool, pad: bool
) -> None:
    pair = Pair(max_message_size=LIMIT)
    pair.conn.client_data(pair.request(1))
    body, points = body_and_cuts(sizes, extra_cuts, at_boundaries)
    headers = hpack.Encoder().encode([(":status", "200"), ("content-type", "application/grpc")])
    answer = frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, 1, headers) + data_frames(1, body, points, pad)
    pair.conn.upstream_data(answer)
    too_big = first_over(sizes)
    if too_big is None:
        assert pair.client.data == answer
        assert pair.conn.active_calls == 1
    else:
        assert pair.observed == [(VERSION, grpc_framing.RESOURCE_EXHAUSTED)]
        status = grpc_framing.status_frame(1, grpc_framing.RESOURCE_EXHAUSTED, over_limit("response", too_big), False)
        assert status in pair.client.data
        assert pair.conn.active_calls == 0


def test_the_same_trailers_bytes_give_each_call_the_status_they_carry() -> None:
    """A status learned from a header block is kept with the decoded block: the same bytes
    again (the backend's HPACK table unchanged) end the next call with the same status, and
    other bytes with theirs."""
    pair = Pair()
    encoder = hpack.Encoder()
    sent: list[bytes] = []
    for sid, code in zip((1, 3, 5, 7, 9, 11), (0, 5, 0, 5, 0, 5), strict=True):
        pair.conn.client_data(pair.request(sid))
        response = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
        trailers = encoder.encode(grpc_framing.status_headers(code, "gone" if code else "", trailers_only=False))
        sent.append(trailers)
        pair.conn.upstream_data(
            frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, sid, response)
            + frames.frame(frames.DATA, 0, sid, encode_message(b"answer"))
            + frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS | frames.FLAG_END_STREAM, sid, trailers)
        )
    assert sent[2:4] == sent[4:6]  # the table warm: the same bytes for the same trailers
    assert pair.observed == [(VERSION, code) for code in (0, 5, 0, 5, 0, 5)]
    assert pair.conn.active_calls == 0
