"""The gates a waiting request passes to run on a loaded service: each either lets it
through, makes it wait (with a reason) or rejects it (with a reason and Retry-After).
"""

from __future__ import annotations

import math

from accelmux.core.specs import floored
from accelmux.core.types import (
    Category,
    Reason,
    ResizeSupport,
    ServiceClass,
    ServiceStatus,
)

from .interface import Parts, Round
from .state import RequestState, ServiceState, World


def retry_after(self: Parts, svc: ServiceState) -> float:
    return float(
        max(
            1,
            min(
                300,
                math.ceil(svc.mean_service_s * (1 + svc.waiting_count) / svc.spec.concurrency),
            ),
        )
    )


def told(req: RequestState, reason: Reason) -> bool:
    """Whether ``req`` was told to wait for ``reason`` already and its queue's bound
    no longer applies: telling it again is a no-op (its detail need not be written)."""
    return req.announced and req.wait_reason is reason


def queue_or_reject(
    self: Parts, world: World, req: RequestState, reason: Reason, detail: str = ""
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


def held_back(svc: ServiceState, cls: ServiceClass, blocked: ServiceClass | None) -> bool:
    """Fair progress: work of ``cls`` on ``svc`` may take only idle memory while a higher
    class is blocked on memory, unless that class may not take ``svc`` anyway (a steady
    service and a blocked batch request: the background floor)."""
    return blocked is not None and blocked < cls and not floored(svc.spec, blocked)


def class_must_wait(
    dev: str, cls: ServiceClass, rnd: Round, fair_progress: bool, steady: bool = False
) -> tuple[Reason, str] | None:
    """Why work of ``cls`` on ``dev`` waits this round, whatever its service (of a
    steady service when ``steady``, or where one may be among them).

    With fair progress on, whether work waits for a lower class blocked on memory
    depends on its service (:meth:`_must_wait` decides it). A steady service's work is
    not held while realtime work runs: a frame cannot wait for a voice chain to end
    (its deadline is a second or so), and what it takes is small.
    """
    if cls >= ServiceClass.BATCH and dev in rnd.realtime_active and not steady:
        return Reason.HIGHER_CLASS_WAITING, "realtime work running"
    if cls is ServiceClass.BATCH and dev in rnd.interactive_active:
        # Batch work yields compute to interactive requests (it would slow them).
        return Reason.HIGHER_CLASS_WAITING, "interactive work running"
    blocked = rnd.blocked.get(dev)
    if not fair_progress and blocked is not None and blocked < cls:
        return Reason.HIGHER_CLASS_WAITING, f"{blocked.label} request waits for memory"
    return None


def service_wait(
    self: Parts, world: World, svc: ServiceState, cls: ServiceClass, rnd: Round
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


def must_wait(
    self: Parts,
    world: World,
    svc: ServiceState,
    cls: ServiceClass,
    outside: bool,
    rnd: Round,
) -> tuple[Reason, str] | None:
    """Why a request of ``svc`` waits without competing for memory, if it does."""
    dev = svc.spec.device
    fair_progress = world.knobs.switches.fair_progress
    wait = self._class_must_wait(dev, cls, rnd, fair_progress, svc.spec.steady)
    if wait is not None:
        return wait
    blocked = rnd.blocked.get(dev)
    if (
        fair_progress
        and blocked is not None
        and blocked < cls
        and (svc.status is ServiceStatus.UNLOADING or not self._preemptible(svc, blocked))
        and not floored(svc.spec, blocked)
    ):
        # Fair progress is for work the blocked class could preempt, and a service
        # on its way out takes no new work. A steady service the blocked class may not
        # take runs on: holding its work back would free nothing that class could use.
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


def consider(self: Parts, world: World, req: RequestState, rnd: Round) -> None:
    """Decide one waiting request: reject it, make it wait (with a reason), load its
    service, or run it (:meth:`_admit`)."""
    svc = world.services[req.service]
    if req.estimate.kv_bytes > svc.kv_request_limit:
        world.reject(
            req,
            reason=Reason.TOO_LARGE,
            retry_after_s=0.0,
            detail=_too_large_kv(svc, req),
        )
        return
    outside, wait = self._service_wait(world, svc, req.cls, rnd)
    if wait is not None:
        self._queue_or_reject(world, req, *wait)
        return
    if self._gives_way(world, req, svc, rnd):
        return
    blocked = rnd.blocked.get(svc.spec.device)
    if svc.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED):
        # Past _must_wait with a lower class waiting for memory, fair progress applies:
        # work that class could preempt may still use idle memory (it takes nothing from
        # anyone, and gives the memory back when preempted).
        idle_only = held_back(svc, req.cls, blocked)
        self._load_for(world, req, svc, rnd, outside, idle_only)
        return
    if self._one_at_a_time(world, req, svc):
        return
    self._admit(world, req, svc, rnd, outside, blocked)


def earlier_waits_for_growth(svc: ServiceState, req: RequestState) -> bool:
    return any(r.seq < req.seq and r.wait_reason is Reason.RESIZING for r in svc.queue.values())


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


def gives_way(self: Parts, world: World, req: RequestState, svc: ServiceState, rnd: Round) -> bool:
    """Whether ``req`` waits for compute it gives to others (it is told so): realtime work
    on its device (``realtime_yield``), or the request it was paused for."""
    dev = svc.spec.device
    if dev in rnd.realtime_work and (
        (req.paused and req.request_id in self._yielded_realtime)
        or (
            not req.paused
            and self._yields_compute(world, svc)
            and self._compute_is_shared(world, dev)
        )
    ):
        self._queue_or_reject(world, req, Reason.HIGHER_CLASS_WAITING, "realtime work running")
        return True
    if req.paused and self._yielding(world, req):
        self._queue_or_reject(
            world, req, Reason.PAUSED, f"gave its memory to {self._yielded_to[req.request_id]}"
        )
        return True
    return False


def one_at_a_time(self: Parts, world: World, req: RequestState, svc: ServiceState) -> bool:
    """Whether ``req`` waits for a request of its own loaded service to end (it is told
    so): the service is measured above its limit or its leases, or at its concurrency
    (unless a stream of it pauses for ``req``'s first token)."""
    inflight = svc.inflight
    if svc.over_limit and inflight:
        # Measured far above its profile: it may not grow further while it serves,
        # so it runs one request at a time (its measured bytes are already in the
        # ledger as reserved, so admission stays safe) until a reload recalibrates it.
        self._queue_or_reject(
            world, req, Reason.NO_MEMORY, "service above its memory limit: one at a time"
        )
        return True
    charges = world.learned.charged
    if inflight and svc.name in charges and world.knobs.switches.pressure_charging:
        fresh = req.wait_reason is not Reason.NO_MEMORY
        self._queue_or_reject(
            world, req, Reason.NO_MEMORY, "uses more than its leases: one at a time"
        )
        if fresh and req.wait_reason is Reason.NO_MEMORY:
            charged = charges[svc.name]
            world.add_explanation(req, f"{svc.name} measured {charged} B above its leases")
        return True
    concurrency = svc.spec.concurrency
    if len(inflight) >= concurrency and not self._pause_for_first_token(world, svc, req):
        if not self._told(req, Reason.CONCURRENCY_LIMIT):
            self._queue_or_reject(
                world,
                req,
                Reason.CONCURRENCY_LIMIT,
                f"{len(inflight)}/{concurrency} running",
            )
        return True
    return False


def admit(
    self: Parts,
    world: World,
    req: RequestState,
    svc: ServiceState,
    rnd: Round,
    outside: bool,
    blocked: ServiceClass | None,
) -> None:
    """Run ``req`` on its loaded service once its KV and activations fit: make room for
    them (leaving the realtime reserve free), grow its KV pool, dispatch it. ``blocked``:
    the highest class waiting for memory on its device this round."""
    cls = req.cls
    dev = svc.spec.device
    active = world.projected_active(req)
    fit = self._kv_fit(world, req, svc)
    if fit is None:
        return
    kv, grow = fit
    sized = self._admission_need(world, req, svc, active, grow)
    if sized is None:
        return
    need, limit, lease = sized
    knobs = world.knobs
    before = world.ledger.available(dev)
    if outside and before - need < (knobs.spare_fraction * world.devices[dev].usable_bytes):
        self._queue_or_reject(world, req, Reason.OUTSIDE_WINDOW, "no spare memory")
        return
    if cls is ServiceClass.REALTIME:
        world.note_realtime_activation(svc, active)
    own_cache = self._reusable_cache(world, svc, before)
    reserve = 0
    if cls > ServiceClass.REALTIME and not self._yields_to_realtime(world, svc):
        reserve = self._fitting_reserve(world, svc, need, limit)
    running = len(world.inflight)
    room_needed = max(0, need - own_cache) + reserve
    if held_back(svc, cls, blocked) and before < room_needed:
        # fair progress (see consider): only idle memory
        self._queue_or_reject(
            world,
            req,
            Reason.HIGHER_CLASS_WAITING,
            # REALTIME is 0 (falsy): its label is left out, as the decision streams pin
            f"{blocked.label if blocked else ''} request waits for memory; idle memory too small",
        )
        return
    if not self.make_room(world, dev, room_needed, cls, svc, Reason.NO_MEMORY, requester=req):
        if self._reachable(world, dev, room_needed, svc):
            rnd.blocked[dev] = min(cls, rnd.blocked.get(dev, cls))
        if not self._told(req, Reason.NO_MEMORY):
            was = req.wait_reason
            self._queue_or_reject(
                world,
                req,
                Reason.NO_MEMORY,
                f"needs {need} B, {world.ledger.available(dev)} B available",
            )
            self._explain_reserve(world, req, dev, reserve, was)
        return
    self._start_admitted(world, req, svc, rnd, kv, grow, before, running, lease, own_cache)


def kv_fit(
    self: Parts, world: World, req: RequestState, svc: ServiceState
) -> tuple[int, int] | None:
    """(the KV bytes ``req`` brings, the bytes its service's KV pool must grow by for
    them), or None when its KV does not fit the pool now (it is told why)."""
    profile = svc.spec.profile
    # A paused request brings back its parked KV state, or still holds its place.
    kv = req.parked_kv if req.paused else req.estimate.kv_bytes
    kv_in_use = svc.kv_in_use
    pool = svc.kv_pool
    if svc.resize_support is not ResizeSupport.LIVE and (kv_in_use + kv > pool or kv > svc.kv_slot):
        self._kv_pool_fixed(world, req, svc)
        return None
    if kv_in_use + kv > max(profile.kv_ceiling, pool):
        if not self._told(req, Reason.CONCURRENCY_LIMIT):
            self._queue_or_reject(
                world,
                req,
                Reason.CONCURRENCY_LIMIT,
                f"KV pool full ({kv_in_use} B of {profile.kv_ceiling} B in use)",
            )
        return None
    resizing = svc.resize_target is not None
    grow = max(0, kv - (svc.kv_usable - kv_in_use))
    if grow and resizing:
        self._queue_or_reject(
            world, req, Reason.RESIZING, "its KV pool is being resized: waits for the answer"
        )
        return None
    if kv and resizing and self._earlier_waits_for_growth(svc, req):
        # The growth is for an earlier request: a later one must not take its KV.
        self._queue_or_reject(
            world, req, Reason.RESIZING, "an earlier request waits for the pool to grow"
        )
        return None
    return kv, grow


def admission_need(
    self: Parts, world: World, req: RequestState, svc: ServiceState, active: int, grow: int
) -> tuple[int, int, int | None] | None:
    """(bytes ``req`` needs on its loaded service, the most its device could ever free
    for it, the activation lease when degraded to what was measured, else None), or None
    when it can never fit (it is rejected)."""
    need = active + grow
    limit = self._max_possible(world, svc.spec.device, svc) - svc.resident_bytes + svc.kv_pool
    lease: int | None = None
    if need > limit:
        observed = svc.calibration.active.project_observed(req.estimate.active_bytes)
        if observed + grow > limit or not world.knobs.switches.degrade_to_raw:
            world.reject(
                req,
                reason=Reason.TOO_LARGE,
                retry_after_s=0.0,
                detail=f"needs {need} B ({observed} B as measured so far), device can "
                "never free that much",
            )
            return None
        # Only the calibration margin does not fit: degrade to the estimate scaled by
        # what was measured (no margin) and let the headroom absorb the difference.
        lease = observed
        need = lease + grow
    return need, limit, lease


def reusable_cache(world: World, svc: ServiceState, available: int) -> int:
    """The allocator cache of ``svc`` its own next request reuses (``cache_reuse``): its
    reserved blocks, unless its device is short (``available`` below 0)."""
    own_cache = world.ledger.amount(svc.spec.device, svc.name, Category.RESERVED)
    if available < 0 or not world.knobs.switches.cache_reuse:
        own_cache = 0  # under pressure the cache is what has to go, not reuse
    return own_cache


def start_admitted(
    self: Parts,
    world: World,
    req: RequestState,
    svc: ServiceState,
    rnd: Round,
    kv: int,
    grow: int,
    before: int,
    running: int,
    lease: int | None,
    own_cache: int,
) -> None:
    """Start ``req``, its room made: grow its service's KV pool first if it must (it
    runs once the backend answers), else dispatch it, saying what made the room
    (``before``: memory free, ``running``: requests in flight, before the room was made).
    """
    dev = svc.spec.device
    room = world.ledger.available(dev)
    if grow:
        target = min(svc.spec.profile.kv_ceiling, svc.kv_in_use + kv)
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
        cls = req.cls
        rnd.blocked[dev] = min(cls, rnd.blocked.get(dev, cls))
        self._queue_or_reject(world, req, Reason.NO_MEMORY, "lost the race for memory")
