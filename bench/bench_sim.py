"""Regenerate the simulator results: ``bench/results/sim-<scenario>.json``.

Usage::

    .venv/bin/python bench/bench_sim.py                 # all four scenarios, 5 seeds
    .venv/bin/python bench/bench_sim.py --scenarios burst --seeds 2

Each scenario runs accelmux, every baseline and every baseline variant in ``VARIANTS``
(the real systems under their shipped defaults and under the settings a careful user
would choose) for each seed at the scenario's device size. Each family's best variant
is picked by :func:`best_variant`; the device sweep then runs for accelmux, the plain
baselines and each family's best variant only (sweeping every variant would double the
cost of a run). ``bench/render_sim.py`` renders the tables of
docs/benchmarks.md from the JSON (``scripts/gen-docs``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from accelmux.sim.baselines import parse_variant
from accelmux.sim.runner import (
    DEFAULT_POLICIES,
    RunSpec,
    aggregate,
    default_workers,
    meets_target,
    run_many,
    simulate,
)
from accelmux.sim.scenario import load_scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))

from meta import run_meta

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("home-evening", "burst", "small-gpu", "shared-memory-host")
TARGET_CLASSES = ("realtime", "interactive")

#: Each configurable baseline under its defaults and the settings worth trying. The
#: bare name is the default (as the real system ships, with the pinned services kept
#: loaded the way its users do it: keep_alive -1, a persistent llama-swap group).
VARIANTS: dict[str, tuple[str, ...]] = {
    "ollama+containers": (
        "ollama+containers",
        "ollama+containers[max_loaded_models=7]",
        "ollama+containers[max_loaded_models=null]",
        "ollama+containers[num_parallel=4]",
        "ollama+containers[max_loaded_models=null,num_parallel=4]",
        "ollama+containers[pinned_keep_alive=default]",
        "ollama+containers[hosts=all,max_loaded_models=7]",
    ),
    "llama-swap": (
        "llama-swap",
        "llama-swap[layout=no-groups]",
        "llama-swap[ttl=false]",
        "llama-swap[hosts=all]",
    ),
}


def family(policy: str) -> str:
    return parse_variant(policy)[0]


def score(result: dict[str, Any]) -> float:
    """Mean SLO attainment over the realtime and interactive classes a scenario has."""
    vals = [(result["classes"].get(c) or {}).get("slo_attainment") for c in TARGET_CLASSES]
    present = [v for v in vals if v is not None]
    return sum(present) / len(present) if present else 0.0


def best_variant(results: dict[str, Any], variants: tuple[str, ...]) -> str:
    """The rule: highest mean of realtime and interactive attainment, then fewer OOM
    events, then the earlier variant in ``VARIANTS`` (the default first)."""
    ranked = sorted(
        enumerate(variants),
        key=lambda iv: (-round(score(results[iv[1]]), 6), results[iv[1]]["oom_events"], iv[0]),
    )
    return ranked[0][1]


def _sweep(
    path: str, report: dict[str, Any], policies: list[str], seeds: int, workers: int
) -> None:
    """Add each policy's ``device_sweep`` and ``smallest_device_gib`` (main runs reused)."""
    scn = load_scenario(path)
    sim = scn.config.simulation
    base = report["capacity_gib"]
    sizes = sorted(sim.device_sweep_gib)
    n_sweep = min(seeds, sim.sweep_seeds)
    specs = [
        RunSpec(path, p, seed, size)
        for size in sizes
        if abs(size - base) > 1e-6
        for p in policies
        if p != "oracle"
        for seed in range(n_sweep)
    ]
    runs = run_many(specs, workers)
    for p in policies:
        table: dict[str, Any] = {}
        smallest: float | None = None
        for size in sizes:
            if p == "oracle" or abs(size - base) < 1e-6:
                agg = report["results"][p]
            else:
                agg = aggregate(
                    [r for r in runs if r["policy"] == p and abs(r["capacity_gib"] - size) < 1e-6]
                )
            ok = meets_target(agg, report["slo_target"])
            table[f"{size:g}"] = {
                c: (agg["classes"].get(c) or {}).get("slo_attainment") for c in TARGET_CLASSES
            } | {"oom_events": agg["oom_events"], "meets_target": ok}
            if ok and smallest is None:
                smallest = size
        report["results"][p]["device_sweep"] = table
        report["results"][p]["smallest_device_gib"] = smallest
    report["sweep_seeds"] = n_sweep if sizes else 0
    report["sweep_policies"] = policies


def run_scenario(name: str, seeds: int, workers: int) -> dict[str, Any]:
    path = f"scenarios/{name}.yaml"
    policies = [p for p in DEFAULT_POLICIES if p not in VARIANTS]
    every = list(DEFAULT_POLICIES) + [v for vs in VARIANTS.values() for v in vs]
    every = list(dict.fromkeys(every))
    report = simulate(str(ROOT / path), policies=every, seeds=seeds, sweep_gib=[], workers=workers)
    report["source"] = path
    best = {fam: best_variant(report["results"], vs) for fam, vs in VARIANTS.items()}
    report["sensitivity"] = {
        fam: {
            "rule": "highest mean of realtime and interactive attainment, then fewer OOM "
            "events, then the earlier variant (the default first)",
            "best": best[fam],
            "variants": {
                v: {
                    "score": score(report["results"][v]),
                    "oom_events": report["results"][v]["oom_events"],
                }
                for v in vs
            },
        }
        for fam, vs in VARIANTS.items()
    }
    swept = list(dict.fromkeys([*policies, *best.values()]))
    _sweep(str(ROOT / path), report, swept, seeds, workers)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = args.workers or default_workers()
    for name in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
        started = time.perf_counter()
        report = run_scenario(name, args.seeds, workers)
        wall = round(time.perf_counter() - started, 1)
        report["meta"] = run_meta(
            {
                "scenario": name,
                "seeds": args.seeds,
                "workers": workers,
                "variants": VARIANTS,
                "wall_s": wall,
            }
        )
        target = out_dir / f"sim-{name}.json"
        target.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {target} ({wall} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
