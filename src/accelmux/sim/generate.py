"""Random but realistic homes: a scenario drawn from the catalogue, pure given a seed.

:func:`generate_home` draws one home server from :mod:`accelmux.sim.catalogue`: a device
(6 to 48 GiB, an NVIDIA card or a shared-memory host), the services a home runs on it
(a voice chain, one to three LLMs, image generation, camera detection, an indexing job),
their classes, residencies and maintenance windows, the request rates and burstiness
(gamma arrivals, the Azure trace, bursts), the estimate error (a per-service sigma and a
global bias up to 2x) and foreign processes coming and going. The result is the data of a
normal scenario file: ``accelmux check`` accepts it and ``accelmux simulate`` runs it.

A home is of one of :data:`HOME_KINDS`: ``mixed`` (the draw above, the suite's homes),
``night-cameras`` (cameras detecting all night beside a night maintenance window of
indexing and batch work), ``evening-game`` (an evening with a game or another GPU program
taking 30-70% of the device and much of its compute for 1-3 hours) or ``small-gpu`` (the
mixed draw on a card of 8 GiB or less). Each kind draws from its own random stream, so
adding a kind changes no other kind's homes.

:func:`with_degrade` declares, on a home with an NVIDIA card, a CPU fallback and a
partial-offload range for each interactive LLM (and the host's RAM as a device
for the fallback): the same home, for the degrade benchmark.

:func:`stress_classes` reads the stresses a scenario carries back from its config, so a
suite can report results per stress class whatever produced the scenario.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ByteSize, TypeAdapter

from accelmux.core.types import GIB, MIB
from accelmux.sim.catalogue import (
    DECODE_EFFICIENCY,
    DEVICES,
    LLMS,
    REFERENCE_PREFILL_8B_TPS,
    Device,
    Llm,
    Model,
    ModelKind,
    models_of,
)
from accelmux.sim.scenario import (
    DEFAULT_TRACE,
    GammaWorkload,
    Scenario,
    ScenarioConfig,
    TraceWorkload,
    load_scenario_data,
    workload_services,
)
from accelmux.sim.trace import load_trace

#: What a generated home can stress; :func:`stress_classes` finds them in any scenario.
STRESSES = (
    "estimate-2x",
    "batch-without-window",
    "several-llms",
    "bursty-traces",
    "foreign-mid-burst",
)
#: A workload at least this fast inside a bounded span is a burst.
BURST_RATE_PER_H = 150.0
#: Simulated seconds of a generated home unless the caller asks for another length.
DEFAULT_DURATION_S = 1200.0
#: What a home can be (see the module doc); ``mixed`` is the suite's default.
HOME_KINDS = ("mixed", "night-cameras", "evening-game", "small-gpu")
#: The cards a ``small-gpu`` home draws from: NVIDIA cards of 8 GiB or less.
SMALL_GPUS = tuple(d for d in DEVICES if not d.shared_memory and d.capacity_gib <= 8)
#: The host RAM a home's CPU fallback may fill (``with_degrade``): a 32 GiB machine
#: keeping 8 GiB for its OS and programs.
FALLBACK_HOST = {
    "kind": "host",
    "capacity": "32GiB",
    "budget": "24GiB",
    "headroom": "1GiB",
    "load_bandwidth": "2GB",
}


def _mib(n: float) -> str:
    return f"{max(1, round(n / MIB))}MiB"


def _r(x: float, digits: int = 3) -> float:
    return round(x, digits)


@dataclass
class _Home:
    """What the draw accumulates before it becomes scenario data."""

    rng: random.Random
    device: Device
    usable: int
    duration: float
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    perf: dict[str, dict[str, Any]] = field(default_factory=dict)
    workloads: list[dict[str, Any]] = field(default_factory=list)
    foreign: list[dict[str, Any]] = field(default_factory=list)
    models: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    slot_tokens: dict[str, int] = field(default_factory=dict)
    pinned: int = 0
    start: str | None = None

    def add(self, name: str, svc: dict[str, Any], perf: dict[str, Any], m: Llm | Model) -> None:
        self.services[name] = svc
        self.perf[name] = perf
        self.models[name] = m.name
        self.sources[m.name] = m.source


@dataclass(frozen=True)
class GeneratedHome:
    """One generated home: its scenario data and where its figures come from."""

    seed: int
    name: str
    data: dict[str, Any]
    device: Device
    models: dict[str, str]
    sources: dict[str, str]

    def scenario(self, base_dir: Path | None = None) -> Scenario:
        """The validated scenario (raises ConfigError like any scenario file)."""
        return load_scenario_data(self.data, f"{self.name}.yaml", base_dir or Path.cwd())

    def stresses(self) -> list[str]:
        return stress_classes(self.scenario().config)

    def to_yaml(self) -> str:
        """The scenario file, with a header naming the device, models and sources."""
        lines = [
            f"# Generated home {self.name} (accelmux.sim.generate, seed {self.seed}).",
            f"# Device: {self.device.name} ({self.device.source}).",
        ]
        for svc, m in self.models.items():
            lines.append(f"# {svc}: {m} ({self.sources[m]})")
        lines.append(f"# Stresses: {', '.join(self.stresses()) or 'none'}")
        body = yaml.safe_dump(self.data, sort_keys=False, default_flow_style=None, width=100)
        return "\n".join(lines) + "\n\n" + body


@dataclass(frozen=True, slots=True)
class _TraceStats:
    context_p95: int
    context_mean: float
    generated_mean: float


@lru_cache(maxsize=1)
def _trace_stats() -> _TraceStats:
    """Token statistics of the shipped Azure trace (what a trace workload sends)."""
    rows = load_trace(DEFAULT_TRACE).rows
    contexts = sorted(row.context_tokens for row in rows)
    return _TraceStats(
        context_p95=contexts[int(0.95 * (len(contexts) - 1))],
        context_mean=sum(contexts) / len(contexts),
        generated_mean=sum(row.generated_tokens for row in rows) / len(rows),
    )


def _llm_rate(h: _Home, choice: float, perf: dict[str, Any], prompt: float, out: float) -> float:
    """The drawn rate, capped so this LLM alone keeps the device 10-30% busy on average."""
    solo = float(perf["base_s"]) + prompt / float(perf["prefill_tps"]) + out * float(perf["tbt_s"])
    cap = h.rng.uniform(0.1, 0.3) * 3600.0 / solo
    return _r(max(2.0, min(choice, cap)), 1)


def _llm_perf(m: Llm, dev: Device, share: float) -> dict[str, Any]:
    prefill = REFERENCE_PREFILL_8B_TPS * (8.03 / m.params_b) * dev.compute_scale
    tbt = m.gguf_bytes / (dev.bandwidth_gbs * 1e9 * DECODE_EFFICIENCY)
    return {"share": share, "base_s": 0.03, "prefill_tps": _r(prefill, 1), "tbt_s": _r(tbt, 4)}


def _model_perf(m: Model, dev: Device) -> dict[str, Any]:
    out: dict[str, Any] = {
        "share": m.share,
        "base_s": _r(m.base_s / dev.compute_scale, 4),
        "per_unit_s": _r(m.per_unit_s / dev.compute_scale, 5),
    }
    if m.caching_allocator:
        out["caching_allocator"] = True
    return out


def _solo(perf: dict[str, Any], units: float) -> float:
    return float(perf["base_s"]) + float(perf["per_unit_s"]) * units


def _model_floor(m: Model, dev: Device) -> int:
    return m.weights + dev.context_bytes + m.workspace


def _pick_model(h: _Home, kind: ModelKind, limit: int, units: float) -> Model | None:
    fits = [m for m in models_of(kind) if _model_floor(m, h.device) + m.per_unit * units <= limit]
    return h.rng.choice(fits) if fits else None


def _llm_floor(m: Llm, dev: Device, ctx: int) -> int:
    return m.gguf_bytes + dev.context_bytes + m.compute_buffer + m.kv_per_token * ctx


def _llm_service(
    h: _Home,
    m: Llm,
    *,
    cls: str,
    residency: str,
    concurrency: int,
    ctx: int,
    ttft_s: float,
    tbt_s: float,
    deadline_s: float,
) -> dict[str, Any]:
    kvpt = m.kv_per_token
    ceiling = kvpt * ctx * concurrency
    svc: dict[str, Any] = {
        "kind": "chat",
        "class": cls,
        "residency": residency,
        "concurrency": concurrency,
        "init_s": 1.0 if m.params_b < 4 else 1.5,
        "memory": {
            "weights": _mib(m.gguf_bytes),
            "runtime": _mib(h.device.context_bytes + m.compute_buffer),
            "kv_per_token": f"{kvpt // 1024}KiB",
            "kv_floor": _mib(min(ceiling, max(64 * MIB, kvpt * ctx))),
            "kv_ceiling": _mib(ceiling),
            "workspace": "32MiB" if m.params_b < 4 else "64MiB",
        },
        "queue": {"limit": 16 if cls != "batch" else 64, "deadline_s": deadline_s},
        "slo": {"ttft_s": _r(ttft_s, 2), "tbt_s": _r(tbt_s, 3)},
    }
    if residency != "pinned":
        svc["ttl_s"] = float(h.rng.choice([300, 600, 1800]))
    return svc


def _voice(h: _Home) -> None:
    rng, dev = h.rng, h.device
    share = 0.35 * h.usable  # the pinned set keeps fitting when the truth is 2x
    asr = _pick_model(h, "asr", int(share * 0.4), 30)
    tts = _pick_model(h, "tts", int(share * 0.2), 400)
    if asr is None or tts is None:
        return
    room = share - _model_floor(asr, dev) - _model_floor(tts, dev)
    small = [m for m in LLMS if m.params_b <= 3.3 and _llm_floor(m, dev, 2048) <= room]
    if not small:
        return
    llm = rng.choice(small)
    pinned = rng.random() < 0.85
    residency = "pinned" if pinned else "warm"
    prompt = rng.choice([300, 600, 1000, 1500])
    ctx = 2048 if prompt < 1000 else 4096
    conc = 2 if _llm_floor(llm, dev, ctx * 2) <= room else 1
    if _llm_floor(llm, dev, ctx * conc) > room:
        ctx = 2048
        prompt = min(prompt, 1000)
    asr_perf = _model_perf(asr, dev)
    tts_perf = _model_perf(tts, dev)
    llm_perf = _llm_perf(llm, dev, 0.4)
    asr_slo = max(1.0, 3.0 * _solo(asr_perf, 6.0))
    tts_slo = max(0.6, 3.0 * _solo(tts_perf, 160.0))
    ttft = max(0.8, 3.0 * (0.03 + prompt / llm_perf["prefill_tps"]))
    tbt = max(0.08, 2.0 * llm_perf["tbt_s"])
    for name, m, slo_s, perf, workspace in (
        ("asr", asr, asr_slo, asr_perf, asr.workspace),
        ("tts", tts, tts_slo, tts_perf, tts.workspace),
    ):
        svc = {
            "kind": m.kind,
            "class": "realtime",
            "residency": residency,
            "init_s": 1.0 if m.kind == "asr" else 0.5,
            "memory": {
                "weights": _mib(m.weights),
                "runtime": _mib(dev.context_bytes),
                "workspace": _mib(workspace),
                "per_unit": f"{max(1, m.per_unit // 1024)}KiB",
            },
            "queue": {"limit": 8, "deadline_s": 10},
            "slo": {"latency_s": _r(slo_s, 2)},
        }
        h.add(name, svc, perf, m)
    vsvc = _llm_service(
        h,
        llm,
        cls="realtime",
        residency=residency,
        concurrency=conc,
        ctx=ctx,
        ttft_s=ttft,
        tbt_s=tbt,
        deadline_s=10,
    )
    vsvc["queue"]["limit"] = 8
    h.add("voice-llm", vsvc, llm_perf, llm)
    if pinned:
        h.pinned += _model_floor(asr, dev) + _model_floor(tts, dev) + _llm_floor(llm, dev, ctx)
    out_mean = rng.choice([25, 40, 60])
    speak = 0.03 + (out_mean * 1.5) * llm_perf["tbt_s"]
    chain_slo = max(3.0, 1.5 * (asr_slo / 3 + ttft / 3 + speak + tts_slo / 3))
    h.workloads.append(
        {
            "type": "voice",
            "name": "voice",
            "asr": "asr",
            "llm": "voice-llm",
            "tts": "tts",
            "rate_per_h": float(rng.choice([6, 12, 20, 30, 45, 60])),
            "cv": _r(rng.uniform(1.0, 3.0), 2),
            "audio_s": {"mean": 4.0, "cv": 0.5, "min": 0.8, "max": 30},
            "prompt_tokens": {"mean": float(prompt), "cv": 0.2, "max": float(ctx - 256)},
            "output_tokens": {"mean": float(out_mean), "cv": 0.6, "min": 5, "max": 200},
            "slo_s": _r(chain_slo, 2),
        }
    )


_LLM_ROLES = (("chat", "interactive"), ("code", "interactive"), ("agent", "batch"))


def _llms(h: _Home) -> list[str]:
    """One to three LLMs; returns the names of the interactive ones."""
    rng, dev = h.rng, h.device
    n = rng.choices([1, 2, 3], weights=[0.4, 0.4, 0.2])[0]
    interactive: list[str] = []
    for i in range(n):
        name, cls = _LLM_ROLES[i]
        if cls == "batch" and rng.random() < 0.4:
            cls = "interactive"
        frac = 0.6 if i == 0 else 0.4
        ctx = rng.choice([2048, 4096, 8192])
        fits = [m for m in LLMS if _llm_floor(m, dev, ctx) + 64 * MIB <= frac * h.usable]
        if not fits:
            ctx = 2048
            fits = [m for m in LLMS if _llm_floor(m, dev, ctx) + 64 * MIB <= frac * h.usable]
        if not fits:
            continue
        m = rng.choice(sorted(fits, key=lambda x: x.gguf_bytes)[-5:])
        conc = rng.choice([1, 2, 4, 8])
        while conc > 1 and m.kv_per_token * ctx * conc > 0.3 * h.usable:
            conc //= 2
        perf = _llm_perf(m, dev, 0.45)
        use_trace = cls != "batch" and rng.random() < 0.5
        prompt_mean = rng.choice([300, 800, 1500, 3000])
        prompt_mean = min(prompt_mean, ctx // 2)
        out_mean = rng.choice([100, 200, 400])
        # the SLO lets the 95th-percentile prompt through alone with room to spare
        p95 = min(ctx - 512, _trace_stats().context_p95 if use_trace else int(2.5 * prompt_mean))
        solo_ttft = 0.03 + p95 / perf["prefill_tps"]
        if cls == "batch":
            ttft, tbt, deadline = max(30.0, 5 * solo_ttft), max(0.5, 4 * perf["tbt_s"]), 900.0
        else:
            ttft, tbt, deadline = max(2.0, 1.5 * solo_ttft), max(0.1, 2 * perf["tbt_s"]), 60.0
        residency = "warm" if cls == "batch" or rng.random() < 0.85 else "on-demand"
        svc = _llm_service(
            h,
            m,
            cls=cls,
            residency=residency,
            concurrency=conc,
            ctx=ctx,
            ttft_s=ttft,
            tbt_s=tbt,
            deadline_s=deadline,
        )
        h.add(name, svc, perf, m)
        h.slot_tokens[name] = ctx
        max_out = min(ctx // 4, 3 * out_mean)
        if cls == "batch":
            h.workloads.append(
                {
                    "type": "gamma",
                    "name": f"{name}-jobs",
                    "service": name,
                    "rate_per_h": _llm_rate(
                        h, rng.choice([30, 60, 120]), perf, prompt_mean, out_mean
                    ),
                    "cv": 1.0,
                    "prompt_tokens": {"mean": float(prompt_mean), "cv": 0.5, "min": 64},
                    "output_tokens": {"mean": float(out_mean), "cv": 0.5, "max": float(max_out)},
                }
            )
            continue
        interactive.append(name)
        if use_trace:
            h.workloads.append(
                {
                    "type": "trace",
                    "name": name,
                    "service": name,
                    "rate_per_h": _llm_rate(
                        h,
                        rng.choice([30, 60, 90, 120]),
                        perf,
                        min(_trace_stats().context_mean, ctx - 512),
                        _trace_stats().generated_mean,
                    ),
                    "max_context_tokens": ctx - 512,
                }
            )
        else:
            h.workloads.append(
                {
                    "type": "gamma",
                    "name": name,
                    "service": name,
                    "rate_per_h": _llm_rate(
                        h, rng.choice([20, 40, 60, 90]), perf, prompt_mean, out_mean
                    ),
                    "cv": _r(rng.uniform(0.7, 2.5), 2),
                    "prompt_tokens": {
                        "mean": float(prompt_mean),
                        "cv": 0.8,
                        "min": 16,
                        "max": float(ctx - max_out),
                    },
                    "output_tokens": {
                        "mean": float(out_mean),
                        "cv": 0.6,
                        "min": 1,
                        "max": float(max_out),
                    },
                }
            )
    return interactive


def _burst(h: _Home, services: list[str]) -> tuple[float, float] | None:
    """A burst on one interactive LLM: the trace replayed fast, or gamma CV >= 3."""
    rng = h.rng
    if not services or rng.random() > 0.45:
        return None
    name = rng.choice(services)
    ctx_tokens = h.slot_tokens[name]
    length = rng.choice([300.0, 450.0, 600.0])
    start = _r(rng.uniform(0.15, 0.6) * h.duration, 1)
    end = min(h.duration, start + length)
    if rng.random() < 0.5:
        w: dict[str, Any] = {
            "type": "trace",
            "service": name,
            "rate_per_h": float(rng.choice([180, 240, 360])),
            "max_context_tokens": ctx_tokens - 512,
        }
    else:
        w = {
            "type": "gamma",
            "service": name,
            "rate_per_h": float(rng.choice([180, 240, 360])),
            "cv": _r(rng.uniform(3.0, 4.0), 2),
            "prompt_tokens": {
                "mean": float(min(2000, ctx_tokens // 4)),
                "cv": 0.4,
                "min": 256,
                "max": float(ctx_tokens - 300),
            },
            "output_tokens": {"mean": 150.0, "cv": 0.5, "min": 16, "max": 280.0},
        }
    h.workloads.append({"name": f"{name}-burst", **w, "from_s": start, "until_s": end})
    return start, end


def _image(h: _Home) -> None:
    rng, dev = h.rng, h.device
    if rng.random() > 0.5:
        return
    m = _pick_model(h, "image", int(0.7 * h.usable), 1.05)
    if m is None:
        return
    choices = [0.26, 0.26, 0.59] if m.name == "sd-1.5" else [0.59, 1.05, 1.05]
    perf = _model_perf(m, dev)
    cls = "interactive" if rng.random() < 0.85 else "batch"
    residency = "on-demand" if rng.random() < 0.8 else "warm"
    slo = max(30.0, 3.0 * _solo(perf, max(choices)))
    svc = {
        "kind": "image",
        "class": cls,
        "residency": residency,
        "ttl_s": 120.0,
        "init_s": 2.0,
        "memory": {
            "weights": _mib(m.weights),
            "runtime": _mib(dev.context_bytes + 200 * MIB),
            "workspace": _mib(m.workspace),
            "per_unit": _mib(m.per_unit),
        },
        "queue": {"limit": 4, "deadline_s": max(120.0, _r(2 * slo, 0))},
        "slo": {"latency_s": _r(slo, 1)},
    }
    h.add("image", svc, perf, m)
    h.workloads.append(
        {
            "type": "gamma",
            "name": "image",
            "service": "image",
            "rate_per_h": float(rng.choice([1, 2, 4, 8])),
            "cv": _r(rng.uniform(1.0, 2.5), 2),
            "units": {"choices": choices},
        }
    )


def _cameras(h: _Home, *, always: bool = False) -> None:
    rng, dev = h.rng, h.device
    if not always and rng.random() > 0.6:
        return
    m = _pick_model(h, "detect", int(0.1 * h.usable), 0.41)
    if m is None:
        return
    perf = _model_perf(m, dev)
    solo = _solo(perf, 0.41)
    # detection runs on motion (Frigate-style): 1-2 frames/s per camera on average
    cameras = rng.choice([1, 2, 3])
    fps = rng.choice([1.0, 2.0])
    while cameras * fps * solo > 0.3 and (cameras > 1 or fps > 0.5):
        if fps > 0.5:
            fps /= 2
        else:
            cameras -= 1
    pinned = rng.random() < 0.2 and h.pinned + _model_floor(m, dev) <= 0.4 * h.usable
    svc: dict[str, Any] = {
        "kind": "detect",
        "class": "background",
        "residency": "pinned" if pinned else "warm",
        "concurrency": rng.choice([1, 2]),
        "init_s": 1.0,
        "memory": {
            "weights": _mib(m.weights),
            "runtime": _mib(dev.context_bytes),
            "workspace": _mib(m.workspace),
            "per_unit": _mib(m.per_unit),
        },
        "queue": {"limit": 8, "deadline_s": _r(max(1.0, 4 * solo), 2)},
        "slo": {"latency_s": _r(max(0.5, 3 * solo), 3)},
    }
    if pinned:
        h.pinned += _model_floor(m, dev)
    h.add("detect", svc, perf, m)
    h.workloads.append(
        {
            "type": "camera",
            "name": "cameras",
            "service": "detect",
            "cameras": cameras,
            "fps": fps,
            "units": 0.41,
        }
    )


def _indexing(h: _Home, *, always: bool = False, window: bool | None = None) -> None:
    """An indexing job (65% of homes, or ``always``), in a night window (60%, or as
    ``window`` says)."""
    rng, dev = h.rng, h.device
    if not always and rng.random() > 0.65:
        return
    m = _pick_model(h, "embeddings", int(0.1 * h.usable), 128)
    if m is None:
        return
    perf = _model_perf(m, dev)
    cls = "batch" if rng.random() < 0.85 else "background"
    conc = rng.choice([1, 2])
    outstanding = rng.choice([1, 2, 4])
    per_doc = _solo(perf, 24)
    documents = int(rng.uniform(0.15, 0.5) * h.duration * min(conc, outstanding) / per_doc)
    documents = max(50, min(3000, documents))
    svc: dict[str, Any] = {
        "kind": "embeddings",
        "class": cls,
        "residency": "warm",
        "ttl_s": 300.0,
        "concurrency": conc,
        "init_s": 2.0,
        "memory": {
            "weights": _mib(m.weights),
            "runtime": _mib(dev.context_bytes + 50 * MIB),
            "workspace": _mib(m.workspace),
            "per_unit": _mib(m.per_unit),
        },
        "queue": {"limit": 64, "deadline_s": 600},
        "slo": {"latency_s": _r(max(60.0, 20 * per_doc), 1)},
    }
    job: dict[str, Any] = {
        "type": "indexing",
        "name": "index",
        "service": "embed",
        "documents": documents,
        "outstanding": outstanding,
        "units": {"mean": 24, "cv": 0.8, "min": 1, "max": 128},
    }
    windowed = rng.random() < 0.6 if window is None else window
    if windowed:
        hour = rng.choice([0, 1, 2, 3, 22, 23])
        length = rng.choice([2, 4, 6])
        svc["windows"] = [f"{hour:02d}:00-{(hour + length) % 24:02d}:00"]
        job["at"] = f"{hour:02d}:00"
        # the run starts up to half its length before the window opens
        lead = int(rng.uniform(0.0, 0.5) * h.duration / 60)
        t = (hour * 60 - lead) % (24 * 60)
        h.start = f"{t // 60:02d}:{t % 60:02d}"
    else:
        job["from_s"] = _r(rng.uniform(0.0, 0.3) * h.duration, 1)
    h.add("embed", svc, perf, m)
    h.workloads.append(job)


_FOREIGN_NAMES = ("transcode", "game", "photo-indexer", "browser", "backup")


def _foreign(h: _Home, burst: tuple[float, float] | None) -> None:
    rng = h.rng
    count = rng.choices([0, 1, 2], weights=[0.35, 0.4, 0.25])[0]
    for _ in range(count):
        entry: dict[str, Any] = {
            "name": rng.choice(_FOREIGN_NAMES),
            "at_s": _r(rng.uniform(0.0, 0.8) * h.duration, 1),
            "bytes": _mib(rng.uniform(0.05, 0.3) * h.usable),
        }
        if rng.random() < 0.85:
            entry["duration_s"] = float(rng.choice([120, 300, 600, 900]))
        h.foreign.append(entry)
    if burst is not None and rng.random() < 0.65:
        start, end = burst
        h.foreign.append(
            {
                "name": "transcode",
                "at_s": _r(start + rng.uniform(0.2, 0.6) * (end - start), 1),
                "bytes": _mib(rng.uniform(0.1, 0.25) * h.usable),
                "duration_s": float(rng.choice([300, 600, 900])),
            }
        )


_PROGRAM_NAMES = ("game", "game", "vr-game", "cuda-render", "browser-3d")


def _gpu_program(h: _Home, capacity: int) -> None:
    """A game or another GPU program for the evening: 30-70% of the device's memory and
    30-90% of its compute, from early in the run for 1-3 hours."""
    rng = h.rng
    h.foreign.append(
        {
            "name": rng.choice(_PROGRAM_NAMES),
            "at_s": _r(rng.uniform(0.05, 0.4) * h.duration, 1),
            "bytes": _mib(rng.uniform(0.3, 0.7) * capacity),
            "duration_s": float(rng.choice([3600, 5400, 7200, 10800])),
            "compute_share": _r(rng.uniform(0.3, 0.9), 2),
        }
    )


def _night_maintenance(h: _Home) -> None:
    """Batch LLM work shares the indexing job's night window (maintenance)."""
    window = h.services.get("embed", {}).get("windows")
    if not window:
        return
    for svc in h.services.values():
        if svc["class"] == "batch" and "windows" not in svc:
            svc["windows"] = list(window)


