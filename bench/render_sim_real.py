"""Doc blocks of the sim-to-real benchmark (``bench/results/sim_real.json``), and the
error bars ``accelmux plan`` prints (``src/accelmux/plan/error_bars.json``), made from
the same JSON (a test keeps the two in step)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meta import meta_line
from render_bench import Report, load

ROOT = Path(__file__).resolve().parents[1]
ERROR_BARS = ROOT / "src" / "accelmux" / "plan" / "error_bars.json"
MIB = 2**20
CLASS_ORDER = ("realtime", "interactive", "batch", "background")
WORKLOADS = (
    ("calibration", "calibration workload"),
    ("unseen", "unseen workload"),
    ("seen", "second workload (looked at while the cost model was built)"),
)
#: The targets of issue 36: p95 within 15 %, attainment within 2 points, memory peak 5 %.
TARGETS = {"p95_pct": 15.0, "attainment_pts": 2.0, "memory_peak_pct": 5.0}


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "-"
    return f"{100 * x:+.1f} %" if signed else f"{100 * x:.1f} %"


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def _pts(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}"


def _mark(value: float | None, limit: float, unit: str = "") -> str:
    """The value, bold when it misses its target."""
    if value is None:
        return "-"
    text = f"{value:+.1f}{unit}"
    return text if abs(value) <= limit else f"**{text}**"


def _load(run: dict[str, Any]) -> str:
    la = run.get("load_average") or {}

    def one(x: float | None) -> str:
        return "?" if x is None else f"{x:.1f}"

    return (
        f"load average (1 min) {one(la.get('mean_1m'))} mean, {one(la.get('max_1m'))} max "
        "during the run"
    )


def _side_rows(groups: dict[str, Any], names: list[str]) -> list[str]:
    rows = []
    for name in names:
        g = groups.get(name)
        if g is None:
            continue
        r, s, e = g["real"], g["sim"], g["error"]
        p95 = None if e["p95_rel"] is None else 100 * e["p95_rel"]
        rows.append(
            f"| {name} | {r.get('requests', 0)} | {_s(r.get('p50_s'))} / {_s(s.get('p50_s'))} "
            f"| {_pct(e['p50_rel'])} | {_s(r.get('p95_s'))} / {_s(s.get('p95_s'))} "
            f"| {_mark(p95, TARGETS['p95_pct'], ' %')} "
            f"| {_pct(r.get('attainment'), False)} / {_pct(s.get('attainment'), False)} "
            f"| {_mark(e['attainment_pts'], TARGETS['attainment_pts'])} "
            f"| {_s(r.get('queue_mean_s'))} / {_s(s.get('queue_mean_s'))} |"
        )
    return rows


HEADER = [
    "| | requests | p50 real / sim | p50 error | p95 real / sim | p95 error | attainment "
    "real / sim | attainment error (pts) | mean queue wait real / sim |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
]


def _per(
    report: Report, part: str, noun: str, order: Callable[[dict[str, Any]], list[str]]
) -> list[str]:
    """Per workload, the side-by-side table of its ``part`` (classes or services); a
    class table is followed by the workload's run note."""
    lines: list[str] = []
    for key, title in WORKLOADS:
        w = report["workloads"].get(key)
        if w is None:
            continue
        rows = w["result"][part]
        lines += [f"**{title.capitalize()}**, per {noun}:", "", *HEADER]
        lines += _side_rows(rows, order(rows))
        lines += ["", _run_note(w, key), ""] if part == "classes" else [""]
    return lines


def classes(report: Report) -> str:
    lines = _per(report, "classes", "class", lambda _rows: list(CLASS_ORDER))
    lines.append(_targets_note())
    return "\n".join(lines).rstrip() + "\n"


def services(report: Report) -> str:
    return "\n".join(_per(report, "services", "service", sorted)).rstrip() + "\n"


