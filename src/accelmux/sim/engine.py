"""The discrete-event engine: a heap keyed ``(time, seq)`` and a virtual clock.

The sequence number makes ordering total and deterministic: two events at the same
time run in the order they were scheduled (as in SimPy's ``core.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from accelmux.errors import InvariantError

#: A heap entry: (time, sequence number, callback). Plain tuples compare in C; the
#: sequence number is unique, so the callback itself is never compared.
_Entry = tuple[float, int, Callable[[], None]]


class SimClock:
    """A virtual clock; only the engine moves it, never backwards."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise InvariantError(f"simulated time went backwards: {t} < {self._now}")
        self._now = t


class EventHeap:
    """Callbacks scheduled at virtual times."""

    def __init__(self, clock: SimClock | None = None) -> None:
        self.clock = clock or SimClock()
        self._heap: list[_Entry] = []
        self._seq = 0
        self.processed = 0

    def __len__(self) -> int:
        return len(self._heap)

    def at(self, t: float, fn: Callable[[], None]) -> None:
        if t < self.clock.now():
            raise InvariantError(f"scheduled in the past: {t} < {self.clock.now()}")
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn))

    def peek_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run(self, until: float) -> None:
        """Run every event with time <= ``until``, then move the clock to ``until``."""
        heap = self._heap
        pop = heapq.heappop
        clock = self.clock
        while heap and heap[0][0] <= until:
            t, _, fn = pop(heap)
            clock.advance_to(t)
            self.processed += 1
            fn()
        self.clock.advance_to(max(self.clock.now(), until))
