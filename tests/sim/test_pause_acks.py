"""The simulator acknowledges every pause at the moment it takes, and draws which LLM
requests their backend could not pause (tools, structured output) by seed."""

from __future__ import annotations

import dataclasses
from typing import Any

from accelmux.core.actions import Pause
from accelmux.core.events import PauseFinished, RequestArrived
from accelmux.sim.executor import Simulation
from accelmux.sim.scenario import Scenario, load_scenario

from .support import SCENARIOS


def many_llms(unpausable: float = 0.0) -> Scenario:
    scn = load_scenario(SCENARIOS / "many-llms.yaml")
    if not unpausable:
        return scn
    services = {
        name: perf.model_copy(update={"unpausable_share": unpausable})
        for name, perf in scn.config.simulation.services.items()
    }
    sim_cfg = scn.config.simulation.model_copy(update={"services": services})
    return dataclasses.replace(scn, config=scn.config.model_copy(update={"simulation": sim_cfg}))


def recorded(scn: Scenario, seed: int = 0, duration_s: float = 900.0) -> list[tuple[float, Any]]:
    sim = Simulation(scn, "accelmux", seed, duration_s=duration_s)
    seen: list[tuple[float, Any]] = []
    handle = sim.manager.handle

    def recording(event: Any, now: float) -> Any:
        out = handle(event, now)
        seen.append((now, event))
        seen.extend((now, a) for a in out)
        return out

    sim.manager.handle = recording  # type: ignore[method-assign]
    sim.run()
    return seen


def test_every_simulated_pause_is_acknowledged_at_the_same_virtual_time() -> None:
    seen = recorded(many_llms())
    pauses = [(t, a) for t, a in seen if isinstance(a, Pause)]
    acks = {(t, e.request_id, e.attempt) for t, e in seen if isinstance(e, PauseFinished)}
    assert pauses, "the scenario pauses streams"
    for t, p in pauses:
        assert (t, p.request_id, p.attempt) in acks


def test_requests_their_backend_cannot_pause_are_drawn_by_seed_and_never_paused() -> None:
    scn = many_llms(unpausable=0.5)
    first = recorded(scn, duration_s=600.0)
    arrivals = [e for _, e in first if isinstance(e, RequestArrived)]
    llm = {"chat", "coder", "quick"}
    drawn = [e.pausable for e in arrivals if e.service in llm]
    assert drawn and 0.25 < drawn.count(False) / len(drawn) < 0.75
    unpausable = {e.request_id for e in arrivals if e.service in llm and not e.pausable}
    assert not [a for _, a in first if isinstance(a, Pause) and a.request_id in unpausable]
    again = recorded(scn, duration_s=600.0)
    assert [e for _, e in again if isinstance(e, RequestArrived)] == arrivals
