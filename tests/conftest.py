"""Shared fixtures. End-to-end tests run against a real containerd: they never skip.

Every test that uses the `containerd` fixture runs once per containerd series the test bed
has (runtimes.SERIES_SUITES: Debian bookworm's 1.6, trixie's 1.7 and sid's 2.x, the latter two
fetched into a cache by .ci/system-deps.sh). ``@pytest.mark.containerd_series("1.7")`` pins a test
or module to the series named; RUNTIMEPROXY_CONTAINERD_SERIES="1.7" narrows a local run
(tests pinned to other series keep theirs).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

from runtimeproxy.common import logs
from runtimeproxy.testbed import Containerd, ContainerdBuild, RuntimeFetchError
from runtimeproxy.testbed.runtimes import SERIES_SUITES, locate

# Fixtures shared by several test modules, kept beside their helpers.
pytest_plugins = ("hook_bed", "fake_dists", "plugin_runners")

# containerd's own binaries come from each build (runtimes.BINARIES); these from the system.
_REQUIRED_BINARIES = ("runc", "mount", "ip")
SERIES_ENV = "RUNTIMEPROXY_CONTAINERD_SERIES"
SERIES_MARK = "containerd_series"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{SERIES_MARK}(*series): run only against these containerd series")


def _known(series: list[str], where: str) -> list[str]:
    unknown = sorted(set(series) - set(SERIES_SUITES))
    if unknown:
        raise pytest.UsageError(f"{where}: unknown containerd series {unknown} (known: {list(SERIES_SUITES)})")
    return series


def containerd_series(metafunc: pytest.Metafunc) -> list[str]:
    """The series a test runs against: its marker's, else the environment's, else all."""
    mark = metafunc.definition.get_closest_marker(SERIES_MARK)
    if mark is not None:
        return _known(list(mark.args), f"{SERIES_MARK} mark of {metafunc.definition.nodeid}")
    chosen = os.environ.get(SERIES_ENV, "").replace(",", " ").split()
    return _known(chosen, SERIES_ENV) or list(SERIES_SUITES)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests using the `containerd` fixture run once per series (one daemon per series)."""
    if "containerd" in metafunc.fixturenames:
        series = containerd_series(metafunc)
        metafunc.parametrize("containerd", series, indirect=True, scope="session",
                             ids=[f"containerd{s}" for s in series])


def _testbed_problems(build: ContainerdBuild | None) -> list[str]:
    problems = []
    if os.geteuid() != 0:
        problems.append("the tests must run as root (they start a real containerd)")
    missing = [name for name in _REQUIRED_BINARIES if shutil.which(name) is None]
    missing += build.missing() if build is not None else []
    if missing:
        problems.append(f"missing binaries: {', '.join(missing)}")
    if not os.path.exists("/bin/busybox"):
        problems.append("missing /bin/busybox (the test images are built from it)")
    return problems


def start_testbed(series: str, **options: Any) -> Containerd:
    """A started containerd test bed of `series` ("1.6", "1.7", "2.x"); `options` go to Containerd
    (``nri=True``, say).

    Fails, never skips, when the machine cannot run it: a CI that lacks containerd
    or a cached build must go red, not green. `bash .ci/system-deps.sh` installs
    and fetches what is needed.
    """
    build: ContainerdBuild | None = None
    problems = []
    try:
        build = locate(series)
    except RuntimeFetchError as exc:
        problems.append(str(exc))
    problems += _testbed_problems(build)
    if problems:
        pytest.fail("cannot start the containerd test bed: " + "; ".join(problems)
                    + " (run `bash .ci/system-deps.sh` as root)", pytrace=False)
    bed = Containerd(build=build, **options)
    try:
        bed.start()
    except BaseException:
        with contextlib.suppress(Exception):  # keep the start error, not a cleanup one
            bed.stop()
        raise
    return bed


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """A test that runs a CLI command configures structlog process-wide (configure_logging);
    put the configuration back so later tests' capture_logs still see every level."""
    config = structlog.get_config()
    level = logs._min_level
    yield
    structlog.configure(**config)
    logs._min_level = level


@pytest.fixture
def require_root() -> None:
    """For tests that need root and iproute2: they fail, never skip, without them."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"this test needs root and iproute2 (uid {os.geteuid()}, missing: {missing})", pytrace=False)


@pytest.fixture(scope="session")
def containerd(request: pytest.FixtureRequest) -> Iterator[Containerd]:
    """A started containerd (CRI at `.address`) of the series in `request.param`, shared
    by the whole session (pytest runs one series' tests, then the next one's)."""
    bed = start_testbed(request.param)
    yield bed
    bed.stop()


@pytest.fixture
def fresh_containerd() -> Iterator[Callable[[str], Containerd]]:
    """Private test beds, started on demand (``fresh_containerd("1.7")``) and torn down
    after the test: for tests that need a daemon nothing else has used (an empty event
    queue, for instance)."""
    beds: list[Containerd] = []

    def start(series: str) -> Containerd:
        beds.append(start_testbed(series))
        return beds[-1]

    yield start
    for bed in beds:
        bed.stop()
