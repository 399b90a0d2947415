"""The node image of the real-node tier: a Debian root filesystem and a kernel, cached.

`ensure_node_image()` returns a directory holding

* ``root/``: a Debian (trixie) root made by debootstrap with systemd, containerd, runc,
  iproute2, python3 and the project's Python dependencies installed (pip inside a chroot,
  offline, from wheels the host downloaded for the guest's Python), plus the kernel
  modules the scenario needs; docs, man pages, locales and apt's downloads trimmed;
* ``base.cpio.zst``: that root packed as an initramfs (the guest boots with its root in
  RAM, so nothing in the guest has to unpack or install anything);
* ``vmlinuz``: Debian's kernel, from the same package as the modules;
* ``manifest.json``: the inputs and how long each build step took.

It is built once per set of inputs (`image_key`: suite, packages, kernel package, the
project's declared dependencies, and `BUILD_VERSION` for the build steps themselves) under
the cache directory (``$RUNTIMEPROXY_NODE_CACHE``, else ``~/.cache/runtimeproxy/node``),
under a lock, and published by a rename, so an interrupted build leaves nothing behind
that could be taken for a finished one. Older images are pruned.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from runtimeproxy.common.extras import TOOLS_EXTRA

__all__ = [
    "KERNEL_MODULES",
    "PACKAGES",
    "SUITE",
    "NodeImage",
    "NodeImageError",
    "cache_root",
    "debian_mirror",
    "ensure_node_image",
    "image_key",
    "kernel_package",
    "pack_cpio",
    "project_requirements",
]

SUITE = "trixie"
# systemd as PID 1 (systemd-sysv), its bus (dbus: systemctl and busctl talk to PID 1 over
# it) and udev; the runtime; tc for the network plugin; Python, pip and the project's build
# backend (setuptools: the project installs with --no-build-isolation, offline); kmod to load
# the modules below; procps for ps/pgrep when debugging a run.
PACKAGES = ("systemd", "systemd-sysv", "dbus", "udev", "containerd", "runc", "iproute2",
            "python3", "python3-pip", "python3-setuptools", "kmod", "procps")
# The host's kernel meta-package: its dependency names the versioned image package.
KERNEL_META = "linux-image-amd64"
# Modules the scenario loads (everything else it needs is built in): HTB and its
# filters for the network plugin, a dummy link for it to shape.
KERNEL_MODULES = ("kernel/net/sched/sch_htb.ko", "kernel/net/sched/cls_u32.ko",
                  "kernel/net/sched/cls_bpf.ko", "kernel/drivers/net/dummy.ko")
# Bump when the build steps change what an image holds.
BUILD_VERSION = 1
# What a node running from RAM does not need (about 150 MB).
_TRIM = ("usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/info",
         "var/cache/apt/archives", "var/lib/apt/lists")
_KEEP_IMAGES = 2
_CHROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8"}
_SOURCES = (Path("/etc/apt/sources.list.d"), Path("/etc/apt/sources.list"))

Log = Callable[[str], None]


class NodeImageError(RuntimeError):
    """A build step failed; the message names the step and carries its output."""


@dataclass(frozen=True)
class NodeImage:
    """A finished image directory (see the module doc)."""

    key: str
    path: Path

    @property
    def root(self) -> Path:
        return self.path / "root"

    @property
    def initrd(self) -> Path:
        return self.path / "base.cpio.zst"

    @property
    def kernel(self) -> Path:
        return self.path / "vmlinuz"

    @property
    def manifest(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.path / "manifest.json").read_text())
        return data


# -- inputs --------------------------------------------------------------------------


def cache_root() -> Path:
    """Where images live: $RUNTIMEPROXY_NODE_CACHE, else ~/.cache/runtimeproxy/node."""
    configured = os.environ.get("RUNTIMEPROXY_NODE_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runtimeproxy" / "node"


def _source_entries(text: str) -> Iterator[tuple[list[str], list[str], list[str]]]:
    """(types, URIs, suites) of each entry of a deb822 .sources or one-line .list file."""
    if re.search(r"^URIs:", text, re.MULTILINE | re.IGNORECASE):
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ", "\t")):
                    name, _, value = line.partition(":")
                    fields[name.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() != "no":
                yield fields.get("types", "").split(), fields.get("uris", "").split(), fields.get("suites", "").split()
        return
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 3:
            yield [words[0]], [words[1]], [words[2]]


def debian_mirror(sources: Iterable[Path] = _SOURCES) -> str:
    """The Debian archive URI the host's apt uses (not its security archive).

    NodeImageError when no `deb` entry names a plain suite (``bookworm``, not
    ``bookworm-security`` or ``bookworm/updates``).
    """
    files: list[Path] = []
    for source in sources:
        if source.is_dir():
            files += sorted(p for p in source.iterdir() if p.suffix in (".sources", ".list"))
        elif source.is_file():
            files.append(source)
    for file in files:
        for types, uris, suites in _source_entries(file.read_text(errors="replace")):
            plain = [s for s in suites if re.fullmatch(r"[a-z]+", s)]
            if "deb" in types and uris and plain and "security" not in uris[0]:
                return uris[0]
    raise NodeImageError(f"no Debian archive in the apt sources ({', '.join(map(str, files)) or 'none found'})")


def kernel_package() -> str:
    """The versioned kernel image package the host's kernel meta-package depends on."""
    done = _run(["apt-cache", "depends", "--important", KERNEL_META], "apt-cache depends")
    match = re.search(r"Depends:\s*(linux-image-\S+)", done)
    if match is None:
        raise NodeImageError(f"{KERNEL_META} names no kernel image (run apt-get update?):\n{done}")
    return match.group(1)


