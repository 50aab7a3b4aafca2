"""Facts the parts of the accelmux policy share: what a service, a request or the spec
says, read from the world and nothing else (no part, no cache, no state of their own).

They sit below every part (:mod:`.graph` draws the order), so that no two parts need
each other for a plain fact: whether a service is kept, whether its window is open,
what its unload frees, whether its work may be stopped or paused, whether a request was
told a reason already. ``queue_or_reject`` is the one that acts: a request waits, or is
refused when its queue is full, in one place for every part that makes one wait.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from accelmux.core.policies.accelmux.heuristics import TUNING
from accelmux.core.policies.accelmux.records import Round
from accelmux.core.specs import floored, ranks_below, room_rank
from accelmux.core.types import (
    Category,
    Reason,
    Residency,
    ServiceClass,
    ServiceStatus,
    Tier,
)
from accelmux.core.world import RequestState, ServiceState, WorldOps, WorldView, reuse_rate


def sharing_key(view: WorldView, requester: RequestState | None) -> object:
    """What a make_room failure depends on beyond its class: what time sharing reads
    of the requester, when it may pause other models' streams (:meth:`facts.time_shared`:
    its service, whether that is an LLM, whether it is paused). Requests alike in
    these share a failure (the memo lasts one round: the time does not change)."""
    if requester is None or not view.knobs.switches.time_share:
        return None
    return (requester.service, requester.paused)


def can_pause(view: WorldView, svc: ServiceState) -> bool:
    caps = svc.spec.capabilities
    return view.knobs.switches.pause and caps.pause and caps.park


def time_shared(
    view: WorldView,
    svc: ServiceState,
    cls: ServiceClass,
    requester: RequestState | None,
) -> list[RequestState]:
    """The running requests of ``svc`` that ``requester`` (of class ``cls``) may pause
    to switch models: all of them or none (only an idle service unloads).

    A realtime request pauses interactive streams at once. Within a class, an LLM
    request waiting for its first token pauses streams that ran
    ``TIME_SHARE_MIN_RUN_S``, a paused one streams that ran ``TIME_SHARE_QUANTUM_S``.
    Lower classes are preempted (or paused) by :meth:`facts.preemptible` already."""
    for_realtime = cls is ServiceClass.REALTIME and svc.spec.cls is ServiceClass.INTERACTIVE
    same_class_llm = (
        svc.spec.cls == cls
        and requester is not None
        and view.services[requester.service].spec.kind.is_llm
    )
    if (
        requester is None
        or not view.knobs.switches.time_share
        or not (for_realtime or same_class_llm)
        or not svc.spec.kind.is_llm
        or not can_pause(view, svc)
        or svc.name == requester.service
        or svc.paused_kv  # a request paused in its pool keeps it loaded
    ):
        return []
    run = 0.0 if svc.spec.cls > cls else TUNING.time_share_min_run_s
    if requester.paused:
        run = TUNING.time_share_quantum_s
    running = list(svc.inflight.values())
    for r in running:
        since = r.running_since if r.running_since is not None else view.now
        if r.pauses >= TUNING.max_pauses or view.now - since < run:
            return []
        if not r.pausable or r.pausing is not None:
            return []  # one that cannot pause (or is pausing) is never preempted here
    return running


def realtime_grace(view: WorldView, device: str) -> float:
    """Seconds batch and background work stay held on ``device`` after a realtime request
    ends: ``policy.realtime_grace_s`` where it is set, else the policy's own on a device
    whose compute is shared (``host_realtime_grace_s``) and none on a discrete one."""
    grace = view.knobs.realtime_grace_s
    if grace is not None:
        return grace
    return TUNING.host_realtime_grace_s if compute_is_shared(view, device) else 0.0


def realtime_devices(view: WorldView) -> set[str]:
    """Devices where realtime work runs or waits (or ended within the grace)."""
    out: set[str] = set()
    for dev, svcs in view.realtime_by_device.items():
        grace = realtime_grace(view, dev)
        for svc in svcs:
            if svc.inflight or svc.waiting_count or view.now < svc.last_used + grace:
                out.add(dev)
                break
    return out


def yields_compute(view: WorldView, svc: ServiceState) -> bool:
    """Interactive LLM work that pauses while realtime work runs beside it."""
    return (
        svc.spec.cls is ServiceClass.INTERACTIVE
        and svc.spec.kind.is_llm
        and can_pause(view, svc)
        and view.knobs.switches.realtime_yield
    )


def compute_is_shared(view: WorldView, device: str) -> bool:
    """A host device (shared memory: CPU cores, or an integrated accelerator whose
    decode runs at the RAM's bandwidth) shares its compute and its memory bandwidth
    with every model and the OS: anything running beside realtime work slows it in
    proportion, so interactive streams yield at once and new ones wait. A discrete
    accelerator runs a batch-1 decode beside it for less, and a new stream gets its
    first token first."""
    return view.devices[device].kind == "host"


def share_thresholds(view: WorldView, device: str) -> tuple[tuple[str, bool, bool], ...]:
    """Which running streams on ``device`` that could be paused have run long enough
    to be paused for another request (``TIME_SHARE_MIN_RUN_S``, and the quantum of a
    stream paused before): time alone changes that, so a round where one crossed is
    not a repeat."""
    if not view.knobs.switches.pause:
        return ()
    now = view.now
    return tuple(
        (r.request_id, ran >= TUNING.time_share_min_run_s, ran >= TUNING.time_share_quantum_s)
        for svc in view.loaded_on(device)
        if svc.inflight and svc.spec.capabilities.pause
        for r in svc.inflight.values()
        if r.pausable and r.running_since is not None
        for ran in (now - r.running_since,)
    )


def may_preempt(view: WorldView, req: RequestState) -> bool:
    """A request may be preempted again: it has not reached the bound."""
    return not view.knobs.switches.preemption_bound or req.attempt <= TUNING.max_preemptions


def may_stop(view: WorldView, req: RequestState) -> bool:
    """A running request may be stopped for higher-class work: paused (below the
    pause bound) when its backend can pause, else preempted (below that bound)."""
    if can_pause(view, view.services[req.service]):
        return req.pauses < TUNING.max_pauses
    return may_preempt(view, req)


def preemptible(svc: ServiceState, cls: ServiceClass, steady: bool = False) -> bool:
    """Whether work of ``svc`` may be stopped (and re-queued) for class ``cls`` (of a
    steady service when ``steady``: it ranks above batch, :func:`room_rank`).

    Batch and background work yields to any higher rank; a non-LLM on-demand
    interactive job (an image) yields to realtime work: it restarts a few seconds
    later within its looser SLO, while a voice request cannot wait.
    """
    if not ranks_below(svc.spec, cls, steady=steady) or floored(svc.spec, cls):
        return False
    if svc.spec.cls >= ServiceClass.BATCH:
        return True
    return (
        cls is ServiceClass.REALTIME
        and svc.spec.residency is Residency.ON_DEMAND
        and not svc.spec.kind.is_llm
    )


def stoppable(view: WorldView, svc: ServiceState) -> list[RequestState]:
    """The running requests of ``svc`` that :meth:`facts.may_stop` allows to stop."""
    running = svc.inflight.values()
    if can_pause(view, svc):
        return [r for r in running if r.pauses < TUNING.max_pauses]
    if not view.knobs.switches.preemption_bound:
        return list(running)
    return [r for r in running if r.attempt <= TUNING.max_preemptions]


def tier(view: WorldView, svc: ServiceState) -> Tier:
    """Where ``svc``'s weights go when it unloads."""
    return view.park_tier(svc) if view.knobs.switches.park_weights else Tier.COLD


def unload_frees(view: WorldView, svc: ServiceState) -> int:
    """Bytes an unload gives back: resident, KV pool and the allocator's reserved cache
    (less weights another loaded service shares: they stay)."""
    reserved = view.ledger.amount(svc.spec.device, svc.name, Category.RESERVED)
    if svc.spec.weights_key and view.weights_sharers(svc):
        kept = sum(le.nbytes for le in svc.resident_leases if le.category is Category.WEIGHTS)
        return svc.resident_bytes + reserved - kept
    return svc.resident_bytes + reserved


def parked_stays(view: WorldView, svc: ServiceState) -> int:
    """Bytes of ``svc``'s device an unload to its tier leaves charged: on the park device
    (kind ``host``: the park budget is that device's RAM) weights parked or sleeping stay
    there as ``parked`` (an unloading service: the tier it is going to)."""
    if svc.spec.device != view.park_device or (svc.spec.weights_key and view.weights_sharers(svc)):
        return 0
    to = svc.tier if svc.status is ServiceStatus.UNLOADING else tier(view, svc)
    return 0 if to is Tier.COLD else view.host_weight_bytes(svc)


def droppable_parked(
    view: WorldView, device: str, for_rank: int, strict: bool = False
) -> list[ServiceState]:
    """The services whose parked or sleeping weights on ``device`` (the park device) may be
    dropped for room for work of rank ``for_rank`` (:func:`room_rank`): the copies of
    services that hold no device memory, are not kept by the operator, and rank at or
    below it (strictly below when ``strict``), as an eviction would allow."""
    if device != view.park_device:
        return []
    out = []
    for name in view.host_weights:
        s = view.services[name]
        if s.holds_memory or s.pinned or s.admin_wants_loaded:
            continue
        rank = room_rank(s.spec.cls, steady=s.spec.steady)
        if rank > for_rank or (rank == for_rank and not strict):
            out.append(s)
    return out


def regaining(exclude: ServiceState | None) -> bool:
    """Whether room is made for a steady service that is not up: its load, its memory back
    after a crash or an eviction. It stops running batch work (it ranks above batch,
    :func:`room_rank`). Its frames only evict idle batch services (:func:`evictable`): a
    stopped job on a caching backend unloads its model, a frame a second every second."""
    return exclude is not None and exclude.spec.steady and not exclude.is_up


def kept_floor(view: WorldView, s: ServiceState) -> int:
    """Memory a kept (pinned or admin-loaded) service holds at its KV floor, with
    the allocator cache measured in it (freed only when it unloads: never)."""
    if (s.pinned or s.admin_wants_loaded) and s.holds_memory:
        return floor_held(view, s)
    return 0


def held_above(view: WorldView, device: str, svc: ServiceState) -> int:
    """What the loaded services on ``device`` that rank above ``svc`` (a higher class,
    :func:`room_rank`) and are not kept hold at their KV floor (the kept ones count in
    ``Room.max_possible``): room made for ``svc``'s work never evicts them
    (``Room.evictable``), only shrinks their KV pools, so that memory is out of its
    reach until they unload on their own."""
    rank = room_rank(svc.spec.cls, steady=svc.spec.steady)
    held = 0
    for other in view.loaded_on(device):
        if other is svc or other.pinned or other.admin_wants_loaded:
            continue
        if room_rank(other.spec.cls, steady=other.spec.steady) < rank:
            held += floor_held(view, other)
    return held


def configured_size(svc: ServiceState, kv_pool: int, active: int) -> int:
    """What ``svc`` needs by its configured estimate alone (weights, runtime, a KV pool of
    ``kv_pool`` bytes and ``active`` bytes of activations): against the empty device, it
    alone decides ``too_large``."""
    p = svc.spec.profile
    return p.weights + p.runtime + kv_pool + active


def floor_held(view: WorldView, s: ServiceState) -> int:
    """What a service holding memory keeps when its KV pool is shrunk to its floor: its
    weights, runtime and floor, with the allocator cache measured in it."""
    reserved = view.ledger.amount(s.spec.device, s.name, Category.RESERVED)
    return s.resident_bytes - s.kv_pool + s.spec.profile.kv_floor + reserved


def compute_yields_to_realtime(view: WorldView, svc: ServiceState) -> bool:
    if preemptible(svc, ServiceClass.REALTIME):
        return True
    return (
        svc.spec.kind.is_llm
        and svc.spec.cls is ServiceClass.INTERACTIVE
        and can_pause(view, svc)
        and view.knobs.switches.time_share
    )


def other_replica_up(view: WorldView, svc: ServiceState) -> bool:
    """Whether another replica of ``svc``'s service holds memory: a spare replica
    is loaded only for a request (:meth:`route`), never to keep warm."""
    group = svc.spec.group
    return bool(group) and any(r.holds_memory for r in view.groups[group] if r is not svc)


def wanted_by_higher_class(view: WorldView, svc: ServiceState) -> bool:
    """Whether requests of a higher class wait on ``svc``'s device: its memory is
    theirs, and a load there would be evicted again as soon as it is done."""
    device = svc.spec.device
    return any(
        view.waiting_classes.get((device, cls), 0) for cls in ServiceClass if cls < svc.spec.cls
    )


def forms_of(view: WorldView, svc: ServiceState) -> list[ServiceState]:
    """The forms of a service that may degrade, best first (:mod:`accelmux.core.degrade`);
    [] for any other service."""
    if svc.spec.variant is None:
        return []
    return sorted(view.groups[svc.spec.group], key=form_rank)


def form_rank(svc: ServiceState) -> int:
    return svc.spec.variant.rank if svc.spec.variant is not None else 0


def why_degraded(view: WorldView, svc: ServiceState) -> str:
    """Why a lesser form of a service loads: what its full form needs on its GPU, and
    what is free there."""
    variant = svc.spec.variant
    full = forms_of(view, svc)[0]
    device = full.spec.device
    mib = 1024 * 1024
    how = variant.describe() if variant is not None else svc.name
    return (
        f"{how}: the full model needs {footprint(view, full) // mib} MiB on {device}, "
        f"{max(0, view.ledger.available(device)) // mib} MiB free, and the rest is held "
        "by a higher class, busy work or other programs"
    )


def footprint(view: WorldView, svc: ServiceState) -> int:
    """What loading ``svc`` commits at its KV floor, calibrated."""
    weights, runtime, _ = view.projected_resident(svc, 0)
    return weights + runtime + svc.spec.profile.kv_floor


def retry_after(svc: ServiceState) -> float:
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
    view: WorldView, ops: WorldOps, req: RequestState, reason: Reason, detail: str = ""
) -> None:
    """``req`` waits for ``reason``; or, the first time it is told so with its service's
    queue at its bound, it is refused (queue full, Retry-After from the service time)."""
    svc = view.services[req.service]
    if not req.announced and svc.waiting_count - 1 >= svc.spec.queue_limit:
        ops.reject(
            req,
            reason=Reason.QUEUE_FULL,
            retry_after_s=retry_after(svc),
            detail=f"{svc.waiting_count - 1} waiting (limit {svc.spec.queue_limit})",
        )
        return
    ops.enqueue(req, reason=reason, detail=detail)


