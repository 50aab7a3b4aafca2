"""Worst-case blocks of docs/benchmarks.md: bench/worst_case.py's summary of the runs
(``run_rows``) of suite.json, suite-holdout.json, suite-foreign.json and stress.json."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import worst_case
from meta import meta_line
from render_suite import _load, _pct, _pts

CLASSES = worst_case.CLASSES


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _run(where: dict[str, Any]) -> str:
    return f"{where['home']} s{where['seed']}"


def table(summary: dict[str, Any]) -> str:
    """The per-class worst case, the share of runs below 90 % per policy, the runs that
    broke a target, and the two targets."""
    classes = summary["classes"]
    rows = []
    for cls in CLASSES:
        c = classes.get(cls)
        if c is None:
            continue
        worst, gap, zero = c["worst"], c["minus_best_baseline_worst"], c["longest_zero_service"]
        rows.append(
            [
                cls,
                str(c["runs"]),
                _pct(c["mean"]),
                f"{_pct(worst['attainment'])} ({_run(worst)}, {worst['requests']} requests)",
                _pct(c["share_below_90"]),
                _pts(c["minus_best_baseline_mean"]),
                "-"
                if gap is None
                else f"{_pts(gap['points'])} ({_run(gap)}, vs `{gap['baseline']}`)",
                f"{c['runs_behind_over_10_points']} "
                f"({c['runs_behind_over_10_points_beyond_noise']})",
                f"{zero['seconds']:.0f} s ({_run(zero)})",
                str(c["runs_zero_service_over_5_min"]),
            ]
        )
    main = _table(
        [
            "class",
            "runs",
            "accelmux mean of runs",
            "worst run",
            "runs below 90%",
            "minus best baseline of the run: mean",
            "worst run",
            "runs > 10 points behind (beyond noise)",
            "longest zero service",
            "runs > 5 min zero service",
        ],
        rows,
    )
    policies = list(next(iter(classes.values()))["share_below_90_by_policy"]) if classes else []
    shares = _table(
        ["runs below 90%", *[c for c in CLASSES if c in classes]],
        [
            [
                p,
                *[
                    _pct(classes[c]["share_below_90_by_policy"].get(p))
                    for c in CLASSES
                    if c in classes
                ],
            ]
            for p in policies
        ],
    )
    listed = []
    for cls in CLASSES:
        c = classes.get(cls)
        if c is None:
            continue
        for b in c["behind"]:
            listed.append(
                f"- {cls}: {_run(b)}: {_pct(b['accelmux'])} of {b['requests']} requests, "
                f"{_pts(b['points'])} points against `{b['baseline']}`"
                + ("" if b["beyond_noise"] else " (within noise)")
            )
        for z in c["zero_service"]:
            listed.append(f"- {cls}: {_run(z)}: no service for {z['seconds']:.0f} s")
    t = summary["targets"]
    behind, locked = t["no_run_10_points_below_best_baseline"], t["no_zero_service_over_5_min"]
    targets = (
        f"Targets: no run with a class more than 10 points below the best baseline of that "
        f"run: {'met' if behind['met'] else '**not met**'} ({behind['runs_behind']} class-runs, "
        f"{behind['beyond_noise']} beyond noise); no class without service for more than 5 "
        f"simulated minutes while its requests fit the device: "
        f"{'met' if locked['met'] else '**not met**'} ({locked['runs']} class-runs)."
    )
    parts = [main, targets, shares]
    if listed:
        parts.append(
            "The runs that broke a target (the worst five per class):\n\n" + "\n".join(listed)
        )
    return "\n\n".join(parts)


def _suite_block(name: str, command: str) -> Callable[[], str]:
    def block() -> str:
        data = _load(name)
        if data is None or "run_rows" not in data:
            return f"_No per-run results yet: run `{command}`._"
        summary = worst_case.summarize(data["run_rows"])
        head = (
            f"{summary['runs']} runs (home x seed), accelmux against every "
            f"baseline of the same run. {meta_line(data['meta'])}."
        )
        return f"{head}\n\n{table(summary)}"

    return block


def foreign() -> str:
    data = _load("suite-foreign.json")
    if data is None or "run_rows" not in data:
        return (
            "_No per-run results yet: run `python bench/bench_suite.py --kinds "
            "night-cameras,evening-game --homes 6 --out bench/results/suite-foreign.json`._"
        )
    parts = [f"{meta_line(data['meta'])}."]
    for kind in data["kinds"]:
        summary = worst_case.summarize([r for r in data["run_rows"] if r["kind"] == kind])
        parts += [f"`{kind}` ({summary['runs']} runs):", table(summary)]
    return "\n\n".join(parts)


BLOCKS: dict[str, Callable[[], str]] = {
    "suite-worst-case": _suite_block("suite.json", "python bench/bench_suite.py"),
    "suite-holdout-worst-case": _suite_block(
        "suite-holdout.json",
        "python bench/bench_suite.py --first-home 100 --out bench/results/suite-holdout.json",
    ),
    "suite-foreign-worst-case": foreign,
    "stress-worst-case": _suite_block("stress.json", "python bench/bench_stress.py"),
}
