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
    """The highest reading of ``measure`` during each request, above its start."""

    def __init__(self, measure: Callable[[], int | None], interval_s: float = PEAK_SAMPLE_S):
        self._measure = measure
        self._interval = interval_s
        self._lock = threading.Lock()
        self._spans: dict[int, list[int]] = {}  # token -> [start, peak]
        self._next = 0
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def _read(self) -> int:
        try:
            return self._measure() or 0
        except Exception:  # a vanished process: no reading, never a crash
            return 0

    def begin(self) -> int:
        now = self._read()
        with self._lock:
            self._next += 1
            self._spans[self._next] = [now, now]
            token = self._next
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="peak")
                self._thread.start()
        self._wake.set()
        return token

    def end(self, token: int) -> int:
        """Bytes the tree grew by at most while the request ran."""
        now = self._read()
        with self._lock:
            start, peak = self._spans.pop(token, [0, 0])
        return max(0, max(peak, now) - start)

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
                    for span in self._spans.values():
                        span[1] = max(span[1], reading)
                time.sleep(self._interval)
