"""The Manager loop, with an injected clock and executor.

``submit(event)`` reads the clock, lets the Manager decide, hands every action to the
executor and re-arms one timer for the Manager's next wakeup (deadlines, TTLs, windows,
backoffs), which submits a ``Tick``. Events submitted while actions execute (an executor
that completes something synchronously) are queued and handled right after, in order, so
the Manager is never re-entered. The live daemon uses :class:`~.clock.LoopClock`; tests
and the parity check use :class:`~.clock.ManualClock`. After each round, the invariant
reports a non-strict Manager made (:class:`~accelmux.core.manager.InvariantBroken`) go
to ``report``: never an exception in whoever submitted the event.

Observers (:class:`RoundObserver`, the request history) see every round, in order: the
event and the actions. The Manager's first round is told at once; the others are kept
and told together through ``later`` (the live daemon: :func:`soon_on_loop`, the event
loop's next turn), so that recording them is off the path of the request that caused
them: its dispatch runs, its answer goes out, then the rounds are recorded, none lost
(:meth:`Driver.tell_rounds` tells what is still kept, before an observer is removed).
Without ``later`` each round is told as soon as its actions ran. An observer that
raises is logged and dropped, never the round.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from accelmux.core.actions import Action
from accelmux.core.events import Event, Tick
from accelmux.core.manager import InvariantBroken, Manager
from accelmux.runtime.clock import Clock, TimerHandle

log = logging.getLogger("accelmux.runtime")

#: Timers fire this much after the wakeup the Manager asked for, so "now" is past it.
WAKE_EPSILON_S = 1e-4


class RoundObserver(Protocol):
    """Sees each Manager round: its event (None for the Manager's start) and actions."""

    def round(self, now: float, event: Event | None, actions: Sequence[Action]) -> None: ...


def soon_on_loop(callback: Callable[[], None]) -> None:
    """Run ``callback`` at the running event loop's next turn (now when none runs)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        callback()
        return
    loop.call_soon(callback)


class Driver:
    def __init__(
        self,
        manager: Manager,
        clock: Clock,
        execute: Callable[[Action], None],
        observe: Callable[[float, Action], None] | None = None,
        report: Callable[[InvariantBroken], None] | None = None,
        *,
        later: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.manager = manager
        self.clock = clock
        self.execute = execute
        self.observe = observe
        self.report = report
        self._pending: deque[Event] = deque()
        self._busy = False
        self._timer: TimerHandle | None = None
        self._timer_at: float | None = None
        self._wake_at: float | None = None
        self.closed = False
        self.observers: list[RoundObserver] = []
        #: How the kept rounds are told (None: at once, see the module's docstring).
        self.later = later
        #: Rounds not yet told to the observers, oldest first.
        self._untold: list[tuple[float, Event | None, list[Action]]] = []
        #: Whether ``later`` was asked to tell them and has not yet.
        self._telling = False

    def start(self) -> None:
        now = self.clock.now()
        actions = self.manager.start(now)
        self._tell(now, None, actions)
        self._run(actions, now)
        self._rearm(now)

    def submit(self, event: Event) -> None:
        if self.closed:
            return
        self._pending.append(event)
        if self._busy:
            return
        self._busy = True
        try:
            while self._pending:
                ev = self._pending.popleft()
                now = self.clock.now()
                actions = self.manager.handle(ev, now)
                if self.observers:
                    self._untold.append((now, ev, actions))
                self._run(actions, now)
            self._rearm(self.clock.now())
        finally:
            self._busy = False
        if self._untold and not self._telling:
            if self.later is None:
                self.tell_rounds()
            else:
                self._telling = True
                self.later(self.tell_rounds)

    def tell_rounds(self) -> None:
        """Tell the observers every round kept, oldest first."""
        self._telling = False
        while self._untold:
            rounds, self._untold = self._untold, []
            for now, event, actions in rounds:
                self._tell(now, event, actions)

    def _tell(self, now: float, event: Event | None, actions: list[Action]) -> None:
        for observer in list(self.observers):
            try:
                observer.round(now, event, actions)
            except Exception:
                log.exception("a round observer failed; it is dropped")
                self.observers.remove(observer)

    def _run(self, actions: list[Action], now: float) -> None:
        observe = self.observe
        for action in actions:
            if observe is not None:
                observe(now, action)
            self.execute(action)
        if self.report is not None:
            for broken in self.manager.take_broken():
                self.report(broken)

    def _rearm(self, now: float) -> None:
        """Keep one timer at (or before) the Manager's next wakeup.

        A wakeup that moved later keeps the armed timer: when it fires early it only
        re-arms (no Tick), which spares a cancel and a new timer on every request.
        """
        wake = self.manager.next_wakeup(now)
        self._wake_at = wake
        if wake is None:
            return  # an armed timer will find nothing to do
        target = wake + WAKE_EPSILON_S
        if self._timer is not None and self._timer_at is not None and self._timer_at <= target:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = target
        self._timer = self.clock.call_at(target, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._timer_at = None
        wake = self._wake_at
        if wake is None or self.closed:
            return
        target = wake + WAKE_EPSILON_S
        if self.clock.now() < target:  # fired for an earlier wakeup that moved later
            self._timer_at = target
            self._timer = self.clock.call_at(target, self._tick)
            return
        self._wake_at = None
        self.submit(Tick())

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