def project_requirements(distribution: str = "runtimeproxy", extras: Iterable[str] = (TOOLS_EXTRA,)) -> list[str]:
    """The installed project's runtime dependencies and those of ``extras``, as declared (the
    node scenario plays pods in the guest: the tools' extra)."""
    wanted = {f'extra == "{name}"' for name in extras}
    requires = importlib.metadata.requires(distribution) or []
    return sorted(requirement.strip() for requirement, _, marker in (r.partition(";") for r in requires)
                  if "extra ==" not in marker or marker.strip() in wanted)


def image_key(suite: str, packages: Iterable[str], kernel: str, requirements: Iterable[str]) -> str:
    """A short digest of everything an image is built from."""
    inputs = {"suite": suite, "packages": sorted(packages), "kernel": kernel,
              "modules": sorted(KERNEL_MODULES), "requirements": sorted(requirements),
              "build": BUILD_VERSION}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


# -- build -----------------------------------------------------------------------------


def _run(cmd: list[str], step: str, *, timeout: float = 1800, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False)
    except subprocess.TimeoutExpired as exc:
        raise NodeImageError(f"{step}: no result within {timeout:.0f}s: {' '.join(cmd)}") from exc
    except FileNotFoundError as exc:
        raise NodeImageError(f"{step}: {cmd[0]} is not installed (.ci/node-deps.sh installs it)") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise NodeImageError(f"{step} failed (exit {done.returncode}): {' '.join(cmd)}\n{tail}")
    return done.stdout


def chroot(root: Path, *args: str, step: str, timeout: float = 900) -> str:
    """Run a command in `root` with a clean environment (no host PIP_* settings leak in)."""
    return _run(["chroot", str(root), *args], step, timeout=timeout, env=dict(_CHROOT_ENV))


def pack_cpio(source: Path, dest: Path, *, level: int = 6) -> None:
    """Pack `source` as a zstd-compressed newc cpio archive, the initramfs format."""
    names = "".join(f"{p.relative_to(source)}\n" for p in sorted(source.rglob("*"))).encode()
    cpio = subprocess.Popen(["cpio", "--quiet", "-o", "-H", "newc"], cwd=source, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    zstd = subprocess.Popen(["zstd", "-q", "-f", "-T0", f"-{int(level)}", "-o", str(dest)], stdin=cpio.stdout,
                            stderr=subprocess.PIPE)
    assert cpio.stdout is not None and cpio.stdin is not None
    cpio.stdout.close()  # zstd holds the read end now
    try:
        _, cpio_err = cpio.communicate(names, timeout=900)
        _, zstd_err = zstd.communicate(timeout=900)
    except subprocess.TimeoutExpired as exc:
        cpio.kill()
        zstd.kill()
        raise NodeImageError(f"packing {source} took over 900 s") from exc
    if cpio.returncode != 0 or zstd.returncode != 0:
        errors = (cpio_err + zstd_err).decode(errors="replace")[-2000:]
        raise NodeImageError(f"packing {source} failed (cpio {cpio.returncode}, zstd {zstd.returncode}): {errors}")


def _glibc_minor(root: Path) -> int:
    status = (root / "var/lib/dpkg/status").read_text(errors="replace")
    match = re.search(r"^Package: libc6\n(?:.+\n)*?Version: 2\.(\d+)", status, re.MULTILINE)
    if match is None:
        raise NodeImageError(f"no libc6 version in {root}/var/lib/dpkg/status")
    return int(match.group(1))


def _python_version(root: Path) -> str:
    out = chroot(root, "python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])", step="python3 -V")
    return out.strip()


def download_wheels(requirements: list[str], dest: Path, python: str, glibc_minor: int) -> None:
    """The dependencies as wheels for the guest's Python and glibc, through the host's pip
    (its index settings apply); binary only, so the guest never compiles anything."""
    digits = python.replace(".", "")
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(17, glibc_minor + 1)]
    platforms += ["manylinux2014_x86_64", "manylinux1_x86_64", "any"]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest),
           "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
           "--abi", f"cp{digits}", "--abi", "abi3", "--abi", "none",
           *(arg for platform in platforms for arg in ("--platform", platform)),
           *requirements]
    _run(cmd, "pip download (guest wheels)")


