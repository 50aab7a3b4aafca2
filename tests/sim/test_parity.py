"""The parity hook: the simulator's event log replays to the same decisions."""

from __future__ import annotations

from pathlib import Path

from tests.sim.support import scenario

from accelmux.sim.parity import decision_log, event_log, replay


def test_replaying_the_event_log_reproduces_the_decision_log(tmp_path: Path) -> None:
    scn = scenario(tmp_path)
    decisions = decision_log(scn, 4, duration_s=200)
    spec, events = event_log(scn, 4, duration_s=200)
    assert len(decisions) > 20
    assert replay(spec, "accelmux", events) == decisions


def test_decision_log_is_deterministic_and_json_ready(tmp_path: Path) -> None:
    scn = scenario(tmp_path)
    first = decision_log(scn, 5, policy="ollama+containers", duration_s=200)
    second = decision_log(scn, 5, policy="ollama+containers", duration_s=200)
    assert first == second
    row = first[0]
    assert {"t", "action", "service", "reason"} <= set(row)
    assert all(isinstance(v, str | int | float) for v in row.values())
