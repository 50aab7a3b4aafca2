"""The incremental round decides as a round that recomputes everything.

What the round keeps between rounds and skips (requests whose last consideration would
only repeat, whole turns of a device where nothing they read changed, timers instead of
walks) is checked here against the same policy with its cache off
(``AccelmuxPolicy(cache=False)``: nothing kept, nothing skipped) on the Manager
benchmark's workloads: Zipf-popular services of every class on one to three devices,
more than fit, with windows, pinned voice services, long queues of services that are
down, preemptions and evictions, with heuristics switched off at random and a realtime
grace or none. Both must return the same actions and ask for the same wake-ups.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.core.manager import Manager
from accelmux.core.policies.accelmux import HEURISTICS, AccelmuxPolicy
from accelmux.core.specs import ManagerSpec

from .test_properties import SETTINGS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_manager
import decision_stream


def stream(work: bench_manager.Workload, cache: bool, events: int, seed: int) -> list[str]:
    """The decision stream of ``events`` events of ``work`` with the cache on or off."""
    lines: list[str] = []
    real = bench_manager.Manager

    def recording(spec: ManagerSpec, policy: object) -> Manager:
        manager = real(spec, AccelmuxPolicy(cache=cache))
        decision_stream._record(manager, lines)
        return manager

    bench_manager.Manager = recording  # type: ignore[assignment,misc]
    try:
        bench_manager.run_once(work, events, seed=seed)
    finally:
        bench_manager.Manager = real  # type: ignore[misc]
    return lines


workloads = st.builds(
    lambda services, devices, seed: (services, min(devices, services), seed),
    st.integers(4, 48),
    st.integers(1, 3),
    st.integers(0, 10**6),
)
knobs = {
    "disabled": st.frozensets(st.sampled_from(sorted(HEURISTICS)), max_size=4),
    "grace": st.sampled_from([0.0, 0.0, 2.0]),
    "util": st.sampled_from([0.6, 1.5, 4.0]),
}


def assert_decides_alike(
    workload: tuple[int, int, int], disabled: frozenset[str], grace: float, util: float
) -> None:
    services, devices, seed = workload
    work = bench_manager.build_workload(services, devices, seed=seed, peak_util=util)
    spec = work.spec
    spec = replace(spec, knobs=replace(spec.knobs, disabled=disabled, realtime_grace_s=grace))
    work = replace(work, spec=spec)
    fast = stream(work, True, 500, seed)
    plain = stream(work, False, 500, seed)
    assert fast == plain


@settings(SETTINGS, max_examples=12)
@given(workload=workloads, **knobs)
def test_benchmark_workloads_decide_alike_with_the_cache_off(
    workload: tuple[int, int, int], disabled: frozenset[str], grace: float, util: float
) -> None:
    assert_decides_alike(workload, disabled, grace, util)


@pytest.mark.slow
@settings(SETTINGS, max_examples=150)
@given(workload=workloads, **knobs)
def test_benchmark_workloads_decide_alike_with_the_cache_off_at_length(
    workload: tuple[int, int, int], disabled: frozenset[str], grace: float, util: float
) -> None:
    assert_decides_alike(workload, disabled, grace, util)