def _install_kernel(work: Path, root: Path, package: str) -> str:
    """Fetch the kernel package, put vmlinuz beside the root and the listed modules in it."""
    debs = work / "kernel-deb"
    debs.mkdir()
    _run(["apt-get", "download", package], "apt-get download kernel", cwd=debs)
    deb = next(debs.glob("*.deb"))
    tree = work / "kernel"
    tree.mkdir()
    # Only vmlinuz and the few modules: unpacking the whole package writes 400 MB.
    wanted = ["./boot/vmlinuz-*", "./lib/modules/*/modules.order", "./lib/modules/*/modules.builtin*",
              *(f"./lib/modules/*/{module}" for module in KERNEL_MODULES)]
    script = 'deb=$0 dir=$1; shift; dpkg-deb --fsys-tarfile "$deb" | tar -x --wildcards -C "$dir" "$@"'
    _run(["sh", "-c", script, str(deb), str(tree), *wanted], "extract kernel")
    vmlinuz = next((tree / "boot").glob("vmlinuz-*"))
    version = vmlinuz.name.removeprefix("vmlinuz-")
    shutil.copy2(vmlinuz, work / "vmlinuz")
    source = tree / "lib/modules" / version
    target = root / "usr/lib/modules" / version
    for module in KERNEL_MODULES:
        (target / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / module, target / module)
    for extra in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        if (source / extra).exists():
            shutil.copy2(source / extra, target / extra)
    chroot(root, "depmod", "-a", version, step="depmod")
    shutil.rmtree(tree)
    shutil.rmtree(debs)
    return version


def _install_python_deps(work: Path, root: Path, requirements: list[str]) -> None:
    wheels = root / "tmp/wheels"
    wheels.mkdir(parents=True)
    download_wheels(requirements, wheels, _python_version(root), _glibc_minor(root))
    # --ignore-installed: Debian's python3-setuptools brings Debian's typing_extensions, which pip
    # cannot uninstall (no RECORD); the wheels go to /usr/local, ahead of Debian's on sys.path.
    chroot(root, "python3", "-m", "pip", "install", "-q", "--no-index", "--find-links", "/tmp/wheels",
           "--no-cache-dir", "--break-system-packages", "--root-user-action=ignore", "--ignore-installed",
           *requirements,
           step="pip install (dependencies, in the chroot)")
    shutil.rmtree(wheels)


def _trim(root: Path) -> None:
    for relative in _TRIM:
        path = root / relative
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                elif child.name != "lock":
                    child.unlink()


def _build(work: Path, key: str, packages: tuple[str, ...], kernel: str, requirements: list[str],
           log: Log) -> None:
    timings: dict[str, float] = {}

    def step(name: str, action: Callable[[], object]) -> None:
        log(f"node image {key}: {name}")
        began = time.monotonic()
        action()
        timings[name] = round(time.monotonic() - began, 1)

    root = work / "root"
    mirror = debian_mirror()
    step("debootstrap", lambda: _run(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
                                      SUITE, str(root), mirror], "debootstrap"))
    versions: dict[str, str] = {}
    step("kernel", lambda: versions.update(kernel=_install_kernel(work, root, kernel)))
    step("python dependencies", lambda: _install_python_deps(work, root, requirements))
    step("trim", lambda: _trim(root))
    step("pack", lambda: pack_cpio(root, work / "base.cpio.zst"))
    manifest = {"key": key, "suite": SUITE, "mirror": mirror, "packages": list(packages), "kernel": kernel,
                "kernel_version": versions["kernel"], "requirements": requirements, "build": BUILD_VERSION,
                "timings_s": timings, "initrd_bytes": (work / "base.cpio.zst").stat().st_size,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (work / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _prune(directory: Path, keep: str) -> None:
    images = sorted((p for p in directory.iterdir() if p.is_dir() and (p / "manifest.json").exists()),
                    key=lambda p: (p / "manifest.json").stat().st_mtime, reverse=True)
    for old in [p for p in images if p.name != keep][_KEEP_IMAGES - 1:]:
        shutil.rmtree(old, ignore_errors=True)
    for partial in directory.glob("*.partial-*"):
        shutil.rmtree(partial, ignore_errors=True)


def ensure_node_image(directory: Path | None = None, log: Log = print) -> NodeImage:
    """The image for the current inputs, built first if the cache has none."""
    directory = directory or cache_root()
    requirements = project_requirements()
    kernel = kernel_package()
    key = image_key(SUITE, PACKAGES, kernel, requirements)
    image = NodeImage(key, directory / key)
    with _locked(directory):
        if (image.path / "manifest.json").exists():
            os.utime(image.path / "manifest.json")  # most recently used: pruned last
            return image
        _prune(directory, keep=key)
        work = directory / f"{key}.partial-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        try:
            _build(work, key, PACKAGES, kernel, requirements, log)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        work.rename(image.path)
    return image
