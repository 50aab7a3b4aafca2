"""scripts/gate's verdicts: a class mean more than 1 point or a run more than 5 points
below the committed one fails; less passes (bench/gate.py)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import gate

COMMITTED = {
    "home-0000 s0": {"realtime": 1.0, "interactive": 0.80},
    "home-0000 s1": {"realtime": 1.0, "interactive": 0.90},
}


def test_the_same_runs_pass() -> None:
    assert gate.compare_runs("suite", COMMITTED, COMMITTED)["passed"]


def test_small_drops_pass() -> None:
    now = {
        "home-0000 s0": {"realtime": 0.995, "interactive": 0.80},
        "home-0000 s1": {"realtime": 1.0, "interactive": 0.89},
    }
    assert gate.compare_runs("suite", COMMITTED, now)["passed"]


def test_one_run_six_points_down_fails_though_the_mean_holds() -> None:
    now = {
        "home-0000 s0": {"realtime": 1.0, "interactive": 0.86},
        "home-0000 s1": {"realtime": 1.0, "interactive": 0.84},
    }
    result = gate.compare_runs("suite", COMMITTED, now)
    assert not result["passed"]
    assert result["problems"] == ["interactive in home-0000 s1: 90.0% -> 84.0%"]


def test_a_mean_two_points_down_fails() -> None:
    now = {
        "home-0000 s0": {"realtime": 0.98, "interactive": 0.80},
        "home-0000 s1": {"realtime": 0.98, "interactive": 0.90},
    }
    result = gate.compare_runs("suite", COMMITTED, now)
    assert result["problems"] == ["realtime mean 100.0% -> 98.0%"]


def test_a_run_that_did_not_run_fails() -> None:
    now = {"home-0000 s0": COMMITTED["home-0000 s0"]}
    assert not gate.compare_runs("suite", COMMITTED, now)["passed"]


def test_a_voice_ratio_worse_beyond_both_intervals_fails() -> None:
    def stack(lo: float, hi: float, cams: float) -> dict[str, object]:
        return {
            "protection": {
                "accelmux": {
                    "intervals": {"ratio_p50": [lo, hi], "ratio_p95": [lo, hi]},
                    "camera": {"share_of_nominal_outside_chains": cams},
                }
            }
        }

    assert gate.stack_voice_verdict(stack(1.0, 1.2, 0.9), stack(1.1, 1.3, 0.88)) == []
    problems = gate.stack_voice_verdict(stack(1.0, 1.2, 0.9), stack(1.25, 1.4, 0.8))
    assert len(problems) == 3


def _degrade_gate(monkeypatch: Any, change: Any) -> dict[str, Any]:
    """The gate's degrade part, its runs replaced by the committed ones passed through
    ``change`` (no simulation: what is judged is the verdict)."""
    import bench_degrade

    committed = {
        (r["kind"], r["home"], r["seed"], r["label"]): r
        for r in gate._load(gate.RESULTS / "degrade.json")["runs"]
    }

    def replayed(job: Any) -> dict[str, Any]:
        return change(copy.deepcopy(committed[(job.kind, job.home, job.seed, job.label)]))

    monkeypatch.setattr(bench_degrade, "run_job", replayed)
    return gate._degrade_part(workers=1)


def test_the_degrade_homes_pass_as_committed(monkeypatch: Any) -> None:
    result = _degrade_gate(monkeypatch, lambda run: run)
    assert result["passed"] and result["means"]["realtime"]["runs"] > 0


def test_one_more_out_of_memory_error_in_a_degrade_run_fails(monkeypatch: Any) -> None:
    def one_more(run: dict[str, Any]) -> dict[str, Any]:
        if (run["kind"], run["home"], run["seed"], run["label"]) == (
            "evening-game",
            6,
            0,
            "accelmux+degrade",
        ):
            run["ooms"] += 1
        return run

    result = _degrade_gate(monkeypatch, one_more)
    assert not result["passed"]
    assert result["problems"] == [
        "out-of-memory errors in evening-game-0006 s0 accelmux+degrade: 1 -> 2"
    ]
