"""ttrpc framing (hooks/nri/ttrpc.py) and NRI's multiplexing (hooks/nri/mux.py): round trips over
any split of the byte stream, oversized frames, and garbage that must never crash the decoders."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtimeproxy.hooks.nri.mux import (
    MAX_PAYLOAD,
    PLUGIN_SERVICE_CONN,
    RUNTIME_SERVICE_CONN,
    MuxDecoder,
    MuxError,
    encode_chunks,
)
from runtimeproxy.hooks.nri.ttrpc import (
    HEADER,
    MAX_MESSAGE_SIZE,
    Frame,
    FrameDecoder,
    FrameTooLarge,
    MessageType,
    encode_frame,
)

frames = st.lists(
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 255), st.integers(0, 255), st.binary(max_size=300)),
    max_size=8,
)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def test_header_layout_is_ttrpcs() -> None:
    # length, stream id (big-endian uint32), type, flags: 10 bytes (ttrpc channel.go).
    assert encode_frame(3, MessageType.REQUEST, b"ab", flags=4) == b"\0\0\0\x02\0\0\0\x03\x01\x04ab"


@given(frames, st.lists(st.integers(0, 10_000), max_size=12))
def test_frames_round_trip_over_any_split(items: list[tuple[int, int, int, bytes]], cuts: list[int]) -> None:
    wire = b"".join(encode_frame(sid, type_, payload, flags) for sid, type_, flags, payload in items)
    decoder = FrameDecoder()
    out: list[Frame] = []
    for piece in split(wire, cuts):
        out += decoder.feed(piece)
    assert out == [Frame(sid, type_, flags, payload) for sid, type_, flags, payload in items]
    assert decoder.pending == 0


@given(st.binary(max_size=2000), st.lists(st.integers(0, 3000), max_size=8))
def test_garbage_gives_frames_or_frame_too_large_only(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(max_size=512)
    try:
        for piece in split(data, cuts):
            for frame in decoder.feed(piece):
                assert isinstance(frame, Frame) and len(frame.payload) <= 512
                assert decoder.pending <= HEADER.size + 512
    except FrameTooLarge as exc:
        assert exc.length > 512 and exc.limit == 512
        assert decoder.pending == 0  # nothing of a broken stream is kept
    assert decoder.pending <= min(len(data), HEADER.size + 512)


@pytest.mark.parametrize("declared", [MAX_MESSAGE_SIZE + 1, 2**32 - 1])
def test_a_header_over_the_limit_ends_the_stream_at_once(declared: int) -> None:
    decoder = FrameDecoder()
    before = encode_frame(1, MessageType.REQUEST, b"ok")
    assert decoder.feed(before) == [Frame(1, MessageType.REQUEST, 0, b"ok")]
    header = struct.pack(">IIBB", declared, 3, MessageType.REQUEST, 0)
    after = encode_frame(5, MessageType.REQUEST, b"lost")
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(header[:7])
        decoder.feed(header[7:] + after)  # the header completes: no payload is waited for
    assert (info.value.stream_id, info.value.length, info.value.limit) == (3, declared, MAX_MESSAGE_SIZE)
    assert str(info.value) == f"ttrpc frame on stream 3 declares {declared} bytes, over the 4194304-byte limit"
    with pytest.raises(FrameTooLarge):  # nothing after it is read as frames
        decoder.feed(after)
    assert decoder.pending == 0


def test_a_frame_at_the_limit_is_a_frame() -> None:
    payload = b"x" * MAX_MESSAGE_SIZE
    assert FrameDecoder().feed(encode_frame(1, MessageType.RESPONSE, payload)) == [Frame(1, 2, 0, payload)]


def test_encoding_refuses_what_the_peer_would_refuse() -> None:
    with pytest.raises(ValueError, match="over the"):
        encode_frame(1, MessageType.RESPONSE, b"x" * (MAX_MESSAGE_SIZE + 1))


# -- multiplexing ---------------------------------------------------------------------------------


def test_mux_header_is_conn_id_then_length() -> None:
    assert encode_chunks(PLUGIN_SERVICE_CONN, b"xyz") == b"\0\0\0\x01\0\0\0\x03xyz"
    assert encode_chunks(RUNTIME_SERVICE_CONN, b"") == b""
    with pytest.raises(ValueError, match="reserved"):
        encode_chunks(0, b"x")


@given(
    st.lists(st.tuples(st.sampled_from([1, 2, 7]), st.binary(min_size=1, max_size=200)), max_size=10),
    st.lists(st.integers(0, 5000), max_size=12),
)
def test_mux_round_trip_over_any_split(items: list[tuple[int, bytes]], cuts: list[int]) -> None:
    wire = b"".join(encode_chunks(conn, payload) for conn, payload in items)
    decoder = MuxDecoder()
    out: list[tuple[int, bytes]] = []
    for piece in split(wire, cuts):
        out += decoder.feed(piece)
    assert out == items


def test_a_long_payload_goes_as_several_chunks() -> None:
    data = bytes(range(256)) * (MAX_PAYLOAD // 256 + 1)
    out = MuxDecoder().feed(encode_chunks(RUNTIME_SERVICE_CONN, data))
    assert [len(chunk) for _, chunk in out] == [MAX_PAYLOAD, len(data) - MAX_PAYLOAD]
    assert b"".join(chunk for _, chunk in out) == data


def test_a_chunk_over_the_limit_is_a_corrupt_stream() -> None:
    with pytest.raises(MuxError, match="limit"):
        MuxDecoder().feed(struct.pack(">II", 1, MAX_PAYLOAD + 1))


@given(st.binary(max_size=3000), st.lists(st.integers(0, 4000), max_size=8))
def test_garbage_gives_chunks_or_mux_error_only(data: bytes, cuts: list[int]) -> None:
    decoder = MuxDecoder()
    try:
        for piece in split(data, cuts):
            for conn, chunk in decoder.feed(piece):
                assert isinstance(conn, int) and len(chunk) <= MAX_PAYLOAD
    except MuxError:
        pass
