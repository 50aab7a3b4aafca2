"""Memory estimates and their calibration from observed peaks and measured loads."""

from __future__ import annotations

import math

import pytest

from accelmux.core.events import Demand
from accelmux.core.profiles import (
    RATIO_MARGIN,
    RatioCalibrator,
    RequestEstimate,
    ServiceCalibration,
    estimate_request,
)
from accelmux.core.specs import MemoryProfile
from accelmux.core.types import MIB


def test_llm_estimate_is_kv_per_token_times_tokens_plus_workspace() -> None:
    profile = MemoryProfile(weights=0, kv_bytes_per_token=1000, workspace=50)
    est = estimate_request(profile, Demand(kv_tokens=300, units=2.0))
    assert est == RequestEstimate(kv_bytes=300_000, active_bytes=50)
    assert est.total == 300_050


def test_unit_demand_scales_activation_and_rounds_up() -> None:
    profile = MemoryProfile(weights=0, workspace=10, per_unit=2.5)
    assert estimate_request(profile, Demand(units=3.0)).active_bytes == 10 + math.ceil(7.5)
    assert estimate_request(profile, Demand()).active_bytes == 10


def test_calibrator_without_observations_uses_the_safety_factor() -> None:
    cal = RatioCalibrator(window=8, safety_factor=1.2)
    assert cal.observations == 0
    assert cal.factor == 1.2
    assert cal.project(100) == 120
    assert cal.project(0) == 0


def test_few_observations_never_go_below_the_safety_factor() -> None:
    cal = RatioCalibrator(window=16, safety_factor=1.2)
    for _ in range(7):
        cal.observe(100, 50)
    assert cal.factor == 1.2


def test_enough_small_observations_let_the_factor_fall_towards_one() -> None:
    cal = RatioCalibrator(window=16, safety_factor=1.2)
    for _ in range(8):
        cal.observe(100, 100)
    assert cal.factor == pytest.approx(RATIO_MARGIN)
    for _ in range(8):
        cal.observe(100, 10)
    assert cal.factor == pytest.approx(RATIO_MARGIN)  # the worst recent ratio still counts
    cal2 = RatioCalibrator(window=8, safety_factor=1.2)
    for _ in range(8):
        cal2.observe(100, 10)
    assert cal2.factor == 1.0  # never below 1


def test_a_large_peak_raises_the_factor_above_safety() -> None:
    cal = RatioCalibrator(window=8, safety_factor=1.2)
    cal.observe(100, 200)
    assert cal.factor == pytest.approx(2.0 * RATIO_MARGIN)
    assert cal.project(1000) == math.ceil(1000 * (2.0 * RATIO_MARGIN))


def test_old_observations_leave_the_window() -> None:
    cal = RatioCalibrator(window=8, safety_factor=1.0)
    cal.observe(100, 300)
    for _ in range(8):
        cal.observe(100, 100)
    assert cal.observations == 8
    assert cal.factor == pytest.approx(RATIO_MARGIN)


def test_meaningless_observations_are_ignored() -> None:
    cal = RatioCalibrator(window=8, safety_factor=1.2)
    cal.observe(0, 100)
    cal.observe(-1, 100)
    cal.observe(100, -1)
    assert cal.observations == 0


def test_service_calibration_learns_active_memory_net_of_kv() -> None:
    cal = ServiceCalibration(window=8, safety_factor=1.0)
    est = RequestEstimate(kv_bytes=500 * MIB, active_bytes=100 * MIB)
    cal.observe_request(est, peak_bytes=500 * MIB + 300 * MIB)
    assert cal.project_active(est) == math.ceil(100 * MIB * (3.0 * RATIO_MARGIN))
    # a peak below the KV share counts as zero active memory, not negative
    cal2 = ServiceCalibration(window=8, safety_factor=1.0)
    cal2.observe_request(est, peak_bytes=10)
    assert cal2.active.observations == 1
    assert cal2.project_active(est) == 100 * MIB


def test_resident_projection_uses_measured_loads() -> None:
    cal = ServiceCalibration(window=8, safety_factor=1.5)
    assert cal.project_resident(1000) == 1000  # no safety factor before any measurement
    cal.observe_load(1000, 1500)
    assert cal.project_resident(1000) == math.ceil(1000 * (1.5 * RATIO_MARGIN))
    cal2 = ServiceCalibration(window=8, safety_factor=1.5)
    cal2.observe_load(1000, 500)
    assert cal2.project_resident(1000) == 1000  # smaller than estimated: never below it
