"""Which plugin set which field of a hook call's response, so that a later plugin overwriting
an earlier one's value is said (one log line) and counted, not silent.

The later plugin still wins (the merge rule is unchanged); this only makes the conflict
visible. Setting a field to the value it already has is no conflict and is not reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from .changes import HookResponse

#: How much of a value a log line shows.
VALUE_CHARS: Final = 64
#: The kind of environment variables (HookResponse.set_fields): their values are never shown.
ENV_KIND: Final = "env"


@dataclass(frozen=True, slots=True)
class Overwrite:
    """``later`` replaced ``earlier``'s value of ``field`` (``kind``: the metric label)."""

    field: str
    kind: str
    earlier: str
    later: str
    old: Any
    new: Any

    def log_fields(self) -> dict[str, str]:
        """The values cut to VALUE_CHARS; env values never shown (they may hold secrets)."""
        shown = {"earlier": self.earlier, "later": self.later, "field": self.field}
        if self.kind != ENV_KIND:
            shown["old"] = _cut(self.old)
            shown["new"] = _cut(self.new)
        return shown


def _cut(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 3] + "..."


@dataclass
class FieldOwners:
    """The plugin that last set each field of one hook call's merged response."""

    _owners: dict[str, tuple[str, Any]] = field(default_factory=dict)

    def take(self, plugin: str, response: HookResponse, report: Callable[[Overwrite], None]) -> None:
        """Record ``plugin``'s fields (about to be merged); ``report`` each value it replaces."""
        for name, kind, value in response.set_fields():
            previous = self._owners.get(name)
            if previous is not None and previous[1] != value:
                report(Overwrite(name, kind, previous[0], plugin, previous[1], value))
            self._owners[name] = (plugin, value)
