"""The generated block of docs/benchmarks.md for ``bench/results/connections.json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from docgen import RESULTS
from meta import meta_line


def _load() -> dict[str, Any]:
    return dict(json.loads((RESULTS / "connections.json").read_text(encoding="utf-8")))


def _ms(row: dict[str, Any], key: str) -> str:
    return f"{row[key]:.1f}" if key in row else "-"


def _answered(row: dict[str, Any]) -> str:
    statuses = row["statuses"]
    total = sum(statuses.values())
    others = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()) if s != "200")
    return f"{statuses.get('200', 0)}/{total}" + (f" ({others})" if others else "")


def connections() -> str:
    report = _load()
    idle = report["meta"]["settings"]["idle"]
    room, capped = report["room"], report["capped"]
    phases = [
        ("no other connection (max_connections 4096)", room["alone"]),
        (f"{idle} idle connections held (max_connections 4096)", room["with_idle"]["latency"]),
        (
            f"{idle} idle connections tried from one address (defaults: max_connections "
            "1000, 256 per address)",
            capped["latency"],
        ),
    ]
    lines = [
        "| while | /health p50 ms | /health p95 ms | TTS p50 ms | TTS p95 ms | answered 200 |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for label, row in phases:
        health, tts = row["health"], row["tts"]
        answered = f"health {_answered(health)}, TTS {_answered(tts)}"
        lines.append(
            f"| {label} | {_ms(health, 'p50_ms')} | {_ms(health, 'p95_ms')} "
            f"| {_ms(tts, 'p50_ms')} | {_ms(tts, 'p95_ms')} | {answered} |"
        )
    held = room["with_idle"]["census"]
    census = capped["census"]
    lines += [
        "",
        f"With room for them, {held['held']} of the {idle} idle connections were still open "
        "at the end. At the default cap: "
        f"{census['held']} held, {census['closed']} closed to make room for newer ones, "
        f"{census.get('refused_429', 0)} answered 429 `per_client_limit` (one address's "
        f"share), {census['refused_503']} answered 503 `too_many_connections`, "
        f"{census['failed']} failed to connect.",
        "",
        f"{report['meta']['settings']['requests_per_kind']} requests per kind and row, each on "
        f"a new connection, one at a time. Run: {meta_line(report['meta'])}, 1-minute load "
        f"average at start {report['meta']['machine']['load_avg_1m']}; "
        "`python bench/bench_connections.py`.",
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"connections": connections}
