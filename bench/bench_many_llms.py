"""Many LLMs on one device: ``bench/results/many_llms.json``.

Usage::

    .venv/bin/python bench/bench_many_llms.py                 # scenario, sweep and 40 homes
    .venv/bin/python bench/bench_many_llms.py --homes 10 --seeds 2

Three parts, every one in the simulator:

1. ``scenarios/many-llms.yaml`` (three chat models of 3B-8B and the voice chain on a
   12 GiB GPU) at its own size, 5 seeds, for accelmux, accelmux with whole-model
   swapping only (``accelmux[disable=[time_share,park_weights]]``: no switch of models
   between tokens, no parked weights; streams still pause for voice and for a first
   token of their own model), the baselines and the oracle;
2. the same policies on a sweep of device sizes: the smallest device where realtime and
   interactive both reach 99%;
3. generated homes (``accelmux.sim.generate``) with two or more LLMs, each LLM hosted in
   accelmux's worker (it declares pause, park and host_cache) and the host's page cache
   modelled for every policy: per home, interactive attainment of accelmux with and
   without time sharing and of the best baseline.

``bench/render_many_llms.py`` renders the tables of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from accelmux.sim.generate import generate_home
from accelmux.sim.runner import RunSpec, aggregate, default_workers, run_many, simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))

from meta import run_meta

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SCENARIO = ROOT / "scenarios" / "many-llms.yaml"
WHOLE = "accelmux[disable=[time_share,park_weights]]"
POLICIES = [
    "accelmux",
    WHOLE,
    "ollama+containers",
    "llama-swap",
    "static",
    "independent",
    "oracle",
]
HOME_POLICIES = ["accelmux", WHOLE, "ollama+containers", "llama-swap", "oracle"]
SWEEP_GIB = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0, 20.0, 22.0, 24.0]
LLM_SERVICES = ("voice-llm", "chat", "coder", "quick")
#: Host RAM a generated home's page cache may use for model files (a 32 GiB host).
HOME_PAGE_CACHE = "16GiB"
#: Start-up of a reload by the worker from host RAM (its process and CUDA context stay).
HOME_WARM_INIT_S = 0.3


def _scenario_part(seeds: int, sweep_seeds: int, workers: int) -> dict[str, Any]:
    out = simulate(
        str(SCENARIO),
        policies=POLICIES,
        seeds=seeds,
        sweep_gib=SWEEP_GIB,
        sweep_seeds=sweep_seeds,
        workers=workers,
    )
    policies: dict[str, Any] = {}
    for name, r in out["results"].items():
        policies[name] = {
            "classes": {c: v.get("slo_attainment") for c, v in r["classes"].items()},
            "services": {
                s: {
                    "slo_attainment": v.get("slo_attainment"),
                    "p99_s": v.get("p99_s"),
                    "requests": v.get("requests"),
                    "cold_starts": v.get("cold_starts"),
                }
                for s, v in r["services"].items()
                if s in LLM_SERVICES
            },
            "oom_events": r["oom_events"],
            "cold_starts": r["cold_starts"],
            "pauses": r["pauses"],
            "max_pauses_per_request": r["max_pauses_per_request"],
            "max_preemptions_per_request": r["max_preemptions_per_request"],
            "failures": r["failures"],
            "smallest_device_gib": r.get("smallest_device_gib"),
            "device_sweep": r.get("device_sweep"),
        }
    return {
        "source": "scenarios/many-llms.yaml",
        "capacity_gib": out["capacity_gib"],
        "seeds": out["seeds"],
        "sweep_seeds": out["sweep_seeds"],
        "slo_target": out["slo_target"],
        "policies": policies,
    }


def hosted_in_worker(data: dict[str, Any]) -> dict[str, Any] | None:
    """A generated home with two or more LLMs, each in accelmux's worker (pause, park,
    host_cache declared) and the host's page cache modelled; None for fewer LLMs."""
    services = data["services"]
    llms = [n for n, s in services.items() if s["kind"] in ("chat", "completion")]
    if len(llms) < 2:
        return None
    for name in llms:
        services[name]["backend"] = {"type": "worker"}
        perf = data["simulation"]["services"].setdefault(name, {})
        perf["warm_init_s"] = HOME_WARM_INIT_S
    data["simulation"]["page_cache"] = HOME_PAGE_CACHE
    return data


def _homes_part(
    count: int, first_seed: int, seeds: int, workers: int, work_dir: Path
) -> dict[str, Any]:
    paths: list[tuple[str, Path, int]] = []
    seed = first_seed
    while len(paths) < count and seed < first_seed + 50 * count:
        home = generate_home(seed)
        data = hosted_in_worker(home.data)
        seed += 1
        if data is None:
            continue
        path = work_dir / f"{home.name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        llms = sum(1 for s in data["services"].values() if s["kind"] in ("chat", "completion"))
        paths.append((home.name, path, llms))
    specs = [
        RunSpec(str(path), policy, s)
        for _, path, _ in paths
        for policy in HOME_POLICIES
        for s in range(seeds)
    ]
    runs = run_many(specs, workers)
    homes: list[dict[str, Any]] = []
    for name, path, llms in paths:
        row: dict[str, Any] = {"home": name, "llms": llms, "policies": {}}
        for policy in HOME_POLICIES:
            mine = [
                r
                for s, r in zip(specs, runs, strict=True)
                if s.scenario_path == str(path) and s.policy == policy
            ]
            agg = aggregate(mine)
            row["policies"][policy] = {
                c: (agg["classes"].get(c) or {}).get("slo_attainment")
                for c in ("realtime", "interactive")
            } | {
                "oom_events": agg["oom_events"],
                "max_pauses_per_request": agg["max_pauses_per_request"],
                "cold_starts": agg["cold_starts"],
            }
        homes.append(row)
    return {"count": len(homes), "seeds": seeds, "first_seed": first_seed, "homes": homes}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--sweep-seeds", type=int, default=3)
    parser.add_argument("--homes", type=int, default=40)
    parser.add_argument("--home-seeds", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--out", default=str(RESULTS / "many_llms.json"))
    args = parser.parse_args()
    workers = args.workers or default_workers()
    started = time.perf_counter()
    scenario = _scenario_part(args.seeds, args.sweep_seeds, workers)
    with tempfile.TemporaryDirectory() as tmp:
        homes = _homes_part(args.homes, args.first_seed, args.home_seeds, workers, Path(tmp))
    out = {
        "meta": run_meta(
            {
                "seeds": args.seeds,
                "sweep_seeds": args.sweep_seeds,
                "homes": args.homes,
                "home_seeds": args.home_seeds,
                "first_seed": args.first_seed,
                "workers": workers,
            }
        ),
        "wall_s": round(time.perf_counter() - started, 1),
        "whole_model_swapping": WHOLE,
        "scenario": scenario,
        "generated": homes,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} in {out['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
