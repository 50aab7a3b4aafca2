"""Memory of a separate server's process tree, and the peak of each request on it.

On a host-memory device a tree's bytes are the PSS of its processes (psutil; RSS where
PSS is unreadable). On an NVIDIA device they are NVML's per-process used GPU memory of
the tree's pids. :class:`PeakTracker` samples the tree on a thread while requests run and
gives each request the growth above what the tree held when it started.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from accelmux.monitors.nvidia import NvmlUnavailable, nvml_open, nvml_process_memory
from accelmux.monitors.process import tree_memory, tree_pids

#: Seconds between two samples of a tree while requests run.
PEAK_SAMPLE_S = 0.05


class ProcessTreeMeter:
    """Measures one process tree on the service's device (blocking; call off the loop)."""

    def __init__(self, gpu_index: int | None) -> None:
        self.gpu_index = gpu_index
        self.error: str | None = None
        self._nvml: tuple[object, object] | None = None
        if gpu_index is not None:
            try:
                self._nvml = nvml_open(gpu_index)
            except NvmlUnavailable as exc:
                self.error = str(exc)

    @property
    def source(self) -> str:
        return "nvml" if self.gpu_index is not None else "pss"

    def measure(self, root_pid: int) -> int | None:
        if self.gpu_index is None:
            return tree_memory(root_pid) if tree_pids(root_pid) else None
        if self._nvml is None:
            return None
        per_pid = nvml_process_memory(*self._nvml)
        return sum(per_pid.get(pid, 0) for pid in tree_pids(root_pid))


class PeakTracker:
    """The highest reading of ``measure`` during each request, above its start.

    Only the sampling thread measures (a tree's PSS reads every process's smaps: far too
    slow for the event loop): a request starts from the latest reading and its peak is the
    highest reading while it runs. A request that starts before the tree was ever read
    takes the thread's first reading as its start; one that ends before any reading
    reports no growth (a request shorter than the sampling interval is not seen).
    :meth:`seed` gives it the reading a load took, so that a first request has a start.
    """

    def __init__(self, measure: Callable[[], int | None], interval_s: float = PEAK_SAMPLE_S):
        self._measure = measure
        self._interval = interval_s
        self._lock = threading.Lock()
        self._spans: dict[int, list[int | None]] = {}  # token -> [start, peak]
        self._last: int | None = None
        self._next = 0
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def _read(self) -> int | None:
        try:
            return self._measure()
        except Exception:  # a vanished process: no reading, never a crash
            return None

    def seed(self, reading: int | None) -> None:
        """A reading taken elsewhere (the load's own measurement of the tree): a request
        that starts before the sampling thread has read the tree starts from it, instead
        of from the thread's first reading, which a busy machine may delay until the
        request has already grown the tree."""
        if reading is None:
            return
        with self._lock:
            self._last = reading

    def begin(self) -> int:
        with self._lock:
            self._next += 1
            self._spans[self._next] = [self._last, self._last]
            token = self._next
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="peak")
                self._thread.start()
        self._wake.set()
        return token

    def end(self, token: int) -> int:
        """Bytes the tree grew by at most while the request ran (0 when never read)."""
        with self._lock:
            start, peak = self._spans.pop(token, [None, None])
        if start is None or peak is None:
            return 0
        return max(0, peak - start)

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait()
            while not self._closed:
                with self._lock:
                    if not self._spans:
                        self._wake.clear()
                        break
                reading = self._read()
                with self._lock:
                    if reading is not None:
                        self._last = reading
                        for span in self._spans.values():
                            span[0] = reading if span[0] is None else span[0]
                            span[1] = reading if span[1] is None else max(span[1], reading)
                time.sleep(self._interval)
