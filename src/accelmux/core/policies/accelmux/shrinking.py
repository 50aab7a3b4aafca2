"""Shrinking: the batch a request of a service that may shrink runs with
(:mod:`accelmux.core.shrink`).

A request of such a service is admitted as any other, at its full batch, while the
service runs its full batch. When the room for it cannot be made without evicting a
higher class or stopping work (:meth:`Room.make_room` fails), it runs at the largest
smaller batch whose activation memory fits in **free memory** now (``batch_shrunk``),
instead of waiting. While its service runs shrunk, each of its requests first tries the
largest batch free memory holds, the full one included (``batch_grown``): growing back
never evicts anyone. A shrunk service also runs fewer requests at once
(:meth:`BatchShrink.parallel`, in :meth:`Admission.one_at_a_time`).
"""

from __future__ import annotations

from accelmux.core.policies.accelmux.records import Admitting, Seam
from accelmux.core.shrink import FULL, scaled_demand
from accelmux.core.types import Reason
from accelmux.core.world import RequestState, ServiceState

_MIB = 1 << 20


class Shrinking:
    """Chooses the batch of a request of a service that may shrink."""

    def __init__(self, seam: Seam) -> None:
        self.view = seam.view
        self.ops = seam.ops

    def full_estimate(self, req: RequestState, svc: ServiceState) -> None:
        """Admission sizes ``req`` at its full batch first (a request put back in its
        queue may still carry a smaller batch's estimate)."""
        if req.batch_fraction != FULL and not req.paused:
            self.ops.size_at_full_batch(req, svc)

    def active_at(self, req: RequestState, svc: ServiceState, fraction: float) -> int:
        """The activation lease of one batch of ``fraction`` of ``req``'s units."""
        est = self.view.estimate(svc.name, scaled_demand(req.demand, fraction))
        return svc.calibration.project_active(est)

    def shrunk_fits(
        self, req: RequestState, svc: ServiceState, fit: Admitting, reserve: int
    ) -> bool:
        """:meth:`fit_free` with the full batch too, for a service that runs shrunk now
        (False, nothing changed, for one that runs its full batch)."""
        return svc.batch_fraction < FULL and self.fit_free(req, svc, fit, reserve, with_full=True)

    def fit_free(
        self,
        req: RequestState,
        svc: ServiceState,
        fit: Admitting,
        reserve: int,
        *,
        with_full: bool,
    ) -> bool:
        """Set ``req`` to run at the largest batch (the full one only when ``with_full``)
        whose lease fits in free memory now, less the realtime reserve ``reserve``; True
        when one does (``fit`` then holds its lease and need), False otherwise (nothing
        changes)."""
        shrink = svc.spec.shrink
        if shrink is None or fit.lease is not None or req.paused:
            return False
        free = fit.before
        full_need = fit.need
        for fraction in shrink.fractions():
            if fraction >= FULL and not with_full:
                continue
            active = self.active_at(req, svc, fraction)
            need = active + fit.grow
            if max(0, need - fit.own_cache) + reserve > free:
                continue
            if fraction == svc.batch_fraction:
                detail = ""
            else:
                detail = (
                    f"batch {fraction:g} of full: {full_need // _MIB} MiB at the full batch, "
                    f"{need // _MIB} MiB at this one, {max(0, free) // _MIB} MiB free"
                )
            reason = Reason.BATCH_GROWN if fraction > svc.batch_fraction else Reason.BATCH_SHRUNK
            self.ops.rebatch(req, svc, fraction, reason=reason, detail=detail)
            fit.lease, fit.need = active, need
            return True
        return False

    def grow_full(self, req: RequestState, svc: ServiceState, fit: Admitting) -> None:
        """``req`` runs at the full batch, its room made as for any request: a shrunk
        service grows back (``batch_grown``)."""
        if svc.spec.shrink is None or svc.batch_fraction >= FULL:
            return
        self.ops.rebatch(
            req,
            svc,
            FULL,
            reason=Reason.BATCH_GROWN,
            detail=f"batch 1 of full: {fit.need // _MIB} MiB, room made",
        )
