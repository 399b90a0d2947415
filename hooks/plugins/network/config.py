"""The ``network`` policy section: the shaped interface and its speed, and one band per class."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from ...qos import QoSClass
from ...settings import Invalid, SectionSettings, integer, parsed_by, show

_IFNAMSIZ: Final = 16  # linux/if.h, with the terminating NUL


def _interface(value: object, path: str) -> str:
    """A network interface name as the kernel accepts it (dev_valid_name), or "" for none."""
    if not isinstance(value, str):
        raise Invalid(path, f'must be an interface name (a string, "" for none), got {show(value)}')
    if value == "":
        return value
    if (
        len(value.encode()) >= _IFNAMSIZ
        or value in (".", "..")
        or any(char in "/:" or char.isspace() or not char.isprintable() for char in value)
    ):
        reason = "at most 15 bytes, no '/', ':', space or control character"
        raise Invalid(path, f"{show(value)} is not a valid interface name ({reason})")
    return value


@dataclass(frozen=True)
class NetworkBandSettings:
    """One egress band: guaranteed ``rate_percent`` and ``ceil_percent`` of the link speed, HTB ``priority``."""

    rate_percent: int = field(metadata=parsed_by(integer(1, 100, "a percentage")))
    ceil_percent: int = field(metadata=parsed_by(integer(1, 100, "a percentage")))
    priority: int = field(metadata=parsed_by(integer(0, 7)))

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.rate_percent > self.ceil_percent:
            yield "rate_percent", f"{self.rate_percent} is above ceil_percent ({self.ceil_percent})"


@dataclass(frozen=True)
class NetworkSection:
    """``interface``: the shaped interface, "" = network QoS off. ``link_speed_mbit``: its speed,
    0 = read /sys/class/net/<interface>/speed."""

    interface: str = field(metadata=parsed_by(_interface))
    link_speed_mbit: int = field(metadata=parsed_by(integer(0)))


# The network band of each class, as Koordinator's tc plugin groups them (GetPodNetQoSClassByName).
NETWORK_BANDS: Final[Mapping[QoSClass, QoSClass]] = MappingProxyType(
    {
        QoSClass.LSE: QoSClass.LS,
        QoSClass.LSR: QoSClass.LS,
        QoSClass.LS: QoSClass.LS,
        QoSClass.BE: QoSClass.BE,
        QoSClass.SYSTEM: QoSClass.SYSTEM,
    }
)


@dataclass(frozen=True)
class NetworkConfig:
    """The whole ``network`` section as the shaper uses it: the interface, its speed and the bands."""

    interface: str
    link_speed_mbit: int
    SYSTEM: NetworkBandSettings
    LS: NetworkBandSettings
    BE: NetworkBandSettings


def network_config(section: NetworkSection, settings_for: Callable[[QoSClass], NetworkBandSettings]) -> NetworkConfig:
    """The config from the handlers' ``section`` and ``settings_for``."""
    bands = {band.value: settings_for(band) for band in (QoSClass.SYSTEM, QoSClass.LS, QoSClass.BE)}
    return NetworkConfig(section.interface, section.link_speed_mbit, **bands)


def check_rates(section: SectionSettings) -> Iterator[tuple[str, str]]:
    """The bands' guaranteed rates must fit in the link together."""
    rates = {name: entry.rate_percent for name, entry in section.entries.items()}
    total = sum(rates.values())
    if total > 100:
        listed = " + ".join(f"{name} {rate}" for name, rate in rates.items())
        yield "", f"the bands' rate_percent add up to {total} ({listed}), more than 100"
