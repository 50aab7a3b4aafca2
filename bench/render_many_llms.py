"""The many-LLM tables of docs/benchmarks.md, from bench/results/many_llms.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meta import meta_line

RESULTS = Path(__file__).resolve().parent / "results"
LLMS = ("chat", "coder", "quick", "voice-llm")
BASELINES = ("ollama+containers", "llama-swap")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _load() -> dict[str, Any] | None:
    path = RESULTS / "many_llms.json"
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _label(name: str, whole: str) -> str:
    if name == "accelmux":
        return "**accelmux**"
    if name == whole:
        return "accelmux, whole-model swapping"
    return name


def scenario() -> str:
    data = _load()
    if data is None:
        return "_No run yet: `python bench/bench_many_llms.py`._"
    scn = data["scenario"]
    whole = data["whole_model_swapping"]
    lines = [
        f"`{scn['source']}` at {scn['capacity_gib']:g} GiB, {scn['seeds']} seeds; device sweep "
        f"with {scn['sweep_seeds']} seeds per size. {meta_line(data['meta'])}.",
        "",
        "| policy | realtime | interactive | "
        + " | ".join(LLMS)
        + " | cold starts | pauses | most pauses of one request | OOMs | "
        "smallest device for 99% |",
        "|---|---|---|" + "---|" * len(LLMS) + "---|---|---|---|---|",
    ]
    for name, r in scn["policies"].items():
        smallest = r["smallest_device_gib"]
        cells = [_pct((r["services"].get(s) or {}).get("slo_attainment")) for s in LLMS]
        lines.append(
            f"| {_label(name, whole)} | {_pct(r['classes'].get('realtime'))} | "
            f"{_pct(r['classes'].get('interactive'))} | "
            + " | ".join(cells)
            + f" | {_num(r['cold_starts'])} | {_num(r['pauses'])} | "
            f"{r['max_pauses_per_request']} | {_num(r['oom_events'])} | "
            f"{'-' if smallest is None else f'{smallest:g} GiB'} |"
        )
    mine = scn["policies"]["accelmux"]["smallest_device_gib"]
    swap = scn["policies"][whole]["smallest_device_gib"]
    if mine is not None and swap is not None:
        lines += [
            "",
            f"Smallest device for 99%: accelmux {mine:g} GiB, whole-model swapping {swap:g} GiB "
            f"({mine / swap:.2f}x).",
        ]
    elif mine is not None:
        lines += [
            "",
            f"Smallest device for 99%: accelmux {mine:g} GiB; whole-model swapping reaches 99% "
            "on no size of the sweep.",
        ]
    return "\n".join(lines)


def homes() -> str:
    data = _load()
    if data is None:
        return "_No run yet: `python bench/bench_many_llms.py`._"
    gen = data["generated"]
    whole = data["whole_model_swapping"]
    rows = gen["homes"]
    if not rows:
        return "_No generated home with two or more LLMs._"
    policies = list(rows[0]["policies"])

    def interactive(row: dict[str, Any], p: str) -> float | None:
        v = row["policies"].get(p) or {}
        x = v.get("interactive")
        return None if x is None else float(x)

    def mean(p: str) -> float | None:
        vals = [x for x in (interactive(r, p) for r in rows) if x is not None]
        return sum(vals) / len(vals) if vals else None

    scored = [r for r in rows if interactive(r, "accelmux") is not None]
    better = sum(
        1
        for r in scored
        if (interactive(r, "accelmux") or 0) >= (interactive(r, whole) or 0) - 0.01
    )
    best_base = 0
    for r in scored:
        base = max((interactive(r, b) or 0.0) for b in BASELINES if b in r["policies"])
        if (interactive(r, "accelmux") or 0) >= base - 0.01:
            best_base += 1
    rt_ok = sum(
        1
        for r in rows
        if (r["policies"]["accelmux"].get("realtime") or 1.0)
        >= max((r["policies"][b].get("realtime") or 0.0) for b in BASELINES)
    )
    lines = [
        f"{gen['count']} generated homes with two or more LLMs (from seed {gen['first_seed']}, "
        f"{gen['seeds']} seeds each), every LLM in accelmux's worker and the host's page cache "
        "modelled for every policy.",
        "",
        "| policy | mean interactive |",
        "|---|---|",
    ]
    for p in policies:
        lines.append(f"| {_label(p, whole)} | {_pct(mean(p))} |")
    lines += [
        "",
        f"- accelmux within 1 point of whole-model swapping or better: {better} of {len(scored)} "
        "homes;",
        f"- accelmux within 1 point of the best baseline or better (interactive): {best_base} of "
        f"{len(scored)};",
        f"- accelmux realtime at least every baseline's: {rt_ok} of {len(rows)}.",
    ]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"many-llms": scenario, "many-llms-homes": homes}
