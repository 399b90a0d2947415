"""Keeping what the plugins write on a systemd-driver node: unit properties, and re-applying the rest.

systemd rewrites a unit's cgroup files from the unit's properties whenever it realizes the
unit (its start, a sibling's start or stop, ``systemctl daemon-reload``, a property change),
so a value written only into cgroupfs lasts until the next such event. :class:`SystemdSync`
is the :class:`~.cgroups.WriteListener` of runtime-hooks' CgroupFS under
``--cgroup-driver systemd`` on cgroup v2. For each successful write into a unit's cgroup
(:func:`~.systemd_units.unit_of_cgroup`: a pod slice or a container scope):

* a file with unit properties (:func:`~.systemd_units.unit_properties`: ``cpu.max``,
  ``cpu.weight``, ``cpuset.*``, ``memory.min/low/high/max``): the properties go to systemd
  (:class:`~.systemd_bus.SystemdBus`), so that systemd re-applies our value, not its own. The
  direct write stays: it takes effect at once, the property makes it last;
* a file systemd resets with no property we can set
  (:data:`~.systemd_units.RESET_WITHOUT_PROPERTY`: ``cpu.idle``) to a value other than
  systemd's: remembered, and every ``interval`` (0.2 s) the remembered files are read and
  written again where they differ, so a value systemd reset is back within about 0.2 s
  (counted in ``runtimehooks_systemd_reapplied_total{file}``). A file written back to
  systemd's value is forgotten, so is one whose cgroup is gone; at most ``max_guarded``;
* content no property can express (e.g. ``cpu.max`` without a period) is logged once per
  file and counted in ``runtimehooks_systemd_unmapped_writes_total{file}``: the file keeps
  it until systemd's next realize, then the reconciler's next round writes it again.

Files systemd never writes (``cpu.max.burst``, ``cpu.bvt_warp_ns``, ``memory.wmark_*``) and
writes outside units (cgroup v1, cgroupfs-driver paths) are left as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING, Final

import structlog
from prometheus_client import CollectorRegistry, Counter

from .cgroups import CgroupError, CgroupFS, CgroupVersion, CgroupWrite
from .systemd_units import RESET_WITHOUT_PROPERTY, unit_of_cgroup, unit_properties

if TYPE_CHECKING:  # the bus (dbus_fast) is loaded only where systemd sync is on (hooks/cli.py)
    from .systemd_bus import SystemdBus

__all__ = ["REAPPLY_INTERVAL", "SystemdSync"]

log = structlog.get_logger("runtimeproxy.hooks.systemd_sync")

#: Seconds between two checks of the values systemd resets without a property.
REAPPLY_INTERVAL: Final = 0.2

_Key = tuple[str, str]  # (cgroup, file)


class SystemdSync:
    """Sends unit properties for what CgroupFS writes into units and re-applies what systemd
    resets without one; see the module doc. :meth:`written` is called from any thread;
    :meth:`run` (the bus's worker and the re-apply loop) on the server's event loop."""

    def __init__(
        self,
        bus: SystemdBus,
        *,
        registry: CollectorRegistry | None = None,
        interval: float = REAPPLY_INTERVAL,
        max_guarded: int = 4096,
    ) -> None:
        self.bus = bus
        self.interval = interval
        self.max_guarded = max_guarded
        reg = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.reapplied = Counter(
            "runtimehooks_systemd_reapplied",
            "Values systemd reset in a unit's cgroup file that has no unit property, written again, by file.",
            ["file"],
            registry=reg,
        )
        self.unmapped = Counter(
            "runtimehooks_systemd_unmapped_writes",
            "Writes into a unit's cgroup whose content no unit property can express, by file.",
            ["file"],
            registry=reg,
        )
        self._lock = threading.Lock()
        self._guarded: dict[_Key, tuple[CgroupFS, CgroupWrite]] = {}
        self._logged: set[str] = set()

    def __repr__(self) -> str:
        return f"SystemdSync({self.bus!r})"

    # -- the listener --

    def written(self, cgroups: CgroupFS, write: CgroupWrite) -> None:
        """A write CgroupFS made; never raises (the write is done either way)."""
        try:
            self._written(cgroups, write)
        except Exception:  # a bug here must not fail a plugin's write
            log.exception("cannot pass a cgroup write on to systemd", cgroup=write.cgroup, file=write.file)

    def _written(self, cgroups: CgroupFS, write: CgroupWrite) -> None:
        if cgroups.version is not CgroupVersion.V2:
            return
        unit = unit_of_cgroup(write.cgroup)
        if unit is None:
            return
        text = write.data.decode("utf-8", errors="replace").strip()
        if write.file in RESET_WITHOUT_PROPERTY:
            self._guard(cgroups, write, text)
            return
        try:
            properties = unit_properties(write.file, text)
        except ValueError as exc:
            self.unmapped.labels(file=write.file).inc()
            self._once(
                f"unmapped:{write.file}",
                "no unit property for this value: systemd may put its own back",
                unit=unit,
                file=write.file,
                error=str(exc),
            )
            return
        self.bus.set_properties(unit, properties)

    def _guard(self, cgroups: CgroupFS, write: CgroupWrite, text: str) -> None:
        key = (write.cgroup, write.file)
        with self._lock:
            if text == RESET_WITHOUT_PROPERTY[write.file]:
                self._guarded.pop(key, None)  # systemd writes the same: nothing to keep
                return
            full = key not in self._guarded and len(self._guarded) >= self.max_guarded
            if not full:
                self._guarded[key] = (cgroups, write)
        if full:
            self._once(
                "guard-full",
                "too many values to re-apply after systemd: this one is not",
                cgroup=write.cgroup,
                file=write.file,
                max_guarded=self.max_guarded,
            )

    def guarded(self) -> dict[_Key, bytes]:
        """The files re-applied after systemd, by (cgroup, file), with their values."""
        with self._lock:
            return {key: write.data for key, (_, write) in self._guarded.items()}

    # -- re-applying --

    def check(self) -> int:
        """Read every remembered file and write it again where it differs; how many were written.

        A plugin's write racing this one by microseconds can lose to it; the reconciler's next
        round then writes the plugin's value, and this follows it."""
        with self._lock:
            entries = list(self._guarded.items())
        rewritten = 0
        for key, entry in entries:
            outcome = self._reapply(key, entry)
            if outcome == "gone":
                with self._lock:
                    if self._guarded.get(key) is entry:
                        del self._guarded[key]
            elif outcome == "written":
                rewritten += 1
                self.reapplied.labels(file=key[1]).inc()
        return rewritten

    def _reapply(self, key: _Key, entry: tuple[CgroupFS, CgroupWrite]) -> str:
        """The outcome: "gone" (the cgroup is), "written", "same" (or written anew meanwhile), "failed"."""
        cgroups, write = entry
        wanted = write.data.decode("utf-8", errors="replace").strip()
        try:
            now = cgroups.read(write.controller, write.file, write.parent, write.container_id)
            with self._lock:
                current = self._guarded.get(key) is entry
            if now == wanted or not current:
                return "same"
            cgroups.write(write.controller, write.file, write.data, write.parent, write.container_id)
        except FileNotFoundError:
            return "gone"
        except (OSError, CgroupError) as exc:
            self._once(
                f"reapply:{write.file}:{type(exc).__name__}",
                "cannot re-apply a value systemd reset",
                cgroup=write.cgroup,
                file=write.file,
                error=str(exc),
            )
            return "failed"
        log.debug("re-applied a value systemd reset", cgroup=write.cgroup, file=write.file, value=wanted, was=now)
        return "written"

    # -- running --

    async def run(self) -> None:
        """The bus's worker and the re-apply loop, until cancelled."""
        worker = asyncio.get_running_loop().create_task(self.bus.run(), name="runtime-hooks-systemd-bus")
        try:
            while True:
                await asyncio.sleep(self.interval)
                try:
                    self.check()
                except Exception:  # a bug in one check must not end re-applying
                    log.exception("re-applying after systemd failed")
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    def _once(self, key: str, message: str, **fields: object) -> None:
        """Warn the first time for ``key``, then at debug; never called with the lock held."""
        with self._lock:
            first = key not in self._logged
            self._logged.add(key)
        (log.warning if first else log.debug)(message, **fields)
