"""The forms of a service that may degrade (core/degrade.py): their levels, estimates and
the spec's checks."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelmux.core.degrade import (
    Variant,
    VariantMode,
    layer_split_slowdown,
    offload_levels,
    variant_name,
)
from accelmux.core.specs import DeviceSpec, ManagerSpec, MemoryProfile, ServiceSpec
from accelmux.core.types import GIB, Residency, ServiceClass, ServiceKind


@given(fewest=st.integers(1, 80), extra=st.integers(0, 80))
def test_offload_levels_run_from_most_to_fewest_without_repeats(fewest: int, extra: int) -> None:
    most = fewest + extra
    levels = offload_levels(fewest, most)
    assert (levels[0] == most and levels[-1] == fewest) or levels == [most] == [fewest]
    assert levels == sorted(set(levels), reverse=True) and len(levels) <= 4


def test_offload_levels_refuse_a_bad_range() -> None:
    with pytest.raises(ValueError, match="fewest <= most"):
        offload_levels(5, 4)


def test_layer_split_slowdown_is_the_share_on_each_side() -> None:
    assert layer_split_slowdown(1.0, 8.0) == 1.0
    assert layer_split_slowdown(0.0, 8.0) == 8.0
    assert layer_split_slowdown(0.5, 8.0) == 4.5


def test_variant_checks_and_names() -> None:
    with pytest.raises(ValueError, match="rank 0 is the full form"):
        Variant(rank=0, mode=VariantMode.CPU, n_gpu_layers=0, gpu_share=0.0, slowdown=8.0)
    with pytest.raises(ValueError, match="slowdown"):
        Variant(rank=1, mode=VariantMode.CPU, n_gpu_layers=0, gpu_share=0.0, slowdown=0.5)
    assert variant_name("chat", "gpu", VariantMode.OFFLOAD, 20) == "chat@gpu:20"
    assert variant_name("chat", "cpu", VariantMode.CPU, 0) == "chat@cpu"
    cpu = Variant(rank=2, mode=VariantMode.CPU, n_gpu_layers=0, gpu_share=0.0, slowdown=8.0)
    assert cpu.degraded and cpu.describe() == "on the CPU"


def _spec(ranks: list[int]) -> ManagerSpec:
    gpu = DeviceSpec(
        name="gpu", kind="virtual", capacity_bytes=8 * GIB, budget_bytes=8 * GIB, headroom_bytes=0
    )
    base = ServiceSpec(
        name="chat",
        kind=ServiceKind.CHAT,
        cls=ServiceClass.INTERACTIVE,
        residency=Residency.WARM,
        device="gpu",
        profile=MemoryProfile(weights=GIB),
    )
    services = []
    for rank in ranks:
        mode = VariantMode.FULL if rank == 0 else VariantMode.OFFLOAD
        variant = Variant(
            rank=rank,
            mode=mode,
            n_gpu_layers=-1 if rank == 0 else 10,
            gpu_share=1.0 if rank == 0 else 0.5,
            slowdown=1.0 + rank,
        )
        services.append(
            dataclasses.replace(base, name=f"chat@gpu:{rank}", group="chat", variant=variant)
        )
    return ManagerSpec(devices=(gpu,), services=tuple(services))


def test_the_spec_wants_forms_ranked_from_zero() -> None:
    assert len(_spec([0, 1]).services) == 2
    with pytest.raises(ValueError, match="ranked 0, 1"):
        _spec([0, 2])
