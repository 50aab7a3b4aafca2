"""The adversary's block of docs/benchmarks.md, from bench/results/adversary.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meta import meta_line

RESULTS = Path(__file__).resolve().parent / "results"
#: Findings listed in the table, worst first.
LISTED = 12


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def _change(c: dict[str, Any]) -> str:
    kind = c["change"]
    if kind == "device":
        return f"device x{c['scale']:g}"
    if kind == "drop":
        return f"no {c['service']}"
    if kind == "bias":
        return f"{c['service']} request x{c['request_bias']:g} resident x{c['resident_bias']:g}"
    if kind == "oom":
        return f"OOM injection {c['share']:.0%} at {c['at_s']:g} s for {c['duration_s']:g} s"
    if kind == "foreign":
        return (
            f"program {c['share']:.0%} (compute {c['compute_share']:.0%}) at {c['at_s']:g} s "
            f"for {c['duration_s']:g} s"
        )
    if kind == "burst":
        return f"burst on {c['service']} {c['rate_per_h']:g}/h"
    if kind == "window":
        w = c["window"]
        if not w:
            return f"{c['service']} window none"
        if isinstance(w, str):
            return f"{c['service']} window {w}"
        return (
            f"{c['service']} window opening {w['opens_after']:.0%} into the run for {w['hours']} h"
        )
    return str(kind)


def _raw(raw: list[Any] | None) -> str:
    """A class's loss against every baseline: points and the baseline."""
    return "-" if not raw else f"{raw[0]:.1f} (`{raw[1]}`)"


def _best(baseline: str | None, attainment: float | None) -> str:
    if baseline is None:
        return "none (each gave up a higher class or the budget)"
    return f"`{baseline}` {_pct(attainment)}"


def _per_class(losses: dict[str, float]) -> str:
    return ", ".join(f"{c} {v:.1f}" for c, v in losses.items()) or "none"


def adversary() -> str:
    path = RESULTS / "adversary.json"
    if not path.is_file():
        return "_No search yet: `python bench/adversary.py`._"
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    s = data["meta"]["settings"]
    head = (
        f"Search seed {s['seed']}: {data['evaluations']} candidates in {data['generations']} "
        f"generations ({data['wall_s'] / 60:.0f} min wall on {s['workers']} workers, budget "
        f"{s['minutes']:g} min; load average {data['load_avg_1m_after']} at the end), each "
        f"{s['duration_s']:g} simulated seconds under accelmux and the four baselines. "
        f"Worst loss: {data['worst_loss_points']:.1f} points; {data['findings']} candidates "
        f"lost more than {100 * s['threshold']:.0f} points in a class; "
        f"{len(data['distinct'])} distinct findings (one per home and failure class)"
        + (
            f", {data['distinct_beyond_noise']} of them behind beyond noise"
            if "distinct_beyond_noise" in data
            else ""
        )
        + ". Worst loss per class against the baselines that gave up no higher class for "
        f"it: {_per_class(data['worst_loss_per_class'])}"
        + (
            f"; against any baseline: {_per_class(data['worst_raw_loss_per_class'])}"
            if "worst_raw_loss_per_class" in data
            else ""
        )
        + f". {meta_line(data['meta'])}."
    )
    classes = [
        "| failure class (losing class: what accelmux's misses mostly were) | findings "
        "| homes | worst loss (points) |",
        "|---|---:|---:|---:|",
    ]
    for name, c in data["failure_classes"].items():
        classes.append(f"| {name} | {c['findings']} | {c['homes']} | {c['worst_points']:.1f} |")
    rows = [
        "| scenario file | class | accelmux | best baseline (gave up no higher class) "
        "| loss (points) | against any baseline | failure | changes |",
        "|---|---|---:|---|---:|---|---|---|",
    ]
    for f in data["distinct"][:LISTED]:
        cls = f["class"]
        ours = f["attainment"]["accelmux"].get(cls)
        best = f["attainment"][f["baseline"]].get(cls)
        rows.append(
            f"| `{f['scenario']}` | {cls} | {_pct(ours)} | `{f['baseline']}` {_pct(best)} "
            f"| {f['loss_points']:.1f}{'' if f.get('beyond_noise', True) else ' (within noise)'} "
            f"| {_raw(f.get('raw_losses_points', {}).get(cls))} | {f['failure']} "
            f"| {'; '.join(_change(c) for c in f['changes']) or '(the home as drawn)'} |"
        )
    return "\n\n".join([head, "\n".join(classes), "\n".join(rows)])


def regressions() -> str:
    """The regression scenarios kept from the searches, with the losses recorded when
    they were kept (scenarios/regressions/losses.json)."""
    path = Path(__file__).resolve().parents[1] / "scenarios" / "regressions" / "losses.json"
    if not path.is_file():
        return "_None kept yet: `python bench/adversary.py --keep N`._"
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    rows = [
        "| scenario | seed | status | worst class | accelmux | best baseline (gave up no higher "
        "class, within the budget) | loss (points) | against any baseline | failure |",
        "|---|---:|---|---|---:|---|---:|---|---|",
    ]
    ordered = sorted(data["scenarios"].items(), key=lambda kv: (-kv[1]["loss_points"], kv[0]))
    for name, e in ordered:
        cls = e["class"]
        status = "**open**" if e.get("status", "open") == "open" else "fixed"
        rows.append(
            f"| `{name}` | {e['seed']} | {status} | {cls} | {_pct(e['accelmux'].get(cls))} "
            f"| {_best(e['baseline'], e['best_baseline'].get(cls))} "
            f"| {e['loss_points']:.1f} | {_raw(e.get('raw_losses_points', {}).get(cls))} "
            f"| {e['failure']} |"
        )
    entries = list(data["scenarios"].values())
    n_open = sum(1 for e in entries if e.get("status", "open") == "open")
    head = (
        f"{len(entries)} kept: {len(entries) - n_open} fixed (no class more than 10 points "
        f"below the best baseline of the run; `tests/sim/test_regressions.py` holds them "
        f"to it), {n_open} open (a loss today's policy still has)."
    )
    return head + "\n\n" + "\n".join(rows)


BLOCKS: dict[str, Callable[[], str]] = {
    "adversary": adversary,
    "adversary-regressions": regressions,
}
