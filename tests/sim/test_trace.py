"""Replay of the Azure trace: reading, time scaling, errors."""

from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import pytest
from tests.sim.support import AZURE_TRACE, write_trace

from accelmux.sim.scenario import DEFAULT_TRACE
from accelmux.sim.trace import TraceError, load_trace, scaled_arrivals


def test_reads_rows_in_order(tmp_path: Path) -> None:
    trace = load_trace(str(write_trace(tmp_path / "t.csv", [0.5, 0.25, 1.0], ctx=10)))
    assert [r.offset_s for r in trace.rows] == pytest.approx([0.0, 0.5, 0.75, 1.75])
    assert [r.context_tokens for r in trace.rows] == [10, 11, 12, 13]
    assert trace.rate_per_s == pytest.approx(3 / 1.75)


def test_scaling_stretches_gaps_to_the_home_rate(tmp_path: Path) -> None:
    trace = load_trace(str(write_trace(tmp_path / "t.csv", [0.1] * 500)))
    arrivals = scaled_arrivals(trace, rate_per_s=0.1, duration_s=1000, rng=random.Random(1))
    times = [t for t, _ in arrivals]
    assert len(times) == pytest.approx(100, abs=2)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.mean(gaps) == pytest.approx(10.0, rel=0.01)


def test_missing_trace_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"trace not found.*--trace"):
        load_trace(str(tmp_path / "nope.csv"))


def test_wrong_columns_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(TraceError, match="expected columns"):
        load_trace(str(bad))


@pytest.mark.skipif(not AZURE_TRACE.is_file(), reason="the shared Azure trace is not here")
def test_azure_trace_keeps_its_burstiness_at_home_rates() -> None:
    trace = load_trace(str(AZURE_TRACE))
    assert len(trace.rows) > 19000
    assert trace.rate_per_s == pytest.approx(5.5, rel=0.1)
    arrivals = scaled_arrivals(
        trace, rate_per_s=60 / 3600, duration_s=200 * 3600, rng=random.Random(2)
    )
    times = [t for t, _ in arrivals]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    rate = len(times) / (200 * 3600)
    # the trace's own rate drifts over its hour, so a stretch of it runs +-20% off the mean
    assert rate == pytest.approx(60 / 3600, rel=0.2)
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert 0.9 < cv < 1.4
    tokens = sorted(r.context_tokens for _, r in arrivals)
    assert 800 < tokens[len(tokens) // 2] < 1300


@pytest.mark.parametrize("seed", range(8))
def test_a_short_run_holds_the_expected_count_wherever_it_starts(seed: int) -> None:
    # A 70-minute run at 60/h: wherever the seed's stretch starts (a burst or a lull),
    # the run holds 70 requests spread over the whole run.
    trace = load_trace(DEFAULT_TRACE)
    arrivals = scaled_arrivals(
        trace, rate_per_s=60 / 3600, duration_s=4200, rng=random.Random(seed)
    )
    times = [t for t, _ in arrivals]
    assert len(times) == 70
    assert times == sorted(times)
    assert times[0] >= 0 and times[-1] < 4200


def test_wrapping_past_the_end_keeps_the_count(tmp_path: Path) -> None:
    trace = load_trace(str(write_trace(tmp_path / "t.csv", [1.0, 2.0, 3.0])))
    for seed in range(5):
        arrivals = scaled_arrivals(trace, rate_per_s=0.5, duration_s=40, rng=random.Random(seed))
        assert len(arrivals) == 20
        assert all(0 <= t < 40 for t, _ in arrivals)
