"""Every heuristic of the accelmux policy on a run where turning it off changes something.

The ablation (``bench_suite.py --ablation``) turns each heuristic off on the generated
homes; some of them fire only in situations those homes rarely build (paused streams,
several devices, a request that fits only without its calibration margin). Each one is
given here a run, a shipped scenario or one generated home, where it fires: turned off
there, accelmux decides differently (``tests/sim/test_switch_effects.py`` checks that on
seed 0), and this benchmark measures what that costs, per class, over several seeds::

    python bench/bench_switches.py                  # writes bench/results/switches.json
    python bench/bench_switches.py --seeds 1 --only pause,time_share   # a quick look

A run is a scenario (a file under ``scenarios/``) or a generated home
(``home-NNNN``, kind mixed), with its length in simulated seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import decision_stream
from bench_suite import _mean
from meta import run_meta

from accelmux.core.switches import Switch
from accelmux.sim.executor import RunOutput, Simulation
from accelmux.sim.generate import generate_home
from accelmux.sim.metrics import summarize
from accelmux.sim.scenario import Scenario, load_scenario, load_scenario_data

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "switches.json"
CLASSES = ("realtime", "interactive", "batch", "background")
SEEDS = 3


@dataclass(frozen=True)
class Run:
    """Where a heuristic fires: a shipped scenario (``where`` is its path under
    ``scenarios/``) or a generated home (``where`` is ``home-NNNN``)."""

    where: str
    duration_s: float
    seed: int = 0  # the seed the decision check uses

    def scenario(self) -> Scenario:
        if self.where.endswith(".yaml"):
            return load_scenario(ROOT / "scenarios" / self.where)
        gen = generate_home(int(self.where.removeprefix("home-")), duration_s=self.duration_s)
        return load_scenario_data(gen.data, f"{gen.name}.yaml", ROOT)

    def simulation(self, disable: Switch | None, seed: int) -> Simulation:
        """accelmux on this run, with ``disable`` off (its ``accelmux[disable=[...]]``
        variant)."""
        policy = "accelmux" if disable is None else f"accelmux[disable=[{disable.value}]]"
        return Simulation(self.scenario(), policy, seed, duration_s=self.duration_s)


#: Each heuristic -> a run where turning it off changes what accelmux decides.
RUNS: dict[Switch, Run] = {
    Switch.REALTIME_RESERVE: Run("home-evening.yaml", 600),
    Switch.REALTIME_HOLD: Run("stress/batch-no-window.yaml", 600),
    Switch.BATCH_YIELD: Run("stress/batch-no-window.yaml", 600),
    Switch.PREEMPTION: Run("stress/batch-no-window.yaml", 600),
    Switch.PREEMPTION_BOUND: Run("stress/batch-no-window.yaml", 600),
    Switch.EVICT_AFTER_PREEMPTION: Run("stress/batch-no-window.yaml", 600),
    Switch.BALLOONING: Run("burst.yaml", 600),
    Switch.VICTIM_SCORING: Run("home-0018", 1800),
    Switch.SINGLE_VICTIM: Run("many-llms.yaml", 600),
    Switch.LOWER_CLASS_FIRST: Run("home-0034", 1800),
    Switch.CACHE_REUSE: Run("stress/batch-no-window.yaml", 600),
    Switch.CACHE_ACCOUNTING: Run("stress/batch-no-window.yaml", 600),
    Switch.DEGRADE_TO_RAW: Run("four-gpus.yaml", 1800),
    Switch.CALIBRATION: Run("burst.yaml", 600),
    Switch.FAILURE_CALIBRATION: Run("stress/load-and-request-2x.yaml", 600),
    Switch.PRESSURE_CHARGING: Run("home-0002", 1800, seed=1),
    Switch.FAIR_PROGRESS: Run("stress/batch-no-window.yaml", 600),
    Switch.ON_DEMAND_KEEP: Run("home-0000", 1800),
    Switch.IDLE_KEEP: Run("burst.yaml", 600),
    Switch.RESTORE: Run("stress/batch-no-window.yaml", 600),
    Switch.PREWARM: Run("burst.yaml", 600),
    Switch.PAUSE: Run("many-llms.yaml", 600),
    Switch.TIME_SHARE: Run("many-llms.yaml", 1800),
    Switch.FIRST_TOKEN_PAUSE: Run("many-llms.yaml", 600),
    Switch.REALTIME_YIELD: Run("many-llms.yaml", 600),
    Switch.RESERVE_FALLBACK: Run("home-0008", 1800),
    Switch.RESERVE_LENDING: Run("stress/batch-no-window.yaml", 600),
    Switch.SERIAL_LOADS: Run("home-0002", 1800),
    Switch.PLACEMENT: Run("four-gpus.yaml", 600),
    Switch.PARK_WEIGHTS: Run("many-llms.yaml", 600),
    Switch.REALTIME_UNPIN: Run("regressions/adv-0591-evening-game-220276-s3-realtime.yaml", 1200),
}


def _recorded(run: Run, disable: Switch | None, seed: int) -> tuple[RunOutput, str]:
    """The output of one simulation of ``run`` and the digest of its decision stream
    (``bench/decision_stream.py``)."""
    sim = run.simulation(disable, seed)
    lines: list[str] = []
    decision_stream._record(sim.manager, lines)
    out = sim.run()
    return out, decision_stream.digest(lines)


def decision_digest(run: Run, disable: Switch | None, seed: int | None = None) -> str:
    """The digest of the decision stream of ``run``."""
    return _recorded(run, disable, run.seed if seed is None else seed)[1]


def _measure(job: tuple[Switch, Switch | None, int]) -> dict[str, Any]:
    switch, disable, seed = job
    out, digest = _recorded(RUNS[switch], disable, seed)
    summary = summarize(out)
    return {
        "classes": {
            c: v["slo_attainment"]
            for c, v in summary["classes"].items()
            if v["requests"] and v["slo_attainment"] is not None
        },
        "oom_events": summary["oom_events"],
        "preemptions": summary["preemptions"],
        "digest": digest,
    }


def _compare(on: list[dict[str, Any]], off: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "seeds_changed": sum(a["digest"] != b["digest"] for a, b in zip(on, off, strict=True))
    }
    for cls in CLASSES:
        a = _mean([r["classes"][cls] for r in on if cls in r["classes"]])
        b = _mean([r["classes"][cls] for r in off if cls in r["classes"]])
        row[cls] = {"on": a, "off": b, "delta": None if a is None or b is None else b - a}
    for key in ("oom_events", "preemptions"):
        a, b = _mean([r[key] for r in on]), _mean([r[key] for r in off])
        row[key] = {"on": a, "off": b}
    return row


def measure(switches: list[Switch], seeds: int, workers: int) -> dict[str, Any]:
    jobs = [(s, d, seed) for s in switches for d in (None, s) for seed in range(seeds)]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = dict(zip(jobs, pool.map(_measure, jobs), strict=True))
    out: dict[str, Any] = {}
    for s in switches:
        run = RUNS[s]
        row = _compare(
            [results[(s, None, seed)] for seed in range(seeds)],
            [results[(s, s, seed)] for seed in range(seeds)],
        )
        out[s.value] = {"where": run.where, "duration_s": run.duration_s, **row}
    return {"wall_s": time.perf_counter() - started, "switches": out}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=SEEDS)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", default="", help="comma-separated heuristics (default all)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    try:
        chosen = [Switch(s) for s in args.only.split(",") if s] or list(RUNS)
    except ValueError as exc:
        print(f"bench_switches: {exc}", file=sys.stderr)
        return 2
    report = measure(chosen, args.seeds, args.workers)
    report = {"meta": run_meta({"seeds": args.seeds, "only": args.only or None}), **report}
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    for name, row in report["switches"].items():
        deltas = ", ".join(
            f"{c} {row[c]['delta'] * 100:+.1f}" for c in CLASSES if row[c]["delta"] is not None
        )
        print(f"{name:24} {row['where']:32} changed {row['seeds_changed']}/{args.seeds}  {deltas}")
    print(f"wrote {args.out} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
