"""The "each heuristic on a run that shows it" table, from ``bench/results/switches.json``
(``bench/bench_switches.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from docgen import RESULTS
from meta import meta_line
from render_suite import _pct, _pts, _signed, _table

CLASSES = ("realtime", "interactive", "batch", "background")


def _load() -> dict[str, Any] | None:
    path = RESULTS / "switches.json"
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text(encoding="utf-8")))


def _cell(row: dict[str, Any]) -> str:
    """``on -> off (delta)`` of one class, or ``-`` where the run has no such requests."""
    if row["delta"] is None:
        return "-"
    return f"{_pct(row['on'])} → {_pct(row['off'])} ({_pts(row['delta'])})"


def switch_runs() -> str:
    data = _load()
    if data is None:
        return "_No results yet: run `python bench/bench_switches.py`._"
    seeds = data["meta"]["settings"]["seeds"]
    head = (
        f"accelmux with everything on → with one heuristic off, on the run named for it, "
        f"mean over {seeds} seeds ({data['wall_s']:.0f} s wall). {meta_line(data['meta'])}. "
        'Points in brackets are off minus on; "decisions differ" counts the seeds whose '
        "decision streams part."
    )
    rows = []
    for name, row in data["switches"].items():
        ooms, pre = row["oom_events"], row["preemptions"]
        rows.append(
            [
                f"`{name}`",
                f"{row['where']} ({row['duration_s']:g} s)",
                f"{row['seeds_changed']}/{seeds}",
                *(_cell(row[c]) for c in CLASSES),
                _signed(ooms["off"] - ooms["on"], 2),
                _signed(pre["off"] - pre["on"]),
            ]
        )
    table = _table(
        [
            "off",
            "run",
            "decisions differ",
            *CLASSES,
            "OOMs per run",
            "preemptions per run",
        ],
        rows,
    )
    return f"{head}\n\n{table}"


BLOCKS: dict[str, Callable[[], str]] = {"switch-runs": switch_runs}
