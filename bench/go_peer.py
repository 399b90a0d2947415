"""Build the Go NRI peer plugin (bench/nri_go_peer/main.go) offline from Debian's packages.

    python bench/go_peer.py [--cache DIR]      # prints the binary's path

Debian trixie's Go toolchain (golang-1.24-go) and containerd/nri 0.6.1 (the version containerd
1.7.24 speaks, golang-github-containerd-nri-dev) with every golang-* package they depend on are
downloaded with a private apt state (runtimeproxy/testbed/runtimes.py: the system's apt lists,
cache and sources are neither read nor written), unpacked with ``dpkg-deb -x`` into one root and
the plugin is built there in GOPATH mode, with no module proxy and no network. The root and the
binary are kept under the test bed's cache (``<cache>/go-peer/``) and reused while main.go is
unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from runtimeproxy.testbed.runtimes import (
    PrivateApt,
    RuntimeFetchError,
    _give_to_apt,
    cache_dir,
    codename,
    debian_mirror,
    system_sources,
)

SUITE = "trixie"
ROOTS = ("golang-1.24-go", "golang-github-containerd-nri-dev")
SOURCE = Path(__file__).resolve().parent / "nri_go_peer" / "main.go"
IMPORT_PATH = "runtimeproxy.bench/nri-go-peer"


def packages(apt: PrivateApt) -> list[str]:
    """ROOTS and the Go packages they depend on, recursively (Depends only)."""
    shown = apt.run(
        "apt-cache",
        "depends",
        "--recurse",
        "--no-recommends",
        "--no-suggests",
        "--no-conflicts",
        "--no-breaks",
        "--no-replaces",
        "--no-enhances",
        *ROOTS,
    )
    names = set(ROOTS)
    for line in shown.splitlines():
        name = line.strip().removeprefix("|").removeprefix("Depends:").strip()
        if name.startswith("golang-"):  # "<name>": a virtual package, provided by one listed too
            names.add(name)
    return sorted(names)


def unpack_root(cache: Path) -> Path:
    """The unpacked root of ROOTS and their Go dependencies (downloaded once)."""
    root = cache / "go-peer" / "root"
    if (root / "usr" / "lib" / "go-1.24" / "bin" / "go").exists():
        return root
    mirror = debian_mirror(system_sources(), codename())
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=cache) as tmp:
        work = Path(tmp)
        apt = PrivateApt(work / "apt", mirror, SUITE)
        apt.run("apt-get", "update")
        download = work / "download"
        download.mkdir()
        _give_to_apt(work, download)
        wanted = packages(apt)
        apt.run("apt-get", "download", *[f"{name}/{SUITE}" for name in wanted], cwd=download)
        tree = work / "tree"
        for deb in sorted(download.glob("*.deb")):
            done = subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeFetchError(f"dpkg-deb -x {deb.name} failed: {done.stderr.strip()}")
        (tree / "packages.txt").write_text("\n".join(sorted(d.name for d in download.glob("*.deb"))) + "\n")
        shutil.rmtree(root, ignore_errors=True)
        root.parent.mkdir(parents=True, exist_ok=True)
        tree.rename(root)
    return root


def build(cache: Path | None = None) -> Path:
    """The peer's binary, built from SOURCE in GOPATH mode (reused while SOURCE is unchanged)."""
    cache = cache_dir() if cache is None else cache
    cache.mkdir(parents=True, exist_ok=True)
    root = unpack_root(cache)
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    binary = cache / "go-peer" / f"nri-go-peer-{digest}"
    if binary.exists():
        return binary
    gopath = cache / "go-peer" / "gopath"
    package = gopath / "src" / IMPORT_PATH
    package.mkdir(parents=True, exist_ok=True)
    shutil.copy(SOURCE, package / "main.go")
    goroot = root / "usr" / "lib" / "go-1.24"
    env = {
        "PATH": f"{goroot / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "GOROOT": str(goroot),
        "GOPATH": f"{gopath}:{root / 'usr' / 'share' / 'gocode'}",
        "GO111MODULE": "off",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
        "GOCACHE": str(cache / "go-peer" / "gocache"),
        "HOME": str(cache / "go-peer"),
    }
    done = subprocess.run(
        [str(goroot / "bin" / "go"), "build", "-o", str(binary), IMPORT_PATH],
        capture_output=True,
        text=True,
        env=env,
        cwd=package,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeFetchError(f"go build failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return binary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None, help="cache directory (default: the test bed's)")
    args = parser.parse_args(argv)
    try:
        print(build(args.cache))
    except RuntimeFetchError as exc:
        print(f"go_peer: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
