"""Placement: the replica of a service with replicas on several devices expected to start a
request soonest (``placement``), and moving waiting requests to a free loaded replica.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from accelmux.core.events import Demand
from accelmux.core.placement import first_up
from accelmux.core.types import (
    ServiceClass,
    ServiceStatus,
)

from .interface import Parts
from .state import ServiceState, World, reuse_rate


def route(
    self: Parts, world: World, replicas: Sequence[ServiceState], demand: Demand
) -> ServiceState:
    """The replica expected to start a new request of ``demand`` soonest, to 0.1 s
    (ties: the device left with the most free memory, then the one running fewer
    requests, then config order). Routing to a replica that is not loaded loads it:
    placement and a second replica for a busy service are both decided here."""
    if not world.knobs.switches.placement:
        return first_up(replicas)
    # A second replica is worth only memory nobody else holds: once one replica is
    # up, another is a candidate only where it fits in free memory.
    any_up = any(r.holds_memory for r in replicas)
    # what making room costs each replica that is neither loaded nor loading
    up = (ServiceStatus.LOADED, ServiceStatus.LOADING)
    room = {r.name: self._room_seconds(world, r, demand) for r in replicas if r.status not in up}
    candidates = [r for r in replicas if r.holds_memory or not any_up or room.get(r.name) == 0.0]
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


def reroute_to_free_replicas(world: World) -> None:
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


def other_replica_up(world: World, svc: ServiceState) -> bool:
    """Whether another replica of ``svc``'s service holds memory: a spare replica
    is loaded only for a request (:meth:`route`), never to keep warm."""
    group = svc.spec.group
    return bool(group) and any(r.holds_memory for r in world.groups[group] if r is not svc)


def placed_here(self: Parts, world: World, svc: ServiceState) -> bool:
    """Whether a warm service preloads as ``svc``: an ordinary service does; of a
    service with replicas only the one placement picks, and only while none is up."""
    group = svc.spec.group
    if not group:
        return True
    if self._other_replica_up(world, svc):
        return False
    return self.route(world, world.groups[group], Demand()) is svc


def wanted_by_higher_class(world: World, svc: ServiceState) -> bool:
    """Whether requests of a higher class wait on ``svc``'s device: its memory is
    theirs, and a load there would be evicted again as soon as it is done."""
    device = svc.spec.device
    return any(
        world.waiting_classes.get((device, cls), 0) for cls in ServiceClass if cls < svc.spec.cls
    )


def footprint(world: World, svc: ServiceState) -> int:
    """What loading ``svc`` commits at its KV floor, calibrated."""
    weights, runtime, _ = world.projected_resident(svc, 0)
    return weights + runtime + svc.spec.profile.kv_floor


def expected_start_s(self: Parts, world: World, svc: ServiceState, room_s: float | None) -> float:
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


def room_seconds(self: Parts, world: World, svc: ServiceState, demand: Demand) -> float | None:
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
    if short > 0 and world.knobs.switches.ballooning:
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