def held_back(svc: ServiceState, cls: ServiceClass, blocked: ServiceClass | None) -> bool:
    """Fair progress: work of ``cls`` on ``svc`` may take only idle memory while a higher
    class is blocked on memory, unless that class may not take ``svc`` anyway (a steady
    service and a blocked batch request: the background floor)."""
    return blocked is not None and blocked < cls and not floored(svc.spec, blocked)


def class_must_wait(
    dev: str,
    cls: ServiceClass,
    rnd: Round,
    fair_progress: bool,
    steady: bool = False,
) -> tuple[Reason, str] | None:
    """Why work of ``cls`` on ``dev`` waits this round, whatever its service (of a
    steady service when ``steady``, or where one may be among them).

    With fair progress on, whether work waits for a lower class blocked on memory
    depends on its service (:meth:`Admission.must_wait` decides it). A steady service's
    work is held while realtime work runs only where they share compute
    (``rnd.shared``: a host device, :func:`compute_is_shared`), where a frame beside a
    voice request slows it in proportion; on a discrete accelerator a frame takes little
    and cannot wait for a voice chain to end (its deadline is a second or so). Where
    compute is shared, new interactive work of any kind waits too (an image or an
    embedding request as much as a stream that cannot pause: each slows the voice
    request beside it); on a discrete accelerator it starts beside realtime work.
    """
    if dev in rnd.realtime_active and (
        (cls >= ServiceClass.BATCH and (not steady or dev in rnd.shared))
        or (cls is ServiceClass.INTERACTIVE and dev in rnd.shared)
    ):
        return Reason.HIGHER_CLASS_WAITING, "realtime work running"
    if cls is ServiceClass.BATCH and dev in rnd.interactive_active:
        # Batch work yields compute to interactive requests (it would slow them).
        return Reason.HIGHER_CLASS_WAITING, "interactive work running"
    blocked = rnd.blocked.get(dev)
    if not fair_progress and blocked is not None and blocked < cls:
        return Reason.HIGHER_CLASS_WAITING, f"{blocked.label} request waits for memory"
    return None


