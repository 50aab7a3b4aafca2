"""The simulator tables: each baseline's best variant by the stated rule; honest percentiles."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_sim  # noqa: E402
import render_sim  # noqa: E402


def _result(realtime: float | None, interactive: float, ooms: float = 0.0) -> dict[str, Any]:
    classes: dict[str, Any] = {"interactive": {"slo_attainment": interactive}}
    if realtime is not None:
        classes["realtime"] = {"slo_attainment": realtime}
    return {"classes": classes, "oom_events": ooms}


def test_best_variant_is_the_highest_mean_then_fewer_ooms_then_the_default() -> None:
    results = {
        "x": _result(0.5, 0.5),
        "x[a=1]": _result(0.9, 0.7),
        "x[a=2]": _result(0.7, 0.9, ooms=3),
        "x[a=3]": _result(0.8, 0.8, ooms=1),
    }
    assert bench_sim.best_variant(results, tuple(results)) == "x[a=1]"  # 0.8, no OOM
    results["x[a=1]"] = _result(0.8, 0.8, ooms=2)
    assert bench_sim.best_variant(results, tuple(results)) == "x[a=3]"  # tie: fewer OOMs
    results = {"x": _result(0.8, 0.8), "x[a=1]": _result(0.8, 0.8)}
    assert bench_sim.best_variant(results, tuple(results)) == "x"  # full tie: the default


def test_score_ignores_a_class_the_scenario_lacks() -> None:
    assert bench_sim.score(_result(None, 0.6)) == 0.6


def test_every_variant_names_a_known_family() -> None:
    for fam, variants in bench_sim.VARIANTS.items():
        assert variants[0] == fam
        assert all(bench_sim.family(v) == fam for v in variants)


def test_p99_is_shown_only_over_enough_samples() -> None:
    few = {
        "classes": {
            "interactive": {"requests": 80, "rejected": 5, "failed": 0, "p50_s": 0.4, "p99_s": 9.0}
        }
    }
    many = {
        "classes": {
            "interactive": {"requests": 300, "rejected": 0, "failed": 0, "p50_s": 0.4, "p99_s": 9.0}
        }
    }
    assert render_sim._latency(few) == ("0.40 (n=75)", "-")
    assert render_sim._latency(many) == ("0.40 (n=300)", "9.00")
