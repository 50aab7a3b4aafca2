"""Run a scenario for several policies, seeds and device sizes; aggregate the reports.

Runs are independent, so they go to a process pool when more than one worker is
allowed. Aggregates are means over seeds, with the spread (min/max) beside them.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize
from accelmux.sim.scenario import Scenario, load_scenario

DEFAULT_POLICIES = (
    "accelmux",
    "independent",
    "static",
    "ollama+containers",
    "llama-swap",
    "oracle",
)
TARGET_CLASSES = ("realtime", "interactive")


@dataclass(frozen=True, slots=True)
class RunSpec:
    scenario_path: str
    policy: str
    seed: int
    capacity_gib: float | None = None
    duration_s: float | None = None
    trace_path: str | None = None


def run_one(spec: RunSpec, scenario: Scenario | None = None) -> dict[str, Any]:
    scn = scenario or load_scenario(spec.scenario_path)
    sim = Simulation(
        scn,
        spec.policy,
        spec.seed,
        capacity_gib=spec.capacity_gib,
        duration_s=spec.duration_s,
        trace_path=spec.trace_path,
    )
    return summarize(sim.run())


def run_many(specs: list[RunSpec], workers: int) -> list[dict[str, Any]]:
    if workers <= 1 or len(specs) <= 1:
        cache: dict[str, Scenario] = {}
        out = []
        for s in specs:
            scn = cache.setdefault(s.scenario_path, load_scenario(s.scenario_path))
            out.append(run_one(s, scn))
        return out
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_one, specs, chunksize=1))


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _spread(values: list[float | None]) -> dict[str, float | None]:
    vals = [v for v in values if v is not None]
    return {"min": min(vals) if vals else None, "max": max(vals) if vals else None}


def _mean_tree(items: list[Any]) -> Any:
    """Average dicts of numbers key by key (None and missing values are skipped)."""
    present = [x for x in items if x is not None]
    if not present:
        return None
    first = present[0]
    if isinstance(first, bool):
        return _mean([float(x) for x in present])
    if isinstance(first, int | float):
        return _mean([float(x) for x in present if isinstance(x, int | float)])
    if isinstance(first, dict):
        keys: list[str] = []
        for d in present:
            for k in d:
                if k not in keys:
                    keys.append(k)
        return {k: _mean_tree([d.get(k) for d in present if isinstance(d, dict)]) for k in keys}
    return first


def _mean_counts(items: list[dict[str, Any]]) -> dict[str, float]:
    """Average counters over runs; a reason a run did not see counts as 0 there."""
    keys = sorted({k for d in items for k in d})
    return {k: sum(float(d.get(k, 0)) for d in items) / len(items) for k in keys}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the seeds of one policy, with spread of the headline figures."""
    classes = sorted({c for r in runs for c in r["classes"]})
    agg: dict[str, Any] = {
        "seeds": [r["seed"] for r in runs],
        "capacity_gib": runs[0]["capacity_gib"],
        "oom_events": _mean([r["oom_events"] for r in runs]),
        "oom_broken_requests": _mean([r["oom_broken_requests"] for r in runs]),
        "classes": {c: _mean_tree([r["classes"].get(c) for r in runs]) for c in classes},
        "batch_done_in_window": _mean([r["batch_done_in_window"] for r in runs]),
        "preemptions": _mean([r["preemptions"] for r in runs]),
        "max_preemptions_per_request": max(r["max_preemptions_per_request"] for r in runs),
        "pauses": _mean([r["pauses"] for r in runs]),
        "max_pauses_per_request": max(r["max_pauses_per_request"] for r in runs),
        "starvation": _mean_tree([r["starvation"] for r in runs]) or {},
        "longest_starved_s": max(
            (v["longest_starved_s"] for r in runs for v in r["starvation"].values()), default=0.0
        ),
        "cold_starts": _mean([r["cold_starts"] for r in runs]),
        "thrash": _mean([r["thrash"] for r in runs]),
        "loads": _mean([r["loads"] for r in runs]),
        "evictions": _mean([r["evictions"] for r in runs]),
        "rejections": _mean_counts([r["rejections"] for r in runs]),
        "failures": _mean_counts([r["failures"] for r in runs]),
        "chains": _mean_tree([r["chains"] for r in runs]) or {},
        "services": _mean_tree([r["services"] for r in runs]) or {},
        "memory": _mean_tree([r["memory"] for r in runs]) or {},
        "spread": {
            "oom_events": _spread([r["oom_events"] for r in runs]),
            "batch_done_in_window": _spread([r["batch_done_in_window"] for r in runs]),
            "classes": {
                c: _spread([r["classes"].get(c, {}).get("slo_attainment") for r in runs])
                for c in classes
            },
        },
        "per_seed": [
            {
                "seed": r["seed"],
                "oom_events": r["oom_events"],
                "batch_done_in_window": r["batch_done_in_window"],
                "max_preemptions_per_request": r["max_preemptions_per_request"],
                "slo_attainment": {c: v["slo_attainment"] for c, v in sorted(r["classes"].items())},
                "ooms": r["ooms"][:5],
            }
            for r in runs
        ],
    }
    for name, svc in agg["services"].items():
        svc["outcomes"] = _mean_counts([r["services"][name]["outcomes"] for r in runs])
    return agg


