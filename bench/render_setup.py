"""The README's setup figures from ``bench/results/setup.json`` (bench/bench_setup.py)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

from docgen import RESULTS
from meta import meta_line

LABELS = {
    "fast_cold": "`scripts/test --fast`, empty caches",
    "fast": "`scripts/test --fast`, pip cache warm",
    "first_run": "first `scripts/run`, until `/v1/models` answers",
    "first_test": "first `scripts/test`",
    "second_test": "second `scripts/test`",
    "wheel": "the wheel: `pip install`, `accelmux setup`, `serve` until `/v1/models` answers",
}
#: (what, the step it starts at, the step it ends at), by the prefix of each ``==`` line;
#: the older scripts' names are kept for measurements taken before ``accelmux setup``.
PARTS = (
    ("installing `.[dev]`", ("installing accelmux with its test tools into",), ("ruff",)),
    ("the fast tier", ("fast tier first",), ("fast tier passed",)),
    (
        "compiling llama.cpp",
        ("setup: building llama.cpp", "setup-models: building llama.cpp"),
        ("setup: packing", "setup-models: packing"),
    ),
    (
        "llama-server, built or found beside the parallel tests (read when they end)",
        ("llama-server for tests/external, building",),
        ("llama-server ready",),
    ),
    (
        "building llama-server",
        ("setup-llama-server: building",),
        ("setup-llama-server: llama-server at",),
    ),
    (
        "the parallel tests",
        ("pytest (rest; the tests that may share",),
        ("parallel tests done",),
    ),
    ("the serial tests", ("pytest (rest; the serial",), ()),
    ("accelmux setup", ("accelmux setup",), ("accelmux serve",)),
)


def _load() -> dict[str, Any]:
    return dict(json.loads((RESULTS / "setup.json").read_text(encoding="utf-8")))


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _load_avg(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def _part_seconds(
    m: dict[str, Any], starts: tuple[str, ...], ends: tuple[str, ...]
) -> float | None:
    """Seconds from the first step starting with one of ``starts`` to the next step
    after it starting with one of ``ends`` (no ``ends``: the end of the run)."""
    steps = m.get("steps", [])
    begin = next((i for i, s in enumerate(steps) if s["step"].startswith(starts)), None)
    if begin is None:
        return None
    if not ends:
        return float(m["seconds"]) - float(steps[begin]["at_s"])
    after = steps[begin + 1 :]
    end = next((s for s in after if s["step"].startswith(ends)), None)
    return None if end is None else float(end["at_s"]) - float(steps[begin]["at_s"])


def _parts(m: dict[str, Any]) -> str:
    found = []
    for what, starts, ends in PARTS:
        seconds = _part_seconds(m, starts, ends)
        if seconds is not None:
            found.append(f"{what} {_duration(seconds)}")
    return f"; of it: {', '.join(found)}" if found else ""


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
        target = targets.get(name)
        shown_target = _duration(target) if target is not None else "-"
        m = measured.get(name)
        if m is None or not m.get("measured"):
            why = f" ({m['reason']})" if m is not None and m.get("reason") else ""
            lines.append(f"| {label} | not measured{why} | {shown_target} | | |")
            continue
        took = _duration(m["seconds"]) if m.get("seconds") is not None else "did not finish"
        if m.get("exit_code") == -signal.SIGKILL:
            # bench_setup stops a command at its --timeout-s or the run's --total-s
            took = f"over {took} (stopped at the time bound)"
        elif not m.get("ok"):
            took += " (failed)"
        lines.append(
            f"| {label} | {took} | {shown_target} | "
            f"{_load_avg(m['load_avg_before'])} | {_load_avg(m['load_avg_after'])} |"
        )
        runs.append(f"{label}: {meta_line(m['meta'])}{_parts(m)}")
    lines += ["", *[f"- {run}" for run in runs]]
    lines.append("")
    lines.append(
        "`python bench/bench_setup.py [--measure run|fast|test|wheel|all ...]`; every cache is "
        "empty (`HOME`, `XDG_*`, pip's, the llama.cpp wheel cache), except the pip cache of "
        "the warm fast-tier row, kept from the empty-cache row before it; the load average "
        "is the machine's (a build on a shared machine takes longer)."
    )
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {"setup": setup}
