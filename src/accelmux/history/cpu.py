"""How much the host's processes wanted the CPU between two memory samples.

On a host device (a shared-memory accelerator, or the CPU itself) the services compete
for the same cores as every other program. Linux shares the cores fairly between the
threads that can run: with ``N`` runnable threads on ``C`` cores each gets ``C / N`` of
a core when ``N > C``. So what slows a request down is not how busy the cores are (a
saturated machine reads 100 % whether 3 or 30 threads wait) but how many threads want
them. The probe keeps, per sample:

- ``run_managed`` and ``run_total``: the mean number of runnable threads in the managed
  services' processes (the inference workers, external servers and their children) and
  on the whole machine, read from ``/proc`` :data:`RATE_HZ` times a second by a thread of
  its own (``procs_running`` in ``/proc/stat``; each managed thread's state), and each
  count with its time (``ticks``): the calibration reads what one request of a service
  keeps runnable from the counts taken while it ran alone;
- ``cpu_managed`` and ``cpu_total``: the fraction of the cores they used (CPU time).

A call (on the daemon's event loop, at each memory sample) reads only a few small
files: the thread also finds the managed processes (a scan of every process) every
:data:`PID_REFRESH_TICKS` counts.

The calibration reads from the first how many threads one request of each service
keeps runnable (its share of the device), and the simulator replays the rest of the
machine's runnable threads as foreign compute (:mod:`accelmux.plan.calibrate`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

#: How often the runnable threads are counted (per second). A count reads one small file
#: per thread of the managed processes: about 1 ms for a worker of 40 threads here, so
#: 0.5 % of a core at this rate.
RATE_HZ = 5.0
#: The managed processes are looked for again every this many counts (it scans them all).
PID_REFRESH_TICKS = 10


@dataclass(frozen=True, slots=True)
class CpuFigures:
    """One span's figures (None where not measured)."""

    cpu_managed: float | None = None
    cpu_total: float | None = None
    run_managed: float | None = None
    run_total: float | None = None
    #: Each count of the span: ``T:M:N`` (T the time on the probe's clock, in ms, M the
    #: managed runnable threads, N the machine's), ``;``-separated.
    ticks: str | None = None


def parse_ticks(text: str | None) -> list[tuple[float, int, int]]:
    """The counts of :attr:`CpuFigures.ticks`: (time in seconds, managed, all)."""
    out: list[tuple[float, int, int]] = []
    for item in (text or "").split(";"):
        parts = item.split(":")
        if len(parts) == 3:
            out.append((int(parts[0]) / 1000.0, int(parts[1]), int(parts[2])))
    return out


def _busy_s() -> float:
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    return float(sum(t)) - idle


def procs_running() -> int | None:
    """Runnable threads on the machine now (``procs_running``), None when unknown."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("procs_running"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def runnable_threads(pids: Iterable[int]) -> int:
    """Threads of ``pids`` that are runnable now (state ``R``)."""
    count = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, IndexError):
                    stat = (task / "stat").read_text(encoding="ascii", errors="replace")
                    if stat[stat.rindex(")") + 2] == "R":
                        count += 1
    return count


class CpuProbe:
    """Called once per sample of a host device: that span's :class:`CpuFigures` (all
    None for the first call, and for other devices). ``close()`` stops its thread."""

    def __init__(
        self,
        roots: Callable[[], Iterable[int]],
        host_devices: Iterable[str],
        *,
        clock: Callable[[], float] = time.monotonic,
        rate_hz: float = RATE_HZ,
    ) -> None:
        self._roots = roots
        self._hosts = set(host_devices)
        self._clock = clock
        self._cores = psutil.cpu_count() or os.cpu_count() or 1
        self._last: tuple[float, float, dict[int, float]] | None = None
        self._pids: list[int] = self._find_pids() if self._hosts else []
        self._lock = threading.Lock()
        self._ticks: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self._hosts and procs_running() is not None:
            self._thread = threading.Thread(
                target=self._count, args=(1.0 / rate_hz,), name="history-cpu", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)

    def _count(self, period: float) -> None:
        ticks = 0
        while not self._stop.wait(period):
            if ticks % PID_REFRESH_TICKS == 0:  # finding the processes scans them all
                pids = self._find_pids()
                with self._lock:
                    self._pids = pids
            ticks += 1
            total = procs_running()
            with self._lock:
                pids = list(self._pids)
            managed = runnable_threads(pids)
            if total is None:
                continue
            total = max(managed, total - 1)  # not this thread, reading
            stamp = round(self._clock() * 1000)
            with self._lock:
                self._ticks.append(f"{stamp}:{managed}:{total}")

    def _find_pids(self) -> list[int]:
        """The managed processes and their children (a scan of every process)."""
        out: list[int] = []
        for pid in set(self._roots()):
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(pid)
                out += [root.pid, *(c.pid for c in root.children(recursive=True))]
        return out

    def _managed(self) -> dict[int, float]:
        """CPU seconds of each managed process (as last found), by pid."""
        with self._lock:
            pids = list(self._pids)
        if self._thread is None:  # no counting thread: find them here
            pids = self._find_pids()
        out: dict[int, float] = {}
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(pid).cpu_times()
                out[pid] = float(t.user + t.system)
        return out

    def _runnable(self) -> tuple[float | None, float | None, str | None]:
        """The span's mean runnable threads (managed, all) and its counts."""
        with self._lock:
            ticks, self._ticks = self._ticks, []
        if not ticks:
            return None, None, None
        text = ";".join(ticks)
        counts = parse_ticks(text)
        n = len(counts)
        return (
            round(sum(c[1] for c in counts) / n, 3),
            round(sum(c[2] for c in counts) / n, 3),
            text,
        )

    def __call__(self, device: str) -> CpuFigures:
        if device not in self._hosts:
            return CpuFigures()
        now, busy, managed = self._clock(), _busy_s(), self._managed()
        run_managed, run_total, ticks = self._runnable()
        last, self._last = self._last, (now, busy, managed)
        if last is None or now - last[0] <= 0:
            return CpuFigures()
        span = (now - last[0]) * self._cores
        # a process seen for the first time counts from now on (its past is not this span's)
        used = sum(max(0.0, s - last[2][pid]) for pid, s in managed.items() if pid in last[2])
        total = max(0.0, busy - last[1])
        return CpuFigures(
            cpu_managed=round(min(1.0, used / span), 4),
            cpu_total=round(min(1.0, total / span), 4),
            run_managed=run_managed,
            run_total=run_total,
            ticks=ticks,
        )
