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
    MessageType,
    Oversized,
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
    out: list[Frame | Oversized] = []
    for piece in split(wire, cuts):
        out += decoder.feed(piece)
    assert out == [Frame(sid, type_, flags, payload) for sid, type_, flags, payload in items]
    assert decoder.pending == 0


@given(st.binary(max_size=2000), st.lists(st.integers(0, 3000), max_size=8))
def test_garbage_never_crashes_the_frame_decoder(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(max_size=512)
    for piece in split(data, cuts):
        for frame in decoder.feed(piece):
            assert isinstance(frame, Frame | Oversized)
            if isinstance(frame, Frame):
                assert len(frame.payload) <= 512
    assert decoder.held <= min(len(data), HEADER.size + 512)


def test_an_oversized_frame_is_skipped_and_reported_then_decoding_goes_on() -> None:
    decoder = FrameDecoder(max_size=4)
    big = struct.pack(">IIBB", 6, 7, 1, 0) + b"123456"
    after = encode_frame(9, MessageType.REQUEST, b"ok")
    out = decoder.feed(big[:12]) + decoder.feed(big[12:] + after)
    assert out == [Oversized(7, 1, 6), Frame(9, 1, 0, b"ok")]
    assert decoder.pending == 0


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
