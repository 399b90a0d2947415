"""Koordinator's extended resources as a pod carries them: the annotation and its quantities.

koord-manager's webhook moves a colocated pod's ``kubernetes.io/batch-cpu`` and
``kubernetes.io/batch-memory`` requests and limits into the pod annotation
``node.koordinator.sh/extended-resource-spec``, because CRI requests do not carry extended
resources (koordinator-sh/koordinator ``apis/extension/resource.go``)::

    {"containers": {"<name>": {"requests": {"kubernetes.io/batch-cpu": "1000", ...},
                               "limits":   {"kubernetes.io/batch-memory": "2Gi", ...}}}}

``batch-cpu`` counts milli-cores (``"1000"`` is one core) and ``batch-memory`` bytes: koordlet
takes ``Quantity.Value()`` of both (``pkg/util/extended_resource.go``).

This module is pure (no I/O, no logging): it returns values and reasons, and the plugins log.

Reading the annotation (:func:`read_extended_resource_spec`) follows koordlet's
``apiext.GetExtendedResourceSpec`` (Go ``encoding/json`` into the struct):

* no annotation: ``(None, "")``;
* JSON ``null``, an object without ``containers``, ``"containers": null``: a spec with no
  containers (koordlet then leaves every cgroup value alone);
* anything Go's decoder refuses -- not JSON, not an object, ``containers`` /
  a container / ``requests`` / ``limits`` not an object (or null), one quantity that does not
  parse, anywhere, for any resource -- makes the whole annotation ignored, as koordlet
  discards the spec on any decode error: ``(None, "annotation ... ignored: <reason>")``;
* as Go does: unknown keys are ignored; field names match case-insensitively, an exact match
  first; a field given twice merges its maps (a container or resource given twice: the last
  wins); a null container entry has no requests and limits; a null quantity is 0.

Using the values (as koordlet's batchresource hook, ``hooks/batchresource/batch_resource.go``):
a quantity <= 0 counts as unset; a container's limit is unset without a positive one; the pod
request is the sum of the containers' positive requests; the pod limit is the sum of the
containers' limits only when every listed container has one (one without makes the pod
unlimited). A non-positive quantity is kept and reported in :attr:`ExtendedResourceSpec.notes`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType
from typing import Final

from . import annotation_json
from .annotation_json import GoObject, json_kind, merged_map, struct_fields

__all__ = [
    "BATCH_CPU",
    "BATCH_MEMORY",
    "EXTENDED_RESOURCE_SPEC_ANNOTATION",
    "INT64_MAX",
    "ContainerResources",
    "ExtendedResourceSpec",
    "quantity_at",
    "quantity_value",
    "read_extended_resource_spec",
]

# apis/extension: NodeDomainPrefix + "/extended-resource-spec"; ResourceDomainPrefix + "batch-*".
EXTENDED_RESOURCE_SPEC_ANNOTATION: Final = "node.koordinator.sh/extended-resource-spec"
BATCH_CPU: Final = "kubernetes.io/batch-cpu"
BATCH_MEMORY: Final = "kubernetes.io/batch-memory"
INT64_MAX: Final = (1 << 63) - 1

# --- quantities ---------------------------------------------------------------------------------

# What k8s.io/apimachinery resource.ParseQuantity accepts (parseQuantityString, then the
# suffixer): a sign, digits, a fraction and a suffix, each part optional but the whole not
# empty. Go takes the degenerate forms "+", ".", "Ki" as 0 too, so this does as well.
_QUANTITY: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?",
    re.ASCII,
)
_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# Go's unicode.IsSpace (what strings.TrimSpace in Quantity.UnmarshalJSON trims); Python's
# str.strip() would also trim \x1c-\x1f.
_GO_SPACE: Final = (
    "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
)
# 10**19 > INT64_MAX: a value with more integer digits than this is clamped without computing it.
_INT64_DIGITS: Final = 19
# A non-zero value below 10**-5 rounds up (away from 0) to 1 whatever its digits.
_TINY_DIGITS: Final = 5


def _text(raw: object) -> str:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float | Decimal):
        raise ValueError(f"not a quantity: {raw!r}")
    if isinstance(raw, str):
        return raw.strip(_GO_SPACE)
    return repr(raw) if isinstance(raw, float) else str(raw)


def quantity_value(raw: object) -> int:
    """``resource.Quantity.Value()`` of a quantity string (or JSON number): rounded up, away
    from 0, to a whole unit and kept within +-INT64_MAX. ValueError (saying why) for anything
    ParseQuantity refuses, and for booleans, None and other types.

    Go caps DecimalSI and BinarySI values at +-INT64_MAX but not exponent forms (``1e30``), whose
    Value() then overflows; this clamps those too.
    """
    text = _text(raw)
    match = _QUANTITY.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"not a quantity: {raw!r}")
    digits = (match["int"] or "") + (match["frac"] or "")
    suffix = match["suffix"] or ""
    try:
        mantissa = int(digits or "0")
    except ValueError:  # beyond Python's int digit limit (sys.get_int_max_str_digits)
        raise ValueError(f"quantity has too many digits: {len(digits)}") from None
    if mantissa == 0:
        return 0
    # The magnitude is rounded up, then the sign applied: Value() rounds away from 0.
    sign = -1 if match["sign"] == "-" else 1
    frac_digits = len(match["frac"] or "")
    if suffix in _BINARY:
        value = Fraction(mantissa, 10**frac_digits) * (1 << _BINARY[suffix])
        return sign * min(math.ceil(value), INT64_MAX)
    exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
    if abs(exponent) > INT64_MAX:  # strconv.ParseInt refuses it
        raise ValueError(f"quantity exponent out of range: {raw!r}")
    power = exponent - frac_digits
    magnitude = len(str(mantissa)) + power  # 10**(magnitude-1) <= value < 10**magnitude
    if magnitude > _INT64_DIGITS:
        return sign * INT64_MAX
    if magnitude < -_TINY_DIGITS:
        return sign
    return sign * min(math.ceil(mantissa * Fraction(10) ** power), INT64_MAX)


# --- the annotation -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerResources:
    """One container's entry: resource name -> ``Quantity.Value()`` (0 for a null quantity)."""

    requests: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    limits: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def request(self, resource: str) -> int | None:
        """The request for ``resource``; None when absent or not positive."""
        value = self.requests.get(resource)
        return value if value is not None and value > 0 else None

    def limit(self, resource: str) -> int | None:
        """The limit for ``resource``; None when absent or not positive (no limit)."""
        value = self.limits.get(resource)
        return value if value is not None and value > 0 else None


