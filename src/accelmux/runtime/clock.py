"""Clocks for the driver: the live loop clock and a manual clock for tests and parity."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the clock's origin (the Manager's time)."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` once the clock reads ``when`` or later."""
        ...


class LoopClock:
    """``time.monotonic()`` minus the start time; timers on the running asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._origin = time.monotonic()
        self._loop = loop

    def now(self) -> float:
        return time.monotonic() - self._origin

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        loop = self._loop or asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - self.now()), callback)


def seconds_of_day_now() -> float:
    """Local time of day in seconds (the Manager's clock origin for windows)."""
    t = time.localtime()
    return float(t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec)


@dataclass(order=True)
class _Timer:
    when: float
    seq: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to; timers run in (time, sequence) order."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[_Timer] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        timer = _Timer(when, next(self._seq), callback)
        heapq.heappush(self._timers, timer)
        return timer

    def next_timer(self) -> float | None:
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0].when if self._timers else None

    async def sleep(self, delay: float) -> None:
        """Wait until the clock has moved ``delay`` further (for clock-injected fakes)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        self.call_at(self._now + max(0.0, delay), wake)
        await future

    def step(self) -> bool:
        """Fire the next timer alone (moving the clock to it); False when none is left."""
        if self.next_timer() is None:
            return False
        timer = heapq.heappop(self._timers)
        self._now = max(self._now, timer.when)
        timer.callback()
        return True

    def advance(self, to: float) -> None:
        """Move to ``to``, firing every due timer at its own time on the way."""
        while True:
            nxt = self.next_timer()
            if nxt is None or nxt > to:
                break
            timer = heapq.heappop(self._timers)
            self._now = max(self._now, timer.when)
            timer.callback()
        self._now = max(self._now, to)
