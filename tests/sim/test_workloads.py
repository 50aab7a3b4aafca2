"""Workload generators: rates, CVs, the voice chain, the indexing job, cameras, trace."""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Callable

import pytest

from accelmux.core.events import Demand
from accelmux.sim.scenario import (
    CameraWorkload,
    DistConfig,
    GammaWorkload,
    IndexingWorkload,
    PoissonWorkload,
    VoiceWorkload,
)
from accelmux.sim.workloads import (
    CameraSource,
    IndexingSource,
    OpenLoopSource,
    Source,
    VoiceSource,
    draw,
    gamma_gap,
)


class FakeContext:
    """Records submissions; runs callbacks in time order like the engine."""

    def __init__(self, duration_s: float, start_s_of_day: float = 0.0) -> None:
        self._duration = duration_s
        self._start = start_s_of_day
        self.now = 0.0
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self.submitted: list[tuple[float, str, Demand, object]] = []
        self._seq = 0

    @property
    def duration_s(self) -> float:
        return self._duration

    @property
    def start_s_of_day(self) -> float:
        return self._start

    def submit(
        self,
        service: str,
        demand: Demand,
        *,
        source: Source,
        truth: float,
        tag: object = None,
        job_id: str | None = None,
    ) -> str:
        self.submitted.append((self.now, service, demand, tag))
        return f"r{len(self.submitted)}"

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        self.queue.append((t, self._seq, fn))

    def truth(self, rng: random.Random, service: str) -> float:
        return 1.0

    def is_llm(self, service: str) -> bool:
        return service == "llm"

    def run(self) -> None:
        while self.queue:
            self.queue.sort(key=lambda e: (e[0], e[1]))
            t, _, fn = self.queue.pop(0)
            self.now = t
            fn()


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_poisson_rate_and_cv() -> None:
    cfg = PoissonWorkload(type="poisson", service="svc", rate_per_h=3600, units=1.0)
    ctx = FakeContext(duration_s=4000)
    OpenLoopSource(cfg, seed=1, index=0).start(ctx)
    ctx.run()
    times = [t for t, *_ in ctx.submitted]
    assert len(times) == pytest.approx(4000, rel=0.06)
    gaps = _gaps(times)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.08)


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_cv(cv: float) -> None:
    rng = random.Random(5)
    gaps = [gamma_gap(rng, 2.0, cv) for _ in range(20000)]
    assert statistics.mean(gaps) == pytest.approx(0.5, rel=0.05)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(cv, rel=0.08)


def test_gamma_workload_uses_its_window() -> None:
    cfg = GammaWorkload(
        type="gamma", service="svc", rate_per_h=3600, cv=1.0, from_s=100, until_s=200
    )
    ctx = FakeContext(duration_s=1000)
    OpenLoopSource(cfg, seed=2, index=0).start(ctx)
    ctx.run()
    assert all(100 <= t < 200 for t, *_ in ctx.submitted)
    assert 60 < len(ctx.submitted) < 140


def test_camera_is_a_constant_frame_rate() -> None:
    cfg = CameraWorkload(type="camera", service="det", cameras=2, fps=5, units=0.41)
    ctx = FakeContext(duration_s=100)
    CameraSource(cfg, seed=3, index=0).start(ctx)
    ctx.run()
    assert len(ctx.submitted) == pytest.approx(1000, abs=2)
    times = sorted(t for t, *_ in ctx.submitted)
    # every gap of one camera is exactly 1/fps: the two phases interleave
    first, second = times[0::2], times[1::2]
    for cam in (first, second):
        assert max(_gaps(cam)) == pytest.approx(0.2, abs=1e-9)
        assert min(_gaps(cam)) == pytest.approx(0.2, abs=1e-9)


def test_voice_chain_runs_asr_then_llm_then_tts() -> None:
    cfg = VoiceWorkload(
        type="voice", asr="asr", llm="llm", tts="tts", rate_per_h=60, output_tokens=40
    )
    ctx = FakeContext(duration_s=600)
    src = VoiceSource(cfg, seed=4, index=0)
    src.start(ctx)
    ctx.run()
    assert [s for _, s, *_ in ctx.submitted] == ["asr"] * len(src.chains)
    chain = src.chains[0]
    src.outcome(ctx, "r1", chain, True, chain.arrived_at + 0.3)
    _, service, demand, tag = ctx.submitted[-1]
    assert service == "llm" and tag is chain
    assert demand.output_tokens == 40 and demand.kv_tokens == demand.prompt_tokens + 40
    src.outcome(ctx, "r2", chain, True, chain.arrived_at + 1.0)
    _, service, demand, _ = ctx.submitted[-1]
    assert service == "tts" and demand.units == 160.0
    src.outcome(ctx, "r3", chain, True, chain.arrived_at + 1.2)
    assert chain.finished_at == pytest.approx(chain.arrived_at + 1.2)
    other = src.chains[1]
    src.outcome(ctx, "r4", other, False, other.arrived_at + 0.1)
    assert other.failed and other.finished_at is None


def test_indexing_job_keeps_k_outstanding_and_retries() -> None:
    cfg = IndexingWorkload(
        type="indexing", service="emb", documents=10, outstanding=3, units=8, at="00:10"
    )
    ctx = FakeContext(duration_s=3600, start_s_of_day=0.0)
    src = IndexingSource(cfg, seed=5, index=0)
    src.start(ctx)
    ctx.run()
    assert src.started_at == 600.0
    assert len(ctx.submitted) == 3
    docs = [tag for *_, tag in ctx.submitted]
    src.outcome(ctx, "r1", docs[0], True, 601.0)
    assert len(ctx.submitted) == 4
    src.outcome(ctx, "r2", docs[1], False, 602.0)
    ctx.run()
    assert len(ctx.submitted) == 5 and ctx.submitted[-1][3] is docs[1]
    assert src.done_at == [601.0]


def test_draw_lognormal_mean_and_choices() -> None:
    rng = random.Random(9)
    values = [draw(DistConfig(mean=100.0, cv=0.5), rng) for _ in range(20000)]
    assert statistics.mean(values) == pytest.approx(100.0, rel=0.03)
    assert statistics.pstdev(values) / statistics.mean(values) == pytest.approx(0.5, rel=0.1)
    picks = {draw(DistConfig(choices=[1.0, 2.0]), rng) for _ in range(50)}
    assert picks == {1.0, 2.0}
    assert draw(DistConfig(mean=5.0, cv=3.0, max=6.0), rng) <= 6.0
    assert draw(3.0, rng) == 3.0


def test_indexing_start_wraps_midnight() -> None:
    cfg = IndexingWorkload(type="indexing", service="emb", documents=1, at="00:00")
    ctx = FakeContext(duration_s=7200, start_s_of_day=23 * 3600 + 45 * 60)
    src = IndexingSource(cfg, seed=1, index=0)
    assert src.start_time(ctx) == 15 * 60
