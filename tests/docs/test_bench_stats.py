"""The benchmarks' percentiles: never read from fewer samples than support them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import stats

samples = st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1)


@pytest.mark.parametrize(("q", "need"), [(0.95, 20), (0.99, 100)])
def test_a_percentile_of_too_few_samples_is_refused(q: float, need: int) -> None:
    with pytest.raises(stats.TooFewSamples, match=f"at least {need}"):
        stats.percentile([1.0] * (need - 1), q)
    assert stats.percentile([1.0] * need, q) == 1.0


def test_the_summary_leaves_out_what_the_samples_do_not_support() -> None:
    eight = stats.summary([float(i) for i in range(8)])
    assert eight["n"] == 8 and eight["p95_s"] is None and eight["p99_s"] is None
    assert eight["max_s"] == 7.0
    thirty = stats.summary([float(i) for i in range(30)])
    assert thirty["p95_s"] == 28.0 and thirty["p99_s"] is None


@given(samples, st.sampled_from([0.5, 0.95, 0.99]))
def test_a_percentile_is_one_of_the_samples_and_grows_with_q(values: list[float], q: float) -> None:
    values = values * 100  # enough samples for every q
    p = stats.percentile(values, q)
    assert p in values
    assert stats.percentile(values, 0.5) <= p <= max(values)


def test_a_bootstrap_interval_holds_the_estimate_and_is_repeatable() -> None:
    values = [1.0 + 0.01 * i for i in range(100)]
    lo, hi = stats.bootstrap_interval(values, 0.5) or (0.0, 0.0)
    assert lo <= stats.percentile(values, 0.5) <= hi and hi - lo < 0.3
    assert stats.bootstrap_interval(values, 0.5) == (lo, hi)
    assert stats.bootstrap_interval(values[:19], 0.95) is None


def test_a_bootstrap_ratio_of_equal_samples_straddles_one() -> None:
    values = [1.0 + 0.01 * (i * 37 % 100) for i in range(100)]
    lo, hi = stats.bootstrap_interval(values, 0.95, against=list(values)) or (0.0, 0.0)
    assert lo <= 1.0 <= hi
    doubled = [2 * v for v in values]
    lo, hi = stats.bootstrap_interval(doubled, 0.5, against=values) or (0.0, 0.0)
    assert 1.7 < lo <= 2.0 <= hi < 2.3
