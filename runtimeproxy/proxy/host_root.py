"""A host's filesystem seen from its root directory: ``/``, or the host mounted elsewhere (the
installer pod mounts it at /host). Paths are host paths, resolved inside the root the way the host
itself resolves them (an absolute symlink such as /var/run -> /run stays inside the root), and
files are read, written atomically and removed there."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

__all__ = ["FileState", "HostPathError", "HostRoot", "sha256"]

_MAX_SYMLINK_HOPS = 40  # as the kernel's ELOOP limit


class HostPathError(OSError):
    """A host path that cannot be resolved inside the root (a symlink loop)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class FileState:
    """What a path holds: nothing, a file (its content and mode) or a symlink (its target)."""

    kind: Literal["absent", "file", "symlink", "other"]
    content: bytes = b""
    mode: int = 0o644
    target: str = ""

    def describe(self) -> str:
        return {"absent": "absent", "file": f"file, mode {self.mode:04o}", "symlink": f"symlink to {self.target}",
                "other": "not a file"}[self.kind]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "content": base64.b64encode(self.content).decode(), "mode": self.mode,
                "target": self.target}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileState:
        return cls(kind=data["kind"], content=base64.b64decode(data["content"]), mode=int(data["mode"]),
                   target=data["target"])


ABSENT = FileState("absent")


class HostRoot:
    """The host's files under `root` (see the module doc)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(os.path.abspath(root))

    @property
    def is_own_root(self) -> bool:
        """Whether the root is this process's own `/` (no chroot needed to act on the host)."""
        return self.root == Path("/")

    def path(self, host_path: str, *, follow_last: bool = True) -> Path:
        """Where `host_path` is under the root, symlinks followed inside it (the last component
        only when `follow_last`: a symlink itself is read and replaced, not its target)."""
        pending = [p for p in PurePosixPath(host_path).parts if p != "/"]
        resolved: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "..":  # never above the root, as in a chroot
                if resolved:
                    resolved.pop()
                continue
            candidate = self.root.joinpath(*resolved, part)
            if (pending or follow_last) and candidate.is_symlink():
                hops += 1
                if hops > _MAX_SYMLINK_HOPS:
                    raise HostPathError(f"too many symbolic links resolving {host_path} under {self.root}")
                target = os.readlink(candidate)
                if target.startswith("/"):
                    resolved = []
                pending = [p for p in PurePosixPath(target).parts if p != "/"] + pending
                continue
            resolved.append(part)
        return self.root.joinpath(*resolved)

    def state(self, host_path: str) -> FileState:
        path = self.path(host_path, follow_last=False)
        if path.is_symlink():
            return FileState("symlink", target=os.readlink(path))
        if not path.exists():
            return ABSENT
        if not path.is_file():
            return FileState("other")
        return FileState("file", content=path.read_bytes(), mode=path.stat().st_mode & 0o7777)

    def is_dir(self, host_path: str) -> bool:
        return self.path(host_path).is_dir()

    def put(self, host_path: str, state: FileState) -> None:
        """Make `host_path` hold `state`: a file is written to a temporary name beside it and
        renamed over it (never half-written); absent removes it."""
        path = self.path(host_path, follow_last=False)
        if state.kind == "absent":
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
            return
        temporary = path.with_name(f".{path.name}.runtimeproxy-new")
        temporary.unlink(missing_ok=True)
        if state.kind == "symlink":
            temporary.symlink_to(state.target)
        elif state.kind == "file":
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(state.content)
                os.fchmod(out.fileno(), state.mode)
                out.flush()
                os.fsync(out.fileno())
        else:
            raise ValueError(f"cannot write a {state.kind} at {host_path}")
        os.replace(temporary, path)

    def make_dir(self, host_path: str, mode: int = 0o755) -> None:
        path = self.path(host_path)
        path.mkdir(mode=mode)
        os.chmod(path, mode)  # mkdir's mode went through the umask

    def remove_empty_dir(self, host_path: str) -> bool:
        """Remove the directory if it is empty; whether it is gone."""
        path = self.path(host_path)
        if not path.exists():
            return True
        try:
            path.rmdir()
        except OSError:
            return False
        return True
