"""``accelmux simulate SCENARIO``: compare policies on a scenario, print a table, write JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="run a scenario through the simulator for several policies",
        description="Run a scenario (YAML) through the discrete-event simulator for each "
        "policy and seed; print a comparison table and optionally write JSON.",
    )
    p.add_argument("scenario", help="scenario YAML file (see scenarios/)")
    p.add_argument(
        "--policies",
        help="comma-separated policies or variants, e.g. "
        "'accelmux,ollama+containers[max_loaded_models=7,num_parallel=4]' (default: all)",
    )
    p.add_argument("--seeds", type=int, help="number of seeds (default: the scenario's)")
    p.add_argument(
        "--device-gib", help="comma-separated device sizes to sweep (default: the scenario's)"
    )
    p.add_argument("--sweep-seeds", type=int, help="seeds per sweep point (default: scenario)")
    p.add_argument("--json", dest="json_path", help="write the full results here")
    p.add_argument("--trace", help="path of the Azure LLM trace CSV")
    p.add_argument("--duration-s", type=float, help="simulated seconds (default: scenario)")
    p.add_argument("--workers", type=int, help="parallel processes (default: up to 4)")
    p.set_defaults(func=run)


def _floats(text: str | None, what: str) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"accelmux simulate: {what} must be numbers, got {text!r}") from None
    return values


def run(args: argparse.Namespace) -> int:
    from accelmux.config.baselines import apply_variant, split_policies
    from accelmux.errors import ConfigError
    from accelmux.sim.report import header, text_table
    from accelmux.sim.runner import simulate
    from accelmux.sim.scenario import load_scenario, trace_problems

    path = Path(args.scenario)
    if not path.is_file():
        print(f"accelmux simulate: scenario not found: {path}", file=sys.stderr)
        return 2
    try:
        scn = load_scenario(path)
    except ConfigError as exc:
        print(f"{exc.source}: {len(exc.problems)} problem(s)", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    if args.trace is not None and not Path(args.trace).is_file():
        print(f"accelmux simulate: trace not found: {args.trace}", file=sys.stderr)
        return 2
    missing = trace_problems(scn, args.trace)
    if missing:
        print(f"accelmux simulate: {path}:", file=sys.stderr)
        for m in missing:
            print(f"  - {m}", file=sys.stderr)
        return 2
    policies = None
    if args.policies:
        policies = split_policies(args.policies)
        for text in policies:
            try:
                apply_variant(text, scn.config.policy)
            except ValueError as exc:
                print(f"accelmux simulate: {exc}", file=sys.stderr)
                return 2
    if args.seeds is not None and args.seeds < 1:
        print("accelmux simulate: --seeds must be >= 1", file=sys.stderr)
        return 2
    sweep = _floats(args.device_gib, "--device-gib")
    report = simulate(
        str(path),
        policies=policies,
        seeds=args.seeds,
        sweep_gib=sweep,
        sweep_seeds=args.sweep_seeds,
        duration_s=args.duration_s,
        trace_path=args.trace,
        workers=args.workers,
    )
    print(header(report))
    print(text_table(report))
    if args.json_path:
        out = Path(args.json_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        print(f"wrote {out}")
    return 0
