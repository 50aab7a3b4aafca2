"""Blocks of docs/benchmarks.md rendered from bench/results/suite.json, suite-holdout.json,
suite-foreign.json and ablation.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meta import meta_line

RESULTS = Path(__file__).resolve().parent / "results"
CLASSES = ("realtime", "interactive", "batch", "background")
WORST = 10


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def _pts(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:+.1f}"


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _signed(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:+.{digits}f}"


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _settings(data: dict[str, Any]) -> str:
    s = data["meta"]["settings"]
    return (
        f"{s['homes']} generated homes (seeds {s['first_home']}-"
        f"{s['first_home'] + s['homes'] - 1}), {s['seeds']} simulation seed(s) each, "
        f"{s['duration_s']:g} simulated seconds per run, {data['runs']} runs: "
        f"{data['wall_s']:.0f} s wall on {s['workers']} worker processes "
        f"({data['cpu_s']:.0f} CPU s; load average {data.get('load_avg_1m_after', '?')} "
        f"at the end). {meta_line(data['meta'])}."
    )


def _policy_means(data: dict[str, Any], means: dict[str, Any] | None = None) -> str:
    """The policy means table; with the foreign programs' columns when the run has them
    (results written before they were measured render as they did)."""
    means = data["policy_means"] if means is None else means
    foreign = all("foreign_starved_share" in m for m in means.values())
    rows = []
    for name, m in means.items():
        row = (
            [name]
            + [_pct(m[c]) for c in CLASSES]
            + [
                _num(m["oom_events_per_run"]),
                str(m["max_preemptions"]),
                _num(m["starvation_s"]),
                _num(m["longest_starved_s"]),
            ]
        )
        if foreign:
            row += [_pct(m["foreign_starved_share"]), _num(m["foreign_wait_s"])]
        rows.append(row)
    head = [
        "policy",
        *CLASSES,
        "OOMs per run",
        "most preemptions of one request",
        "starved s per run",
        "longest starved stretch s",
    ]
    if foreign:
        head += ["foreign program starved", "foreign wait s"]
    return _table(head, rows)


def _targets(data: dict[str, Any]) -> str:
    t = data["targets"]
    rt, it = t["realtime_not_below_any_baseline"], t["interactive_within_1_point"]
    right, wrong = t["ooms_with_right_estimates"], t["ooms_per_service_2x_wrong"]
    pre = t["largest_preemption_count"]
    return _table(
        ["target", "result", "met"],
        [
            [
                "realtime >= every baseline, every home",
                f"{rt['passed']} of {rt['homes']} homes",
                "yes" if rt["met"] else "**no**",
            ],
            [
                "interactive within 1 point of the best baseline in >= 95% of homes",
                f"{it['passed']} of {it['homes']} homes ({_pct(it['share'])})",
                "yes" if it["met"] else "**no**",
            ],
            [
                "... of the homes behind: by more than twice the standard error",
                f"{len(it.get('behind_beyond_noise', []))} of {it['homes'] - it['passed']}",
                "-",
            ],
            [
                "... of the homes behind: every baseline ahead had OOMs",
                f"{len(it.get('behind_only_baselines_with_ooms_ahead', []))} of "
                f"{it['homes'] - it['passed']}",
                "-",
            ],
            [
                "no OOM with right estimates",
                f"{right['homes_with_ooms']} of {right['homes']} homes had OOMs "
                f"({_num(right['oom_events_per_run'])} per run in all; besides, "
                f"{_num(right.get('unforeseen_foreign_per_run', 0))} per run from foreign "
                "memory that appeared between two samples)",
                "yes" if right["met"] else "**no**",
            ],
            [
                "at most 1 OOM per service per run, estimates 2x wrong",
                f"worst {wrong['worst_per_service_per_run']} in {wrong['homes']} homes; "
                f"{len(wrong['homes_over_one'])} over 1",
                "yes" if wrong["met"] else "**no**",
            ],
            [
                "largest preemption count of one request (livelock)",
                f"{pre['count']} ({pre['home']})",
                "-",
            ],
        ],
    )


def summary() -> str:
    data = _load("suite.json")
    if data is None:
        return "_No suite results yet: run `python bench/bench_suite.py`._"
    policies, targets = _policy_means(data), _targets(data)
    stress_rows = []
    for name, row in data["by_stress"].items():
        stress_rows.append(
            [
                name,
                str(row["homes"]),
                _pts(row["realtime_minus_best_baseline"]),
                _pts(row["interactive_minus_best_baseline"]),
                _pts(row["realtime_minus_oracle"]),
                _pts(row["interactive_minus_oracle"]),
                _num(row["accelmux_oom_events_per_run"], 2),
            ]
        )
    stresses = _table(
        [
            "stress",
            "homes",
            "realtime vs best baseline",
            "interactive vs best baseline",
            "realtime vs oracle",
            "interactive vs oracle",
            "accelmux OOMs per run",
        ],
        stress_rows,
    )
    return (
        f"{_settings(data)}\n\nSLO attainment per class, mean over homes (each home: mean "
        f"over seeds):\n\n{policies}\n\nTargets (accelmux):\n\n{targets}\n\n"
        f"accelmux minus the best baseline and minus the oracle, in points, mean over the "
        f"homes with each stress:\n\n{stresses}"
    )


def holdout() -> str:
    data = _load("suite-holdout.json")
    if data is None:
        return (
            "_No holdout results yet: run `python bench/bench_suite.py --first-home 100 "
            "--out bench/results/suite-holdout.json`._"
        )
    return (
        f"{_settings(data)}\n\nSLO attainment per class, mean over homes:\n\n"
        f"{_policy_means(data)}\n\nTargets (accelmux):\n\n{_targets(data)}"
    )


def foreign() -> str:
    data = _load("suite-foreign.json")
    if data is None:
        return (
            "_No results yet: run `python bench/bench_suite.py --kinds "
            "night-cameras,evening-game --homes 6 --out bench/results/suite-foreign.json`._"
        )
    s = data["meta"]["settings"]
    head = (
        f"{s['homes']} homes of each kind (seeds {s['first_home']}-"
        f"{s['first_home'] + s['homes'] - 1}), {s['seeds']} simulation seed(s) each, "
        f"{s['duration_s']:g} simulated seconds per run, {data['runs']} runs: "
        f"{data['wall_s']:.0f} s wall on {s['workers']} worker processes "
        f"({data['cpu_s']:.0f} CPU s). {meta_line(data['meta'])}."
    )
    parts = [head]
    for kind, means in data["by_kind"].items():
        parts.append(f"`{kind}`: SLO attainment per class, mean over homes:")
        parts.append(_policy_means(data, means))
        parts.append(_minus_best(data, kind, means))
    return "\n\n".join(parts)


def _minus_best(data: dict[str, Any], kind: str, means: dict[str, Any]) -> str:
    """accelmux minus the best baseline per class: against the baseline with the best mean,
    and the mean over homes of accelmux minus that home's best baseline."""
    homes = [h for h in data["homes"] if h["kind"] == kind]
    cells = []
    for cls in CLASSES:
        ours = means["accelmux"].get(cls)
        best = max(
            (
                (means[p][cls], p)
                for p in data["baselines"]
                if p in means and means[p].get(cls) is not None
            ),
            default=None,
        )
        per_home = [
            h["accelmux_minus_best_baseline"][cls]
            for h in homes
            if h["accelmux_minus_best_baseline"].get(cls) is not None
        ]
        if ours is None or best is None:
            continue
        home_mean = sum(per_home) / len(per_home) if per_home else None
        cells.append(
            f"{cls} {_pts(ours - best[0])} against `{best[1]}` "
            f"({_pts(home_mean)} against each home's best)"
        )
    return "accelmux minus the best baseline, in points: " + "; ".join(cells) + "."


