"""Time sharing between models and yielding compute to realtime work: pausing streams for
another model's first token (``time_share``, ``first_token_pause``), pausing interactive
streams while realtime work runs on their device (``realtime_yield``), and what a round
must know of both.
"""

from __future__ import annotations

from accelmux.core.types import (
    Reason,
    ServiceClass,
)

from .heuristics import TUNING
from .interface import Parts
from .state import RequestState, ServiceState, World


def pause_for_first_token(self: Parts, world: World, svc: ServiceState, req: RequestState) -> bool:
    """A new request of a service at its concurrency limit pauses the stream of that
    service that has run longest (at least ``TIME_SHARE_MIN_RUN_S``, below the
    pause bound): it gets its first token now, the paused stream resumes at the
    next free slot. Its KV state is parked only when the pool must make room."""
    if req.paused or not world.knobs.switches.first_token_pause or not self._can_pause(world, svc):
        return False
    if not svc.spec.kind.is_llm:
        return False
    ran = [
        r
        for r in svc.inflight.values()
        if r.running_since is not None
        and world.now - r.running_since >= TUNING.time_share_min_run_s
        and r.pauses < TUNING.max_pauses
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


def yielding(self: Parts, world: World, req: RequestState) -> bool:
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


def sharing_key(world: World, requester: RequestState | None) -> object:
    """What a make_room failure depends on beyond its class: what time sharing reads
    of the requester, when it may pause other models' streams (:meth:`_time_shared`:
    its service, whether that is an LLM, whether it is paused). Requests alike in
    these share a failure (the memo lasts one round: the time does not change)."""
    if requester is None or not world.knobs.switches.time_share:
        return None
    return (requester.service, requester.paused)


def room_key(self: Parts, world: World, device: str, requester: RequestState | None) -> object:
    """:meth:`_sharing_key`, or None where no service of ``device`` can be paused for
    time sharing (then no requester's state changes what make_room can free)."""
    if device not in self._time_sharing_devices(world):
        return None
    return self._sharing_key(world, requester)


def time_sharing_devices(self: Parts, world: World) -> frozenset[str]:
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


def can_pause(world: World, svc: ServiceState) -> bool:
    caps = svc.spec.capabilities
    return world.knobs.switches.pause and caps.pause and caps.park


def time_shared(
    self: Parts,
    world: World,
    svc: ServiceState,
    cls: ServiceClass,
    requester: RequestState | None,
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
        or not world.knobs.switches.time_share
        or not (for_realtime or same_class_llm)
        or not svc.spec.kind.is_llm
        or not self._can_pause(world, svc)
        or svc.name == requester.service
        or svc.paused_kv  # a request paused in its pool keeps it loaded
    ):
        return []
    run = 0.0 if svc.spec.cls > cls else TUNING.time_share_min_run_s
    if requester.paused:
        run = TUNING.time_share_quantum_s
    running = list(svc.inflight.values())
    for r in running:
        since = r.running_since if r.running_since is not None else world.now
        if r.pauses >= TUNING.max_pauses or world.now - since < run:
            return []
        if not r.pausable or r.pausing is not None:
            return []  # one that cannot pause (or is pausing) is never preempted here
    return running


def realtime_devices(world: World) -> set[str]:
    """Devices where realtime work runs or waits (or ended within the grace)."""
    out: set[str] = set()
    grace = world.knobs.realtime_grace_s
    for dev, svcs in world.realtime_by_device.items():
        for svc in svcs:
            if svc.inflight or svc.waiting_count or world.now < svc.last_used + grace:
                out.add(dev)
                break
    return out


def round_realtime_devices(self: Parts, world: World) -> set[str]:
    """:meth:`_realtime_devices`, found once per round: the yield to realtime work and
    the schedule both ask, and nothing between them starts, ends or queues realtime
    work (they pause, preempt, evict and load only lower-class or idle services)."""
    if self._rt_devices is None:
        self._rt_devices = self._realtime_devices(world)
    return self._rt_devices


def yields_compute(self: Parts, world: World, svc: ServiceState) -> bool:
    """Interactive LLM work that pauses while realtime work runs beside it."""
    return (
        svc.spec.cls is ServiceClass.INTERACTIVE
        and svc.spec.kind.is_llm
        and self._can_pause(world, svc)
        and world.knobs.switches.realtime_yield
    )


def compute_is_shared(world: World, device: str) -> bool:
    """A host device (shared memory: CPU cores, or an integrated accelerator whose
    decode runs at the RAM's bandwidth) shares its compute and its memory bandwidth
    with every model and the OS: anything running beside realtime work slows it in
    proportion, so interactive streams yield at once and new ones wait. A discrete
    accelerator runs a batch-1 decode beside it for less, and a new stream gets its
    first token first."""
    return world.devices[device].kind == "host"


def yield_to_realtime(self: Parts, world: World) -> None:
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
            if not shared_cores and world.now - since < TUNING.time_share_min_run_s:
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


def share_thresholds(world: World, device: str) -> tuple[tuple[str, bool, bool], ...]:
    """Which running streams on ``device`` that could be paused have run long enough
    to be paused for another request (``TIME_SHARE_MIN_RUN_S``, and the quantum of a
    stream paused before): time alone changes that, so a round where one crossed is
    not a repeat."""
    if not world.knobs.switches.pause:
        return ()
    now = world.now
    return tuple(
        (r.request_id, ran >= TUNING.time_share_min_run_s, ran >= TUNING.time_share_quantum_s)
        for svc in world.loaded_on(device)
        if svc.inflight and svc.spec.capabilities.pause
        for r in svc.inflight.values()
        if r.pausable and r.running_since is not None
        for ran in (now - r.running_since,)
    )


def pausing(world: World, request_id: str) -> bool:
    """Whether ``request_id`` runs with a pause the backend has not answered yet."""
    req = world.inflight.get(request_id)
    return req is not None and req.pausing is not None
