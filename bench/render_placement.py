"""The placement tables of docs/benchmarks.md, from bench/results/placement.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meta import meta_line

RESULTS = Path(__file__).resolve().parent / "results"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def _gib(x: float | None) -> str:
    return "none in the sweep" if x is None else f"{x:g} GiB"


def _load() -> dict[str, Any] | None:
    path = RESULTS / "placement.json"
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _placement_text(placement: dict[str, str]) -> str:
    by_device: dict[str, list[str]] = {}
    for name, dev in placement.items():
        by_device.setdefault(dev, []).append(name)
    return "; ".join(f"{dev}: {', '.join(names)}" for dev, names in sorted(by_device.items()))


def _scenario(key: str, s: dict[str, Any]) -> list[str]:
    n = s["devices"]
    best = s["best_hand"]
    totals = s["smallest_total_gib"]
    ratio = s["ratio"]
    lines = [
        f"**`{s['source']}`** ({n} x {s['capacity_gib']:g} GiB). {s['hand_placements_tried']} "
        f"hand placements screened at {s['screen_gib']:g} GiB per device (1 seed), the best "
        f"{len(s['finalists'])} swept with {s['sweep_seeds']} seeds per size; the policy's "
        "placement swept the same way.",
        "",
        f"- Best hand placement: {_placement_text(best['placement'])}.",
        f"- Smallest total memory for 99% (realtime and interactive): **placing "
        f"{_gib(totals['placing'])}**, best hand placement {_gib(totals['best_hand'])}"
        + (f" (**{ratio:.2f}x**)." if ratio is not None else "."),
        "",
        "| GiB per device | placing: realtime | interactive | best hand: realtime | interactive |",
        "|---|---|---|---|---|",
    ]
    for size, row in s["placing"]["sweep"].items():
        hand = best["sweep"].get(size, {})
        lines.append(
            f"| {size} | {_pct(row['realtime'])} | {_pct(row['interactive'])} | "
            f"{_pct(hand.get('realtime'))} | {_pct(hand.get('interactive'))} |"
        )
    lines += [
        "",
        f"At {s['capacity_gib']:g} GiB per device, {s['seeds']} seeds:",
        "",
        "| policy | realtime | interactive | background | OOMs | cold starts |",
        "|---|---|---|---|---|---|",
    ]
    for label, row in s["at_size"].items():
        name = f"**{label}**" if label.startswith("accelmux (placing") else label
        lines.append(
            f"| {name} | {_pct(row['realtime'])} | {_pct(row['interactive'])} | "
            f"{_pct(row['background'])} | {row['oom_events']:g} | {row['cold_starts']:g} |"
        )
    return lines


def scenarios() -> str:
    data = _load()
    if data is None:
        return "_No run yet: `python bench/bench_placement.py`._"
    lines = [f"{meta_line(data['meta'])}.", ""]
    for key, s in data["scenarios"].items():
        lines += _scenario(key, s)
        lines.append("")
    return "\n".join(lines).rstrip()


def homes() -> str:
    data = _load()
    if data is None or "generated" not in data:
        return "_No run yet: `python bench/bench_placement.py`._"
    g = data["generated"]
    rows = g["homes"]
    if not rows:
        return "_No generated home qualified._"

    def mean(side: str, cls: str) -> float:
        vals = [r[side][cls] for r in rows if r[side][cls] is not None]
        return sum(vals) / max(1, len(vals))

    def at_least(cls: str, slack: float) -> int:
        return sum(
            1
            for r in rows
            if r["placing"][cls] is None
            or r["best_hand"][cls] is None
            or r["placing"][cls] >= r["best_hand"][cls] - slack
        )

    ooms_placing = sum(r["placing"]["oom_events"] for r in rows)
    ooms_hand = sum(r["best_hand"]["oom_events"] for r in rows)
    lines = [
        f"{g['count']} generated homes on two devices of 60% of their generated size, "
        f"{g['seeds']} seeds each; accelmux placing against accelmux on the better of two "
        "users' hand placements. "
        f"{meta_line(data['meta'])}.",
        "",
        "| | placing | best of two hand placements |",
        "|---|---|---|",
        f"| mean realtime | {_pct(mean('placing', 'realtime'))} | "
        f"{_pct(mean('best_hand', 'realtime'))} |",
        f"| mean interactive | {_pct(mean('placing', 'interactive'))} | "
        f"{_pct(mean('best_hand', 'interactive'))} |",
        f"| OOMs, all homes (mean per run, summed) | {ooms_placing:g} | {ooms_hand:g} |",
        "",
        f"Placing is within 1 point of the hand placement or better on interactive in "
        f"{at_least('interactive', 0.01)} of {len(rows)} homes, and on realtime in "
        f"{at_least('realtime', 0.01)} of {len(rows)}.",
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {
    "placement": scenarios,
    "placement-homes": homes,
}
