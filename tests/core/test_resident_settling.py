"""A loaded service is charged what it holds: resident leases settle to the measured load.

A load is granted its calibrated projection (the estimate times the worst ratio seen,
with a margin). When the backend reports less once loaded, the leases shrink to the
measurement, as a measurement above them is charged to the service; memory it grows
afterwards is measured like any other (``reserved``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.core.events import LoadFinished
from accelmux.core.manager import Manager
from accelmux.core.types import GIB, MIB, Category, Residency

from .support import arrive, loads, manager, plain_profile, service, unloads

RESIDENT = (Category.WEIGHTS, Category.RUNTIME)


def _resident(m: Manager, name: str) -> int:
    return sum(m.world.ledger.amount("gpu", name, c) for c in RESIDENT)


def _calibrated_img(ratio: float, *, weights: int = 2 * GIB, runtime: int = 0) -> Manager:
    """``img`` (pinned), whose earlier loads measured ``ratio`` times its estimate."""
    m = manager(
        service(
            "img",
            residency=Residency.PINNED,
            profile=plain_profile(weights=weights, runtime=runtime),
        ),
        service("other", profile=plain_profile(weights=8 * GIB + 512 * MIB)),
    )
    m.world.services["img"].calibration.observe_load(
        weights + runtime, int((weights + runtime) * ratio)
    )
    return m


def test_a_reload_measured_below_its_projection_is_charged_what_it_measured() -> None:
    m = _calibrated_img(1.5)
    m.handle(arrive("i1", "img"), 0.0)
    projected = _resident(m, "img")
    assert projected > 3 * GIB  # the worst ratio seen, with its margin
    m.handle(LoadFinished(service="img", weights_bytes=2 * GIB + 512 * MIB), 1.0)
    assert _resident(m, "img") == 2 * GIB + 512 * MIB


def test_memory_the_projection_overstated_serves_the_next_service() -> None:
    # 12 GiB less 512 MiB headroom: other (8.5 GiB + its workspace) fits beside img as
    # measured (2.5 GiB) and not beside img as projected (over 3 GiB); img is pinned.
    m = _calibrated_img(1.5)
    m.handle(arrive("i1", "img"), 0.0)
    m.handle(LoadFinished(service="img", weights_bytes=2 * GIB + 512 * MIB), 1.0)
    out = m.handle(arrive("o1", "other"), 2.0)
    assert [a.service for a in loads(out)] == ["other"]
    assert unloads(out) == []


def test_a_load_measured_above_its_grant_keeps_its_grant_and_its_excess() -> None:
    m = _calibrated_img(1.0)
    m.handle(arrive("i1", "img"), 0.0)
    granted = _resident(m, "img")
    m.handle(LoadFinished(service="img", weights_bytes=granted + GIB), 1.0)
    assert _resident(m, "img") == granted
    assert m.world.services["img"].load_excess == GIB


@settings(max_examples=60, deadline=None)
@given(
    ratio=st.floats(min_value=0.5, max_value=2.0),
    measured_share=st.floats(min_value=0.1, max_value=1.5),
    runtime=st.integers(min_value=0, max_value=GIB),
)
def test_a_loaded_service_is_charged_no_more_than_it_measured_nor_than_granted(
    ratio: float, measured_share: float, runtime: int
) -> None:
    m = _calibrated_img(ratio, runtime=runtime)
    m.handle(arrive("i1", "img"), 0.0)
    granted = _resident(m, "img")
    measured = int(granted * measured_share)
    m.handle(LoadFinished(service="img", weights_bytes=measured, runtime_bytes=0), 1.0)
    charged = _resident(m, "img")
    # The leases shrink by the surplus, rounded down per category: never below the
    # measurement, at most one byte per category above it.
    assert min(granted, measured) <= charged <= min(granted, measured) + len(RESIDENT)
    m.world.ledger.check_totals()


def test_the_cut_falls_on_the_category_the_projection_overstated() -> None:
    # A runtime's own weights (a GGUF's tensors) are exact: only the runtime lease shrinks.
    m = _calibrated_img(1.0, weights=2 * GIB, runtime=GIB)
    m.handle(arrive("i1", "img"), 0.0)
    weights = m.world.ledger.amount("gpu", "img", Category.WEIGHTS)
    m.handle(LoadFinished(service="img", weights_bytes=weights, runtime_bytes=256 * MIB), 1.0)
    assert m.world.ledger.amount("gpu", "img", Category.WEIGHTS) == weights
    assert m.world.ledger.amount("gpu", "img", Category.RUNTIME) == 256 * MIB


def test_each_category_settles_to_its_measurement_when_both_were_overstated() -> None:
    m = _calibrated_img(1.5, weights=2 * GIB, runtime=GIB)
    m.handle(arrive("i1", "img"), 0.0)
    m.handle(LoadFinished(service="img", weights_bytes=2 * GIB, runtime_bytes=512 * MIB), 1.0)
    assert m.world.ledger.amount("gpu", "img", Category.WEIGHTS) == 2 * GIB
    assert m.world.ledger.amount("gpu", "img", Category.RUNTIME) == 512 * MIB
