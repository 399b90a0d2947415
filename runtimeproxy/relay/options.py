"""What every relayed connection shares: where calls go, the options, the held-request budget.

May import the standard library, runtimeproxy.wire and the relay's own methods and
call_interceptor modules (see the package docstring); no asyncio at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from runtimeproxy.relay.call_interceptor import CallInterceptor
from runtimeproxy.relay.methods import MethodInfo, MethodTable
from runtimeproxy.wire.peer_limits import DEFAULT_LIMITS, LimitSettings

if TYPE_CHECKING:
    import asyncio

# (method, gRPC code, message, seconds, whether the interceptor saw the call and logs it)
CallObserver = Callable[[MethodInfo, int, str, float, bool], None]


class Backends:
    """Where calls go: the runtime backend, and the image backend when it is a different one.

    With two backends, each client connection is routed by the service of its first call
    (kubelet keeps separate connections for the runtime and image services); a call on
    a connection routed to the other backend is refused with a status that says why.
    """

    IMAGE_SERVICE = "runtime.v1.ImageService"

    def __init__(self, runtime: str, image: str | None = None) -> None:
        self.runtime = runtime
        self.image = image or runtime

    @property
    def split(self) -> bool:
        return self.image != self.runtime

    def for_service(self, service: str) -> str:
        return self.image if service == self.IMAGE_SERVICE else self.runtime


class RelayOptions:
    """What every relayed connection shares."""

    def __init__(
        self,
        backends: Backends,
        methods: MethodTable,
        interceptor: CallInterceptor,
        observer: CallObserver,
        max_message_size: int,
        held_budget: int | None = None,
        peer_limits: LimitSettings = DEFAULT_LIMITS,
    ) -> None:
        self.backends = backends
        self.peer_limits = peer_limits  # what either peer may send (wire.peer_limits)
        self.methods = methods
        self.interceptor = interceptor
        self.observer = observer
        self.max_message_size = max_message_size
        self.held = HeldBytes(2 * max_message_size if held_budget is None else held_budget)
        # ``after`` calls owed to the interceptor, across connections: a stopping proxy
        # gives them the drain grace and counts those it cuts off.
        self.after_tasks: set[asyncio.Task[None]] = set()
        self._claims: dict[str, bool] = {}

    def intercepts(self, method: MethodInfo) -> bool:
        claimed = self._claims.get(method.path)
        if claimed is None:
            claimed = method.unary and self.interceptor.intercepts(method)
            self._claims[method.path] = claimed
        return claimed


class HeldBytes:
    """The bytes of intercepted requests held in memory, across connections, under one budget.

    Each held byte costs several more while the hooks work on it (a copy, the decoded
    message, the re-encoded request), so many large requests at once could take the node's
    memory: past the budget, a call is refused with RESOURCE_EXHAUSTED and kubelet retries.
    """

    __slots__ = ("budget", "used")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.budget:
            return False
        self.used += size
        return True

    def give_back(self, size: int) -> None:
        self.used -= size
