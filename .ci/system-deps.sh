#!/usr/bin/env bash
# Installs the Debian packages the end-to-end tests and the demo need: a real
# containerd with runc, the static busybox the test images are built from, the CNI
# plugins for pod networking, and iproute2. Idempotent: apt is touched only when a
# package is missing. Runs unattended (no TTY) as root, or through passwordless sudo.
set -euo pipefail

# systemd provides systemd-analyze, which the unit-file tests run (it starts nothing).
packages=(containerd runc busybox-static containernetworking-plugins iproute2 systemd)

missing=()
for pkg in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
    echo "system-deps: all present (${packages[*]})"
    exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null; then
        echo "system-deps: missing ${missing[*]}; run this script as root" >&2
        exit 1
    fi
    sudo=(sudo -n --preserve-env=DEBIAN_FRONTEND)
fi

export DEBIAN_FRONTEND=noninteractive
echo "system-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends \
    -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    "${missing[@]}"
