"""Worst-case blocks of docs/benchmarks.md: bench/worst_case.py's summary of the runs
(``run_rows``) of suite.json, suite-holdout.json, suite-foreign.json and stress.json."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import render_stress
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


def _aside(set_aside: dict[str, str]) -> str:
    """The baselines ahead that the judge set aside, and why."""
    return ", ".join(f"`{b}` {_why(why)}" for b, why in sorted(set_aside.items()))


def _why(gave_up: str) -> str:
    if gave_up == worst_case.OVER_BUDGET:
        return "held more than the budget"
    return f"gave up {gave_up}"


def _gap(gap: dict[str, Any] | None) -> str:
    return "-" if gap is None else f"{_pts(gap['points'])} ({_run(gap)}, vs `{gap['baseline']}`)"


def _behind(against: dict[str, Any]) -> str:
    return (
        f"{against['runs_behind_over_10_points']} "
        f"({against['runs_behind_over_10_points_beyond_noise']})"
    )


def judged_as(budget_rule: str) -> str:
    """What the judged columns compare with, given whether rule 2 had its data."""
    rule2 = {
        "applied": "and whose services kept within the device's budget at every sample",
        "partial": "and, in the runs that record it, whose services kept within the "
        "device's budget (rule 2 pending for the others: they predate that record)",
        "pending": "(rule 2, within the device's budget, is **pending**: these runs "
        "predate the record of what each policy's services held; a re-run records it)",
    }[budget_rule]
    return (
        "the best baseline of the same run that gave up no higher class for it (none more "
        f"than 10 points below accelmux in a class ranked above) {rule2}"
    )


def table(summary: dict[str, Any]) -> str:
    """The per-class worst case, the share of runs below 90 % per policy, the runs that
    broke a target, and the two targets; the loss against the judged baseline, with the
    loss against any baseline beside it."""
    classes = summary["classes"]
    rows = []
    for cls in CLASSES:
        c = classes.get(cls)
        if c is None:
            continue
        worst, zero = c["worst"], c["longest_zero_service"]
        judged, raw = c["minus_best_judged_baseline"], c["minus_best_baseline"]
        rows.append(
            [
                cls,
                str(c["runs"]),
                _pct(c["mean"]),
                f"{_pct(worst['attainment'])} ({_run(worst)}, {worst['requests']} requests)",
                _pct(c["share_below_90"]),
                _pts(judged["mean"])
                + ("" if judged["runs"] == c["runs"] else f" ({judged['runs']} runs)"),
                _gap(judged["worst"]),
                _behind(judged),
                f"{_pts(raw['mean'])}; {_gap(raw['worst'])}",
                _behind(raw),
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
            "minus best judged baseline: mean",
            "worst run",
            "runs > 10 points behind (beyond noise)",
            "minus any baseline: mean; worst run",
            "runs > 10 points behind any (beyond noise)",
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
    listed, aside = [], []
    for cls in CLASSES:
        c = classes.get(cls)
        if c is None:
            continue
        for b in c["minus_best_judged_baseline"]["behind"]:
            listed.append(
                f"- {cls}: {_run(b)}: {_pct(b['accelmux'])} of {b['requests']} requests, "
                f"{_pts(b['points'])} points against `{b['baseline']}`"
                + ("" if b["beyond_noise"] else " (within noise)")
                + (f"; set aside: {_aside(b['set_aside'])}" if b["set_aside"] else "")
            )
        for z in c["zero_service"]:
            shortest = z["baselines_shortest_s"]
            listed.append(
                f"- {cls}: {_run(z)}: no service for {z['seconds']:.0f} s"
                + ("" if shortest is None else f" (the baselines: {shortest:.0f} s at the least)")
            )
        for b in c["behind_only_a_set_aside_baseline"]:
            aside.append(
                f"- {cls}: {_run(b)}: {_pct(b['accelmux'])} of {b['requests']} requests, "
                f"{_pts(b['points'])} points against `{b['baseline']}`, which "
                f"{_why(b['gave_up'])}"
            )
    t = summary["targets"]
    behind, locked = t["no_run_10_points_below_best_baseline"], t["no_zero_service_over_5_min"]
    raw = behind["against_any_baseline"]
    targets = (
        f"Targets: no run with a class more than 10 points below the best judged baseline "
        f"of that run: {'met' if behind['met'] else '**not met**'} ({behind['runs_behind']} "
        f"class-runs, {behind['beyond_noise']} beyond noise; against any baseline "
        f"{raw['runs_behind']}, {raw['beyond_noise']} beyond noise); no class without "
        f"service for more than 5 simulated minutes while its requests fit the device: "
        f"{'met' if locked['met'] else '**not met**'} ({locked['runs']} class-runs)."
    )
    parts = [main, targets, shares]
    if listed:
        parts.append(
            "The runs that broke a target (the worst five per class):\n\n" + "\n".join(listed)
        )
    if aside:
        parts.append(
            "Behind by more than 10 points only against a baseline the judge set aside "
            "(the worst five per class):\n\n" + "\n".join(aside)
        )
    return "\n\n".join(parts)


def _suite_block(name: str, command: str) -> Callable[[], str]:
    def block() -> str:
        data = _load(name)
        if data is None or "run_rows" not in data:
            return f"_No per-run results yet: run `{command}`._"
        summary = worst_case.summarize(data["run_rows"])
        head = (
            f"{summary['runs']} runs (home x seed). Judged: accelmux against "
            f"{judged_as(summary['budget_rule'])}; beside it, against any baseline. "
            f"{meta_line(data['meta'])}."
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
    rule = worst_case.budget_rule(data["run_rows"])
    parts = [f"Judged: accelmux against {judged_as(rule)}. {meta_line(data['meta'])}."]
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
    "stress-failure-classes-worst-case": _suite_block(
        render_stress.FAILURE_CLASSES, render_stress.FAILURE_CLASSES_COMMAND
    ),
}
