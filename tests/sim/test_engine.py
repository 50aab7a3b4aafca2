"""The event heap, the virtual clock, and run determinism."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.sim.support import scenario

from accelmux.errors import InvariantError
from accelmux.sim.engine import EventHeap, SimClock
from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize


def test_events_run_in_time_then_schedule_order() -> None:
    heap = EventHeap()
    seen: list[str] = []
    heap.at(2.0, lambda: seen.append("b"))
    heap.at(1.0, lambda: seen.append("a1"))
    heap.at(1.0, lambda: seen.append("a2"))
    heap.at(3.0, lambda: seen.append("late"))
    heap.run(2.5)
    assert seen == ["a1", "a2", "b"]
    assert heap.clock.now() == 2.5
    assert len(heap) == 1


def test_events_scheduled_while_running_at_the_same_time_run_after() -> None:
    heap = EventHeap()
    seen: list[str] = []

    def first() -> None:
        seen.append("first")
        heap.at(heap.clock.now(), lambda: seen.append("child"))

    heap.at(1.0, first)
    heap.at(1.0, lambda: seen.append("second"))
    heap.run(10.0)
    assert seen == ["first", "second", "child"]


def test_the_past_cannot_be_scheduled_and_the_clock_never_goes_back() -> None:
    heap = EventHeap(SimClock(5.0))
    with pytest.raises(InvariantError):
        heap.at(4.0, lambda: None)
    with pytest.raises(InvariantError):
        heap.clock.advance_to(1.0)


def test_same_seed_gives_identical_decisions_and_report(tmp_path: Path) -> None:
    scn = scenario(tmp_path)
    runs = []
    for _ in range(2):
        sim = Simulation(scn, "accelmux", 7, duration_s=300, record_decisions=True)
        out = sim.run()
        runs.append((sim.decisions, summarize(out)))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]
    assert len(runs[0][0]) > 50


def test_other_seed_gives_another_run(tmp_path: Path) -> None:
    scn = scenario(tmp_path)
    a = Simulation(scn, "accelmux", 1, duration_s=300, record_decisions=True)
    b = Simulation(scn, "accelmux", 2, duration_s=300, record_decisions=True)
    a.run()
    b.run()
    assert a.decisions != b.decisions


def test_all_policies_see_the_same_workload(tmp_path: Path) -> None:
    scn = scenario(tmp_path)
    arrivals = {}
    for policy in ("accelmux", "oracle", "llama-swap"):
        out = Simulation(scn, policy, 3, duration_s=300).run()
        arrivals[policy] = [
            (round(r.arrived_at, 9), r.service, r.demand, r.truth)
            for r in out.requests.values()
            if r.service in ("chat", "image")
        ]
    assert arrivals["accelmux"] == arrivals["oracle"] == arrivals["llama-swap"]
