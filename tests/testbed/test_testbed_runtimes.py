"""The containerd builds the test bed runs (runtimeproxy/testbed/runtimes.py): versions, the
system's apt sources, apt with its own state, the cache, and a whole fetch against fake apt
tools (offline). The real fetch runs in .ci/system-deps.sh; every end-to-end test then uses
its result."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtimeproxy.testbed import runtimes
from runtimeproxy.testbed.runtimes import (
    AptSource,
    ContainerdBuild,
    PrivateApt,
    RuncBuild,
    RuntimeFetchError,
    binary_version,
    cached_builds,
    codename,
    debian_mirror,
    fetch,
    locate,
    parse_deb822_sources,
    parse_one_line_sources,
    render_deb822,
    series_of,
    system_sources,
    upstream_version,
)

SOURCES = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_containerd_tree(bin_dir: Path, version_line: str) -> None:
    """The three binaries a build needs, `containerd --version` printing `version_line`."""
    executable(bin_dir / "containerd", f"#!/bin/sh\necho '{version_line}'\n")
    executable(bin_dir / "containerd-shim-runc-v2")
    executable(bin_dir / "ctr")


# -- versions ---------------------------------------------------------------------------------

SUFFIXES = ["", "~ds1", "~ds1-6+deb13u1", "-1", "+b2", "~rc.1", "-rc.0+dirty"]


@given(
    st.integers(0, 999),
    st.integers(0, 999),
    st.integers(0, 999),
    st.sampled_from(SUFFIXES),
    st.sampled_from(["", "v", "1:", "12:"]),
)
def test_upstream_version_of_debian_and_upstream_strings(
    major: int, minor: int, patch: int, suffix: str, prefix: str
) -> None:
    text = f"{prefix}{major}.{minor}.{patch}{suffix}"
    assert upstream_version(text) == f"{major}.{minor}.{patch}"
    assert series_of(text) == (f"{major}.x" if major == 2 else f"{major}.{minor}")


@pytest.mark.parametrize(("version", "series"), [("1.6.20", "1.6"), ("1.7.24~ds1", "1.7"),
                                                 ("2.1.9~ds1-1", "2.x"), ("2.0.0", "2.x"),
                                                 ("3.0.1", "3.0")])
def test_series_of_follows_the_matrix(version: str, series: str) -> None:
    """The 2.x series takes any 2.x release; other series are major.minor."""
    assert series_of(version) == series


@given(st.text(max_size=40))
def test_upstream_version_of_any_text_is_a_version_in_it_or_value_error(text: str) -> None:
    try:
        version = upstream_version(text)
    except ValueError as exc:
        assert "not a containerd version" in str(exc)
        return
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert version.split(".")[0] in text


@pytest.mark.parametrize("text", ["", "containerd", "1.7", "v1.x.2", "x1.7.24", "~1.7.24"])
def test_upstream_version_refuses_non_versions(text: str) -> None:
    with pytest.raises(ValueError, match="not a containerd version"):
        upstream_version(text)


def test_binary_version_reads_the_third_field(tmp_path: Path) -> None:
    line = "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1"
    assert binary_version(str(executable(tmp_path / "c", f"#!/bin/sh\necho '{line}'\n"))) == "1.7.24"
    upstream = "containerd github.com/containerd/containerd v1.7.24 88bf19b2105c8b17560993bee28a01ddc2f97182"
    assert binary_version(str(executable(tmp_path / "u", f"#!/bin/sh\necho '{upstream}'\n"))) == "1.7.24"


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ("#!/bin/sh\necho broken >&2\nexit 3\n", r"--version failed \(3\).*broken"),
        ("#!/bin/sh\necho containerd\n", r"--version failed \(0\)"),
        ("#!/bin/sh\necho containerd github.com/containerd/containerd dev\n", "not a containerd version"),
    ],
    ids=["fails", "too-short", "no-version"],
)
def test_binary_version_errors_name_the_cause(tmp_path: Path, script: str, error: str) -> None:
    with pytest.raises(RuntimeFetchError, match=error):
        binary_version(str(executable(tmp_path / "containerd", script)))


def test_binary_version_of_a_missing_binary(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFetchError, match=r"cannot run .*nothing-here"):
        binary_version(str(tmp_path / "nothing-here"))


# -- apt sources ------------------------------------------------------------------------------


def test_deb822_sources_one_source_per_uri_disabled_and_source_only_left_out() -> None:
    text = (
        SOURCES
        + """
