"""Hypothesis strategies shared by several test folders."""

from __future__ import annotations

from hypothesis import strategies as st
from runtimeproxy.hooks.plugins.network import NetworkBandSettings


@st.composite
def network_bands(draw: st.DrawFn) -> dict[str, NetworkBandSettings]:
    """The network plugin's bands as its policy section accepts them, by band name: each
    rate <= its ceiling, the rates adding up to at most 100."""
    system = draw(st.integers(1, 98))
    ls = draw(st.integers(1, 99 - system))
    be = draw(st.integers(1, 100 - system - ls))
    return {
        name: NetworkBandSettings(
            rate_percent=rate, ceil_percent=draw(st.integers(rate, 100)), priority=draw(st.integers(0, 7))
        )
        for name, rate in (("LS", ls), ("BE", be), ("SYSTEM", system))
    }
