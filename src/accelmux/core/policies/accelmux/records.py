"""The records the parts of the accelmux policy hand each other: what every part is built
on (:class:`Seam`), one round's own state (:class:`Round`), whom room is made for and the
plan to make it (:class:`RoomFor`, :class:`Survey`, :class:`RoomPlan`), and what admission
found out about a request on its way to a dispatch (:class:`Admitting`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from accelmux.core.policies.accelmux.cache import RoundCache
from accelmux.core.types import Reason, ServiceClass
from accelmux.core.world import RequestState, ServiceState, WorldOps, WorldView


@dataclass(frozen=True, slots=True)
class Seam:
    """What every part is built on: the world to read, its one writer, the round's cache."""

    view: WorldView
    ops: WorldOps
    cache: RoundCache


@dataclass(slots=True)
class Round:
    """One round's own state: what its decisions so far hold for the rest of it."""

    #: Per device, the highest class a request of which waits for memory there.
    blocked: dict[str, ServiceClass] = field(default_factory=dict)
    realtime_active: set[str] = field(default_factory=set)
    #: Devices with realtime work running, waiting or within its grace (realtime_yield).
    realtime_work: set[str] = field(default_factory=set)
    #: Devices whose compute every model shares (host devices): steady work yields there.
    shared: frozenset[str] = frozenset()
    interactive_active: set[str] = field(default_factory=set)
    higher_waiting: dict[str, ServiceClass] = field(default_factory=dict)
    #: Devices where this round would repeat a round that changed nothing.
    quiet: set[str] = field(default_factory=set)
    #: The time of day (windows): the round's time does not change.
    tod: float = 0.0
    #: Per service with windows, whether one is open (see ``facts.in_window``).
    inside: dict[str, bool] = field(default_factory=dict)
    #: How many times a request marked its device blocked (:meth:`block`), whether or
    #: not that lowered the class: what a request set in the round, to be set again
    #: when the request is not considered again (``Schedule.consider``).
    marks: int = 0

    def block(self, device: str, cls: ServiceClass) -> None:
        """A request of ``cls`` waits for memory on ``device``: lower classes there are
        held back (``blocked`` keeps the highest class so marked)."""
        self.blocked[device] = min(cls, self.blocked.get(device, cls))
        self.marks += 1


@dataclass(frozen=True, slots=True)
class RoomFor:
    """Whom room is made for: a class, the service it is for (never its own victim; a
    steady one ranks above batch), why, whether only strictly lower classes may be
    evicted (restores), the request it is for (it may pause other models' streams),
    whether idle pinned services may go too (``Room.unpins``: the last resort of a realtime
    request), and whether that request aged (``RequestState.aged``: idle interactive
    services with no request waiting may go too)."""

    cls: ServiceClass
    exclude: ServiceState | None
    reason: Reason = Reason.NO_MEMORY
    strict: bool = False
    requester: RequestState | None = None
    unpin: bool = False
    aged: bool = False

    @classmethod
    def request(
        cls, req: RequestState, svc: ServiceState, reason: Reason = Reason.NO_MEMORY
    ) -> RoomFor:
        """Room for ``req`` on ``svc`` (its load or its run): its class, whether it aged."""
        return cls(req.cls, svc, reason, requester=req, aged=req.aged)


@dataclass(slots=True)
class Survey:
    """What a room plan could free on a device (see ``Room.survey``)."""

    shrinks: list[tuple[ServiceState, int]] = field(default_factory=list)
    preempts: list[RequestState] = field(default_factory=list)
    victims: list[ServiceState] = field(default_factory=list)
    #: Services whose parked weights on the park device may be dropped (not loaded).
    drops: list[ServiceState] = field(default_factory=list)
    #: Bytes the shrinks, drops, stops and evictions would free, beyond what is free or on its
    #: way back.
    gain: int = 0


@dataclass(slots=True)
class RoomPlan:
    """How ``need`` bytes are found on ``device`` for ``for_`` (``Room.plan``): nothing to
    do (``survey`` None: they are free, or on their way back), or the steps of
    ``survey`` in the order they are taken. ``pending``: memory on its way back when the
    plan was made."""

    device: str
    need: int
    for_: RoomFor
    pending: int = 0
    survey: Survey | None = None


@dataclass(slots=True)
class Admitting:
    """What admission found out about a request on a loaded service, step by step: the KV
    it brings and how much its pool must grow, the bytes it needs, the most its device
    could ever free, its lease when degraded to what was measured, and, when its room
    is made, what was free and running before (to say what made the room) and its
    service's own allocator cache it reuses."""

    kv: int = 0
    grow: int = 0
    need: int = 0
    limit: int = 0
    lease: int | None = None
    before: int = 0
    running: int = 0
    own_cache: int = 0
