"""accelmux on a range of generated homes against baseline runs kept from before: a quick A/B.

The suite (``bench_suite.py``) runs every policy; while a rule of the accelmux policy is
being changed only accelmux's runs change, so this script keeps the baselines' runs in a
cache file and reruns accelmux alone, then prints the suite's targets and class means::

    python bench/ab_suite.py --first-home 0 --homes 100            # homes 0-99, 600 s runs
    python bench/ab_suite.py --first-home 100 --homes 100          # the holdout
    python bench/ab_suite.py --disable reserve_lending             # with a switch off

The cache (``--cache-dir``, default ``.ab-cache``) is keyed by the homes, the run length
and the seeds; delete it when the simulator or a baseline changes. Nothing is written to
``bench/results``: figures for the docs come from ``bench_suite.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import bench_suite as suite

from accelmux.sim.baselines import policy_names


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--first-home", type=int, default=0)
    parser.add_argument("--homes", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--disable", default="", help="comma-separated heuristics to turn off")
    parser.add_argument("--cache-dir", type=Path, default=Path(".ab-cache"))
    args = parser.parse_args()
    homes = list(range(args.first_home, args.first_home + args.homes))
    policies = policy_names()
    baselines = [p for p in policies if p != suite.OURS]
    key = f"{args.first_home}-{args.homes}-{args.duration_s:g}-{args.seeds}.json"
    cache = args.cache_dir / key
    if cache.is_file():
        base_runs = json.loads(cache.read_text(encoding="utf-8"))
    else:
        jobs = [
            suite.Job(h, p, s, args.duration_s)
            for h in homes
            for p in baselines
            for s in range(args.seeds)
        ]
        base_runs = suite.run_jobs(jobs, args.workers)
        args.cache_dir.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(base_runs), encoding="utf-8")
    disable = tuple(x for x in args.disable.split(",") if x)
    started = time.perf_counter()
    ours = suite.run_jobs(
        [
            suite.Job(h, suite.OURS, s, args.duration_s, disable)
            for h in homes
            for s in range(args.seeds)
        ],
        args.workers,
    )
    wall = time.perf_counter() - started
    results = suite.compare_homes(base_runs + ours, homes, policies, args.duration_s)
    targets = suite.targets(results)
    means = suite.policy_means(results, policies)
    rt, it = targets["realtime_not_below_any_baseline"], targets["interactive_within_1_point"]
    print(f"accelmux runs: {wall:.0f} s wall")
    print(f"realtime >= every baseline: {rt['passed']} of {rt['homes']} homes")
    print(f"interactive within 1 point: {it['passed']} of {it['homes']} homes")
    print(f"OOMs with right estimates in: {targets['ooms_with_right_estimates']['names']}")
    over_one = targets["ooms_per_service_2x_wrong"]["homes_over_one"]
    print(f"over one OOM per service, 2x wrong: {over_one}")
    for p in policies:
        row = means[p]
        print(
            f"  {p:18s} "
            + " ".join(f"{c} {100 * row[c]:.1f}%" for c in suite.CLASSES if row[c] is not None)
            + f"  OOMs/run {row['oom_events_per_run']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
