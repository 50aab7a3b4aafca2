"""Making room: freeing ``need`` bytes on a device for a class, in order of cost (shrink
elastic KV pools, stop lower-class work, evict idle services by victim score), and what
an unload frees and costs.
"""

from __future__ import annotations

import math

from accelmux.core.specs import floored, room_rank
from accelmux.core.types import (
    Category,
    Reason,
    Residency,
    ServiceClass,
    ServiceStatus,
    Tier,
)

from .interface import Parts, Survey
from .state import RequestState, ServiceState, World, reuse_rate


def victim_score(self: Parts, world: World, svc: ServiceState) -> float:
    """Lower is a better victim: cheap to reload, unlikely reused, large."""
    horizon = world.knobs.reuse_horizon_s
    rate = reuse_rate(svc, world.now, horizon)
    p_reuse = max(0.01, 1.0 - math.exp(-rate * horizon))
    weight = world.knobs.class_weights[int(svc.spec.cls)]
    if svc.spec.residency is Residency.ON_DEMAND:
        weight *= 0.5
    freed = max(1, self.unload_frees(world, svc))
    return world.load_seconds(svc, self._tier(world, svc)) * p_reuse * weight / (freed / 1e9)


def tier(world: World, svc: ServiceState) -> Tier:
    """Where ``svc``'s weights go when it unloads."""
    return world.park_tier(svc) if world.knobs.switches.park_weights else Tier.COLD


def unload(self: Parts, world: World, svc: ServiceState, *, reason: Reason, detail: str) -> None:
    world.unload(svc, reason=reason, tier=self._tier(world, svc), detail=detail)


def eviction_cost(self: Parts, world: World, svc: ServiceState) -> float:
    """The victim score without the per-byte normalisation."""
    return self.victim_score(world, svc) * max(1, self.unload_frees(world, svc)) / 1e9


def unload_frees(world: World, svc: ServiceState) -> int:
    """Bytes an unload gives back: resident, KV pool and the allocator's reserved cache
    (less weights another loaded service shares: they stay)."""
    reserved = world.ledger.amount(svc.spec.device, svc.name, Category.RESERVED)
    if svc.spec.weights_key and world.weights_sharers(svc):
        kept = sum(le.nbytes for le in svc.resident_leases if le.category is Category.WEIGHTS)
        return svc.resident_bytes + reserved - kept
    return svc.resident_bytes + reserved


def pending_free(self: Parts, world: World, device: str) -> int:
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


def evictable(
    self: Parts,
    svc: ServiceState,
    cls: ServiceClass,
    exclude: ServiceState | None,
    strict: bool = False,
    once_preempted: bool = False,
    yielded: int = 0,
) -> bool:
    """Whether ``svc`` may be evicted for class ``cls`` (for ``exclude``, the service the
    room is for: a steady one ranks above batch, :func:`room_rank`); ``once_preempted``:
    it is busy, but every request it runs is being preempted for this room; ``yielded``:
    how many of its waiting requests are streams it paused for this room."""
    if (
        svc is exclude
        or svc.status is not ServiceStatus.LOADED
        or not (svc.idle or once_preempted)
        or self._keep(svc)
        or floored(svc.spec, cls)
    ):
        return False
    rank = room_rank(svc.spec.cls, steady=svc.spec.steady)
    for_rank = room_rank(cls, steady=exclude is not None and exclude.spec.steady)
    return (svc.waiting_count == yielded or rank > for_rank) and (
        rank > for_rank if strict else rank >= for_rank
    )


def regaining(exclude: ServiceState | None) -> bool:
    """Whether room is made for a steady service that is not up: its load, its memory back
    after a crash or an eviction. It stops running batch work (it ranks above batch,
    :func:`room_rank`). Its frames only evict idle batch services (:func:`evictable`): a
    stopped job on a caching backend unloads its model, a frame a second every second."""
    return exclude is not None and exclude.spec.steady and not exclude.is_up


def survey(
    self: Parts,
    world: World,
    device: str,
    cls: ServiceClass,
    exclude: ServiceState | None,
    strict: bool,
    requester: RequestState | None,
    sharing: object,
) -> Survey:
    """What make_room could free on ``device`` for class ``cls``, in one pass over its
    loaded services (services with requests in flight are loaded): KV pools to
    shrink, running requests to stop, idle services to evict. ``sharing`` is None
    when no stream there can be paused for time sharing (:meth:`_room_key`)."""
    knobs = world.knobs
    preempting = knobs.switches.preemption
    shrinking = knobs.switches.ballooning
    clearing = knobs.switches.evict_after_preemption
    found = Survey()
    for svc in world.loaded_on(device):
        cleared = False
        yielded = 0
        stopped_kv = 0  # KV the stopped requests of svc give back to its pool
        inflight = svc.inflight
        if inflight:
            stopped: list[RequestState] = []
            if preempting and self._preemptible(svc, cls, regaining(exclude)):
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


