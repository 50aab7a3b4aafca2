"""Stopping running work for higher-class work: which services' requests may be stopped
(:func:`preemptible`), the preemption and pause bounds, and the stop itself (a pause that
parks the request's KV when its backend can, else a preemption).
"""

from __future__ import annotations

from accelmux.core.policies.accelmux import facts
from accelmux.core.policies.accelmux.records import Seam
from accelmux.core.policies.accelmux.time_sharing import TimeSharing
from accelmux.core.types import Reason, ServiceClass
from accelmux.core.world import RequestState


class Preemption:
    """Stopping running work to make room (whether it may be stopped is in ``facts``)."""

    def __init__(self, seam: Seam, time_sharing: TimeSharing) -> None:
        self.view = seam.view
        self.ops = seam.ops
        self.time_sharing = time_sharing

    def stop(
        self,
        req: RequestState,
        cls: ServiceClass,
        requester: RequestState | None,
    ) -> None:
        """Stop a running request to make room: pause and park it when its backend can,
        else preempt it (it starts again later)."""
        svc = self.view.services[req.service]
        if req.pausing is not None:
            return  # its pause is under way: its memory comes back with the answer
        if facts.can_pause(self.view, svc):
            why = requester.request_id if requester is not None else f"class {cls.label}"
            if self.ops.pause(req, reason=Reason.TIME_SHARE, park=True, detail=f"room for {why}"):
                if requester is not None:
                    self.time_sharing.note_yield(req, requester)
                return
        self.ops.preempt(
            req, reason=Reason.PREEMPTED_FOR_HIGHER_CLASS, detail=f"room for class {cls.label}"
        )
