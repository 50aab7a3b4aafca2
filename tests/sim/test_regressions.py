"""The adversary's regression scenarios (scenarios/regressions): each is a valid scenario
with its loss recorded, the record is what today's policy does there, and a case marked
``fixed`` holds the issue's bound.

``losses.json`` marks each case ``fixed`` (no class, with at least ten requests, more
than 10 points below the best baseline of that run that gave up no higher class for it,
``bench/worst_case.traded``) or ``open`` (a loss the policy still
has: listed in docs/benchmarks.md, "The adversary", and never counted as passing). A
change to the policy updates the record with ``python bench/adversary.py --recheck``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.sim.support import REPO, SCENARIOS

from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize
from accelmux.sim.scenario import load_scenario

sys.path.insert(0, str(REPO / "bench"))

import adversary

FOLDER = SCENARIOS / "regressions"
RECORD = FOLDER / "losses.json"
FILES = sorted(FOLDER.glob("*.yaml"))
LOSSES: dict[str, dict[str, object]] = (
    json.loads(RECORD.read_text(encoding="utf-8"))["scenarios"] if RECORD.is_file() else {}
)
FIXED = [p for p in FILES if LOSSES.get(p.name, {}).get("status") == "fixed"]
BOUND_POINTS = 10.0


def test_every_file_has_its_loss_recorded() -> None:
    assert sorted(p.name for p in FILES) == sorted(LOSSES)


def test_each_case_is_fixed_or_open_as_its_losses_say() -> None:
    for name, entry in LOSSES.items():
        losses = entry["losses_points"]
        assert isinstance(losses, dict)
        worst = max((float(v) for v in losses.values()), default=0.0)
        assert entry["status"] == ("open" if worst > BOUND_POINTS else "fixed"), name


def test_every_open_case_is_listed_in_the_docs() -> None:
    docs = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for name, entry in LOSSES.items():
        if entry["status"] == "open":
            assert f"`{name}`" in docs, name


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


@pytest.mark.slow
@pytest.mark.parametrize("path", FIXED, ids=lambda p: p.stem)
def test_a_fixed_case_is_within_the_bound_of_every_baseline(path: Path) -> None:
    """Every policy run again: no class of accelmux more than 10 points below the best
    baseline of the run that gave up no higher class for it (bench/worst_case.traded)."""
    seed = int(str(LOSSES[path.name]["seed"]))
    _, losses, _ = adversary.class_losses(load_scenario(path), seed)
    assert all(100 * loss <= BOUND_POINTS for loss, _, _ in losses.values()), losses