@dataclass(frozen=True)
class ExtendedResourceSpec:
    """The annotation's containers by name, and notes on quantities that count as unset."""

    containers: Mapping[str, ContainerResources] = field(default_factory=lambda: MappingProxyType({}))
    notes: tuple[str, ...] = ()

    def container(self, name: str) -> ContainerResources | None:
        return self.containers.get(name)

    def pod_request(self, resource: str) -> int | None:
        """The sum of the containers' positive requests; None when none has one."""
        values = [value for entry in self.containers.values() if (value := entry.request(resource)) is not None]
        return sum(values) if values else None

    def pod_limit(self, resource: str) -> int | None:
        """The sum of the containers' limits; None (no limit) once a container has none, or
        when no container is listed."""
        values = [entry.limit(resource) for entry in self.containers.values()]
        if not values or any(value is None for value in values):
            return None
        return sum(value for value in values if value is not None)


def quantity_at(value: object, where: str) -> int:
    """A quantity field of an annotation (null is 0), its errors prefixed with where it stands."""
    if value is None:
        return 0
    try:
        return quantity_value(value)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _container(value: object, where: str) -> ContainerResources:
    if value is None:
        return ContainerResources()
    if not isinstance(value, GoObject):
        raise ValueError(f"{where} must be an object, got {json_kind(value)}")
    found = struct_fields(value, ("requests", "limits"))
    requests = merged_map(found["requests"], f"{where}.requests", quantity_at) or {}
    limits = merged_map(found["limits"], f"{where}.limits", quantity_at) or {}
    return ContainerResources(requests=MappingProxyType(requests), limits=MappingProxyType(limits))


def _notes(containers: Mapping[str, ContainerResources]) -> tuple[str, ...]:
    notes: list[str] = []
    for name, entry in containers.items():
        for kind, values in (("requests", entry.requests), ("limits", entry.limits)):
            notes.extend(
                f"containers[{name}].{kind}[{resource}] is {value}: not positive, counts as unset"
                for resource, value in values.items()
                if value <= 0
            )
    return tuple(notes)


def _decode(text: str) -> ExtendedResourceSpec:
    data = annotation_json.loads(text)
    if data is None:
        return ExtendedResourceSpec()
    if not isinstance(data, GoObject):
        raise ValueError(f"must be a JSON object, got {json_kind(data)}")
    containers = merged_map(struct_fields(data, ("containers",))["containers"], "containers", _container) or {}
    return ExtendedResourceSpec(MappingProxyType(containers), _notes(containers))


def read_extended_resource_spec(annotations: Mapping[str, str]) -> tuple[ExtendedResourceSpec | None, str]:
    """The pod's extended-resource spec and a problem ("" when none); see the module doc.

    ``(None, "")`` without the annotation, ``(None, reason)`` when it is ignored."""
    text = annotations.get(EXTENDED_RESOURCE_SPEC_ANNOTATION)
    if text is None:
        return None, ""
    return _read(text)


# Several plugins read the same pod's annotation in one hook call (cpu, memory, batch_memory):
# decoded once per text (about 25 us each); the answers are immutable, so sharing them is safe.
# A few entries cover the calls in flight; few, as an annotation may be large (256 KiB).
@functools.lru_cache(maxsize=32)
def _read(text: str) -> tuple[ExtendedResourceSpec | None, str]:
    try:
        return _decode(text), ""
    except (ValueError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        return None, f"annotation {EXTENDED_RESOURCE_SPEC_ANNOTATION} ignored: {reason}"
