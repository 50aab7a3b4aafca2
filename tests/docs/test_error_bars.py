"""The error bars ``accelmux plan`` prints are the sim-to-real benchmark's, from its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import render_bench  # noqa: E402
import render_sim_real  # noqa: E402

from accelmux.plan.engine import error_bars  # noqa: E402


def test_the_shipped_error_bars_are_those_of_the_committed_benchmark() -> None:
    report = render_bench.load("sim_real")
    assert error_bars() == json.loads(json.dumps(render_sim_real.error_bars(report))), (
        "src/accelmux/plan/error_bars.json is out of step with bench/results/sim_real.json: "
        "python bench/bench_sim_real.py report ... writes both"
    )


def test_the_error_bars_are_the_largest_error_of_either_workload_rounded_up() -> None:
    def side(p95: float | None, att: float) -> dict:
        return {"error": {"p50_rel": 0.01, "p95_rel": p95, "attainment_pts": att}}

    report = {
        "meta": {"commit": "abc"},
        "workloads": {
            "calibration": {
                "result": {
                    "classes": {"realtime": side(0.052, -1.2)},
                    "memory": {"host": {"peak_rel": -0.021}},
                }
            },
            "unseen": {
                "result": {
                    "classes": {"realtime": side(-0.131, 0.4), "batch": side(None, 0.0)},
                    "memory": {"host": {"peak_rel": 0.034}},
                }
            },
        },
    }
    bars = render_sim_real.error_bars(report)
    assert bars["classes"]["realtime"] == {"p50_pct": 1, "p95_pct": 14, "attainment_pts": 2}
    assert "p95_pct" not in bars["classes"]["batch"]
    assert bars["memory_peak_pct"] == 4
