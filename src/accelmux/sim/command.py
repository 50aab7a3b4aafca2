"""``accelmux simulate SCENARIO``: compare policies on a scenario, print a table, write JSON.

The simulator is imported when the command runs (``# noqa: PLC0415``), not when the CLI
registers it, so ``accelmux --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from accelmux.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="run a scenario through the simulator for several policies",
        description="Run a scenario (YAML) through the discrete-event simulator for each "
        "policy and seed; print a comparison table and optionally write JSON.",
    )
    p.add_argument("scenario", nargs="?", help="scenario YAML file (see scenarios/)")
    p.add_argument("--generate", type=int, metavar="N", help="simulate N generated homes instead")
    p.add_argument("--seed", type=int, default=0, help="seed of the first generated home")
    p.add_argument("--write-dir", help="keep the generated homes' scenario files here")
    p.add_argument(
        "--home-kind",
        default="mixed",
        help="kind of generated home: mixed (default), night-cameras or evening-game",
    )
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
    if args.generate is not None:
        return _run_generated(args)
    if args.scenario is None:
        print("accelmux simulate: give a SCENARIO file or --generate N", file=sys.stderr)
        return 2
    return _run_file(args, Path(args.scenario))


def _run_generated(args: argparse.Namespace) -> int:
    """Write N generated homes (to --write-dir or a temporary folder) and run each."""
    from accelmux.sim.generate import HOME_KINDS, write_homes  # noqa: PLC0415  # fast --help

    if args.scenario is not None:
        print("accelmux simulate: give a SCENARIO or --generate, not both", file=sys.stderr)
        return 2
    if args.generate < 1:
        print("accelmux simulate: --generate must be >= 1", file=sys.stderr)
        return 2
    if args.home_kind not in HOME_KINDS:
        print(
            f"accelmux simulate: --home-kind must be one of {', '.join(HOME_KINDS)} "
            f"(got {args.home_kind!r})",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(args.write_dir or tmp)
        kwargs = {} if args.duration_s is None else {"duration_s": args.duration_s}
        reports: dict[str, Any] = {}
        homes = write_homes(args.seed, args.generate, out_dir, kind=args.home_kind, **kwargs)
        for path in homes:
            code, report = _simulate_file(args, path)
            if report is None:
                return code
            reports[path.stem] = report
        if args.write_dir:
            print(f"wrote {args.generate} scenario(s) to {out_dir}")
    if args.json_path:
        _write_json(Path(args.json_path), reports)
    return 0


def _run_file(args: argparse.Namespace, path: Path) -> int:
    code, report = _simulate_file(args, path)
    if report is not None and args.json_path:
        _write_json(Path(args.json_path), report)
    return code


def _write_json(out: Path, data: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"wrote {out}")


def _simulate_file(args: argparse.Namespace, path: Path) -> tuple[int, dict[str, Any] | None]:
    """Validate and run one scenario file: (exit code, report when it ran)."""
    from accelmux.sim.baselines import apply_variant, split_policies  # noqa: PLC0415  # --help stays fast
    from accelmux.sim.report import header, text_table  # noqa: PLC0415  # --help stays fast
    from accelmux.sim.runner import simulate  # noqa: PLC0415  # --help stays fast
    from accelmux.sim.scenario import load_scenario, trace_problems  # noqa: PLC0415  # --help stays fast

    if not path.is_file():
        print(f"accelmux simulate: scenario not found: {path}", file=sys.stderr)
        return 2, None
    try:
        scn = load_scenario(path)
    except ConfigError as exc:
        print(f"{exc.source}: {len(exc.problems)} problem(s)", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2, None
    if args.trace is not None and not Path(args.trace).is_file():
        print(f"accelmux simulate: trace not found: {args.trace}", file=sys.stderr)
        return 2, None
    missing = trace_problems(scn, args.trace)
    if missing:
        print(f"accelmux simulate: {path}:", file=sys.stderr)
        for m in missing:
            print(f"  - {m}", file=sys.stderr)
        return 2, None
    policies = None
    if args.policies:
        policies = split_policies(args.policies)
        for text in policies:
            try:
                apply_variant(text, scn.config.policy)
            except ValueError as exc:
                print(f"accelmux simulate: {exc}", file=sys.stderr)
                return 2, None
    if args.seeds is not None and args.seeds < 1:
        print("accelmux simulate: --seeds must be >= 1", file=sys.stderr)
        return 2, None
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
    return 0, report
