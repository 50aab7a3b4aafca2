"""The adversary's regression scenarios (scenarios/regressions): each is a valid scenario
with its loss recorded, and the record is what today's policy does there.

These pin the record, not a fix: the policy work that fixes a failure class changes the
figures (and updates losses.json, through scripts/gate's comparison) on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.sim.support import SCENARIOS

from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize
from accelmux.sim.scenario import load_scenario

FOLDER = SCENARIOS / "regressions"
RECORD = FOLDER / "losses.json"
FILES = sorted(FOLDER.glob("*.yaml"))
LOSSES: dict[str, dict[str, object]] = (
    json.loads(RECORD.read_text(encoding="utf-8"))["scenarios"] if RECORD.is_file() else {}
)


def test_every_file_has_its_loss_recorded() -> None:
    assert sorted(p.name for p in FILES) == sorted(LOSSES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_each_is_a_scenario_that_runs_its_losing_seed(path: Path) -> None:
    scn = load_scenario(path)
    assert scn.config.simulation.seeds > int(str(LOSSES[path.name]["seed"]))


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_recorded_loss_is_todays(path: Path) -> None:
    entry = LOSSES[path.name]
    report = summarize(Simulation(load_scenario(path), "accelmux", int(str(entry["seed"]))).run())
    now = {c: v["slo_attainment"] for c, v in report["classes"].items() if v["requests"]}
    recorded = entry["accelmux"]
    assert isinstance(recorded, dict)
    assert {c: round(v, 9) for c, v in now.items()} == {
        c: round(float(v), 9) for c, v in recorded.items()
    }
