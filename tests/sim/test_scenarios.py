"""Scenario files: strict validation, ``accelmux check``, and a smoke run of each."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.sim.support import SCENARIOS, scenario, tiny, write_scenario

from accelmux.cli import main
from accelmux.errors import ConfigError
from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize
from accelmux.sim.scenario import load_scenario

SCENARIO_FILES = sorted(SCENARIOS.glob("*.yaml"))


def test_the_four_scenarios_exist() -> None:
    names = {p.stem for p in SCENARIO_FILES}
    assert {"home-evening", "burst", "small-gpu", "shared-memory-host"} <= names


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.stem)
def test_scenarios_validate(path: Path) -> None:
    scn = load_scenario(path)
    assert scn.config.workloads
    spec = scn.manager_spec()
    assert spec.services


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.stem)
def test_check_accepts_scenarios(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(path)]) == 0
    assert "OK (scenario" in capsys.readouterr().out


def test_unknown_keys_and_services_are_named(tmp_path: Path) -> None:
    data = tiny()
    data["simulation"]["bogus"] = 1
    data["workloads"].append({"type": "poisson", "service": "nope", "rate_per_h": 1})
    data["workloads"].append({"type": "camera", "service": "asr", "fps": 1, "extra": 2})
    with pytest.raises(ConfigError) as err:
        scenario(tmp_path, data)
    text = "\n".join(err.value.problems)
    assert "simulation.bogus: unknown key" in text
    assert "workloads.4.camera.extra: unknown key" in text


def test_unknown_workload_service_is_a_semantic_problem(tmp_path: Path) -> None:
    data = tiny()
    data["workloads"].append({"type": "poisson", "service": "nope", "rate_per_h": 1})
    with pytest.raises(ConfigError) as err:
        scenario(tmp_path, data)
    assert err.value.problems == ["workloads.3: unknown service (got 'nope')"]


def test_check_reports_scenario_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tiny()
    data["simulation"]["start"] = "25:00"
    path = write_scenario(tmp_path / "bad.yaml", data)
    assert main(["check", str(path)]) == 2
    assert "simulation.start" in capsys.readouterr().err


def test_check_reports_a_missing_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tiny()
    data["workloads"].append(
        {"type": "trace", "service": "chat", "rate_per_h": 60, "path": "missing.csv"}
    )
    path = write_scenario(tmp_path / "t.yaml", data)
    assert main(["check", str(path)]) == 2
    assert "trace file not found" in capsys.readouterr().err


def test_sweep_resizes_the_device_and_keeps_the_host_share(tmp_path: Path) -> None:
    data = tiny()
    data["devices"]["gpu"]["budget"] = "6GiB"
    spec = scenario(tmp_path, data).manager_spec(capacity_gib=16)
    dev = spec.devices[0]
    assert dev.capacity_bytes == 16 * 1024**3
    assert dev.budget_bytes == 14 * 1024**3


def test_home_evening_smoke_run() -> None:
    scn = load_scenario(SCENARIOS / "home-evening.yaml")
    report = summarize(Simulation(scn, "accelmux", 0, duration_s=300).run())
    assert report["oom_events"] == 0
    assert report["classes"]["realtime"]["requests"] > 0
    assert report["classes"]["background"]["requests"] > 900