def _error(h: _Home) -> dict[str, Any]:
    rng = h.rng
    mode = rng.choices(["right", "under", "2x"], weights=[0.45, 0.25, 0.3])[0]
    if mode == "right":
        bias = 1.0
    elif mode == "under":
        bias = rng.uniform(1.1, 1.7)
    else:
        bias = 2.0 if rng.random() < 0.5 else rng.uniform(1.8, 2.0)
    resident = 1.0 + (bias - 1.0) * rng.uniform(0.3, 1.0)
    for perf in h.perf.values():
        if rng.random() < 0.5:
            perf["request_sigma"] = _r(rng.uniform(0.05, 0.35), 3)
    return {
        "enabled": True,
        "resident_bias": _r(resident),
        "resident_sigma": _r(rng.uniform(0.02, 0.06)),
        "request_bias": _r(bias),
        "request_sigma": _r(rng.uniform(0.08, 0.25)),
        "tail_probability": _r(rng.uniform(0.0, 0.03)),
        "tail_factor": _r(rng.uniform(1.3, 1.8)),
    }


def _device(dev: Device, rng: random.Random) -> tuple[dict[str, Any], int, float]:
    """The device section, the usable bytes (budget - headroom), and the OS share."""
    cap = int(dev.capacity_gib * GIB)
    if not dev.shared_memory:
        headroom = 512 * MIB
        return (
            {
                "kind": "virtual",
                "capacity": _mib(cap),
                "headroom": "512MiB",
                "load_bandwidth": "3GB",
            },
            cap - headroom,
            0.0,
        )
    os_share = _r(rng.uniform(1.5, 3.0), 2)
    budget = cap - int((os_share + rng.uniform(0.5, 1.5)) * GIB)
    headroom = 768 * MIB
    section = {
        "kind": "host",
        "capacity": _mib(cap),
        "budget": _mib(budget),
        "headroom": "768MiB",
        "load_bandwidth": "2GB",
    }
    return section, budget - headroom, os_share


