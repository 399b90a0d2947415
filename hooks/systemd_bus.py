"""Unit properties sent to systemd over D-Bus, from any thread, without making the writer wait.

:class:`SystemdBus` is how runtime-hooks makes systemd keep a value the plugins wrote into a
unit's cgroup (:mod:`.systemd_sync`): ``SetUnitProperties(name, runtime=true, a(sv))`` on
``org.freedesktop.systemd1.Manager``, as kubelet does for its pod slices. ``runtime``: the
property lives under ``/run`` only, and a transient unit's is removed with the unit.

**Library and bus.** `dbus-fast <https://pypi.org/project/dbus-fast/>`_: asyncio-native,
maintained, wheels for CPython 3.11 and 3.13 on x86_64 with no C library needed at run time
(its compiled parts are optional speed-ups of pure Python). jeepney is pure Python but
low-level (no service side, which the tests need to stand in for systemd); sdbus needs
libsystemd. It connects to the system bus (``DBUS_SYSTEM_BUS_ADDRESS``, else
``/var/run/dbus/system_bus_socket``, so an image without the ``/var/run`` -> ``/run`` link
needs the variable; the Helm chart sets it) or to ``address``. Not to systemd's private socket
``/run/systemd/private``, which kubelet's go-systemd tries first: that is a direct connection
with no bus daemon, where a client must not send the bus's ``Hello`` (go-systemd: "We skip
Hello when talking directly to systemd"), and dbus-fast always sends it on connect. Root may
call ``SetUnitProperties`` on the system bus without polkit; a node with systemd as PID 1 has
that bus (dbus or dbus-broker), and kubelet falls back to it too.

**What is sent.** :meth:`SystemdBus.set_properties` merges into a pending table by unit (the
latest value of each property wins) and returns. The worker (:meth:`SystemdBus.run`, on the
server's event loop) sends each unit's properties in one call, after two questions that
never load a unit: ``GetUnit`` (is it loaded?) and its ``Transient`` property. Only a loaded,
transient unit gets properties -- kubelet's pod slices and the runtime's container scopes
are. A unit that is not loaded is skipped (``SetUnitProperties`` would load it), and so is
one that is not transient: a slice systemd made implicitly around a scope (no kubelet made
the pod's slice) would keep the property as a drop-in under ``/run/systemd/system.control``
after the pod is gone.

**Failures** never reach the writer: its cgroupfs write is done. systemd unreachable (no
socket, refused, connection lost, authentication, no answer within ``timeout``): the unit's
properties stay pending and are sent again after ``retry[0]`` s, doubling up to ``retry[1]``;
logged once per cause until a call succeeds again, which is logged too. systemd refusing them
(an error reply): dropped, logged once per error name; a unit skipped, logged once per
reason (later ones at debug, with the unit). Every outcome is counted in
``runtimehooks_systemd_property_sets_total{result}``: ``ok``, ``unreachable``, ``refused``,
``not_loaded``, ``not_transient``, ``dropped`` (more than ``max_units`` units pending).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from typing import Any, Final

import structlog
from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from prometheus_client import CollectorRegistry, Counter

from .systemd_units import UnitProperty

__all__ = ["RESULTS", "SystemdBus"]

log = structlog.get_logger("runtimeproxy.hooks.systemd_bus")

_SYSTEMD: Final = "org.freedesktop.systemd1"
_MANAGER_PATH: Final = "/org/freedesktop/systemd1"
_MANAGER: Final = "org.freedesktop.systemd1.Manager"
_UNIT: Final = "org.freedesktop.systemd1.Unit"
_PROPERTIES: Final = "org.freedesktop.DBus.Properties"
_NO_SUCH_UNIT: Final = "org.freedesktop.systemd1.NoSuchUnit"

#: The outcomes counted in runtimehooks_systemd_property_sets_total.
RESULTS: Final = ("ok", "unreachable", "refused", "not_loaded", "not_transient", "dropped")

_MESSAGES: Final = {
    "unreachable": "cannot reach systemd; the unit properties are sent again when it answers "
    "(the cgroup files are written all the same)",
    "refused": "systemd refused the unit properties; it may put its own values back into the cgroup",
    "not_loaded": "unit not loaded by systemd: no properties set (its cgroup was not made through systemd)",
    "not_transient": "unit is not transient: no properties set (systemd would keep them after the pod)",
    "dropped": "too many units waiting for systemd: their properties are dropped",
}


class _Unreachable(Exception):
    """No answer from systemd: ``cause`` names the kind, for logging once."""

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(detail)
        self.cause = cause


class _Refused(Exception):
    """An error reply; ``name`` is the D-Bus error name."""

    def __init__(self, name: str, text: str) -> None:
        super().__init__(text)
        self.name = name


class SystemdBus:
    """Sets unit properties through systemd's D-Bus API; see the module doc.

    ``address``: a D-Bus address ("": the system bus). ``timeout``: seconds for connecting
    and for each call. ``retry``: the first and the longest pause before sending again to an
    unreachable systemd. Call :meth:`set_properties` from any thread; :meth:`run` works on
    the event loop it is awaited in until cancelled.
    """

    def __init__(
        self,
        address: str = "",
        *,
        registry: CollectorRegistry | None = None,
        timeout: float = 10.0,
        retry: tuple[float, float] = (0.5, 30.0),
        max_units: int = 8192,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.retry = retry
        self.max_units = max_units
        self.sets = Counter(
            "runtimehooks_systemd_property_sets",
            "Units whose properties runtime-hooks sent to systemd (systemd cgroup driver), by result: "
            "ok, unreachable (kept, sent again), refused, not_loaded, not_transient, dropped.",
            ["result"],
            registry=registry if registry is not None else CollectorRegistry(auto_describe=True),
        )
        for result in RESULTS:
            self.sets.labels(result=result)
        self._lock = threading.Lock()  # guards _pending: set_properties comes from any thread
        self._pending: dict[str, dict[str, UnitProperty]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._working = False
        self._waiting_retry = False
        self._bus: MessageBus | None = None
        self._watches: set[asyncio.Task[None]] = set()  # one per connection, until it closes
        self._logged: set[str] = set()  # causes warned about (unreachable ones: until a success)
        self._log_lock = threading.Lock()  # "dropped" is reported from the writer's thread

    def __repr__(self) -> str:
        return f"SystemdBus(address={self.address or 'system bus'!r})"

    # -- the writer's side (any thread) --

    def set_properties(self, unit: str, properties: Sequence[UnitProperty]) -> None:
        """Have systemd set ``properties`` on ``unit`` soon; returns at once."""
        if not properties:
            return
        with self._lock:
            if unit not in self._pending and len(self._pending) >= self.max_units:
                dropped = True
            else:
                dropped = False
                entry = self._pending.setdefault(unit, {})
                entry.update((prop.name, prop) for prop in properties)
            loop = self._loop
        if dropped:
            self._outcome("dropped", "dropped", unit=unit, pending_units=self.max_units)
            return
        if loop is None:
            return  # run() sends it once started
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._poke()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing will be sent anyway
                loop.call_soon_threadsafe(self._poke)

    def pending(self) -> dict[str, tuple[UnitProperty, ...]]:
        """The units whose properties were not sent yet (waiting, or kept for a retry)."""
        with self._lock:
            return {unit: tuple(props.values()) for unit, props in self._pending.items()}

    # -- the worker (event loop) --

    async def run(self) -> None:
        """Send what is pending, as it comes, until cancelled; then disconnect."""
        self._loop = asyncio.get_running_loop()  # the events bind to it on first use
        self._poke()
        delay = self.retry[0]
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if await self._send_pending():
                    delay = self.retry[0]
                    continue
                self._waiting_retry = True
                self._changed.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry[1])
                self._waiting_retry = False
                self._poke()
        finally:
            self._loop = None
            self._disconnect()
            if self._watches:
                await asyncio.gather(*self._watches)  # done at once: the connections are closed

    async def flush(self, timeout: float = 10.0) -> bool:
        """Wait (on run()'s loop) until nothing is being sent and nothing waits but for a retry;
        True when nothing is pending. TimeoutError after ``timeout`` s."""
        async with asyncio.timeout(timeout):
            while self._working or (self.pending() and not self._waiting_retry):
                self._changed.clear()
                await self._changed.wait()
        return not self.pending()

    def _poke(self) -> None:
        self._wake.set()
        self._changed.set()

    def _take(self) -> list[tuple[str, tuple[UnitProperty, ...]]]:
        with self._lock:
            batch = [(unit, tuple(props.values())) for unit, props in self._pending.items()]
            self._pending.clear()
        return batch

    def _put_back(self, batch: list[tuple[str, tuple[UnitProperty, ...]]]) -> None:
        """Unsent properties go back under any newer ones set meanwhile."""
        with self._lock:
            newer = self._pending
            self._pending = {unit: {prop.name: prop for prop in props} for unit, props in batch}
            for unit, props in newer.items():
                self._pending.setdefault(unit, {}).update(props)

    async def _send_pending(self) -> bool:
        """Send the pending units one by one; False (the rest kept) when systemd is unreachable."""
        batch = self._take()
        self._working = True
        try:
            for index, (unit, properties) in enumerate(batch):
                try:
                    result = await self._apply(unit, properties)
                except _Unreachable as exc:
                    self._put_back(batch[index:])
                    self._outcome("unreachable", exc.cause, unit=unit, error=str(exc))
                    return False
                except _Refused as exc:
                    self._outcome(
                        "refused", exc.name, unit=unit, error=f"{exc.name}: {exc}", properties=_names(properties)
                    )
                    continue
                except Exception as exc:  # an answer of an unexpected shape: this unit only, the worker goes on
                    self._outcome("refused", type(exc).__name__, unit=unit, error=repr(exc))
                    continue
                self._outcome(result, result, unit=unit, properties=_names(properties))
            return True
        finally:
            self._working = False
            self._changed.set()

    async def _apply(self, unit: str, properties: Sequence[UnitProperty]) -> str:
        bus = await self._connected()
        try:
            reply = await self._call(bus, _manager_call("GetUnit", "s", [unit]))
        except _Refused as exc:
            if exc.name == _NO_SUCH_UNIT:
                return "not_loaded"
            raise
        path = reply.body[0]
        reply = await self._call(
            bus,
            Message(
                destination=_SYSTEMD,
                path=path,
                interface=_PROPERTIES,
                member="Get",
                signature="ss",
                body=[_UNIT, "Transient"],
            ),
        )
        if not reply.body[0].value:
            return "not_transient"
        body = [unit, True, [[prop.name, Variant(prop.signature, prop.value)] for prop in properties]]
        await self._call(bus, _manager_call("SetUnitProperties", "sba(sv)", body))
        return "ok"

    async def _connected(self) -> MessageBus:
        if self._bus is not None and self._bus.connected:
            return self._bus
        self._disconnect()
        bus = MessageBus(bus_address=self.address or None, bus_type=BusType.SYSTEM)
        try:
            async with asyncio.timeout(self.timeout):
                await bus.connect()
        except TimeoutError:
            raise _Unreachable("timeout", f"no connection within {self.timeout:g} s") from None
        except Exception as exc:  # OSError, AuthError, a bad address...: nothing to talk to
            raise _Unreachable(type(exc).__name__, f"{self._where()}: {exc}") from None
        self._bus = bus
        # Awaited so that a connection systemd's side closed (dbus restarted) is noted, not
        # left as a never-retrieved exception; the next call connects afresh.
        watch = asyncio.get_running_loop().create_task(self._closed(bus))
        self._watches.add(watch)
        watch.add_done_callback(self._watches.discard)
        return bus

    async def _closed(self, bus: MessageBus) -> None:
        try:
            await bus.wait_for_disconnect()  # type: ignore[no-untyped-call]  # dbus-fast leaves it unannotated
        except Exception as exc:
            log.debug("the connection to systemd closed", error=repr(exc))

    async def _call(self, bus: MessageBus, message: Message) -> Message:
        try:
            async with asyncio.timeout(self.timeout):
                reply = await bus.call(message)
        except TimeoutError:
            self._disconnect()  # systemd is stuck (or the connection is): start afresh next time
            raise _Unreachable("timeout", f"no answer to {message.member} within {self.timeout:g} s") from None
        except Exception as exc:  # the connection broke
            self._disconnect()
            raise _Unreachable(type(exc).__name__, f"{self._where()}: {exc}") from None
        if reply.message_type is MessageType.ERROR:
            raise _Refused(reply.error_name or "unknown", str(reply.body[0]) if reply.body else "")
        return reply

    def _disconnect(self) -> None:
        bus, self._bus = self._bus, None
        if bus is not None:
            with contextlib.suppress(Exception):
                bus.disconnect()

    def _where(self) -> str:
        return self.address or "the system bus"

    def _outcome(self, result: str, cause: str, **fields: Any) -> None:
        self.sets.labels(result=result).inc()
        with self._log_lock:
            # An outage ends with a success (and is logged again if it comes back); the other
            # causes are about units or values, each logged once.
            recovered = sorted(key for key in self._logged if key.startswith("unreachable:")) if result == "ok" else []
            self._logged.difference_update(recovered)
            first = result != "ok" and f"{result}:{cause}" not in self._logged
            if first:
                self._logged.add(f"{result}:{cause}")
        if recovered:
            log.info("systemd takes unit properties again", after=recovered, **fields)
        elif result == "ok":
            log.debug("unit properties set", **fields)
        elif first:
            log.warning(_MESSAGES[result], cause=cause, bus=self._where(), **fields)
        else:
            log.debug(_MESSAGES[result], cause=cause, **fields)


def _manager_call(member: str, signature: str, body: list[Any]) -> Message:
    return Message(
        destination=_SYSTEMD, path=_MANAGER_PATH, interface=_MANAGER, member=member, signature=signature, body=body
    )


def _names(properties: Sequence[UnitProperty]) -> list[str]:
    return [prop.describe() for prop in properties]
