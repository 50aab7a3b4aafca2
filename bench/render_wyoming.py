"""The generated block of docs/benchmarks.md for ``bench/results/wyoming.json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from docgen import RESULTS
from meta import meta_line

LABELS = {
    "reference": "wyoming-piper + wyoming-ovos-stt (no manager)",
    "accelmux": "accelmux `server.wyoming`",
}


def _load() -> dict[str, Any]:
    return dict(json.loads((RESULTS / "wyoming.json").read_text(encoding="utf-8")))


def _cell(row: dict[str, Any]) -> str:
    ratio = row.get("ratio_p95")
    fails = f", {row['fail']} failed" if row.get("fail") else ""
    if ratio is None:
        return f"{row['p95_s'] * 1000:.0f} ms{fails}"
    return f"{row['p95_s'] * 1000:.0f} ms (**{ratio:.2f}x**){fails}"


def wyoming() -> str:
    report = _load()
    setups = report["setups"]
    n = report["meta"]["settings"]["requests_per_case"]
    lines = [
        f"p95 latency of {n} requests per cell, measured by `wyoming-bench` (non-streaming); "
        "in parentheses: p95 under the load / p95 alone.",
        "",
        "| setup | STT alone | STT + chat | STT + embeddings | TTS alone | TTS + chat "
        "| TTS + embeddings |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for setup, label in LABELS.items():
        cases = setups[setup]
        cells = [_cell(cases[case][kind]) for kind in ("stt", "tts") for case in cases]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    alone = report["accelmux_vs_reference_alone"]
    lines += [
        "",
        f"accelmux alone / reference alone (p95): STT **{alone['stt']:.2f}x**, "
        f"TTS **{alone['tts']:.2f}x**.",
        "",
        f"Run: {meta_line(report['meta'])}, 1-minute load average at start "
        f"{report['meta']['machine']['load_avg_1m']}.",
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"wyoming": wyoming}
