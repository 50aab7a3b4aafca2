"""Every heuristic of the accelmux policy changes its decisions somewhere.

``bench/bench_switches.py`` names, for each :class:`~accelmux.core.switches.Switch`, a
run (a shipped scenario or a generated home) where it fires. Here each run is simulated
with everything on and with that one heuristic off: the two decision streams must part.
A heuristic that no longer changes anything on its run has lost its situation (or
become dead code): give it a run that shows it, or remove it.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_switches

from accelmux.core.switches import Switch


@cache
def _everything_on(run: bench_switches.Run) -> str:
    return bench_switches.decision_digest(run, None)


def test_every_switch_has_a_run_that_shows_it() -> None:
    assert sorted(bench_switches.RUNS) == sorted(Switch)


@pytest.mark.slow
@pytest.mark.parametrize("switch", list(Switch), ids=str)
def test_turning_the_switch_off_changes_the_decisions(switch: Switch) -> None:
    run = bench_switches.RUNS[switch]
    assert bench_switches.decision_digest(run, switch) != _everything_on(run), (
        f"accelmux decides alike with {switch.value} off on {run.where} "
        f"({run.duration_s:g} s, seed {run.seed})"
    )