def worst() -> str:
    data = _load("suite.json")
    if data is None:
        return "_No suite results yet: run `python bench/bench_suite.py`._"

    def key(h: dict[str, Any]) -> float:
        d = h["accelmux_minus_best_baseline"]
        return min(d.get("realtime", 0.0), d.get("interactive", 0.0))

    homes = sorted(data["homes"], key=key)[:WORST]
    rows = []
    for h in homes:
        d, o = h["accelmux_minus_best_baseline"], h["accelmux_minus_oracle"]
        ours = h["policies"]["accelmux"]
        rows.append(
            [
                h["name"],
                h["device"],
                ", ".join(h["stresses"]) or "-",
                f"{h['request_bias']:.2f}",
                _pts(d.get("realtime")),
                _pts(d.get("interactive")),
                str(ours.get("requests", {}).get("interactive", "-")),
                h["best_baseline"].get("interactive", "-"),
                _pts(o.get("interactive")),
                _num(ours["oom_events"]),
                str(ours["max_preemptions"]),
            ]
        )
    return _table(
        [
            "home",
            "device",
            "stresses",
            "request bias",
            "realtime vs best",
            "interactive vs best",
            "interactive requests",
            "best baseline (interactive)",
            "interactive vs oracle",
            "accelmux OOMs per run",
            "most preemptions",
        ],
        rows,
    )


