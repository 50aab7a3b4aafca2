"""Loading a service for a waiting request: the KV pool a load asks for, its sizes, and the
gates a cold start passes (serial loads after an out-of-memory load included).
"""

from __future__ import annotations

from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.cache import Miss
from accelmux.core.policies.accelmux.records import RoomFor, Round, Seam
from accelmux.core.policies.accelmux.reserve import Reserve
from accelmux.core.policies.accelmux.room import Room
from accelmux.core.policies.accelmux.steady import Steady
from accelmux.core.shrink import scaled_demand
from accelmux.core.types import Reason, ResizeSupport, ServiceClass, ServiceStatus
from accelmux.core.world import RequestState, ServiceState


class Loading:
    """Loading a service for a waiting request: its sizes, its room, its gates."""

    def __init__(self, seam: Seam, room: Room, reserve: Reserve, steady: Steady) -> None:
        self.view = seam.view
        self.ops = seam.ops
        self.cache = seam.cache
        self.room = room
        self.reserve = reserve
        self.steady = steady

    def wait(self, req: RequestState, reason: Reason, detail: str = "") -> None:
        """``req`` waits for ``reason`` (or is refused, its queue full: ``facts``)."""
        facts.queue_or_reject(self.view, self.ops, req, reason, detail)

    def loads_one_at_a_time(self, device: str) -> bool:
        """A load has run out of memory on ``device`` and another load is in flight there
        (``serial_loads``): a second load waits for it. A load's true size is known only
        once it is measured, so two loads side by side on a device where one was already
        larger than its ledger said can both fail, and a service a second time."""
        if device not in self.view.load_oom_devices or not self.view.knobs.switches.serial_loads:
            return False
        return any(s.status is ServiceStatus.LOADING for s in self.view.services_by_device[device])

    def load_pool(self, svc: ServiceState, wanted: int) -> int:
        """The KV pool a load asks for: the KV bytes ``wanted``, within the floor and the
        ceiling, when the pool can grow and shrink later (a live resize).

        A pool that changes only at the next load is sized for the largest waiting
        request too, plus the memory that is free beyond the realtime reserve and the
        spare fraction of the budget, since it cannot grow later without a reload. A
        backend that cannot resize at all holds its ceiling (:meth:`WorldView.load` sees to
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
            self.view.ledger.available(dev)
            - sum(self.view.projected_resident(svc, base))
            - self.reserve.realtime_reserve(dev)
            - int(self.view.knobs.spare_fraction * self.view.devices[dev].usable_bytes)
        )
        return base + max(0, min(p.kv_ceiling - base, free))

    def kv_pool_fixed(self, req: RequestState, svc: ServiceState) -> None:
        """A request whose KV does not fit a pool that cannot change while loaded.

        If it would fit the empty pool it waits for running requests to end. If not, and
        the backend resizes at its next load, the idle service is unloaded so that it
        reloads with a pool sized for the waiting requests; while busy, it waits.
        """
        kv = req.estimate.kv_bytes
        if kv <= svc.kv_slot:
            self.wait(
                req,
                Reason.CONCURRENCY_LIMIT,
                f"KV pool full ({svc.kv_in_use} B of {svc.kv_pool} B in use)",
            )
            return
        if svc.resize_support is ResizeSupport.NEXT_LOAD and svc.idle:
            self.ops.unload(
                svc,
                reason=Reason.RESIZE_AT_NEXT_LOAD,
                detail=f"KV pool {svc.kv_pool} B < {kv} B for {req.request_id}",
            )
            self.wait(req, Reason.LOADING, "reloads with a larger KV pool")
            return
        self.wait(
            req,
            Reason.CONCURRENCY_LIMIT,
            f"needs {kv} B of KV, its pool holds {svc.kv_pool} B until its next load",
        )

    def load_for(
        self,
        req: RequestState,
        svc: ServiceState,
        rnd: Round,
        outside: bool,
        idle_only: bool = False,
    ) -> None:
        """Load ``svc`` for ``req`` if it can ever fit and its room can be made now (a cold
        start: ``req`` waits for the load), else reject it or make it wait, saying why.
        ``idle_only``: fair progress, it may take only idle memory."""
        dev = svc.spec.device
        knobs = self.view.knobs
        pool, need, reserve, limit = self.load_plan(req, svc)
        if need > limit:  # what _max_possible says (nothing changed since it was asked)
            self.refuse_beyond_limit(req, svc, pool, need, limit)
            return
        available = self.view.ledger.available(dev)
        spare = knobs.spare_fraction * self.view.devices[dev].usable_bytes
        if outside and available - need < spare:
            self.wait(req, Reason.OUTSIDE_WINDOW, "no spare memory to load")
            return
        if self.loads_one_at_a_time(dev):
            self.wait(
                req,
                Reason.LOADING,
                "after an out-of-memory load, loads go one at a time",
            )
            return
        if idle_only and available < need + reserve:
            # Fair progress loads into idle memory only: it takes nothing from the
            # waiting higher class (the service is evictable again once idle).
            self.wait(
                req,
                Reason.HIGHER_CLASS_WAITING,
                "idle memory too small to load",
            )
            return
        reason = Reason.RELOAD_AFTER_CRASH if svc.status is ServiceStatus.CRASHED else Reason.DEMAND
        detail = f"for {req.request_id}"
        if svc.spec.variant is not None and svc.spec.variant.degraded:
            reason, detail = Reason.DEGRADED, f"{detail}: {facts.why_degraded(self.view, svc)}"
        room = need + reserve - self.room.own_parked(svc)
        if self.room.make_room(dev, room, RoomFor.request(req, svc, reason)) and self.ops.load(
            svc, reason=reason, kv_pool=pool, detail=detail
        ):
            self.wait(req, Reason.LOADING, "cold start")
            self.explain_learned(req, svc)
            return
        self.wait_for_memory(req, svc, rnd, need, reserve)

    def wait_for_memory(
        self, req: RequestState, svc: ServiceState, rnd: Round, need: int, reserve: int
    ) -> None:
        """``req``'s load needs ``need`` bytes (and ``reserve`` left free) its device has not
        got now: it waits (holding lower classes back where they could be freed), or a
        realtime request no eviction could serve is refused at once."""
        dev = svc.spec.device
        if self.room.reachable(dev, need + reserve, svc):
            rnd.block(dev, req.cls)
        elif req.cls is ServiceClass.REALTIME:
            self.room.refuse(req, dev, need)
            return
        was = req.wait_reason
        self.wait(
            req,
            Reason.NO_MEMORY,
            ""  # told once: a request waiting for this reason is not told again
            if was is Reason.NO_MEMORY
            else f"load needs {need} B, {self.view.ledger.available(dev)} B available",
        )
        self.reserve.explain_reserve(req, dev, reserve, was)

    def refuse_beyond_limit(
        self, req: RequestState, svc: ServiceState, pool: int, need: int, limit: int
    ) -> None:
        """Refuse ``req``: its load, as projected (``need`` bytes), needs more than the
        ``limit`` its device could ever give it, saying why.

        Only the configured estimate against the empty device decides that a service
        can never run (``too_large``): what was learned from measurements and failures,
        and what the kept services hold as measured, never refuses as too large a
        service whose estimate fits the device. A size learned from an out-of-memory load
        of its own refuses it until its re-test (``load_failed``, with the size, its
        evidence and the re-test's time); otherwise it is refused for now (``no_memory``:
        the memory kept services hold, or the device's, may change)."""
        raw = facts.configured_size(svc, pool, req.estimate.active_bytes)
        usable = self.view.devices[svc.spec.device].usable_bytes
        if raw > usable:
            self.ops.reject(
                req,
                reason=Reason.TOO_LARGE,
                retry_after_s=0.0,
                detail=(
                    f"its estimate needs {raw} B to run, more than the {usable} B usable "
                    "budget of its device holds even empty"
                ),
            )
            return
        size = self.view.learned.sizes.get(svc.name)
        if size is not None and not size.testing:
            self.ops.reject(
                req,
                reason=Reason.LOAD_FAILED,
                retry_after_s=max(1.0, min(3600.0, size.retest_at - self.view.now)),
                detail=(
                    f"learned to need {size.nbytes} B at t={size.at:.0f} ({size.evidence}), "
                    f"more than the {limit} B its device can hold for it; " + size.retest_words()
                ),
            )
            return
        self.ops.reject(
            req,
            reason=Reason.NO_MEMORY,
            retry_after_s=60.0,
            detail=(
                f"needs {need} B (its estimate {raw} B), more than the {limit} B its "
                "device can hold for it beside the services kept loaded (as measured)"
            ),
        )

    def explain_learned(self, req: RequestState, svc: ServiceState) -> None:
        """Say what sized the load just started for ``req`` when a size learned from an
        out-of-memory load did (its evidence and re-test), or it re-tests one."""
        size = self.view.learned.sizes.get(svc.name)
        if size is None:
            return
        if size.testing:
            text = (
                f"re-tests {svc.name}'s learned size ({size.nbytes} B, {size.evidence}): "
                "loads as measured before it"
            )
        else:
            text = (
                f"{svc.name} loads at the {size.nbytes} B it was learned to need at "
                f"t={size.at:.0f} ({size.evidence}); {size.retest_words()}"
            )
        self.ops.add_explanation(req, text)

    def load_sizes(self, req: RequestState, svc: ServiceState) -> tuple[int, int, int, int]:
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
            hit = self.cache.load_sizes.get(req.request_id, stamp)
            if hit is not Miss.MISS and hit[0] is req:
                return hit[1]
        pool = self.load_pool(svc, req.estimate.kv_bytes)
        shrink = svc.spec.shrink
        active = (
            self.view.projected_active(req)
            if shrink is None
            # a service that may shrink loads when its smallest batch fits beside it
            else cal.project_active(
                self.view.estimate(svc.name, scaled_demand(req.demand, shrink.min_fraction))
            )
        )
        sizes = (
            pool,
            active,
            sum(self.view.projected_resident(svc, pool)),
            cal.active.project_observed(req.estimate.active_bytes),
        )
        if fixed:
            self.cache.load_sizes.put(req.request_id, stamp, (req, sizes))
        return sizes

    def load_plan(self, req: RequestState, svc: ServiceState) -> tuple[int, int, int, int]:
        """(KV pool, bytes the load and ``req`` need, realtime reserve to leave free, the most
        the device could ever free for them) of loading ``svc`` for ``req``."""
        pool, active, resident, observed = self.load_sizes(req, svc)
        need = resident + active
        limit = self.room.max_possible(svc.spec.device, svc)
        if need > limit >= resident + observed and self.view.knobs.switches.degrade_to_raw:
            # Only the calibration margin does not fit: plan for the estimate scaled by
            # what was measured (the dispatch degrades the same way).
            active = observed
            need = resident + active
        return pool, need, self.load_reserve(req, svc, need, active, limit), limit

    def load_reserve(
        self, req: RequestState, svc: ServiceState, need: int, active: int, limit: int
    ) -> int:
        """What a load of ``svc`` needing ``need`` bytes (``active`` of them ``req``'s
        activations) for ``req`` leaves free, at most ``limit`` bytes being freeable for
        it: the realtime reserve (for work below realtime) and the next frame of each
        steady service ranked above it."""
        reserve = 0
        if req.cls > ServiceClass.REALTIME:
            # Resident memory must leave the realtime reserve free; the first request's
            # activations may overlap it when realtime work can preempt them.
            reserve = self.reserve.fitting_reserve(svc, need, limit)
            if self.reserve.yields_to_realtime(svc):
                reserve = max(0, reserve - active)
        return reserve + self.steady.steady_reserve(svc, need, limit)
