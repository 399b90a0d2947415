"""The runtime-proxy daemon: its command line (cli; the play and demo tools are loaded only when
they run), the server that accepts kubelet's connections and relays them (server), and the
metrics of the CRI calls it relays (metrics); ``runtime-proxy demo``, the whole product on one
machine (demo).

May import any runtimeproxy package but runtime-hooks (runtimeproxy.hooks): demo starts
runtime-hooks as a process of its own and loads its cgroup table module by name when it runs.
"""
