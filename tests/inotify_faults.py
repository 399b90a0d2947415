"""For the tests of what watches a directory (hook registry, policy file): inotify made to fail,
and the warnings that say a directory is polled instead."""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence
from typing import Any, NoReturn

import pytest

from runtimeproxy.common.dirwatch import DirWatch


def fail_inotify(monkeypatch: pytest.MonkeyPatch, code: int, call: str) -> str:
    """Make every DirWatch.open fail as ``call`` (inotify_init1, inotify_add_watch) does with
    errno ``code``; the error text the watcher then logs."""
    text = f"{call}: {os.strerror(code)}"

    def fail(self: DirWatch) -> NoReturn:
        raise OSError(code, text)

    monkeypatch.setattr(DirWatch, "open", fail)
    return text


def not_watched_errors(logs: Sequence[MutableMapping[str, Any]], what: str) -> list[str]:
    """The errors of the "<what> not watched; polling it" warnings, in order."""
    return [e["error"] for e in logs if e["event"] == f"{what} not watched; polling it"]
