"""The accelmux policy.

Admission is against ``budget - headroom - foreign - committed`` with calibrated
estimates. When a request does not fit, memory is taken back in order of cost:

1. shrink elastic KV pools of other services down to their floor (or what is in use);
2. preempt running batch/background requests of a lower class (they are re-queued);
3. evict idle, unpinned services of an equal or lower class, lowest victim score first:
   ``reload_seconds x P(reuse within horizon) x class_weight / bytes_freed``; the
   requester's own class only when strictly lower classes cannot cover the shortfall.

If that cannot make room the request waits (bounded queue, deadline) or is rejected with
a reason and Retry-After. Realtime work is protected three times: requests are scheduled
in class order; while a realtime request runs or waits on a device, no new batch or
background work starts there (it would steal compute), nor for ``realtime_grace_s``
after one ends (the next step of a voice chain follows at once); and a *realtime reserve* (the
largest activation seen per loaded realtime service) is kept free of resident memory
and of non-preemptible leases of lower classes, while on-demand non-LLM jobs (an image)
may overlap it because realtime work preempts them. Batch work also yields compute to
running interactive requests. Batch services run inside their maintenance windows, and
outside them only with spare memory and no higher class waiting.

Residency: an eviction counts the allocator cache it frees; when one victim covers the
shortfall the cheapest such one goes (not the largest). At start, warm services are
loaded into memory nobody needs yet; a warm service evicted for a short on-demand job
is restored as soon as that job's service goes idle (``RESTORE_GRACE_S``), taking memory
back from batch and background work if it has to. When only the calibration margin of a
request does not fit the device, it runs on its estimate scaled by what was measured so
far (the headroom covers the margin).

When estimates are wrong: a request is preempted at most ``MAX_PREEMPTIONS`` times; a
crash with requests in flight, or a sample measuring running requests above their
leases, raises the service's calibration at once; memory measured above the leases is
charged to the service using it (one request at a time, its own work given back first);
and work a waiting higher class could preempt still runs in idle memory (fair progress).
Each heuristic has a name in ``HEURISTICS`` and can be turned off (``policy.disable``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from accelmux.core.events import Demand
from accelmux.core.placement import first_up
from accelmux.core.specs import seconds_until_next_sorted
from accelmux.core.state import RequestState, ServiceSet, ServiceState, World, reuse_rate
from accelmux.core.types import (
    Category,
    Reason,
    Residency,
    ResizeSupport,
    ServiceClass,
    ServiceStatus,
    Tier,
)


@dataclass(slots=True)
class _Round:
    """Per-decide scratch state."""

    blocked: dict[str, ServiceClass] = field(default_factory=dict)
    realtime_active: set[str] = field(default_factory=set)
    #: Devices with realtime work running, waiting or within its grace (realtime_yield).
    realtime_work: set[str] = field(default_factory=set)
    interactive_active: set[str] = field(default_factory=set)
    higher_waiting: dict[str, ServiceClass] = field(default_factory=dict)
    #: Devices where this round would repeat a round that changed nothing.
    quiet: set[str] = field(default_factory=set)
    #: (service, class) -> (world.version, outside its windows, why it waits): see
    #: AccelmuxPolicy._service_wait.
    waits: dict[tuple[str, ServiceClass], tuple[int, bool, tuple[Reason, str] | None]] = field(
        default_factory=dict
    )
    #: The time of day (windows): the round's time does not change.
    tod: float = 0.0
    #: Per service with windows, whether one is open (see AccelmuxPolicy._in_window).
    inside: dict[str, bool] = field(default_factory=dict)


@dataclass(slots=True)
class _Survey:
    """What make_room found it could free on a device (see AccelmuxPolicy._survey)."""

    shrinks: list[tuple[ServiceState, int]] = field(default_factory=list)
    preempts: list[RequestState] = field(default_factory=list)
    victims: list[ServiceState] = field(default_factory=list)
    #: Bytes the shrinks, stops and evictions would free, beyond what is free or on its
    #: way back.
    gain: int = 0


#: The policy's heuristics by name, each of which ``policy.disable`` can turn off (for
#: ablation: what each one buys is measured by running without it).
HEURISTICS: dict[str, str] = {
    "realtime_reserve": "keep the next activation of each loaded realtime service free "
    "of resident memory and of lower-class leases",
    "realtime_hold": "start no batch or background work on a device while realtime work "
    "runs or waits there",
    "batch_yield": "batch work yields compute to running interactive requests",
    "preemption": "stop (and re-queue) running lower-class work to make room",
    "preemption_bound": "a request preempted MAX_PREEMPTIONS times is no longer preemptible",
    "evict_after_preemption": "a service whose running work is all preempted to make room "
    "counts as a victim too: it is evicted once idle (a busy batch model gives way to an "
    "interactive one, not only its leases)",
    "ballooning": "shrink elastic KV pools when idle and to make room",
    "victim_scoring": "evict by reload cost x reuse probability x class weight per byte "
    "(off: least recently used first)",
    "single_victim": "when one victim covers the shortfall, evict the cheapest such one",
    "lower_class_first": "evict services of a strictly lower class than the requester's "
    "while they can cover the shortfall; its own class goes only when they cannot (a voice "
    "request must not evict the next step of its own chain while a chat model sits idle)",
    "cache_reuse": "a service's own allocator cache counts as room for its requests",
    "cache_accounting": "a service measured caching freed memory keeps what its finished "
    "or preempted requests held (charged to it until a sample or its unload): preempting "
    "it frees nothing until it unloads, so it is evicted, or others yield",
    "degrade_to_raw": "when only the calibration margin does not fit, run on the estimate "
    "scaled by the worst measured ratio, without margin (off: reject as too large)",
    "calibration": "scale estimates by the worst recent observed/estimated ratio "
    "(off: the safety factor alone)",
    "failure_calibration": "a crash with requests in flight, a load out of memory, or "
    "running requests measured above their leases, raises the service's calibration at once",
    "pressure_charging": "memory measured above what was accounted is charged to the "
    "service using it: it runs one request at a time and gives its own work back first",
    "fair_progress": "work a waiting higher class could preempt still loads and runs in "
    "idle memory (it takes memory from no one)",
    "on_demand_keep": "an idle on-demand service stays loaded past on_demand_ttl_s while "
    "its device's memory is not wanted (it is evicted first when it is)",
    "idle_keep": "an idle service stays loaded past its ttl_s while its device has memory "
    "to spare: nothing waits for memory there and more than the realtime reserve plus the "
    "spare fraction of the budget is free (its TTL applies again once less is); a realtime "
    "service always (only a realtime request evicts it, when lower classes cannot make "
    "the room)",
    "restore": "a warm service evicted for a short on-demand job is restored as soon as "
    "that job's service goes idle",
    "prewarm": "load warm services at start and reload likely-reused evicted ones into "
    "spare memory",
    "pause": "running LLM requests whose backend can pause are paused (their KV parked) "
    "instead of preempted: nothing is lost or redone when they resume",
    "time_share": "an LLM request waiting for its first token may pause the running "
    "streams of another model of its class (after TIME_SHARE_MIN_RUN_S of theirs) so "
    "that their model unloads to host RAM and its own loads: models switch between "
    "tokens instead of a request waiting out a whole answer; a paused stream may do the "
    "same after TIME_SHARE_QUANTUM_S of theirs",
    "first_token_pause": "a new request of a model at its concurrency limit pauses the "
    "stream of that model that has run longest (at least TIME_SHARE_MIN_RUN_S): it gets "
    "its first token now, the paused stream resumes at the next free slot",
    "realtime_yield": "while realtime work runs or waits on a device, interactive LLM "
    "streams there that can pause are paused between tokens (their KV kept in place) and "
    "new ones wait: the realtime work gets the compute, the streams resume after it",
    "reserve_fallback": "when the full realtime reserve would keep a lower-class load or "
    "request out for good although it fits the device, one realtime activation is kept "
    "free instead",
    "reserve_lending": "the realtime reserve may be held by services below realtime that one "
    "unload each gives back: idle ones, and ones running only work realtime preempts (a "
    "voice request then waits for an unload, not for another model's request to end); only "
    "the rest of it must be free",
    "serial_loads": "once a load has run out of memory on a device, loads there go one at "
    "a time: the next waits until the one in flight is done and measured",
    "placement": "a request for a service with replicas on several devices goes to the "
    "replica expected to start it soonest: a free loaded one, else the shortest queue or a "
    "load where memory is free or held by idle services (a second replica of a busy "
    "service loads when that is sooner than its queue); off: the replica that is up",
    "park_weights": "an unloaded model keeps its weights in host RAM (parked or sleeping, "
    "as its backend declares) within the host budget; victims are scored by the reload "
    "cost of the tier they land in",
}

#: A request is preempted at most this many times; after that it is no longer
#: preemptible (by higher classes, foreign pressure or its own over-use) and runs to its
#: end. Preemption thus cannot livelock: every preemption brings a request closer to it.
MAX_PREEMPTIONS = 3

#: A request is paused for time sharing at most this many times (each pause costs it
#: only time between two tokens: its output so far and its KV state are kept).
MAX_PAUSES = 4
#: Seconds a stream runs before a request of another model waiting for its first
#: token may pause it (its own first token is out by then), and before a paused stream
#: may pause it in turn (a quantum: models do not switch back and forth faster).
TIME_SHARE_MIN_RUN_S = 1.0
TIME_SHARE_QUANTUM_S = 5.0

#: Measured activation memory within this much of what was accounted is noise.
EXCESS_TOLERANCE = 16 * 1024 * 1024

#: A restore that evicted others for its room, and found the room taken by demand when
#: the evictions were done, evicts for it again only after this long: a speculative
#: reload never livelocks with the work it displaces.
RESTORE_RETRY_S = 30.0

#: Idle seconds after which an on-demand service goes when it holds the memory of an
#: evicted warm service that is likely to be used again (restore it sooner).
RESTORE_GRACE_S = 1.0


class AccelmuxPolicy:
    name = "accelmux"
    infinite_memory = False
    enforces_budget = True
    #: Up to this many waiting requests a round considers them all, skipping nothing.
    few_waiting = 8

    def __init__(self) -> None:
        #: Largest projected activation of each realtime service's requests so far, and
        #: how often one grew.
        self._rt_peak: dict[str, int] = {}
        self._rt_peak_changes = 0
        #: device -> (its epoch, _rt_peak_changes, the realtime reserve found then).
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
        #: Per-round memo of make_room failures: (device, class, strict, requester holding
        #: memory, a time-sharing requester) -> (device epoch, the most it could free).
        self._room_failed: dict[
            tuple[str, ServiceClass, bool, str | None, object], tuple[int, int]
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
        #: Per device, (epoch, round inputs) of the last schedule that changed nothing there.
        self._quiet: dict[str, tuple[int, tuple[object, ...]]] = {}
        #: Services measured above what was accounted at the last sample: name -> bytes.
        self._charged: dict[str, int] = {}
        #: Highest activation memory measured per loaded service: a caching allocator may
        #: keep that much reserved, so only a measurement above it shows an over-estimate.
        self._high_water: dict[str, int] = {}
        #: Services measured holding activation memory while idle (a caching allocator).
        self._caching: set[str] = set()
        #: When a restore of each service last evicted others to make its room.
        self._restore_tried_at: dict[str, float] = {}
        #: Crash count of each service when last seen (what its requests held when it
        #: crashed: ``ServiceState.crash_held``).
        self._seen_crashes: dict[str, int] = {}
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

    # ---- Protocol -------------------------------------------------------------
    def start(self, world: World, now: float) -> None:
        self._keep_pinned_loaded(world)
        if world.knobs.prewarm and world.knobs.enabled("prewarm"):
            self._preload_warm(world)

    def _learn(self, world: World) -> None:
        """Learn from being wrong, at once: crashes and measurements above the leases.

        A crash with requests in flight (an OOM kills the service that asked) raises the
        service's calibration to at least twice what those requests held. After each
        memory sample, a running service whose measured activation memory exceeds its
        leases and the highest activation measured before (what a caching allocator may
        still hold from earlier requests) is *charged* with the excess:
        its calibration rises to what was measured, and until it is measured within its
        leases it runs one request at a time and gives back its own work first under
        pressure (``_relieve_pressure``).

        What it learns changes decisions on the service's device, so it touches the
        device's epoch (a round there is not a repeat of an earlier one).
        """
        knobs = world.knobs
        learn = knobs.enabled("failure_calibration")
        for svc in self._learners(world):
            name = svc.name
            dev = svc.spec.device
            if svc.crashes != self._seen_crashes.get(name, 0):
                self._seen_crashes[name] = svc.crashes
                world.touch(dev)
                if learn:
                    for estimated, lease in svc.crash_held:
                        world.observe_failure(svc, estimated, lease)
            if world.sampled_at.get(dev) != world.now:
                if not svc.inflight and self._charged.pop(name, None) is not None:
                    world.touch(dev)
                continue
            world.touch(dev)
            if not svc.holds_memory:
                self._high_water.pop(name, None)
                self._charged.pop(name, None)
                continue
            # What the load measured above its leases is resident memory, not activations.
            reserved = max(0, world.ledger.amount(dev, name, Category.RESERVED) - svc.load_excess)
            leases = sum(r.active_lease.nbytes for r in svc.inflight.values() if r.active_lease)
            measured = reserved + leases
            before = self._high_water.get(name, 0)
            self._high_water[name] = max(before, measured)
            excess = measured - max(leases, before)
            if not svc.inflight and reserved > EXCESS_TOLERANCE:
                # a property of the backend: every replica of the service caches alike
                self._caching.add(svc.spec.addressed_as)
                if knobs.enabled("cache_accounting"):
                    world.mark_caching(svc)
            if not svc.inflight or excess <= EXCESS_TOLERANCE:
                self._charged.pop(name, None)
                continue
            self._charged[name] = excess
            if learn:
                estimated = sum(r.estimate.active_bytes for r in svc.inflight.values())
                world.observe_excess(svc, estimated, measured)

    def _learners(self, world: World) -> list[ServiceState]:
        """The services :meth:`_learn` may learn from this round, in spec order.

        A crash leaves its service CRASHED until the round after it (the Manager applies
        the event, then the policy decides), a charge is lifted only from a charged
        service, and measurements come for the services of a device sampled now: every
        other service would pass through ``_learn`` unchanged, so it is not visited.
        """
        found = {s.name: s for s in world.crashed}
        for name in self._charged:
            found[name] = world.services[name]
        for dev, at in world.sampled_at.items():
            if at == world.now:
                found.update((s.name, s) for s in world.services_by_device[dev])
        return sorted(found.values(), key=lambda s: s.index)

    def _may_preempt(self, world: World, req: RequestState) -> bool:
        """A request may be preempted again: it has not reached the bound."""
        return not world.knobs.enabled("preemption_bound") or req.attempt <= MAX_PREEMPTIONS

    def _may_stop(self, world: World, req: RequestState) -> bool:
        """A running request may be stopped for higher-class work: paused (below the
        pause bound) when its backend can pause, else preempted (below that bound)."""
        if self._can_pause(world, world.services[req.service]):
            return req.pauses < MAX_PAUSES
        return self._may_preempt(world, req)

    def _stop(
        self, world: World, req: RequestState, cls: ServiceClass, requester: RequestState | None
    ) -> None:
        """Stop a running request to make room: pause and park it when its backend can,
        else preempt it (it starts again later)."""
        svc = world.services[req.service]
        if req.pausing is not None:
            return  # its pause is under way: its memory comes back with the answer
        if self._can_pause(world, svc):
            why = requester.request_id if requester is not None else f"class {cls.label}"
            if world.pause(req, reason=Reason.TIME_SHARE, park=True, detail=f"room for {why}"):
                if requester is not None:
                    self._yielded_to[req.request_id] = requester.request_id
                return
        world.preempt(
            req, reason=Reason.PREEMPTED_FOR_HIGHER_CLASS, detail=f"room for class {cls.label}"
        )

    def _pause_for_first_token(self, world: World, svc: ServiceState, req: RequestState) -> bool:
        """A new request of a service at its concurrency limit pauses the stream of that
        service that has run longest (at least ``TIME_SHARE_MIN_RUN_S``, below the
        pause bound): it gets its first token now, the paused stream resumes at the
        next free slot. Its KV state is parked only when the pool must make room."""
        if (
            req.paused
            or not world.knobs.enabled("first_token_pause")
            or not self._can_pause(world, svc)
        ):
            return False
        if not svc.spec.kind.is_llm:
            return False
        ran = [
            r
            for r in svc.inflight.values()
            if r.running_since is not None
            and world.now - r.running_since >= TIME_SHARE_MIN_RUN_S
            and r.pauses < MAX_PAUSES
            and r.pausable
            and r.pausing is None
        ]
        if not ran:
            return False
        victim = min(ran, key=lambda r: (r.running_since or 0.0, r.seq))
        park = svc.kv_in_use + req.estimate.kv_bytes > svc.kv_usable
        return world.pause(
            victim, reason=Reason.TIME_SHARE, park=park, detail=f"first token of {req.request_id}"
        )

    def _yielding(self, world: World, req: RequestState) -> bool:
        """Whether paused ``req`` still leaves its memory to the request it was paused
        for: until that one has started (or ended)."""
        other = self._yielded_to.get(req.request_id)
        if other is None:
            return False
        waiting = world.waiting.get(other)
        if waiting is not None and not waiting.paused:
            return True
        del self._yielded_to[req.request_id]
        return False

    @staticmethod
    def _sharing_key(world: World, requester: RequestState | None) -> object:
        """What a make_room failure depends on beyond its class: what time sharing reads
        of the requester, when it may pause other models' streams (:meth:`_time_shared`:
        its service, whether that is an LLM, whether it is paused). Requests alike in
        these share a failure (the memo lasts one round: the time does not change)."""
        if requester is None or not world.knobs.enabled("time_share"):
            return None
        return (requester.service, requester.paused)

    def _room_key(self, world: World, device: str, requester: RequestState | None) -> object:
        """:meth:`_sharing_key`, or None where no service of ``device`` can be paused for
        time sharing (then no requester's state changes what make_room can free)."""
        if device not in self._time_sharing_devices(world):
            return None
        return self._sharing_key(world, requester)

    def _time_sharing_devices(self, world: World) -> frozenset[str]:
        """Devices with an LLM service whose backend can pause (what the spec and the
        knobs declare: found once per World)."""
        kept = self._sharing_devices
        if kept is None or kept[0] is not world:
            found = frozenset(
                s.spec.device
                for s in world.services.values()
                if s.spec.kind.is_llm and self._can_pause(world, s)
            )
            kept = self._sharing_devices = (world, found)
        return kept[1]

    def _preload_warm(self, world: World) -> None:
        """At start, load warm services (class order) into memory nobody else needs yet."""
        order = sorted(world.services.values(), key=lambda s: (int(s.spec.cls), s.name))
        for svc in order:
            if (
                svc.status is not ServiceStatus.UNLOADED
                or svc.spec.residency is not Residency.WARM
                or not svc.spec.in_window(world.time_of_day())
                or not self._placed_here(world, svc)
            ):
                continue
            dev = svc.spec.device
            pool = self._load_pool(world, svc, svc.spec.profile.kv_floor)
            need = sum(world.projected_resident(svc, pool))
            if need + self._realtime_reserve(world, dev) <= world.ledger.available(dev):
                world.load(svc, reason=Reason.PRELOAD, kv_pool=pool, detail="warm at start")

    def decide(self, world: World, now: float) -> None:
        self._memo.clear()
        self._room_failed.clear()
        self._restorable_memo.clear()
        self._restores_memo.clear()
        self._rt_devices = None
        if len(self._sizes) > 2 * len(world.waiting) + 64:
            self._sizes = {k: v for k, v in self._sizes.items() if k in world.waiting}
        if world.knobs.enabled("realtime_yield") and world.busy:
            self._yield_to_realtime(world)
        if self._yielded_to:
            self._yielded_to = {
                r: o
                for r, o in self._yielded_to.items()
                if r in world.waiting or _pausing(world, r)
            }
        if self._yielded_realtime:
            self._yielded_realtime = {
                r
                for r in self._yielded_realtime
                if ((q := world.waiting.get(r)) and q.paused) or _pausing(world, r)
            }
        self._learn(world)
        self._admin_unloads(world)
        self._relieve_pressure(world)
        self._keep_pinned_loaded(world)
        if world.groups and world.knobs.enabled("placement"):
            self._reroute_to_free_replicas(world)
        self._schedule(world)
        self._expire_idle(world)
        if world.knobs.enabled("ballooning"):
            self._balloon(world)
        if world.knobs.prewarm and world.knobs.enabled("prewarm"):
            self._prewarm(world)

    def next_wakeup(self, world: World, now: float) -> float | None:
        # The earliest of the times below after ``now``. A TTL that a pending restore
        # would shorten is settled last, and only when either TTL could be the earliest.
        best: float | None = None
        unsure: list[tuple[ServiceState, float, float]] = []
        tod = world.time_of_day(now)
        balloon_idle_s = world.knobs.balloon_idle_s
        for svc in world.loaded:  # the World's indexes: only services that can ask
            if svc.idle and not self._keep(svc):
                short, ttl = self._ttl_range(world, svc)
                if short < ttl:
                    unsure.append((svc, short, ttl))
                elif math.isfinite(ttl):
                    t = svc.last_used + ttl
                    if t > now and (best is None or t < best):
                        best = t
            if svc.kv_pool > svc.spec.profile.kv_floor and world.resizable(svc):
                t = svc.last_used + balloon_idle_s
                if t > now and (best is None or t < best):
                    best = t
        for svc in world.kept:
            t = svc.backoff_until
            if t > now and (best is None or t < best):
                best = t
        for svc in world.queued:
            t = svc.backoff_until
            if t > now and (best is None or t < best):
                best = t
        edges = self._window_edges(world)
        if edges:  # the next edge of any window of a service with waiting requests
            t = now + seconds_until_next_sorted(edges, tod)
            if t > now and (best is None or t < best):
                best = t
        grace = world.knobs.realtime_grace_s
        if grace > 0:
            for svcs in world.realtime_by_device.values():
                for svc in svcs:  # held work resumes
                    t = svc.last_used + grace
                    if t > now and (best is None or t < best):
                        best = t
        for svc, short, ttl in unsure:
            # ``short`` (finite) if a restore is pending, else ``ttl`` (inf: no wake-up).
            pending = svc.last_used + short
            not_pending = svc.last_used + ttl if math.isfinite(ttl) else None
            if any(
                t is not None and t > now and (best is None or t < best)
                for t in (pending, not_pending)
            ):
                chosen = pending if self._restore_pending(world, svc) else not_pending
                if chosen is not None and chosen > now and (best is None or chosen < best):
                    best = chosen
        return best

    def _window_edges(self, world: World) -> tuple[float, ...]:
        """The edges of the windows of the services with waiting requests (sorted, each
        once), kept while those services stay the same."""
        queued = world.queued
        memo = self._edges_memo
        if memo is None or memo[0] is not queued or memo[1] != queued.version:
            edges = {e for svc in queued for w in svc.spec.windows for e in w.edges}
            memo = self._edges_memo = (queued, queued.version, tuple(sorted(edges)))
        return memo[2]

    # ---- helpers ----------------------------------------------------------------
    @staticmethod
    def _keep(svc: ServiceState) -> bool:
        return svc.pinned or svc.admin_wants_loaded

    def _ttl(self, world: World, svc: ServiceState) -> float:
        short, ttl = self._ttl_range(world, svc)
        if short < ttl and self._restore_pending(world, svc):
            return short
        return ttl

    def _ttl_range(self, world: World, svc: ServiceState) -> tuple[float, float]:
        """(the TTL if a restore is pending, the TTL if not) of ``svc``, without asking
        whether one is (:meth:`_restore_pending` is the costly part of a TTL)."""
        knobs = world.knobs
        if svc.spec.residency is Residency.ON_DEMAND:
            ttl = svc.ttl_s
            if not knobs.enabled("on_demand_keep") or self._memory_wanted(world, svc):
                ttl = min(ttl, knobs.on_demand_ttl_s)
            elif knobs.enabled("idle_keep") and self._memory_spare(world, svc):
                ttl = math.inf
            if knobs.prewarm and knobs.enabled("restore"):
                return min(ttl, RESTORE_GRACE_S), ttl
            return ttl, ttl
        if knobs.enabled("idle_keep") and self._memory_spare(world, svc):
            return math.inf, math.inf
        return svc.ttl_s, svc.ttl_s

    def _idle_past_ttl(self, world: World, svc: ServiceState) -> bool:
        """``world.now - svc.last_used >= self._ttl(world, svc)``, asking whether a
        restore is pending only when the answer depends on it."""
        idle_s = world.now - svc.last_used
        short, ttl = self._ttl_range(world, svc)
        if idle_s >= ttl:
            return True
        if idle_s < short:
            return False
        return self._restore_pending(world, svc)

    def _memory_wanted(self, world: World, svc: ServiceState) -> bool:
        """Whether memory an idle on-demand service holds is wanted by something else.

        It is while a request waits for memory on its device, or when less than the
        realtime reserve is free (a voice request then finds its room without an
        eviction first).
        Work held back for a higher class (``higher_class_waiting``) does not want it:
        it waits for compute, or for a higher class's request that itself waits for
        memory (and counts here).
        """
        dev = svc.spec.device
        key = ("memory_wanted", dev)
        hit = self._memo.get(key)  # the same for every service of the device, per version
        if hit is not None and hit[0] == world.version:
            return bool(hit[1])
        causes = world.waiting_causes  # waiting requests per (device, class, wait reason)
        wanted = any(
            causes.get((dev, cls, Reason.NO_MEMORY)) for cls in ServiceClass
        ) or world.ledger.available(dev) < self._realtime_reserve(world, dev)
        self._memo[key] = (world.version, int(wanted))
        return wanted

    def _memory_spare(self, world: World, svc: ServiceState) -> bool:
        """Whether ``svc``'s device has memory to spare: nothing wants what is loaded
        (:meth:`_memory_wanted`) and more than the realtime reserve plus the spare
        fraction of the budget is free (room for a foreign process to start).

        While it has, an idle service stays loaded past its TTL (``idle_keep``): memory
        nobody wants is worth more holding a model than empty, and it is given back the
        moment it is wanted (eviction by score, or the TTL once less is spare). A realtime
        service's memory is spare unless realtime work waits for memory on its device (a
        voice cold start is what the reserve exists to prevent, and no lower class may
        take a voice model's memory), and a service whose client gave a keep_alive has
        exactly that (never "spare")."""
        if svc.keep_alive_s is not None:
            return False  # a client's keep_alive is kept to the second
        if svc.spec.cls is ServiceClass.REALTIME:
            # Lower classes never take a voice service's memory (they cannot evict it
            # either), and realtime work waiting for memory evicts what it needs itself,
            # lower classes first (make_room): a TTL on top of that would also unload
            # the next steps of the voice chain that is waiting.
            return True
        dev = svc.spec.device
        key = ("memory_spare", dev)
        hit = self._memo.get(key)  # the same for every service of the device, per version
        if hit is not None and hit[0] == world.version:
            level = hit[1]
        else:
            # 0: wanted; 1: not wanted, less than the spare fraction free; 2: spare
            level = 0
            if not self._memory_wanted(world, svc):
                spare = world.knobs.spare_fraction * world.devices[dev].usable_bytes
                free = world.ledger.available(dev) - self._realtime_reserve(world, dev)
                level = 2 if free >= spare else 1
            self._memo[key] = (world.version, level)
        return level == 2

    @staticmethod
    def _likely_reused(world: World, svc: ServiceState) -> bool:
        horizon = world.knobs.reuse_horizon_s
        return 1.0 - math.exp(-reuse_rate(svc, world.now, horizon) * horizon) >= 0.5

    def _restore_pending(self, world: World, holder: ServiceState) -> bool:
        """A warm service evicted for memory on ``holder``'s device, of a class at least
        as high as ``holder``'s, is likely to be used again, sooner than ``holder`` (an
        on-demand service used more often than what it displaced keeps its place), and
        would fit once ``holder`` is gone (no service is unloaded for a restore that
        cannot happen).

        Asked by the TTL expiry and again by the next wake-up: kept until anything
        changes (an action) or time passes, and for the round only (decide clears it).
        """
        stamp = (world.version, world.now)
        hit = self._restores_memo.get(holder.name)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        pending = self._compute_restore_pending(world, holder)
        self._restores_memo[holder.name] = (stamp, pending)
        return pending

    def _compute_restore_pending(self, world: World, holder: ServiceState) -> bool:
        horizon = world.knobs.reuse_horizon_s
        own = reuse_rate(holder, world.now, horizon)
        dev = holder.spec.device
        room = world.ledger.available(dev) + self.unload_frees(world, holder)
        version = world.version
        for candidate in self._restorable(world, dev):
            s, rate, need, computed_at = candidate
            if s.spec.cls <= holder.spec.cls and rate > own:
                if computed_at != version:  # the need reads the ledger and the reserve
                    pool = self._load_pool(world, s, s.spec.profile.kv_floor)
                    need = candidate[2] = self._restore_need(world, s, pool)
                    candidate[3] = version
                if need <= room:
                    return True
        return False

    def _restorable(self, world: World, device: str) -> list[list[Any]]:
        """The warm services evicted from ``device`` that are likely to be used again, in
        spec order, as ``[service, reuse rate, restore need, the world.version it was
        computed at (None: not yet)]``.

        What every holder's :meth:`_restore_pending` asks about them: kept while the
        evicted services stay the same and time does not pass, for the round only
        (decide clears it; reuse rates change only with arrivals, between rounds).
        """
        stamp = (world.evicted_out.version, world.now)
        hit = self._restorable_memo.get(device)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        horizon = world.knobs.reuse_horizon_s
        found: list[list[Any]] = []
        evicted = world.evicted_out
        for s in self._warm_services(world, device):  # spec order, as evicted_out's
            if s in evicted:  # evicted and unloaded since
                rate = reuse_rate(s, world.now, horizon)
                if 1.0 - math.exp(-rate * horizon) >= 0.5:  # _likely_reused
                    found.append([s, rate, 0, None])
        self._restorable_memo[device] = (stamp, found)
        return found

    def _warm_services(self, world: World, device: str) -> list[ServiceState]:
        """The warm services of ``device``, in spec order (what the spec says)."""
        self._know_warm(world)
        return self._warm[device]

    def _know_warm(self, world: World) -> None:
        """Find ``world``'s warm services once: per device, and all in class order."""
        if self._warm_world is not world:
            self._warm_world = world
            self._warm = {
                dev: [s for s in svcs if s.spec.residency is Residency.WARM]
                for dev, svcs in world.services_by_device.items()
            }
            self._warm_ordered = sorted(
                (s for svcs in self._warm.values() for s in svcs),
                key=lambda s: (int(s.spec.cls), s.name),
            )

    def _warm_in_class_order(self, world: World) -> list[ServiceState]:
        """Every warm service, in class order then by name (what the spec says)."""
        self._know_warm(world)
        return self._warm_ordered

    def _restore_need(self, world: World, svc: ServiceState, pool: int) -> int:
        """Free memory a prewarm of ``svc`` with a KV pool of ``pool`` needs: its resident
        size, plus the realtime reserve and a tenth of the budget left free after it
        (memory measured only at the next sample, e.g. an allocator's cache)."""
        dev = svc.spec.device
        spare = self._realtime_reserve(world, dev) + world.devices[dev].usable_bytes // 10
        return sum(world.projected_resident(svc, pool)) + spare

    @staticmethod
    def _preemptible(svc: ServiceState, cls: ServiceClass) -> bool:
        """Whether work of ``svc`` may be stopped (and re-queued) for class ``cls``.

        Batch and background work yields to any higher class; a non-LLM on-demand
        interactive job (an image) yields to realtime work: it restarts a few seconds
        later within its looser SLO, while a voice request cannot wait.
        """
        if svc.spec.cls <= cls:
            return False
        if svc.spec.cls >= ServiceClass.BATCH:
            return True
        return (
            cls is ServiceClass.REALTIME
            and svc.spec.residency is Residency.ON_DEMAND
            and not svc.spec.kind.is_llm
        )

    def _realtime_reserve(self, world: World, device: str) -> int:
        """Memory kept free for the next requests of loaded realtime services.

        Lower classes may not take it: a voice request never waits for memory that
        chat or batch work holds. Sized by the largest activation seen per service
        (its workspace estimate before any request), minus what its requests hold now.
        """
        if not world.knobs.enabled("realtime_reserve"):
            return 0
        key = ("realtime_reserve", device)
        version = world.version
        hit = self._memo.get(key)  # _cached, inlined: asked for every request considered
        if hit is not None and hit[0] == version:
            return hit[1]
        # It reads the device's realtime services (their state moves the device's epoch)
        # and the peaks seen: while neither changed, the last value found still holds.
        epoch = world.epoch(device)
        last = self._reserves.get(device)
        if last is not None and last[0] == epoch and last[1] == self._rt_peak_changes:
            value = last[2]
        else:
            value = self._compute_realtime_reserve(world, device)
            self._reserves[device] = (epoch, self._rt_peak_changes, value)
        self._memo[key] = (version, value)
        return value

    def _yields_to_realtime(self, world: World, svc: ServiceState) -> bool:
        """Whether realtime work takes ``svc``'s activation leases back at once: it is
        preempted, or (an interactive LLM that can pause) paused between tokens.

        What the spec and the knobs say: found once per service."""
        facts = self._static_facts(world)
        found = facts.get(svc.name)
        if found is None:
            found = facts[svc.name] = self._compute_yields_to_realtime(world, svc)
        return found

    def _static_facts(self, world: World) -> dict[str, bool]:
        """Per service, what :meth:`_yields_to_realtime` found (for ``world`` only)."""
        if self._facts_world is not world:
            self._facts_world = world
            self._facts = {}
        return self._facts

    def _compute_yields_to_realtime(self, world: World, svc: ServiceState) -> bool:
        if self._preemptible(svc, ServiceClass.REALTIME):
            return True
        return (
            svc.spec.kind.is_llm
            and svc.spec.cls is ServiceClass.INTERACTIVE
            and self._can_pause(world, svc)
            and world.knobs.enabled("time_share")
        )

    def _fitting_reserve(self, world: World, svc: ServiceState, need: int, limit: int) -> int:
        """The realtime reserve a lower-class need of ``need`` bytes of ``svc`` must leave
        free, when at most ``limit`` bytes could ever be freed for it.

        The full reserve holds every loaded realtime service's next activations at once.
        When that would keep ``need`` out for good although it fits the device
        (``reserve_fallback``), it leaves one realtime activation free instead (the
        largest: a voice chain runs one step at a time). When ``need`` fits in free
        memory, services realtime work can take back by one unload may hold the reserve
        (``reserve_lending``): only the rest of it must be free.
        """
        device = svc.spec.device
        reserve = full = self._realtime_reserve(world, device)
        if need + full > limit >= need and world.knobs.enabled("reserve_fallback"):
            largest = max(
                (
                    self._typical_activation(s)
                    for s in world.realtime_by_device[device]
                    if s.holds_memory
                ),
                default=0,
            )
            reserve = min(full, largest)
        available = world.ledger.available(device)
        if need <= available < need + reserve and world.knobs.enabled("reserve_lending"):
            # Lent only when ``need`` fits in free memory: the services that hold the
            # rest must stay to be given back, so none of them is evicted for ``need``.
            lent = max(0, reserve - self._quickly_freeable(world, device, svc))
            if available >= need + lent:
                return lent
        return reserve

    def _loads_one_at_a_time(self, world: World, device: str) -> bool:
        """A load has run out of memory on ``device`` and another load is in flight there
        (``serial_loads``): a second load waits for it. A load's true size is known only
        once it is measured, so two loads side by side on a device where one was already
        larger than its ledger said can both fail, and a service a second time."""
        if device not in world.load_oom_devices or not world.knobs.enabled("serial_loads"):
            return False
        return any(s.status is ServiceStatus.LOADING for s in world.services_by_device[device])

    def _quickly_freeable(self, world: World, device: str, exclude: ServiceState) -> int:
        """Memory realtime work could take back on ``device`` by one unload each: what
        the services below realtime that it may evict hold (``exclude`` aside; see
        :meth:`_freeable_for_realtime`).

        The realtime reserve only has to be free *or* this (``reserve_lending``): a voice
        request that finds it held by an idle chat model waits for one unload, not for
        the model's next request to end."""
        total = self._cached(  # what it reads moves the device's epoch
            world,
            ("quickly_freeable", device),
            lambda: self._sum_quickly_freeable(world, device),
            stamp=world.epoch(device),
        )
        if self._freeable_for_realtime(world, exclude):
            total -= self.unload_frees(world, exclude)
        return max(0, total)

    def _sum_quickly_freeable(self, world: World, device: str) -> int:
        return sum(
            self.unload_frees(world, s)
            for s in world.loaded_on(device)
            if self._freeable_for_realtime(world, s)
        )

    def _freeable_for_realtime(self, world: World, svc: ServiceState) -> bool:
        """Realtime work could take all ``svc`` holds back by one unload: it is loaded,
        below realtime, not kept, and idle, or running only work realtime preempts (a
        batch or background job below its preemption bound), which it then evicts."""
        if (
            svc.status is not ServiceStatus.LOADED
            or svc.spec.cls <= ServiceClass.REALTIME
            or self._keep(svc)
        ):
            return False
        if svc.idle:
            return True
        knobs = world.knobs
        return (
            knobs.enabled("preemption")
            and knobs.enabled("evict_after_preemption")
            and not svc.paused_kv
            and self._preemptible(svc, ServiceClass.REALTIME)
            and all(self._may_preempt(world, r) for r in svc.inflight.values())
        )

    def _typical_activation(self, svc: ServiceState) -> int:
        """A realtime service's next activation: the largest projected so far, or its
        workspace estimate before any request."""
        typical = self._rt_peak.get(svc.name)
        if typical is None:
            typical = svc.calibration.active.project(svc.spec.profile.workspace)
        return typical

    def _compute_realtime_reserve(self, world: World, device: str) -> int:
        total = 0
        for s in world.realtime_by_device[device]:
            if not s.holds_memory:
                continue
            typical = self._typical_activation(s)
            held = sum(r.active_lease.nbytes for r in s.inflight.values() if r.active_lease)
            total += max(0, s.spec.concurrency * typical - held)
        return total

    # ---- placement ------------------------------------------------------------------
    def route(self, world: World, replicas: Sequence[ServiceState], demand: Demand) -> ServiceState:
        """The replica expected to start a new request of ``demand`` soonest, to 0.1 s
        (ties: the device left with the most free memory, then the one running fewer
        requests, then config order). Routing to a replica that is not loaded loads it:
        placement and a second replica for a busy service are both decided here."""
        if not world.knobs.enabled("placement"):
            return first_up(replicas)
        # A second replica is worth only memory nobody else holds: once one replica is
        # up, another is a candidate only where it fits in free memory.
        any_up = any(r.holds_memory for r in replicas)
        # what making room costs each replica that is neither loaded nor loading
        up = (ServiceStatus.LOADED, ServiceStatus.LOADING)
        room = {
            r.name: self._room_seconds(world, r, demand) for r in replicas if r.status not in up
        }
        candidates = [
            r for r in replicas if r.holds_memory or not any_up or room.get(r.name) == 0.0
        ]
        return min(
            candidates,
            key=lambda r: (
                round(self._expected_start_s(world, r, room.get(r.name)), 1),
                # then worst fit: the device left with the most free memory, so models
                # spread out and the next load evicts no one
                -(
                    world.ledger.available(r.spec.device)
                    - (0 if r.holds_memory else self._footprint(world, r))
                ),
                sum(len(s.inflight) for s in world.loaded_on(r.spec.device)),
                r.index,
            ),
        )

    @staticmethod
    def _reroute_to_free_replicas(world: World) -> None:
        """A request waiting on a replica that is not loaded moves to a loaded replica
        of its service with a free slot and no queue: it starts there now."""
        for replicas in world.groups.values():
            free = [
                r
                for r in replicas
                if r.status is ServiceStatus.LOADED
                and not r.queue
                and len(r.inflight) < r.spec.concurrency
            ]
            if not free:
                continue
            waiting = sorted(
                (
                    q
                    for r in replicas
                    if r.status is not ServiceStatus.LOADED
                    for q in r.queue.values()
                    if q.dispatched_at is None and not q.paused
                ),
                key=lambda q: q.queued_mark,
            )
            for to in free:
                for _ in range(to.spec.concurrency - len(to.inflight)):
                    if not waiting:
                        return
                    world.reroute(waiting.pop(0), to, detail="a replica is free now")

    @staticmethod
    def _other_replica_up(world: World, svc: ServiceState) -> bool:
        """Whether another replica of ``svc``'s service holds memory: a spare replica
        is loaded only for a request (:meth:`route`), never to keep warm."""
        group = svc.spec.group
        return bool(group) and any(r.holds_memory for r in world.groups[group] if r is not svc)

    def _placed_here(self, world: World, svc: ServiceState) -> bool:
        """Whether a warm service preloads as ``svc``: an ordinary service does; of a
        service with replicas only the one placement picks, and only while none is up."""
        group = svc.spec.group
        if not group:
            return True
        if self._other_replica_up(world, svc):
            return False
        return self.route(world, world.groups[group], Demand()) is svc

    @staticmethod
    def _wanted_by_higher_class(world: World, svc: ServiceState) -> bool:
        """Whether requests of a higher class wait on ``svc``'s device: its memory is
        theirs, and a load there would be evicted again as soon as it is done."""
        device = svc.spec.device
        return any(
            world.waiting_classes.get((device, cls), 0)
            for cls in ServiceClass
            if cls < svc.spec.cls
        )

    @staticmethod
    def _footprint(world: World, svc: ServiceState) -> int:
        """What loading ``svc`` commits at its KV floor, calibrated."""
        weights, runtime, _ = world.projected_resident(svc, 0)
        return weights + runtime + svc.spec.profile.kv_floor

    def _expected_start_s(self, world: World, svc: ServiceState, room_s: float | None) -> float:
        """Seconds until ``svc`` could start a new request: its queue ahead of it, plus
        the rest of a load in progress or the whole load (and ``room_s``, what making its
        room costs: :meth:`_room_seconds`) if it is not loaded. A replica that could start
        only once busy work ends scores its deadline."""
        per_slot = svc.mean_service_s / svc.spec.concurrency
        ahead = len(svc.inflight) + svc.waiting_count - svc.spec.concurrency + 1
        queue_s = max(0, ahead) * per_slot
        if svc.status is ServiceStatus.LOADED:
            return queue_s
        if svc.status is ServiceStatus.LOADING:
            since = svc.loading_since if svc.loading_since is not None else world.now
            left = world.load_seconds(svc, svc.loading_from) - (world.now - since)
            return max(0.0, left) + queue_s
        if svc.status is ServiceStatus.CRASHED and svc.backoff_until > world.now:
            queue_s += svc.backoff_until - world.now
        if room_s is None or self._wanted_by_higher_class(world, svc):
            return svc.spec.deadline_s + queue_s
        return world.load_seconds(svc, svc.tier) + room_s + queue_s

    def _room_seconds(self, world: World, svc: ServiceState, demand: Demand) -> float | None:
        """The expected reload seconds others pay for ``svc`` to load now (0: it fits in
        free memory), or None when it fits only once busy work ends."""
        device = svc.spec.device
        est = world.estimate(svc.name, demand)
        need = (
            self._footprint(world, svc)
            + svc.calibration.project_active(est)
            + self._realtime_reserve(world, device)
        )
        short = need - world.ledger.available(device) - self._pending_free(world, device)
        if short > 0 and world.knobs.enabled("ballooning"):
            # KV pools above what their requests use shrink at no reload cost to anyone
            short -= sum(
                max(0, s.kv_pool - max(s.spec.profile.kv_floor, s.kv_in_use))
                for s in world.loaded_on(device)
                if s is not svc and world.resizable(s)
            )
        if short <= 0:
            return 0.0
        # A victim costs its reload if it is wanted while ``svc`` holds its memory: about
        # the load and a few of ``svc``'s requests (its reuse rate over a long horizon).
        horizon = world.knobs.reuse_horizon_s
        hold_s = world.load_seconds(svc, svc.tier) + 2.0 * svc.mean_service_s
        victims = sorted(
            (s for s in world.loaded_on(device) if self._evictable(s, svc.spec.cls, svc)),
            key=lambda s: self.victim_score(world, s),
        )
        cost = 0.0
        for v in victims:
            wanted = 0.0 if self._other_replica_up(world, v) else reuse_rate(v, world.now, horizon)
            p_reuse = 1.0 - math.exp(-wanted * hold_s)
            cost += world.load_seconds(v, self._tier(world, v)) * p_reuse
            short -= self.unload_frees(world, v)
            if short <= 0:
                return cost
        return None

    def victim_score(self, world: World, svc: ServiceState) -> float:
        """Lower is a better victim: cheap to reload, unlikely reused, large."""
        horizon = world.knobs.reuse_horizon_s
        rate = reuse_rate(svc, world.now, horizon)
        p_reuse = max(0.01, 1.0 - math.exp(-rate * horizon))
        weight = world.knobs.class_weights[int(svc.spec.cls)]
        if svc.spec.residency is Residency.ON_DEMAND:
            weight *= 0.5
        freed = max(1, self.unload_frees(world, svc))
        return world.load_seconds(svc, self._tier(world, svc)) * p_reuse * weight / (freed / 1e9)

    @staticmethod
    def _tier(world: World, svc: ServiceState) -> Tier:
        """Where ``svc``'s weights go when it unloads."""
        return world.park_tier(svc) if world.knobs.enabled("park_weights") else Tier.COLD

    def _unload(self, world: World, svc: ServiceState, *, reason: Reason, detail: str) -> None:
        world.unload(svc, reason=reason, tier=self._tier(world, svc), detail=detail)

    @staticmethod
    def _can_pause(world: World, svc: ServiceState) -> bool:
        caps = svc.spec.capabilities
        return world.knobs.enabled("pause") and caps.pause and caps.park

    def _time_shared(
        self, world: World, svc: ServiceState, cls: ServiceClass, requester: RequestState | None
    ) -> list[RequestState]:
        """The running requests of ``svc`` that ``requester`` (of class ``cls``) may pause
        to switch models: all of them or none (only an idle service unloads).

        A realtime request pauses interactive streams at once. Within a class, an LLM
        request waiting for its first token pauses streams that ran
        ``TIME_SHARE_MIN_RUN_S``, a paused one streams that ran ``TIME_SHARE_QUANTUM_S``.
        Lower classes are preempted (or paused) by :meth:`_preemptible` already."""
        for_realtime = cls is ServiceClass.REALTIME and svc.spec.cls is ServiceClass.INTERACTIVE
        same_class_llm = (
            svc.spec.cls == cls
            and requester is not None
            and world.services[requester.service].spec.kind.is_llm
        )
        if (
            requester is None
            or not world.knobs.enabled("time_share")
            or not (for_realtime or same_class_llm)
            or not svc.spec.kind.is_llm
            or not self._can_pause(world, svc)
            or svc.name == requester.service
            or svc.paused_kv  # a request paused in its pool keeps it loaded
        ):
            return []
        run = 0.0 if svc.spec.cls > cls else TIME_SHARE_MIN_RUN_S
        if requester.paused:
            run = TIME_SHARE_QUANTUM_S
        running = list(svc.inflight.values())
        for r in running:
            since = r.running_since if r.running_since is not None else world.now
            if r.pauses >= MAX_PAUSES or world.now - since < run:
                return []
            if not r.pausable or r.pausing is not None:
                return []  # one that cannot pause (or is pausing) is never preempted here
        return running

    def eviction_cost(self, world: World, svc: ServiceState) -> float:
        """The victim score without the per-byte normalisation."""
        return self.victim_score(world, svc) * max(1, self.unload_frees(world, svc)) / 1e9

    @staticmethod
    def unload_frees(world: World, svc: ServiceState) -> int:
        """Bytes an unload gives back: resident, KV pool and the allocator's reserved cache
        (less weights another loaded service shares: they stay)."""
        reserved = world.ledger.amount(svc.spec.device, svc.name, Category.RESERVED)
        if svc.spec.weights_key and world.weights_sharers(svc):
            kept = sum(le.nbytes for le in svc.resident_leases if le.category is Category.WEIGHTS)
            return svc.resident_bytes + reserved - kept
        return svc.resident_bytes + reserved

    def _pending_free(self, world: World, device: str) -> int:
        """Memory on its way back: services unloading, KV pools shrinking."""
        key = ("pending_free", device)
        epoch = world.epoch(device)
        hit = self._memo.get(key)  # _cached, inlined: asked by every make_room
        if hit is not None and hit[0] == epoch:
            return hit[1]
        # A resize awaits its answer only while loaded or unloading (check_indexes).
        value = sum(self.unload_frees(world, s) for s in world.unloading_on(device)) + sum(
            s.kv_shrinking for s in world.loaded_on(device) if s.resize_target is not None
        )
        self._memo[key] = (epoch, value)
        return value

    def _evictable(
        self,
        svc: ServiceState,
        cls: ServiceClass,
        exclude: ServiceState | None,
        strict: bool = False,
        once_preempted: bool = False,
        yielded: int = 0,
    ) -> bool:
        """Whether ``svc`` may be evicted for class ``cls``; ``once_preempted``: it is
        busy, but every request it runs is being preempted for this room; ``yielded``:
        how many of its waiting requests are streams it paused for this room."""
        return (
            svc is not exclude
            and svc.status is ServiceStatus.LOADED
            and (svc.idle or once_preempted)
            and not self._keep(svc)
            and (svc.waiting_count == yielded or svc.spec.cls > cls)
            and (svc.spec.cls > cls if strict else svc.spec.cls >= cls)
        )

    def _survey(
        self,
        world: World,
        device: str,
        cls: ServiceClass,
        exclude: ServiceState | None,
        strict: bool,
        requester: RequestState | None,
        sharing: object,
    ) -> _Survey:
        """What make_room could free on ``device`` for class ``cls``, in one pass over its
        loaded services (services with requests in flight are loaded): KV pools to
        shrink, running requests to stop, idle services to evict. ``sharing`` is None
        when no stream there can be paused for time sharing (:meth:`_room_key`)."""
        knobs = world.knobs
        preempting = knobs.enabled("preemption")
        shrinking = knobs.enabled("ballooning")
        clearing = knobs.enabled("evict_after_preemption")
        found = _Survey()
        for svc in world.loaded_on(device):
            cleared = False
            yielded = 0
            stopped_kv = 0  # KV the stopped requests of svc give back to its pool
            inflight = svc.inflight
            if inflight:
                stopped: list[RequestState] = []
                if preempting and self._preemptible(svc, cls):
                    stopped = self._stoppable(world, svc)
                    cleared = clearing and len(stopped) == len(inflight)
                elif sharing is not None:
                    stopped = self._time_shared(world, svc, cls, requester)
                    cleared = bool(stopped)
                for r in stopped:
                    found.preempts.append(r)
                    found.gain += r.active_lease.nbytes if r.active_lease else 0
                    stopped_kv += r.kv_bytes
            elif requester is not None and svc.queue and self._yielded_to:
                # Its streams were paused (and confirmed parked) for this requester in an
                # earlier round: it counts as cleared for it, as in the round it paused them.
                rid = requester.request_id
                yielded = sum(
                    1
                    for r in svc.queue.values()
                    if r.paused and r.parked and self._yielded_to.get(r.request_id) == rid
                )
                cleared = yielded > 0
            if svc is exclude or svc.status is not ServiceStatus.LOADED:
                continue
            if shrinking and world.resizable(svc):
                floor = svc.spec.profile.kv_floor
                pool = svc.kv_pool
                target = max(floor, svc.kv_in_use)
                if pool > target:
                    found.shrinks.append((svc, target))
                # KV freed by a preemption comes back only as far as its pool can shrink.
                found.gain += max(0, pool - max(floor, svc.kv_in_use - stopped_kv))
            if self._evictable(svc, cls, exclude, strict, once_preempted=cleared, yielded=yielded):
                found.victims.append(svc)
                found.gain += self.unload_frees(world, svc)
        return found

    def _stoppable(self, world: World, svc: ServiceState) -> list[RequestState]:
        """The running requests of ``svc`` that :meth:`_may_stop` allows to stop."""
        running = svc.inflight.values()
        if self._can_pause(world, svc):
            return [r for r in running if r.pauses < MAX_PAUSES]
        if not world.knobs.enabled("preemption_bound"):
            return list(running)
        return [r for r in running if r.attempt <= MAX_PREEMPTIONS]

    def make_room(
        self,
        world: World,
        device: str,
        need: int,
        cls: ServiceClass,
        exclude: ServiceState | None,
        reason: Reason,
        *,
        strict: bool = False,
        requester: RequestState | None = None,
    ) -> bool:
        """Free memory for ``need`` bytes on behalf of class ``cls``.

        ``strict``: only strictly lower classes are evicted (for restores, so that two
        services of one class never evict each other in turn). ``requester``: the
        request the room is for, which may pause other models' streams to switch
        models (:meth:`_time_shared`).

        Returns True when ``need`` fits now. Evictions free memory only once the
        backend confirms the unload, so after issuing them this returns False and the
        caller waits; memory already on its way out is not evicted for twice.
        """
        ledger = world.ledger
        available = ledger.available(device)
        if available >= need:
            return True
        pending = self._pending_free(world, device)
        if available + pending >= need:
            return False
        # What can be freed depends on the state, the class and the requester (only when
        # it holds memory), not on the need: a failure answers every need above what it
        # found it could free, until something on the device changes (its epoch; a new
        # wait reason frees nothing).
        holding = exclude.name if exclude is not None and exclude.is_up else None
        # None: no stream on the device can be paused for time sharing (see _room_key).
        sharing = self._room_key(world, device, requester)
        memo_key = (device, cls, strict, holding, sharing)
        failed = self._room_failed.get(memo_key)
        if failed is not None and failed[0] == world.epoch(device) and need > failed[1]:
            return False
        found = self._survey(world, device, cls, exclude, strict, requester, sharing)
        freeable = available + pending + found.gain
        if freeable < need:
            self._room_failed[memo_key] = (world.epoch(device), freeable)
            return False
        shrinks, preempts, victims = found.shrinks, found.preempts, found.victims
        knobs = world.knobs
        shrinking = knobs.enabled("ballooning")
        shrinks.sort(key=lambda st: -int(st[0].spec.cls))  # stable: lowest class first
        preempts.sort(key=lambda r: (-int(r.cls), -(r.dispatched_at or 0.0)))
        if knobs.enabled("victim_scoring"):
            victims.sort(key=lambda s: (self.victim_score(world, s), s.name))
        else:
            victims.sort(key=lambda s: (s.last_used, s.name))

        # A shrink frees its memory once the backend answers: it counts as pending.
        shrunk = 0
        for svc, target in shrinks:
            if ledger.available(device) + shrunk >= need:
                break
            if world.resize(
                svc, target, reason=Reason.BALLOON_SHRINK, detail=f"room for {reason.value}"
            ):
                shrunk += svc.kv_shrinking
        pending += shrunk
        # A caching allocator keeps what a preempted request held: the World charges
        # it to the service (RESERVED) until the service unloads.
        evicted_cache = False
        for req in preempts:
            if ledger.available(device) + pending >= need:
                break
            self._stop(world, req, cls, requester)
            holder = world.services[req.service]
            target = max(holder.spec.profile.kv_floor, holder.kv_in_use)
            if (
                shrinking
                and holder.kv_pool > target
                and world.resize(
                    holder, target, reason=Reason.BALLOON_SHRINK, detail="after preemption"
                )
            ):
                pending += holder.kv_shrinking
            if (
                holder.spec.addressed_as in world.caching_backends
                and holder.idle
                and self._evictable(holder, cls, exclude, strict)
            ):
                self._unload(
                    world,
                    holder,
                    reason=Reason.EVICTED_FOR_MEMORY,
                    detail=f"room for class {cls.label}: its allocator keeps freed memory",
                )
                evicted_cache = True
        if evicted_cache:
            return False  # the memory comes back with the unload
        if ledger.available(device) >= need:
            return True
        if ledger.available(device) + pending >= need:
            return False  # shrinks and unloads under way cover it
        freed = 0
        short = need - ledger.available(device) - pending
        if knobs.enabled("lower_class_first"):
            lower = [s for s in victims if s.spec.cls > cls]
            if (
                len(lower) < len(victims)
                and sum(self.unload_frees(world, s) for s in lower) >= short
            ):
                victims = lower
        # When one victim alone covers the shortfall, take the cheapest such one
        # (reload cost x reuse x class weight), not the best per byte: a few MB must
        # not cost the largest model.
        single = [s for s in victims if self.unload_frees(world, s) >= short]
        if single and knobs.enabled("single_victim"):
            victims = [min(single, key=lambda s: (self.eviction_cost(world, s), s.name))]
        for svc in victims:
            if ledger.available(device) + pending + freed >= need:
                break
            if not svc.idle or svc.status is not ServiceStatus.LOADED:
                continue  # its work was not all preempted (or parked) after all
            freed += self.unload_frees(world, svc)
            self._unload(
                world,
                svc,
                reason=Reason.EVICTED_FOR_MEMORY,
                detail=f"room for class {cls.label} ({reason.value})",
            )
        return False

    @staticmethod
    def _kept_floor(world: World, s: ServiceState) -> int:
        """Memory a kept (pinned or admin-loaded) service holds at its KV floor, with
        the allocator cache measured in it (freed only when it unloads: never)."""
        if (s.pinned or s.admin_wants_loaded) and s.holds_memory:
            reserved = world.ledger.amount(s.spec.device, s.name, Category.RESERVED)
            return s.resident_bytes - s.kv_pool + s.spec.profile.kv_floor + reserved
        return 0

    def _max_possible(self, world: World, device: str, exclude: ServiceState) -> int:
        dev = world.devices[device]
        key = ("kept_floor", device)
        epoch = world.epoch(device)
        hit = self._memo.get(key)  # _cached, inlined: asked for every request considered
        if hit is not None and hit[0] == epoch:
            held = hit[1]
        else:
            held = sum(self._kept_floor(world, s) for s in world.kept if s.spec.device == device)
            self._memo[key] = (epoch, held)
        return dev.usable_bytes - (held - self._kept_floor(world, exclude))

    def _retry_after(self, svc: ServiceState) -> float:
        return float(
            max(
                1,
                min(
                    300,
                    math.ceil(svc.mean_service_s * (1 + svc.waiting_count) / svc.spec.concurrency),
                ),
            )
        )

    # ---- steps --------------------------------------------------------------------
    def _admin_unloads(self, world: World) -> None:
        for name in sorted(world.admin_unload):
            svc = world.services[name]
            if svc.status is ServiceStatus.LOADED and svc.idle:
                world.unload(svc, reason=Reason.ADMIN, detail="operator asked")
                world.clear_admin_unload(name)
            elif svc.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED):
                # Already out (an eviction may have beaten the command): the operator's
                # word stands, so a prewarm must not bring it back as "evicted".
                world.forget_eviction(svc)
                world.clear_admin_unload(name)

    def _relieve_pressure(self, world: World) -> None:
        """Foreign or reserved memory grew: give memory back until the ledger balances.

        Memory a running service uses above its leases is charged to it: its own
        (non-realtime, below the preemption bound) requests are stopped first, and other
        work yields only for the rest of the shortfall. Once measured, the excess is in
        the ledger until the next sample, so the shortfall other work must cover is what
        remains after the charged bytes.
        """
        charging = world.knobs.enabled("pressure_charging")
        ledger = world.ledger
        for device in world.devices:
            if ledger.available(device) >= 0:
                continue
            charged = [
                world.services[n]
                for n in (self._charged if charging else ())
                if world.services[n].spec.device == device
            ]
            excess = sum(self._charged[s.name] for s in charged)
            for svc in sorted(charged, key=lambda s: (-self._charged[s.name], s.name)):
                if svc.spec.cls is ServiceClass.REALTIME:
                    continue
                running = sorted(svc.inflight.values(), key=lambda r: -(r.dispatched_at or 0.0))
                for req in running:
                    if ledger.available(device) >= 0 or not self._may_preempt(world, req):
                        continue
                    world.preempt(
                        req,
                        reason=Reason.OVER_ESTIMATE,
                        detail=f"{svc.name} measured {self._charged[svc.name]} B above its leases",
                    )
            need = min(0, -excess)
            if ledger.available(device) < need:
                self.make_room(
                    world, device, need, ServiceClass.REALTIME, None, Reason.FOREIGN_PRESSURE
                )

    def _keep_pinned_loaded(self, world: World) -> None:
        down = (
            s
            for s in world.kept
            if self._keep(s) and s.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED)
        )
        for svc in sorted(down, key=lambda s: (int(s.spec.cls), s.name)):
            if not self._keep(svc) or svc.status not in (
                ServiceStatus.UNLOADED,
                ServiceStatus.CRASHED,
            ):
                continue
            if (
                world.now < svc.backoff_until
                or world.shutting_down
                or self._loads_one_at_a_time(world, svc.spec.device)
            ):
                continue
            reason = (
                Reason.RELOAD_AFTER_CRASH
                if svc.status is ServiceStatus.CRASHED
                else Reason.ADMIN
                if svc.admin_wants_loaded and not svc.pinned
                else Reason.PINNED
            )
            pool = self._load_pool(world, svc, svc.spec.profile.kv_floor)
            need = sum(world.projected_resident(svc, pool))
            if self.make_room(world, svc.spec.device, need, svc.spec.cls, svc, reason):
                world.load(svc, reason=reason, kv_pool=pool)

    @staticmethod
    def _realtime_devices(world: World) -> set[str]:
        """Devices where realtime work runs or waits (or ended within the grace)."""
        out: set[str] = set()
        grace = world.knobs.realtime_grace_s
        for dev, svcs in world.realtime_by_device.items():
            for svc in svcs:
                if svc.inflight or svc.waiting_count or world.now < svc.last_used + grace:
                    out.add(dev)
                    break
        return out

    def _round_realtime_devices(self, world: World) -> set[str]:
        """:meth:`_realtime_devices`, found once per round: the yield to realtime work and
        the schedule both ask, and nothing between them starts, ends or queues realtime
        work (they pause, preempt, evict and load only lower-class or idle services)."""
        if self._rt_devices is None:
            self._rt_devices = self._realtime_devices(world)
        return self._rt_devices

    def _yields_compute(self, world: World, svc: ServiceState) -> bool:
        """Interactive LLM work that pauses while realtime work runs beside it."""
        return (
            svc.spec.cls is ServiceClass.INTERACTIVE
            and svc.spec.kind.is_llm
            and self._can_pause(world, svc)
            and world.knobs.enabled("realtime_yield")
        )

    @staticmethod
    def _compute_is_shared(world: World, device: str) -> bool:
        """A host device (shared memory: CPU cores, or an integrated accelerator whose
        decode runs at the RAM's bandwidth) shares its compute and its memory bandwidth
        with every model and the OS: anything running beside realtime work slows it in
        proportion, so interactive streams yield at once and new ones wait. A discrete
        accelerator runs a batch-1 decode beside it for less, and a new stream gets its
        first token first."""
        return world.devices[device].kind == "host"

    def _yield_to_realtime(self, world: World) -> None:
        """Pause the running streams of interactive LLMs on devices with realtime work."""
        devices = self._round_realtime_devices(world)
        if not devices:
            return
        for svc in list(world.busy):
            if svc.spec.device not in devices or not self._yields_compute(world, svc):
                continue
            shared_cores = self._compute_is_shared(world, svc.spec.device)
            for req in list(svc.inflight.values()):
                since = req.running_since if req.running_since is not None else world.now
                if not shared_cores and world.now - since < TIME_SHARE_MIN_RUN_S:
                    continue  # its first token comes first
                # Parked (when it can be): its model may then be evicted if the realtime
                # work needs the memory, instead of a paused stream pinning it.
                if world.pause(
                    req,
                    reason=Reason.TIME_SHARE,
                    park=svc.spec.capabilities.park,
                    detail="realtime work running",
                    for_realtime=True,
                ):
                    self._yielded_realtime.add(req.request_id)

    def _schedule(self, world: World) -> None:
        if not world.waiting:
            return  # a device's quiet record stays true: it names the state it saw
        rnd = _Round(tod=world.time_of_day())
        knobs = world.knobs
        hold = knobs.enabled("realtime_hold")
        grace = knobs.realtime_grace_s  # 0 (the default) turns it off
        for svcs in world.realtime_by_device.values():
            for svc in svcs:
                if (hold and svc.inflight) or world.now < svc.last_used + grace:
                    rnd.realtime_active.add(svc.spec.device)
        if knobs.enabled("realtime_yield"):
            rnd.realtime_work = self._round_realtime_devices(world)
        if knobs.enabled("batch_yield"):
            for svc in world.busy:
                if svc.spec.cls is ServiceClass.INTERACTIVE:
                    rnd.interactive_active.add(svc.spec.device)
        classes: set[ServiceClass] = set()
        for (dev, cls), count in world.waiting_classes.items():
            if not count:
                continue
            classes.add(cls)
            if hold and cls is ServiceClass.REALTIME:
                rnd.realtime_active.add(dev)
            current = rnd.higher_waiting.get(dev)
            if current is None or cls < current:
                rnd.higher_waiting[dev] = cls
        if len(world.waiting) <= self.few_waiting:
            # A short queue: considering every request costs less than finding the ones
            # to skip (both decide the same).
            for req in sorted(world.waiting.values(), key=lambda r: r.sort_key):
                self._consider(world, req, rnd)
                world.mark_announced(req)
            return
        # A device whose state (its World epoch) and round inputs are those of a round
        # that changed nothing there (wait reasons aside) would repeat it: it is skipped.
        # Its inputs are read only where the epoch alone does not tell it apart.
        start = {dev: world.epoch(dev) for dev in world.devices}
        inputs: dict[str, tuple[object, ...]] = {}
        for dev, epoch in start.items():
            seen = self._quiet.get(dev)
            if seen is not None and seen[0] == epoch:
                inputs[dev] = self._round_inputs(world, rnd, dev)
                if seen[1] == inputs[dev]:
                    rnd.quiet.add(dev)
        # Requests in class order, then arrival order; those requeued meanwhile (preempted
        # in this round) wait for the next one.
        mark = world.queue_mark
        for cls in sorted(classes):
            todo = [r for r in self._unsettled(world, cls, rnd) if r.queued_mark <= mark]
            for req in sorted(todo, key=lambda r: r.seq):
                self._consider(world, req, rnd)
                world.mark_announced(req)
        # Where the epoch did not move, nothing there changed: the inputs read now are
        # those at the start of the round.
        self._quiet = {
            dev: (epoch, inputs[dev] if dev in inputs else self._round_inputs(world, rnd, dev))
            for dev, epoch in start.items()
            if world.epoch(dev) == epoch
        }

    def _round_inputs(self, world: World, rnd: _Round, device: str) -> tuple[object, ...]:
        """What a round's decisions on ``device`` read besides its state: time (windows,
        backoffs of the queued services there) and the round's realtime and class state.
        """
        now = world.now
        queued = tuple(
            (svc.index, self._in_window(svc, rnd), now < svc.backoff_until)
            for svc in world.queued
            if svc.spec.device == device
        )
        return (
            device in rnd.realtime_active,
            device in rnd.realtime_work,
            device in rnd.interactive_active,
            rnd.higher_waiting.get(device),
            queued,
            self._share_thresholds(world, device),
        )

    @staticmethod
    def _share_thresholds(world: World, device: str) -> tuple[tuple[str, bool, bool], ...]:
        """Which running streams on ``device`` that could be paused have run long enough
        to be paused for another request (``TIME_SHARE_MIN_RUN_S``, and the quantum of a
        stream paused before): time alone changes that, so a round where one crossed is
        not a repeat."""
        if not world.knobs.enabled("pause"):
            return ()
        now = world.now
        return tuple(
            (r.request_id, ran >= TIME_SHARE_MIN_RUN_S, ran >= TIME_SHARE_QUANTUM_S)
            for svc in world.loaded_on(device)
            if svc.inflight and svc.spec.capabilities.pause
            for r in svc.inflight.values()
            if r.pausable and r.running_since is not None
            for ran in (now - r.running_since,)
        )

    @staticmethod
    def _in_window(svc: ServiceState, rnd: _Round) -> bool:
        """Whether ``svc`` has no windows or one of them is open: once per round."""
        if not svc.spec.windows:
            return True
        inside = rnd.inside.get(svc.name)
        if inside is None:
            inside = rnd.inside[svc.name] = svc.spec.in_window(rnd.tod)
        return inside

    def _unsettled(self, world: World, cls: ServiceClass, rnd: _Round) -> list[RequestState]:
        """Waiting requests of ``cls`` that this round may decide differently.

        Called when the class's turn comes. Whether a request has to wait without
        competing for memory (:meth:`_must_wait`) depends, by then, only on the round's
        state and on its service, and none of them changes during the class's turn. A
        request already told to wait for that same reason would only be told again (a
        no-op): it is skipped. A request never told why (new or preempted) is not.
        """
        out: list[RequestState] = []
        for dev in world.devices:
            services = world.queued_services(dev, cls)
            if not len(services) or dev in rnd.quiet:
                continue
            group = self._class_must_wait(dev, cls, rnd, world.knobs.enabled("fair_progress"))
            if group is not None and world.waiting_causes.get(
                (dev, cls, group[0]), 0
            ) == world.waiting_classes.get((dev, cls), 0):
                continue
            for svc in services:
                wait = self._service_wait(world, svc, cls, rnd)[1]
                if wait is None:
                    out.extend(svc.queue.values())
                else:
                    out.extend(r for r in svc.queue.values() if r.wait_reason is not wait[0])
        return out

    @staticmethod
    def _told(req: RequestState, reason: Reason) -> bool:
        """Whether ``req`` was told to wait for ``reason`` already and its queue's bound
        no longer applies: telling it again is a no-op (its detail need not be written)."""
        return req.announced and req.wait_reason is reason

    def _queue_or_reject(
        self, world: World, req: RequestState, reason: Reason, detail: str = ""
    ) -> None:
        svc = world.services[req.service]
        if not req.announced and svc.waiting_count - 1 >= svc.spec.queue_limit:
            world.reject(
                req,
                reason=Reason.QUEUE_FULL,
                retry_after_s=self._retry_after(svc),
                detail=f"{svc.waiting_count - 1} waiting (limit {svc.spec.queue_limit})",
            )
            return
        world.enqueue(req, reason=reason, detail=detail)

    @staticmethod
    def _class_must_wait(
        dev: str, cls: ServiceClass, rnd: _Round, fair_progress: bool
    ) -> tuple[Reason, str] | None:
        """Why work of ``cls`` on ``dev`` waits this round, whatever its service.

        With fair progress on, whether work waits for a lower class blocked on memory
        depends on its service (:meth:`_must_wait` decides it).
        """
        if cls >= ServiceClass.BATCH and dev in rnd.realtime_active:
            return Reason.HIGHER_CLASS_WAITING, "realtime work running"
        if cls is ServiceClass.BATCH and dev in rnd.interactive_active:
            # Batch work yields compute to interactive requests (it would slow them).
            return Reason.HIGHER_CLASS_WAITING, "interactive work running"
        blocked = rnd.blocked.get(dev)
        if not fair_progress and blocked is not None and blocked < cls:
            return Reason.HIGHER_CLASS_WAITING, f"{blocked.label} request waits for memory"
        return None

    def _service_wait(
        self, world: World, svc: ServiceState, cls: ServiceClass, rnd: _Round
    ) -> tuple[bool, tuple[Reason, str] | None]:
        """(whether ``svc`` is outside its windows, :meth:`_must_wait` for its requests of
        ``cls``), found once per service while no action runs: the round's state it reads
        does not change during the class's turn (``blocked`` below the class stays as it
        is), the service's only through an action."""
        key = (svc.name, cls)
        hit = rnd.waits.get(key)
        if hit is not None and hit[0] == world.version:
            return hit[1], hit[2]
        outside = not self._in_window(svc, rnd)
        wait = self._must_wait(world, svc, cls, outside, rnd)
        rnd.waits[key] = (world.version, outside, wait)
        return outside, wait

    def _must_wait(
        self, world: World, svc: ServiceState, cls: ServiceClass, outside: bool, rnd: _Round
    ) -> tuple[Reason, str] | None:
        """Why a request of ``svc`` waits without competing for memory, if it does."""
        dev = svc.spec.device
        fair_progress = world.knobs.enabled("fair_progress")
        wait = self._class_must_wait(dev, cls, rnd, fair_progress)
        if wait is not None:
            return wait
        blocked = rnd.blocked.get(dev)
        if (
            fair_progress
            and blocked is not None
            and blocked < cls
            and (svc.status is ServiceStatus.UNLOADING or not self._preemptible(svc, blocked))
        ):
            # Fair progress is for work the blocked class could preempt, and a service
            # on its way out takes no new work.
            return Reason.HIGHER_CLASS_WAITING, f"{blocked.label} request waits for memory"
        if outside:
            higher = rnd.higher_waiting.get(dev)
            if higher is not None and higher < cls:
                return Reason.OUTSIDE_WINDOW, "higher class waiting"
        if svc.status in (ServiceStatus.LOADING, ServiceStatus.UNLOADING):
            return Reason.LOADING, svc.status.value
        if (
            svc.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED)
            and world.now < svc.backoff_until
        ):
            return Reason.BACKOFF, f"restart after {svc.backoff_until - world.now:.1f}s"
        return None

    def _consider(self, world: World, req: RequestState, rnd: _Round) -> None:
        svc = world.services[req.service]
        spec = svc.spec
        dev = spec.device
        cls = req.cls
        if req.estimate.kv_bytes > svc.kv_request_limit:
            world.reject(
                req,
                reason=Reason.TOO_LARGE,
                retry_after_s=0.0,
                detail=_too_large_kv(svc, req),
            )
            return
        outside, wait = self._service_wait(world, svc, cls, rnd)
        if wait is not None:
            self._queue_or_reject(world, req, *wait)
            return
        if dev in rnd.realtime_work and (
            (req.paused and req.request_id in self._yielded_realtime)
            or (
                not req.paused
                and self._yields_compute(world, svc)
                and self._compute_is_shared(world, dev)
            )
        ):
            self._queue_or_reject(world, req, Reason.HIGHER_CLASS_WAITING, "realtime work running")
            return
        if req.paused and self._yielding(world, req):
            self._queue_or_reject(
                world, req, Reason.PAUSED, f"gave its memory to {self._yielded_to[req.request_id]}"
            )
            return
        blocked = rnd.blocked.get(dev)
        # Past _must_wait with a lower class waiting for memory, fair progress applies:
        # work that class could preempt may still use idle memory (it takes nothing from
        # anyone, and gives the memory back when preempted).
        idle_only = blocked is not None and blocked < cls
        if svc.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED):
            self._load_for(world, req, svc, rnd, outside, idle_only)
            return
        inflight = svc.inflight
        knobs = world.knobs
        if svc.over_limit and inflight:
            # Measured far above its profile: it may not grow further while it serves,
            # so it runs one request at a time (its measured bytes are already in the
            # ledger as reserved, so admission stays safe) until a reload recalibrates it.
            self._queue_or_reject(
                world, req, Reason.NO_MEMORY, "service above its memory limit: one at a time"
            )
            return
        if inflight and svc.name in self._charged and knobs.enabled("pressure_charging"):
            self._queue_or_reject(
                world, req, Reason.NO_MEMORY, "uses more than its leases: one at a time"
            )
            return
        if len(inflight) >= spec.concurrency and not self._pause_for_first_token(world, svc, req):
            if not self._told(req, Reason.CONCURRENCY_LIMIT):
                self._queue_or_reject(
                    world,
                    req,
                    Reason.CONCURRENCY_LIMIT,
                    f"{len(inflight)}/{spec.concurrency} running",
                )
            return
        profile = spec.profile
        active = world.projected_active(req)
        # A paused request brings back its parked KV state, or still holds its place.
        kv = req.parked_kv if req.paused else req.estimate.kv_bytes
        kv_in_use = svc.kv_in_use
        pool = svc.kv_pool
        if svc.resize_support is not ResizeSupport.LIVE and (
            kv_in_use + kv > pool or kv > svc.kv_slot
        ):
            self._kv_pool_fixed(world, req, svc)
            return
        if kv_in_use + kv > max(profile.kv_ceiling, pool):
            if not self._told(req, Reason.CONCURRENCY_LIMIT):
                self._queue_or_reject(
                    world,
                    req,
                    Reason.CONCURRENCY_LIMIT,
                    f"KV pool full ({kv_in_use} B of {profile.kv_ceiling} B in use)",
                )
            return
        resizing = svc.resize_target is not None
        grow = max(0, kv - (svc.kv_usable - kv_in_use))
        if grow and resizing:
            self._queue_or_reject(
                world, req, Reason.RESIZING, "its KV pool is being resized: waits for the answer"
            )
            return
        if kv and resizing and self._earlier_waits_for_growth(svc, req):
            # The growth is for an earlier request: a later one must not take its KV.
            self._queue_or_reject(
                world, req, Reason.RESIZING, "an earlier request waits for the pool to grow"
            )
            return
        need = active + grow
        limit = self._max_possible(world, dev, svc) - svc.resident_bytes + pool
        lease: int | None = None
        if need > limit:
            observed = svc.calibration.active.project_observed(req.estimate.active_bytes)
            if observed + grow > limit or not knobs.enabled("degrade_to_raw"):
                world.reject(
                    req,
                    reason=Reason.TOO_LARGE,
                    retry_after_s=0.0,
                    detail=f"needs {need} B ({observed} B as measured so far), device can "
                    "never free that much",
                )
                return
            # Only the calibration margin does not fit: degrade to the estimate scaled by
            # what was measured (no margin) and let the headroom absorb the difference.
            lease = observed
            need = lease + grow
        ledger = world.ledger
        before = ledger.available(dev)
        if outside and before - need < (knobs.spare_fraction * world.devices[dev].usable_bytes):
            self._queue_or_reject(world, req, Reason.OUTSIDE_WINDOW, "no spare memory")
            return
        if cls is ServiceClass.REALTIME:
            peak = self._rt_peak.get(svc.name)
            if peak is None or active > peak:  # the first one sets it, even at 0
                self._rt_peak[svc.name] = max(0, active)
                self._rt_peak_changes += 1
        # A caching allocator's reserved blocks are reused by the service's own requests.
        own_cache = ledger.amount(dev, svc.name, Category.RESERVED)
        if before < 0 or not knobs.enabled("cache_reuse"):
            own_cache = 0  # under pressure the cache is what has to go, not reuse
        reserve = 0
        if cls > ServiceClass.REALTIME and not self._yields_to_realtime(world, svc):
            reserve = self._fitting_reserve(world, svc, need, limit)
        running = len(world.inflight)
        room_needed = max(0, need - own_cache) + reserve
        if idle_only and before < room_needed:
            self._queue_or_reject(
                world,
                req,
                Reason.HIGHER_CLASS_WAITING,
                f"{blocked.label if blocked else ''} request waits for memory; "
                "idle memory too small",
            )
            return
        if not self.make_room(world, dev, room_needed, cls, svc, Reason.NO_MEMORY, requester=req):
            rnd.blocked[dev] = min(cls, rnd.blocked.get(dev, cls))
            if not self._told(req, Reason.NO_MEMORY):
                self._queue_or_reject(
                    world,
                    req,
                    Reason.NO_MEMORY,
                    f"needs {need} B, {ledger.available(dev)} B available",
                )
            return
        room = ledger.available(dev)
        if grow:
            target = min(profile.kv_ceiling, svc.kv_in_use + kv)
            if world.resize(
                svc,
                max(target, svc.kv_pool),
                reason=Reason.BALLOON_GROW,
                detail=f"+{grow} B for {req.request_id}",
            ):
                # The request runs once the backend says the pool is there.
                self._queue_or_reject(world, req, Reason.RESIZING, f"KV pool grows by {grow} B")
                return
        if len(world.inflight) < running:
            reason = Reason.FITS_AFTER_PREEMPTION
        elif room > before:
            reason = Reason.FITS_AFTER_SHRINK
        else:
            reason = Reason.FITS
        if not world.dispatch(req, reason=reason, active_bytes=lease, enforce=own_cache == 0):
            rnd.blocked[dev] = min(cls, rnd.blocked.get(dev, cls))
            self._queue_or_reject(world, req, Reason.NO_MEMORY, "lost the race for memory")

    @staticmethod
    def _earlier_waits_for_growth(svc: ServiceState, req: RequestState) -> bool:
        return any(r.seq < req.seq and r.wait_reason is Reason.RESIZING for r in svc.queue.values())

    def _load_pool(self, world: World, svc: ServiceState, wanted: int) -> int:
        """The KV pool a load asks for: the KV bytes ``wanted``, within the floor and the
        ceiling, when the pool can grow and shrink later (a live resize).

        A pool that changes only at the next load is sized for the largest waiting
        request too, plus the memory that is free beyond the realtime reserve and the
        spare fraction of the budget, since it cannot grow later without a reload. A
        backend that cannot resize at all holds its ceiling (:meth:`World.load` sees to
        it)."""
        p = svc.spec.profile
        if not p.kv_ceiling:
            return 0
        # A backend that splits its pool between its slots gives a request one slot.
        slots = svc.spec.concurrency if svc.spec.capabilities.kv_per_slot else 1
        if svc.resize_support is not ResizeSupport.NEXT_LOAD:
            return max(p.kv_floor, min(p.kv_ceiling, wanted * slots))
        waiting = max((r.estimate.kv_bytes for r in svc.queue.values()), default=0)
        base = max(p.kv_floor, min(p.kv_ceiling, max(wanted, waiting) * slots))
        dev = svc.spec.device
        free = (
            world.ledger.available(dev)
            - sum(world.projected_resident(svc, base))
            - self._realtime_reserve(world, dev)
            - int(world.knobs.spare_fraction * world.devices[dev].usable_bytes)
        )
        return base + max(0, min(p.kv_ceiling - base, free))

    def _kv_pool_fixed(self, world: World, req: RequestState, svc: ServiceState) -> None:
        """A request whose KV does not fit a pool that cannot change while loaded.

        If it would fit the empty pool it waits for running requests to end. If not, and
        the backend resizes at its next load, the idle service is unloaded so that it
        reloads with a pool sized for the waiting requests; while busy, it waits.
        """
        kv = req.estimate.kv_bytes
        if kv <= svc.kv_slot:
            self._queue_or_reject(
                world,
                req,
                Reason.CONCURRENCY_LIMIT,
                f"KV pool full ({svc.kv_in_use} B of {svc.kv_pool} B in use)",
            )
            return
        if svc.resize_support is ResizeSupport.NEXT_LOAD and svc.idle:
            world.unload(
                svc,
                reason=Reason.RESIZE_AT_NEXT_LOAD,
                detail=f"KV pool {svc.kv_pool} B < {kv} B for {req.request_id}",
            )
            self._queue_or_reject(world, req, Reason.LOADING, "reloads with a larger KV pool")
            return
        self._queue_or_reject(
            world,
            req,
            Reason.CONCURRENCY_LIMIT,
            f"needs {kv} B of KV, its pool holds {svc.kv_pool} B until its next load",
        )

    def _load_for(
        self,
        world: World,
        req: RequestState,
        svc: ServiceState,
        rnd: _Round,
        outside: bool,
        idle_only: bool = False,
    ) -> None:
        dev = svc.spec.device
        knobs = world.knobs
        pool, active, resident, observed = self._load_sizes(world, req, svc)
        need = resident + active
        limit = self._max_possible(world, dev, svc)
        if need > limit >= resident + observed and knobs.enabled("degrade_to_raw"):
            # Only the calibration margin does not fit: plan for the estimate scaled by
            # what was measured (the dispatch degrades the same way).
            active = observed
            need = resident + active
        reserve = 0
        if req.cls > ServiceClass.REALTIME:
            # Resident memory must leave the realtime reserve free; the first request's
            # activations may overlap it when realtime work can preempt them.
            reserve = self._fitting_reserve(world, svc, need, limit)
            if self._yields_to_realtime(world, svc):
                reserve = max(0, reserve - active)
        if need > limit:  # what _max_possible says (nothing changed since it was asked)
            world.reject(
                req,
                reason=Reason.TOO_LARGE,
                retry_after_s=0.0,
                detail=f"service needs {need} B to run, usable budget cannot hold it",
            )
            return
        available = world.ledger.available(dev)
        if outside and available - need < (knobs.spare_fraction * world.devices[dev].usable_bytes):
            self._queue_or_reject(world, req, Reason.OUTSIDE_WINDOW, "no spare memory to load")
            return
        if self._loads_one_at_a_time(world, dev):
            self._queue_or_reject(
                world, req, Reason.LOADING, "after an out-of-memory load, loads go one at a time"
            )
            return
        if idle_only and available < need + reserve:
            # Fair progress loads into idle memory only: it takes nothing from the
            # waiting higher class (the service is evictable again once idle).
            self._queue_or_reject(
                world, req, Reason.HIGHER_CLASS_WAITING, "idle memory too small to load"
            )
            return
        reason = Reason.RELOAD_AFTER_CRASH if svc.status is ServiceStatus.CRASHED else Reason.DEMAND
        if self.make_room(
            world, dev, need + reserve, req.cls, svc, reason, requester=req
        ) and world.load(svc, reason=reason, kv_pool=pool, detail=f"for {req.request_id}"):
            self._queue_or_reject(world, req, Reason.LOADING, "cold start")
            return
        rnd.blocked[dev] = min(req.cls, rnd.blocked.get(dev, req.cls))
        self._queue_or_reject(
            world,
            req,
            Reason.NO_MEMORY,
            ""  # told once: a request waiting for this reason is not told again
            if req.wait_reason is Reason.NO_MEMORY
            else f"load needs {need} B, {world.ledger.available(dev)} B available",
        )

    def _load_sizes(
        self, world: World, req: RequestState, svc: ServiceState
    ) -> tuple[int, int, int, int]:
        """(KV pool, projected activation, resident size, activation as measured so far)
        of loading ``svc`` for ``req``.

        Kept per request while the service's calibrations stay as they were, unless its
        pool is sized from the ledger and the queue (a resize at the next load): a
        waiting request is planned again on every event about its device.
        """
        cal = svc.calibration
        stamp = (cal.active.version, cal.resident.version)
        fixed = svc.resize_support is not ResizeSupport.NEXT_LOAD
        if fixed:
            hit = self._sizes.get(req.request_id)
            if hit is not None and hit[0] is req and hit[1] == stamp:
                return hit[2]
        pool = self._load_pool(world, svc, req.estimate.kv_bytes)
        sizes = (
            pool,
            world.projected_active(req),
            sum(world.projected_resident(svc, pool)),
            cal.active.project_observed(req.estimate.active_bytes),
        )
        if fixed:
            self._sizes[req.request_id] = (req, stamp, sizes)
        return sizes

    def _expire_idle(self, world: World) -> None:
        for svc in world.loaded:
            if (
                svc.status is ServiceStatus.LOADED
                and svc.idle
                and svc.waiting_count == 0
                and not self._keep(svc)
                and self._idle_past_ttl(world, svc)
            ):
                self._unload(
                    world,
                    svc,
                    reason=Reason.TTL_EXPIRED,
                    detail=f"idle {world.now - svc.last_used:.0f}s",
                )

    def _balloon(self, world: World) -> None:
        for svc in world.loaded:
            if svc.kv_pool <= svc.spec.profile.kv_floor or not world.resizable(svc):
                continue
            if svc.waiting_count == 0 and world.now - svc.last_used >= world.knobs.balloon_idle_s:
                target = max(svc.spec.profile.kv_floor, svc.kv_in_use)
                if target < svc.kv_pool:
                    world.resize(svc, target, reason=Reason.BALLOON_SHRINK, detail="idle pool")

    def _prewarm(self, world: World) -> None:
        """WarmServe-style: reload a recently evicted, likely-reused service into spare memory."""
        horizon = world.knobs.reuse_horizon_s
        if world.waiting_for(Reason.NO_MEMORY):
            return  # memory goes to waiting requests first
        evicted = world.evicted_out  # evicted and unloaded since
        for svc in [s for s in self._warm_in_class_order(world) if s in evicted]:
            if (
                svc.status is not ServiceStatus.UNLOADED
                or svc.spec.residency is not Residency.WARM
                or svc.last_evicted_at is None
                or world.now < svc.backoff_until
                or not svc.spec.in_window(world.time_of_day())
                or self._other_replica_up(world, svc)
                or self._loads_one_at_a_time(world, svc.spec.device)
            ):
                continue
            if 1.0 - math.exp(-reuse_rate(svc, world.now, horizon) * horizon) < 0.5:
                continue
            dev = svc.spec.device
            pool = self._load_pool(world, svc, svc.spec.profile.kv_floor)
            # Restoring what was evicted for a short on-demand job returns the device to
            # its steady state: it leaves the realtime reserve and a tenth of the budget
            # free (see _restore_need).
            need_with_spare = self._restore_need(world, svc, pool)
            fits = world.ledger.available(dev) >= need_with_spare
            tried = self._restore_tried_at.get(svc.name)
            if tried is not None and world.now - tried < RESTORE_RETRY_S:
                pass  # the room it made went to demand: do not evict for it again yet
            elif not fits and svc.spec.cls < ServiceClass.BATCH and world.knobs.enabled("restore"):
                # An interactive service outranks batch and background work: take its
                # memory back from them (they are preempted or evicted) to restore it.
                # Only strictly lower classes yield: two services of one class that cannot
                # both fit must never restore each other in turn (a load/unload loop).
                fits = self.make_room(
                    world, dev, need_with_spare, svc.spec.cls, svc, Reason.PRELOAD, strict=True
                )
                if not fits and world.ledger.available(dev) + self._pending_free(world, dev) >= (
                    need_with_spare
                ):
                    self._restore_tried_at[svc.name] = world.now
            if fits:
                world.load(svc, reason=Reason.PRELOAD, kv_pool=pool, detail="likely reused soon")
                world.forget_eviction(svc)


def _too_large_kv(svc: ServiceState, req: RequestState) -> str:
    """Why ``req``'s KV can never fit ``svc``: its pool's ceiling, or one slot's share."""
    need = req.estimate.kv_bytes
    spec = svc.spec
    if spec.capabilities.kv_per_slot and spec.concurrency > 1:
        return (
            f"needs {need} B of KV, one of its {spec.concurrency} slots holds "
            f"{svc.kv_request_limit} B (ctx_total / parallel)"
        )
    return f"needs {need} B of KV, ceiling {spec.profile.kv_ceiling} B"


def _pausing(world: World, request_id: str) -> bool:
    """Whether ``request_id`` runs with a pause the backend has not answered yet."""
    req = world.inflight.get(request_id)
    return req is not None and req.pausing is not None
