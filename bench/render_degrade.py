"""docs/benchmarks.md's degrade block, from ``bench/results/degrade.json``
(bench/bench_degrade.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meta import meta_line
from render_suite import _load as _load_result
from render_suite import _pct, _pts

CLASSES = ("realtime", "interactive", "batch", "background")


def _met(target: dict[str, Any]) -> str:
    return "met" if target["met"] else "**missed**"


def degrade() -> str:
    report = _load_result("degrade.json")
    if report is None:
        return "No result yet: run `python bench/bench_degrade.py`.\n"
    meta = report["meta"]
    s = meta["settings"]
    lines = [
        f"{s['homes']} homes of each kind ({', '.join(s['kinds'])}) x {s['seeds']} seeds x "
        f"{s['duration_s']:.0f} s; {meta_line(meta)}; wall {report['wall_s']:.0f} s.",
        "",
        "Mean attainment per class over the runs that have the class, the OOMs the "
        "policy caused per run, and the share of the memory the game and the other "
        "programs asked for that they went without (byte-seconds):",
        "",
        "| kind | policy | " + " | ".join(CLASSES) + " | OOMs/run | programs short |",
        "| --- | --- | " + " | ".join("---:" for _ in CLASSES) + " | ---: | ---: |",
    ]
    for kind, per in report["means"].items():
        for label in report["labels"]:
            m = per[label]
            cells = " | ".join(_pct(m.get(c)) for c in CLASSES)
            name = f"**{label}**" if label == "accelmux+degrade" else label
            short = m.get("foreign_starved_share")
            lines.append(f"| {kind} | {name} | {cells} | {m['ooms_per_run']:.2f} | {_pct(short)} |")
    t = report["targets"]
    lines += [
        "",
        "Targets, judged per home and seed (the worst run counts):",
        "",
        "| target | runs | result | worst run |",
        "| --- | ---: | --- | --- |",
    ]
    for c in ("interactive", "batch"):
        for key, words in (
            ("", "the best baseline"),
            ("_no_higher_cost", "the best baseline at no higher class's cost"),
        ):
            x = t.get(f"{c}_within_5_points{key}")
            if x is None:
                continue
            w = x["worst"]
            worst = (
                f"{w['home']} seed {w['seed']}: {_pts(w['minus_best_baseline'])} points"
                if w
                else "-"
            )
            apart = x.get("nothing_to_compare")
            none = f"; {apart} with no such baseline" if apart else ""
            lines.append(
                f"| {c} within 5 points of {words} | {x['runs']} | {_met(x)} "
                f"({x['passed']} of {x['runs']}{none}) | {worst} |"
            )
    rt = t["realtime_unchanged"]
    w = rt["worst"]
    worst = f"{w['home']} seed {w['seed']}: {_pts(w['minus_accelmux'])} points" if w else "-"
    lines.append(
        f"| realtime not below accelmux without degrading | {rt['runs']} | {_met(rt)} "
        f"({rt['below']} below) | {worst} |"
    )
    oom = t["no_extra_ooms"]
    where = ", ".join(oom["runs_with_extra"]) or "none"
    lines.append(
        f"| 0 extra OOMs | {len(report['rows'])} | {_met(oom)} ({oom['extra_ooms']} extra) "
        f"| {where} |"
    )
    failed = [(c, f) for c in ("interactive", "batch") for f in t[f"{c}_within_5_points"]["failed"]]
    if failed:
        lines += ["", "Runs more than 5 points behind the best baseline:", ""]
        lines += [
            "| class | home | seed | accelmux+degrade | accelmux | best baseline "
            "| its met requests while the card was over-committed "
            "| best at no higher class's cost |"
        ]
        lines += ["| --- | --- | ---: | ---: | ---: | --- | ---: | --- |"]
        rows = {(r["home"], r["seed"]): r for r in report["rows"]}
        for c, f in failed:
            r = rows[f["home"], f["seed"]]
            best = r["best_baseline"][c]
            fair = r.get("best_baseline_no_higher_cost", {}).get(c)
            fair_cell = f"{fair} {_pct(r['attainment'][fair].get(c))}" if fair else "none"
            lines.append(
                f"| {c} | {f['home']} | {f['seed']} | "
                f"{_pct(r['attainment']['accelmux+degrade'].get(c))} | "
                f"{_pct(r['attainment']['accelmux'].get(c))} | "
                f"{best} {_pct(r['attainment'][best].get(c))} | "
                f"{r.get('best_met_while_over_committed', {}).get(c, '-')} | {fair_cell} |"
            )
    return "\n".join(lines) + "\n"


BLOCKS: dict[str, Callable[[], str]] = {"degrade": degrade}
