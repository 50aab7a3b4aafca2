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


def _interval(ci: list[float] | None) -> str:
    return f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else ""


def _cell(row: dict[str, Any]) -> str:
    ratio = row.get("ratio_p95")
    fails = f", {row['fail']} failed" if row.get("fail") else ""
    if ratio is None:
        return f"{row['p95_s'] * 1000:.0f} ms{fails}"
    interval = _interval(row.get("ratio_p95_ci"))
    return f"{row['p95_s'] * 1000:.0f} ms (**{ratio:.2f}x**{interval}){fails}"


def _p50_line(setups: dict[str, Any]) -> str:
    """The p50 ratios of accelmux, with their intervals (the p95's tail is a few
    requests; the median says whether the load slows every request)."""
    cells = []
    for kind in ("stt", "tts"):
        for case in ("chat", "embed"):
            row = setups["accelmux"][case][kind]
            ratio = row.get("ratio_p50")
            if ratio is not None:
                interval = _interval(row.get("ratio_p50_ci"))
                cells.append(f"{kind.upper()} + {case} **{ratio:.2f}x**{interval}")
    return "accelmux p50 under the load / p50 alone: " + ", ".join(cells) + "." if cells else ""


def wyoming() -> str:
    report = _load()
    setups = report["setups"]
    n = report["meta"]["settings"]["requests_per_case"]
    blocks = report["meta"]["settings"].get("blocks", 1)
    lines = [
        f"p95 latency of {n} requests per cell ({blocks} alternated block(s)), measured by "
        "`wyoming-bench` (non-streaming); in parentheses: p95 under the load / p95 alone, "
        "with its 95 % bootstrap interval.",
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
    p50 = _p50_line(setups)
    lines += [
        "",
        *([p50, ""] if p50 else []),
        f"accelmux alone / reference alone (p95): STT **{alone['stt']:.2f}x**, "
        f"TTS **{alone['tts']:.2f}x**.",
        "",
        f"Run: {meta_line(report['meta'])}, 1-minute load average at start "
        f"{report['meta']['machine']['load_avg_1m']}.",
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"wyoming": wyoming}