def memory_decisions(report: Report) -> str:
    lines = [
        "| workload | memory peak real / sim (MiB) | error | loads real / sim | cold starts "
        "| evictions | pauses | decision agreement |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, title in WORKLOADS:
        w = report["workloads"].get(key)
        if w is None:
            continue
        result = w["result"]
        real, sim = result["decisions"]["real"]["total"], result["decisions"]["sim"]["total"]

        def pair(k: str, real: dict[str, Any] = real, sim: dict[str, Any] = sim) -> str:
            return f"{real.get(k, 0)} / {sim.get(k, 0)}"

        for dev, m in result["memory"].items():
            err = None if m["peak_rel"] is None else 100 * m["peak_rel"]
            mark = _mark(err, TARGETS["memory_peak_pct"], " %")
            lines.append(
                f"| {title} ({dev}) | {m['real_peak'] / MIB:,.0f} / "
                f"{(m['sim_peak'] or 0) / MIB:,.0f} | {mark} "
                f"| {pair('loads')} | {pair('cold_starts')} | {pair('evictions')} "
                f"| {pair('pauses')} | {_pct(result['agreement'], False)} |"
            )
    lines += [
        "",
        "Memory peak: the most the services held at one memory sample (every second), after "
        "the workload began. Loads, cold starts (loads a request waited for), evictions "
        "(unloads that made room) and pauses: counted from the decisions of both sides. "
        "Decision agreement: the share of requests the Manager first treated the same way "
        "in both (dispatched at once, told to wait for the same reason, or refused for the "
        "same reason).",
    ]
    return "\n".join(lines) + "\n"


def predict(report: Report) -> str:
    p = report.get("predict")
    if not p:
        return "Not run yet.\n"
    predicted = p["predicted"]["plan"]["columns"][-1]
    measured = p["measured"]["columns"][0]
    lines = [
        f"Change: **{p['change']}** on the calibration workload. Predicted with `accelmux plan` "
        f"from the calibration run's history ({meta_line(p['predicted']['meta'])}), then "
        f"measured on the real stack with that budget ({meta_line(p['run']['meta'])}; "
        f"{_load(p['run'])}).",
        "",
        "| | predicted | measured | error |",
        "|---|---:|---:|---:|",
    ]
    for cls in CLASS_ORDER:
        a, b = predicted["classes"].get(cls), measured["classes"].get(cls)
        if not a or not b:
            continue
        for key, label in (("attainment", "attainment"), ("p50_s", "p50"), ("p95_s", "p95")):
            x, y = a.get(key), b.get(key)
            if key == "attainment":
                err = "-" if x is None or y is None else f"{100 * (x - y):+.1f} pts"
                lines.append(f"| {cls} {label} | {_pct(x, False)} | {_pct(y, False)} | {err} |")
            else:
                err = "-" if x is None or y is None or not y else f"{100 * (x - y) / y:+.1f} %"
                lines.append(f"| {cls} {label} | {_s(x)} | {_s(y)} | {err} |")
    for dev, m in predicted["memory"].items():
        real = measured["memory"].get(dev, {}).get("peak")
        err = "-" if not real else f"{100 * (m['peak'] - real) / real:+.1f} %"
        peaks = f"{m['peak'] / MIB:,.0f} MiB | {(real or 0) / MIB:,.0f} MiB"
        lines.append(f"| {dev} memory peak | {peaks} | {err} |")
    for key in ("loads", "cold_starts", "evictions", "pauses"):
        x, y = predicted["decisions"].get(key, 0), measured["decisions"].get(key, 0)
        lines.append(f"| {key.replace('_', ' ')} | {x:g} | {y:g} | {x - y:+g} |")
    f = predicted.get("first_to_suffer") or {}
    lines += [
        "",
        f"The plan named **{f.get('service') or 'no service'}** as the first to suffer "
        f"(newly missing: {json.dumps(f.get('newly_missed', {}))}).",
    ]
    return "\n".join(lines) + "\n"


def _run_note(w: dict[str, Any], key: str) -> str:
    run = w["run"]
    cal = "its own profiles" if key == "calibration" else "the calibration run's profiles"
    minutes = w.get("measured_s", 0) / 60
    return (
        f"{minutes:.0f} minutes measured; replay calibrated from {cal}. Real run: "
        f"{meta_line(run['meta'])}; {_load(run)}. Replay: {w.get('replay_wall_s', '?')} s."
    )


def _targets_note() -> str:
    return (
        f"Errors are (sim - real) / real; bold where a target is missed (p95 within "
        f"{TARGETS['p95_pct']:g} %, attainment within {TARGETS['attainment_pts']:g} points; "
        "a p95 needs 20 served requests on both sides). "
        "`python bench/bench_sim_real.py report ...` (the module docstring has every step)."
    )


# ---- the error bars a plan prints --------------------------------------------------------
def error_bars(report: Report) -> dict[str, Any]:
    """The largest error over the workloads, per class and for the memory peak, rounded
    up: what ``accelmux plan`` prints after each simulated figure."""
    classes: dict[str, dict[str, float]] = {}
    memory = 0.0
    for key, _ in WORKLOADS:
        w = report["workloads"].get(key)
        if w is None:
            continue
        for cls, side in w["result"]["classes"].items():
            e = side["error"]
            bars = classes.setdefault(cls, {})
            for name, value, scale in (
                ("p50_pct", e["p50_rel"], 100.0),
                ("p95_pct", e["p95_rel"], 100.0),
                ("attainment_pts", e["attainment_pts"], 1.0),
            ):
                if value is not None:
                    bars[name] = max(bars.get(name, 0.0), math.ceil(abs(value) * scale))
        for m in w["result"]["memory"].values():
            if m["peak_rel"] is not None:
                memory = max(memory, math.ceil(abs(m["peak_rel"]) * 100))
    commit = str(report.get("meta", {}).get("commit", "?"))[:10]
    return {
        "source": f"docs/benchmarks.md, sim to real; bench/results/sim_real.json at {commit}",
        "classes": classes,
        "memory_peak_pct": memory,
    }


def write_error_bars(report: Report) -> None:
    ERROR_BARS.write_text(json.dumps(error_bars(report), indent=1, sort_keys=True) + "\n")


def gil(report: Report) -> str:
    """bench/results/gil.json: how much of each model's call leaves the lock free."""
    lines = [
        "| model (one call) | took | a Python thread beside it | a process beside it "
        "| the call leaves the lock free |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in report["models"]:
        free = r["lock_free_share"]
        lines.append(
            f"| {r['model']} | {r['call_s']:.2f} s | {r['thread_speed']:.0%} | "
            f"{r['process_speed']:.0%} | {'-' if free is None else f'{free:.0%}'} |"
        )
    lines += [
        "",
        "Speeds of a counting thread (same process) and a counting process during the "
        "call, relative to their speeds alone; the thread's over the process's is the share "
        "of the call that leaves the interpreter lock free. Medians over "
        f"{report['meta']['settings'].get('repeat', '?')} calls. Run: "
        f"{meta_line(report['meta'])}; `python bench/bench_gil.py`.",
    ]
    return "\n".join(lines) + "\n"


def _block(fn: Callable[[Report], str]) -> Callable[[], str]:
    return lambda: fn(load("sim_real"))


BLOCKS: dict[str, Callable[[], str]] = {
    "sim-real-classes": _block(classes),
    "sim-real-services": _block(services),
    "sim-real-memory": _block(memory_decisions),
    "sim-real-predict": _block(predict),
    "sim-real-gil": lambda: gil(load("gil")),
}
