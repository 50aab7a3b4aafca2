"""Per-service activity the daemon measures itself: model switches per hour and cold-start
seconds.

A switch is a load that finished (the service's model was brought in, replacing nothing
or something evicted). The rate is the loads of the last hour divided by the hours
observed in that window (at least a minute, so one load right after start is not a rate
of thousands).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW_S = 3600.0
MIN_WINDOW_S = 60.0


@dataclass(slots=True)
class ServiceActivity:
    started_at: float
    loads: deque[float] = field(default_factory=deque)
    last_cold_start_s: float | None = None
    cold_start_total_s: float = 0.0
    cold_starts: int = 0

    def loaded(self, now: float, seconds: float) -> None:
        self.loads.append(now)
        self.last_cold_start_s = seconds
        self.cold_start_total_s += seconds
        self.cold_starts += 1
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self.loads and self.loads[0] < now - WINDOW_S:
            self.loads.popleft()

    def switches_per_hour(self, now: float) -> float:
        self._trim(now)
        window = min(WINDOW_S, max(MIN_WINDOW_S, now - self.started_at))
        return len(self.loads) * 3600.0 / window

    def as_dict(self, now: float) -> dict[str, float | int | None]:
        mean = self.cold_start_total_s / self.cold_starts if self.cold_starts else None
        return {
            "switches_per_hour": round(self.switches_per_hour(now), 3),
            "cold_start_s_last": (
                round(self.last_cold_start_s, 3) if self.last_cold_start_s is not None else None
            ),
            "cold_start_s_mean": round(mean, 3) if mean is not None else None,
            "measured_loads": self.cold_starts,
        }
