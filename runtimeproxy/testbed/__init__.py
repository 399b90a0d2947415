"""A real containerd, started by the test suite in a temporary root, plus local images.

It ships with the package because ``runtime-proxy demo`` runs the same private
containerd that the end-to-end tests use.

May import the standard library, third-party libraries, runtimeproxy.api, common,
kubelet_model and play; never the daemons' own parts (relay, dispatch, proxy, runtime-hooks).
"""

from .containerd import Containerd, ContainerdError
from .images import ImageSpec, build_image_tar, pause_image_spec, test_image_spec
from .runtimes import ContainerdBuild, RuntimeFetchError

__all__ = [
    "Containerd",
    "ContainerdBuild",
    "ContainerdError",
    "ImageSpec",
    "RuntimeFetchError",
    "build_image_tar",
    "pause_image_spec",
    "test_image_spec",
]
