"""The relay's caching HPACK decoder must always agree with a plain decoder."""

from __future__ import annotations

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy.wire.hpack_cache import CachingDecoder

names = st.sampled_from([":path", ":status", "content-type", "grpc-status", "grpc-timeout", "x-a", "x-b"])
values = st.sampled_from(["", "0", "1", "200", "application/grpc", "/s/M", "119999m", "v" * 300])
header_lists = st.lists(st.tuples(names, values), min_size=1, max_size=6)
blocks = st.lists(st.tuples(header_lists, st.booleans(), st.sampled_from([None, 64, 256, 4096])), max_size=40)


@settings(max_examples=300, deadline=None)
@given(blocks)
def test_caching_decoder_matches_plain_decoder(sequence: list[tuple[list[tuple[str, str]], bool, int | None]]) -> None:
    encoder, plain, caching = hpack.Encoder(), hpack.Decoder(), CachingDecoder(1 << 20)
    for headers, huffman, table_size in sequence:
        if table_size is not None:
            encoder.header_table_size = table_size  # emits a size update in the next block
        block = encoder.encode(headers, huffman=huffman)
        expected = [(str(k), str(v)) for k, v in plain.decode(block)]
        assert caching.decode(block) == expected == headers


def test_repeated_neutral_block_is_served_from_the_cache() -> None:
    encoder, caching = hpack.Encoder(), CachingDecoder(1 << 20)
    headers = [(":status", "200"), ("content-type", "application/grpc")]
    caching.decode(encoder.encode(headers))  # first time: inserts content-type into the table
    warm = encoder.encode(headers)  # now only references
    first = caching.decode(warm)
    assert caching.decode(warm) is first
