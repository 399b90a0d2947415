"""Shared fixtures. End-to-end tests run against a real containerd: they never skip."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

import pytest

from runtimeproxy.testbed import Containerd

_REQUIRED_BINARIES = ("containerd", "ctr", "runc", "containerd-shim-runc-v2", "mount", "ip")


def _testbed_problems() -> list[str]:
    problems = []
    if os.geteuid() != 0:
        problems.append("the tests must run as root (they start a real containerd)")
    missing = [name for name in _REQUIRED_BINARIES if shutil.which(name) is None]
    if missing:
        problems.append(f"missing binaries: {', '.join(missing)}")
    if not os.path.exists("/bin/busybox"):
        problems.append("missing /bin/busybox (the test images are built from it)")
    return problems


@pytest.fixture
def require_root() -> None:
    """For tests that need root and iproute2: they fail, never skip, without them."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"this test needs root and iproute2 (uid {os.geteuid()}, missing: {missing})", pytrace=False)


@pytest.fixture(scope="session")
def containerd() -> Iterator[Containerd]:
    """A started containerd (CRI at `.address`) shared by the whole session.

    Fails, never skips, when the machine cannot run it: a CI that lacks containerd
    must go red, not green. `bash .ci/system-deps.sh` installs what is needed.
    """
    problems = _testbed_problems()
    if problems:
        pytest.fail("cannot start the containerd test bed: " + "; ".join(problems)
                    + " (run `bash .ci/system-deps.sh` as root)", pytrace=False)
    bed = Containerd()
    try:
        bed.start()
    except BaseException:
        with contextlib.suppress(Exception):  # keep the start error, not a cleanup one
            bed.stop()
        raise
    yield bed
    bed.stop()