def generate_home(
    seed: int, *, duration_s: float = DEFAULT_DURATION_S, kind: str = "mixed"
) -> GeneratedHome:
    """The home of ``kind`` for ``seed``: the same seed always gives the same scenario."""
    if kind not in HOME_KINDS:
        raise ValueError(f"unknown home kind {kind!r} (known: {', '.join(HOME_KINDS)})")
    rng = random.Random(f"accelmux-home:{seed}" if kind == "mixed" else f"accelmux-{kind}:{seed}")
    dev = rng.choice(SMALL_GPUS if kind == "small-gpu" else DEVICES)
    device, usable, os_share = _device(dev, rng)
    h = _Home(rng=rng, device=dev, usable=usable, duration=float(duration_s))
    if kind == "night-cameras":
        if rng.random() < 0.4:  # someone still up
            _voice(h)
        interactive = _llms(h)
        burst = None
        _cameras(h, always=True)
        _indexing(h, always=True, window=True)
        _night_maintenance(h)
        if not h.workloads:
            _llms(h)
        _foreign(h, burst)
    else:
        if rng.random() < 0.75:
            _voice(h)
        interactive = _llms(h)
        burst = _burst(h, interactive)
        _image(h)
        _cameras(h)
        # an evening home's indexing runs now: a night window would leave it idle all run
        _indexing(h, window=False if kind == "evening-game" else None)
        if not h.workloads:  # a home with nothing to do is not a home
            _llms(h)
        _foreign(h, burst)
        if kind == "evening-game":
            _gpu_program(h, int(dev.capacity_gib * GIB))
            h.start = f"{rng.choice([18, 19, 20, 21]):02d}:{rng.choice([0, 15, 30, 45]):02d}"
    if os_share:
        h.foreign.insert(
            0,
            {
                "name": "os-and-host-services",
                "baseline": True,
                "at_s": 0.0,
                "bytes": f"{os_share}GiB",
            },
        )
    error = _error(h)
    start = h.start or f"{rng.randrange(24):02d}:{rng.choice([0, 15, 30, 45]):02d}"
    name = f"home-{seed:04d}" if kind == "mixed" else f"{kind}-{seed:04d}"
    data: dict[str, Any] = {
        "devices": {"gpu" if not dev.shared_memory else "host": device},
        "services": h.services,
        "policy": {"name": "accelmux"},
        "workloads": h.workloads,
        "simulation": {
            "duration_s": float(duration_s),
            "start": start,
            "seeds": 2,
            "warmup_s": 60.0,
            "sample_period_s": 1.0,
            "unload_s": 0.5,
            "error": error,
            "foreign": h.foreign,
            "services": h.perf,
        },
    }
    return GeneratedHome(
        seed=seed, name=name, data=data, device=dev, models=h.models, sources=h.sources
    )


