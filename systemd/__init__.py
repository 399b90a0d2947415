"""The systemd units, their settings files and kubelet's drop-in, shipped as package data
(``runtimeproxy.data.systemd``) so that ``runtime-proxy install`` can write them on a host. No
code, so it imports nothing."""
