"""Zero service: the longest stretch a class asked for work that fits and got none."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tests.sim.support import SCENARIOS

from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize
from accelmux.sim.scenario import load_scenario
from accelmux.sim.zero_service import longest_gap


def test_a_demand_while_served_is_no_gap() -> None:
    assert longest_gap([5.0, 6.0], [(4.0, 10.0)], 100.0) == (0.0, None)


def test_the_gap_runs_from_the_demand_to_the_next_service() -> None:
    assert longest_gap([5.0], [(1.0, 2.0), (25.0, 30.0)], 100.0) == (20.0, 5.0)


def test_a_class_never_served_again_is_out_until_the_end() -> None:
    # a service locked out (every request refused at once) is never being served
    assert longest_gap([100.0, 200.0, 3000.0], [(10.0, 20.0)], 3600.0) == (3500.0, 100.0)


spans = st.lists(
    st.tuples(st.floats(0, 1000), st.floats(0, 100)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=20,
).map(sorted)


@given(st.lists(st.floats(0, 1000), max_size=30), spans)
def test_a_gap_never_outlasts_the_run_and_starts_at_a_demand(
    demands: list[float], raw: list[tuple[float, float]]
) -> None:
    merged: list[tuple[float, float]] = []
    for s, e in raw:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    length, at = longest_gap(demands, merged, 1100.0)
    assert 0.0 <= length <= 1100.0
    if at is None:
        assert length == 0.0
    else:
        assert at in demands and at + length <= 1100.0 + 1e-9
        # nothing was served between the demand and the end of the gap
        assert not any(s <= at <= e for s, e in merged)
        assert not any(at < s < at + length for s, _ in merged)


def test_every_class_of_a_shipped_scenario_is_served_within_five_minutes() -> None:
    scn = load_scenario(SCENARIOS / "home-evening.yaml")
    report = summarize(Simulation(scn, "accelmux", 0, duration_s=900.0).run())
    assert {"realtime", "interactive", "background"} <= set(report["zero_service"])
    assert all(v["longest_s"] < 300.0 for v in report["zero_service"].values())