def make_room(
    self: Parts,
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
    plan = self._room_plan(
        world, device, need, cls, exclude, strict, requester, available + pending
    )
    if plan is None:
        return False
    # A shrink frees its memory once the backend answers: it counts as pending.
    pending += self._shrink_for_room(world, device, need, plan.shrinks, reason)
    stopped = self._stop_for_room(
        world, device, need, pending, plan.preempts, cls, exclude, strict, requester
    )
    if stopped is None:
        return False  # the memory comes back with the unload
    pending = stopped
    if ledger.available(device) >= need:
        return True
    if ledger.available(device) + pending >= need:
        return False  # shrinks and unloads under way cover it
    short = need - ledger.available(device) - pending
    victims = self._pick_victims(world, plan.victims, cls, short)
    self._evict_for_room(world, device, need, pending, victims, cls, reason)
    return False


def kept_floor(world: World, s: ServiceState) -> int:
    """Memory a kept (pinned or admin-loaded) service holds at its KV floor, with
    the allocator cache measured in it (freed only when it unloads: never)."""
    if (s.pinned or s.admin_wants_loaded) and s.holds_memory:
        reserved = world.ledger.amount(s.spec.device, s.name, Category.RESERVED)
        return s.resident_bytes - s.kv_pool + s.spec.profile.kv_floor + reserved
    return 0


def max_possible(self: Parts, world: World, device: str, exclude: ServiceState) -> int:
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


def reachable(self: Parts, world: World, device: str, need: int, svc: ServiceState) -> bool:
    """Whether ``need`` more bytes for ``svc`` could be found on ``device`` by evicting
    everything that may go, with what the device's foreign programs, workers' overhead
    and park hold now. A request that cannot does not hold lower classes back (fair
    progress): it waits for a foreign program to leave, which their work cannot delay."""
    ledger = world.ledger
    outside = ledger.foreign(device) + ledger.overhead(device) + ledger.parked(device)
    own = svc.resident_bytes if svc.holds_memory else 0
    return need <= self._max_possible(world, device, svc) - own - outside


def room_plan(
    self: Parts,
    world: World,
    device: str,
    need: int,
    cls: ServiceClass,
    exclude: ServiceState | None,
    strict: bool,
    requester: RequestState | None,
    within: int,
) -> Survey | None:
    """What make_room can free on ``device`` for ``need`` bytes (:meth:`_survey`), in the
    order it frees it: shrinks lowest class first, stops lowest class and latest first,
    victims by score (or least recently used). None when it cannot free enough beyond
    ``within`` (what is free or on its way back).

    What can be freed depends on the state, the class and the requester (only when it
    holds memory), not on the need: a failure answers every need above what it found it
    could free, until something on the device changes (its epoch; a new wait reason
    frees nothing)."""
    holding = exclude.name if exclude is not None and exclude.is_up else None
    steady = exclude is not None and exclude.spec.steady  # it ranks above batch
    # None: no stream on the device can be paused for time sharing (see _room_key).
    sharing = self._room_key(world, device, requester)
    memo_key = (device, cls, steady, strict, holding, sharing)
    failed = self._room_failed.get(memo_key)
    if failed is not None and failed[0] == world.epoch(device) and need > failed[1]:
        return None
    found = self._survey(world, device, cls, exclude, strict, requester, sharing)
    freeable = within + found.gain
    if freeable < need:
        self._room_failed[memo_key] = (world.epoch(device), freeable)
        return None
    found.shrinks.sort(key=lambda st: -int(st[0].spec.cls))  # stable: lowest class first
    found.preempts.sort(key=lambda r: (-int(r.cls), -(r.dispatched_at or 0.0)))
    if world.knobs.switches.victim_scoring:
        found.victims.sort(key=lambda s: (self.victim_score(world, s), s.name))
    else:
        found.victims.sort(key=lambda s: (s.last_used, s.name))
    return found


def shrink_for_room(
    world: World,
    device: str,
    need: int,
    shrinks: list[tuple[ServiceState, int]],
    reason: Reason,
) -> int:
    """Shrink KV pools in order until ``need`` would fit in free memory; the bytes the
    shrinks give back once the backends answer."""
    ledger = world.ledger
    shrunk = 0
    for svc, target in shrinks:
        if ledger.available(device) + shrunk >= need:
            break
        if world.resize(
            svc, target, reason=Reason.BALLOON_SHRINK, detail=f"room for {reason.value}"
        ):
            shrunk += svc.kv_shrinking
    return shrunk


def stop_for_room(
    self: Parts,
    world: World,
    device: str,
    need: int,
    pending: int,
    preempts: list[RequestState],
    cls: ServiceClass,
    exclude: ServiceState | None,
    strict: bool,
    requester: RequestState | None,
) -> int | None:
    """Stop running requests in order until ``need`` would fit, shrinking the pools they
    leave; the memory then on its way back (``pending`` and what the shrinks free), or
    None when a stopped request's service was evicted for its allocator cache (the
    memory comes back with the unload).

    A caching allocator keeps what a preempted request held: the World charges it to the
    service (RESERVED) until the service unloads."""
    ledger = world.ledger
    shrinking = world.knobs.switches.ballooning
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
    return None if evicted_cache else pending


def pick_victims(
    self: Parts, world: World, victims: list[ServiceState], cls: ServiceClass, short: int
) -> list[ServiceState]:
    """The victims, in eviction order, to evict for ``short`` bytes: strictly lower
    classes alone when they cover it (``lower_class_first``); when one victim alone
    covers it, the cheapest such one (reload cost x reuse x class weight, not the best
    per byte: a few MB must not cost the largest model; ``single_victim``)."""
    knobs = world.knobs
    if knobs.switches.lower_class_first:
        lower = [s for s in victims if s.spec.cls > cls]
        if len(lower) < len(victims) and sum(self.unload_frees(world, s) for s in lower) >= short:
            victims = lower
    single = [s for s in victims if self.unload_frees(world, s) >= short]
    if single and knobs.switches.single_victim:
        victims = [min(single, key=lambda s: (self.eviction_cost(world, s), s.name))]
    return victims


def evict_for_room(
    self: Parts,
    world: World,
    device: str,
    need: int,
    pending: int,
    victims: list[ServiceState],
    cls: ServiceClass,
    reason: Reason,
) -> None:
    """Evict ``victims`` in order until ``need`` would fit once their unloads are done."""
    ledger = world.ledger
    freed = 0
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