Types: deb deb-src
URIs: http://a.example/debian http://b.example/debian
Suites: trixie
Components: main contrib

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
Components: main

Enabled: no
Types: deb
URIs: http://off.example/debian
Suites: bookworm
Components: main
"""
    )
    found = parse_deb822_sources(text)
    assert [s.uri for s in found] == [
        "http://mirror.example/debian",
        "http://mirror.example/debian-security",
        "http://a.example/debian",
        "http://b.example/debian",
    ]
    assert found[0] == AptSource(
        "http://mirror.example/debian",
        ("bookworm", "bookworm-updates"),
        ("main",),
        "/usr/share/keyrings/debian-archive-keyring.gpg",
    )
    assert found[2].components == ("main", "contrib") and found[2].signed_by == ""


def test_one_line_sources_with_options_and_comments() -> None:
    text = """\
# deb http://commented.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://m.example/debian bookworm main contrib # note
deb-src http://m.example/debian bookworm main
deb http://plain.example/debian bookworm-security main
not a source line
deb http://short.example/debian
"""
    assert parse_one_line_sources(text) == [
        AptSource("http://m.example/debian", ("bookworm",), ("main", "contrib"), "/usr/share/keyrings/k.gpg"),
        AptSource("http://plain.example/debian", ("bookworm-security",), ("main",), ""),
    ]


KEY_LINE = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=", max_size=20)


@given(
    uri=st.from_regex(r"https?://[a-z]{1,10}\.example/[a-z]{0,8}", fullmatch=True),
    suite=st.from_regex(r"[a-z]{3,10}(-[a-z]{3,8})?", fullmatch=True),
    signed_by=st.one_of(
        st.just(""),
        st.from_regex(r"/usr/share/keyrings/[a-z-]{1,20}\.gpg", fullmatch=True),
        st.lists(KEY_LINE, min_size=1, max_size=6).map(
            lambda lines: "\n".join(
                ["-----BEGIN PGP PUBLIC KEY BLOCK-----", *lines, "-----END PGP PUBLIC KEY BLOCK-----"]
            )
        ),
    ),
)
def test_rendered_stanza_parses_back(uri: str, suite: str, signed_by: str) -> None:
    """Our sources entry for another suite keeps the mirror and its keyring (a path or an
    inline key whose empty lines deb822 writes as ".")."""
    mirror = AptSource(uri, ("bookworm",), ("main",), signed_by)
    assert parse_deb822_sources(render_deb822(mirror, suite)) == [AptSource(uri, (suite,), ("main",), signed_by)]


def test_system_sources_reads_the_files_apt_reads(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("deb http://list.example/debian bookworm main\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(SOURCES)
    (tmp_path / "sources.list.d" / "extra.list").write_text("deb http://extra.example/debian bookworm main\n")
    (tmp_path / "sources.list.d" / "other.sources.disabled").write_text(SOURCES.replace("mirror", "disabled"))
    uris = [s.uri for s in system_sources(tmp_path)]
    assert uris == [
        "http://list.example/debian",
        "http://mirror.example/debian",
        "http://mirror.example/debian-security",
        "http://extra.example/debian",
    ]
    assert system_sources(tmp_path / "missing") == []


def test_debian_mirror_is_the_source_of_the_system_suite() -> None:
    sources = parse_deb822_sources(SOURCES)
    assert debian_mirror(list(reversed(sources)), "bookworm").uri == "http://mirror.example/debian"
    no_main = [AptSource("http://x.example/debian", ("bookworm",), ("contrib",))]
    with pytest.raises(RuntimeFetchError, match=r"no apt source serves trixie main .*mirror\.example/debian bookworm"):
        debian_mirror(sources, "trixie")
    with pytest.raises(RuntimeFetchError, match=r"sources: http://x\.example/debian bookworm"):
        debian_mirror(no_main, "bookworm")
    with pytest.raises(RuntimeFetchError, match=r"\(sources: none\)"):
        debian_mirror([], "bookworm")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nVERSION_CODENAME=bookworm\nID=debian\n', "bookworm"),
        ('VERSION_CODENAME="trixie"\n', "trixie"),
    ],
)
def test_codename(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "os-release").write_text(text)
    assert codename(tmp_path / "os-release") == expected


@pytest.mark.parametrize("text", ["ID=alpine\n", "VERSION_CODENAME=\n"])
def test_codename_missing_is_an_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "os-release").write_text(text)
    with pytest.raises(RuntimeFetchError, match="names no VERSION_CODENAME"):
        codename(tmp_path / "os-release")


def test_private_apt_keeps_to_its_own_directories(tmp_path: Path) -> None:
    mirror = AptSource("http://mirror.example/debian", ("bookworm",), ("main",), "/k.gpg")
    apt = PrivateApt(tmp_path / "apt", mirror, "trixie")
    assert (tmp_path / "apt" / "sources.list").read_text() == ""
    stanza = (tmp_path / "apt" / "sources.list.d" / "trixie.sources").read_text()
    assert parse_deb822_sources(stanza) == [AptSource(mirror.uri, ("trixie",), ("main",), "/k.gpg")]
    # apt itself resolves its lists, sources and cache (downloads included) to them.
    keys = [
        "L",
        "Dir::State::Lists/d",
        "S",
        "Dir::Etc::SourceList/f",
        "P",
        "Dir::Etc::SourceParts/d",
        "C",
        "Dir::Cache/d",
        "A",
        "Dir::Cache::Archives/d",
    ]
    shell = subprocess.run(["apt-config", *apt.options(), "shell", *keys], capture_output=True, text=True, check=True)
    root = tmp_path / "apt"
    assert dict(line.split("=", 1) for line in shell.stdout.splitlines()) == {
        "L": f"'{root}/lists/'",
        "S": f"'{root}/sources.list'",
        "P": f"'{root}/sources.list.d/'",
        "C": f"'{root}/cache/'",
        "A": f"'{root}/cache/archives/'",
    }


# -- builds and the cache ---------------------------------------------------------------------


def test_build_binaries_and_path(tmp_path: Path) -> None:
    build = ContainerdBuild("9.9.1", tmp_path / "bin")
    assert build.binary("ctr") == str(tmp_path / "bin" / "ctr")
    assert build.env({"PATH": "/usr/bin"})["PATH"] == f"{tmp_path / 'bin'}{os.pathsep}/usr/bin"
    assert sorted(build.missing()) == sorted(runtimes.BINARIES)
    fake_containerd_tree(tmp_path / "bin", "x")
    assert build.missing() == [] and build.series == "9.9"
    system = ContainerdBuild("1.6.20")
    assert system.binary("ctr") == "ctr" and system.env({"PATH": "/p"}) == {"PATH": "/p"}
    assert system.label == "containerd 1.6.20 (system)"


def test_cached_builds_are_complete_ones_by_version(tmp_path: Path) -> None:
    for version in ("9.9.10", "9.9.9", "9.8.0"):
        fake_containerd_tree(tmp_path / f"containerd-{version}" / "usr" / "bin", version)
    (tmp_path / "containerd-9.9.11" / "usr" / "bin").mkdir(parents=True)  # incomplete
    fake_containerd_tree(tmp_path / "containerd-dev" / "usr" / "bin", "dev")  # no version
    (tmp_path / ".fetch-abc").mkdir()
    assert [b.version for b in cached_builds(tmp_path)] == ["9.8.0", "9.9.9", "9.9.10"]
    assert locate("9.9", tmp_path) == ContainerdBuild("9.9.10", tmp_path / "containerd-9.9.10" / "usr" / "bin")
    with pytest.raises(RuntimeFetchError, match=r"no containerd 9\.7: .* holds no containerd-9\.7\.\* .*ensure"):
        locate("9.7", tmp_path)
    assert cached_builds(tmp_path / "missing") == []


def test_cache_dir_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(runtimes.CACHE_ENV, str(tmp_path))
    assert runtimes.cache_dir() == tmp_path
    monkeypatch.delenv(runtimes.CACHE_ENV)
    assert runtimes.cache_dir() == runtimes.DEFAULT_CACHE


def test_ensure_refuses_an_unknown_series(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFetchError, match=r"unknown containerd series '0\.1' \(known: 1\.6, 1\.7, 2\.x\)"):
        runtimes.ensure("0.1", tmp_path)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_containerd_tree(tmp_path / "containerd-9.9.1" / "usr" / "bin", "x")
    assert runtimes.main(["--cache", str(tmp_path), "list"]) == 0
    assert f"containerd 9.9.1 ({tmp_path}/containerd-9.9.1/usr/bin)" in capsys.readouterr().out.splitlines()
    assert runtimes.main(["--cache", str(tmp_path), "ensure", "0.1"]) == 1
    assert "runtimes: unknown containerd series '0.1'" in capsys.readouterr().err


# -- a whole fetch, against fake apt tools ----------------------------------------------------


FAKE_APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$FAKE_APT_LOG"
for arg in "$@"; do last="$arg"; done
case " $* " in
  *" update "*) exit 0 ;;
  *" download "*) cp "$FAKE_DEB" "./$(echo "$last" | cut -d= -f1)_$(echo "$last" | cut -d= -f2)_amd64.deb" ;;
  *) exit 9 ;;
esac
"""
FAKE_APT_CACHE = """#!/bin/sh
echo "apt-cache $*" >> "$FAKE_APT_LOG"
printf 'Package: containerd\\nVersion: %s\\nArchitecture: amd64\\n' "$FAKE_VERSION"
"""


