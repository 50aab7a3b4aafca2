"""A plan as a side-by-side text table (``accelmux plan``; ``--json`` gives the data)."""

from __future__ import annotations

from typing import Any

from accelmux.core.types import GIB
from accelmux.plan.engine import Plan, oom_risk

CLASS_ORDER = ("realtime", "interactive", "batch", "background")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GIB:.2f} GiB"


def _bar(bars: dict[str, Any], cls: str, key: str, unit: str) -> str:
    value = (bars.get("classes", {}).get(cls) or {}).get(key)
    if value is None:
        return ""
    return f" ±{value:.0f}{unit}"


def _class_rows(plan: Plan) -> list[tuple[str, list[str]]]:
    classes = [c for c in CLASS_ORDER if any(c in col.classes for col in plan.columns)]
    bars = plan.error_bars
    rows: list[tuple[str, list[str]]] = []
    for cls in classes:
        att, lat, n = [], [], []
        for col in plan.columns:
            f = col.classes.get(cls) or {}
            sim = col.kind != "recorded"
            att.append(
                _pct(f.get("attainment"))
                + (_bar(bars, cls, "attainment_pts", " pts") if sim else "")
            )
            p95 = f.get("p95_s")
            p95_text = _s(p95) if p95 is not None else "too few"
            lat.append(
                f"{_s(f.get('p50_s'))} / {p95_text}"
                + (_bar(bars, cls, "p95_pct", " %") if sim and p95 is not None else "")
            )
            waiting = f.get("waiting_at_end") or 0
            n.append(str(f.get("requests", 0)) + (f" (+{waiting:g} waiting)" if waiting else ""))
        rows += [(f"{cls} attainment", att), (f"{cls} p50 / p95", lat), (f"{cls} requests", n)]
    return rows


def _memory_rows(plan: Plan) -> list[tuple[str, list[str]]]:
    devices = sorted({d for col in plan.columns for d in col.memory})
    peak_bar = plan.error_bars.get("memory_peak_pct")
    rows: list[tuple[str, list[str]]] = []
    for dev in devices:
        peaks, left = [], []
        for col in plan.columns:
            m = col.memory.get(dev) or {}
            bar = f" ±{peak_bar:.0f} %" if peak_bar is not None and col.kind != "recorded" else ""
            peaks.append(_gib(m.get("peak")) + (bar if m.get("peak") is not None else ""))
            left.append(f"{_gib(m.get('budget_left_at_peak'))} of {_gib(m.get('budget'))}")
        rows += [(f"{dev} memory peak", peaks), (f"{dev} budget left at peak", left)]
    return rows


def _decision_rows(plan: Plan) -> list[tuple[str, list[str]]]:
    rows: list[tuple[str, list[str]]] = []
    for key, label in (
        ("cold_starts", "cold starts"),
        ("evictions", "evictions"),
        ("loads", "loads"),
    ):
        rows.append((label, [f"{col.decisions.get(key, 0):g}" for col in plan.columns]))
    rows.append(("OOM risk", [oom_risk(col) for col in plan.columns]))
    suffer = []
    for col in plan.columns:
        f = col.first_to_suffer
        if f is None:
            suffer.append("-")
        elif f["service"] is None:
            suffer.append("none")
        else:
            missed = sum(f["newly_missed"].values())
            suffer.append(f"{f['service']} at {f['at_s'] / 60:.1f} min ({missed} miss)")
    rows.append(("first to suffer", suffer))
    return rows


def text(plan: Plan) -> str:
    head = [
        col.label + ("" if col.kind == "recorded" else f" [{col.policy}]") for col in plan.columns
    ]
    rows = [("", head)]
    rows += _class_rows(plan) + _memory_rows(plan) + _decision_rows(plan)
    widths = [max(len(r[0]) for r in rows)] + [
        max(len(r[1][i]) for r in rows) for i in range(len(plan.columns))
    ]
    lines = [
        f"accelmux plan: {plan.source}: {plan.requests} requests over {plan.span_s / 60:.1f} min"
    ]
    for label, cells in rows:
        lines.append(
            "  ".join(
                [label.ljust(widths[0])]
                + [c.rjust(w) for c, w in zip(cells, widths[1:], strict=True)]
            )
        )
    if plan.error_bars:
        lines.append(
            "± : the simulator's error measured against the real stack "
            f"({plan.error_bars.get('source', 'docs/benchmarks.md')})"
        )
    else:
        lines.append("no measured error bars are shipped with this version")
    for col in plan.columns:
        for note in col.notes:
            lines.append(f"note ({col.label}): {note}")
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)
