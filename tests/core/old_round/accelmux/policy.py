"""The accelmux policy as one class: its state, one round (:meth:`AccelmuxPolicy.decide`)
and the table that wires in the parts.

Each part is a module of this package whose functions take the policy as ``self`` and
become its methods here (``_survey = room.survey``); the parts see the policy as
:class:`~accelmux.core.policies.accelmux.interface.Parts`. A method of a part is still
reached through the instance, so a subclass that overrides one (the tests' copies of
the policy without memos do) changes it for every part.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accelmux.core.types import ServiceClass

from . import (
    admission,
    interface,
    learning,
    loading,
    preemption,
    reserve,
    residency,
    room,
    routing,
    schedule,
    steady,
    time_sharing,
    wakeup,
)
from .state import RequestState, ServiceSet, ServiceState, World
from .time_sharing import pausing


class AccelmuxPolicy:
    name = "accelmux"
    infinite_memory = False
    enforces_budget = True
    #: Up to this many waiting requests a round considers them all, skipping nothing.
    few_waiting = 8

    def __init__(self) -> None:
        #: device -> (its epoch, world.learned.realtime_peak_changes, the realtime
        #: reserve found then).
        self._reserves: dict[str, tuple[int, int, int]] = {}
        #: Per-round memo of per-device aggregates: key -> (stamp, value), the stamp being
        #: world.version (no mutator has run since) or the device's epoch (nothing on the
        #: device has changed since: an aggregate of what no wait reason changes).
        #: Cleared at the start of every decide().
        self._memo: dict[tuple[str, str], tuple[int, int]] = {}
        #: The warm services of each device of ``_warm_world`` (static).
        self._warm_world: World | None = None
        self._warm: dict[str, list[ServiceState]] = {}
        self._warm_ordered: list[ServiceState] = []
        #: What :meth:`_yields_to_realtime` found per service of ``_facts_world`` (static).
        self._facts_world: World | None = None
        self._facts: dict[str, bool] = {}
        #: The World and its devices where time sharing may pause a stream (static).
        self._sharing_devices: tuple[World, frozenset[str]] | None = None
        #: Per-round memo of make_room failures: (device, class, for a steady service,
        #: strict, requester holding memory, a time-sharing requester) -> (device epoch,
        #: the most it could free).
        self._room_failed: dict[
            tuple[str, ServiceClass, bool, bool, str | None, object], tuple[int, int]
        ] = {}
        #: What :meth:`_load_sizes` found per waiting request: id -> (request,
        #: calibration versions, sizes).
        self._sizes: dict[str, tuple[RequestState, tuple[int, int], tuple[int, int, int, int]]] = {}
        #: Per-round memo of :meth:`_restorable`: device -> ((version, now), candidates).
        #: What :meth:`_window_edges` found: (the set, its version, the edges).
        self._edges_memo: tuple[ServiceSet, int, tuple[float, ...]] | None = None
        self._restorable_memo: dict[str, tuple[tuple[int, float], list[list[Any]]]] = {}
        #: Per-round memo of :meth:`_round_realtime_devices` (None: not asked yet).
        self._rt_devices: set[str] | None = None
        #: Per-round memo of :meth:`_restore_pending`: holder -> ((version, now), pending).
        self._restores_memo: dict[str, tuple[tuple[int, float], bool]] = {}
        #: Per-round memo of :meth:`_ttl_range`: service -> (world.version, range).
        self._ttl_memo: dict[str, tuple[int, tuple[float, float]]] = {}
        #: What :meth:`_evicted_warm` found: (the set, its version, the services).
        self._evicted_warm_memo: tuple[ServiceSet, int, list[ServiceState]] | None = None
        #: Per device, (epoch, round inputs) of the last schedule that changed nothing there.
        self._quiet: dict[str, tuple[int, tuple[object, ...]]] = {}
        #: Services measured holding activation memory while idle (a caching allocator).
        self._caching: set[str] = set()
        #: When a restore of each service last evicted others to make its room.
        self._restore_tried_at: dict[str, float] = {}
        #: Requests paused to switch models -> the request they were paused for: they
        #: do not take back the memory they gave until it has started.
        self._yielded_to: dict[str, str] = {}
        #: Requests paused to give the compute to realtime work (realtime_yield).
        self._yielded_realtime: set[str] = set()

    def _cached(
        self,
        world: World,
        key: tuple[str, str],
        compute: Callable[[], int],
        stamp: int | None = None,
    ) -> int:
        mark = world.version if stamp is None else stamp
        hit = self._memo.get(key)
        if hit is not None and hit[0] == mark:
            return hit[1]
        value = compute()
        self._memo[key] = (mark, value)
        return value

    def start(self, world: World, now: float) -> None:
        self._keep_pinned_loaded(world)
        if world.knobs.prewarm and world.knobs.switches.prewarm:
            self._preload_warm(world)

    def decide(self, world: World, now: float) -> None:
        self._memo.clear()
        self._room_failed.clear()
        self._restorable_memo.clear()
        self._restores_memo.clear()
        self._ttl_memo.clear()
        self._rt_devices = None
        if len(self._sizes) > 2 * len(world.waiting) + 64:
            self._sizes = {k: v for k, v in self._sizes.items() if k in world.waiting}
        if world.knobs.switches.realtime_yield and world.busy:
            self._yield_to_realtime(world)
        if self._yielded_to:
            self._yielded_to = {
                r: o for r, o in self._yielded_to.items() if r in world.waiting or pausing(world, r)
            }
        if self._yielded_realtime:
            self._yielded_realtime = {
                r
                for r in self._yielded_realtime
                if ((q := world.waiting.get(r)) and q.paused) or pausing(world, r)
            }
        self._learn(world)
        self._admin_unloads(world)
        self._relieve_pressure(world)
        self._keep_pinned_loaded(world)
        if world.groups and world.knobs.switches.placement:
            self._reroute_to_free_replicas(world)
        self._schedule(world)
        self._expire_idle(world)
        if world.knobs.switches.ballooning:
            self._balloon(world)
        if world.knobs.prewarm and world.knobs.switches.prewarm:
            self._prewarm(world)

    # ---- the parts (each a module of this package; see its docstring) ----------
    # learning
    _learn = learning.learn
    _learners = learning.learners
    _relieve_pressure = learning.relieve_pressure

    # preemption
    _may_preempt = preemption.may_preempt
    _may_stop = preemption.may_stop
    _stop = preemption.stop
    _preemptible = staticmethod(preemption.preemptible)
    _stoppable = preemption.stoppable

    # steady
    _steady_reserve = steady.steady_reserve

    # time_sharing
    _pause_for_first_token = time_sharing.pause_for_first_token
    _yielding = time_sharing.yielding
    _sharing_key = staticmethod(time_sharing.sharing_key)
    _room_key = time_sharing.room_key
    _time_sharing_devices = time_sharing.time_sharing_devices
    _can_pause = staticmethod(time_sharing.can_pause)
    _time_shared = time_sharing.time_shared
    _realtime_devices = staticmethod(time_sharing.realtime_devices)
    _round_realtime_devices = time_sharing.round_realtime_devices
    _yields_compute = time_sharing.yields_compute
    _compute_is_shared = staticmethod(time_sharing.compute_is_shared)
    _yield_to_realtime = time_sharing.yield_to_realtime
    _share_thresholds = staticmethod(time_sharing.share_thresholds)

    # reserve
    _realtime_reserve = reserve.realtime_reserve
    _yields_to_realtime = reserve.yields_to_realtime
    _static_facts = reserve.static_facts
    _compute_yields_to_realtime = reserve.compute_yields_to_realtime
    _fitting_reserve = reserve.fitting_reserve
    _quickly_freeable = reserve.quickly_freeable
    _sum_quickly_freeable = reserve.sum_quickly_freeable
    _freeable_for_realtime = reserve.freeable_for_realtime
    _typical_activation = reserve.typical_activation
    _compute_realtime_reserve = reserve.compute_realtime_reserve
    _explain_reserve = reserve.explain_reserve

    # room
    victim_score = room.victim_score
    _tier = staticmethod(room.tier)
    _unload = room.unload
    eviction_cost = room.eviction_cost
    unload_frees = staticmethod(room.unload_frees)
    _pending_free = room.pending_free
    _evictable = room.evictable
    _survey = room.survey
    make_room = room.make_room
    _kept_floor = staticmethod(room.kept_floor)
    _max_possible = room.max_possible
    _reachable = room.reachable
    _room_plan = room.room_plan
    _shrink_for_room = staticmethod(room.shrink_for_room)
    _stop_for_room = room.stop_for_room
    _pick_victims = room.pick_victims
    _evict_for_room = room.evict_for_room

    # residency
    _preload_warm = residency.preload_warm
    _keep = staticmethod(residency.keep)
    _ttl = residency.ttl
    _ttl_range = residency.ttl_range
    _ttl_floor = staticmethod(residency.ttl_floor)
    _idle_past_ttl = residency.idle_past_ttl
    _memory_wanted = residency.memory_wanted
    _memory_spare = residency.memory_spare
    _likely_reused = staticmethod(residency.likely_reused)
    _restore_pending = residency.restore_pending
    _compute_restore_pending = residency.compute_restore_pending
    _restorable = residency.restorable
    _warm_services = residency.warm_services
    _know_warm = residency.know_warm
    _warm_in_class_order = residency.warm_in_class_order
    _evicted_warm = residency.evicted_warm
    _restore_need = residency.restore_need
    _admin_unloads = residency.admin_unloads
    _keep_pinned_loaded = residency.keep_pinned_loaded
    _expire_idle = residency.expire_idle
    _balloon = residency.balloon
    _prewarm = residency.prewarm

    # routing
    route = routing.route
    _reroute_to_free_replicas = staticmethod(routing.reroute_to_free_replicas)
    _other_replica_up = staticmethod(routing.other_replica_up)
    _placed_here = routing.placed_here
    _wanted_by_higher_class = staticmethod(routing.wanted_by_higher_class)
    _footprint = staticmethod(routing.footprint)
    _expected_start_s = routing.expected_start_s
    _room_seconds = routing.room_seconds

    # schedule
    _schedule = schedule.schedule
    _round_inputs = schedule.round_inputs
    _in_window = staticmethod(schedule.in_window)
    _unsettled = schedule.unsettled

    # admission
    _retry_after = admission.retry_after
    _told = staticmethod(admission.told)
    _queue_or_reject = admission.queue_or_reject
    _class_must_wait = staticmethod(admission.class_must_wait)
    _service_wait = admission.service_wait
    _must_wait = admission.must_wait
    _consider = admission.consider
    _earlier_waits_for_growth = staticmethod(admission.earlier_waits_for_growth)
    _gives_way = admission.gives_way
    _one_at_a_time = admission.one_at_a_time
    _admit = admission.admit
    _kv_fit = admission.kv_fit
    _admission_need = admission.admission_need
    _reusable_cache = staticmethod(admission.reusable_cache)
    _start_admitted = admission.start_admitted

    # loading
    _loads_one_at_a_time = loading.loads_one_at_a_time
    _load_pool = loading.load_pool
    _kv_pool_fixed = loading.kv_pool_fixed
    _load_for = loading.load_for
    _load_sizes = loading.load_sizes
    _load_plan = loading.load_plan

    # wakeup
    next_wakeup = wakeup.next_wakeup
    _window_edges = wakeup.window_edges


def _as_parts(policy: AccelmuxPolicy) -> interface.Parts:
    """The class is what its parts expect (a check for mypy: it fails here if not)."""
    return policy