def build_deb(tmp_path: Path, version: str, reports: str) -> Path:
    """A containerd .deb whose containerd binary reports `reports`."""
    tree = tmp_path / f"deb-{reports}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: containerd\nVersion: {version}\nArchitecture: amd64\nMaintainer: test <t@example>\n"
        "Description: fake\n"
    )
    fake_containerd_tree(tree / "usr" / "bin", f"containerd github.com/containerd/containerd {reports} x")
    deb = tmp_path / f"containerd-{reports}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)], check=True, capture_output=True)
    return deb


@pytest.fixture
def fake_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """apt-get and apt-cache on PATH that log their arguments and serve one fake .deb; an
    /etc/apt and os-release naming a bookworm mirror. Returns the log file."""
    bin_dir = tmp_path / "fakebin"
    executable(bin_dir / "apt-get", FAKE_APT_GET)
    executable(bin_dir / "apt-cache", FAKE_APT_CACHE)
    log = tmp_path / "apt.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APT_LOG", str(log))
    monkeypatch.setenv("FAKE_VERSION", "9.9.3~ds1-1")
    monkeypatch.setenv("FAKE_DEB", str(build_deb(tmp_path, "9.9.3~ds1-1", "9.9.3~ds1")))
    (tmp_path / "etc" / "sources.list.d").mkdir(parents=True)
    (tmp_path / "etc" / "sources.list.d" / "debian.sources").write_text(SOURCES)
    (tmp_path / "os-release").write_text("VERSION_CODENAME=bookworm\n")
    return log


def test_fetch_unpacks_the_suite_package_into_the_cache(tmp_path: Path, fake_apt: Path) -> None:
    cache = tmp_path / "cache"
    build = fetch("trixie", cache, etc=tmp_path / "etc", os_release=tmp_path / "os-release")
    dest = cache / "containerd-9.9.3"
    assert build == ContainerdBuild("9.9.3", dest / "usr" / "bin") and build.missing() == []
    assert json.loads((dest / "source.json").read_text()) == {
        "package": "containerd",
        "version": "9.9.3~ds1-1",
        "suite": "trixie",
        "mirror": "http://mirror.example/debian",
        "deb": "containerd_9.9.3~ds1-1_amd64.deb",
    }
    assert sorted(p.name for p in cache.iterdir()) == ["containerd-9.9.3"]  # no work files left
    calls = fake_apt.read_text().splitlines()
    assert [c.split()[-1] for c in calls] == ["--error-on=any", "containerd/trixie", "containerd=9.9.3~ds1-1"]
    for call in calls:  # every apt call on its own state, never the system's
        for key in ("Dir::State::Lists", "Dir::Etc::SourceList", "Dir::Etc::SourceParts", "Dir::Cache"):
            assert re.search(rf"-o {key}={re.escape(str(cache))}/\.fetch-\w+/apt/", call), (key, call)
    # Fetched once: a second fetch finds it (apt asked for the version, nothing downloaded).
    fake_apt.write_text("")
    assert fetch("trixie", cache, etc=tmp_path / "etc", os_release=tmp_path / "os-release") == build
    assert [c.split()[-1] for c in fake_apt.read_text().splitlines()] == ["--error-on=any", "containerd/trixie"]


def test_fetch_refuses_a_package_whose_binary_reports_another_version(
    tmp_path: Path, fake_apt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_DEB", str(build_deb(tmp_path, "9.9.3~ds1-1", "9.9.4")))
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeFetchError, match=r"unpacked containerd reports 9\.9\.4, the package 9\.9\.3"):
        fetch("trixie", cache, etc=tmp_path / "etc", os_release=tmp_path / "os-release")
    assert list(cache.iterdir()) == []


def test_fetch_reports_apt_failures(tmp_path: Path, fake_apt: Path) -> None:
    executable(tmp_path / "fakebin" / "apt-get", "#!/bin/sh\necho 'E: mirror unreachable' >&2\nexit 100\n")
    with pytest.raises(RuntimeFetchError, match=r"update --error-on=any failed \(100\):\nE: mirror unreachable"):
        fetch("trixie", tmp_path / "cache", etc=tmp_path / "etc", os_release=tmp_path / "os-release")


# -- 2.x follows sid; sid's runc --------------------------------------------------------------


def build_runc_deb(tmp_path: Path, version: str) -> Path:
    """A runc .deb: /usr/sbin/runc (never run: sid's needs a newer glibc than the host's)."""
    tree = tmp_path / f"runc-deb-{version}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: runc\nVersion: {version}\nArchitecture: amd64\nMaintainer: test <t@example>\nDescription: fake\n"
    )
    executable(tree / "usr" / "sbin" / "runc", "#!/bin/sh\nexit 1\n")
    deb = tmp_path / f"runc-{version}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)], check=True, capture_output=True)
    return deb


