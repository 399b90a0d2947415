"""CgroupFS resolves paths part by part from remembered parents: the answers must be exactly
os.path.realpath's, links at any depth (absolute, relative, dangling, chained) and missing
parts included."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from runtimeproxy.hooks.cgroups import CgroupFS

NAMES = ("a", "b", "c")
# Each entry: where (a path of NAMES below the root), and what: a directory, or a link to
# another such path (absolute or relative), or to a path that does not exist.
where = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(tuple)
entry = st.tuples(where, st.sampled_from(("dir", "abs", "rel", "dangling")), where)


def _plant(root: Path, entries: list[tuple[tuple[str, ...], str, tuple[str, ...]]]) -> None:
    for at, kind, to in entries:
        path = root.joinpath(*at)
        if not path.parent.is_dir() or os.path.lexists(path):
            continue  # parents first; the first entry at a place wins
        if kind == "dir":
            path.mkdir()
        elif kind == "abs":
            path.symlink_to(root.joinpath(*to))
        elif kind == "rel":
            path.symlink_to(os.path.relpath(root.joinpath(*to), path.parent))
        else:
            path.symlink_to(root / "missing" / to[0])


@settings(max_examples=60, deadline=None)
@given(st.lists(entry, max_size=12), st.lists(where, min_size=1, max_size=6))
def test_each_path_resolves_as_os_path_realpath_does(
    entries: list[tuple[tuple[str, ...], str, tuple[str, ...]]], asked: list[tuple[str, ...]]
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        _plant(root, entries)
        fs = CgroupFS(root)
        for parts in asked:  # in turn, so later ones find their parents remembered
            for n in range(len(parts) + 1):
                path = root.joinpath(*parts[:n])
                assert fs._realpath(path) == os.path.realpath(path), path
                assert fs._realpath(str(path) + "/x") == os.path.realpath(str(path) + "/x")


def test_a_relative_or_dotted_path_is_left_to_os_path_realpath(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    fs = CgroupFS(tmp_path)
    assert fs._realpath(f"{tmp_path}/d/..") == os.path.realpath(tmp_path)
    assert fs._realpath(f"{tmp_path}/d/.") == os.path.realpath(tmp_path / "d")
    assert fs._realpath("relative/x") == os.path.realpath("relative/x")
