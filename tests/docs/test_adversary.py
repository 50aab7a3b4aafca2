"""The adversary's candidates: drawn from its seed alone, every one a valid scenario, and
a finding written as a file ``accelmux simulate`` runs at the losing seed."""

from __future__ import annotations

import json
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


def _lost(index: int, losses: dict[str, float]) -> adversary.Evaluated:
    cand = adversary.Candidate("mixed", index, 0)
    return adversary.Evaluated(
        cand,
        0.0,
        None,
        None,
        index=index,
        losses={c: (v, "static", f"{c}: rejected:too_large") for c, v in losses.items()},
    )


def test_every_losing_class_keeps_its_own_parents() -> None:
    # batch saturates at 100 points in many candidates; interactive loses 3 points once:
    # the interactive loser is still a parent (its niche), not crowded out by batch.
    done = [_lost(i, {"batch": 1.0}) for i in range(20)]
    done.append(_lost(20, {"interactive": 0.03, "batch": 0.5}))
    done.append(_lost(21, {"realtime": 0.0}))  # no loss: no niche
    niches = adversary._niches(done, 4)
    assert sorted(niches) == ["batch", "interactive"]
    assert [e.index for e in niches["interactive"]] == [20]
    assert [e.index for e in niches["batch"]] == [0, 1, 2, 3]  # worst first, then oldest


def test_a_runaway_candidate_is_recorded_as_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    def runaway(candidate: adversary.Candidate, duration_s: float) -> adversary.Evaluated:
        raise MemoryError("burst queued without end")

    monkeypatch.setattr(adversary, "evaluate", runaway)
    limit = resource.getrlimit(resource.RLIMIT_AS)
    try:
        ev = adversary._evaluate_job((adversary.Candidate("mixed", 1, 0), DURATION_S))
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        assert soft != resource.RLIM_INFINITY and soft <= adversary.MEMORY_LIMIT
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limit)
    assert ev.failure == "not run: MemoryError: burst queued without end"
    assert ev.loss == 0.0 and not ev.losses


def test_a_program_error_still_ends_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    def broken(candidate: adversary.Candidate, duration_s: float) -> adversary.Evaluated:
        raise KeyError("services")

    monkeypatch.setattr(adversary, "evaluate", broken)
    limit = resource.getrlimit(resource.RLIMIT_AS)
    try:
        with pytest.raises(KeyError):
            adversary.evaluate_all([adversary.Candidate("mixed", 1, 0)], DURATION_S, 1)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limit)


def test_keep_takes_the_worst_of_each_failure_class_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    regressions = tmp_path / "regressions"
    monkeypatch.setattr(adversary, "REGRESSIONS", regressions)
    rows = []
    for i, (points, failure) in enumerate(
        [(90.0, "batch: x"), (80.0, "batch: x"), (30.0, "interactive: y"), (70.0, "batch: x")]
    ):
        name = f"f{i}.yaml"
        (tmp_path / name).write_text(f"# finding {i}\n", encoding="utf-8")
        rows.append(
            {
                "evaluation": i,
                "scenario": name,
                "seed": 0,
                "class": failure.split(":")[0],
                "baseline": "static",
                "loss_points": points,
                "failure": failure,
                "attainment": {"accelmux": {}, "static": {}},
                "zero_service_s": {},
                "losses_points": {failure.split(":")[0]: points},
                "raw_losses_points": {failure.split(":")[0]: [points, "static"]},
            }
        )
    kept = adversary.keep(rows, tmp_path, 3, search_seed=7)
    assert kept == ["f0.yaml", "f2.yaml", "f1.yaml"]
    record = json.loads((regressions / "losses.json").read_text(encoding="utf-8"))
    assert sorted(record["scenarios"]) == ["f0.yaml", "f1.yaml", "f2.yaml"]
    assert record["scenarios"]["f2.yaml"]["loss_points"] == 30.0
    assert record["scenarios"]["f2.yaml"]["status"] == "open"  # a finding lost > 10 points
    assert (regressions / "f2.yaml").read_text(encoding="utf-8") == "# finding 2\n"


def test_a_candidate_no_configuration_check_passes_is_recorded_as_not_run() -> None:
    """Shrinking the device below a model it hosts (the search's seed 2 drew one) makes a
    home no user could run: recorded as not run, in a pool worker as in this process."""
    shrunk = (("device", (("scale", 0.6),)),) * 4  # 13 % of the card
    job = (adversary.Candidate("mixed", 1, 0, shrunk), DURATION_S)
    for ev in (adversary._evaluate_job(job), *adversary.evaluate_all([job[0]] * 2, DURATION_S, 2)):
        assert ev.failure is not None and ev.failure.startswith("not run: ConfigError")
        assert ev.loss == 0.0 and not ev.losses
