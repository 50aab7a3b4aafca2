"""The stress scenarios: they validate, and short runs keep the policy's guarantees."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.sim.support import SCENARIOS

from accelmux.core.policies.accelmux import MAX_PREEMPTIONS
from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize
from accelmux.sim.scenario import load_scenario

STRESS = sorted((SCENARIOS / "stress").glob("*.yaml"))


def test_the_stress_scenarios_exist() -> None:
    names = {p.stem for p in STRESS}
    assert {
        "bias-2x",
        "load-and-request-2x",
        "noisy-image",
        "batch-no-window",
        "bursty-chat",
        "foreign-mid-burst",
        "oom-while-full",
        "three-llms-cameras",
        "voice-beside-llms-host",
        "night-indexing-beside-chat",
    } <= names


@pytest.mark.parametrize("path", STRESS, ids=lambda p: p.stem)
def test_stress_scenarios_validate(path: Path) -> None:
    assert load_scenario(path).manager_spec().services


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "seed"),
    [("bias-2x", 1), ("bias-2x", 2), ("load-and-request-2x", 1), ("load-and-request-2x", 2)],
)
def test_twice_wrong_estimates_cost_at_most_one_oom_per_service(name: str, seed: int) -> None:
    # Seed 2 of bias-2x used to preempt one image 35,000 times while ASR crashed.
    scn = load_scenario(SCENARIOS / "stress" / f"{name}.yaml")
    report = summarize(Simulation(scn, "accelmux", seed, duration_s=1500).run())
    assert report["max_preemptions_per_request"] <= MAX_PREEMPTIONS
    for service, svc in report["services"].items():
        assert svc["ooms"] <= 1, (service, svc["ooms"])
    assert report["classes"]["realtime"]["slo_attainment"] >= 0.99


@pytest.mark.slow
def test_an_oom_teaches_no_size_that_refuses_a_fitting_request_too_large() -> None:
    # Image 1.5x its estimate on a device a program keeps filling: its request runs out of
    # memory, and before the attribution every later image was refused too_large (its
    # estimate fits the empty device); now what cannot fit beside the rest is no_memory.
    scn = load_scenario(SCENARIOS / "stress" / "oom-while-full.yaml")
    report = summarize(Simulation(scn, "accelmux", 1, duration_s=2000).run())
    assert report["oom_events"] >= 1
    assert "too_large" not in report["rejections"], report["rejections"]
    assert report["classes"]["realtime"]["slo_attainment"] >= 0.99


@pytest.mark.slow
def test_voice_beside_llms_on_a_tight_host_is_never_refused() -> None:
    # The LLMs run in the worker (pause, park, weights parked in the host's RAM, which is
    # the device's): the voice chain's LLM request must not wait behind their parked copies.
    scn = load_scenario(SCENARIOS / "stress" / "voice-beside-llms-host.yaml")
    report = summarize(Simulation(scn, "accelmux", 0, duration_s=1500).run())
    realtime = report["classes"]["realtime"]
    assert realtime["rejected"] == 0
    assert realtime["slo_attainment"] >= 0.99
