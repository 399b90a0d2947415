"""Reading a registry's samples as a scrape shows them (tests of the daemons' metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families


def samples_of(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample named ``name`` in ``registry``'s exposition, by its sorted labels."""
    text = generate_latest(registry).decode()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }
