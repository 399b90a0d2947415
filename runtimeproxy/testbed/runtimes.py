"""The containerd builds the test bed runs: the system's, and Debian releases' extracted
into a cache directory (never installed over the system's).

The end-to-end suites run against three containerd series: 1.6 (Debian bookworm), 1.7
(Debian trixie) and 2.x (whichever 2.x release Debian sid ships). Whichever of them the
system has installed is used from PATH; the others are fetched with apt from the Debian
mirror the system's apt already uses (a second sources entry for the other suite, with
apt's own lists, cache and source files so the
system's apt state stays as it was), and unpacked with ``dpkg-deb -x`` into
``<cache>/containerd-<version>/``. The cache is ``$RUNTIMEPROXY_RUNTIME_CACHE``, else
/var/cache/runtimeproxy-testbed.

"2.x" follows a moving suite: `ensure` asks sid for its current release each time and
fetches a newer one beside the cached ones; when the mirror cannot be reached it goes on
with the newest cached build (and says so). The real-node tier's 2.x flavour also needs
sid's runc (1.3, which needs a newer glibc than bookworm's: it runs in the node's trixie
root, not on this host): fetched the same way into ``<cache>/runc-<version>/``.

Standard library only, and runnable as a plain script, so that .ci/system-deps.sh can
fill the cache before the package is installed::

    python3 runtimeproxy/testbed/runtimes.py ensure     # every series and runc: present or fetched
    python3 runtimeproxy/testbed/runtimes.py list       # what is there
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

CACHE_ENV = "RUNTIMEPROXY_RUNTIME_CACHE"
DEFAULT_CACHE = Path("/var/cache/runtimeproxy-testbed")
APT_ETC = Path("/etc/apt")
OS_RELEASE = Path("/etc/os-release")
# The binaries a test bed needs from one build: the daemon, its runc shim, and ctr for
# image import. runc itself comes from the system (bookworm's runs 1.7 and 2.x fine; sid's
# runc needs a newer glibc than bookworm has, so only the node tier's guest runs it).
BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
# Each series the suites cover, and the Debian suite that ships it. "2.x" follows a whole
# major line: whatever 2.x release sid has is that series (the cache directory is named
# after the exact version, so a new release is fetched beside the old one).
SERIES_SUITES = {"1.6": "bookworm", "1.7": "trixie", "2.x": "sid"}
# The runc that goes with the 2.x series on a node (the real-node tier's 2.x flavour), and
# where its package puts the binary.
RUNC_SUITE = SERIES_SUITES["2.x"]
RUNC_BINARY = Path("usr/sbin/runc")
_VERSION = re.compile(r"v?(?:\d+:)?(\d+)\.(\d+)\.(\d+)")


class RuntimeFetchError(RuntimeError):
    """A containerd build could not be found or fetched."""


# -- versions ---------------------------------------------------------------------------


def upstream_version(text: str) -> str:
    """"1.7.24" from a Debian version ("1.7.24~ds1-6+deb13u1", epoch allowed) or an
    upstream tag ("v1.7.24"); ValueError for anything else."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise ValueError(f"not a containerd version: {text!r}")
    return ".".join(match.groups())


def series_of(version: str) -> str:
    """"1.7" for "1.7.24"; "2.x" for "2.1.9", since the series "2.x" covers the major line."""
    major, minor, _patch = upstream_version(version).split(".")
    whole_line = f"{major}.x"
    return whole_line if whole_line in SERIES_SUITES else f"{major}.{minor}"


