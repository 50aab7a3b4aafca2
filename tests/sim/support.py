"""Small scenarios and traces for the simulator tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from accelmux.sim.scenario import DEFAULT_TRACE, Scenario, load_scenario

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "scenarios"
#: The Azure trace shipped inside the package (the replay tests read it, never skip it).
AZURE_TRACE = Path(DEFAULT_TRACE)

TINY: dict[str, Any] = {
    "devices": {"gpu": {"kind": "virtual", "capacity": "8GiB", "headroom": "256MiB"}},
    "services": {
        "asr": {
            "kind": "asr",
            "class": "realtime",
            "residency": "pinned",
            "init_s": 0.5,
            "memory": {"weights": "500MiB", "runtime": "200MiB", "workspace": "100MiB"},
            "slo": {"latency_s": 1.0},
        },
        "chat": {
            "kind": "chat",
            "class": "interactive",
            "residency": "warm",
            "concurrency": 2,
            "init_s": 1.0,
            "memory": {
                "weights": "3GiB",
                "runtime": "300MiB",
                "kv_per_token": "128KiB",
                "kv_floor": "256MiB",
                "kv_ceiling": "1GiB",
                "workspace": "32MiB",
            },
            "slo": {"ttft_s": 3.0, "tbt_s": 0.2},
        },
        "image": {
            "kind": "image",
            "class": "interactive",
            "residency": "on-demand",
            "init_s": 1.0,
            "memory": {
                "weights": "3GiB",
                "runtime": "300MiB",
                "workspace": "300MiB",
                "per_unit": "1GiB",
            },
            "queue": {"deadline_s": 120},
            "slo": {"latency_s": 30},
        },
    },
    "workloads": [
        {"type": "poisson", "service": "asr", "rate_per_h": 360, "units": 4.0},
        {
            "type": "gamma",
            "service": "chat",
            "rate_per_h": 240,
            "cv": 1.5,
            "prompt_tokens": {"mean": 800, "cv": 0.5},
            "output_tokens": {"mean": 100, "cv": 0.5},
        },
        {"type": "poisson", "service": "image", "rate_per_h": 30, "units": 1.0},
    ],
    "simulation": {
        "duration_s": 600,
        "start": "12:00",
        "seeds": 2,
        "warmup_s": 0,
        "services": {
            "asr": {"share": 0.5, "base_s": 0.05, "per_unit_s": 0.03},
            "chat": {"share": 0.4, "prefill_tps": 2000, "tbt_s": 0.02},
            "image": {"share": 1.0, "base_s": 0.5, "per_unit_s": 5.0},
        },
    },
}


def tiny(**changes: Any) -> dict[str, Any]:
    """A deep copy of the tiny scenario with top-level sections replaced."""
    data = copy.deepcopy(TINY)
    data.update(changes)
    return data


def write_scenario(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def scenario(tmp_path: Path, data: dict[str, Any] | None = None) -> Scenario:
    return load_scenario(write_scenario(tmp_path / "tiny.yaml", data or tiny()))


def write_trace(path: Path, gaps: list[float], ctx: int = 500, gen: int = 50) -> Path:
    """A CSV in the Azure trace format with the given inter-arrival gaps (seconds)."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    t = 0.0
    for i, gap in enumerate([0.0, *gaps]):
        t += gap
        whole = int(t)
        frac = t - whole
        mm, ss = divmod(whole, 60)
        lines.append(f"2023-11-16 18:{mm:02d}:{ss:02d}.{int(frac * 1e7):07d},{ctx + i},{gen}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