@pytest.fixture
def sid(tmp_path: Path, fake_apt: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """fake_apt serving sid's containerd 2.1.9, the runtime cache at tmp_path/cache and
    /etc/apt and os-release of fake_apt as the system's. Returns the cache."""
    monkeypatch.setenv("FAKE_VERSION", "2.1.9~ds1-1")
    monkeypatch.setenv("FAKE_DEB", str(build_deb(tmp_path, "2.1.9~ds1-1", "2.1.9~ds1")))
    monkeypatch.setattr(runtimes, "APT_ETC", tmp_path / "etc")
    monkeypatch.setattr(runtimes, "OS_RELEASE", tmp_path / "os-release")
    for name in ("fetch", "fetch_runc"):  # their defaults were bound at definition
        original = getattr(runtimes, name)
        monkeypatch.setattr(runtimes, name, lambda *a, _f=original, **k: _f(
            *a, etc=tmp_path / "etc", os_release=tmp_path / "os-release", **k))
    cache = tmp_path / "cache"
    cache.mkdir()
    return cache


def test_2x_is_sids_current_release_fetched_beside_the_cached_one(sid: Path, fake_apt: Path) -> None:
    fake_containerd_tree(sid / "containerd-2.0.1" / "usr" / "bin", "containerd x 2.0.1 y")
    said: list[str] = []
    build = runtimes.ensure("2.x", sid, log=said.append)
    assert build == ContainerdBuild("2.1.9", sid / "containerd-2.1.9" / "usr" / "bin") and said == []
    assert [b.version for b in cached_builds(sid)] == ["2.0.1", "2.1.9"]  # the old one kept
    assert [c.split()[-1] for c in fake_apt.read_text().splitlines()] == [
        "--error-on=any", "containerd/sid", "containerd=2.1.9~ds1-1"]


def test_a_fixed_series_in_the_cache_asks_no_mirror(sid: Path, fake_apt: Path) -> None:
    fake_containerd_tree(sid / "containerd-1.7.24" / "usr" / "bin", "containerd x 1.7.24 y")
    assert runtimes.ensure("1.7", sid).version == "1.7.24"
    assert not fake_apt.exists()


def test_2x_goes_on_with_the_cached_build_when_sid_cannot_be_asked(sid: Path, tmp_path: Path) -> None:
    executable(tmp_path / "fakebin" / "apt-get", "#!/bin/sh\necho 'E: mirror unreachable' >&2\nexit 100\n")
    fake_containerd_tree(sid / "containerd-2.0.1" / "usr" / "bin", "containerd x 2.0.1 y")
    said: list[str] = []
    cached = ContainerdBuild("2.0.1", sid / "containerd-2.0.1" / "usr" / "bin")
    assert runtimes.ensure("2.x", sid, log=said.append) == cached
    assert said == ["runtimes: containerd 2.x: could not ask Debian for its current release (E: mirror unreachable); "
                    f"using the cached containerd 2.0.1 ({sid}/containerd-2.0.1/usr/bin)"]
    (sid / "containerd-2.0.1").rename(sid / "elsewhere")  # nothing cached: the apt error itself
    with pytest.raises(RuntimeFetchError, match=r"update --error-on=any failed \(100\):\nE: mirror unreachable"):
        runtimes.ensure("2.x", sid, log=said.append)


def test_sids_runc_is_fetched_by_version_and_found_offline(
    sid: Path, tmp_path: Path, fake_apt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RuntimeFetchError, match=r"holds no runc-\* .*ensure runc"):
        runtimes.locate_runc(sid)
    monkeypatch.setenv("FAKE_VERSION", "1.3.6+ds1-1")
    monkeypatch.setenv("FAKE_DEB", str(build_runc_deb(tmp_path, "1.3.6+ds1-1")))
    runc = runtimes.ensure_runc(sid)
    assert runc == RuncBuild("1.3.6", sid / "runc-1.3.6") and runc.binary.is_file()
    assert json.loads((sid / "runc-1.3.6" / "source.json").read_text())["version"] == "1.3.6+ds1-1"
    assert [c.split()[-1] for c in fake_apt.read_text().splitlines()][-2:] == ["runc/sid", "runc=1.3.6+ds1-1"]
    executable(tmp_path / "fakebin" / "apt-get", "#!/bin/sh\nexit 100\n")
    said: list[str] = []
    assert runtimes.ensure_runc(sid, log=said.append) == runc
    assert len(said) == 1 and said[0].startswith("runtimes: runc: could not ask Debian") and str(sid) in said[0]
    assert runtimes.main(["--cache", str(sid), "list"]) == 0


def test_a_runc_package_without_the_binary_is_refused(
    sid: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VERSION", "1.3.6+ds1-1")
    monkeypatch.setenv("FAKE_DEB", str(build_deb(tmp_path, "1.3.6+ds1-1", "1.3.6")))  # a containerd tree
    with pytest.raises(RuntimeFetchError, match=r"the runc package 1\.3\.6\+ds1-1 has no /usr/sbin/runc"):
        runtimes.ensure_runc(sid, log=lambda line: None)
    assert [p.name for p in sid.iterdir()] == []
