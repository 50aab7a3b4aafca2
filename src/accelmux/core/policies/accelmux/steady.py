"""The background floor's reserve: memory a load of work ranking below steady services
(batch and other background work, :func:`~accelmux.core.specs.room_rank`) leaves free
for the next frame of each steady service loaded on its device.
"""

from __future__ import annotations

import math

from accelmux.core.policies.accelmux.cache import Miss
from accelmux.core.policies.accelmux.records import Seam
from accelmux.core.specs import room_rank
from accelmux.core.types import ServiceClass
from accelmux.core.world import ServiceState, WorldView

#: The rank of a steady service's batch or background work (:func:`room_rank`).
STEADY_RANK = room_rank(ServiceClass.BACKGROUND, steady=True)


class Steady:
    """The background floor's reserve for the next frames of steady services."""

    def __init__(self, seam: Seam) -> None:
        self.view = seam.view
        self.cache = seam.cache

    def steady_reserve(self, svc: ServiceState, need: int, limit: int) -> int:
        """Memory a load of ``svc`` needing ``need`` bytes must leave free for the next frame
        of each steady service on its device, when ``svc`` ranks below them (``limit``: the
        most its device could ever free for it).

        A steady service's frames may evict idle batch services, never a loading one: a
        batch load into the memory a frame was about to use would cost the frame (and the
        next ones, for as long as the load lasts). A loaded batch service's jobs need not
        leave it: the frame evicts the service once they end. Nothing is kept when ``need``
        and the reserve could never fit together (the load would be kept out for good)."""
        if room_rank(svc.spec.cls, steady=svc.spec.steady) <= STEADY_RANK:
            return 0
        device = svc.spec.device
        version = self.view.version
        reserve = self.cache.steady_reserve.get(device, version)
        if reserve is Miss.MISS:
            reserve = self.cache.steady_reserve.put(
                device, version, _next_frames(self.view, device)
            )
        return 0 if need + reserve > limit else reserve


def _next_frames(view: WorldView, device: str) -> int:
    """The next activation of each steady service holding memory on ``device`` (one
    frame: its workspace and one unit, as calibrated), less what its requests hold now."""
    total = 0
    for s in view.services_by_device[device]:
        if not s.spec.steady or not s.holds_memory:
            continue
        profile = s.spec.profile
        frame = s.calibration.active.project(profile.workspace + math.ceil(profile.per_unit))
        held = sum(r.active_lease.nbytes for r in s.inflight.values() if r.active_lease)
        total += max(0, frame - held)
    return total
