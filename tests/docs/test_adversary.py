"""The adversary's candidates: drawn from its seed alone, every one a valid scenario, and
a finding written as a file ``accelmux simulate`` runs at the losing seed."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import adversary

from accelmux.sim.scenario import load_scenario, load_scenario_data

DURATION_S = 600.0


def _draw(seed: int, n: int) -> list[adversary.Candidate]:
    rng = random.Random(f"accelmux-adversary:{seed}")
    first = [adversary.random_candidate(rng, DURATION_S) for _ in range(n)]
    return first + [adversary.mutate(rng, c, DURATION_S) for c in first]


def test_the_candidates_come_from_the_seed_alone() -> None:
    assert _draw(3, 6) == _draw(3, 6)
    assert _draw(3, 6) != _draw(4, 6)


def test_every_candidate_is_a_scenario_the_simulator_accepts() -> None:
    kinds = set()
    for cand in _draw(11, 25):
        for change in cand.changes:
            kinds.add(change[0])
        data = adversary.apply(cand, DURATION_S)
        if data is None:
            continue
        scn = load_scenario_data(data, "candidate.yaml", adversary.ROOT)
        assert scn.config.simulation.seeds == cand.seed + 1
    assert len(kinds) >= 5  # the draws reach most kinds of change


def test_a_changed_service_carries_its_own_estimate_error() -> None:
    cand = adversary.Candidate("mixed", 123_456, 0)
    data = adversary.apply(cand, DURATION_S)
    assert data is not None
    name = next(iter(data["services"]))
    biased = adversary.Candidate(
        "mixed",
        123_456,
        0,
        (("bias", (("request_bias", 2.5), ("resident_bias", 1.5), ("service", name))),),
    )
    changed = adversary.apply(biased, DURATION_S)
    assert changed is not None
    perf = load_scenario_data(changed, "x.yaml", adversary.ROOT).config.simulation.services
    assert perf[name].request_bias == 2.5 and perf[name].resident_bias == 1.5


@pytest.mark.slow
def test_a_finding_is_a_file_the_simulator_runs(tmp_path: Path) -> None:
    cand = adversary.Candidate(
        "evening-game",
        791_005,
        1,
        (("oom", (("at_s", 200.0), ("duration_s", 10.0), ("share", 0.9))),),
    )
    ev = adversary.evaluate(cand, DURATION_S)
    assert set(ev.per_policy) == set(adversary.POLICIES)
    ev.cls, ev.baseline = ev.cls or "realtime", ev.baseline or "static"
    path = tmp_path / "finding.yaml"
    path.write_text(adversary.scenario_text(ev, DURATION_S, 1), encoding="utf-8")
    scn = load_scenario(path)
    assert scn.config.simulation.seeds == 2  # seeds 0 and 1: the losing seed is run
    assert "oom-injection" in {f.name for f in scn.config.simulation.foreign}