#: The smallest share of its batch a batch service of a home runs with under pressure.
SHRINK_MIN_FRACTION = 0.25


def _bytes(value: Any) -> float:
    """A memory figure of a generated service (bytes, or a string such as "3MiB")."""
    return float(TypeAdapter(ByteSize).validate_python(value))


def with_degrade(home: GeneratedHome) -> dict[str, Any]:
    """``home``'s scenario data with a ``degrade`` section on each interactive LLM (a
    fallback to the host's RAM, :data:`FALLBACK_HOST`, and layers from a quarter to 85 %
    of the model's on the GPU) and every service on the card by name. Batch LLMs declare
    none: their work waits for the GPU rather than run many times slower on the CPU
    (measured: with a fallback, the small-gpu homes' batch fell from 100 % to 76 %).
    Each batch service whose requests hold activation memory per unit (embeddings,
    images) declares ``shrink`` down to a quarter of its batch
    (:data:`SHRINK_MIN_FRACTION`). A home on a shared-memory host has nothing to fall
    back to: its data comes back unchanged."""
    data = copy.deepcopy(home.data)
    if home.device.shared_memory:
        return data
    (gpu,) = data["devices"]
    data["devices"]["cpu"] = dict(FALLBACK_HOST)
    llms = {m.name: m for m in LLMS}
    for name, svc in data["services"].items():
        svc["device"] = gpu
        if svc["class"] == "batch" and _bytes(svc["memory"].get("per_unit", 0)) > 0:
            svc["shrink"] = {"min_batch_fraction": SHRINK_MIN_FRACTION}
        model = llms.get(home.models.get(name, ""))
        if model is None or svc["class"] != "interactive":
            continue
        layers = model.layers + 1  # llama.cpp counts the output layer too
        most = max(1, round(0.85 * layers))
        svc["degrade"] = {
            "fallback_device": "cpu",
            "min_gpu_layers": min(most, max(1, round(0.25 * layers))),
            "max_gpu_layers": most,
            "layers": layers,
        }
    return data


