"""The generated block of docs/benchmarks.md for ``bench/results/frontdoor.json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from docgen import RESULTS
from meta import meta_line

CONFIGS = {
    "defaults": "defaults (each body over its route's limit: 413 before it is read)",
    "raised": "body limits raised to 25 MiB (each body read, parsed and counted in the "
    "check process, refused by its item count)",
}


def _load() -> dict[str, Any]:
    return dict(json.loads((RESULTS / "frontdoor.json").read_text(encoding="utf-8")))


def _cell(figures: dict[str, Any], idle: bool) -> str:
    ms = f"{figures['p95_s'] * 1000:.0f} ms"
    return ms if idle else f"{ms} (**{figures['ratio_p95']:.2f}x**)"


def frontdoor() -> str:
    report = _load()
    settings = report["meta"]["settings"]
    lines = [
        f"p95 latency of {settings['samples']} TTS requests (`/v1/audio/speech`) and "
        f"{settings['samples']} Wyoming `describe` calls per row, sent one after the other "
        f"by a client process while an attacker process sends a valid "
        f"{settings['body_bytes'] / 2**20:.1f} MiB body to one route in a loop; in "
        "parentheses: p95 under attack / p95 idle (target: at most "
        f"{report['target_ratio']}x).",
        "",
        "| configuration | attacked route | bodies sent | daemon CPU | TTS p95 | describe p95 |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for config, label in CONFIGS.items():
        for row in report["configs"][config]:
            idle = row["route"] is None
            route = "none (idle)" if idle else f"`{row['route']}`"
            lines.append(
                f"| {label} | {route} | {row['attack_bodies']} | {row['daemon_cpu']:.2f} | "
                f"{_cell(row['tts'], idle)} | {_cell(row['describe'], idle)} |"
            )
    lines += [
        "",
        f"Worst ratio: **{report['worst_ratio_p95']:.2f}x**. Daemon CPU: its CPU time "
        "(with its body check process) over the case's wall time, 1.00 being one core.",
        "",
        f"Run: {meta_line(report['meta'])}, 1-minute load average at start "
        f"{report['meta']['machine']['load_avg_1m']}.",
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"frontdoor": frontdoor}
