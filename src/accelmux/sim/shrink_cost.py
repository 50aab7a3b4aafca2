"""The simulator's cost model of a shrunk batch: the **micro-batch cost model** (a model,
not a measurement; ``simulation.shrink_cost`` in a scenario sets its figure).

A request run at a batch fraction ``f`` (:mod:`accelmux.core.shrink`) goes over its units
in ``ceil(1/f)`` passes. Each pass pays the request's fixed cost again (``base_s``: the
call into the model, a kernel launch, reading the weights once more), and the per-unit
work runs less efficiently the smaller the batch (an accelerator kept less busy):
``per_unit work x (1 + batch_efficiency_loss x (1 - f))``. An LLM's prompt is processed in
smaller micro-batches the same way (its tokens, bound by memory bandwidth, do not change).
"""

from __future__ import annotations

import math

from pydantic import Field

from accelmux.config.schema import StrictModel


class ShrinkCostConfig(StrictModel):
    """The micro-batch cost model's figure."""

    batch_efficiency_loss: float = Field(0.3, ge=0.0, le=10.0)

    def stretch(
        self, fraction: float, *, is_llm: bool, work: float, prefill: float, base_s: float
    ) -> tuple[float, float]:
        """(work, prefill) of a request run at ``fraction`` of its batch, from its solo
        figures at the full batch (``work`` includes ``prefill``)."""
        if fraction >= 1.0:
            return work, prefill
        slower = 1.0 + self.batch_efficiency_loss * (1.0 - fraction)
        if is_llm:
            slow_prefill = prefill * slower
            return work - prefill + slow_prefill, slow_prefill
        passes = math.ceil(1.0 / fraction - 1e-9)
        per_unit = max(0.0, work - base_s)
        return base_s * passes + per_unit * slower, prefill
