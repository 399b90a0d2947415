"""The results protocol between the real-node scenario (in the VM) and the host test.

The guest writes one line per fact on its second serial port (``/dev/ttyS1``), which
qemu writes to a file on the host::

    RTPX {"name": "pod/be/files", "t": 81.2, "data": {...}}

``name`` is unique per run, ``t`` the guest's uptime in seconds and ``data`` any JSON:
what the guest saw (file contents, ``systemctl show`` properties, journal excerpts), never
a verdict, so that the host's assertions and their failure messages carry the evidence.
Lines without the prefix (kernel noise) are ignored; a prefixed line that is not valid
JSON (a run cut short mid-line) is kept as an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DONE", "PREFIX", "Facts", "encode", "parse"]

PREFIX = "RTPX "
# The last fact of a run that reached its end.
DONE = "done"


def encode(name: str, data: Any, t: float) -> bytes:
    """One fact as a line (ASCII only, so a serial line discipline cannot mangle it)."""
    line = json.dumps({"name": name, "t": round(t, 2), "data": data}, ensure_ascii=True, default=str)
    return (PREFIX + line + "\n").encode("ascii")


@dataclass
class Facts:
    """The facts of one run, by name, in arrival order."""

    data: dict[str, Any] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def __contains__(self, name: object) -> bool:
        return name in self.data

    def __getitem__(self, name: str) -> Any:
        return self.data[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default)

    @property
    def complete(self) -> bool:
        return DONE in self.data


def parse(text: str) -> Facts:
    """The facts in a serial log; a repeated name keeps its last value (and is reported)."""
    facts = Facts()
    for raw in text.splitlines():
        line = raw.strip("\r\x00 ")
        start = line.find(PREFIX)
        if start < 0:
            continue
        try:
            record = json.loads(line[start + len(PREFIX):])
            name, t, data = record["name"], float(record["t"]), record["data"]
        except (ValueError, KeyError, TypeError) as exc:
            facts.errors.append(f"unreadable line ({exc}): {line[:200]!r}")
            continue
        if not isinstance(name, str):
            facts.errors.append(f"fact without a string name: {line[:200]!r}")
            continue
        if name in facts.data:
            facts.errors.append(f"fact {name!r} sent twice; the last one is kept")
        facts.data[name] = data
        facts.times[name] = t
    return facts
