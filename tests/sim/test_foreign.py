"""Foreign programs as they are: they take their memory and compute whatever accelmux
thinks, and the policies are scored on what they do to them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.sim.support import scenario, tiny

from accelmux.core.types import GIB, MIB
from accelmux.errors import ConfigError
from accelmux.sim.compute import ComputeDevice, Job
from accelmux.sim.executor import RunOutput, Simulation
from accelmux.sim.metrics import summarize
from accelmux.sim.physical import PhysicalDevice


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_foreign_program_takes_all_it_asks_and_over_commits_a_full_device() -> None:
    clock = _Clock()
    dev = PhysicalDevice("gpu", 4 * GIB, clock=clock)
    assert dev.load("a", 3 * GIB, 0, caching=False)
    assert dev.set_foreign("game", 2 * GIB) == GIB  # it holds what was free, asks for all
    assert dev.used == 5 * GIB
    assert dev.over_committed == GIB
    # no managed allocation fits any more: each one is an OOM
    assert not dev.start_request("a", "r1", MIB)
    assert not dev.load("b", MIB, 0, caching=False)
    clock.t = 10.0
    dev.free("a")  # the service crashed or was evicted: the game gets the rest
    assert dev.over_committed == 0
    (game,) = dev.processes
    assert game.short == 0
    assert game.whole_at == 10.0
    assert game.wait_s(60.0) == 10.0
    clock.t = 20.0
    dev.set_foreign("game", 0)
    assert dev.used == 0
    assert game.short_byte_s == pytest.approx(GIB * 10.0)
    assert game.asked_byte_s == pytest.approx(2 * GIB * 20.0)


def test_the_excess_falls_on_the_foreign_program_that_started_last() -> None:
    dev = PhysicalDevice("gpu", 10 * GIB)
    assert dev.load("a", 6 * GIB, 0, caching=False)
    dev.set_foreign("browser", 2 * GIB)
    dev.set_foreign("game", 4 * GIB)
    browser, game = dev.processes
    assert (browser.short, game.short) == (0, 2 * GIB)
    assert browser.whole_at == 0.0
    assert game.whole_at is None
    dev.end_request("a", "none")  # nothing freed: nothing changes
    assert game.short == 2 * GIB


def test_a_free_only_foreign_program_is_short_of_the_rest_for_its_whole_life() -> None:
    clock = _Clock()
    dev = PhysicalDevice("gpu", 4 * GIB, clock=clock)
    dev.load("a", 3 * GIB, 0, caching=False)
    assert dev.set_foreign("x", 2 * GIB, free_only=True) == GIB
    assert dev.used == 4 * GIB
    clock.t = 5.0
    dev.free("a")  # it never asks again
    (x,) = dev.processes
    assert x.short == GIB
    clock.t = 8.0
    dev.set_foreign("x", 0)
    assert x.whole_at is None
    assert x.wait_s(100.0) == 8.0
    assert x.short_byte_s == pytest.approx(GIB * 8.0)


def test_a_foreign_compute_share_slows_the_jobs_on_its_device() -> None:
    comp = ComputeDevice("gpu")
    comp.add(Job(rid="a", service="s", share=0.5, work=1.0, prefill=0.0, started_at=0.0), 0.0)
    assert comp.next_completion() == 1.0
    version = comp.version
    comp.set_foreign_share(1.0, 0.0)  # a game at full tilt: 0.5 + 1.0 -> 1/1.5 speed
    assert comp.version != version  # the scheduled completion is stale
    assert comp.next_completion() == pytest.approx(1.5)
    comp.set_foreign_share(0.0, 0.75)  # half the work done by then
    assert comp.next_completion() == pytest.approx(1.25)
    isolated = ComputeDevice("gpu", isolated=True)
    isolated.set_foreign_share(1.0, 0.0)
    assert isolated.rate == 1.0  # the oracle's bound has no contention


def _full_device(
    *, residency: str = "pinned", service_class: str = "realtime", **game: Any
) -> dict[str, Any]:
    """An 8 GiB device nearly full of one service (6.5 GiB true), a 4 GiB game at 100 s
    for 100 s, and a request every 2 s from 150 s on (none with ``rate_per_h`` 0)."""
    data = tiny()
    data["devices"]["gpu"]["capacity"] = "8GiB"
    data["services"] = {
        "big": {
            "kind": "asr",
            "class": service_class,
            "residency": residency,
            "ttl_s": 3600,
            "init_s": 0.5,
            "memory": {"weights": "6GiB", "runtime": "512MiB", "workspace": "64MiB"},
            "slo": {"latency_s": 1.0},
        }
    }
    data["workloads"] = [
        {"type": "poisson", "service": "big", "rate_per_h": 1800, "units": 1.0, "from_s": 150}
    ]
    data["simulation"].update(
        {
            "duration_s": 300,
            "error": {"enabled": False},
            "services": {"big": {"share": 0.5, "base_s": 0.05, "per_unit_s": 0.01}},
            "foreign": [{"name": "game", "at_s": 100, "bytes": "4GiB", "duration_s": 100, **game}],
        }
    )
    return data


def _run(tmp_path: Path, data: dict[str, Any], policy: str = "static") -> RunOutput:
    return Simulation(scenario(tmp_path, data), policy, 1).run()


def test_a_game_starting_on_a_full_device_is_not_refused_and_the_service_ooms(
    tmp_path: Path,
) -> None:
    sim = Simulation(scenario(tmp_path, _full_device()), "static", 1)
    out = sim.run()
    # the pinned service's next allocation after the game came is an OOM, which frees
    # its memory for the game
    ooms = [o for o in out.ooms if o.service == "big"]
    assert ooms
    assert 100.0 <= ooms[0].time < 200.0
    assert ooms[0].used > ooms[0].capacity  # the game over-committed the device
    (game,) = out.foreign
    assert game.asked == 4 * GIB
    assert game.whole_at == pytest.approx(ooms[0].time)
    report = summarize(out)
    assert report["oom_events"] >= 1
    assert report["foreign"]["programs"] == 1
    assert report["foreign"]["never_whole"] == 0
    assert 0.0 < report["foreign"]["starved_share"] < 1.0


def test_the_policy_evicts_an_idle_service_after_the_next_sample(tmp_path: Path) -> None:
    data = _full_device(residency="warm", service_class="interactive")
    data["workloads"][0]["from_s"] = 250  # idle while the game runs
    out = _run(tmp_path, data, "accelmux")
    (game,) = out.foreign
    assert not [o for o in out.ooms if 100.0 <= o.time < 200.0]
    assert game.whole_at is not None
    # seen at the sample after 100 s, evicted, freed after unload_s
    assert 100.0 < game.whole_at <= 100.0 + 1.0 + 0.5 + 1e-6
    report = summarize(out)["foreign"]
    assert report["wait_s_max"] == pytest.approx(game.whole_at - 100.0)


def test_the_foreign_metrics_on_a_hand_made_run(tmp_path: Path) -> None:
    """No requests at all: the pinned 6.5 GiB stays, the game is short of the excess for
    its whole 100 s life, regardless or free-only."""
    for allocates in ("regardless", "free-only"):
        data = _full_device(allocates=allocates)
        data["workloads"][0]["from_s"] = 299
        out = _run(tmp_path, data)
        assert not out.ooms
        phys_used = 6 * GIB + 512 * MIB
        short = phys_used + 4 * GIB - 8 * GIB
        foreign = summarize(out)["foreign"]
        assert foreign["programs"] == 1
        assert foreign["asked_byte_s"] == pytest.approx(4 * GIB * 100.0)
        assert foreign["short_byte_s"] == pytest.approx(short * 100.0)
        assert foreign["starved_share"] == pytest.approx(short / (4 * GIB))
        assert foreign["wait_s_mean"] == pytest.approx(100.0)
        assert foreign["wait_s_max"] == pytest.approx(100.0)
        assert foreign["never_whole"] == 1


def test_baseline_memory_is_not_a_foreign_program(tmp_path: Path) -> None:
    data = _full_device()
    data["simulation"]["foreign"].append(
        {"name": "os", "baseline": True, "at_s": 0, "bytes": "1MiB"}
    )
    out = _run(tmp_path, data)
    assert [p.key for p in out.foreign] == ["game-0"]


def test_a_foreign_compute_share_slows_a_managed_request(tmp_path: Path) -> None:
    def p50(share: float) -> float:
        data = _full_device(compute_share=share, bytes="64MiB")
        data["simulation"]["foreign"][0].update({"at_s": 0, "duration_s": 300})
        result: float = summarize(_run(tmp_path, data))["services"]["big"]["p50_s"]
        return result

    alone, beside_game = p50(0.0), p50(1.0)
    # 0.06 s of solo work at share 0.5 beside a game using the whole device: 1/1.5 speed
    assert alone == pytest.approx(0.06)
    assert beside_game == pytest.approx(0.09)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"compute_share": 1.5}, "compute_share"),
        ({"allocates": "politely"}, "allocates"),
    ],
)
def test_bad_foreign_entries_are_named(tmp_path: Path, entry: dict[str, Any], problem: str) -> None:
    data = _full_device(**entry)
    with pytest.raises(ConfigError, match=problem):
        scenario(tmp_path, data)
