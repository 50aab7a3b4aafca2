"""Degrading a service instead of refusing it: the forms a service may take.

A service may declare a CPU fallback (a host device) and, for llama.cpp, a range of
layers to keep on its GPU (``degrade:`` in its config). The config then gives the
Manager one service per **form** (:class:`Variant`), as replicas of one group: the full
form on its GPU (``chat@gpu``), one form per offload level with fewer layers there
(``chat@gpu:20``) and the form on the host (``chat@cpu``). To the World each form is
an ordinary replica with its own ledger accounts; which one serves is the policy's
decision (``policies/accelmux/degrade.py``): the best form that can be held without
evicting a higher class, back to a better one when room returns.

Each form carries what the policy and the simulator need to know of it: its rank (0 is
the full form, higher is more degraded), how many layers it puts on the GPU, the share
of the model's layer bytes that is there, and how much slower a request runs on it than
on the full form (:func:`layer_split_slowdown`, an estimate the policy routes by; the
simulator's cost model is :mod:`accelmux.sim.degrade_cost`).

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

#: At most this many offload levels between a service's fewest and most layers.
MAX_OFFLOAD_LEVELS = 4


class VariantMode(StrEnum):
    FULL = "full"
    OFFLOAD = "offload"
    CPU = "cpu"


@dataclass(frozen=True, slots=True, kw_only=True)
class Variant:
    """One form of a service that may degrade."""

    rank: int
    mode: VariantMode
    #: llama.cpp's ``n_gpu_layers`` of this form: -1 all (full), 0 none (cpu).
    n_gpu_layers: int
    #: Share of the model's layer bytes on the GPU: 1.0 full, 0.0 on the CPU.
    gpu_share: float
    #: Expected seconds per request over the full form's (>= 1).
    slowdown: float

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError("variant rank must be >= 0")
        if not 0.0 <= self.gpu_share <= 1.0:
            raise ValueError("variant gpu_share must be in [0, 1]")
        if self.slowdown < 1.0:
            raise ValueError("variant slowdown must be >= 1")
        if (self.rank == 0) != (self.mode is VariantMode.FULL):
            raise ValueError("rank 0 is the full form, and only it")

    @property
    def degraded(self) -> bool:
        return self.rank > 0

    def describe(self) -> str:
        """For people: ``full``, ``20 layers on the GPU``, ``on the CPU``."""
        if self.mode is VariantMode.FULL:
            return "full"
        if self.mode is VariantMode.CPU:
            return "on the CPU"
        return f"{self.n_gpu_layers} layers on the GPU"


def layer_split_slowdown(gpu_share: float, cpu_slowdown: float) -> float:
    """Time per request with ``gpu_share`` of the layers on the GPU, over all of them
    there: each layer runs where it is, so the time is the GPU's share at GPU speed plus
    the rest at ``cpu_slowdown`` times it (copying activations between them is small)."""
    return gpu_share + (1.0 - gpu_share) * cpu_slowdown


def offload_levels(fewest: int, most: int, levels: int = MAX_OFFLOAD_LEVELS) -> list[int]:
    """The layer counts an offload range is tried at, most first: ``most``, then evenly
    down to ``fewest`` (at most ``levels`` of them, no repeats)."""
    if not 1 <= fewest <= most:
        raise ValueError(f"need 1 <= fewest <= most layers (got {fewest}, {most})")
    if levels <= 1 or fewest == most:
        return [most]
    step = (most - fewest) / (levels - 1)
    out: list[int] = []
    for i in range(levels):
        n = round(most - i * step)
        if n not in out:
            out.append(n)
    return out


def variant_name(group: str, device: str, mode: VariantMode, n_gpu_layers: int) -> str:
    """The Manager's name of one form: ``chat@gpu``, ``chat@gpu:20``, ``chat@cpu``."""
    base = f"{group}@{device}"
    return f"{base}:{n_gpu_layers}" if mode is VariantMode.OFFLOAD else base
