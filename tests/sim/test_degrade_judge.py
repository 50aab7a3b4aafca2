"""The degrade benchmark's judge (bench/bench_degrade.py): against the best baseline per
class, and against the best baseline at no higher class's cost."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_degrade


def _run(label: str, **att: float) -> dict[str, Any]:
    return {
        "kind": "evening-game",
        "home": 6,
        "seed": 0,
        "label": label,
        "classes": {c: {"requests": 10, "slo_attainment": v} for c, v in att.items()},
        "ooms": 0,
        "foreign_starved_share": 0.0,
    }


def _runs(**baselines: dict[str, float]) -> list[dict[str, Any]]:
    ours = {"realtime": 1.0, "interactive": 0.3, "batch": 0.1}
    runs = [_run("accelmux+degrade", **ours), _run("accelmux", **ours)]
    weak = {"realtime": 0.5, "interactive": 0.0, "batch": 0.0}
    for b in bench_degrade.BASELINES:
        runs.append(_run(b, **baselines.get(b, weak)))
    return runs


def test_a_baseline_that_buys_batch_with_interactive_is_left_out_of_the_fair_comparison() -> None:
    # llama-swap: 90% batch by leaving chat at 4%; ollama: as much chat as ours, 12% batch
    runs = _runs(
        **{
            "llama-swap": {"realtime": 1.0, "interactive": 0.04, "batch": 0.9},
            "ollama+containers": {"realtime": 1.0, "interactive": 0.26, "batch": 0.12},
        }
    )
    (row,) = bench_degrade.compare(runs)
    assert row["best_baseline"]["batch"] == "llama-swap"
    assert round(row["minus_best_baseline"]["batch"], 3) == -0.8
    assert row["best_baseline_no_higher_cost"]["batch"] == "ollama+containers"
    assert round(row["minus_best_baseline_no_higher_cost"]["batch"], 3) == -0.02
    t = bench_degrade.targets([row])
    assert not t["batch_within_5_points"]["met"]
    assert t["batch_within_5_points_no_higher_cost"]["met"]


def test_realtime_counts_above_interactive_and_no_fair_baseline_is_counted_apart() -> None:
    # every baseline that beats our chat drops voice requests: none compares fairly
    runs = _runs(**{"static": {"realtime": 0.8, "interactive": 0.6, "batch": 0.0}})
    (row,) = bench_degrade.compare(runs)
    assert row["best_baseline"]["interactive"] == "static"
    assert row["best_baseline_no_higher_cost"]["interactive"] is None
    t = bench_degrade.targets([row])
    fair = t["interactive_within_5_points_no_higher_cost"]
    assert fair["runs"] == 0 and fair["nothing_to_compare"] == 1 and fair["met"]
    assert not t["interactive_within_5_points"]["met"]
