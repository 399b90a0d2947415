"""Header blocks the relay writes itself, encoded so that they never touch the HPACK dynamic table.

The relay forwards the two peers' header blocks unchanged, so the client's decoder and the
backend's encoder share one dynamic table. A block of the relay's own must therefore use
only literals "without indexing" (RFC 7541 section 6.2.2): the receiver decodes them and
adds nothing to its table, which keeps both peers in step.
"""

from __future__ import annotations


def _integer(value: int, prefix_bits: int, first_byte_flags: int) -> bytes:
    """HPACK integer (RFC 7541 section 5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first_byte_flags | value])
    out = bytearray([first_byte_flags | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(raw: bytes) -> bytes:
    # Plain octets (no Huffman): the H bit stays 0.
    return _integer(len(raw), 7, 0x00) + raw


def encode_literal_block(headers: list[tuple[str, str]]) -> bytes:
    """A header block of literal fields without indexing and with literal names."""
    out = bytearray()
    for name, value in headers:
        out += b"\x00" + _string(name.encode("ascii")) + _string(value.encode("utf-8"))
    return bytes(out)
