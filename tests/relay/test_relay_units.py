"""Unit and property tests of the relay's pure parts: frames, gRPC framing, HPACK literals."""

from __future__ import annotations

import itertools

import hpack
import pytest
from fake_runtime import grpc_request_headers
from hypothesis import example, given, settings
from hypothesis import strategies as st

from runtimeproxy.relay.connection import first_call_path
from runtimeproxy.wire import frames, grpc_framing
from runtimeproxy.wire.grpc_framing import MessageSizer, encode_message, parse_timeout, split_messages
from runtimeproxy.wire.hpack_literal import encode_literal_block

# -- helpers ------------------------------------------------------------------------------------


def parse_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of every frame in ``data``, which must frame exactly."""
    out = []
    pos = 0
    while pos < len(data):
        high, low, ftype, flags, sid = frames.FRAME_HEADER.unpack_from(data, pos)
        end = pos + frames.HEADER_LEN + ((high << 8) | low)
        assert end <= len(data), "truncated frame"
        out.append((ftype, flags, sid, data[pos + frames.HEADER_LEN : end]))
        pos = end
    return out


def chunk_bounds(total: int, cuts: list[int]) -> list[tuple[int, int]]:
    points = sorted({c % (total + 1) for c in cuts} | {0, total})
    return list(itertools.pairwise(points)) or [(0, 0)]


def request_headers(path: str) -> list[tuple[str, str]]:
    return grpc_request_headers(path, [("grpc-timeout", "119999m"), ("user-agent", "kubelet/v1.31")])


# -- MessageSizer -------------------------------------------------------------------------------


def check_sizer(limit: int, sizes: list[int], cuts: list[int], before: int, after: int) -> None:
    """Feed a stream of messages in chunks; exactly the first oversize message must be flagged.

    Each chunk sits in a buffer with ``before`` and ``after`` bytes of other data around it
    (as a DATA payload does inside the relay's read buffer) and is fed by offsets.
    """
    stream = b"".join(encode_message(bytes([i % 251]) * size) for i, size in enumerate(sizes))
    # Where the first oversize message's 5-byte prefix ends: the sizer can tell from there.
    offset, first_over = 0, None
    for size in sizes:
        if size > limit:
            first_over = (size, offset + grpc_framing.PREFIX_LEN)
            break
        offset += grpc_framing.PREFIX_LEN + size
    sizer = MessageSizer(limit)
    bounds = chunk_bounds(len(stream), cuts)
    flagged = None
    for start, end in bounds:
        buffer = b"\xff" * before + stream[start:end] + b"\xff" * after
        result = sizer.feed(memoryview(buffer), before, before + end - start)
        if result is not None:
            flagged = (result, start, end)
            break
    if first_over is None:
        assert flagged is None
    else:
        size, prefix_end = first_over
        assert flagged is not None
        # ...reported by the chunk that completed its prefix, not earlier, not later.
        assert flagged[0] == size
        assert flagged[1] < prefix_end <= flagged[2]


sizer_cases = {
    "limit": st.integers(0, 300),
    "sizes": st.lists(st.integers(0, 400), max_size=12),
    "cuts": st.lists(st.integers(0, 10_000), max_size=30),
    "before": st.integers(0, 7),
}


@settings(max_examples=300, deadline=None)
@given(**sizer_cases)
@example(limit=5, sizes=[5, 6], cuts=[], before=0)
@example(limit=10, sizes=[10], cuts=[], before=2)  # one whole message per chunk, at the limit
@example(limit=10, sizes=[11], cuts=[], before=2)  # ...and over it
@example(limit=10, sizes=[3, 20], cuts=[8], before=0)  # a whole message, then one over the limit
@example(limit=0, sizes=[0, 0, 1], cuts=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], before=3)
def test_message_sizer_flags_exactly_the_first_message_over_the_limit(
    limit: int, sizes: list[int], cuts: list[int], before: int
) -> None:
    check_sizer(limit, sizes, cuts, before, after=0)


@settings(max_examples=300, deadline=None)
@given(**sizer_cases)
@example(limit=0, sizes=[0, 0, 1], cuts=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], before=3)
@example(limit=1000, sizes=[10], cuts=[3], before=0)
def test_message_sizer_ignores_bytes_after_the_payload(
    limit: int, sizes: list[int], cuts: list[int], before: int
) -> None:
    check_sizer(limit, sizes, cuts, before, after=9)


def test_message_sizer_limit_is_inclusive() -> None:
    sizer = MessageSizer(10)
    data = encode_message(b"x" * 10) + encode_message(b"y" * 11)
    assert sizer.feed(data, 0, 15) is None
    assert sizer.feed(data, 15, len(data)) == 11


def test_message_sizer_across_one_byte_feeds() -> None:
    sizer = MessageSizer(1 << 20)
    data = encode_message(b"a" * 70_000) + encode_message(b"") + encode_message(b"b" * 3)
    assert all(sizer.feed(data[i : i + 1], 0, 1) is None for i in range(len(data)))
    over = encode_message(b"c" * ((1 << 20) + 1))
    results = [sizer.feed(over[i : i + 1], 0, 1) for i in range(grpc_framing.PREFIX_LEN)]
    assert results == [None] * 4 + [(1 << 20) + 1]


# -- message framing ----------------------------------------------------------------------------


@given(st.lists(st.tuples(st.booleans(), st.binary(max_size=300)), max_size=10))
def test_split_messages_round_trips_encode_message(messages: list[tuple[bool, bytes]]) -> None:
    payload = b"".join(encode_message(body, compressed) for compressed, body in messages)
    split = split_messages(payload)
    assert split is not None
    assert [(m.compressed, m.body) for m in split] == messages


@given(st.lists(st.binary(max_size=100), min_size=1, max_size=5), st.data())
def test_split_messages_rejects_truncated_payloads(bodies: list[bytes], data: st.DataObject) -> None:
    payload = b"".join(encode_message(b) for b in bodies)
    boundaries = {0}
    offset = 0
    for body in bodies:
        offset += grpc_framing.PREFIX_LEN + len(body)
        boundaries.add(offset)
    cut = data.draw(st.integers(0, len(payload)))
    result = split_messages(payload[:cut])
    if cut in boundaries:
        assert result is not None and len(result) == sorted(boundaries).index(cut)
    else:
        assert result is None


def test_encode_message_layout() -> None:
    assert encode_message(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert encode_message(b"", compressed=True) == b"\x01\x00\x00\x00\x00"
    assert split_messages(b"") == []


# -- grpc-timeout -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1H", 3600.0),
        ("2M", 120.0),
        ("3S", 3.0),
        ("119999m", 119.999),
        ("250u", 250e-6),
        ("7n", 7e-9),
        ("0S", 0.0),
        ("00000010S", 10.0),
        ("99999999H", 99999999 * 3600.0),
    ],
)
def test_parse_timeout_units(value: str, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    ["", "S", "m", "10", "10x", "10s", "10h", "-1S", "+1S", "1.5S", " 1S", "1S ", "1_0S", "0x1S", "1e3m", "SS"],
)
def test_parse_timeout_malformed_is_none(value: str) -> None:
    assert parse_timeout(value) is None


@given(st.integers(0, 99_999_999), st.sampled_from("HMSmun"))
def test_parse_timeout_property(amount: int, unit: str) -> None:
    factor = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}[unit]
    assert parse_timeout(f"{amount}{unit}") == pytest.approx(amount * factor)


@pytest.mark.parametrize("value", ["\u00b2S", "\uff11S", "\u0663m"])
def test_parse_timeout_non_ascii_digits_are_malformed(value: str) -> None:
    assert parse_timeout(value) is None


@given(st.text(max_size=12))
def test_parse_timeout_never_raises_on_ascii(value: str) -> None:
    value = value.encode("ascii", "ignore").decode()
    result = parse_timeout(value)
    if result is not None:
        assert value[:-1].isascii() and value[:-1].isdigit() and value[-1] in "HMSmun"


@pytest.mark.parametrize(
    ("value", "code"),
    [("0", 0), ("8", 8), ("16", 16), ("42", 42), ("", 2), ("-1", 2), (" 1", 2), ("1.0", 2), ("\u0663", 2), ("OK", 2)],
)
def test_parse_status(value: str, code: int) -> None:
    assert grpc_framing.parse_status(value) == code


# -- grpc-message and status frames -------------------------------------------------------------


@given(st.text(max_size=200))
def test_status_message_round_trips_percent_encoding(message: str) -> None:
    fields = dict(grpc_framing.status_headers(13, message, trailers_only=False))
    assert fields["grpc-status"] == "13"
    if message:
        encoded = fields["grpc-message"]
        assert encoded.isascii() and all(0x20 <= ord(c) < 0x7F for c in encoded)
        assert grpc_framing.decode_grpc_message(encoded) == message
    else:
        assert "grpc-message" not in fields


def test_status_frame_is_a_trailers_only_headers_frame() -> None:
    frame = grpc_framing.status_frame(7, grpc_framing.RESOURCE_EXHAUSTED, "too big: 100%", trailers_only=True)
    ((ftype, flags, sid, payload),) = parse_frames(frame)
    assert (ftype, sid) == (frames.HEADERS, 7)
    assert flags == frames.FLAG_END_STREAM | frames.FLAG_END_HEADERS
    decoder = hpack.Decoder()
    headers = list(decoder.decode(payload))
    assert headers == [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", "8"),
        ("grpc-message", "too big: 100%25"),
    ]
    assert len(decoder.header_table.dynamic_entries) == 0


# -- HPACK literals ----------------------------------------------------------------------------

header_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=300)
header_values = st.text(max_size=300)


@settings(max_examples=200)
@given(st.lists(st.tuples(header_names, header_values), max_size=12))
def test_literal_block_decodes_to_the_same_headers_and_leaves_the_table_empty(
    headers: list[tuple[str, str]],
) -> None:
    decoder = hpack.Decoder()
    assert list(decoder.decode(encode_literal_block(headers))) == headers
    assert len(decoder.header_table.dynamic_entries) == 0


@settings(max_examples=100)
@given(
    st.lists(st.tuples(header_names, header_values), min_size=1, max_size=6),
    st.lists(st.tuples(header_names, st.text(max_size=40)), min_size=1, max_size=6),
)
def test_literal_block_between_peer_blocks_keeps_tables_in_step(
    ours: list[tuple[str, str]], theirs: list[tuple[str, str]]
) -> None:
    """A peer's encoder indexes into the shared table; our block in between must not disturb it."""
    encoder, decoder = hpack.Encoder(), hpack.Decoder()
    assert list(decoder.decode(encoder.encode(theirs))) == theirs
    before = list(decoder.header_table.dynamic_entries)
    assert list(decoder.decode(encode_literal_block(ours))) == ours
    assert list(decoder.header_table.dynamic_entries) == before
    # The peer's next block refers to entries it added earlier: still decodes the same.
    assert list(decoder.decode(encoder.encode(theirs))) == theirs


def test_literal_block_integer_boundaries() -> None:
    for length in (0, 126, 127, 128, 255, 16_383, 16_384, 70_000):
        headers = [("x" * max(1, length // 2), "v" * length)]
        assert list(hpack.Decoder(max_header_list_size=1 << 20).decode(encode_literal_block(headers))) == headers


# -- frames -------------------------------------------------------------------------------------


@given(st.integers(0, 1 << 34), st.integers(0, frames.MAX_STREAM_ID))
@example(frames.MAX_WINDOW_INCREMENT, 0)
@example(frames.MAX_WINDOW_INCREMENT + 1, 3)
@example(2 * frames.MAX_WINDOW_INCREMENT, 0)
def test_window_update_splits_over_the_31_bit_maximum(increment: int, stream_id: int) -> None:
    parsed = parse_frames(frames.window_update(stream_id, increment))
    steps = [int.from_bytes(payload, "big") for _, _, _, payload in parsed]
    assert sum(steps) == increment
    assert all(1 <= step <= frames.MAX_WINDOW_INCREMENT for step in steps)
    assert len(parsed) == -(-increment // frames.MAX_WINDOW_INCREMENT)
    assert all((t, f, s, len(p)) == (frames.WINDOW_UPDATE, 0, stream_id, 4) for t, f, s, p in parsed)


@given(st.dictionaries(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF_FFFF), max_size=10))
def test_parse_settings_round_trips(values: dict[int, int]) -> None:
    ((ftype, flags, sid, payload),) = parse_frames(frames.settings(values))
    assert (ftype, flags, sid) == (frames.SETTINGS, 0, 0)
    assert frames.parse_settings(payload) == values
    assert frames.parse_settings(memoryview(payload)) == values


def test_parse_settings_later_entries_win_and_partial_entries_are_ignored() -> None:
    def entry(ident: int, value: int) -> bytes:
        return ident.to_bytes(2, "big") + value.to_bytes(4, "big")

    payload = entry(1, 4096) + entry(4, 65535) + entry(1, 0) + entry(5, 1 << 20) + b"\x00\x04\x00"
    assert frames.parse_settings(payload) == {1: 0, 4: 65535, 5: 1 << 20}
    assert frames.parse_settings(b"") == {}
    assert frames.settings_ack() == frames.frame(frames.SETTINGS, frames.FLAG_ACK, 0)


@given(
    fragment=st.binary(max_size=200),
    pad=st.none() | st.integers(0, 255),
    priority=st.booleans(),
    as_view=st.booleans(),
)
def test_header_block_fragment_strips_padding_and_priority(
    fragment: bytes, pad: int | None, priority: bool, as_view: bool
) -> None:
    flags = frames.FLAG_END_HEADERS
    payload = fragment
    if priority:
        flags |= frames.FLAG_PRIORITY
        payload = (0x8000_0003).to_bytes(4, "big") + b"\x10" + payload
    if pad is not None:
        flags |= frames.FLAG_PADDED
        payload = bytes([pad]) + payload + b"\x00" * pad
    result = frames.header_block_fragment(flags, memoryview(payload) if as_view else payload)
    assert bytes(result) == fragment


@given(body=st.binary(max_size=3000), pad=st.none() | st.integers(0, 255))
def test_data_bounds_remove_the_padding(body: bytes, pad: int | None) -> None:
    flags, payload = 0, body
    if pad is not None:
        flags, payload = frames.FLAG_PADDED, bytes([pad]) + body + b"\x00" * pad
    lo, hi = frames.data_bounds(flags, payload, 0, len(payload))
    assert payload[lo:hi] == body


@given(body=st.binary(max_size=5000), max_frame=st.integers(1, 1200), end_stream=st.booleans())
def test_data_frames_split_and_mark_the_last(body: bytes, max_frame: int, end_stream: bool) -> None:
    parsed = parse_frames(b"".join(frames.data_frames(9, body, max_frame, end_stream)))
    assert b"".join(p for _, _, _, p in parsed) == body
    assert all(t == frames.DATA and s == 9 and len(p) <= max_frame for t, _, s, p in parsed)
    assert [f for _, f, _, _ in parsed] == [0] * (len(parsed) - 1) + [frames.FLAG_END_STREAM if end_stream else 0]


def test_goaway_and_rst_stream_layout() -> None:
    ((ftype, flags, sid, payload),) = parse_frames(frames.goaway(41, frames.NO_ERROR, b"bye"))
    assert (ftype, flags, sid) == (frames.GOAWAY, 0, 0)
    assert payload == (41).to_bytes(4, "big") + b"\x00\x00\x00\x00bye"
    ((ftype, _, sid, payload),) = parse_frames(frames.rst_stream(5))
    assert (ftype, sid, int.from_bytes(payload, "big")) == (frames.RST_STREAM, 5, frames.CANCEL)


# -- first_call_path ------------------------------------------------------------------------------


def opening(
    path: str,
    *,
    chunks: int = 1,
    pad: int | None = None,
    priority: bool = False,
    huffman: bool = True,
) -> tuple[bytes, int]:
    """A client's opening bytes and the offset where its first header block is complete."""
    encoder = hpack.Encoder()
    block = encoder.encode(request_headers(path), huffman=huffman)
    step = max(1, -(-len(block) // chunks))
    pieces = [block[i : i + step] for i in range(0, len(block), step)] or [b""]
    out = bytearray(frames.PREFACE)
    out += frames.settings({frames.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 20, 0xFE03: 1})
    out += frames.window_update(0, 1 << 20)
    out += frames.frame(frames.PING, 0, 0, b"12345678")
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        if i == 0:
            flags, payload = 0, piece
            if priority:
                flags |= frames.FLAG_PRIORITY
                payload = b"\x00\x00\x00\x00\x0f" + payload
            if pad is not None:
                flags |= frames.FLAG_PADDED
                payload = bytes([pad]) + payload + b"\x00" * pad
            out += frames.frame(frames.HEADERS, flags | (frames.FLAG_END_HEADERS if last else 0), 1, payload)
        else:
            out += frames.frame(frames.CONTINUATION, frames.FLAG_END_HEADERS if last else 0, 1, piece)
    complete = len(out)
    out += frames.frame(frames.DATA, frames.FLAG_END_STREAM, 1, encode_message(b"\x0a\x01x"))
    return bytes(out), complete


paths = st.sampled_from(
    [
        "/runtime.v1.RuntimeService/Version",
        "/runtime.v1.ImageService/PullImage",
        "/runtime.v1.RuntimeService/FutureCall",
        "/x",
    ]
) | st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ./_-", min_size=1, max_size=80)


@settings(max_examples=150)
@given(
    path=paths,
    chunks=st.integers(1, 6),
    pad=st.none() | st.integers(0, 40),
    priority=st.booleans(),
    huffman=st.booleans(),
    data=st.data(),
)
def test_first_call_path_once_the_first_header_block_is_complete(
    path: str, chunks: int, pad: int | None, priority: bool, huffman: bool, data: st.DataObject
) -> None:
    raw, complete = opening(path, chunks=chunks, pad=pad, priority=priority, huffman=huffman)
    assert first_call_path(raw) == path
    assert first_call_path(raw[:complete]) == path
    cut = data.draw(st.integers(0, complete - 1))
    assert first_call_path(raw[:cut]) is None


def test_first_call_path_without_path_header() -> None:
    block = hpack.Encoder().encode([(":method", "POST")])
    raw = frames.PREFACE + frames.settings() + frames.frame(frames.HEADERS, frames.FLAG_END_HEADERS, 1, block)
    assert first_call_path(raw) == ""
    assert first_call_path(b"") is None
    assert first_call_path(frames.PREFACE) is None
