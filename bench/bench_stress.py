"""Every policy on the stress scenarios: ``bench/results/stress.json``.

Usage::

    .venv/bin/python bench/bench_stress.py              # every scenarios/stress/*.yaml, 5 seeds
    .venv/bin/python bench/bench_stress.py --scenarios bias-2x --seeds 2

Each stress scenario (``scenarios/stress/``, one class of failure each: estimates 2x
wrong, one noisy estimate, a batch job with no window, bursty chat, foreign processes
mid-burst, loads and requests both 2x wrong) runs accelmux and every baseline at its
scenario's device size for each seed. The JSON records, per scenario and policy, the
mean SLO attainment per class, the OOM events per run, the most OOMs of one service in
one run, the most preemptions of one request (a livelock shows as a large count),
starvation, and the batch work done; and every (scenario, seed) run's figures per class
(``run_rows``), from which bench/worst_case.py reads the worst case: per class the
worst run, the share of runs below 90 %, accelmux minus the best baseline of each run
(judged as the adversary judges it, and against any baseline) and the longest stretch
without service. ``bench/render_stress.py`` renders the table of
docs/benchmarks.md (``scripts/gen-docs``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from accelmux.sim.runner import DEFAULT_POLICIES, RunSpec, aggregate, default_workers, run_many

sys.path.insert(0, str(Path(__file__).resolve().parent))

import worst_case
from meta import run_meta

ROOT = Path(__file__).resolve().parents[1]
STRESS = ROOT / "scenarios" / "stress"
CLASSES = ("realtime", "interactive", "batch", "background")


def reduce(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One policy on one scenario over its seeds."""
    agg = aggregate(runs)
    worst_service = 0
    for r in runs:
        for svc in r["services"].values():
            worst_service = max(worst_service, int(svc["ooms"]))
    return {
        "classes": {
            c: (agg["classes"].get(c) or {}).get("slo_attainment")
            for c in CLASSES
            if c in agg["classes"]
        },
        "requests": {c: (agg["classes"].get(c) or {}).get("requests") for c in agg["classes"]},
        "oom_events": agg["oom_events"],
        "max_ooms_per_service": worst_service,
        "max_preemptions_per_request": agg["max_preemptions_per_request"],
        "starved_s": sum(float(v.get("starved_s") or 0.0) for v in agg["starvation"].values()),
        "longest_starved_s": agg["longest_starved_s"],
        "batch_done_in_window": agg["batch_done_in_window"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenarios", help="comma-separated names (default: every one)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "stress.json"))
    args = parser.parse_args()
    names = (
        args.scenarios.split(",")
        if args.scenarios
        else sorted(p.stem for p in STRESS.glob("*.yaml"))
    )
    workers = args.workers or default_workers()
    started = time.perf_counter()
    specs = [
        RunSpec(str(STRESS / f"{name}.yaml"), policy, seed)
        for name in names
        for policy in DEFAULT_POLICIES
        for seed in range(args.seeds)
    ]
    runs = run_many(specs, workers)
    scenarios: dict[str, Any] = {}
    for name in names:
        path = str(STRESS / f"{name}.yaml")
        mine = [r for s, r in zip(specs, runs, strict=True) if s.scenario_path == path]
        scenarios[name] = {
            "source": f"scenarios/stress/{name}.yaml",
            "policies": {
                p: reduce([r for r in mine if r["policy"] == p]) for p in DEFAULT_POLICIES
            },
        }
    rows = [
        worst_case.run_row(
            name,
            seed,
            {
                s.policy: r
                for s, r in zip(specs, runs, strict=True)
                if s.scenario_path == str(STRESS / f"{name}.yaml") and s.seed == seed
            },
        )
        for name in names
        for seed in range(args.seeds)
    ]
    out = {
        "meta": run_meta({"seeds": args.seeds, "workers": workers, "scenarios": names}),
        "wall_s": round(time.perf_counter() - started, 1),
        "runs": len(runs),
        "scenarios": scenarios,
        "run_rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(runs)} runs in {out['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
