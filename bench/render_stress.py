"""The stress-scenario table of docs/benchmarks.md, from bench/results/stress.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meta import meta_line

RESULTS = Path(__file__).resolve().parent / "results"
CLASSES = ("realtime", "interactive", "batch", "background")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def stress(result: str = "stress.json", command: str = "python bench/bench_stress.py") -> str:
    path = RESULTS / result
    if not path.is_file():
        return f"_No stress run yet: `{command}`._"
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    s = data["meta"]["settings"]
    lines = [
        f"{len(data['scenarios'])} stress scenarios, every policy, {s['seeds']} seeds each at "
        f"the scenario's device size ({data['runs']} runs, {data['wall_s']:.0f} s wall). "
        f"{meta_line(data['meta'])}.",
        "",
        "| scenario | policy | realtime | interactive | batch | background | OOMs per run "
        "| most OOMs of one service in a run | most preemptions of one request "
        "| starved s per run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, scn in data["scenarios"].items():
        for policy, r in scn["policies"].items():
            cells = [_pct(r["classes"].get(c)) for c in CLASSES]
            shown = f"**{policy}**" if policy == "accelmux" else policy
            lines.append(
                f"| {name} | {shown} | "
                + " | ".join(cells)
                + f" | {_num(r['oom_events'])} | {r['max_ooms_per_service']} | "
                f"{r['max_preemptions_per_request']} | {_num(r['starved_s'], 0)} |"
            )
    return "\n".join(lines)


#: The four failure classes of the robustness work alone, at 3 seeds (a run that fits a
#: shared machine between the full runs).
FAILURE_CLASSES = "stress-failure-classes.json"
FAILURE_CLASSES_COMMAND = (
    "python bench/bench_stress.py --scenarios oom-while-full,three-llms-cameras,"
    "voice-beside-llms-host,night-indexing-beside-chat --seeds 3 "
    "--out bench/results/stress-failure-classes.json"
)

BLOCKS: dict[str, Callable[[], str]] = {
    "stress": stress,
    "stress-failure-classes": lambda: stress(FAILURE_CLASSES, FAILURE_CLASSES_COMMAND),
}
