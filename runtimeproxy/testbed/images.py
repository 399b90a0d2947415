"""Build OCI image layouts from the host's static busybox, in pure Python.

No registry is reachable here, so test images are made locally: one uncompressed
tar layer holding ``/bin/busybox`` and a symlink per applet, an image config, a
manifest and an ``index.json`` naming the image, packed as a tar that
``ctr images import`` accepts.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUSYBOX = Path("/bin/busybox")
PAUSE_REF = "localhost/runtimeproxy-testbed/pause:1"
TEST_REF = "localhost/runtimeproxy-testbed/busybox:1"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# A fixed mtime keeps the layer digest stable from run to run.
_MTIME = 1_700_000_000
_DIRS = {"bin": 0o755, "dev": 0o755, "etc": 0o755, "proc": 0o555, "root": 0o700,
         "sys": 0o555, "tmp": 0o1777, "usr": 0o755, "var": 0o755}
_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"
_MT_LAYER = "application/vnd.oci.image.layer.v1.tar"
_MT_CONFIG = "application/vnd.oci.image.config.v1+json"
_MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_MT_INDEX = "application/vnd.oci.image.index.v1+json"
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
           "s390x": "s390x", "riscv64": "riscv64"}


@dataclass(frozen=True)
class ImageSpec:
    """What goes into an image's config: its name and how its process starts."""

    ref: str
    cmd: list[str]
    entrypoint: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=lambda: [DEFAULT_PATH])
    # Empty means the runtime's default (SIGTERM).
    stop_signal: str = ""
    labels: dict[str, str] = field(default_factory=dict)


def pause_image_spec(ref: str = PAUSE_REF) -> ImageSpec:
    """The sandbox ("pause") image: a process that stays up and does nothing."""
    return ImageSpec(ref=ref, cmd=["sleep", "infinity"])


def test_image_spec(ref: str = TEST_REF) -> ImageSpec:
    """The workload image. `sleep` as PID 1 ignores SIGTERM, so StopContainer would
    wait out its whole timeout: SIGKILL as stop signal keeps tests fast."""
    return ImageSpec(ref=ref, cmd=["sleep", "3600"], stop_signal="SIGKILL")


def busybox_applets(busybox: Path = BUSYBOX) -> list[str]:
    """Applet names this busybox provides, from `busybox --list`."""
    out = subprocess.run([str(busybox), "--list"], check=True, capture_output=True, text=True)
    return sorted({name for name in out.stdout.split() if name and name != "busybox"})


def tarinfo(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    """A tar entry owned by root with the fixed mtime (stable layer digests)."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, _MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    tar.addfile(tarinfo(name, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))


def build_layer(busybox: Path = BUSYBOX) -> bytes:
    """An uncompressed rootfs layer: directories, busybox, one symlink per applet."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in sorted(_DIRS.items()):
            tar.addfile(tarinfo(name, tarfile.DIRTYPE, mode))
        _add_file(tar, "bin/busybox", busybox.read_bytes(), 0o755)
        for applet in busybox_applets(busybox):
            link = tarinfo(f"bin/{applet}", tarfile.SYMTYPE, 0o777)
            link.linkname = "busybox"
            tar.addfile(link)
        _add_file(tar, "etc/passwd", _PASSWD.encode())
        _add_file(tar, "etc/group", _GROUP.encode())
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(media_type: str, data: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": _digest(data), "size": len(data)}


def _image_config(spec: ImageSpec, layer: bytes) -> bytes:
    config: dict[str, Any] = {"Env": spec.env, "Cmd": spec.cmd, "WorkingDir": "/"}
    if spec.entrypoint:
        config["Entrypoint"] = spec.entrypoint
    if spec.stop_signal:
        config["StopSignal"] = spec.stop_signal
    if spec.labels:
        config["Labels"] = spec.labels
    return _json({
        "architecture": _GOARCH.get(platform.machine(), platform.machine()),
        "os": "linux",
        "created": "2023-11-14T22:13:20Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        "history": [{"created_by": "runtimeproxy testbed (busybox-static)"}],
    })


def image_blobs(spec: ImageSpec, layer: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The index.json entry naming one image, and all of its blobs by digest."""
    config = _image_config(spec, layer)
    manifest = _json({
        "schemaVersion": 2,
        "mediaType": _MT_MANIFEST,
        "config": _descriptor(_MT_CONFIG, config),
        "layers": [_descriptor(_MT_LAYER, layer)],
    })
    entry = _descriptor(_MT_MANIFEST, manifest)
    entry["annotations"] = {"org.opencontainers.image.ref.name": spec.ref}
    blobs = {_digest(blob): blob for blob in (layer, config, manifest)}
    return entry, blobs


def build_image_tar(specs: ImageSpec | list[ImageSpec], dest: Path,
                    layer: bytes | None = None) -> Path:
    """Write one or more images, sharing one busybox layer, as an OCI image layout
    packed in the tar file `dest`: one `ctr images import` brings them all in."""
    layer = build_layer() if layer is None else layer
    return write_image_tar([specs] if isinstance(specs, ImageSpec) else specs, layer, dest)


def write_image_tar(specs: list[ImageSpec], layer: bytes, dest: Path) -> Path:
    """Images sharing the one `layer`, as an OCI image layout packed in the tar file `dest`."""
    entries, blobs = [], {}
    for spec in specs:
        entry, image = image_blobs(spec, layer)
        entries.append(entry)
        blobs.update(image)
    index = {"schemaVersion": 2, "mediaType": _MT_INDEX, "manifests": entries}
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_file(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _add_file(tar, "index.json", _json(index))
        for digest, blob in sorted(blobs.items()):
            _add_file(tar, "blobs/sha256/" + digest.removeprefix("sha256:"), blob)
    return dest
