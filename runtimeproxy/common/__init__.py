"""What both daemons are built from, knowing nothing of CRI or hooks: structured logging
(logs), trace events (trace), the unix socket they serve on (listener) and endpoint paths
(endpoints), directory watching (dirwatch), systemd notification (sdnotify), returning freed
memory to the kernel (malloc), coroutine helpers (coroutines), giving the CPU to a caller just
answered (give_way), the command-line options both daemons share (cli_options), gRPC message
sizes (message_size), and Prometheus building blocks with the HTTP endpoint that serves them
(metrics_export).

May import the standard library and third-party libraries only, never another runtimeproxy
package.
"""
