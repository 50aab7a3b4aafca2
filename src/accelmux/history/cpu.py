"""The compute the host's processes used between two memory samples (psutil).

On a host device (a shared-memory accelerator, or the CPU itself) the services compete
for the same cores as every other program, so the history keeps, per sample, the
fraction of the machine's cores that were busy since the sample before: in the managed
services' processes (the inference workers, external servers and their children) and
in all processes. The simulator replays the difference as foreign compute, and the
calibration reads from the first how much of the device one request of each service
uses (:mod:`accelmux.plan.calibrate`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

import psutil


def _busy_s() -> float:
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    return float(sum(t)) - idle


class CpuProbe:
    """Called once per sample of a host device: (managed, total) fractions of the cores
    busy since the last call (None, None for the first call and for other devices)."""

    def __init__(
        self,
        pids: Callable[[], Iterable[int]],
        host_devices: Iterable[str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pids = pids
        self._hosts = set(host_devices)
        self._clock = clock
        self._cores = psutil.cpu_count() or os.cpu_count() or 1
        self._last: tuple[float, float, dict[int, float]] | None = None

    def _managed(self) -> dict[int, float]:
        """CPU seconds of each managed process and its children, by pid."""
        out: dict[int, float] = {}
        for pid in set(self._pids()):
            try:
                root = psutil.Process(pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in procs:
                try:
                    t = proc.cpu_times()
                except psutil.Error:
                    continue
                out[proc.pid] = float(t.user + t.system)
        return out

    def __call__(self, device: str) -> tuple[float | None, float | None]:
        if device not in self._hosts:
            return None, None
        now, busy, managed = self._clock(), _busy_s(), self._managed()
        last, self._last = self._last, (now, busy, managed)
        if last is None or now - last[0] <= 0:
            return None, None
        span = (now - last[0]) * self._cores
        # a process seen for the first time counts from now on (its past is not this span's)
        used = sum(max(0.0, s - last[2][pid]) for pid, s in managed.items() if pid in last[2])
        total = max(0.0, busy - last[1])
        return round(min(1.0, used / span), 4), round(min(1.0, total / span), 4)
