"""What `runtime-proxy install` changed on a host, kept on the host for `uninstall` to undo exactly
that, with no cluster: each path it wrote with what the path held before, the directories it
made, the units it enabled and whether it unpacked a bundle."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runtimeproxy.proxy.host_root import FileState, HostRoot, sha256

__all__ = ["RECORD_PATH", "InstallRecord", "RecordError"]

RECORD_PATH = "/var/lib/runtimeproxy/install.json"
_FORMAT = 1


class RecordError(ValueError):
    """The record on the host cannot be read: uninstall would not know what to undo."""


@dataclass
class WrittenFile:
    previous: FileState  # what the path held before the first install wrote it
    written: str  # sha256 of what install wrote last ("" for a symlink)
    kind: str


@dataclass
class InstallRecord:
    files: dict[str, WrittenFile] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)  # made by install, parents first
    enabled: list[str] = field(default_factory=list)  # units install enabled (not enabled before)
    bundle: str | None = None  # where a bundle was unpacked

    def note_file(self, path: str, previous: FileState, kind: str) -> None:
        """Remember what `path` held before the first write (later installs keep that)."""
        self.files.setdefault(path, WrittenFile(previous, "", kind))

    def note_written(self, path: str, content: bytes) -> None:
        self.files[path].written = sha256(content)

    def to_json(self) -> dict[str, Any]:
        return {"format": _FORMAT,
                "files": {path: {"previous": f.previous.to_json(), "written": f.written, "kind": f.kind}
                          for path, f in self.files.items()},
                "dirs": self.dirs, "enabled": self.enabled, "bundle": self.bundle}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InstallRecord:
        if data.get("format") != _FORMAT:
            raise RecordError(f"unknown record format {data.get('format')!r} (this version reads {_FORMAT})")
        files = {path: WrittenFile(FileState.from_json(f["previous"]), f["written"], f["kind"])
                 for path, f in data["files"].items()}
        return cls(files=files, dirs=list(data["dirs"]), enabled=list(data["enabled"]), bundle=data["bundle"])

    @classmethod
    def load(cls, host: HostRoot) -> InstallRecord | None:
        """The host's record; None when nothing was installed there."""
        state = host.state(RECORD_PATH)
        if state.kind == "absent":
            return None
        try:
            return cls.from_json(json.loads(state.content))
        except (ValueError, KeyError, TypeError) as exc:
            raise RecordError(f"{host.root / RECORD_PATH.lstrip('/')} is not a record this version reads: "
                              f"{exc!r}") from exc

    def content(self) -> bytes:
        return (json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode()
