"""HTTP/2 and gRPC on the wire, without grpcio: frames (frames), HPACK helpers (hpack_cache,
hpack_literal), gRPC message framing and status codes (grpc_framing), the limits every HTTP/2
peer is held to (peer_limits, and their counter: peer_limit_metrics), one HTTP/2 connection
(h2_peer) and the unary gRPC client (grpc_client) and server (grpc_server) on it. The relay
builds its data path on the frame and HPACK modules; the proxy's hook calls and store reads
and runtime-hooks' server and CRI calls use the client and the server.

May import the standard library, hpack, structlog, prometheus_client and runtimeproxy.common.
"""