def binary_version(binary: str, env: dict[str, str] | None = None) -> str:
    """The upstream version a containerd or ctr binary reports: `--version` prints
    "containerd github.com/containerd/containerd 1.7.24~ds1 <revision>"."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30,
                              check=False, env=env)
    except OSError as exc:
        raise RuntimeFetchError(f"cannot run {binary} --version: {exc}") from exc
    fields = done.stdout.split()
    if done.returncode != 0 or len(fields) < 3:
        raise RuntimeFetchError(f"{binary} --version failed ({done.returncode}): "
                                f"{(done.stdout + done.stderr).strip()!r}")
    try:
        return upstream_version(fields[2])
    except ValueError as exc:
        raise RuntimeFetchError(f"{binary} --version: {exc}") from exc


# -- builds -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerdBuild:
    """One set of containerd binaries. ``bin_dir`` None means the system's, from PATH."""

    version: str
    bin_dir: Path | None = None

    @property
    def series(self) -> str:
        return series_of(self.version)

    @property
    def major(self) -> int:
        """1 for "1.7.24": which config format and defaults the daemon has."""
        return int(self.version.split(".")[0])

    @property
    def label(self) -> str:
        where = "system" if self.bin_dir is None else str(self.bin_dir)
        return f"containerd {self.version} ({where})"

    def binary(self, name: str) -> str:
        """What to execute for `name`: a path in ``bin_dir``, or the bare name."""
        return name if self.bin_dir is None else str(self.bin_dir / name)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose PATH finds this build's binaries first: containerd looks
        its shim up on PATH, so 1.7's daemon must find 1.7's shim before the system's."""
        env = dict(os.environ if base is None else base)
        if self.bin_dir is not None:
            env["PATH"] = os.pathsep.join([str(self.bin_dir), env.get("PATH", os.defpath)])
        return env

    def missing(self) -> list[str]:
        """Binaries this build lacks (not found or not executable)."""
        env = self.env()
        return [name for name in BINARIES if shutil.which(self.binary(name), path=env["PATH"]) is None]


@dataclass(frozen=True)
class RuncBuild:
    """sid's runc, unpacked: ``root`` is the package's tree (``root``/usr/sbin/runc)."""

    version: str
    root: Path

    @property
    def binary(self) -> Path:
        return self.root / RUNC_BINARY

    @property
    def label(self) -> str:
        return f"runc {self.version} ({self.root})"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def system_build() -> ContainerdBuild | None:
    """The containerd on PATH, if any."""
    if shutil.which("containerd") is None:
        return None
    return ContainerdBuild(binary_version("containerd"))


def _version_key(build: ContainerdBuild) -> tuple[int, ...]:
    return tuple(int(part) for part in build.version.split("."))


def cached_builds(cache: Path | None = None) -> list[ContainerdBuild]:
    """Complete builds in the cache (every binary present), oldest first."""
    cache = cache_dir() if cache is None else cache
    builds = []
    for entry in sorted(cache.glob("containerd-*")) if cache.is_dir() else []:
        with contextlib.suppress(ValueError):
            build = ContainerdBuild(upstream_version(entry.name.removeprefix("containerd-")),
                                    entry / "usr" / "bin")
            if not build.missing():
                builds.append(build)
    return sorted(builds, key=_version_key)


def cached_runcs(cache: Path | None = None) -> list[RuncBuild]:
    """runc builds in the cache (the binary present), oldest first."""
    cache = cache_dir() if cache is None else cache
    found = []
    for entry in sorted(cache.glob("runc-*")) if cache.is_dir() else []:
        with contextlib.suppress(ValueError):
            build = RuncBuild(upstream_version(entry.name.removeprefix("runc-")), entry)
            if build.binary.is_file():
                found.append(build)
    return sorted(found, key=lambda build: tuple(int(part) for part in build.version.split(".")))


def locate_runc(cache: Path | None = None) -> RuncBuild:
    """The newest cached runc; RuntimeFetchError naming how to get one otherwise."""
    found = cached_runcs(cache)
    if found:
        return found[-1]
    where = cache_dir() if cache is None else cache
    raise RuntimeFetchError(f"{where} holds no runc-* (run `bash .ci/system-deps.sh` as root, or "
                            f"`python3 runtimeproxy/testbed/runtimes.py ensure runc`)")


def locate(series: str, cache: Path | None = None) -> ContainerdBuild:
    """The build for `series`: the system's if it is that series, else the newest
    cached one; RuntimeFetchError naming how to get it otherwise."""
    system = system_build()
    if system is not None and system.series == series:
        return system
    found = [build for build in cached_builds(cache) if build.series == series]
    if found:
        return found[-1]
    where = cache_dir() if cache is None else cache
    raise RuntimeFetchError(
        f"no containerd {series}: the system has {system.version if system else 'none'} and "
        f"{where} holds no containerd-{series}.* (run `bash .ci/system-deps.sh` as root, or "
        f"`python3 runtimeproxy/testbed/runtimes.py ensure`)")


# -- apt sources ------------------------------------------------------------------------


