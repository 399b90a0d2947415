"""HPACK decoding that remembers header blocks which leave the dynamic table unchanged.

Decoding dominates the relay's CPU per call (pure-Python hpack). Once the tables are
warm, a peer sends the same bytes for the same headers call after call (containerd's
response headers and trailers, a client's request to the same method), and such a block
consists of references that do not change the table. Under an unchanged table the same
bytes decode to the same headers, so those results are kept until the table changes.
What a reader derives from a block (the relay: a call's method, a call's status) can be kept
with its result, as ``digest``: it is as valid as the cached headers themselves.
"""

from __future__ import annotations

from typing import Any

import hpack

MAX_CACHED_BLOCKS = 512


class HeaderList(list[tuple[str, str]]):
    """Decoded headers, (name, value) in order, and ``digest``: what a reader derived from them
    (None until set). One reader per decoder, so one meaning of ``digest`` per decoder."""

    __slots__ = ("digest",)

    def __init__(self, headers: Any = ()) -> None:
        super().__init__(headers)
        self.digest: Any = None


class CachingDecoder:
    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._table = self._decoder.header_table
        # Block -> its headers: a caller may look a block up here itself before calling decode
        # (a hit is what decode would return) and keep a reference (it is cleared in place,
        # never replaced); it must not change it.
        self.cache: dict[bytes, HeaderList] = {}

    @property
    def max_allowed_table_size(self) -> int:
        return int(self._decoder.max_allowed_table_size)

    @max_allowed_table_size.setter
    def max_allowed_table_size(self, value: int) -> None:
        self._decoder.max_allowed_table_size = value

    def decode(self, block: bytes) -> HeaderList:
        """The headers of ``block``; the list is shared with later hits, so do not change it."""
        cached = self.cache.get(block)
        if cached is not None:
            return cached
        before = self._state()
        headers = _text_headers(self._decoder.decode(block, raw=True))
        if _same_state(before, self._state()):
            if len(self.cache) >= MAX_CACHED_BLOCKS:
                self.cache.clear()
            self.cache[block] = headers
        else:
            self.cache.clear()  # the table changed: earlier results may no longer hold
        return headers

    def _state(self) -> tuple[int, object, int]:
        # An insertion puts a new entry object at the front; a size change shows in maxsize. The
        # front entry itself is kept, not its id(): an evicted entry's id may be reused by the
        # entry inserted in its place.
        entries = self._table.dynamic_entries
        return len(entries), entries[0] if entries else None, self._table.maxsize


def _same_state(before: tuple[int, object, int], after: tuple[int, object, int]) -> bool:
    # Identity for the front entry: an equal (name, value) inserted again still shifts the table.
    return before[0] == after[0] and before[1] is after[1] and before[2] == after[2]


def _text_headers(headers: Any) -> HeaderList:
    # Raw bytes as latin-1: binary metadata ("-bin" values, which grpc-core peers may send
    # unencoded) must not fail the decode; the names and values the relay reads are ASCII.
    return HeaderList([(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers])
