"""One run of the real-node scenario: image, run layer, boot, facts.

`run_node` takes the plan of a scenario (see `node_scenario`) and the files it names,
builds (or reuses) the node image, builds this run's layer on top (the project installed (its systemd units
with it, for `runtime-proxy install`), the test images, containerd's configuration,
the scenario unit), boots the VM and returns what the guest reported, with the time each
phase took.

The guest's containerd runs with the systemd cgroup driver (``SystemdCgroup = true``).
Its root is the initramfs, which has two consequences: the ``native`` snapshotter (no
overlayfs on rootfs) and runc's ``NoPivotRoot`` (pivot_root(2) fails on rootfs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .images import build_image_tar, pause_image_spec, test_image_spec
from .nodelayer import RunLayer
from .noderoot import NodeImage, ensure_node_image
from .vm import BootResult, boot

__all__ = ["GUEST_DIR", "NodeRun", "containerd_config", "run_node"]

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


def containerd_config(sandbox_image: str) -> str:
    """containerd 1.7 config (version 2) for the guest: CRI with runc under systemd."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
[{cri}]
  sandbox_image = {json.dumps(sandbox_image)}
  [{cri}.containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = true
        NoPivotRoot = true
"""


@dataclass
class NodeRun:
    image: NodeImage
    result: BootResult
    timings_s: dict[str, float] = field(default_factory=dict)


def _layer(image: NodeImage, work: Path, source: Path, plan: Mapping[str, Any], files: Mapping[str, str],
           timings: dict[str, float]) -> Path:
    began = time.monotonic()
    layer = RunLayer(image, work / "layer")
    layer.install_project(source)
    timings["install_project"] = round(time.monotonic() - began, 1)
    tar = work / "images.tar"
    build_image_tar([pause_image_spec(), test_image_spec()], tar)
    layer.add_file(f"{GUEST_DIR}/images.tar", tar.read_bytes())
    layer.add_file(f"{GUEST_DIR}/plan.json", json.dumps(plan, indent=2))
    for path, content in files.items():
        layer.add_file(path, content)
    layer.add_file("/etc/containerd/config.toml", containerd_config(pause_image_spec().ref))
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
             log: Callable[[str], None] = print) -> NodeRun:
    """Build what is missing, boot, and return the guest's facts (see the module doc)."""
    timings: dict[str, float] = {}
    began = time.monotonic()
    image = ensure_node_image(log=log)
    timings["node_image"] = round(time.monotonic() - began, 1)
    layer = _layer(image, work, source, plan, files, timings)
    log(f"booting {image.path.name} (timeout {timeout:.0f}s); console: {work / 'vm' / 'console.log'}")
    result = boot(image.kernel, [image.initrd, layer], work / "vm", timeout=timeout, progress=log)
    timings["vm"] = result.elapsed_s
    return NodeRun(image=image, result=result, timings_s=timings)
