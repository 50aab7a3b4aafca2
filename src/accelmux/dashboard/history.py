"""A bounded history of memory per service, for the dashboard's timeline.

:class:`MemoryHistory` keeps one sample per period (default: one a second) over a window
(default: the last hour) in a ring buffer, so its size never grows past
``window_s / period_s`` samples whatever the uptime. Each sample holds, per service, the
bytes its ledger accounts (weights + runtime + KV + active + reserved) and, per device,
the foreign bytes, the budget and the headroom. It is fed a status dict (the shape of
``Runtime.status()`` / ``Snapshot.as_dict()``), so it reads nothing itself and needs no
clock but the one it is given.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_WINDOW_S = 3600.0
DEFAULT_PERIOD_S = 1.0


@dataclass(frozen=True, slots=True)
class MemorySample:
    t: float
    services: dict[str, int]
    foreign: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {"t": self.t, "services": self.services, "foreign": self.foreign}


class MemoryHistory:
    """The last ``window_s`` seconds of per-service memory, one sample per ``period_s``.

    ``record`` drops a sample that comes sooner than ``period_s * 0.5`` after the last one,
    so two feeders (a timer and the runtime's sampler) cannot double the rate.
    """

    def __init__(
        self,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        period_s: float = DEFAULT_PERIOD_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if window_s <= 0 or period_s <= 0:
            raise ValueError("window_s and period_s must be positive")
        self.window_s = float(window_s)
        self.period_s = float(period_s)
        self.clock = clock
        self.maxlen = math.ceil(window_s / period_s) + 1
        self._samples: deque[MemorySample] = deque(maxlen=self.maxlen)
        self.service_device: dict[str, str] = {}
        self.devices: dict[str, dict[str, int]] = {}

    def __len__(self) -> int:
        return len(self._samples)

    def record(self, status: Mapping[str, Any], at: float | None = None) -> bool:
        """Add one sample taken from ``status``; False when it came too soon."""
        t = self.clock() if at is None else at
        if self._samples and t - self._samples[-1].t < self.period_s * 0.5:
            return False
        services: dict[str, int] = {}
        for svc in status.get("services", []):
            name = str(svc["name"])
            services[name] = int(sum(svc.get("ledger", {}).values()))
            self.service_device[name] = str(svc.get("device", ""))
        foreign: dict[str, int] = {}
        for dev in status.get("devices", []):
            name = str(dev["name"])
            foreign[name] = int(dev.get("foreign_bytes", 0))
            self.devices[name] = {
                "capacity_bytes": int(dev.get("capacity_bytes", 0)),
                "budget_bytes": int(dev.get("budget_bytes", 0)),
                "headroom_bytes": int(dev.get("headroom_bytes", 0)),
            }
        self._samples.append(MemorySample(round(t, 3), services, foreign))
        cutoff = t - self.window_s
        while self._samples and self._samples[0].t < cutoff:
            self._samples.popleft()
        return True

    def samples(self, since: float | None = None) -> list[MemorySample]:
        if since is None:
            return list(self._samples)
        return [s for s in self._samples if s.t > since]

    def as_dict(self, since: float | None = None) -> dict[str, Any]:
        """JSON-ready: the samples after ``since`` (all when None) and what they refer to."""
        return {
            "now": round(self.clock(), 3),
            "window_s": self.window_s,
            "period_s": self.period_s,
            "devices": self.devices,
            "service_device": self.service_device,
            "samples": [s.as_dict() for s in self.samples(since)],
        }