def earlier_waits_for_growth(svc: ServiceState, req: RequestState) -> bool:
    return any(r.seq < req.seq and r.wait_reason is Reason.RESIZING for r in svc.queue.values())


def reusable_cache(view: WorldView, svc: ServiceState, available: int) -> int:
    """The allocator cache of ``svc`` its own next request reuses (``cache_reuse``): its
    reserved blocks, unless its device is short (``available`` below 0)."""
    own_cache = view.ledger.amount(svc.spec.device, svc.name, Category.RESERVED)
    if available < 0 or not view.knobs.switches.cache_reuse:
        own_cache = 0  # under pressure the cache is what has to go, not reuse
    return own_cache


def in_window(svc: ServiceState, rnd: Round) -> bool:
    """Whether ``svc`` has no windows or one of them is open: once per round."""
    if not svc.spec.windows:
        return True
    inside = rnd.inside.get(svc.name)
    if inside is None:
        inside = rnd.inside[svc.name] = svc.spec.in_window(rnd.tod)
    return inside


def keep(svc: ServiceState) -> bool:
    return svc.pinned or svc.admin_wants_loaded


def ttl_floor(view: WorldView, svc: ServiceState) -> float:
    """The shortest TTL :meth:`Residents.ttl_range` can give ``svc``, whatever the memory and
    the restores: its own TTL, for an on-demand service also the on-demand TTL and the
    restore grace. Read without asking about memory or restores."""
    floor = svc.ttl_s
    if svc.spec.residency is Residency.ON_DEMAND:
        floor = min(floor, view.knobs.on_demand_ttl_s, TUNING.restore_grace_s)
    return floor


