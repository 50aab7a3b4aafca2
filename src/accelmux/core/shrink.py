"""A batch service that may shrink: how small its batch and its parallelism may get.

A request's activation memory is ``workspace + per_unit x units``
(:func:`accelmux.core.profiles.estimate_request`). A service that declares a
:class:`BatchShrink` may run a request's units in smaller batches, one after another: a
*batch fraction* ``f`` holds ``workspace + per_unit x units x f`` at a time and takes
more passes over the work (the simulator's micro-batch cost model says how much longer).
While it runs shrunk, it also runs fewer requests at once (:meth:`BatchShrink.parallel`).
The policy shrinks it when its full batch cannot be held without evicting a higher class
or stopping work, and grows it back, from free memory only, when room returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accelmux.core.events import Demand
from accelmux.core.types import require

#: The full batch.
FULL = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchShrink:
    """``min_fraction``: the smallest share of its batch a request may run with;
    ``min_parallel``: the fewest requests it runs at once while shrunk."""

    min_fraction: float
    min_parallel: int = 1

    def __post_init__(self) -> None:
        require(0 < self.min_fraction < 1, "shrink: min_fraction must be in (0, 1)")
        require(self.min_parallel >= 1, "shrink: min_parallel must be >= 1")

    def fractions(self) -> tuple[float, ...]:
        """The batch fractions it may run with, largest first: the full batch, then
        halving, down to ``min_fraction``."""
        out = [FULL]
        f = FULL / 2
        while f > self.min_fraction:
            out.append(f)
            f /= 2
        out.append(self.min_fraction)
        return tuple(out)

    def parallel(self, fraction: float, concurrency: int) -> int:
        """How many requests run at once at ``fraction`` of the batch: the configured
        concurrency scaled alike, never below ``min_parallel`` (nor above the full)."""
        if fraction >= FULL:
            return concurrency
        return min(concurrency, max(self.min_parallel, math.ceil(concurrency * fraction)))


def scaled_demand(demand: Demand, fraction: float) -> Demand:
    """The demand of one pass at ``fraction`` of the batch: its units scaled (the KV
    tokens and the tokens in and out are the request's own)."""
    return Demand(
        kv_tokens=demand.kv_tokens,
        units=demand.units * fraction,
        prompt_tokens=demand.prompt_tokens,
        output_tokens=demand.output_tokens,
    )
