"""The executor: load times, OOM crashes and what they break, preemption, sampling."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.sim.support import scenario, tiny

from accelmux.core.events import BackendCrashed, LoadFinished, MemorySampled, ResizeFinished
from accelmux.core.types import MIB
from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize


def test_load_takes_true_weights_over_bandwidth_plus_init(tmp_path: Path) -> None:
    data = tiny()
    data["devices"]["gpu"]["load_bandwidth"] = "1GB"
    data["simulation"]["error"] = {"enabled": False}
    sim = Simulation(scenario(tmp_path, data), "accelmux", 1, duration_s=60, record_events=True)
    sim.run()
    (t, ev) = next((t, e) for t, e in sim.events if isinstance(e, LoadFinished))
    assert ev.service == "asr"
    assert ev.weights_bytes == 500 * MIB
    assert t == pytest.approx(500 * MIB / 1e9 + 0.5)


def test_memory_samples_report_true_usage(tmp_path: Path) -> None:
    sim = Simulation(scenario(tmp_path), "accelmux", 1, duration_s=30, record_events=True)
    sim.run()
    samples = [e for _, e in sim.events if isinstance(e, MemorySampled)]
    assert len(samples) == 30
    last = samples[-1]
    assert last.used_bytes == sum(last.per_service.values())
    assert "asr" in last.per_service


def _collide(tmp_path: Path) -> dict[str, object]:
    data = tiny()
    data["devices"]["gpu"]["capacity"] = "4GiB"
    data["services"] = {
        "img": {
            "kind": "image",
            "class": "interactive",
            "residency": "warm",
            "concurrency": 3,
            "memory": {"weights": "2GiB", "workspace": "700MiB"},
            "queue": {"deadline_s": 60},
            "slo": {"latency_s": 30},
        }
    }
    data["workloads"] = [{"type": "poisson", "service": "img", "rate_per_h": 1800, "units": 0}]
    data["simulation"]["services"] = {"img": {"share": 1.0, "base_s": 4.0}}
    return data


def test_peaks_that_collide_crash_the_runtime_and_fail_its_requests(tmp_path: Path) -> None:
    data = _collide(tmp_path)
    sim = Simulation(scenario(tmp_path, data), "independent", 2, duration_s=600, record_events=True)
    report = summarize(sim.run())
    assert report["oom_events"] >= 1
    assert all(o["what"] == "request" for o in report["ooms"])
    assert report["oom_broken_requests"] >= 2  # the one that crossed and its neighbours
    assert any(isinstance(e, BackendCrashed) for _, e in sim.events)
    assert report["services"]["img"]["loads"] >= 2  # restarted after the crash
    assert report["failures"].get("backend_crashed", 0) >= 2


def test_accelmux_reserves_and_does_not_oom_on_the_same_load(tmp_path: Path) -> None:
    data = _collide(tmp_path)
    report = summarize(Simulation(scenario(tmp_path, data), "accelmux", 2, duration_s=600).run())
    assert report["oom_events"] == 0
    assert report["services"]["img"]["requests"] > 100


def test_resizes_are_answered_after_resize_s(tmp_path: Path) -> None:
    data = tiny()
    data["simulation"]["resize_s"] = 0.25
    sim = Simulation(
        scenario(tmp_path, data),
        "accelmux",
        1,
        duration_s=300,
        record_events=True,
        record_decisions=True,
    )
    sim.run()
    asked = [(t, d) for t, d in ((d["t"], d) for d in sim.decisions) if d["action"] == "resize"]
    answered = [(t, e) for t, e in sim.events if isinstance(e, ResizeFinished)]
    assert asked, "the chat pool never resized"
    assert len(answered) >= len(asked) - 1  # the last may still be under way
    for (t_ask, d), (t_done, e) in zip(asked, answered, strict=False):
        assert e.kv_pool_bytes == d["kv_pool_bytes"]
        assert t_done == pytest.approx(t_ask + 0.25)


def test_a_pool_fixed_until_the_next_load_is_never_resized(tmp_path: Path) -> None:
    data = tiny()
    # An external server whose context is templated: it declares resize at next load.
    data["services"]["chat"]["backend"] = {
        "type": "external",
        "argv": ["llama-server", "--port", "{port}", "--ctx-size", "{ctx_size}"],
    }
    sim = Simulation(scenario(tmp_path, data), "accelmux", 1, duration_s=300, record_decisions=True)
    sim.run()
    assert [d for d in sim.decisions if d["action"] == "load" and d["service"] == "chat"]
    assert not [d for d in sim.decisions if d["action"] == "resize"]
    assert sim.ooms == []
