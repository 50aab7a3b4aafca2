"""Workload generators: open-loop arrivals, a voice chain, an indexing job, cameras, trace.

Each generator is a :class:`Source` that schedules its own requests through a
:class:`Context` (the simulation). Every source has its own random stream, and it draws
everything about a request (sizes, and the true-memory factor of the physical model)
when the request is created, so all policies see the same workload for a seed.

- ``poisson`` / ``gamma``: independent arrivals at ``rate_per_h``; gamma inter-arrivals
  have the given coefficient of variation (CV 1 is Poisson).
- ``trace``: the Azure conversation trace, time-stretched to ``rate_per_h``.
- ``voice``: an utterance (gamma arrivals) triggers ASR -> LLM -> TTS, each step when
  the previous one ends; the chain has an end-to-end SLO.
- ``indexing``: N documents, closed loop with K outstanding, starting at a time of day
  (a maintenance window); failed documents are retried.
- ``camera``: a constant frame rate per camera (CV 0), random phase per camera.
- ``recorded``: the requests a daemon recorded, replayed (:mod:`accelmux.sim.recorded`):
  each at its recorded time, or, linked to an earlier one of the same client, that
  client's gap after the earlier one ends here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from accelmux.core.events import Demand
from accelmux.core.specs import DAY_S
from accelmux.sim.recorded import TraceRow, read_trace
from accelmux.sim.scenario import (
    CameraWorkload,
    Dist,
    DistConfig,
    GammaWorkload,
    IndexingWorkload,
    PoissonWorkload,
    RecordedWorkload,
    Scenario,
    TraceWorkload,
    VoiceWorkload,
    WorkloadConfig,
    parse_clock,
)
from accelmux.sim.trace import load_trace, scaled_arrivals


class Context(Protocol):
    """What a source needs from the simulation."""

    @property
    def duration_s(self) -> float: ...

    @property
    def start_s_of_day(self) -> float: ...

    def submit(
        self,
        service: str,
        demand: Demand,
        *,
        source: Source,
        truth: float,
        tag: object = None,
        job_id: str | None = None,
        pausable: bool | None = None,
    ) -> str: ...

    def call_at(self, t: float, fn: Callable[[], None]) -> None: ...

    def truth(self, rng: random.Random, service: str) -> float: ...

    def truth_of_peak(self, service: str, demand: Demand, peak_bytes: int) -> float: ...

    def is_llm(self, service: str) -> bool: ...


def draw(dist: Dist, rng: random.Random) -> float:
    """Sample a :data:`Dist`: a constant, ``choices``, or lognormal(mean, cv)."""
    if not isinstance(dist, DistConfig):
        return float(dist)
    if dist.choices:
        value = rng.choice(dist.choices)
    else:
        mean = float(dist.mean or 0.0)
        if dist.cv <= 0:
            value = mean
        else:
            s2 = math.log(1.0 + dist.cv**2)
            value = rng.lognormvariate(math.log(mean) - s2 / 2.0, math.sqrt(s2))
    if dist.min is not None:
        value = max(value, dist.min)
    if dist.max is not None:
        value = min(value, dist.max)
    return value


def gamma_gap(rng: random.Random, rate_per_s: float, cv: float) -> float:
    """An inter-arrival gap with mean 1/rate and the given CV (1 = exponential)."""
    shape = 1.0 / (cv * cv)
    return rng.gammavariate(shape, 1.0 / (rate_per_s * shape))


class Source:
    """Base of every generator."""

    kind = "source"

    def __init__(self, name: str, seed: int, index: int) -> None:
        self.name = name
        self.rng = random.Random(f"{seed}:{index}:{name}")
        self.submitted = 0

    def start(self, ctx: Context) -> None:
        raise NotImplementedError

    def outcome(self, ctx: Context, rid: str, tag: object, ok: bool, t: float) -> None:
        """A request of this source ended (served, or rejected/failed when ``ok`` is False)."""
        return None

    def summary(self) -> dict[str, object]:
        return {"kind": self.kind, "submitted": self.submitted}


def _llm_demand(prompt: int, output: int) -> Demand:
    return Demand(kv_tokens=prompt + output, prompt_tokens=prompt, output_tokens=output)


class OpenLoopSource(Source):
    """Poisson or gamma arrivals to one service."""

    kind = "open"

    def __init__(self, cfg: PoissonWorkload | GammaWorkload, seed: int, index: int) -> None:
        super().__init__(cfg.name or f"{cfg.type}-{cfg.service}", seed, index)
        self.cfg = cfg
        self.cv = cfg.cv if isinstance(cfg, GammaWorkload) else 1.0

    def _end(self, ctx: Context) -> float:
        return min(ctx.duration_s, self.cfg.until_s or math.inf)

    def start(self, ctx: Context) -> None:
        self._next(ctx, self.cfg.from_s)

    def _next(self, ctx: Context, after: float) -> None:
        t = after + gamma_gap(self.rng, self.cfg.rate_per_h / 3600.0, self.cv)
        if t < self._end(ctx):
            ctx.call_at(t, lambda: self._fire(ctx, t))

    def _fire(self, ctx: Context, t: float) -> None:
        cfg = self.cfg
        if ctx.is_llm(cfg.service):
            demand = _llm_demand(
                max(1, round(draw(cfg.prompt_tokens, self.rng))),
                max(1, round(draw(cfg.output_tokens, self.rng))),
            )
        else:
            demand = Demand(units=draw(cfg.units, self.rng))
        ctx.submit(cfg.service, demand, source=self, truth=ctx.truth(self.rng, cfg.service))
        self.submitted += 1
        self._next(ctx, t)


class TraceSource(Source):
    kind = "trace"

    def __init__(self, cfg: TraceWorkload, seed: int, index: int, trace_path: str) -> None:
        super().__init__(cfg.name or f"trace-{cfg.service}", seed, index)
        self.cfg = cfg
        self.trace_path = trace_path

    def start(self, ctx: Context) -> None:
        trace = load_trace(self.trace_path)
        end = min(ctx.duration_s, self.cfg.until_s or math.inf) - self.cfg.from_s
        arrivals = scaled_arrivals(
            trace, rate_per_s=self.cfg.rate_per_h / 3600.0, duration_s=end, rng=self.rng
        )
        for t, row in arrivals:
            prompt = row.context_tokens
            if self.cfg.max_context_tokens:
                prompt = min(prompt, self.cfg.max_context_tokens)
            demand = _llm_demand(max(1, prompt), max(1, row.generated_tokens))
            truth = ctx.truth(self.rng, self.cfg.service)
            ctx.call_at(t + self.cfg.from_s, self._submitter(ctx, demand, truth))

    def _submitter(self, ctx: Context, demand: Demand, truth: float) -> Callable[[], None]:
        def fire() -> None:
            ctx.submit(self.cfg.service, demand, source=self, truth=truth)
            self.submitted += 1

        return fire


@dataclass(slots=True)
class Chain:
    """One voice interaction: utterance end to spoken answer."""

    index: int
    arrived_at: float
    audio_s: float
    prompt: int
    output: int
    truths: tuple[float, float, float]
    step: int = 0
    finished_at: float | None = None
    failed: bool = False


class VoiceSource(Source):
    kind = "voice"

    def __init__(self, cfg: VoiceWorkload, seed: int, index: int) -> None:
        super().__init__(cfg.name or "voice", seed, index)
        self.cfg = cfg
        self.chains: list[Chain] = []

    def start(self, ctx: Context) -> None:
        self._next(ctx, self.cfg.from_s)

    def _next(self, ctx: Context, after: float) -> None:
        t = after + gamma_gap(self.rng, self.cfg.rate_per_h / 3600.0, self.cfg.cv)
        if t < min(ctx.duration_s, self.cfg.until_s or math.inf):
            ctx.call_at(t, lambda: self._utterance(ctx, t))

    def _utterance(self, ctx: Context, t: float) -> None:
        cfg, rng = self.cfg, self.rng
        chain = Chain(
            index=len(self.chains),
            arrived_at=t,
            audio_s=max(0.3, draw(cfg.audio_s, rng)),
            prompt=max(1, round(draw(cfg.prompt_tokens, rng))),
            output=max(1, round(draw(cfg.output_tokens, rng))),
            truths=(
                ctx.truth(rng, cfg.asr),
                ctx.truth(rng, cfg.llm),
                ctx.truth(rng, cfg.tts),
            ),
        )
        self.chains.append(chain)
        self._step(ctx, chain)
        self._next(ctx, t)

    def _step(self, ctx: Context, chain: Chain) -> None:
        cfg = self.cfg
        if chain.step == 0:
            service, demand = cfg.asr, Demand(units=chain.audio_s)
        elif chain.step == 1:
            service, demand = cfg.llm, _llm_demand(chain.prompt, chain.output)
        else:
            service, demand = cfg.tts, Demand(units=chain.output * cfg.chars_per_token)
        ctx.submit(service, demand, source=self, truth=chain.truths[chain.step], tag=chain)
        self.submitted += 1

    def outcome(self, ctx: Context, rid: str, tag: object, ok: bool, t: float) -> None:
        if not isinstance(tag, Chain):
            return
        if not ok:
            tag.failed = True
            return
        tag.step += 1
        if tag.step >= 3:
            tag.finished_at = t
        else:
            self._step(ctx, tag)

    def summary(self) -> dict[str, object]:
        lat = [c.finished_at - c.arrived_at for c in self.chains if c.finished_at is not None]
        return {
            "kind": self.kind,
            "submitted": self.submitted,
            "chains": len(self.chains),
            "completed": len(lat),
            "failed": sum(1 for c in self.chains if c.failed),
            "slo_s": self.cfg.slo_s,
            "latencies": lat,
        }


@dataclass(slots=True)
class _Doc:
    index: int
    units: float
    truth: float
    attempts: int = 0


class IndexingSource(Source):
    """A batch job: N documents, K outstanding, retried on failure."""

    kind = "indexing"

    def __init__(self, cfg: IndexingWorkload, seed: int, index: int) -> None:
        super().__init__(cfg.name or f"index-{cfg.service}", seed, index)
        self.cfg = cfg
        self.next_doc = 0
        self.done_at: list[float] = []
        self.started_at: float | None = None
        self.docs: list[_Doc] = []
        self.skipped = 0

    def start_time(self, ctx: Context) -> float:
        if self.cfg.at is None:
            return self.cfg.from_s
        delta = (parse_clock(self.cfg.at) - ctx.start_s_of_day) % DAY_S
        return max(self.cfg.from_s, delta)

    def start(self, ctx: Context) -> None:
        for i in range(self.cfg.documents):
            self.docs.append(
                _Doc(
                    index=i,
                    units=max(1.0, draw(self.cfg.units, self.rng)),
                    truth=ctx.truth(self.rng, self.cfg.service),
                )
            )
        t0 = self.start_time(ctx)
        if t0 < ctx.duration_s:
            ctx.call_at(t0, lambda: self._begin(ctx, t0))

    def _begin(self, ctx: Context, t: float) -> None:
        self.started_at = t
        for _ in range(min(self.cfg.outstanding, len(self.docs))):
            self._submit_next(ctx)

    def _submit_next(self, ctx: Context) -> None:
        if self.next_doc >= len(self.docs):
            return
        doc = self.docs[self.next_doc]
        self.next_doc += 1
        self._submit(ctx, doc)

    def _submit(self, ctx: Context, doc: _Doc) -> None:
        doc.attempts += 1
        ctx.submit(
            self.cfg.service,
            Demand(units=doc.units),
            source=self,
            truth=doc.truth,
            tag=doc,
            job_id=self.name,
        )
        self.submitted += 1

    def outcome(self, ctx: Context, rid: str, tag: object, ok: bool, t: float) -> None:
        if not isinstance(tag, _Doc):
            return
        if ok:
            self.done_at.append(t)
            self._submit_next(ctx)
        elif tag.attempts >= self.cfg.max_attempts:
            self.skipped += 1
            self._submit_next(ctx)
        else:
            ctx.call_at(t + self.cfg.retry_s, lambda: self._submit(ctx, tag))

    def summary(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "submitted": self.submitted,
            "documents": len(self.docs),
            "done": len(self.done_at),
            "skipped": self.skipped,
            "started_at": self.started_at,
            "done_at": list(self.done_at),
        }


class CameraSource(Source):
    kind = "camera"

    def __init__(self, cfg: CameraWorkload, seed: int, index: int) -> None:
        super().__init__(cfg.name or f"camera-{cfg.service}", seed, index)
        self.cfg = cfg

    def start(self, ctx: Context) -> None:
        period = 1.0 / self.cfg.fps
        end = min(ctx.duration_s, self.cfg.until_s or math.inf)
        for _cam in range(self.cfg.cameras):
            self._frame(ctx, self.cfg.from_s + self.rng.uniform(0.0, period), period, end)

    def _frame(self, ctx: Context, t: float, period: float, end: float) -> None:
        if t >= end:
            return

        def fire() -> None:
            ctx.submit(
                self.cfg.service,
                Demand(units=draw(self.cfg.units, self.rng)),
                source=self,
                truth=ctx.truth(self.rng, self.cfg.service),
            )
            self.submitted += 1
            self._frame(ctx, t + period, period, end)

        ctx.call_at(t, fire)


class RecordedSource(Source):
    """A recorded request trace, replayed (see the module doc)."""

    kind = "recorded"

    def __init__(self, cfg: RecordedWorkload, seed: int, index: int, path: str) -> None:
        super().__init__(cfg.name or "recorded", seed, index)
        self.cfg = cfg
        self.path = path
        self.followers: dict[int, list[TraceRow]] = {}
        self.rows = 0

    def _end(self, ctx: Context) -> float:
        return min(ctx.duration_s, self.cfg.until_s or math.inf)

    def start(self, ctx: Context) -> None:
        dropped = set(self.cfg.drop_services)
        rows = [r for r in read_trace(Path(self.path)) if r.service not in dropped]
        kept = {r.index for r in rows}
        self.rows = len(rows)
        end = self._end(ctx)
        for row in rows:
            if self.cfg.closed_loop and row.after is not None and row.after in kept:
                self.followers.setdefault(row.after, []).append(row)
                continue
            t = row.arrival_s + self.cfg.from_s
            if t < end:
                ctx.call_at(t, self._submitter(ctx, row))

    def _submitter(self, ctx: Context, row: TraceRow) -> Callable[[], None]:
        return lambda: self._submit(ctx, row)

    def _submit(self, ctx: Context, row: TraceRow) -> None:
        if ctx.is_llm(row.service):
            produced = row.output_tokens if row.output_tokens is not None else row.max_output_tokens
            demand = Demand(
                kv_tokens=row.kv_tokens,
                prompt_tokens=row.prompt_tokens,
                output_tokens=max(1, produced),
            )
        else:
            demand = Demand(units=row.units, prompt_tokens=row.prompt_tokens)
        if row.peak_bytes is not None:
            truth = ctx.truth_of_peak(row.service, demand, row.peak_bytes)
        else:
            truth = ctx.truth(self.rng, row.service)
        ctx.submit(row.service, demand, source=self, truth=truth, tag=row, pausable=row.pausable)
        self.submitted += 1

    def outcome(self, ctx: Context, rid: str, tag: object, ok: bool, t: float) -> None:
        if not isinstance(tag, TraceRow):
            return
        for row in self.followers.pop(tag.index, []):
            at = t + max(0.0, row.gap_s or 0.0)
            if at < self._end(ctx):
                ctx.call_at(at, self._submitter(ctx, row))

    def summary(self) -> dict[str, object]:
        return {"kind": self.kind, "submitted": self.submitted, "rows": self.rows}


def build_sources(scn: Scenario, seed: int, trace_override: str | None = None) -> list[Source]:
    out: list[Source] = []
    for i, w in enumerate(scn.config.workloads):
        out.append(_build(scn, w, seed, i, trace_override))
    return out


def _build(
    scn: Scenario, w: WorkloadConfig, seed: int, i: int, trace_override: str | None
) -> Source:
    if isinstance(w, PoissonWorkload | GammaWorkload):
        return OpenLoopSource(w, seed, i)
    if isinstance(w, TraceWorkload):
        path = trace_override or str(scn.resolve(w.path))
        return TraceSource(w, seed, i, path)
    if isinstance(w, VoiceWorkload):
        return VoiceSource(w, seed, i)
    if isinstance(w, IndexingWorkload):
        return IndexingSource(w, seed, i)
    if isinstance(w, RecordedWorkload):
        return RecordedSource(w, seed, i, str(scn.resolve(w.path)))
    return CameraSource(w, seed, i)
