"""The realtime reserve: memory kept free of resident memory and of lower-class leases for
the next activations of each loaded realtime service (``realtime_reserve``), one
activation when the full reserve would keep work out for good (``reserve_fallback``), and
the part of it that services realtime work can take back by one unload may hold
(``reserve_lending``).
"""

from __future__ import annotations

from accelmux.core.types import (
    Reason,
    ServiceClass,
    ServiceStatus,
)

from .interface import Parts
from .state import RequestState, ServiceState, World


def realtime_reserve(self: Parts, world: World, device: str) -> int:
    """Memory kept free for the next requests of loaded realtime services.

    Lower classes may not take it: a voice request never waits for memory that
    chat or batch work holds. Sized by the largest activation seen per service
    (its workspace estimate before any request), minus what its requests hold now.
    """
    if not world.knobs.switches.realtime_reserve:
        return 0
    key = ("realtime_reserve", device)
    version = world.version
    hit = self._memo.get(key)  # _cached, inlined: asked for every request considered
    if hit is not None and hit[0] == version:
        return hit[1]
    # It reads the device's realtime services (their state moves the device's epoch)
    # and the peaks seen: while neither changed, the last value found still holds.
    epoch = world.epoch(device)
    peaks = world.learned.realtime_peak_changes
    last = self._reserves.get(device)
    if last is not None and last[0] == epoch and last[1] == peaks:
        value = last[2]
    else:
        value = self._compute_realtime_reserve(world, device)
        self._reserves[device] = (epoch, peaks, value)
    self._memo[key] = (version, value)
    return value


def yields_to_realtime(self: Parts, world: World, svc: ServiceState) -> bool:
    """Whether realtime work takes ``svc``'s activation leases back at once: it is
    preempted, or (an interactive LLM that can pause) paused between tokens.

    What the spec and the knobs say: found once per service."""
    facts = self._static_facts(world)
    found = facts.get(svc.name)
    if found is None:
        found = facts[svc.name] = self._compute_yields_to_realtime(world, svc)
    return found


def static_facts(self: Parts, world: World) -> dict[str, bool]:
    """Per service, what :meth:`_yields_to_realtime` found (for ``world`` only)."""
    if self._facts_world is not world:
        self._facts_world = world
        self._facts = {}
    return self._facts


def compute_yields_to_realtime(self: Parts, world: World, svc: ServiceState) -> bool:
    if self._preemptible(svc, ServiceClass.REALTIME):
        return True
    return (
        svc.spec.kind.is_llm
        and svc.spec.cls is ServiceClass.INTERACTIVE
        and self._can_pause(world, svc)
        and world.knobs.switches.time_share
    )


def fitting_reserve(self: Parts, world: World, svc: ServiceState, need: int, limit: int) -> int:
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
    if need + full > limit >= need and world.knobs.switches.reserve_fallback:
        largest = max(
            (
                self._typical_activation(world, s)
                for s in world.realtime_by_device[device]
                if s.holds_memory
            ),
            default=0,
        )
        reserve = min(full, largest)
    available = world.ledger.available(device)
    if need <= available < need + reserve and world.knobs.switches.reserve_lending:
        # Lent only when ``need`` fits in free memory: the services that hold the
        # rest must stay to be given back, so none of them is evicted for ``need``.
        lent = max(0, reserve - self._quickly_freeable(world, device, svc))
        if available >= need + lent:
            return lent
    return reserve


def quickly_freeable(self: Parts, world: World, device: str, exclude: ServiceState) -> int:
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


def sum_quickly_freeable(self: Parts, world: World, device: str) -> int:
    return sum(
        self.unload_frees(world, s)
        for s in world.loaded_on(device)
        if self._freeable_for_realtime(world, s)
    )


def freeable_for_realtime(self: Parts, world: World, svc: ServiceState) -> bool:
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
        knobs.switches.preemption
        and knobs.switches.evict_after_preemption
        and not svc.paused_kv
        and self._preemptible(svc, ServiceClass.REALTIME)
        and all(self._may_preempt(world, r) for r in svc.inflight.values())
    )


def typical_activation(self: Parts, world: World, svc: ServiceState) -> int:
    """A realtime service's next activation: the largest projected so far (its learned
    ``realtime_peak``), or its workspace estimate before any request."""
    typical = world.learned.realtime_peak.get(svc.name)
    if typical is None:
        typical = svc.calibration.active.project(svc.spec.profile.workspace)
    return typical


def compute_realtime_reserve(self: Parts, world: World, device: str) -> int:
    total = 0
    for s in world.realtime_by_device[device]:
        if not s.holds_memory:
            continue
        typical = self._typical_activation(world, s)
        held = sum(r.active_lease.nbytes for r in s.inflight.values() if r.active_lease)
        total += max(0, s.spec.concurrency * typical - held)
    return total


def explain_reserve(
    self: Parts,
    world: World,
    req: RequestState,
    device: str,
    reserve: int,
    was: Reason | None,
) -> None:
    """When ``req`` was just told to wait for memory (its wait reason was ``was``) while
    ``reserve`` bytes were kept free on ``device`` for the loaded realtime services, add
    to its explanation the activation each service's share was sized by (its learned
    peak, or its estimate before any request)."""
    if not reserve or was is Reason.NO_MEMORY or req.wait_reason is not Reason.NO_MEMORY:
        return
    sized = []
    for s in world.realtime_by_device[device]:
        if s.holds_memory:
            source = "learned peak" if s.name in world.learned.realtime_peak else "estimate"
            typical = self._typical_activation(world, s)
            sized.append(f"{s.name} {s.spec.concurrency} x {typical} B ({source})")
    world.add_explanation(req, f"kept {reserve} B free for realtime work: {', '.join(sized)}")
