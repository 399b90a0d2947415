"""The flavours of the real-node tier: which containerd and runc the node runs.

Every flavour boots the same node image (`noderoot`: Debian trixie, with trixie's containerd
1.7 and runc 1.1). A flavour with other runtimes adds one more initramfs archive between the
image and the run layer; the kernel unpacks the archives in order and a later file replaces
an earlier one, so the node's containerd.service starts the flavour's binaries:

* ``trixie-1.7``: the image as it is (containerd config version 2).
* ``sid-2.x``: Debian sid's containerd 2.x (containerd, its runc shim, ctr) and sid's runc
  1.3, from the test bed's runtime cache (`runtimes`: the same builds the host suites use
  for 2.x, and sid's runc, which needs trixie's glibc and so runs in the guest only);
  containerd config version 3.

runc 1.3.2+ turns CPU shares into cgroup v2 cpu.weight with another formula than runc 1.1
(runtime-hooks' ``--cpu-weight-conversion``): each flavour names its runc's, which the
node's runtime-hooks is started with and which the host computes its expectations with.

The runtime archive is packed once per pair of versions under the node cache
(``<cache>/runtimes/``) and published by a rename.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .noderoot import cache_root, pack_cpio
from .runtimes import ContainerdBuild, RuncBuild, locate, locate_runc

__all__ = ["FLAVOURS", "SID_2X", "TRIXIE_17", "NodeFlavour", "runtime_layer"]

# Where the node's packages put the binaries a flavour replaces.
_GUEST_BIN = "usr/bin"
_GUEST_RUNC = "usr/sbin/runc"


@dataclass(frozen=True)
class NodeFlavour:
    """One runtime set for the node. ``containerd_series`` None: the image's own (trixie's)."""

    name: str
    containerd_major: int
    # runtime-hooks' --cpu-weight-conversion for this flavour's runc.
    weight_conversion: str
    containerd_series: str | None = None
    # Whether the scenario also plays the Helm chart's runtime-hooks pod (node_daemonset): a
    # few minutes of emulated CPU, spent on one flavour (the pod's runtime needs are the same).
    plays_chart: bool = False

    @property
    def replaces_runtimes(self) -> bool:
        return self.containerd_series is not None

    def builds(self) -> tuple[ContainerdBuild, RuncBuild]:
        """The cached containerd and runc this flavour lays over the image (RuntimeFetchError,
        naming how to fetch them, when the cache lacks one)."""
        if self.containerd_series is None:
            raise ValueError(f"flavour {self.name} runs the image's own runtimes")
        return locate(self.containerd_series), locate_runc()


TRIXIE_17 = NodeFlavour("trixie-1.7", containerd_major=1, weight_conversion="linear", plays_chart=True)
SID_2X = NodeFlavour("sid-2.x", containerd_major=2, weight_conversion="log-quadratic", containerd_series="2.x")
FLAVOURS = (TRIXIE_17, SID_2X)


def runtime_layer(flavour: NodeFlavour, directory: Path | None = None) -> tuple[Path, dict[str, str]]:
    """The packed archive of `flavour`'s runtimes (built on first use) and their versions."""
    containerd, runc = flavour.builds()
    versions = {"containerd": containerd.version, "runc": runc.version}
    directory = (directory or cache_root()) / "runtimes"
    dest = directory / f"containerd-{containerd.version}-runc-{runc.version}.cpio.zst"
    if dest.exists():
        return dest, versions
    directory.mkdir(parents=True, exist_ok=True)
    tree = directory / f".tree-{os.getpid()}"
    partial = dest.with_name(f".{dest.name}.{os.getpid()}")
    shutil.rmtree(tree, ignore_errors=True)
    try:
        assert containerd.bin_dir is not None  # locate gives the system's only for its own series
        (tree / _GUEST_BIN).mkdir(parents=True)
        for name in ("containerd", "containerd-shim-runc-v2", "ctr"):
            shutil.copy2(containerd.bin_dir / name, tree / _GUEST_BIN / name)
        (tree / _GUEST_RUNC).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(runc.binary, tree / _GUEST_RUNC)
        pack_cpio(tree, partial)
        partial.rename(dest)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        partial.unlink(missing_ok=True)
    return dest, versions
