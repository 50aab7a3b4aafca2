"""The simulator tables of docs/benchmarks.md, rendered from ``bench/results/sim-*.json``.

Blocks: ``sim-<scenario>`` (accelmux against each baseline at its best variant),
``sim-sensitivity`` (every variant of every configurable baseline) and ``sim-margins``
(accelmux minus the best baseline per class). ``bench/bench_sim.py`` writes the JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from meta import meta_line

from accelmux.sim.report import P99_MIN_SAMPLES, response_samples

RESULTS = Path(__file__).resolve().parent / "results"
SCENARIOS = ("home-evening", "burst", "small-gpu", "shared-memory-host")
CLASSES = ("realtime", "interactive", "batch", "background")
PLAIN = ("accelmux", "independent", "static")


def _report(scenario: str) -> dict[str, Any]:
    path = RESULTS / f"sim-{scenario}.json"
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}" if x != int(x) else f"{int(x)}"


def _att(result: dict[str, Any], cls: str) -> float | None:
    value: float | None = (result["classes"].get(cls) or {}).get("slo_attainment")
    return value


def _latency(result: dict[str, Any]) -> tuple[str, str]:
    cls = result["classes"].get("interactive") or {}
    if cls.get("p50_s") is None:
        return "-", "-"
    n = response_samples(cls)
    p50 = f"{cls['p50_s']:.2f} (n={n:.0f})"
    p99 = f"{cls['p99_s']:.2f}" if n >= P99_MIN_SAMPLES and cls.get("p99_s") is not None else "-"
    return p50, p99


def lineup(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(row label, result key): accelmux, the plain baselines, each family at its best
    variant, the oracle."""
    rows = [(p, p) for p in PLAIN if p in report["results"]]
    for fam, sens in report.get("sensitivity", {}).items():
        best = sens["best"]
        label = fam if best == fam else f"{best} (best of {len(sens['variants'])})"
        rows.append((label, best))
    if "oracle" in report["results"]:
        rows.append(("oracle", "oracle"))
    return rows


COLUMNS = (
    "policy",
    "realtime",
    "interactive",
    "batch",
    "background",
    "voice e2e",
    "interactive p50 s (n/seed)",
    "interactive p99 s",
    "OOMs",
    "rejected",
    "cold starts",
    "batch in window",
    "smallest GiB",
)


def _table(header: tuple[str, ...], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def render_scenario(scenario: str) -> str:
    report = _report(scenario)
    body = []
    for label, key in lineup(report):
        r = report["results"][key]
        chains = r.get("chains") or {}
        voice = next(iter(chains.values()), {}) if chains else {}
        smallest = r.get("smallest_device_gib")
        swept = key in report.get("sweep_policies", [key])
        p50, p99 = _latency(r)
        body.append(
            [
                f"`{label}`",
                *(_pct(_att(r, c)) for c in CLASSES),
                _pct(voice.get("slo_attainment")),
                p50,
                p99,
                _num(r["oom_events"]),
                _num(sum(r["rejections"].values())),
                _num(r["cold_starts"]),
                _pct(r["batch_done_in_window"]),
                ("-" if smallest is None else f"{smallest:g}") if swept else "not swept",
            ]
        )
    err = report.get("estimate_error", {})
    head = (
        f"{report['capacity_gib']:g} GiB, {report['duration_s']:g} s simulated, "
        f"{report['seeds']} seeds (device sweep {report['sweep_seeds']} seeds per size), "
        f"estimate error {'on' if err.get('enabled') else 'off'}; SLO attainment is the "
        f"mean over seeds, target {100 * report['slo_target']:g}%. "
        + (f"Run: {meta_line(report['meta'])}." if "meta" in report else "")
    )
    return f"{head}\n\n{_table(COLUMNS, body)}"


def render_sensitivity() -> str:
    parts = []
    header = ("scenario", "variant", "realtime", "interactive", "mean", "OOMs", "rejected")
    for fam in ("ollama+containers", "llama-swap"):
        body = []
        for scenario in SCENARIOS:
            report = _report(scenario)
            sens = report.get("sensitivity", {}).get(fam)
            if sens is None:
                continue
            for variant, v in sens["variants"].items():
                r = report["results"][variant]
                mark = " **best**" if variant == sens["best"] else ""
                body.append(
                    [
                        scenario,
                        f"`{variant}`{mark}",
                        _pct(_att(r, "realtime")),
                        _pct(_att(r, "interactive")),
                        _pct(v["score"]),
                        _num(v["oom_events"]),
                        _num(sum(r["rejections"].values())),
                    ]
                )
        parts.append(f"**{fam}**\n\n{_table(header, body)}")
    return "\n\n".join(parts)


def _margin(mine: float, best: float, who: str) -> str:
    points = round(100.0 * (mine - best), 1) + 0.0  # + 0.0: no "-0.0"
    return f"{points:+.1f} pts vs `{who}`"


def render_margins() -> str:
    header = ("scenario", *CLASSES, "voice e2e")
    body = []
    for scenario in SCENARIOS:
        report = _report(scenario)
        results = report["results"]
        ours = results["accelmux"]
        baselines = [key for label, key in lineup(report) if key not in ("accelmux", "oracle")]
        cells = [scenario]
        for cls in CLASSES:
            mine = _att(ours, cls)
            theirs = [(_att(results[b], cls), b) for b in baselines]
            present = [(v, b) for v, b in theirs if v is not None]
            if mine is None or not present:
                cells.append("-")
                continue
            best_v, best_b = max(present, key=lambda vb: vb[0])
            cells.append(_margin(mine, best_v, best_b))
        voice = [
            (next(iter((results[b].get("chains") or {}).values()), {}).get("slo_attainment"), b)
            for b in baselines
        ]
        mine_voice = next(iter((ours.get("chains") or {}).values()), {}).get("slo_attainment")
        present_voice = [(v, b) for v, b in voice if v is not None]
        if mine_voice is None or not present_voice:
            cells.append("-")
        else:
            best_v, best_b = max(present_voice, key=lambda vb: vb[0])
            cells.append(_margin(mine_voice, best_v, best_b))
        body.append(cells)
    return _table(header, body)


BLOCKS: dict[str, Callable[[], str]] = {
    **{f"sim-{s}": partial(render_scenario, s) for s in SCENARIOS},
    "sim-sensitivity": render_sensitivity,
    "sim-margins": render_margins,
}
