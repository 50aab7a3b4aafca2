"""The accelmux policy: its parts, built once per world in one acyclic order, and one round
(:meth:`AccelmuxPolicy.decide`).

Each part is a class of this package that gets what it depends on in its constructor:
the :class:`~accelmux.core.policies.accelmux.records.Seam` (the world to read, its one
writer, the round's cache) and the parts it calls. :func:`build_parts` builds them
bottom up, so a part can only be given a part built before it: the order is the graph
(:mod:`.graph` reads it from the constructors; ``scripts/part-graph`` prints it, and a
test fails on a cycle).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from accelmux.core.events import Demand
from accelmux.core.policies.accelmux.admission import Admission
from accelmux.core.policies.accelmux.cache import RoundCache
from accelmux.core.policies.accelmux.degrading import Degrading
from accelmux.core.policies.accelmux.learning import Learning
from accelmux.core.policies.accelmux.loading import Loading
from accelmux.core.policies.accelmux.preemption import Preemption
from accelmux.core.policies.accelmux.records import Seam
from accelmux.core.policies.accelmux.reserve import Reserve
from accelmux.core.policies.accelmux.residency import Residents
from accelmux.core.policies.accelmux.room import Room
from accelmux.core.policies.accelmux.routing import Routing
from accelmux.core.policies.accelmux.schedule import FEW_WAITING, Schedule
from accelmux.core.policies.accelmux.shrinking import Shrinking
from accelmux.core.policies.accelmux.steady import Steady
from accelmux.core.policies.accelmux.time_sharing import TimeSharing
from accelmux.core.policies.accelmux.wakeup import Wakeup
from accelmux.core.world import ServiceState, WorldOps, WorldView
from accelmux.errors import InvariantError


@dataclass(frozen=True, slots=True)
class Parts:
    """The parts of one policy over one world, in the order they are built."""

    seam: Seam
    time_sharing: TimeSharing
    preemption: Preemption
    room: Room
    reserve: Reserve
    steady: Steady
    shrinking: Shrinking
    routing: Routing
    loading: Loading
    degrading: Degrading
    admission: Admission
    schedule: Schedule
    residents: Residents
    learning: Learning
    wakeup: Wakeup


def build_parts(seam: Seam) -> Parts:
    """Every part, bottom up: each gets the parts it calls, all built before it."""
    time_sharing = TimeSharing(seam)
    preemption = Preemption(seam, time_sharing)
    room = Room(seam, preemption, time_sharing)
    reserve = Reserve(seam)
    steady = Steady(seam)
    shrinking = Shrinking(seam)
    routing = Routing(seam, room, reserve)
    loading = Loading(seam, room, reserve, steady)
    degrading = Degrading(seam, routing, loading, reserve)
    admission = Admission(seam, room, reserve, loading, time_sharing, shrinking)
    schedule = Schedule(seam, admission, time_sharing)
    residents = Residents(seam, room, reserve, loading, routing)
    learning = Learning(seam, room)
    wakeup = Wakeup(seam, residents)
    return Parts(
        seam,
        time_sharing,
        preemption,
        room,
        reserve,
        steady,
        shrinking,
        routing,
        loading,
        degrading,
        admission,
        schedule,
        residents,
        learning,
        wakeup,
    )


class AccelmuxPolicy:
    """The product's policy (see the package docstring). ``cache=False``: the round keeps
    and skips nothing (:class:`~accelmux.core.policies.accelmux.cache.RoundCache` off),
    for tests: it decides exactly alike."""

    name = "accelmux"
    infinite_memory = False
    enforces_budget = True

    def __init__(self, *, cache: bool = True) -> None:
        self.cache_enabled = cache
        #: Up to this many waiting requests a round considers them all, skipping nothing.
        self.few_waiting = FEW_WAITING
        self._parts: Parts | None = None

    def parts(self, view: WorldView, ops: WorldOps | None = None) -> Parts:
        """The parts over ``view`` (built on first use, with ``ops``, its writer)."""
        parts = self._parts
        if parts is None:
            if ops is None:
                raise InvariantError("the accelmux policy is used before it has started")
            cache = RoundCache(view, enabled=self.cache_enabled)
            parts = self._parts = build_parts(Seam(view, ops, cache))
        elif parts.seam.view is not view:
            raise InvariantError("one accelmux policy decides for one world only")
        parts.schedule.few_waiting = self.few_waiting
        return parts

    def start(self, view: WorldView, ops: WorldOps, now: float) -> None:
        p = self.parts(view, ops)
        p.residents.keep_pinned_loaded()
        if view.knobs.prewarm and view.knobs.switches.prewarm:
            p.residents.preload_warm()

    def decide(self, view: WorldView, ops: WorldOps, now: float) -> None:
        p = self.parts(view, ops)
        switches = view.knobs.switches
        p.seam.cache.new_round()
        if switches.realtime_yield and view.busy:
            p.time_sharing.yield_to_realtime()
        p.time_sharing.forget_settled()
        p.learning.learn()
        p.residents.admin_unloads()
        p.learning.relieve_pressure()
        p.residents.keep_pinned_loaded()
        if view.groups and switches.placement:
            p.routing.reroute_to_free_replicas()
            p.degrading.step()
        p.schedule.schedule()
        p.residents.expire_idle()
        if switches.ballooning:
            p.residents.balloon()
        if view.knobs.prewarm and switches.prewarm:
            p.residents.prewarm()

    def next_wakeup(self, view: WorldView, now: float) -> float | None:
        return self.parts(view).wakeup.next_wakeup(now)

    def route(
        self, view: WorldView, replicas: Sequence[ServiceState], demand: Demand
    ) -> ServiceState:
        return self.parts(view).routing.route(replicas, demand)

    def victim_score(self, view: WorldView, svc: ServiceState) -> float:
        """Lower is a better victim (see ``Room.victim_score``)."""
        return self.parts(view).room.victim_score(svc)
