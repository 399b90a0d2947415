"""Set up a pod's volumes on this node before its sandbox starts, and remove them with it.

The plan (:mod:`runtimeproxy.kubelet_model.volumes`) says where each volume goes; this module
does what kubelet's volume plugins do there:

* hostPath: the ``type`` check (``DirectoryOrCreate`` and ``FileOrCreate`` create what is
  missing, ``Directory``, ``File``, ``Socket``, ``CharDevice`` and ``BlockDevice`` refuse
  anything else), before anything is created for the pod;
* configMap: kubelet's atomic writer: the files in a new ``..<UTC time>.<random>`` directory, a
  ``..data_tmp`` symlink to it renamed over ``..data``, a symlink per top-level name into
  ``..data``, then the previous directory and names no longer in the ConfigMap removed; playing
  the pod again with changed data is the update kubelet makes when a ConfigMap changes;
* emptyDir: a directory (mode 0777); ``medium: Memory`` mounts a tmpfs there, ``size=`` the
  size limit.

:func:`tear_down` unmounts the tmpfs volumes and removes the pod's directory.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable

from runtimeproxy.kubelet_model.volumes import VolumePlan

__all__ = ["VolumeSetupError", "set_up", "tear_down"]

_TYPE_CHECKS = {
    "Directory": (stat.S_ISDIR, "a directory"),
    "File": (stat.S_ISREG, "a file"),
    "Socket": (stat.S_ISSOCK, "a socket"),
    "CharDevice": (stat.S_ISCHR, "a character device"),
    "BlockDevice": (stat.S_ISBLK, "a block device"),
}
_DATA = "..data"
_DATA_TMP = "..data_tmp"


class VolumeSetupError(RuntimeError):
    """A volume could not be set up; the message names the volume and the path."""


def set_up(volumes: Iterable[VolumePlan]) -> list[str]:
    """Check the host paths, then create the pod's volumes; one line per volume."""
    volumes = list(volumes)
    notes = [_check_host_path(volume) for volume in volumes if volume.kind == "hostPath"]
    for volume in volumes:
        if volume.kind == "configMap":
            notes.append(_write_config_map(volume))
        elif volume.kind == "emptyDir":
            notes.append(_make_empty_dir(volume))
    return notes


def _check_host_path(volume: VolumePlan) -> str:
    path, kind = volume.path, volume.host_path_type
    where = f"volume {volume.name!r}: hostPath {path}"
    try:
        if kind == "DirectoryOrCreate":
            if not os.path.isdir(path):
                os.makedirs(path, mode=0o755, exist_ok=False)
                return f"{where}: created (DirectoryOrCreate)"
        elif kind == "FileOrCreate":
            if not os.path.lexists(path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
                return f"{where}: created (FileOrCreate)"
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise VolumeSetupError(f"{where}: type check failed: exists and is not a file")
        elif kind in _TYPE_CHECKS:
            check, what = _TYPE_CHECKS[kind]
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                raise VolumeSetupError(f"{where}: type check failed: does not exist ({kind})") from None
            if not check(mode):
                raise VolumeSetupError(f"{where}: type check failed: is not {what} ({kind})")
    except OSError as exc:
        raise VolumeSetupError(f"{where}: {exc.strerror or exc}") from exc
    return f"{where}: {kind or 'unchecked'}"


def _write_config_map(volume: VolumePlan) -> str:
    """kubelet's AtomicWriter over ``volume.path`` (see the module doc)."""
    target = volume.path
    try:
        os.makedirs(target, mode=0o755, exist_ok=True)
        stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime())
        new_dir = tempfile.mkdtemp(prefix=stamp, dir=target)
        os.chmod(new_dir, 0o755)
        for relative, (data, mode) in sorted(volume.files.items()):
            file_path = os.path.join(new_dir, relative)
            os.makedirs(os.path.dirname(file_path), mode=0o755, exist_ok=True)
            with open(file_path, "wb") as handle:
                handle.write(data)
            os.chmod(file_path, mode)
        old_dir = os.readlink(os.path.join(target, _DATA)) if os.path.islink(os.path.join(target, _DATA)) else None
        tmp_link = os.path.join(target, _DATA_TMP)
        if os.path.lexists(tmp_link):
            os.unlink(tmp_link)
        os.symlink(os.path.basename(new_dir), tmp_link)
        os.rename(tmp_link, os.path.join(target, _DATA))
        names = {relative.split("/", 1)[0] for relative in volume.files}
        for name in names:
            link = os.path.join(target, name)
            if not os.path.lexists(link):
                os.symlink(os.path.join(_DATA, name), link)
        for entry in os.listdir(target):
            if not entry.startswith("..") and entry not in names:
                os.unlink(os.path.join(target, entry))
        if old_dir is not None and old_dir != os.path.basename(new_dir):
            shutil.rmtree(os.path.join(target, old_dir), ignore_errors=True)
    except OSError as exc:
        raise VolumeSetupError(f"volume {volume.name!r}: cannot write {target}: {exc.strerror or exc}") from exc
    return f"volume {volume.name!r}: configMap, {len(volume.files)} file(s) in {target}"


def _make_empty_dir(volume: VolumePlan) -> str:
    path = volume.path
    try:
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o777)
    except OSError as exc:
        raise VolumeSetupError(f"volume {volume.name!r}: cannot create {path}: {exc.strerror or exc}") from exc
    if not volume.memory:
        return f"volume {volume.name!r}: emptyDir {path}"
    if os.path.ismount(path):
        return f"volume {volume.name!r}: emptyDir tmpfs {path} (mounted already)"
    options = "mode=0777" + (f",size={volume.size_limit}" if volume.size_limit is not None else "")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise VolumeSetupError(f"volume {volume.name!r}: cannot mount a tmpfs on {path}: {done.stderr.strip()}")
    return f"volume {volume.name!r}: emptyDir tmpfs {path} ({options})"


def tear_down(pod_directory: str) -> list[str]:
    """Unmount what is mounted below the pod's directory, then remove it; one line per step."""
    if not pod_directory or not os.path.isdir(pod_directory):
        return []
    notes = []
    for point in sorted(_mounts_below(pod_directory), reverse=True):
        done = subprocess.run(["umount", point], capture_output=True, text=True, check=False)
        notes.append(f"unmounted {point}" if done.returncode == 0 else f"umount {point}: FAILED {done.stderr.strip()}")
    if any("FAILED" in note for note in notes):
        return notes  # never remove files below a mount still in place
    shutil.rmtree(pod_directory, ignore_errors=True)
    notes.append(f"removed {pod_directory}")
    return notes


def _mounts_below(directory: str) -> list[str]:
    prefix = os.path.realpath(directory).rstrip("/") + "/"
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            point = line.split()[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
            if point.startswith(prefix):
                points.append(point)
    return points