def likely_reused(view: WorldView, svc: ServiceState) -> bool:
    horizon = view.knobs.reuse_horizon_s
    return 1.0 - math.exp(-reuse_rate(svc, view.now, horizon) * horizon) >= 0.5


def pausing(view: WorldView, request_id: str) -> bool:
    """Whether ``request_id`` runs with a pause the backend has not answered yet."""
    req = view.inflight.get(request_id)
    return req is not None and req.pausing is not None


def ages_at(view: WorldView, req: RequestState) -> float:
    """When ``req`` ages: a batch request of a service that is not steady, once it has
    waited ``batch_age_fraction`` of its queue deadline; never (inf) for other work, with
    no deadline, or with no fraction set (the default: batch ageing is opt-in)."""
    fraction = view.knobs.batch_age_fraction
    if (
        fraction is None
        or req.cls is not ServiceClass.BATCH
        or view.services[req.service].spec.steady
        or not math.isfinite(req.deadline_at)
    ):
        return math.inf
    return req.arrived_at + fraction * (req.deadline_at - req.arrived_at)


def not_yet_aged(view: WorldView) -> Iterator[tuple[RequestState, float]]:
    """Each waiting request that will age and has not (:func:`ages_at`), with when: those
    of the batch services that are not steady. None while no fraction is set."""
    if view.knobs.batch_age_fraction is None:
        return
    for svc in view.queued:
        if svc.spec.cls is not ServiceClass.BATCH or svc.spec.steady:
            continue
        for req in svc.queue.values():
            if not req.aged:
                yield req, ages_at(view, req)
