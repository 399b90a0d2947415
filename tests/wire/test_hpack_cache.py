"""The relay's caching HPACK decoder must always agree with a plain decoder."""

from __future__ import annotations

import hpack
from hypothesis import example, given, settings
from hypothesis import strategies as st

from runtimeproxy.wire.hpack_cache import CachingDecoder

names = st.sampled_from([":path", ":status", "content-type", "grpc-status", "grpc-timeout", "x-a", "x-b"])
values = st.sampled_from(["", "0", "1", "200", "application/grpc", "/s/M", "119999m", "v" * 300])
header_lists = st.lists(st.tuples(names, values), min_size=1, max_size=6)
blocks = st.lists(st.tuples(header_lists, st.booleans(), st.sampled_from([None, 64, 256, 4096])), max_size=40)


V = "v" * 300
# Found by this test: with a 64-octet table each insertion evicts the entry before it, and CPython
# may give the new entry the evicted one's address, so a table change must not be told by id().
EVICTING_TABLE = [
    ([("x-b", "application/grpc"), ("grpc-status", ""), (":status", V), ("x-b", "/s/M"), (":path", "200")], False, 64),
    ([("grpc-timeout", V), ("x-a", "200")], False, 64),
    ([(":status", ""), ("x-a", ""), ("grpc-timeout", ""), ("grpc-timeout", "0")], False, 64),
    ([("x-a", "0"), ("x-a", "application/grpc"), ("content-type", "200"), (":status", "200"), ("content-type", "0")],
     False, 64),
    ([(":status", ""), ("x-a", ""), ("grpc-timeout", ""), ("grpc-timeout", "0")], False, 64),
    ([("grpc-timeout", ""), ("grpc-timeout", "1"), ("content-type", "119999m"), (":path", "application/grpc"),
      ("x-a", "/s/M"), ("grpc-status", "200")], False, 256),
    ([(":path", "application/grpc"), ("content-type", ""), ("x-b", "application/grpc")], False, 256),
    ([("content-type", "application/grpc"), ("x-b", "application/grpc"), ("grpc-status", "200")], True, 64),
]


@settings(max_examples=300, deadline=None)
@given(blocks)
@example(EVICTING_TABLE)
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
