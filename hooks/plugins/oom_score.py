"""A container's ``oom_score_adj`` from Koordinator's pod annotations: the part of koordlet's
``oomscoreadj`` hook that the ``memory`` plugin does (its settings switch ``pod_oom_score_adj``,
off for every class, as koordlet's OOMScoreAdj feature gate is by default).

koordlet (``pkg/koordlet/runtimehooks/hooks/oomscoreadj/helper.go``
``getOOMScoreAdjForContainer``; names in ``apis/extension/constants.go``) reads, for a container:

1. ``koordinator.sh/oom-score-adj-spec``: a JSON object, container name -> integer (Go
   ``json.Unmarshal`` into ``map[string]int64``). The container's entry if it has one. An
   annotation that does not decode is an error: nothing is set, the pod-wide value is **not**
   used either;
2. else ``koordinator.sh/oom-score-adj``: one integer for every container of the pod (Go
   ``strconv.ParseInt(s, 10, 64)``: an optional sign and decimal digits, nothing else);
3. an empty annotation counts as absent. A value outside -1000..1000 (the kernel's range,
   ``OOM_SCORE_ADJ_MIN``/``MAX``) is skipped with a warning.

Go's decoding rules kept here: map keys match exactly (case-sensitive); a key given twice: the
last wins; a ``null`` value is 0 (a new map element decoded from null stays zero); ``null`` for
the whole annotation is an empty map; a number with a fraction or an exponent (``1.0``, ``1e3``)
or beyond int64 is an error (Go parses an int64 field with ``strconv.ParseInt``).

koordlet writes the value into ``/proc/<pid>/oom_score_adj`` of the container's processes from
its reconciler; ours puts it in the CRI answer of PreCreateContainer (``oom_score_adj``), so
runc sets it for the container's first process and its children inherit it. A containerd with
``restrict_oom_score_adj`` raises a value below its own score to that score.

This module is pure: it returns the value and, when the annotations are refused, why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final

__all__ = [
    "OOM_SCORE_ADJ_ANNOTATION",
    "OOM_SCORE_ADJ_MAX",
    "OOM_SCORE_ADJ_MIN",
    "OOM_SCORE_ADJ_SPEC_ANNOTATION",
    "oom_score_adj_for",
]

OOM_SCORE_ADJ_SPEC_ANNOTATION: Final = "koordinator.sh/oom-score-adj-spec"
OOM_SCORE_ADJ_ANNOTATION: Final = "koordinator.sh/oom-score-adj"
# include/uapi/linux/oom.h
OOM_SCORE_ADJ_MIN: Final = -1000
OOM_SCORE_ADJ_MAX: Final = 1000
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
# strconv.ParseInt base 10: a sign, then ASCII digits only (no spaces, no underscores).
_GO_INT: Final = re.compile(r"[+-]?[0-9]+", re.ASCII)


class _Refused(ValueError):
    """The annotation does not decode as Go would decode it."""


def _go_int(text: str, what: str) -> int:
    if not _GO_INT.fullmatch(text):
        raise _Refused(f"{what}: {text[:40]!r} is not an integer")
    value = int(text)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _Refused(f"{what}: {text[:40]} is out of the int64 range")
    return value


def _json_int(token: str) -> int:
    return _go_int(token, "a value")


def _no_float(token: str) -> int:
    raise _Refused(f"{token[:40]} is not an integer")  # Go parses an int64 element with ParseInt


def _no_constant(token: str) -> int:
    raise _Refused(f"{token} is not JSON")


class _Object(list[tuple[str, object]]):
    """A JSON object's pairs in order, duplicates kept (the last one wins below, as in Go)."""


def _spec_value(text: str, container: str) -> int | None:
    """The container's entry of the spec annotation; None without one. _Refused when it does not decode."""
    try:
        raw = json.loads(
            text, parse_int=_json_int, parse_float=_no_float, parse_constant=_no_constant, object_pairs_hook=_Object
        )
    except json.JSONDecodeError as exc:
        raise _Refused(f"not JSON ({exc.msg})") from None
    if raw is None:  # Go: null into a map leaves it empty
        return None
    if not isinstance(raw, _Object):
        raise _Refused("must be a JSON object of container names to integers")
    found: int | None = None
    for key, value in raw:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise _Refused(f"{key[:40]!r} must map to an integer")
        if key == container:
            found = 0 if value is None else value
    return found


def oom_score_adj_for(annotations: Mapping[str, str], container: str) -> tuple[int | None, str]:
    """The oom_score_adj Koordinator's annotations ask for ``container``: ``(value, "")``,
    ``(None, "")`` when they ask nothing, ``(None, reason)`` when they are refused or out of range."""
    value: int | None = None
    spec = annotations.get(OOM_SCORE_ADJ_SPEC_ANNOTATION, "")
    if spec:
        try:
            value = _spec_value(spec, container)
        except _Refused as exc:
            return None, f"annotation {OOM_SCORE_ADJ_SPEC_ANNOTATION} ignored: {exc}"
    pod_wide = annotations.get(OOM_SCORE_ADJ_ANNOTATION, "")
    if value is None and pod_wide:
        try:
            value = _go_int(pod_wide, "value")
        except _Refused as exc:
            return None, f"annotation {OOM_SCORE_ADJ_ANNOTATION} ignored: {exc}"
    if value is not None and not OOM_SCORE_ADJ_MIN <= value <= OOM_SCORE_ADJ_MAX:
        return None, f"oom_score_adj {value} is out of range [{OOM_SCORE_ADJ_MIN}, {OOM_SCORE_ADJ_MAX}]: skipped"
    return value, ""
