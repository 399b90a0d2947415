"""The documentation's links resolve, and its text speaks about the product, not about the work.

Every relative link in a Markdown file of the repository (README.md, docs/, bench/, systemd/,
examples/) must name a file or folder that exists, and a `#fragment` must name a heading of the
target file as GitHub makes anchors of them. Work-history markers (the words session or issue
followed by a number) must not appear in them, nor in the code, tests, benchmarks and build files;
links to other projects' issues are fine.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC_ROOTS = ("README.md", "docs", "bench", "systemd", "examples")
# Everything else tracked that a newcomer reads: code, tests, build and CI files.
SOURCE_ROOTS = ("runtimeproxy", "hooks", "tests", "bench", "api", "systemd", "examples", ".ci",
                "pyproject.toml", "setup.py", "tox.ini")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HISTORY = re.compile(r"\b(?:sessions?|issues?)\s+\d+", re.IGNORECASE)


def tracked(roots: tuple[str, ...]) -> list[Path]:
    """The files under ``roots`` that git tracks or would track (build output and caches are not)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *roots],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    return sorted(REPO / name for name in listed.split("\0") if name and (REPO / name).is_file())


def markdown_files() -> list[Path]:
    return [path for path in tracked(DOC_ROOTS) if path.suffix == ".md"]


def history_lines(path: Path) -> list[str]:
    """The lines of ``path`` that name a session or an issue by number (web addresses left out)."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:  # a binary file
        return []
    return [line.strip() for line in text.splitlines() if HISTORY.search(re.sub(r"https?://\S+", "", line))]


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text))


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for line in prose(path.read_text()):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


FILES = markdown_files()


def test_the_documentation_is_found() -> None:
    names = {path.relative_to(REPO).as_posix() for path in FILES}
    assert {"README.md", "docs/README.md", "docs/performance.md", "systemd/INSTALL.md"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for line in prose(path.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            name, _, fragment = target.partition("#")
            dest = (path.parent / name).resolve() if name else path
            if not dest.exists():
                broken.append(f"{target}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{target}: no heading with anchor #{fragment}")
    assert not broken, broken


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_work_history(path: Path) -> None:
    assert not history_lines(path)


def test_no_work_history_in_code_and_tests() -> None:
    found = {path.relative_to(REPO).as_posix(): lines
             for path in tracked(SOURCE_ROOTS) if (lines := history_lines(path))}
    assert not found, found


def test_the_readme_keeps_the_ci_test_command() -> None:
    """README's test command is the one .ci/run runs."""
    ci = (REPO / ".ci/run").read_text()
    command = "python3 -m pip install -q tox && python3 -m tox -e test,node"
    assert command in ci
    assert command in (REPO / "README.md").read_text()
