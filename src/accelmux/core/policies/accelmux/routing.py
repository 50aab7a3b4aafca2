"""Placement: the replica of a service with replicas on several devices expected to start a
request soonest (``placement``), and moving waiting requests to a free loaded replica.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from accelmux.core.events import Demand
from accelmux.core.placement import first_up
from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.records import RoomFor, Seam
from accelmux.core.policies.accelmux.reserve import Reserve
from accelmux.core.policies.accelmux.room import Room
from accelmux.core.types import Reason, ServiceStatus
from accelmux.core.world import ServiceState, reuse_rate


class Routing:
    """Which replica of a service with replicas a request waits on."""

    def __init__(self, seam: Seam, room: Room, reserve: Reserve) -> None:
        self.view = seam.view
        self.ops = seam.ops
        self.room = room
        self.reserve = reserve

    def route(self, replicas: Sequence[ServiceState], demand: Demand) -> ServiceState:
        """The replica expected to start a new request of ``demand`` soonest, to 0.1 s
        (ties: the device left with the most free memory, then the one running fewer
        requests, then config order). Routing to a replica that is not loaded loads it:
        placement and a second replica for a busy service are both decided here."""
        if not self.view.knobs.switches.placement:
            return first_up(replicas)
        if replicas[0].spec.variant is not None:
            return self.route_forms(replicas, demand)
        # A second replica is worth only memory nobody else holds: once one replica is
        # up, another is a candidate only where it fits in free memory.
        any_up = any(r.holds_memory for r in replicas)
        # what making room costs each replica that is neither loaded nor loading
        up = (ServiceStatus.LOADED, ServiceStatus.LOADING)
        room = {r.name: self.room_seconds(r, demand) for r in replicas if r.status not in up}
        candidates = [
            r for r in replicas if r.holds_memory or not any_up or room.get(r.name) == 0.0
        ]
        return min(
            candidates,
            key=lambda r: (
                round(self.expected_start_s(r, room.get(r.name)), 1),
                # then worst fit: the device left with the most free memory, so models
                # spread out and the next load evicts no one
                -(
                    self.view.ledger.available(r.spec.device)
                    - (0 if r.holds_memory else facts.footprint(self.view, r))
                ),
                sum(len(s.inflight) for s in self.view.loaded_on(r.spec.device)),
                r.index,
            ),
        )

    def route_forms(self, forms: Sequence[ServiceState], demand: Demand) -> ServiceState:
        """The form of a service that may degrade a request waits on: while a form is up,
        the up form expected to finish it first (its queue, the rest of its load, its
        time per request); else :meth:`best_form`, else the full form (the request waits
        for it)."""
        ordered = sorted(forms, key=facts.form_rank)
        up = [f for f in ordered if f.status in (ServiceStatus.LOADED, ServiceStatus.LOADING)]
        if up:
            return min(
                up,
                key=lambda f: (
                    round(self.expected_start_s(f, None) + self.form_service_s(f), 1),
                    facts.form_rank(f),
                ),
            )
        return self.best_form(ordered, demand) or ordered[0]

    def best_form(self, ordered: Sequence[ServiceState], demand: Demand) -> ServiceState | None:
        """The best form (``ordered``: best first) that can be loaded now without evicting
        a higher class. On its GPU first: the best form whose room is free memory and idle
        services of its class or lower; else the full form if its room also stops or
        shrinks lower-class work (what a load of the service does without forms); only
        then a form on another device (the CPU: many times slower). A lesser form never
        stops other work: it is many times slower too, and the work it would stop loses
        more than it gains. None when no form can be held."""
        full = ordered[0]
        on_gpu = [f for f in ordered if f.spec.device == full.spec.device]
        elsewhere = [f for f in ordered if f.spec.device != full.spec.device]
        for form in on_gpu:
            if self.holds(form, demand, stop_work=False):
                return form
        if self.holds(full, demand, stop_work=True):
            return full
        for form in elsewhere:
            if self.holds(form, demand, stop_work=True):
                return form
        return None

    def holds(self, form: ServiceState, demand: Demand, *, stop_work: bool = True) -> bool:
        """Whether ``form`` can be loaded now without evicting a higher class: not backing
        off after a crash, no higher class waiting on its device, and its room made of
        free memory and idle services of its class or lower (``stop_work``: and of
        lower-class work stopped or shrunk, as :meth:`Room.plan` finds it)."""
        if form.status is ServiceStatus.CRASHED and form.backoff_until > self.view.now:
            return False
        if facts.wanted_by_higher_class(self.view, form):
            return False
        if self.room_seconds(form, demand) is not None:
            return True
        if not stop_work:
            return False
        for_ = RoomFor(form.spec.cls, form, Reason.DEGRADED)
        return self.room.plan(form.spec.device, self.load_need(form, demand), for_) is not None

    def load_need(self, svc: ServiceState, demand: Demand) -> int:
        """What loading ``svc`` for a request of ``demand`` needs free on its device: its
        footprint at its KV floor, the request's projected activation memory and the
        realtime reserve."""
        est = self.view.estimate(svc.name, demand)
        return (
            facts.footprint(self.view, svc)
            + svc.calibration.project_active(est)
            + self.reserve.realtime_reserve(svc.spec.device)
        )

    def form_service_s(self, form: ServiceState) -> float:
        """Expected seconds per request on ``form``: the full form's time (learned from
        whichever forms have served, each over its slowdown) times ``form``'s slowdown."""
        forms = self.view.groups[form.spec.group]
        full_s = [
            f.mean_service_s / f.spec.variant.slowdown
            for f in forms
            if f.served and f.spec.variant is not None
        ]
        base = min(full_s) if full_s else form.mean_service_s
        variant = form.spec.variant
        return base * (variant.slowdown if variant is not None else 1.0)

    def reroute_to_free_replicas(self) -> None:
        """A request waiting on a replica that is not loaded moves to a loaded replica
        of its service with a free slot and no queue: it starts there now."""
        for replicas in self.view.groups.values():
            if replicas[0].spec.variant is not None:
                continue  # the forms of a service move their requests themselves
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
                    self.ops.reroute(waiting.pop(0), to, detail="a replica is free now")

    def placed_here(self, svc: ServiceState) -> bool:
        """Whether a warm service preloads as ``svc``: an ordinary service does; of a
        service with replicas only the one placement picks, and only while none is up."""
        group = svc.spec.group
        if not group:
            return True
        if svc.spec.variant is not None:  # only the full form of a service is kept warm
            return svc.spec.variant.rank == 0 and not facts.other_replica_up(self.view, svc)
        if facts.other_replica_up(self.view, svc):
            return False
        return self.route(self.view.groups[group], Demand()) is svc

    def expected_start_s(self, svc: ServiceState, room_s: float | None) -> float:
        """Seconds until ``svc`` could start a new request: its queue ahead of it, plus
        the rest of a load in progress or the whole load (and ``room_s``, what making its
        room costs: :meth:`Routing.room_seconds`) if it is not loaded. A replica that could start
        only once busy work ends scores its deadline."""
        per_slot = svc.mean_service_s / svc.spec.concurrency
        ahead = len(svc.inflight) + svc.waiting_count - svc.spec.concurrency + 1
        queue_s = max(0, ahead) * per_slot
        if svc.status is ServiceStatus.LOADED:
            return queue_s
        if svc.status is ServiceStatus.LOADING:
            since = svc.loading_since if svc.loading_since is not None else self.view.now
            left = self.view.load_seconds(svc, svc.loading_from) - (self.view.now - since)
            return max(0.0, left) + queue_s
        if svc.status is ServiceStatus.CRASHED and svc.backoff_until > self.view.now:
            queue_s += svc.backoff_until - self.view.now
        if room_s is None or facts.wanted_by_higher_class(self.view, svc):
            return svc.spec.deadline_s + queue_s
        return self.view.load_seconds(svc, svc.tier) + room_s + queue_s

    def room_seconds(self, svc: ServiceState, demand: Demand) -> float | None:
        """The expected reload seconds others pay for ``svc`` to load now (0: it fits in
        free memory), or None when it fits only once busy work ends."""
        device = svc.spec.device
        need = self.load_need(svc, demand)
        short = need - self.view.ledger.available(device) - self.room.pending_free(device)
        if short > 0 and self.view.knobs.switches.ballooning:
            # KV pools above what their requests use shrink at no reload cost to anyone
            short -= sum(
                max(0, s.kv_pool - max(s.spec.profile.kv_floor, s.kv_in_use))
                for s in self.view.loaded_on(device)
                if s is not svc and self.view.resizable(s)
            )
        if short <= 0:
            return 0.0
        # A victim costs its reload if it is wanted while ``svc`` holds its memory: about
        # the load and a few of ``svc``'s requests (its reuse rate over a long horizon).
        horizon = self.view.knobs.reuse_horizon_s
        hold_s = self.view.load_seconds(svc, svc.tier) + 2.0 * svc.mean_service_s
        victims = sorted(
            (
                s
                for s in self.view.loaded_on(device)
                if self.room.evictable(s, RoomFor(svc.spec.cls, svc))
            ),
            key=self.room.victim_score,
        )
        cost = 0.0
        for v in victims:
            wanted = (
                0.0
                if facts.other_replica_up(self.view, v)
                else reuse_rate(v, self.view.now, horizon)
            )
            p_reuse = 1.0 - math.exp(-wanted * hold_s)
            cost += self.view.load_seconds(v, facts.tier(self.view, v)) * p_reuse
            short -= facts.unload_frees(self.view, v)
            if short <= 0:
                return cost
        return None
