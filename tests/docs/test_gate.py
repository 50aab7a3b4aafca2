"""scripts/gate's verdicts: a class mean more than 1 point or a run more than 5 points
below the committed one fails; less passes (bench/gate.py)."""

from __future__ import annotations

import sys
from pathlib import Path

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
