"""The memory peak of each request a shared worker serves, from the process's RSS.

:class:`PeakSampler` samples the process's RSS every :data:`SAMPLE_S` while at least one
request runs; a request's peak is the highest RSS over its running spans, each measured
from the RSS when it began. Two things that move the process's RSS are not the running
requests' own, and are kept out of their peaks:

- a paused request is *suspended*: what other requests allocate while it waits is not
  charged to it;
- a load or an unload of a model (:meth:`PeakSampler.hold` ... :meth:`release`, around
  every lifecycle operation of the worker) allocates or frees a model's weights in the
  same process: the RSS it moves while it runs is taken out of every running request's
  span (a request's own growth in that time goes with it: a request is measured by what
  it holds outside the load, never by another service's weights). Without this a voice
  request that ran while another service's model loaded was measured at that model's
  size, and the Manager learned it as the request's peak.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from accelmux.worker.component_base import rss_bytes

#: RSS sampling period while requests run (their peak = highest sample - RSS at start).
SAMPLE_S = 0.01


class PeakSampler:
    """Tracks the highest RSS of each running request (see the module doc)."""

    def __init__(self, rss: Callable[[], int] = rss_bytes, *, sample_s: float = SAMPLE_S) -> None:
        self._rss = rss
        self._sample_s = sample_s
        self._lock = threading.Lock()
        #: token -> [start, peak, mark]: mark is the RSS when a hold began (or when the
        #: span began during one), None outside a hold
        self._active: dict[int, list[int | None]] = {}
        self._suspended: dict[int, int] = {}  # token -> its highest peak so far
        self._holds = 0
        self._wake = threading.Event()
        self._next = 0
        threading.Thread(target=self._loop, daemon=True, name="rss-sampler").start()

    def begin(self) -> int:
        rss = self._rss()
        with self._lock:
            self._next += 1
            self._active[self._next] = [rss, rss, rss if self._holds else None]
            token = self._next
        self._wake.set()
        return token

    @staticmethod
    def _measured(span: list[int | None], rss: int) -> int:
        """A span's peak above its start, ``rss`` read now (or where a hold began)."""
        start, peak, mark = span
        assert start is not None and peak is not None
        return max(peak, rss if mark is None else mark) - start

    def end(self, token: int) -> int:
        rss = self._rss()
        with self._lock:
            span = self._active.pop(token, None)
            before = self._suspended.pop(token, 0)
        if span is None:
            return before
        return max(before, self._measured(span, rss))

    def suspend(self, token: int) -> None:
        rss = self._rss()
        with self._lock:
            span = self._active.pop(token, None)
            if span is not None:
                self._suspended[token] = max(
                    self._suspended.get(token, 0), self._measured(span, rss)
                )

    def resume(self, token: int) -> None:
        rss = self._rss()
        with self._lock:
            if token in self._suspended and token not in self._active:
                self._active[token] = [rss, rss, rss if self._holds else None]
        self._wake.set()

    def current(self, token: int) -> int:
        with self._lock:
            span = self._active.get(token)
            before = self._suspended.get(token, 0)
            now = 0 if span is None else int(span[1] or 0) - int(span[0] or 0)
        return max(before, now)

    def hold(self) -> None:
        """A load or unload starts: the RSS it moves is not the running requests'."""
        rss = self._rss()
        with self._lock:
            self._holds += 1
            if self._holds == 1:
                for span in self._active.values():
                    span[1] = max(int(span[1] or 0), rss)
                    span[2] = rss

    def release(self) -> None:
        """The load or unload ended: each running span moves by what it moved."""
        rss = self._rss()
        with self._lock:
            self._holds = max(0, self._holds - 1)
            if self._holds:
                return
            for span in self._active.values():
                mark = span[2]
                if mark is not None:
                    moved = rss - mark
                    span[0] = int(span[0] or 0) + moved
                    span[1] = int(span[1] or 0) + moved
                    span[2] = None

    def sample(self) -> None:
        """One sample of the RSS into every running span (none while a load runs)."""
        rss = self._rss()
        with self._lock:
            if self._holds:
                return
            for span in self._active.values():
                span[1] = max(int(span[1] or 0), rss)

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            while True:
                with self._lock:
                    if not self._active:
                        self._wake.clear()
                        break
                self.sample()
                time.sleep(self._sample_s)