def ablation() -> str:
    data = _load("ablation.json")
    if data is None:
        return "_No ablation results yet: run `python bench/bench_suite.py --ablation`._"
    s = data["meta"]["settings"]
    base = data["baseline"]
    head = (
        f"accelmux with one heuristic off, on the first {s['homes']} homes, {s['seeds']} "
        f"seed(s), {s['duration_s']:g} s per run ({data['runs']} runs, {data['wall_s']:.0f} s "
        f"wall). {meta_line(data['meta'])}. With everything on: "
        + ", ".join(f"{c} {_pct(base[c])}" for c in CLASSES if base.get(c) is not None)
        + ". Changes are in points (off minus on), mean over the homes; worst is the "
        "largest drop in one home."
    )
    rows = []
    for name, row in data["heuristics"].items():
        rows.append(
            [
                f"`{name}`",
                _pts(row["realtime_delta"]),
                _pts(row["interactive_delta"]),
                _pts(row["interactive_worst_delta"]),
                _pts(row["batch_delta"]),
                _pts(row["background_delta"]),
                _signed(row["oom_events_delta"], 2),
                _signed(row["preemptions_delta"]),
                _signed(row["starvation_s_delta"]),
                str(row["homes_changed"]),
            ]
        )
    table = _table(
        [
            "off",
            "realtime",
            "interactive",
            "interactive worst",
            "batch",
            "background",
            "OOMs per run",
            "preemptions per run",
            "starved s per run",
            "homes changed",
        ],
        rows,
    )
    return f"{head}\n\n{table}"


def catalogue() -> str:
    """The generator's catalogue (docs/generator.md), from accelmux.sim.catalogue."""
    from accelmux.sim.catalogue import DEVICES, LLMS, MODELS

    llms = _table(
        [
            "model",
            "params (B)",
            "Q4_K_M GGUF",
            "layers x kv_heads x head_dim",
            "KV per token",
            "source",
        ],
        [
            [
                m.name,
                f"{m.params_b:g}",
                f"{m.gguf_bytes / 1e9:.2f} GB",
                f"{m.layers} x {m.kv_heads} x {m.head_dim}",
                f"{m.kv_per_token // 1024} KiB",
                m.source,
            ]
            for m in LLMS
        ],
    )
    models = _table(
        ["model", "kind", "weights", "workspace", "per unit", "base s", "per unit s", "source"],
        [
            [
                m.name,
                m.kind,
                f"{m.weights / 2**20:.0f} MiB",
                f"{m.workspace / 2**20:.0f} MiB",
                f"{m.per_unit / 2**20:.3g} MiB",
                f"{m.base_s:g}",
                f"{m.per_unit_s:g}",
                m.source,
            ]
            for m in MODELS
        ],
    )
    devices = _table(
        ["device", "memory", "kind", "bandwidth GB/s", "FP32 TFLOPS", "source"],
        [
            [
                d.name,
                f"{d.capacity_gib:g} GiB",
                "shared memory" if d.shared_memory else "GPU",
                f"{d.bandwidth_gbs:g}",
                f"{d.fp32_tflops:g}",
                d.source,
            ]
            for d in DEVICES
        ],
    )
    return (
        f"LLMs:\n\n{llms}\n\nOther models (speeds on the reference RTX 4070):\n\n"
        f"{models}\n\nDevices:\n\n{devices}"
    )


BLOCKS: dict[str, Callable[[], str]] = {
    "generator-catalogue": catalogue,
    "suite-summary": summary,
    "suite-holdout": holdout,
    "suite-worst": worst,
    "suite-foreign": foreign,
    "suite-ablation": ablation,
}
