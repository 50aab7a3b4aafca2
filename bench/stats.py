"""Percentiles only where the samples support them.

A p95 read from fewer than 20 samples, or a p99 from fewer than 100, is the maximum (or
close to it) under another name. :func:`percentile` refuses such a request, so a
benchmark cannot publish one by accident, and :func:`summary` leaves the unsupported
percentiles out and always records ``n``.
"""

from __future__ import annotations

import random
import statistics

#: The fewest samples a percentile may be read from.
MIN_SAMPLES = {0.50: 1, 0.95: 20, 0.99: 100}


class TooFewSamples(ValueError):
    """A percentile was asked of fewer samples than support it."""


def min_samples(q: float) -> int:
    """The fewest samples that support the ``q`` quantile (``1 / (1 - q)``, at least 1)."""
    if q in MIN_SAMPLES:
        return MIN_SAMPLES[q]
    return max(1, round(1 / (1 - q))) if q < 1 else 1


def supported(n: int, q: float) -> bool:
    return n >= min_samples(q)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; :class:`TooFewSamples` when
    ``len(values)`` is below :func:`min_samples`."""
    need = min_samples(q)
    if len(values) < need:
        raise TooFewSamples(f"p{q * 100:g} needs at least {need} samples, got {len(values)}")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float], digits: int = 3) -> dict[str, float | int | None]:
    """``n``, median, p95 (None below 20 samples), p99 (None below 100) and max."""
    out: dict[str, float | int | None] = {"n": len(values)}
    if not values:
        return out | {"p50_s": None, "p95_s": None, "p99_s": None, "max_s": None}
    out["p50_s"] = round(statistics.median(values), digits)
    for q, key in ((0.95, "p95_s"), (0.99, "p99_s")):
        out[key] = round(percentile(values, q), digits) if supported(len(values), q) else None
    out["max_s"] = round(max(values), digits)
    return out


#: Resamples of a bootstrap interval, and its coverage.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_LEVEL = 0.95


def bootstrap_interval(
    values: list[float],
    q: float,
    *,
    against: list[float] | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """The percentile bootstrap interval (:data:`BOOTSTRAP_LEVEL`) of the ``q`` quantile of
    ``values``, or, with ``against``, of the ratio of that quantile to the same quantile of
    ``against`` (the two samples resampled independently). None when either sample is too
    small for the quantile (:func:`supported`). Deterministic for ``seed``."""
    if not supported(len(values), q) or (against is not None and not supported(len(against), q)):
        return None
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        x = percentile(rng.choices(values, k=len(values)), q)
        if against is not None:
            x /= percentile(rng.choices(against, k=len(against)), q)
        stats.append(x)
    tail = (1 - BOOTSTRAP_LEVEL) / 2
    return (percentile(stats, tail), percentile(stats, 1 - tail))
