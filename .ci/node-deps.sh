#!/usr/bin/env bash
# Installs the Debian packages the real-node tier (tox -e node) needs on the host: qemu to
# boot the node, debootstrap to build its root, cpio and zstd to pack it as an initramfs.
# The kernel comes from the host's apt lists (apt-get download linux-image-*), so those must
# exist. Idempotent; runs unattended as root (or through passwordless sudo).
set -euo pipefail

packages=(qemu-system-x86 debootstrap cpio zstd)

sudo=()
if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null; then
        echo "node-deps: run this script as root" >&2
        exit 1
    fi
    sudo=(sudo -n --preserve-env=DEBIAN_FRONTEND)
fi
export DEBIAN_FRONTEND=noninteractive

missing=()
for pkg in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$pkg")
done
# No kernel meta-package in the lists means apt has never been updated here.
if ((${#missing[@]} > 0)) || ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
    "${sudo[@]}" apt-get update -q
fi
if ((${#missing[@]} == 0)); then
    echo "node-deps: all present (${packages[*]})"
    exit 0
fi
echo "node-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get install -y -q --no-install-recommends \
    -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    "${missing[@]}"
