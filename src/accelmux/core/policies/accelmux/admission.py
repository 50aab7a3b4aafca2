"""The gates a waiting request passes to run on a loaded service: each either lets it
through, makes it wait (with a reason) or rejects it (with a reason and Retry-After).
"""

from __future__ import annotations

from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.loading import Loading
from accelmux.core.policies.accelmux.records import Admitting, RoomFor, Round, Seam
from accelmux.core.policies.accelmux.reserve import Reserve
from accelmux.core.policies.accelmux.room import Room
from accelmux.core.policies.accelmux.shrinking import Shrinking
from accelmux.core.policies.accelmux.time_sharing import TimeSharing
from accelmux.core.specs import floored
from accelmux.core.types import Category, Reason, ResizeSupport, ServiceClass, ServiceStatus
from accelmux.core.world import RequestState, ServiceState


class Admission:
    """The gates a waiting request passes, and its start on its loaded service."""

    def __init__(
        self,
        seam: Seam,
        room: Room,
        reserve: Reserve,
        loading: Loading,
        time_sharing: TimeSharing,
        shrinking: Shrinking,
    ) -> None:
        self.view = seam.view
        self.ops = seam.ops
        self.cache = seam.cache
        self.room = room
        self.reserve = reserve
        self.loading = loading
        self.time_sharing = time_sharing
        self.shrinking = shrinking

    def wait(self, req: RequestState, reason: Reason, detail: str = "") -> None:
        """``req`` waits for ``reason`` (or is refused, its queue full: ``facts``)."""
        facts.queue_or_reject(self.view, self.ops, req, reason, detail)

    def service_wait(
        self, svc: ServiceState, cls: ServiceClass, rnd: Round
    ) -> tuple[bool, tuple[Reason, str] | None]:
        """(whether ``svc`` is outside its windows, :meth:`Admission.must_wait` for its requests of
        ``cls``), found once per service while no action runs: the round's state it reads
        does not change during the class's turn (``blocked`` below the class stays as it
        is), the service's only through an action."""
        key = (svc.name, cls)
        version = self.view.version
        hit = self.cache.service_waits.entries.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        outside = not facts.in_window(svc, rnd)
        return self.cache.service_waits.put(
            key, version, (outside, self.must_wait(svc, cls, outside, rnd))
        )

    def must_wait(
        self,
        svc: ServiceState,
        cls: ServiceClass,
        outside: bool,
        rnd: Round,
    ) -> tuple[Reason, str] | None:
        """Why a request of ``svc`` waits without competing for memory, if it does."""
        dev = svc.spec.device
        fair_progress = self.view.knobs.switches.fair_progress
        wait = facts.class_must_wait(dev, cls, rnd, fair_progress, svc.spec.steady)
        if wait is not None:
            return wait
        if (
            cls is ServiceClass.BACKGROUND
            and svc.inflight
            and not svc.spec.steady
            and dev in rnd.interactive_active  # filled only with batch_yield on
        ):
            # Beside interactive work a background service keeps one request running, no
            # more: each one beside a stream slows its tokens (home-0176: indexing beside
            # chat on a host); none at all starved indexing where interactive work never
            # stopped (home-0044).
            return Reason.HIGHER_CLASS_WAITING, "interactive work running: one at a time"
        blocked = rnd.blocked.get(dev)
        if (
            fair_progress
            and blocked is not None
            and blocked < cls
            and (svc.status is ServiceStatus.UNLOADING or not facts.preemptible(svc, blocked))
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
            and self.view.now < svc.backoff_until
        ):
            return Reason.BACKOFF, f"restart after {svc.backoff_until - self.view.now:.1f}s"
        return None

    def consider(self, req: RequestState, rnd: Round) -> None:
        """Decide one waiting request: reject it, make it wait (with a reason), load its
        service, or run it (:meth:`Admission.admit`)."""
        svc = self.view.services[req.service]
        if req.estimate.kv_bytes > svc.kv_request_limit:
            self.ops.reject(
                req,
                reason=Reason.TOO_LARGE,
                retry_after_s=0.0,
                detail=_too_large_kv(svc, req),
            )
            return
        outside, wait = self.service_wait(svc, req.cls, rnd)
        if wait is not None:
            dev = svc.spec.device
            if (
                svc.spec.steady
                and req.cls >= ServiceClass.BATCH
                and dev in rnd.shared
                and dev in rnd.realtime_active
            ):
                self.ops.hold_for_realtime(req)  # a frame delayed (or skipped) for voice
            self.wait(req, *wait)
            return
        if self.gives_way(req, svc, rnd):
            return
        blocked = rnd.blocked.get(svc.spec.device)
        if svc.status in (ServiceStatus.UNLOADED, ServiceStatus.CRASHED):
            # Past _must_wait with a lower class waiting for memory, fair progress applies:
            # work that class could preempt may still use idle memory (it takes nothing from
            # anyone, and gives the memory back when preempted).
            idle_only = facts.held_back(svc, req.cls, blocked)
            self.loading.load_for(req, svc, rnd, outside, idle_only)
            return
        if self.one_at_a_time(req, svc):
            return
        self.admit(req, svc, rnd, outside, blocked)

    def gives_way(self, req: RequestState, svc: ServiceState, rnd: Round) -> bool:
        """Whether ``req`` waits for compute it gives to others (it is told so): realtime work
        on its device (``realtime_yield``), or the request it was paused for."""
        dev = svc.spec.device
        if dev in rnd.realtime_work and (
            (req.paused and req.request_id in self.time_sharing.yielded_realtime)
            or (
                not req.paused
                and facts.yields_compute(self.view, svc)
                and facts.compute_is_shared(self.view, dev)
            )
        ):
            self.wait(req, Reason.HIGHER_CLASS_WAITING, "realtime work running")
            return True
        if req.paused and self.time_sharing.yielding(req):
            self.wait(
                req,
                Reason.PAUSED,
                f"gave its memory to {self.time_sharing.yielded_to[req.request_id]}",
            )
            return True
        return False

    def one_at_a_time(self, req: RequestState, svc: ServiceState) -> bool:
        """Whether ``req`` waits for a request of its own loaded service to end (it is told
        so): the service is measured above its limit or its leases, or at its concurrency
        (unless a stream of it pauses for ``req``'s first token)."""
        inflight = svc.inflight
        if svc.over_limit and inflight:
            # Measured far above its profile: it may not grow further while it serves,
            # so it runs one request at a time (its measured bytes are already in the
            # ledger as reserved, so admission stays safe) until a reload recalibrates it.
            self.wait(
                req,
                Reason.NO_MEMORY,
                "service above its memory limit: one at a time",
            )
            return True
        charges = self.view.learned.charged
        if inflight and svc.name in charges and self.view.knobs.switches.pressure_charging:
            fresh = req.wait_reason is not Reason.NO_MEMORY
            self.wait(
                req,
                Reason.NO_MEMORY,
                "uses more than its leases: one at a time",
            )
            if fresh and req.wait_reason is Reason.NO_MEMORY:
                charged = charges[svc.name]
                self.ops.add_explanation(req, f"{svc.name} measured {charged} B above its leases")
            return True
        concurrency = svc.spec.concurrency
        shrink = svc.spec.shrink
        if shrink is not None:
            concurrency = shrink.parallel(svc.batch_fraction, concurrency)
        if len(inflight) >= concurrency and not self.time_sharing.pause_for_first_token(svc, req):
            if not facts.told(req, Reason.CONCURRENCY_LIMIT):
                self.wait(
                    req,
                    Reason.CONCURRENCY_LIMIT,
                    f"{len(inflight)}/{concurrency} running",
                )
            return True
        return False

    def admit(
        self,
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
        self.shrinking.full_estimate(req, svc)
        active = self.view.projected_active(req)
        fit = self.kv_fit(req, svc)
        if fit is None or not self.admission_need(req, svc, active, fit):
            return
        need = fit.need
        knobs = self.view.knobs
        before = fit.before = self.view.ledger.available(dev)
        if outside and before - need < (knobs.spare_fraction * self.view.devices[dev].usable_bytes):
            self.wait(req, Reason.OUTSIDE_WINDOW, "no spare memory")
            return
        if cls is ServiceClass.REALTIME:
            self.ops.note_realtime_activation(svc, active)
        own_cache = fit.own_cache = facts.reusable_cache(self.view, svc, before)
        reserve = 0
        if cls > ServiceClass.REALTIME and not self.reserve.yields_to_realtime(svc):
            held = self.view.ledger.amount(dev, svc.name, Category.RESERVED)
            # beside all its service holds: its KV pool stays while it is loaded, never
            # memory that could be freed for the reserve (generated home-0156)
            reserve = self.reserve.fitting_reserve(
                svc, need, fit.limit - svc.kv_pool, reused=own_cache, stays=held
            )
        fit.running = len(self.view.inflight)
        room_needed = max(0, need - own_cache) + reserve
        if facts.held_back(svc, cls, blocked) and before < room_needed:
            # fair progress (see consider): only idle memory
            self.wait(
                req,
                Reason.HIGHER_CLASS_WAITING,
                # REALTIME is 0 (falsy): its label is left out, as the decision streams pin
                f"{blocked.label if blocked else ''} request waits for memory; "
                "idle memory too small",
            )
            return
        if self.shrinking.shrunk_fits(req, svc, fit, reserve):
            # a shrunk service: the largest batch free memory holds (grown back when
            # room returned), without evicting anyone
            self.start_admitted(req, svc, rnd, fit)
            return
        if not self.room.make_room(dev, room_needed, RoomFor.request(req, svc)):
            if self.shrinking.fit_free(req, svc, fit, reserve, with_full=False):
                self.start_admitted(req, svc, rnd, fit)
                return
            self.no_room(req, svc, rnd, room_needed, reserve, need)
            return
        self.shrinking.grow_full(req, svc, fit)
        self.start_admitted(req, svc, rnd, fit)

    def no_room(
        self,
        req: RequestState,
        svc: ServiceState,
        rnd: Round,
        room_needed: int,
        reserve: int,
        need: int,
    ) -> None:
        """The room ``req`` needs (``room_needed``: its ``need`` and the realtime
        ``reserve``) cannot be made now: its class is blocked on its device when the
        room is reachable, a realtime request is refused when it is not, and ``req``
        waits for memory, told why."""
        dev = svc.spec.device
        cls = req.cls
        if self.room.reachable(dev, room_needed, svc):
            rnd.block(dev, cls)
        elif cls is ServiceClass.REALTIME:
            self.room.refuse(req, dev, room_needed)
            return
        if not facts.told(req, Reason.NO_MEMORY):
            was = req.wait_reason
            self.wait(
                req,
                Reason.NO_MEMORY,
                f"needs {need} B, {self.view.ledger.available(dev)} B available",
            )
            self.reserve.explain_reserve(req, dev, reserve, was)

    def kv_fit(self, req: RequestState, svc: ServiceState) -> Admitting | None:
        """What ``req`` brings: its KV bytes and how much its service's KV pool must grow
        for them; None when its KV does not fit the pool now (it is told why)."""
        profile = svc.spec.profile
        # A paused request brings back its parked KV state, or still holds its place.
        kv = req.parked_kv if req.paused else req.estimate.kv_bytes
        kv_in_use = svc.kv_in_use
        pool = svc.kv_pool
        if svc.resize_support is not ResizeSupport.LIVE and (
            kv_in_use + kv > pool or kv > svc.kv_slot
        ):
            self.loading.kv_pool_fixed(req, svc)
            return None
        if kv_in_use + kv > max(profile.kv_ceiling, pool):
            if not facts.told(req, Reason.CONCURRENCY_LIMIT):
                self.wait(
                    req,
                    Reason.CONCURRENCY_LIMIT,
                    f"KV pool full ({kv_in_use} B of {profile.kv_ceiling} B in use)",
                )
            return None
        resizing = svc.resize_target is not None
        grow = max(0, kv - (svc.kv_usable - kv_in_use))
        if grow and resizing:
            self.wait(
                req,
                Reason.RESIZING,
                "its KV pool is being resized: waits for the answer",
            )
            return None
        if kv and resizing and facts.earlier_waits_for_growth(svc, req):
            # The growth is for an earlier request: a later one must not take its KV.
            self.wait(
                req,
                Reason.RESIZING,
                "an earlier request waits for the pool to grow",
            )
            return None
        return Admitting(kv=kv, grow=grow)

    def admission_need(
        self, req: RequestState, svc: ServiceState, active: int, fit: Admitting
    ) -> bool:
        """Fill in the bytes ``req`` needs on its loaded service, the most its device could
        ever free for it and the activation lease when degraded to what was measured;
        False when it can never fit (it is rejected)."""
        grow = fit.grow
        need = active + grow
        limit = self.room.max_possible(svc.spec.device, svc) - svc.resident_bytes + svc.kv_pool
        lease: int | None = None
        if need > limit:
            observed = svc.calibration.active.project_observed(req.estimate.active_bytes)
            raw = req.estimate.active_bytes
            if observed + grow > limit or not self.view.knobs.switches.degrade_to_raw:
                # Only the estimate against the empty device says it can never run: what
                # was measured, and what kept services hold, refuse it for now, not as
                # too large (what kept services hold may change).
                alone = facts.configured_size(svc, svc.kv_pool + grow, raw)
                too_large = alone > self.view.devices[svc.spec.device].usable_bytes
                self.ops.reject(
                    req,
                    reason=Reason.TOO_LARGE if too_large else Reason.NO_MEMORY,
                    retry_after_s=0.0 if too_large else 60.0,
                    detail=f"needs {need} B ({observed} B as measured so far, {raw} B "
                    "estimated), device can never free that much",
                )
                return False
            # Only the calibration margin does not fit: degrade to the estimate scaled by
            # what was measured (no margin) and let the headroom absorb the difference.
            lease = observed
            need = lease + grow
        fit.need, fit.limit, fit.lease = need, limit, lease
        return True

    def start_admitted(
        self, req: RequestState, svc: ServiceState, rnd: Round, fit: Admitting
    ) -> None:
        """Start ``req``, its room made: grow its service's KV pool first if it must (it
        runs once the backend answers), else dispatch it, saying what made the room
        (``fit.before``: memory free, ``fit.running``: requests in flight, before the room
        was made)."""
        kv, grow = fit.kv, fit.grow
        dev = svc.spec.device
        room = self.view.ledger.available(dev)
        if grow:
            target = min(svc.spec.profile.kv_ceiling, svc.kv_in_use + kv)
            if self.ops.resize(
                svc,
                max(target, svc.kv_pool),
                reason=Reason.BALLOON_GROW,
                detail=f"+{grow} B for {req.request_id}",
            ):
                # The request runs once the backend says the pool is there.
                self.wait(req, Reason.RESIZING, f"KV pool grows by {grow} B")
                return
        if len(self.view.inflight) < fit.running:
            reason = Reason.FITS_AFTER_PREEMPTION
        elif room > fit.before:
            reason = Reason.FITS_AFTER_SHRINK
        else:
            reason = Reason.FITS
        if not self.ops.dispatch(
            req, reason=reason, active_bytes=fit.lease, enforce=fit.own_cache == 0
        ):
            cls = req.cls
            rnd.block(dev, cls)
            self.wait(req, Reason.NO_MEMORY, "lost the race for memory")


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
