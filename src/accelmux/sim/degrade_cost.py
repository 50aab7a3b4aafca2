"""The simulator's cost model of a degraded form: the **layer-split cost model** (a model,
not a measurement; ``simulation.degrade_cost`` in a scenario sets its figures).

A request on a form of a service that may degrade (:mod:`accelmux.core.degrade`) takes
the time it would on the full form, with each part stretched by where the layers run:
``gpu_share`` of the work at GPU speed, the rest at the CPU's slowdown. An LLM's prompt
(prefill: compute-bound) and its tokens (decode: bound by memory bandwidth) slow down by
different factors; other work (embeddings, speech) by a third. The defaults are the
ratios of a home GPU to a desktop CPU: decode ~8x (about 900 against 80 GB/s of memory
bandwidth), prefill ~25x (tens of TFLOPS against about one), other work ~10x. Copying
activations between the two for a split model is not modelled (it is small next to the
CPU's share).
"""

from __future__ import annotations

from pydantic import Field

from accelmux.config.schema import StrictModel
from accelmux.core.degrade import Variant, layer_split_slowdown


class DegradeCostConfig(StrictModel):
    """The layer-split cost model's figures: how many times slower each part of a
    request runs on the CPU than on the GPU."""

    cpu_prefill_slowdown: float = Field(25.0, ge=1.0, le=1000.0)
    cpu_decode_slowdown: float = Field(8.0, ge=1.0, le=1000.0)
    cpu_other_slowdown: float = Field(10.0, ge=1.0, le=1000.0)

    def stretch(
        self, variant: Variant | None, *, is_llm: bool, work: float, prefill: float
    ) -> tuple[float, float]:
        """(work, prefill) of a request on ``variant``, from its solo figures on the
        full form (``work`` includes ``prefill``)."""
        if variant is None or not variant.degraded:
            return work, prefill
        share = variant.gpu_share
        if not is_llm:
            return work * layer_split_slowdown(share, self.cpu_other_slowdown), prefill
        slow_prefill = prefill * layer_split_slowdown(share, self.cpu_prefill_slowdown)
        decode = (work - prefill) * layer_split_slowdown(share, self.cpu_decode_slowdown)
        return slow_prefill + decode, slow_prefill