def meets_target(agg: dict[str, Any], target: float) -> bool:
    for cls in TARGET_CLASSES:
        att = (agg["classes"].get(cls) or {}).get("slo_attainment")
        if att is not None and att < target:
            return False
    return True


def simulate(
    scenario_path: str,
    *,
    policies: list[str] | None = None,
    seeds: int | None = None,
    sweep_gib: list[float] | None = None,
    sweep_seeds: int | None = None,
    duration_s: float | None = None,
    trace_path: str | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """The whole comparison: main runs at the scenario's size, then the device sweep."""
    scn = load_scenario(scenario_path)
    sim = scn.config.simulation
    names = list(policies or DEFAULT_POLICIES)
    n_seeds = seeds or sim.seeds
    sweep = sorted(sweep_gib if sweep_gib is not None else sim.device_sweep_gib)
    n_sweep = min(n_seeds, sweep_seeds or sim.sweep_seeds)
    base = scn.capacity_gib()
    specs = [
        RunSpec(scenario_path, p, seed, None, duration_s, trace_path)
        for p in names
        for seed in range(n_seeds)
    ]
    # The oracle has infinite memory (no sweep needed); the scenario's own size reuses
    # the main runs with every seed.
    sweep_specs = [
        RunSpec(scenario_path, p, seed, size, duration_s, trace_path)
        for size in sweep
        if abs(size - base) > 1e-6
        for p in names
        if p != "oracle"
        for seed in range(n_sweep)
    ]
    results = run_many(specs + sweep_specs, workers or default_workers())
    main_runs = results[: len(specs)]
    sweep_runs = results[len(specs) :]
    out: dict[str, Any] = {}
    for p in names:
        out[p] = aggregate([r for r in main_runs if r["policy"] == p])
    target = sim.slo_target
    for p in names:
        table: dict[str, Any] = {}
        smallest: float | None = None
        for size in sweep:
            if p == "oracle" or abs(size - base) < 1e-6:
                runs = [r for r in main_runs if r["policy"] == p]
            else:
                runs = [
                    r
                    for r in sweep_runs
                    if r["policy"] == p and abs(r["capacity_gib"] - size) < 1e-6
                ]
            if not runs:
                continue
            agg = aggregate(runs)
            ok = meets_target(agg, target)
            table[f"{size:g}"] = {
                cls: (agg["classes"].get(cls) or {}).get("slo_attainment") for cls in TARGET_CLASSES
            } | {"oom_events": agg["oom_events"], "meets_target": ok}
            if ok and smallest is None:
                smallest = size
        out[p]["device_sweep"] = table
        out[p]["smallest_device_gib"] = smallest
    return {
        "scenario": scn.name,
        "source": scenario_path,
        "capacity_gib": base,
        "duration_s": duration_s or sim.duration_s,
        "seeds": n_seeds,
        "sweep_seeds": n_sweep if sweep else 0,
        "slo_target": target,
        "estimate_error": sim.error.model_dump(),
        "results": out,
    }
