"""NRI's connection multiplexing: two byte streams over one unix socket.

containerd/nri's pkg/net/multiplex (v0.6.1) carries several logical connections over the
socket between runtime and plugin. Each chunk goes as an 8-byte big-endian header --
connection id (uint32), payload length (uint32) -- then the payload; id 0 is reserved. NRI
uses two: 1 (PluginServiceConn: the runtime calls the plugin's Plugin service) and 2
(RuntimeServiceConn: the plugin calls the runtime's Runtime service). A chunk is only a piece
of that connection's byte stream: a ttrpc message may span chunks and a chunk may hold
several messages. The sender refuses chunks over 16 MiB (1 << 24), so a longer one here means
the stream is corrupt: the decoder raises MuxError and the connection must be dropped.
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = [
    "HEADER",
    "MAX_PAYLOAD",
    "PLUGIN_SERVICE_CONN",
    "RUNTIME_SERVICE_CONN",
    "MuxDecoder",
    "MuxError",
    "encode_chunks",
]

HEADER: Final = struct.Struct(">II")
MAX_PAYLOAD: Final = 1 << 24
PLUGIN_SERVICE_CONN: Final = 1
RUNTIME_SERVICE_CONN: Final = 2
RESERVED_CONN: Final = 0


class MuxError(ValueError):
    """The multiplexed stream cannot be read on: the connection must be closed."""


def encode_chunks(conn_id: int, data: bytes) -> bytes:
    """``data`` for connection ``conn_id`` as chunks within MAX_PAYLOAD, ready to write."""
    if conn_id == RESERVED_CONN:
        raise ValueError("connection id 0 is reserved")
    if not data:
        return b""
    parts: list[bytes] = []
    for start in range(0, len(data), MAX_PAYLOAD):
        piece = data[start : start + MAX_PAYLOAD]
        parts += (HEADER.pack(conn_id, len(piece)), piece)
    return b"".join(parts)


class MuxDecoder:
    """(connection id, chunk payload) pairs out of the trunk's bytes, fed in pieces of any size."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buffer += data
        out: list[tuple[int, bytes]] = []
        while len(self._buffer) >= HEADER.size:
            conn_id, length = HEADER.unpack_from(self._buffer)
            if length > MAX_PAYLOAD:
                raise MuxError(f"multiplexed chunk of {length} bytes for connection {conn_id} (limit {MAX_PAYLOAD})")
            end = HEADER.size + length
            if len(self._buffer) < end:
                break
            out.append((conn_id, bytes(self._buffer[HEADER.size : end])))
            del self._buffer[:end]
        return out
