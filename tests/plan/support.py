"""Histories for the plan tests: the simulator stands in for the daemon that recorded them.

:func:`record` runs a scenario through the simulator with the same recorder the daemon
uses, its compute samples taken from the simulated device (the busy fraction of each
sample period, and what foreign programs took), and writes the rows into a real history
directory (SQLite day files), as a daemon that served that scenario would have.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from accelmux.history.cpu import CpuFigures
from accelmux.history.daemon_run import new_run
from accelmux.history.recorder import HistoryRecorder, StreamFigures
from accelmux.history.store import HistoryWriter
from accelmux.sim.executor import Simulation
from accelmux.sim.scenario import load_scenario_data

#: A small home: voice (pinned, realtime), a warm chat LLM, an on-demand embedder.
HOME: dict[str, Any] = {
    "devices": {"gpu": {"kind": "virtual", "capacity": "6GiB", "headroom": "256MiB"}},
    "services": {
        "asr": {
            "kind": "asr",
            "class": "realtime",
            "residency": "pinned",
            "init_s": 0.5,
            "memory": {"weights": "400MiB", "runtime": "100MiB", "workspace": "64MiB"},
            "slo": {"latency_s": 1.0},
        },
        "chat": {
            "kind": "chat",
            "class": "interactive",
            "residency": "warm",
            "ttl_s": 120,
            "init_s": 1.0,
            "memory": {
                "weights": "2GiB",
                "runtime": "200MiB",
                "kv_per_token": "64KiB",
                "kv_floor": "128MiB",
                "kv_ceiling": "512MiB",
                "workspace": "32MiB",
            },
            "slo": {"ttft_s": 2.0, "tbt_s": 0.1},
        },
        "embed": {
            "kind": "embeddings",
            "class": "batch",
            "residency": "on-demand",
            "init_s": 0.5,
            "memory": {
                "weights": "1GiB",
                "runtime": "100MiB",
                "workspace": "64MiB",
                "per_unit": "4MiB",
            },
            "slo": {"latency_s": 30},
        },
    },
    "workloads": [
        {"type": "poisson", "service": "asr", "rate_per_h": 240, "units": {"mean": 4, "cv": 0.3}},
        {
            "type": "poisson",
            "service": "chat",
            "rate_per_h": 180,
            "prompt_tokens": {"mean": 600, "cv": 0.6},
            "output_tokens": {"mean": 80, "cv": 0.5},
        },
        {
            "type": "poisson",
            "service": "embed",
            "rate_per_h": 240,
            "units": {"mean": 16, "cv": 0.5},
        },
    ],
    "simulation": {
        "duration_s": 1500,
        "start": "18:00",
        "seeds": 1,
        "warmup_s": 0,
        "error": {"enabled": False},
        "services": {
            "asr": {"share": 0.5, "base_s": 0.05, "per_unit_s": 0.05},
            "chat": {"share": 0.5, "base_s": 0.02, "prefill_tps": 3000, "tbt_s": 0.03},
            "embed": {"share": 1.0, "base_s": 0.05, "per_unit_s": 0.02},
        },
    },
}


def home(**simulation: Any) -> dict[str, Any]:
    data = copy.deepcopy(HOME)
    data["simulation"].update(simulation)
    return data


class _SimCpu:
    """What the daemon's probe measures of a host, from the simulated device: the mean
    load (the running shares, in threads of a one-core device) and the foreign share
    over each sample period, and the busy fraction."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.last: dict[str, tuple[float, float, float]] = {}

    def __call__(self, device: str) -> CpuFigures:
        comp = self.sim.compute[device]
        now = self.sim.clock.now()
        comp.advance(now)
        before = self.last.get(device)
        self.last[device] = (now, comp.busy_s, comp.load_s)
        if before is None or now <= before[0]:
            return CpuFigures()
        span = now - before[0]
        busy = (comp.busy_s - before[1]) / span
        load = (comp.load_s - before[2]) / span
        return CpuFigures(
            cpu_managed=round(busy, 4),
            cpu_total=round(min(1.0, busy + comp.foreign_share), 4),
            run_managed=round(load, 4),
            run_total=round(load + comp.foreign_share, 4),
        )


def record(
    data: dict[str, Any], directory: Path, *, policy: str = "accelmux", seed: int = 0
) -> Path:
    """Serve ``data`` (a scenario) in the simulator, recorded into ``directory/history``;
    returns that history directory."""
    scn = load_scenario_data(copy.deepcopy(data), str(directory / "home.yaml"), directory)
    sim = Simulation(scn, policy, seed)
    writer = HistoryWriter(directory / "history", days=7, max_bytes=1 << 30)
    run = new_run(scn.config, sim.spec, "test", started_wall=1_790_000_000.0, cores=1)
    writer.start_run(run)

    def figures(rid: str) -> StreamFigures | None:
        req = sim.requests[rid]
        if not sim.is_llm(req.service):
            return None
        return StreamFigures(
            first_chunk_at=req.first_token_at, output_tokens=req.demand.output_tokens
        )

    recorder = HistoryRecorder(
        writer, sim.spec, run, stream_figures=figures, cpu_probe=_SimCpu(sim), flush_s=5.0
    )
    sim.observers.append(recorder)
    sim.run()
    recorder.close(sim.clock.now())
    writer.close()
    return directory / "history"


def shifted(row: Any, **changes: Any) -> Any:
    return dataclasses.replace(row, **changes)


def write_gguf(
    path: Path,
    *,
    layers: int = 4,
    embd: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 1000,
    weights: int = 4 << 20,
) -> Path:
    """A minimal GGUF file (version 3, one F32 tensor of ``weights`` bytes) with the
    metadata a memory profile reads: what a model file's header looks like."""
    import struct

    def string(s: str) -> bytes:
        raw = s.encode()
        return struct.pack("<Q", len(raw)) + raw

    def u32(key: str, value: int) -> bytes:
        return string(key) + struct.pack("<II", 4, value)

    meta = [
        string("general.architecture") + struct.pack("<I", 8) + string("llama"),
        u32("llama.block_count", layers),
        u32("llama.embedding_length", embd),
        u32("llama.attention.head_count", heads),
        u32("llama.attention.head_count_kv", kv_heads),
        u32("llama.feed_forward_length", 4 * embd),
        u32("llama.vocab_size", vocab),
        u32("llama.context_length", 4096),
    ]
    n = weights // 4
    tensor = string("token_embd.weight") + struct.pack("<IQIQ", 1, n, 0, 0)
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, len(meta)) + b"".join(meta) + tensor
    pad = -len(header) % 32
    path.write_bytes(header + b"\0" * pad + b"\0" * weights)
    return path
