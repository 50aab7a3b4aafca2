"""The README's first-run figures from ``bench/results/setup.json`` (bench/bench_setup.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from docgen import RESULTS
from meta import meta_line

LABELS = {
    "first_run": "first `scripts/run`, until `/v1/models` answers",
    "first_test": "first `scripts/test`",
    "second_test": "second `scripts/test`",
}


def _load() -> dict[str, Any]:
    return dict(json.loads((RESULTS / "setup.json").read_text(encoding="utf-8")))


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _load_avg(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def _build_seconds(steps: list[dict[str, Any]]) -> float | None:
    """Seconds from setup-models' "building llama.cpp's libraries" to its "packing" line."""
    at = {}
    for step in steps:
        for key in ("building llama.cpp", "packing the llama-cpp-python"):
            if step["step"].startswith(f"setup-models: {key}"):
                at[key] = float(step["at_s"])
    if len(at) < 2:
        return None
    return at["packing the llama-cpp-python"] - at["building llama.cpp"]


def setup() -> str:
    report = _load()
    measured = report.get("measurements", {})
    targets = report["targets_s"]
    lines = [
        "| on a fresh clone, empty caches | took | target | load average before "
        "(1 / 5 / 15 min) | after |",
        "| --- | ---: | ---: | --- | --- |",
    ]
    runs = []
    for name, label in LABELS.items():
        m = measured.get(name)
        if m is None or not m.get("measured"):
            lines.append(f"| {label} | not measured | {_minutes(targets[name])} | | |")
            continue
        took = _minutes(m["seconds"]) if m.get("seconds") is not None else "did not finish"
        if not m.get("ok"):
            took += " (failed)"
        lines.append(
            f"| {label} | {took} | {_minutes(targets[name])} | "
            f"{_load_avg(m['load_avg_before'])} | {_load_avg(m['load_avg_after'])} |"
        )
        build = _build_seconds(m.get("steps", []))
        built = f"; compiling llama.cpp took {_minutes(build)} of it" if build is not None else ""
        runs.append(f"{label}: {meta_line(m['meta'])}{built}")
    lines += ["", *[f"- {run}" for run in runs]]
    lines.append("")
    lines.append(
        "`python bench/bench_setup.py [--measure run|test|all]`; the load average is the "
        "machine's (a build on a shared machine takes longer)."
    )
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"setup": setup}
