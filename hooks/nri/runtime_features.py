"""What the runtime's NRI can carry, told at Configure.

NRI 0.7 added the runtime's registration and request timeouts (milliseconds) to
``ConfigureRequest``, and every runtime on NRI 0.7 or later sets them: they are its configured
timeouts, 5 s and 2 s by default (a zero timeout would fail every call). A runtime on NRI 0.6
does not know the fields. Their presence is what decides, not the runtime's name and version
(which are logged): one containerd version is built with different NRI versions -- upstream 1.7
moved from NRI 0.6.1 to 0.8.0 at 1.7.26, and Debian builds containerd against its own NRI
package (trixie's 1.7.24 with 0.6.1, sid's 2.1.9 with 0.8.0).

============================  ==========================  ===============================
runtime's NRI                 containerd                  the OOM score a plugin sets
============================  ==========================  ===============================
up to 0.6 (no timeouts)       1.7.0 to 1.7.25             written to the container's
                                                          process at PostStartContainer
                                                          (hooks/nri/oom.py)
0.7 and later (timeouts)      1.7.26+, 2.x (2.1: 0.8)     in the CreateContainer
                                                          adjustment: the runtime starts
                                                          the process with it
============================  ==========================  ===============================

With NRI 0.7+, Synchronize may also come in parts (hooks/nri/sync_parts.py). Until the runtime
has configured the plugin, the oldest NRI is assumed (:data:`NRI_0_6`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = ["NRI_0_6", "RuntimeNri"]


@dataclass(frozen=True, slots=True)
class RuntimeNri:
    """The runtime as its ConfigureRequest describes it; see the module doc."""

    name: str
    version: str
    nri_0_7: bool  # the runtime's NRI is 0.7 or later

    @classmethod
    def of(cls, request: Any) -> RuntimeNri:
        """From a ConfigureRequest: NRI 0.7+ when it carries either timeout."""
        sent_timeouts = request.registration_timeout > 0 or request.request_timeout > 0
        return cls(request.runtime_name, request.runtime_version, sent_timeouts)

    @property
    def oom_in_adjustment(self) -> bool:
        """The CreateContainer adjustment carries an OOM score (LinuxContainerAdjustment.oom_score_adj)."""
        return self.nri_0_7

    @property
    def described(self) -> str:
        """The NRI version range, for log lines."""
        return "0.7+" if self.nri_0_7 else "0.6"


#: What is assumed before Configure: the oldest NRI this plugin speaks.
NRI_0_6: Final = RuntimeNri("", "", nri_0_7=False)
