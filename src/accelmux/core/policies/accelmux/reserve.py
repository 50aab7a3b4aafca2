"""The realtime reserve: memory kept free of resident memory and of lower-class leases for
the next activations of each loaded realtime service (``realtime_reserve``), one
activation when the full reserve would keep work out for good (``reserve_fallback``), and
the part of it that services realtime work can take back by one unload may hold
(``reserve_lending``).
"""

from __future__ import annotations

from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.cache import Miss
from accelmux.core.policies.accelmux.records import Seam
from accelmux.core.types import Reason, ServiceClass, ServiceStatus
from accelmux.core.world import RequestState, ServiceState


class Reserve:
    """The realtime reserve: how much a lower-class need leaves free for realtime work."""

    def __init__(self, seam: Seam) -> None:
        self.view = seam.view
        self.ops = seam.ops
        self.cache = seam.cache

    def realtime_reserve(self, device: str) -> int:
        """Memory kept free for the next requests of loaded realtime services.

        Lower classes may not take it: a voice request never waits for memory that
        chat or batch work holds. Sized by the largest activation seen per service
        (its workspace estimate before any request), minus what its requests hold now.
        """
        if not self.view.knobs.switches.realtime_reserve:
            return 0
        cache = self.cache
        version = self.view.version
        hit = cache.realtime_reserve.entries.get(device)  # asked for every request considered
        if hit is not None and hit[0] == version:
            return hit[1]
        # It reads the device's realtime services (their state moves the device's epoch)
        # and the peaks seen: while neither changed, the last value found still holds.
        stamp = (self.view.epoch(device), self.view.learned.realtime_peak_changes)
        value = cache.reserves.get(device, stamp)
        if value is Miss.MISS:
            value = cache.reserves.put(device, stamp, self.compute_realtime_reserve(device))
        return cache.realtime_reserve.put(device, version, value)

    def yields_to_realtime(self, svc: ServiceState) -> bool:
        """Whether realtime work takes ``svc``'s activation leases back at once: it is
        preempted, or (an interactive LLM that can pause) paused between tokens.

        What the spec and the knobs say: found once per service."""
        found = self.cache.yields_to_realtime.get(svc.name, None)
        if found is Miss.MISS:
            found = self.cache.yields_to_realtime.put(
                svc.name, None, facts.compute_yields_to_realtime(self.view, svc)
            )
        return found

    def fitting_reserve(
        self, svc: ServiceState, need: int, limit: int, *, reused: int = 0, stays: int = 0
    ) -> int:
        """The realtime reserve a lower-class need of ``need`` bytes of ``svc`` must leave
        free, when at most ``limit`` bytes could ever be freed for it; for a request on
        loaded ``svc``, ``reused`` of its need come from its service's own allocator cache
        and ``stays`` bytes of that service's own memory beyond its ledger (``reserved``,
        counted in ``limit``) stay for as long as it is loaded.

        The full reserve holds every loaded realtime service's next activations at once.
        When that would keep ``need`` out for good although it fits the device
        (``reserve_fallback``), it leaves one realtime activation free instead (the
        largest: a voice chain runs one step at a time). "For good" weighs what the need
        takes afresh against what could ever be free beside the memory that stays: a
        chat model measured at 1.8x its estimate otherwise looked as if its own excess
        could be freed for the reserve, and each of its requests waited out its
        deadline for a full reserve that never could be free beside it (adversary case
        ``adv-0163``, seed 0: interactive 15.8 % where ``static`` gave 100 %, realtime
        100 % in both). When ``need`` fits in free memory, services realtime work can
        take back by one unload may hold the reserve (``reserve_lending``): only the
        rest of it must be free.
        """
        device = svc.spec.device
        reserve = full = self.realtime_reserve(device)
        fresh = max(0, need - reused)
        if fresh + full > limit - stays >= fresh and self.view.knobs.switches.reserve_fallback:
            largest = max(
                (
                    self.typical_activation(s)
                    for s in self.view.realtime_by_device[device]
                    if s.holds_memory
                ),
                default=0,
            )
            reserve = min(full, largest)
        available = self.view.ledger.available(device)
        if need <= available < need + reserve and self.view.knobs.switches.reserve_lending:
            # Lent only when ``need`` fits in free memory: the services that hold the
            # rest must stay to be given back, so none of them is evicted for ``need``.
            lent = max(0, reserve - self.quickly_freeable(device, svc))
            if available >= need + lent:
                return lent
        return reserve

    def quickly_freeable(self, device: str, exclude: ServiceState) -> int:
        """Memory realtime work could take back on ``device`` by one unload each: what
        the services below realtime that it may evict hold (``exclude`` aside; see
        :meth:`Reserve.freeable_for_realtime`).

        The realtime reserve only has to be free *or* this (``reserve_lending``): a voice
        request that finds it held by an idle chat model waits for one unload, not for
        the model's next request to end."""
        epoch = self.view.epoch(device)  # what it reads moves the device's epoch
        total = self.cache.quickly_freeable.get(device, epoch)
        if total is Miss.MISS:
            total = self.cache.quickly_freeable.put(
                device, epoch, self.sum_quickly_freeable(device)
            )
        if self.freeable_for_realtime(exclude):
            total -= facts.unload_frees(self.view, exclude)
        return max(0, total)

    def sum_quickly_freeable(self, device: str) -> int:
        return sum(
            facts.unload_frees(self.view, s)
            for s in self.view.loaded_on(device)
            if self.freeable_for_realtime(s)
        )

    def freeable_for_realtime(self, svc: ServiceState) -> bool:
        """Realtime work could take all ``svc`` holds back by one unload: it is loaded,
        below realtime, not kept, and idle, or running only work realtime preempts (a
        batch or background job below its preemption bound), which it then evicts."""
        if (
            svc.status is not ServiceStatus.LOADED
            or svc.spec.cls <= ServiceClass.REALTIME
            or facts.keep(svc)
        ):
            return False
        if svc.idle:
            return True
        knobs = self.view.knobs
        return (
            knobs.switches.preemption
            and knobs.switches.evict_after_preemption
            and not svc.paused_kv
            and facts.preemptible(svc, ServiceClass.REALTIME)
            and all(facts.may_preempt(self.view, r) for r in svc.inflight.values())
        )

    def typical_activation(self, svc: ServiceState) -> int:
        """A realtime service's next activation: the largest projected so far (its learned
        ``realtime_peak``), or its workspace estimate before any request."""
        typical = self.view.learned.realtime_peak.get(svc.name)
        if typical is None:
            typical = svc.calibration.active.project(svc.spec.profile.workspace)
        return typical

    def compute_realtime_reserve(self, device: str) -> int:
        total = 0
        for s in self.view.realtime_by_device[device]:
            if not s.holds_memory:
                continue
            typical = self.typical_activation(s)
            held = sum(r.active_lease.nbytes for r in s.inflight.values() if r.active_lease)
            total += max(0, s.spec.concurrency * typical - held)
        return total

    def explain_reserve(
        self,
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
        for s in self.view.realtime_by_device[device]:
            if s.holds_memory:
                source = "learned peak" if s.name in self.view.learned.realtime_peak else "estimate"
                typical = self.typical_activation(s)
                sized.append(f"{s.name} {s.spec.concurrency} x {typical} B ({source})")
        self.ops.add_explanation(
            req, f"kept {reserve} B free for realtime work: {', '.join(sized)}"
        )