@dataclass(frozen=True)
class AptSource:
    """One repository of the system's apt sources (one URI of a deb822 stanza)."""

    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    # A keyring path, or an inline key block (deb822 only); "" for apt's default keyrings.
    signed_by: str = ""


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    """Field dicts (keys lower-cased) of a deb822 file; continuation lines joined with
    newlines, a lone "." standing for an empty line (as in inline keys)."""
    fields: dict[str, str] = {}
    key = ""
    for line in [*text.splitlines(), ""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if fields:
                yield fields
            fields, key = {}, ""
        elif line[0] in " \t" and key:
            value = line.strip()
            fields[key] += "\n" + ("" if value == "." else value)
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()


def parse_deb822_sources(text: str) -> list[AptSource]:
    """The binary ("deb") repositories of a ``.sources`` file, disabled ones left out."""
    found = []
    for fields in _deb822_stanzas(text):
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").strip().lower() in ("no", "false", "0"):
            continue
        suites = tuple(fields.get("suites", "").split())
        components = tuple(fields.get("components", "").split())
        for uri in fields.get("uris", "").split():
            found.append(AptSource(uri, suites, components, fields.get("signed-by", "").strip()))
    return found


_ONE_LINE = re.compile(r"^deb\s+(?:\[(?P<options>[^\]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)(?P<components>.*)$")


def parse_one_line_sources(text: str) -> list[AptSource]:
    """The ``deb`` lines of a ``sources.list``-style file."""
    found = []
    for line in text.splitlines():
        match = _ONE_LINE.match(line.split("#", 1)[0].strip())
        if match is None:
            continue
        options = dict(opt.partition("=")[::2] for opt in (match["options"] or "").split())
        found.append(AptSource(match["uri"], (match["suite"],), tuple(match["components"].split()),
                               options.get("signed-by", "")))
    return found


def system_sources(etc: Path = APT_ETC) -> list[AptSource]:
    """Every binary repository apt reads: sources.list, then sources.list.d/*.list and
    *.sources (the files apt itself reads; other names there are ignored, as apt does)."""
    found = []
    main = etc / "sources.list"
    if main.is_file():
        found += parse_one_line_sources(main.read_text(errors="replace"))
    parts = etc / "sources.list.d"
    for path in sorted(parts.iterdir()) if parts.is_dir() else []:
        if path.suffix == ".list":
            found += parse_one_line_sources(path.read_text(errors="replace"))
        elif path.suffix == ".sources":
            found += parse_deb822_sources(path.read_text(errors="replace"))
    return found


def codename(os_release: Path = OS_RELEASE) -> str:
    """VERSION_CODENAME of the running system ("bookworm")."""
    for line in os_release.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "VERSION_CODENAME" and value.strip().strip("\"'"):
            return value.strip().strip("\"'")
    raise RuntimeFetchError(f"{os_release} names no VERSION_CODENAME: not a Debian-like system?")


def debian_mirror(sources: Sequence[AptSource], system_suite: str) -> AptSource:
    """The repository serving the system's own suite with its main component: the
    Debian mirror, whichever host it is (security and update suites do not match)."""
    for source in sources:
        if system_suite in source.suites and "main" in source.components:
            return source
    listed = ", ".join(f"{s.uri} {'/'.join(s.suites)}" for s in sources) or "none"
    raise RuntimeFetchError(f"no apt source serves {system_suite} main (sources: {listed})")


def render_deb822(source: AptSource, suite: str) -> str:
    """A sources stanza for `suite` on `source`'s mirror, with its keyring."""
    lines = ["Types: deb", f"URIs: {source.uri}", f"Suites: {suite}", "Components: main"]
    if source.signed_by:
        first, *rest = source.signed_by.split("\n")
        lines.append(f"Signed-By: {first}")
        lines += [f" {line}" if line else " ." for line in rest]
    return "\n".join(lines) + "\n"


# -- fetching ---------------------------------------------------------------------------


class PrivateApt:
    """apt with its own lists, cache and sources under `root`: the system's apt state
    (/var/lib/apt/lists, /var/cache/apt, /etc/apt/sources.list*) is neither read for
    sources nor written."""

    def __init__(self, root: Path, source: AptSource, suite: str) -> None:
        self.root = root
        self.source = source
        self.suite = suite
        (root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (root / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (root / "sources.list.d").mkdir(exist_ok=True)
        (root / "sources.list").write_text("")
        (root / "sources.list.d" / f"{suite}.sources").write_text(render_deb822(source, suite))

    def options(self) -> list[str]:
        settings = {
            "Dir::State::Lists": self.root / "lists",
            "Dir::Etc::SourceList": self.root / "sources.list",
            "Dir::Etc::SourceParts": self.root / "sources.list.d",
            "Dir::Cache": self.root / "cache",
            # A mirror out of reach fails within a minute or so (ensure then goes on offline)
            # instead of apt's retries with back-off.
            "Acquire::Retries": 1,
            "Acquire::http::Timeout": 30,
        }
        return [arg for key, value in settings.items() for arg in ("-o", f"{key}={value}")]

    def run(self, tool: str, *args: str, cwd: Path | None = None) -> str:
        cmd = [tool, "-q", *self.options(), *args]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False,
                                  cwd=cwd, env=env)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeFetchError(f"{' '.join([tool, *args])}: no answer within {exc.timeout:.0f}s") from exc
        if done.returncode != 0:
            raise RuntimeFetchError(f"{' '.join([tool, *args])} failed ({done.returncode}):\n"
                                    f"{(done.stdout + done.stderr).strip()}")
        return done.stdout

    def candidate(self, package: str) -> str:
        """The Debian version of `package` in the suite."""
        shown = self.run("apt-cache", "show", "--no-all-versions", f"{package}/{self.suite}")
        for line in shown.splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
        raise RuntimeFetchError(f"apt-cache show {package}/{self.suite} gave no Version")


def _give_to_apt(work: Path, download: Path) -> None:
    """apt downloads as the unprivileged _apt user (else it warns and downloads as root):
    let it reach `download` inside the private `work` directory and write there."""
    with contextlib.suppress(KeyError, PermissionError):
        os.chown(download, pwd.getpwnam("_apt").pw_uid, -1)
        work.chmod(0o711)


@contextlib.contextmanager
def _suite_apt(cache: Path, suite: str, etc: Path, os_release: Path) -> Iterator[tuple[Path, PrivateApt]]:
    """A work directory in `cache` (removed afterwards) and a PrivateApt in it for `suite` on
    the system's Debian mirror, its lists updated."""
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=cache) as tmp:
        work = Path(tmp)
        apt = PrivateApt(work / "apt", debian_mirror(system_sources(etc), codename(os_release)), suite)
        apt.run("apt-get", "update", "--error-on=any")  # an index not fetched is an error, not a warning
        yield work, apt


def _unpack(apt: PrivateApt, work: Path, package: str, debian_version: str) -> Path:
    """Download one package version and unpack it (``dpkg-deb -x``) into `work`/tree, with a
    source.json saying where it came from."""
    download = work / "download"
    download.mkdir()
    _give_to_apt(work, download)
    apt.run("apt-get", "download", f"{package}={debian_version}", cwd=download)
    debs = sorted(download.glob(f"{package}_*.deb"))
    if len(debs) != 1:
        raise RuntimeFetchError(f"apt-get download left {[d.name for d in debs]} in {download}")
    tree = work / "tree"
    unpack = subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(tree)], capture_output=True,
                            text=True, check=False)
    if unpack.returncode != 0:
        raise RuntimeFetchError(f"dpkg-deb -x {debs[0].name} failed: {unpack.stderr.strip()}")
    (tree / "source.json").write_text(json.dumps({
        "package": package, "version": debian_version, "suite": apt.suite,
        "mirror": apt.source.uri, "deb": debs[0].name}, indent=2) + "\n")
    return tree


