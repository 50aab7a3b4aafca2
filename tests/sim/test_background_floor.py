"""The background floor in the simulator: cameras running all night keep their frames when a
maintenance window opens for batch work that cannot fit beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from accelmux.core.types import ServiceKind
from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize

from .support import scenario


def _night(steady: bool | None) -> dict[str, Any]:
    """A 4 GiB device: a detector fed by two cameras, and an indexing job whose window
    opens two minutes in; the two models cannot both be loaded."""
    detect: dict[str, Any] = {
        "kind": "detect",
        "class": "background",
        "residency": "warm",
        "memory": {"weights": "2GiB", "runtime": "200MiB", "workspace": "64MiB"},
        "queue": {"deadline_s": 2},
        "slo": {"latency_s": 1.0},
    }
    if steady is not None:
        detect["steady"] = steady
    return {
        "devices": {"gpu": {"kind": "virtual", "capacity": "4GiB", "headroom": "256MiB"}},
        "services": {
            "detect": detect,
            "embed": {
                "kind": "embeddings",
                "class": "batch",
                "residency": "on-demand",
                "windows": ["00:00-06:00"],
                "memory": {"weights": "1500MiB", "runtime": "200MiB", "workspace": "64MiB"},
                "queue": {"deadline_s": 600},
                "slo": {"latency_s": 60},
            },
        },
        "workloads": [
            {"type": "camera", "service": "detect", "cameras": 2, "fps": 2},
            {
                "type": "indexing",
                "service": "embed",
                "documents": 3000,
                "outstanding": 4,
                "units": {"mean": 24, "cv": 0.8, "min": 1, "max": 128},
                "at": "00:00",
            },
        ],
        "simulation": {
            "duration_s": 900,
            "start": "23:58",
            "seeds": 1,
            "warmup_s": 0,
            "services": {
                "detect": {"share": 0.3, "base_s": 0.02, "per_unit_s": 0.02},
                "embed": {"share": 0.7, "base_s": 0.05, "per_unit_s": 0.01},
            },
        },
    }


def test_a_service_cameras_feed_is_steady_unless_its_section_says_not(tmp_path: Path) -> None:
    def steady_of(setting: bool | None) -> dict[str, bool]:
        spec = scenario(tmp_path, _night(setting)).manager_spec()
        return {s.name: s.steady for s in spec.services}

    assert steady_of(None) == {"detect": True, "embed": False}
    assert steady_of(False) == {"detect": False, "embed": False}


@pytest.mark.parametrize(("steady", "kept"), [(None, True), (False, False)])
def test_cameras_keep_their_frames_when_the_indexing_window_opens(
    tmp_path: Path, steady: bool | None, kept: bool
) -> None:
    out = summarize(Simulation(scenario(tmp_path, _night(steady)), "accelmux", 0).run())
    cameras = out["services"]["detect"]
    if kept:
        assert cameras["evictions"] == 0
        assert cameras["slo_attainment"] >= 0.99
    else:  # without the floor the window's batch work takes the detector's memory
        assert cameras["evictions"] >= 1
        assert cameras["slo_attainment"] < 0.5


def test_a_camera_service_of_the_daemon_is_steady_by_default() -> None:
    from accelmux.config.load import load_config_data
    from accelmux.config.specs import to_manager_spec

    def spec_of(extra: dict[str, Any]) -> bool:
        cfg = load_config_data(
            {
                "devices": {"gpu": {"kind": "virtual", "capacity": "4GiB"}},
                "services": {
                    "cam": {"kind": ServiceKind.CAMERA.value, "class": "background", **extra}
                },
            },
            "test",
        )
        (svc,) = to_manager_spec(cfg).services
        return svc.steady

    assert spec_of({}) is True
    assert spec_of({"steady": False}) is False


@pytest.mark.parametrize("home", [0, 3, 6])
def test_generated_night_homes_keep_the_cameras_frames(home: int) -> None:
    """Night-cameras homes where the floor alone kept under 99% of the frames: a detector
    that ran out of memory reloads into the window's batch memory (3). On a shared-memory
    device (0, 6) the frames that arrive while voice work runs yield its compute: they
    are delayed or skipped, and counted; every other frame is served."""
    from accelmux.sim.generate import generate_home

    scn = generate_home(home, duration_s=1800, kind="night-cameras").scenario()
    run = Simulation(scn, "accelmux", 0).run()
    out = summarize(run)
    frames = out["classes"]["background"]
    skipped = sum(s.skipped_for_realtime for s in run.manager.world.services.values())
    assert frames["slo_attainment"] + skipped / frames["requests"] >= 0.99
    if home in (0, 6):
        assert skipped > 0
