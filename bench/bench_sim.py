"""Regenerate the simulator results: ``bench/results/sim-<scenario>.json`` and tables.

Usage::

    .venv/bin/python bench/bench_sim.py                 # all four scenarios, 5 seeds
    .venv/bin/python bench/bench_sim.py --scenarios burst --seeds 2

Each scenario runs every policy (accelmux and the five baselines) for each seed at the
scenario's device size, then sweeps the device sizes the scenario lists. The markdown
tables printed at the end are the ones in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from accelmux.sim.report import header, markdown_table
from accelmux.sim.runner import simulate

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("home-evening", "burst", "small-gpu", "shared-memory-host")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--trace", default=None, help="path of the Azure LLM trace CSV")
    parser.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = []
    for name in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
        path = ROOT / "scenarios" / f"{name}.yaml"
        started = time.perf_counter()
        report = simulate(
            str(path.relative_to(ROOT)) if Path.cwd() == ROOT else str(path),
            seeds=args.seeds,
            trace_path=args.trace,
            workers=args.workers,
        )
        report["source"] = f"scenarios/{name}.yaml"
        report["machine"] = {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "wall_s": round(time.perf_counter() - started, 1),
        }
        target = out_dir / f"sim-{name}.json"
        target.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        tables.append(f"### {name}\n\n{header(report)}\n\n{markdown_table(report)}\n")
        print(f"wrote {target} ({report['machine']['wall_s']} s)", flush=True)
    print()
    print("\n".join(tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
