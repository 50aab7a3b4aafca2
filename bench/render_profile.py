"""The generated block of docs/benchmarks.md for ``bench/results/gateway_profile.json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from docgen import RESULTS
from meta import meta_line


def _load() -> dict[str, Any]:
    return dict(json.loads((RESULTS / "gateway_profile.json").read_text(encoding="utf-8")))


def gateway_profile() -> str:
    report = _load()
    layers = [row["layer"] for row in report["layers"]]
    what = {row["layer"]: row["what"] for row in report["layers"]}
    stacks = report["stacks"]
    columns = [(stack, route) for stack, routes in stacks.items() for route in routes]
    lines = [
        "| layer | "
        + " | ".join(
            f"{route} ({'aiohttp' if stack == 'aiohttp' else 'hot path'})"
            for stack, route in columns
        )
        + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for layer in layers:
        cells = []
        for stack, route in columns:
            row = stacks[stack][route]
            us = row["layers_us"].get(layer, 0.0)
            cells.append(f"{us:.0f} ({us / row['cpu_us_per_request']:.0%})")
        lines.append(f"| {layer}: {what[layer]} | " + " | ".join(cells) + " |")
    totals = [f"**{stacks[s][r]['cpu_us_per_request']:.0f}**" for s, r in columns]
    lines.append("| **the event loop's CPU per request** | " + " | ".join(totals) + " |")
    settings = report["meta"]["settings"]
    load = report.get("loadavg_1m_before_after", ["?", "?"])
    lines += [
        "",
        f"Microseconds of the event loop thread's CPU per request (share of the total), "
        f"under cProfile (which slows Python code about twofold: read the shares), "
        f"{settings['requests']:,} requests per route, {settings['concurrency']} at a time. "
        f"Load average (1 min) before and after: {load[0]} and {load[1]}. Run: "
        f"{meta_line(report['meta'])}; `python bench/profile_gateway.py`.",
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"gateway-profile": gateway_profile}
