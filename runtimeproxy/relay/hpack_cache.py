"""HPACK decoding that remembers header blocks which leave the dynamic table unchanged.

Decoding dominates the relay's CPU per call (pure-Python hpack). Once the tables are
warm, a peer sends the same bytes for the same headers call after call (containerd's
response headers and trailers, a client's request to the same method), and such a block
consists of references that do not change the table. Under an unchanged table the same
bytes decode to the same headers, so those results are kept until the table changes.
"""

from __future__ import annotations

from typing import Any

import hpack

MAX_CACHED_BLOCKS = 512


class CachingDecoder:
    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._table = self._decoder.header_table
        self._cache: dict[bytes, list[tuple[str, str]]] = {}

    @property
    def max_allowed_table_size(self) -> int:
        return int(self._decoder.max_allowed_table_size)

    @max_allowed_table_size.setter
    def max_allowed_table_size(self, value: int) -> None:
        self._decoder.max_allowed_table_size = value

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        """The headers of ``block``; the list is shared with later hits, so do not change it."""
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        before = self._state()
        headers = _text_headers(self._decoder.decode(block, raw=True))
        if self._state() == before:
            if len(self._cache) >= MAX_CACHED_BLOCKS:
                self._cache.clear()
            self._cache[block] = headers
        else:
            self._cache.clear()  # the table changed: earlier results may no longer hold
        return headers

    def _state(self) -> tuple[int, int, int]:
        # An insertion puts a new entry object at the front; a size change shows in maxsize.
        entries = self._table.dynamic_entries
        return len(entries), id(entries[0]) if entries else 0, self._table.maxsize


def _text_headers(headers: Any) -> list[tuple[str, str]]:
    # Raw bytes as latin-1: binary metadata ("-bin" values, which grpc-core peers may send
    # unencoded) must not fail the decode; the names and values the relay reads are ASCII.
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]
