"""One run of the real-node scenario: image, run layer, boot, facts.

`run_node` takes the plan of a scenario (see `node_scenario`) and the files it names,
builds (or reuses) the node image, builds this run's layer on top (the project installed (its systemd units
with it, for `runtime-proxy install`), the test images, containerd's configuration,
the scenario unit), boots the VM and returns what the guest reported, with the time each
phase took.

The guest's containerd runs with the systemd cgroup driver (``SystemdCgroup = true``).
Its root is the initramfs, which has two consequences: the ``native`` snapshotter (no
overlayfs on rootfs) and runc's ``NoPivotRoot`` (pivot_root(2) fails on rootfs).

A `nodeflavour.NodeFlavour` picks the runtimes: the image's own (trixie's containerd 1.7,
runc 1.1), or another containerd and runc in an archive booted between the image and the
run layer, with the config format of that containerd.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .hooks_image import build_hooks_image
from .images import build_image_tar, pause_image_spec, test_image_spec
from .nodeflavour import TRIXIE_17, NodeFlavour, runtime_layer
from .nodelayer import RunLayer
from .noderoot import NodeImage, ensure_node_image
from .vm import BootResult, boot

__all__ = ["GUEST_DIR", "NodeRun", "containerd_config", "containerd_config_v3", "run_node"]

# Where the run's own files go in the guest.
GUEST_DIR = "/opt/rtpx"
SCENARIO_UNIT_NAME = "rtpx-scenario.service"
SCENARIO_UNIT = f"""[Unit]
Description=runtimeproxy real-node scenario (reports on ttyS1, then powers off)
After=multi-user.target containerd.service

[Service]
# simple, not oneshot: boot completes while it runs (the scenario waits for that).
Type=simple
ExecStart=/usr/bin/python3 -m runtimeproxy.testbed.node_scenario {GUEST_DIR}/plan.json
# Whatever happened, the VM goes down at once: the host is waiting for it, the results are
# out (the scenario drains the port), and nothing in RAM needs a clean shutdown. One --force
# would wait up to 90 s for the containers' processes to die.
ExecStopPost=/usr/bin/systemctl poweroff --force --force
StandardOutput=journal+console
StandardError=journal+console
RuntimeMaxSec=3600

[Install]
WantedBy=multi-user.target
"""


def containerd_config(sandbox_image: str, *, major: int = 1) -> str:
    """containerd config for the guest: CRI with runc under systemd; version 2 for 1.x,
    version 3 (containerd_config_v3) for 2.x."""
    if major >= 2:
        return containerd_config_v3(sandbox_image)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
[{cri}]
  sandbox_image = {json.dumps(sandbox_image)}
[{cri}.containerd]
  snapshotter = "native"
{_runc(f"{cri}.containerd")}"""


def _runc(table: str) -> str:
    """runc as the default runtime at `table`: under systemd, no pivot_root on the initramfs."""
    return f"""  default_runtime_name = "runc"
  [{table}.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [{table}.runtimes.runc.options]
      SystemdCgroup = true
      NoPivotRoot = true
"""


def containerd_config_v3(sandbox_image: str) -> str:
    """containerd 2.x config (version 3): the CRI plugin's images part (snapshotter, the
    pinned sandbox image) and runtime part (runc) are separate plugins. `ctr images import`
    goes through the transfer service, which unpacks only for the snapshotters of its
    unpack_config (by default overlayfs alone: "no unpack platforms defined" for native). NRI
    is off as on 1.7, where it is off unless configured (2.x turns it on by default)."""
    images = 'plugins."io.containerd.cri.v1.images"'
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    return f"""version = 3
[{images}]
  snapshotter = "native"
  [{images}.pinned_images]
    sandbox = {json.dumps(sandbox_image)}
[{runtime}.containerd]
{_runc(f"{runtime}.containerd")}[[plugins."io.containerd.transfer.v1.local".unpack_config]]
  platform = "linux/amd64"
  snapshotter = "native"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
"""


@dataclass
class NodeRun:
    image: NodeImage
    result: BootResult
    timings_s: dict[str, float] = field(default_factory=dict)
    flavour: NodeFlavour = TRIXIE_17
    # The versions of a flavour's own runtimes (empty: the image's).
    runtimes: dict[str, str] = field(default_factory=dict)


def _layer(image: NodeImage, work: Path, source: Path, plan: Mapping[str, Any], files: Mapping[str, str],
           timings: dict[str, float], flavour: NodeFlavour = TRIXIE_17) -> Path:
    began = time.monotonic()
    layer = RunLayer(image, work / "layer")
    layer.install_project(source)
    timings["install_project"] = round(time.monotonic() - began, 1)
    tar = work / "images.tar"
    build_image_tar([pause_image_spec(), test_image_spec()], tar)
    layer.add_file(f"{GUEST_DIR}/images.tar", tar.read_bytes())
    if plan.get("daemonset", {}).get("image_tar"):  # runtime-hooks as an image of this root (node_daemonset)
        hooks_tar = work / "hooks-image.tar"
        build_hooks_image(image.root, layer.upper, hooks_tar)
        layer.add_file(plan["daemonset"]["image_tar"], hooks_tar.read_bytes())
        timings["hooks_image"] = round(time.monotonic() - began, 1)
    layer.add_file(f"{GUEST_DIR}/plan.json", json.dumps(plan, indent=2))
    for path, content in files.items():
        layer.add_file(path, content)
    layer.add_file("/etc/containerd/config.toml",
                   containerd_config(pause_image_spec().ref, major=flavour.containerd_major))
    layer.add_file("/etc/hostname", "rtpx-node\n")
    layer.add_file(f"/etc/systemd/system/{SCENARIO_UNIT_NAME}", SCENARIO_UNIT)
    layer.add_symlink(f"/etc/systemd/system/multi-user.target.wants/{SCENARIO_UNIT_NAME}",
                      f"/etc/systemd/system/{SCENARIO_UNIT_NAME}")
    # No login prompt on the console: nobody logs in, and it costs emulated CPU.
    layer.add_symlink("/etc/systemd/system/serial-getty@ttyS0.service", "/dev/null")
    layer.add_symlink("/etc/systemd/system/getty@tty1.service", "/dev/null")
    packed = layer.build()
    timings["run_layer"] = round(time.monotonic() - began, 1)
    return packed


def run_node(source: Path, plan: Mapping[str, Any], files: Mapping[str, str], work: Path, *, timeout: float,
             log: Callable[[str], None] = print, flavour: NodeFlavour = TRIXIE_17) -> NodeRun:
    """Build what is missing, boot, and return the guest's facts (see the module doc)."""
    timings: dict[str, float] = {}
    began = time.monotonic()
    image = ensure_node_image(log=log)
    timings["node_image"] = round(time.monotonic() - began, 1)
    runtimes: dict[str, str] = {}
    archives = [image.initrd]
    if flavour.replaces_runtimes:
        began = time.monotonic()
        archive, runtimes = runtime_layer(flavour)
        archives.append(archive)
        timings["runtime_layer"] = round(time.monotonic() - began, 1)
    archives.append(_layer(image, work, source, plan, files, timings, flavour))
    log(f"booting {image.path.name} as {flavour.name} (timeout {timeout:.0f}s); console: {work / 'vm' / 'console.log'}")
    result = boot(image.kernel, archives, work / "vm", timeout=timeout, progress=log)
    timings["vm"] = result.elapsed_s
    return NodeRun(image=image, result=result, timings_s=timings, flavour=flavour, runtimes=runtimes)
