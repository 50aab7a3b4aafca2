"""The gate a change of the policy passes before it lands: ``scripts/gate``.

It re-runs what such a change must not break and compares it with the committed results
(docs/benchmarks.md, "Figures and the policy that made them"):

- **the suite's fixed subset**: accelmux on the first :data:`SUBSET_HOMES` homes of the
  suite (``bench/results/suite.json``) and of its holdout (``suite-holdout.json``), with
  their committed settings (length, seeds), against the runs those files record
  (``run_rows``);
- **the stress scenarios**: accelmux on every ``scenarios/stress/*.yaml`` with the seeds
  of ``bench/results/stress.json``, against its ``run_rows``;
- **the regression scenarios** the adversary found (``scenarios/regressions/``): accelmux
  on each at its losing seed, against the attainment recorded in
  ``scenarios/regressions/losses.json``;
- **the degrade homes** (game evenings and small GPUs): accelmux with and without the
  services' lesser forms on every run of ``bench/results/degrade.json``, against its
  ``runs``; here a run also fails on one out-of-memory error more than committed (a game
  growing into memory the policy lent is what these homes hold);
- with ``--stack``, **the real-stack benchmarks**, each run again into a temporary file:
  voice protection (``bench_stack.py``, accelmux only, no memory part), two LLMs beside
  voice (``bench_stack_llms.py``) and Wyoming (``bench_wyoming.py``).

It fails when, against the committed runs, a class's mean over the runs of a part falls
by more than :data:`MEAN_DROP` (1 point), or a class in any one run falls by more than
:data:`RUN_DROP` (5 points). On the real stack it fails when a voice ratio's bootstrap
interval lies wholly above the committed one's (worse beyond the noise the two runs
show), when the cameras' frame rate outside the voice chains falls by more than 5
points of nominal, when a stream of the two-LLMs benchmark ends in an error or its voice
p95 ratio rises by more than :data:`STACK_RATIO_RISE`, or when a Wyoming p95 ratio under
load rises by more than :data:`WYOMING_RATIO_RISE` (single ratios on a 2-core machine
move by 10-20 % between runs). What it compares, and each verdict, is printed and
written to ``--out``, with every run whose class moved by :data:`MOVED` or more either
way (what a change gains, beside what it costs).

    scripts/gate                    # the simulator parts
    scripts/gate --stack            # and the real stack (about an hour)
    scripts/gate --parts suite      # one part
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from accelmux.sim.runner import RunSpec, run_many

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_suite
import worst_case

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
REGRESSIONS = ROOT / "scenarios" / "regressions"
SUBSET_HOMES = 20
MEAN_DROP = 0.01
RUN_DROP = 0.05
#: A run's class that moved at least this much either way is listed in ``--out`` (the
#: gain a change buys and what it costs, read run by run).
MOVED = 0.01
CAMERA_DROP = 0.05
STACK_RATIO_RISE = 0.15
WYOMING_RATIO_RISE = 0.20
SIM_PARTS = ("suite", "holdout", "stress", "regressions", "degrade")
T = TypeVar("T")


# ---- the simulator parts --------------------------------------------------------------------
def compare_runs(
    name: str, committed: dict[str, dict[str, float]], now: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """Runs keyed by ``home sSEED`` -> class -> attainment, committed and now: the class
    means' and each run's change, and the verdict."""
    problems: list[str] = []
    means: dict[str, dict[str, float]] = {}
    moved: list[dict[str, Any]] = []
    for cls in worst_case.CLASSES:
        keys = [k for k in committed if cls in committed[k] and cls in now.get(k, {})]
        if not keys:
            continue
        before = sum(committed[k][cls] for k in keys) / len(keys)
        after = sum(now[k][cls] for k in keys) / len(keys)
        means[cls] = {"runs": len(keys), "committed": before, "now": after}
        if after < before - MEAN_DROP - 1e-12:
            problems.append(f"{cls} mean {100 * before:.1f}% -> {100 * after:.1f}%")
        for k in keys:
            if abs(now[k][cls] - committed[k][cls]) >= MOVED:
                moved.append(
                    {"run": k, "class": cls, "committed": committed[k][cls], "now": now[k][cls]}
                )
            if now[k][cls] < committed[k][cls] - RUN_DROP - 1e-12:
                problems.append(
                    f"{cls} in {k}: {100 * committed[k][cls]:.1f}% -> {100 * now[k][cls]:.1f}%"
                )
    missing = sorted(set(committed) - set(now))
    if missing:
        problems.append(f"runs that did not run: {missing[:5]}")
    return {
        "part": name,
        "means": means,
        "moved": moved,
        "problems": problems,
        "passed": not problems,
    }


def _rows_by_run(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    return {f"{r['home']} s{r['seed']}": dict(r["policies"]["accelmux"]["classes"]) for r in rows}


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _suite_part(name: str, path: Path, workers: int) -> dict[str, Any]:
    data = _load(path)
    if "run_rows" not in data:
        return {
            "part": name,
            "problems": [f"{path.name} has no run_rows: run it again"],
            "passed": False,
        }
    s = data["meta"]["settings"]
    first = int(s["first_home"])
    homes = list(range(first, first + min(SUBSET_HOMES, int(s["homes"]))))
    wanted = {f"home-{h:04d}" for h in homes}
    committed = {k: v for k, v in _rows_by_run(data["run_rows"]).items() if k.split()[0] in wanted}
    jobs = [
        bench_suite.Job(h, "accelmux", seed, float(s["duration_s"]))
        for h in homes
        for seed in range(int(s["seeds"]))
    ]
    runs = bench_suite.run_jobs(jobs, workers)
    now = {
        f"home-{r['home']:04d} s{r['seed']}": {
            c: v["slo_attainment"] for c, v in r["classes"].items() if v["requests"]
        }
        for r in runs
    }
    return compare_runs(name, committed, now)


def _pool_map(
    func: Callable[[T], dict[str, Any]], items: list[T], workers: int
) -> list[dict[str, Any]]:
    """``func`` over ``items`` in order, on ``workers`` processes (here, for one)."""
    if workers <= 1:
        return [func(item) for item in items]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(func, items, chunksize=1))


def _classes(report: dict[str, Any]) -> dict[str, float]:
    return {c: v["slo_attainment"] for c, v in report["classes"].items() if v.get("requests")}


def _stress_part(workers: int) -> dict[str, Any]:
    data = _load(RESULTS / "stress.json")
    if "run_rows" not in data:
        return {"part": "stress", "problems": ["stress.json has no run_rows"], "passed": False}
    committed = _rows_by_run(data["run_rows"])
    stress = ROOT / "scenarios" / "stress"
    specs = [
        RunSpec(str(stress / f"{r['home']}.yaml"), "accelmux", int(r["seed"]))
        for r in data["run_rows"]
    ]
    now = {
        f"{Path(s.scenario_path).stem} s{s.seed}": _classes(r)
        for s, r in zip(specs, run_many(specs, workers), strict=True)
    }
    return compare_runs("stress", committed, now)


def _regressions_part(workers: int) -> dict[str, Any]:
    record = REGRESSIONS / "losses.json"
    if not record.is_file():
        return {"part": "regressions", "problems": [], "passed": True, "skipped": "none kept"}
    losses = _load(record)["scenarios"]
    specs = [
        RunSpec(str(REGRESSIONS / name), "accelmux", int(entry["seed"]))
        for name, entry in losses.items()
    ]
    committed = {f"{name} s{e['seed']}": e["accelmux"] for name, e in losses.items()}
    now = {
        f"{Path(s.scenario_path).name} s{s.seed}": _classes(r)
        for s, r in zip(specs, run_many(specs, workers), strict=True)
    }
    return compare_runs("regressions", committed, now)


def _degrade_part(workers: int) -> dict[str, Any]:
    import bench_degrade

    data = _load(RESULTS / "degrade.json")
    ours = (bench_degrade.OURS, bench_degrade.TODAY)
    committed_runs = [r for r in data["runs"] if r["label"] in ours]
    s = data["meta"]["settings"]
    jobs = [
        bench_degrade.Job(r["kind"], int(r["home"]), int(r["seed"]), r["label"], s["duration_s"])
        for r in committed_runs
    ]
    now_runs = _pool_map(bench_degrade.run_job, jobs, workers)

    def key(r: dict[str, Any]) -> str:
        return f"{r['kind']}-{r['home']:04d} s{r['seed']} {r['label']}"

    def classes(r: dict[str, Any]) -> dict[str, float]:
        return {c: v["slo_attainment"] for c, v in r["classes"].items()}

    result = compare_runs(
        "degrade",
        {key(r): classes(r) for r in committed_runs},
        {key(r): classes(r) for r in now_runs},
    )
    before = {key(r): int(r["ooms"]) for r in committed_runs}
    for r in now_runs:
        if int(r["ooms"]) > before.get(key(r), 0):
            result["problems"].append(
                f"out-of-memory errors in {key(r)}: {before.get(key(r), 0)} -> {r['ooms']}"
            )
    result["passed"] = not result["problems"]
    return result


# ---- the real stack -------------------------------------------------------------------------
def _bench(script: str, out: Path, *extra: str) -> dict[str, Any]:
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--out", str(out), *extra],
        cwd=ROOT,
        check=True,
    )
    return _load(out)


def _disjoint_worse(now: list[float] | None, before: list[float] | None) -> bool:
    return bool(now and before and now[0] > before[1])


def stack_voice_verdict(committed: dict[str, Any], now: dict[str, Any]) -> list[str]:
    problems = []
    before, after = committed["protection"]["accelmux"], now["protection"]["accelmux"]
    for q in ("p50", "p95"):
        b, a = before.get("intervals", {}).get(f"ratio_{q}"), after["intervals"][f"ratio_{q}"]
        if b is None:
            continue
        if _disjoint_worse(a, b):
            problems.append(f"voice ratio {q} {a} above the committed {b}")
    cam_b = before.get("camera", {}).get("share_of_nominal_outside_chains")
    cam_a = after["camera"]["share_of_nominal_outside_chains"]
    if cam_b is not None and cam_a < cam_b - CAMERA_DROP:
        problems.append(f"cameras outside chains {cam_b:.0%} -> {cam_a:.0%} of nominal")
    return problems


def stack_llms_verdict(committed: dict[str, Any], now: dict[str, Any]) -> list[str]:
    problems = [f"stream error: {e}" for e in now["stream_errors"][:5]]
    b, a = committed["voice"].get("ratio_p95"), now["voice"].get("ratio_p95")
    if b is not None and a is not None and a > b * (1 + STACK_RATIO_RISE):
        problems.append(f"voice p95 ratio {b:.2f} -> {a:.2f}")
    return problems


def wyoming_verdict(committed: dict[str, Any], now: dict[str, Any]) -> list[str]:
    problems = []
    for case in ("chat", "embed"):
        for what in ("tts", "stt"):
            b = committed["setups"]["accelmux"][case][what].get("ratio_p95")
            a = now["setups"]["accelmux"][case][what].get("ratio_p95")
            if b is not None and a is not None and a > b * (1 + WYOMING_RATIO_RISE):
                problems.append(f"{what} beside {case}: p95 ratio {b:.2f} -> {a:.2f}")
            fails = now["setups"]["accelmux"][case][what].get("fail", 0)
            if fails:
                problems.append(f"{what} beside {case}: {fails} requests failed")
    return problems


def stack_parts(tmp: Path) -> list[dict[str, Any]]:
    out = []
    for name, script, extra, verdict in (
        (
            "stack voice",
            "bench_stack.py",
            ("--skip-memory", "--setups", "accelmux"),
            stack_voice_verdict,
        ),
        ("two LLMs beside voice", "bench_stack_llms.py", (), stack_llms_verdict),
        ("wyoming", "bench_wyoming.py", (), wyoming_verdict),
    ):
        committed = _load(RESULTS / script.replace("bench_", "").replace(".py", ".json"))
        try:
            now = _bench(script, tmp / f"{name.replace(' ', '-')}.json", *extra)
            problems = verdict(committed, now)
        except (subprocess.CalledProcessError, KeyError, OSError) as exc:
            problems = [f"did not run: {exc}"]
        out.append({"part": name, "problems": problems, "passed": not problems})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stack", action="store_true", help="also the real-stack benchmarks")
    parser.add_argument("--parts", default=",".join(SIM_PARTS), help=f"of {', '.join(SIM_PARTS)}")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, help="write the comparison here (JSON)")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(SIM_PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown} (known: {', '.join(SIM_PARTS)})")
    results = []
    for part in parts:
        print(f"gate: {part} ...", flush=True)
        if part == "suite":
            results.append(_suite_part("suite", RESULTS / "suite.json", args.workers))
        elif part == "holdout":
            results.append(_suite_part("holdout", RESULTS / "suite-holdout.json", args.workers))
        elif part == "stress":
            results.append(_stress_part(args.workers))
        elif part == "degrade":
            results.append(_degrade_part(args.workers))
        else:
            results.append(_regressions_part(args.workers))
    if args.stack:
        with tempfile.TemporaryDirectory(prefix="accelmux-gate-") as td:
            results += stack_parts(Path(td))
    for r in results:
        print(f"{'PASS' if r['passed'] else 'FAIL'}  {r['part']}")
        for cls, m in r.get("means", {}).items():
            print(
                f"        {cls:12s} mean over {m['runs']} runs: {100 * m['committed']:.1f}% "
                f"committed, {100 * m['now']:.1f}% now"
            )
        for p in r["problems"]:
            print(f"        {p}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
