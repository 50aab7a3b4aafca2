"""The real-stack many-LLM table of docs/benchmarks.md, from bench/results/stack_llms.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meta import meta_line

RESULTS = Path(__file__).resolve().parent / "results"
MIB = 2**20


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def stack_llms() -> str:
    path = RESULTS / "stack_llms.json"
    if not path.is_file():
        return "_No run yet: `python bench/bench_stack_llms.py`._"
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    voice = data["voice"]
    ratio = voice["ratio_p95"]
    lines = [
        f"Budget {data['budget_bytes'] / MIB:,.0f} MiB: every service at its KV floor "
        f"({data['floors_bytes'] / MIB:,.0f} MiB), the voice chain's working set "
        f"({data['voice_working_set_bytes'] / MIB:,.0f} MiB), one LLM request's "
        f"({data['llm_working_set_bytes'] / MIB:,.0f} MiB) and half of what the two LLM "
        f"pools may grow ({data['ceilings_above_floor_bytes'] / MIB:,.0f} MiB), plus the "
        f"headroom. {meta_line(data['meta'])}.",
        "",
        "| | n | p50 | p95 |",
        "|---|---|---|---|",
        f"| voice chain alone | {voice['alone']['n']} | {_s(voice['alone']['p50_s'])} | "
        f"{_s(voice['alone']['p95_s'])} |",
        f"| voice chain beside the two LLMs | {voice['loaded']['n']} | "
        f"{_s(voice['loaded']['p50_s'])} | {_s(voice['loaded']['p95_s'])} |",
    ]
    for model, t in data["ttft"].items():
        lines.append(
            f"| TTFT of `{model}` streams | {t['n']} | {_s(t['p50_s'])} | {_s(t['p95_s'])} |"
        )
    errors = data["stream_errors"]
    lines += [
        "",
        f"Voice p95 beside the two LLMs / alone: "
        f"{'-' if ratio is None else f'{ratio:.2f}x'} (p50 {voice['ratio_p50']:.2f}x). "
        f"{data['streams']} streams ended normally, {len(errors)} in an error; "
        f"{data['pauses']} pauses and {data['resumes']} resumes.",
    ]
    if errors:
        lines += ["", "Errors: " + "; ".join(f"`{e}`" for e in errors[:5])]
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"stack-llms": stack_llms}