def stress_classes(cfg: ScenarioConfig) -> list[str]:
    """The stresses a scenario carries, read from its config (any scenario, not only
    generated ones)."""
    found: set[str] = set()
    err = cfg.simulation.error
    if err.enabled and max(err.request_bias, err.resident_bias) >= 1.8:
        found.add("estimate-2x")
    busy = {s for w in cfg.workloads for s in workload_services(w)}
    for name, svc in cfg.services.items():
        if svc.service_class == "batch" and not svc.windows and name in busy:
            found.add("batch-without-window")
    llms_per_device: dict[str, int] = {}
    for name, svc in cfg.services.items():
        if svc.kind.is_llm:
            dev = cfg.device_of(name)
            llms_per_device[dev] = llms_per_device.get(dev, 0) + 1
    if any(n >= 3 for n in llms_per_device.values()):
        found.add("several-llms")
    bursts: list[tuple[float, float]] = []
    for w in cfg.workloads:
        if isinstance(w, TraceWorkload | GammaWorkload):
            bounded = w.until_s is not None and w.rate_per_h >= BURST_RATE_PER_H
            if bounded or (isinstance(w, GammaWorkload) and w.cv >= 3.0):
                found.add("bursty-traces")
                bursts.append((w.from_s, w.until_s or math.inf))
    for f in cfg.simulation.foreign:
        if not f.baseline and any(a <= f.at_s < b for a, b in bursts):
            found.add("foreign-mid-burst")
    return [s for s in STRESSES if s in found]


def write_homes(
    first_seed: int,
    count: int,
    out_dir: Path,
    *,
    duration_s: float = DEFAULT_DURATION_S,
    kind: str = "mixed",
) -> list[Path]:
    """Write ``count`` homes of ``kind`` from ``first_seed`` on as scenario files; their
    paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in range(first_seed, first_seed + count):
        home = generate_home(seed, duration_s=duration_s, kind=kind)
        path = out_dir / f"{home.name}.yaml"
        path.write_text(home.to_yaml(), encoding="utf-8")
        paths.append(path)
    return paths
