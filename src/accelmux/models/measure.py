"""Measure a process's resident memory: current RSS and the peak over a block of code.

:class:`PeakRss` resets the kernel's high-water mark (``/proc/self/clear_refs``,
Linux) and reads ``VmHWM`` afterwards, which catches short spikes exactly.
Where that is not available it samples RSS from a background thread.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

import psutil

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def rss_bytes() -> int:
    """Resident set size of this process, in bytes."""
    return int(psutil.Process().memory_info().rss)


def _hwm_bytes() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    hwm = _hwm_bytes()
    return hwm is not None and hwm <= rss_bytes() + 4 * 2**20


class PeakRss:
    """Context manager: ``start``, ``peak`` and ``end`` RSS of this process, in bytes.

    >>> with PeakRss() as m:
    ...     work()
    >>> m.peak_delta  # bytes above the RSS at entry
    """

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.start = 0
        self.peak = 0
        self.end = 0
        self.method = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        self.start = rss_bytes()
        self.peak = self.start
        if _reset_hwm():
            self.method = "VmHWM"
        else:
            self.method = "sampled"
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        proc = psutil.Process()
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, int(proc.memory_info().rss))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end = rss_bytes()
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        else:
            self.peak = max(self.peak, _hwm_bytes() or 0)
        self.peak = max(self.peak, self.end)

    @property
    def peak_delta(self) -> int:
        return self.peak - self.start

    @property
    def end_delta(self) -> int:
        return self.end - self.start
