"""Worst case, not only means: per class, the worst run and the runs that broke a target.

A mean over homes and seeds hides a catastrophe in one run (a class at 26 % in one seed
and 97-100 % in the others reads as 74 %, or as 99 % among a hundred homes). The suite
(``bench_suite.py``), the stress scenarios (``bench_stress.py``) and the adversary
(``adversary.py``) therefore keep every run, as a row::

    {"home": "home-0034", "seed": 1,
     "policies": {"accelmux": {"classes": {"interactive": 0.62, ...},
                               "requests": {"interactive": 40, ...},
                               "zero_service_s": {"interactive": 0.0, ...},
                               "over_budget": False}, ...}}

(``over_budget``: the policy's services held more than the device's budget at some memory
sample; absent in runs from before the reports recorded it)

and :func:`summarize` reduces the rows (the renderers call it on the committed rows, so
the summary is never out of step with them), per class, to what the targets of the policy work
are judged by:

- accelmux's mean over runs, its worst run (home, seed) and the share of its runs below
  :data:`LOW` (90 %), with the same share for every other policy beside it;
- accelmux minus the best *judged* baseline *of that run* (:func:`best_untraded`: the
  baseline with the highest attainment of that class in that same home and seed among
  those that gave up no higher class for it and kept within the budget, :func:`traded`,
  the adversary's judge): the mean, the worst run, and the runs more than
  :data:`BEHIND_LIMIT` (10 points) below, with how many of them are behind by more than
  twice the standard error of the difference (Agresti-Caffo; the others may be the
  noise of few requests); beside it the same against any baseline
  (:func:`best_baseline`), and the runs behind only a baseline the judge set aside;
- zero service (:mod:`accelmux.sim.zero_service`): the longest stretch a class asked for
  work that fits the empty device and got none, and the runs where it passed
  :data:`ZERO_SERVICE_LIMIT_S` (5 simulated minutes).

The two targets (issue: "the policy never collapses"): no run where a class is more than
10 points below the best judged baseline for that run, and no class with zero service for
more than 5 simulated minutes while its requests fit the device. :func:`budget_rule`
says whether the budget rule had its data in the rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from accelmux.sim.zero_service import ZERO_SERVICE_LIMIT_S

CLASSES = ("realtime", "interactive", "batch", "background")
OURS = "accelmux"
ORACLE = "oracle"
#: A run below this attainment counts as a bad run.
LOW = 0.90
#: A class further than this below the best baseline of its run breaks the target.
BEHIND_LIMIT = 0.10
#: How many runs per class the summary lists (worst first).
LISTED = 5

Row = dict[str, Any]


def run_row(home: str, seed: int, per_policy: dict[str, dict[str, Any]]) -> Row:
    """One (home, seed) row from each policy's ``accelmux.sim.metrics.summarize`` report
    (or the suite's reduced form of it, which has the same keys)."""
    policies: dict[str, Any] = {}
    for policy, report in per_policy.items():
        classes = report["classes"]
        policies[policy] = {
            "classes": {
                c: v["slo_attainment"]
                for c, v in classes.items()
                if v.get("requests") and v.get("slo_attainment") is not None
            },
            "requests": {c: int(v["requests"]) for c, v in classes.items() if v.get("requests")},
            "zero_service_s": {
                c: float(v["longest_s"]) for c, v in (report.get("zero_service") or {}).items()
            },
        }
        over = over_budget(report)
        if over is not None:
            policies[policy]["over_budget"] = over
    return {"home": home, "seed": seed, "policies": policies}


def over_budget(report: Mapping[str, Any]) -> bool | None:
    """Whether the policy's services held more than the device's budget at any memory
    sample of the run (``accelmux.sim.metrics``: ``memory.peak_services_sampled`` against
    ``memory.budget_bytes``, the first device's), or None where the report does not
    record it (results from before it was recorded)."""
    memory = report.get("memory") or {}
    held, budget = memory.get("peak_services_sampled"), memory.get("budget_bytes")
    if held is None or budget is None:
        return None
    return bool(held > budget)


def _baselines(row: Row) -> list[str]:
    return [p for p in row["policies"] if p not in (OURS, ORACLE)]


def best_baseline(row: Row, cls: str) -> tuple[float, str] | None:
    """(attainment, name) of the baseline best at ``cls`` in this run."""
    scored = [
        (row["policies"][b]["classes"][cls], b)
        for b in _baselines(row)
        if cls in row["policies"][b]["classes"]
    ]
    return max(scored) if scored else None


#: What :func:`traded` answers for a baseline whose services held more memory than the
#: device's budget.
OVER_BUDGET = "budget"


def traded(row: Row, cls: str, baseline: str, margin: float = BEHIND_LIMIT) -> str | None:
    """What ``baseline`` gave up in this run to do better in ``cls``, if anything: the
    class above ``cls`` (realtime first) in which it is more than ``margin`` below
    accelmux, or :data:`OVER_BUDGET` when its services held more memory than the
    device's budget (a run row's ``over_budget``, where recorded).

    The configuration ranks the classes (voice first, always): a baseline that wins batch
    by serving interactive 30 points worse makes a trade the policy is told not to make.
    And a budget below the capacity is memory the home keeps for its other programs (a
    host's desktop, a browser): a baseline that serves chat by taking it, in a run where
    no program came to ask for it back, is not a better result at equal memory."""
    theirs_row = row["policies"][baseline]
    if theirs_row.get("over_budget"):
        return OVER_BUDGET
    return gave_up_above(theirs_row["classes"], row["policies"][OURS]["classes"], cls, margin)


def gave_up_above(
    theirs: Mapping[str, float], ours: Mapping[str, float], cls: str, margin: float
) -> str | None:
    """The first class ranked above ``cls`` (realtime first) in which ``theirs`` (class ->
    attainment) is more than ``margin`` below ``ours``, or None."""
    for higher in CLASSES[: CLASSES.index(cls)]:
        if higher in ours and higher in theirs and theirs[higher] < ours[higher] - margin:
            return higher
    return None


def best_untraded(row: Row, cls: str) -> tuple[float, str] | None:
    """(attainment, name) of the baseline best at ``cls`` in this run among those that
    gave up no higher class for it (:func:`traded`)."""
    scored = [
        (row["policies"][b]["classes"][cls], b)
        for b in _baselines(row)
        if cls in row["policies"][b]["classes"] and traded(row, cls, b) is None
    ]
    return max(scored) if scored else None


def beyond_noise(row: Row, cls: str, baseline: str) -> bool:
    """Behind by more than twice the standard error of the difference of two binomial
    proportions (the requests of each), with one success and one failure added to each
    (Agresti and Caffo's adjustment: 0 of 3 against 3 of 3 has an error, not none)."""
    ours, best = row["policies"][OURS], row["policies"][baseline]
    n1, n2 = ours["requests"].get(cls, 0), best["requests"].get(cls, 0)
    if not n1 or not n2:
        return False
    p1 = (ours["classes"][cls] * n1 + 1) / (n1 + 2)
    p2 = (best["classes"][cls] * n2 + 1) / (n2 + 2)
    se = math.sqrt(p1 * (1 - p1) / (n1 + 2) + p2 * (1 - p2) / (n2 + 2))
    return bool(p2 - p1 > 2 * se)


def _where(row: Row) -> dict[str, Any]:
    return {"home": row["home"], "seed": row["seed"]}


def _set_aside(row: Row, cls: str, judged: float) -> dict[str, str]:
    """The baselines of this run above ``judged`` (the judged best's attainment, or
    accelmux's where none is judged) in ``cls`` that the judge set aside, each with what
    it gave up (:func:`traded`: a higher class, or the budget)."""
    return {
        b: why
        for b in _baselines(row)
        if row["policies"][b]["classes"].get(cls, -1.0) > judged
        and (why := traded(row, cls, b)) is not None
    }


Gap = tuple[float, Row, str]


def _gaps(mine: list[Row], cls: str, judged: bool) -> list[Gap]:
    """(accelmux minus the best baseline, run, that baseline) of each run that has one,
    worst first: the judged best (:func:`best_untraded`) or any (:func:`best_baseline`)."""
    best_of = best_untraded if judged else best_baseline
    gaps = []
    for r in mine:
        best = best_of(r, cls)
        if best is not None:
            gaps.append((r["policies"][OURS]["classes"][cls] - best[0], r, best[1]))
    return sorted(gaps, key=lambda g: (g[0], g[1]["home"], g[1]["seed"]))


def _behind(gaps: list[Gap]) -> list[Gap]:
    return [g for g in gaps if g[0] < -BEHIND_LIMIT - 1e-9]


def _entry(gap: Gap, cls: str, judged: bool) -> dict[str, Any]:
    points, r, name = gap
    e = {**_where(r), "points": points, "baseline": name}
    if judged:
        ours = r["policies"][OURS]["classes"][cls]
        return {**e, "set_aside": _set_aside(r, cls, ours - points)}
    return {**e, "gave_up": traded(r, cls, name)}


def _listed(gaps: list[Gap], cls: str, judged: bool) -> list[dict[str, Any]]:
    return [
        {
            **_entry(g, cls, judged),
            "accelmux": g[1]["policies"][OURS]["classes"][cls],
            "requests": g[1]["policies"][OURS]["requests"].get(cls),
            "beyond_noise": beyond_noise(g[1], cls, g[2]),
        }
        for g in gaps[:LISTED]
    ]


def _against(gaps: list[Gap], cls: str, judged: bool) -> dict[str, Any]:
    """accelmux minus the best (judged, or any) baseline of each run in ``cls``: the
    mean over the runs that have one, the worst run, and the runs more than
    :data:`BEHIND_LIMIT` behind."""
    behind = _behind(gaps)
    return {
        "runs": len(gaps),
        "mean": sum(g[0] for g in gaps) / len(gaps) if gaps else None,
        "worst": _entry(gaps[0], cls, judged) if gaps else None,
        "runs_behind_over_10_points": len(behind),
        "runs_behind_over_10_points_beyond_noise": sum(
            1 for g in behind if beyond_noise(g[1], cls, g[2])
        ),
        "behind": _listed(behind, cls, judged),
    }


def _judged_and_raw(mine: list[Row], cls: str) -> dict[str, Any]:
    """The loss against the judged best baseline and, beside it, against any; and the
    runs behind any baseline by more than the limit but not behind the judged one (each
    with what its best baseline gave up)."""
    judged, raw = _gaps(mine, cls, judged=True), _gaps(mine, cls, judged=False)
    behind_judged = {(g[1]["home"], g[1]["seed"]) for g in _behind(judged)}
    only_raw = [g for g in _behind(raw) if (g[1]["home"], g[1]["seed"]) not in behind_judged]
    return {
        # against the best baseline that gave up no higher class for it and kept within
        # the budget (the judge the adversary uses), and against any baseline beside it
        "minus_best_judged_baseline": _against(judged, cls, judged=True),
        "minus_best_baseline": _against(raw, cls, judged=False),
        "runs_behind_only_a_set_aside_baseline": len(only_raw),
        "behind_only_a_set_aside_baseline": _listed(only_raw, cls, judged=False),
    }


def _baselines_zero(row: Row, cls: str) -> float | None:
    """The shortest longest-zero-service stretch of ``cls`` among the baselines of this
    run (did any of them serve the class where accelmux did not?)."""
    have = [
        row["policies"][b]["zero_service_s"][cls]
        for b in _baselines(row)
        if cls in row["policies"][b].get("zero_service_s", {})
    ]
    return min(have) if have else None


def _class_summary(rows: list[Row], cls: str) -> dict[str, Any] | None:
    mine = [r for r in rows if cls in r["policies"].get(OURS, {}).get("classes", {})]
    if not mine:
        return None
    values = [r["policies"][OURS]["classes"][cls] for r in mine]
    worst = min(mine, key=lambda r: r["policies"][OURS]["classes"][cls])
    below: dict[str, float] = {}
    for policy in rows[0]["policies"]:
        have = [
            r["policies"][policy]["classes"][cls]
            for r in rows
            if cls in r["policies"].get(policy, {}).get("classes", {})
        ]
        if have:
            below[policy] = sum(1 for v in have if v < LOW) / len(have)
    zero = sorted(
        ((r["policies"][OURS]["zero_service_s"].get(cls, 0.0), r) for r in mine),
        key=lambda z: (-z[0], z[1]["home"], z[1]["seed"]),
    )
    locked = [z for z in zero if z[0] > ZERO_SERVICE_LIMIT_S]
    return {
        "runs": len(mine),
        "mean": sum(values) / len(values),
        "worst": {
            **_where(worst),
            "attainment": worst["policies"][OURS]["classes"][cls],
            "requests": worst["policies"][OURS]["requests"].get(cls),
        },
        "share_below_90": below.get(OURS, 0.0),
        "share_below_90_by_policy": below,
        **_judged_and_raw(mine, cls),
        "longest_zero_service": {**_where(zero[0][1]), "seconds": zero[0][0]},
        "runs_zero_service_over_5_min": len(locked),
        "zero_service": [
            {**_where(r), "seconds": s, "baselines_shortest_s": _baselines_zero(r, cls)}
            for s, r in locked[:LISTED]
        ],
    }


def budget_rule(rows: list[Row]) -> str:
    """Whether rule 2 (:data:`OVER_BUDGET`) could be judged on ``rows``: ``applied`` when
    every baseline of every run records ``over_budget``, ``pending`` when none does (runs
    from before it was recorded: their judged loss applies the class order alone),
    ``partial`` otherwise."""
    recorded = [all("over_budget" in r["policies"][b] for b in _baselines(r)) for r in rows]
    if recorded and all(recorded):
        return "applied"
    return "partial" if any(recorded) else "pending"


def summarize(rows: list[Row]) -> dict[str, Any]:
    """Per class, the worst-case figures of accelmux over ``rows``, and the two targets:
    the first judged against the best baseline that traded nothing (:func:`traded`), with
    the count against any baseline beside it."""
    classes = {c: s for c in CLASSES if (s := _class_summary(rows, c)) is not None}

    def count(judge: str, key: str) -> int:
        return sum(s[judge][key] for s in classes.values())

    behind = count("minus_best_judged_baseline", "runs_behind_over_10_points")
    locked = sum(s["runs_zero_service_over_5_min"] for s in classes.values())
    return {
        "runs": len(rows),
        "budget_rule": budget_rule(rows),
        "classes": classes,
        "targets": {
            "no_run_10_points_below_best_baseline": {
                "runs_behind": behind,
                "beyond_noise": count(
                    "minus_best_judged_baseline", "runs_behind_over_10_points_beyond_noise"
                ),
                "met": behind == 0,
                "against_any_baseline": {
                    "runs_behind": count("minus_best_baseline", "runs_behind_over_10_points"),
                    "beyond_noise": count(
                        "minus_best_baseline", "runs_behind_over_10_points_beyond_noise"
                    ),
                },
            },
            "no_zero_service_over_5_min": {"runs": locked, "met": locked == 0},
        },
    }
