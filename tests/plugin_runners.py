"""Fixtures for tests that make PluginRunners: each closes (or stops) the runners the test made
(a pytest plugin: conftest.py loads it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from runtimeproxy.hooks.plugin_runner import PluginRunner


@pytest.fixture
def runners() -> Iterator[list[PluginRunner]]:
    """A list to add runners to; each is closed after the test."""
    made: list[PluginRunner] = []
    yield made
    for runner in made:
        runner.close()


@pytest.fixture
async def stopped_runners() -> AsyncIterator[list[PluginRunner]]:
    """`runners` for tests whose runners start tasks on the loop: each is stopped (awaited) after the test."""
    made: list[PluginRunner] = []
    yield made
    for runner in made:
        await runner.stop()