def _publish(tree: Path, dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)  # an incomplete earlier attempt
    tree.rename(dest)  # same file system: the finished tree appears at once


def fetch(suite: str, cache: Path | None = None, *, etc: Path = APT_ETC,
          os_release: Path = OS_RELEASE) -> ContainerdBuild:
    """Download `suite`'s containerd package from the system's Debian mirror and unpack
    it into ``<cache>/containerd-<version>/`` (kept if already complete)."""
    cache = cache_dir() if cache is None else cache
    with _suite_apt(cache, suite, etc, os_release) as (work, apt):
        debian_version = apt.candidate("containerd")
        version = upstream_version(debian_version)
        dest = cache / f"containerd-{version}"
        build = ContainerdBuild(version, dest / "usr" / "bin")
        if dest.is_dir() and not build.missing():
            return build
        tree = _unpack(apt, work, "containerd", debian_version)
        _check_tree(tree, version)
        _publish(tree, dest)
    return build


def fetch_runc(suite: str = RUNC_SUITE, cache: Path | None = None, *, etc: Path = APT_ETC,
               os_release: Path = OS_RELEASE) -> RuncBuild:
    """`suite`'s runc package, unpacked into ``<cache>/runc-<version>/`` (kept if already
    there). Its version is not run: sid's runc may need a newer glibc than this host has."""
    cache = cache_dir() if cache is None else cache
    with _suite_apt(cache, suite, etc, os_release) as (work, apt):
        debian_version = apt.candidate("runc")
        build = RuncBuild(upstream_version(debian_version), cache / f"runc-{upstream_version(debian_version)}")
        if build.binary.is_file():
            return build
        tree = _unpack(apt, work, "runc", debian_version)
        if not (tree / RUNC_BINARY).is_file():
            raise RuntimeFetchError(f"the runc package {debian_version} has no /{RUNC_BINARY}")
        _publish(tree, build.root)
    return build


