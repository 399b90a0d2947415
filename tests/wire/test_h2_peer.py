"""runtimeproxy.wire.h2_peer: the HTTP/2 pieces our gRPC client and server share (the connection
itself is exercised through both, in test_grpc_client.py and test_grpc_server.py)."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy.wire import frames
from runtimeproxy.wire.h2_peer import MAX_HEADER_BLOCK, decode_literal_block, header_frames
from runtimeproxy.wire.hpack_literal import encode_literal_block

names = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=200).map(str.lower)
values = st.text(max_size=300)


@settings(max_examples=300)
@given(headers=st.lists(st.tuples(names, values), max_size=12))
def test_literal_blocks_decode_as_hpack_decodes_them(headers: list[tuple[str, str]]) -> None:
    block = encode_literal_block(headers)
    decoded = decode_literal_block(block)
    expected = [(name, value.encode().decode("latin-1")) for name, value in headers]  # latin-1 text, as hpack_cache
    assert decoded == expected
    reference = hpack.Decoder()
    assert [(n.decode("latin-1"), v.decode("latin-1")) for n, v in reference.decode(block, raw=True)] == expected


@settings(max_examples=500)
@given(block=st.binary(max_size=200))
def test_any_block_is_decoded_as_hpack_would_or_left_to_it(block: bytes) -> None:
    """Whatever the bytes, the fast path either declines (None) or gives exactly what the HPACK
    decoder gives, without the decoder's table changing (so skipping the decoder is safe)."""
    decoded = decode_literal_block(block)
    if decoded is None:
        return
    reference = hpack.Decoder()
    headers = reference.decode(block, raw=True)
    assert [(n.decode("latin-1"), v.decode("latin-1")) for n, v in headers] == decoded
    assert not reference.header_table.dynamic_entries


def test_other_representations_are_left_to_the_hpack_decoder() -> None:
    encoder = hpack.Encoder()
    indexed = encoder.encode([(":method", "POST")])  # a static-table index
    huffman = hpack.Encoder().encode([("x-name", "value")], huffman=True)
    assert decode_literal_block(bytes(indexed)) is None
    assert decode_literal_block(bytes(huffman)) is None
    assert decode_literal_block(b"\x00\x05ab") is None  # truncated
    assert decode_literal_block(b"") == []


def test_a_literal_header_list_over_the_limit_is_refused() -> None:
    block = encode_literal_block([("x-big", "v" * MAX_HEADER_BLOCK)])
    with pytest.raises(hpack.OversizedHeaderListError):
        decode_literal_block(block)


@given(size=st.integers(0, 50_000), max_frame=st.sampled_from([16_384, 20_000]), end_stream=st.booleans())
def test_header_blocks_are_split_into_continuation_frames(size: int, max_frame: int, end_stream: bool) -> None:
    block = bytes(range(256)) * (size // 256) + bytes(size % 256)
    wire = header_frames(7, block, end_stream, max_frame)
    offset, parts, kinds = 0, [], []
    while offset < len(wire):
        high, low, ftype, flags, stream_id = frames.FRAME_HEADER.unpack_from(wire, offset)
        length = high << 8 | low
        assert length <= max_frame and stream_id == 7
        kinds.append((ftype, flags))
        parts.append(wire[offset + frames.HEADER_LEN : offset + frames.HEADER_LEN + length])
        offset += frames.HEADER_LEN + length
    assert b"".join(parts) == block
    assert kinds[0][0] == frames.HEADERS and all(t == frames.CONTINUATION for t, _ in kinds[1:])
    assert bool(kinds[0][1] & frames.FLAG_END_STREAM) == end_stream
    assert [bool(f & frames.FLAG_END_HEADERS) for _, f in kinds] == [False] * (len(kinds) - 1) + [True]
