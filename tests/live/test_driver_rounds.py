"""The rounds the driver tells its observers (the request history): kept and told later,
in order, none lost; told at once without ``later``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from accelmux.core.actions import Action
from accelmux.core.events import Event
from accelmux.core.manager import Manager
from accelmux.core.policies import make_policy
from accelmux.runtime.clock import ManualClock
from accelmux.runtime.driver import Driver
from accelmux.sim import parity

SCENARIO = str(Path(__file__).resolve().parents[2] / "scenarios" / "burst.yaml")


class Rounds:
    def __init__(self) -> None:
        self.seen: list[tuple[float, Event | None, tuple[Action, ...]]] = []

    def round(self, now: float, event: Event | None, actions: Sequence[Action]) -> None:
        self.seen.append((now, event, tuple(actions)))


def _drive(pending: list[Callable[[], None]] | None) -> tuple[Driver, Rounds, int]:
    """The burst scenario's events through a driver whose ``later`` keeps its calls in
    ``pending`` (run now and then, as the loop's turn comes); None: no ``later``."""
    spec, events = parity.event_log(SCENARIO, 7, duration_s=120.0)
    clock = ManualClock()
    later = None if pending is None else pending.append
    driver = Driver(Manager(spec, make_policy("accelmux")), clock, lambda a: None, later=later)
    rounds = Rounds()
    driver.observers.append(rounds)
    driver.start()
    told_at_start = len(rounds.seen)
    for i, (t, event) in enumerate(events):
        clock.advance(t)
        driver.submit(event)
        if pending is not None and i % 7 == 6:
            calls = list(pending)
            pending.clear()
            for call in calls:
                call()
    return driver, rounds, told_at_start


def test_rounds_told_later_are_the_rounds_told_at_once_in_order() -> None:
    _, at_once, _ = _drive(None)
    pending: list[Callable[[], None]] = []
    driver, later, told_at_start = _drive(pending)
    assert told_at_start == 1  # the Manager's first round is told at once
    assert len(later.seen) < len(at_once.seen)  # some are still kept
    assert len(pending) == 1  # one call of ``later`` for all the rounds kept since
    driver.tell_rounds()  # what an observer's owner does before removing it
    assert later.seen == at_once.seen
    assert len(at_once.seen) > 300
    pending[0]()  # the loop's turn comes after all: nothing is told twice
    assert later.seen == at_once.seen
