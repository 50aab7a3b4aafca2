"""Starvation: time a class had work waiting that idle memory could hold, and none running.

At every memory sample the simulator asks, per class: does a request of this class wait
whose memory (its raw estimate, plus the service's resident size when it is not loaded)
would fit in the device's idle memory (usable budget minus what is truly in use), while
no request of this class runs on that device? If so the class is *starved* for that
sample period. The report gives, per class, the total starved seconds and the longest
unbroken starved stretch; a policy that gives lower classes fair progress keeps the
stretches short (a realtime chain or a burst may hold them for a few seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from accelmux.core.types import ServiceClass
from accelmux.core.world import RequestState, ServiceState, World


def request_need(svc: ServiceState, req: RequestState) -> int:
    """Bytes the request needs from idle memory: its raw estimate (+ a load when down)."""
    est = req.estimate
    if svc.holds_memory:
        return est.kv_bytes + est.active_bytes
    p = svc.spec.profile
    pool = max(p.kv_floor, min(p.kv_ceiling, est.kv_bytes))  # holds the request's KV
    return p.weights + p.runtime + pool + est.active_bytes


@dataclass(slots=True)
class StarvationTracker:
    """Accumulates starved seconds and the longest starved stretch per class label."""

    total_s: dict[str, float] = field(default_factory=dict)
    longest_s: dict[str, float] = field(default_factory=dict)
    _streak: dict[str, float] = field(default_factory=dict)

    def sample(self, world: World, idle_bytes: dict[str, int], period_s: float) -> None:
        """One sample: ``idle_bytes`` per device (usable budget minus true use, >= 0)."""
        running: set[tuple[str, ServiceClass]] = set()
        for req in world.inflight.values():
            running.add((world.services[req.service].spec.device, req.cls))
        starved: set[str] = set()
        for req in world.waiting.values():
            svc = world.services[req.service]
            dev = svc.spec.device
            if (dev, req.cls) in running or req.cls.label in starved:
                continue
            if request_need(svc, req) <= idle_bytes.get(dev, 0):
                starved.add(req.cls.label)
        for cls in ServiceClass:
            label = cls.label
            if label in starved:
                self.total_s[label] = self.total_s.get(label, 0.0) + period_s
                streak = self._streak.get(label, 0.0) + period_s
                self._streak[label] = streak
                self.longest_s[label] = max(self.longest_s.get(label, 0.0), streak)
            else:
                self._streak[label] = 0.0

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {
            label: {
                "starved_s": round(self.total_s.get(label, 0.0), 3),
                "longest_starved_s": round(self.longest_s.get(label, 0.0), 3),
            }
            for label in (c.label for c in ServiceClass)
        }