def _check_tree(tree: Path, version: str) -> None:
    unpacked = ContainerdBuild(version, tree / "usr" / "bin")
    missing = unpacked.missing()
    if missing:
        raise RuntimeFetchError(f"the containerd package lacks {', '.join(missing)}")
    reported = binary_version(unpacked.binary("containerd"))
    if reported != version:
        raise RuntimeFetchError(f"the unpacked containerd reports {reported}, the package {version}")


_Build = TypeVar("_Build", ContainerdBuild, RuncBuild)


def _log(line: str) -> None:
    print(line, file=sys.stderr)


def _newest_or_cached(what: str, fetch_newest: Callable[[], _Build], cached: Callable[[], _Build],
                      log: Callable[[str], None]) -> _Build:
    """What `fetch_newest` gets (the suite's current release, downloaded only if not cached);
    the cached one, with a log line, when the suite cannot be asked."""
    try:
        return fetch_newest()
    except RuntimeFetchError as exc:
        try:
            build = cached()
        except RuntimeFetchError:
            raise exc from None
        lines = str(exc).strip().splitlines()
        reason = next((line for line in lines if "Failed to fetch" in line or line.startswith("E:")), lines[0])
        log(f"runtimes: {what}: could not ask Debian for its current release ({reason}); "
            f"using the cached {build.label}")
        return build


def ensure(series: str, cache: Path | None = None, *, log: Callable[[str], None] = _log) -> ContainerdBuild:
    """The build for `series`. A fixed series (1.6, 1.7) is fetched from its Debian suite only
    if neither the system nor the cache has it; a whole major line ("2.x", a moving suite) is
    the suite's current release, unless the system's containerd is of that line."""
    if series not in SERIES_SUITES:
        raise RuntimeFetchError(f"unknown containerd series {series!r} (known: {', '.join(SERIES_SUITES)})")
    system = system_build()
    if system is not None and system.series == series:
        return system
    if not series.endswith(".x"):
        with contextlib.suppress(RuntimeFetchError):
            return locate(series, cache)
    build = _newest_or_cached(f"containerd {series}", lambda: fetch(SERIES_SUITES[series], cache),
                              lambda: locate(series, cache), log)
    if build.series != series:
        raise RuntimeFetchError(f"Debian {SERIES_SUITES[series]} now ships containerd {build.version}, "
                                f"not {series}: update SERIES_SUITES")
    return build


def ensure_runc(cache: Path | None = None, *, log: Callable[[str], None] = _log) -> RuncBuild:
    """sid's current runc (fetched beside older ones), or the newest cached one when sid
    cannot be asked."""
    return _newest_or_cached("runc", lambda: fetch_runc(RUNC_SUITE, cache), lambda: locate_runc(cache), log)


# -- command line -----------------------------------------------------------------------

RUNC = "runc"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=None,
                        help=f"cache directory (default ${CACHE_ENV} or {DEFAULT_CACHE})")
    commands = parser.add_subparsers(dest="command", required=True)
    ensure_cmd = commands.add_parser("ensure", help="make every series and runc (or those named) available")
    ensure_cmd.add_argument("series", nargs="*", default=[*SERIES_SUITES, RUNC],
                            help=f"series ({', '.join(SERIES_SUITES)}) or {RUNC} (sid's, for the node tier)")
    commands.add_parser("list", help="the system's and the cached builds")
    args = parser.parse_args(argv)
    try:
        if args.command == "ensure":
            for series in args.series:
                found = ensure_runc(args.cache) if series == RUNC else ensure(series, args.cache)
                print(f"runtimes: {series}: {found.label}")
        else:
            system = system_build()
            labels = [build.label for build in [*([system] if system else []), *cached_builds(args.cache)]]
            for label in [*labels, *(runc.label for runc in cached_runcs(args.cache))]:
                print(label)
    except RuntimeFetchError as exc:
        print(f"runtimes: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
