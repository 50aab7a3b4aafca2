"""Generated homes: deterministic, valid scenarios, every stress class over 100 seeds."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.sim.support import SCENARIOS

from accelmux.cli import main
from accelmux.config.load import parse_yaml
from accelmux.core.types import GIB
from accelmux.sim.catalogue import DEVICES, KIB, LLMS, llm
from accelmux.sim.generate import (
    HOME_KINDS,
    STRESSES,
    generate_home,
    stress_classes,
    write_homes,
)
from accelmux.sim.scenario import load_scenario, load_scenario_data, parse_clock, trace_problems

HOMES = range(100)


def test_the_same_seed_gives_the_same_home() -> None:
    for seed in (0, 7, 123_456):
        a, b = generate_home(seed), generate_home(seed)
        assert a.data == b.data
        assert a.to_yaml() == b.to_yaml()
    assert generate_home(1).data != generate_home(2).data


@pytest.mark.slow
def test_every_generated_home_is_a_valid_scenario() -> None:
    for seed in HOMES:
        home = generate_home(seed)
        scn = home.scenario()
        assert trace_problems(scn) == [], home.name
        # the written file reads back to the same scenario
        again = load_scenario_data(parse_yaml(home.to_yaml(), home.name), home.name, Path.cwd())
        assert again.config == scn.config


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(min_value=0, max_value=10**9), duration=st.sampled_from([300, 1200, 3600]))
def test_any_seed_gives_a_home_whose_pinned_set_fits_even_at_twice_its_estimate(
    seed: int, duration: int
) -> None:
    scn = generate_home(seed, duration_s=duration).scenario()
    cfg = scn.config
    assert cfg.workloads
    dev = next(iter(cfg.devices.values()))
    usable = int(dev.budget or dev.capacity or 0) - int(dev.headroom)
    pinned = sum(
        int(s.memory.weights) + int(s.memory.runtime) + int(s.memory.kv_floor)
        for s in cfg.services.values()
        if s.residency.value == "pinned"
    )
    assert 2 * pinned <= usable
    for w in cfg.workloads:
        assert w.until_s is None or w.until_s <= duration


def test_check_accepts_written_homes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in write_homes(40, 3, tmp_path):
        assert main(["check", str(path)]) == 0
        assert "OK (scenario" in capsys.readouterr().out
        assert path.read_text(encoding="utf-8").startswith("# Generated home")


def test_the_stress_classes_all_appear_over_100_homes() -> None:
    seen: Counter[str] = Counter()
    for seed in HOMES:
        seen.update(generate_home(seed).stresses())
    for stress in STRESSES:
        assert seen[stress] >= 10, (stress, seen)


def test_devices_span_6_to_48_gib_of_both_kinds() -> None:
    homes = [generate_home(seed) for seed in HOMES]
    sizes = {h.device.capacity_gib for h in homes}
    assert min(sizes) == 6 and max(sizes) == 48
    assert {h.device.shared_memory for h in homes} == {True, False}
    assert {d.capacity_gib for d in DEVICES} >= {6, 8, 12, 16, 24, 32, 48}


def test_classes_and_residencies_vary() -> None:
    pairs = {
        (svc["class"], svc["residency"])
        for seed in HOMES
        for svc in generate_home(seed).data["services"].values()
    }
    assert {c for c, _ in pairs} == {"realtime", "interactive", "batch", "background"}
    assert {r for _, r in pairs} == {"pinned", "warm", "on-demand"}


def test_kv_bytes_per_token_follow_the_model_configs() -> None:
    # 2 x layers x kv_heads x head_dim x 2 bytes, as in scenarios/home-evening.yaml
    assert llm("llama-3.1-8b").kv_per_token == 128 * KIB
    assert llm("qwen2.5-1.5b").kv_per_token == 28 * KIB
    assert all(m.source.startswith("https://") for m in LLMS)
    assert all(m.gguf_bytes < 10 * GIB for m in LLMS)


def test_stress_classes_read_shipped_scenarios() -> None:
    burst = load_scenario(SCENARIOS / "burst.yaml").config
    assert "bursty-traces" in stress_classes(burst)
    evening = load_scenario(SCENARIOS / "home-evening.yaml").config
    assert "estimate-2x" not in stress_classes(evening)
    assert "batch-without-window" not in stress_classes(evening)


def test_simulate_generate_writes_and_runs_homes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "homes"
    code = main(
        [
            "simulate",
            "--generate",
            "2",
            "--seed",
            "11",
            "--write-dir",
            str(out),
            "--policies",
            "accelmux,oracle",
            "--seeds",
            "1",
            "--duration-s",
            "240",
            "--workers",
            "1",
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "scenario home-0011" in text and "scenario home-0012" in text
    assert sorted(p.name for p in out.iterdir()) == ["home-0011.yaml", "home-0012.yaml"]
    assert (tmp_path / "r.json").is_file()


def test_simulate_needs_a_scenario_or_generate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate"]) == 2
    assert "--generate" in capsys.readouterr().err
    assert main(["simulate", "--generate", "0"]) == 2


#: sha256 of the scenario files of homes 0-19 (mixed, 1200 s) as generated before the
#: other kinds of home were added: a new kind must not change the suite's homes.
MIXED_HOMES_0_19_SHA256 = "a7314e6faee1dcdb0162f778ae1d0cd66b3d3dccab00ad5da4db06bf0da2ab43"


def test_the_other_kinds_leave_the_mixed_homes_byte_for_byte_unchanged() -> None:
    digest = hashlib.sha256()
    for seed in range(20):
        digest.update(generate_home(seed).to_yaml().encode())
    assert digest.hexdigest() == MIXED_HOMES_0_19_SHA256
    assert generate_home(5, kind="mixed").data == generate_home(5).data


def test_night_camera_homes_run_cameras_beside_a_night_maintenance_window() -> None:
    windowed = 0
    for seed in range(20):
        home = generate_home(seed, duration_s=1800, kind="night-cameras")
        assert home.name == f"night-cameras-{seed:04d}"
        cfg = home.scenario().config
        cameras = [w for w in cfg.workloads if w.type == "camera"]
        assert cameras and all(w.until_s is None for w in cameras), home.name  # all night
        assert cfg.services["detect"].service_class == "background"
        windows = {n: s.windows for n, s in cfg.services.items() if s.windows}
        if "embed" in cfg.services:
            assert windows.get("embed"), home.name  # the indexing job has its window
            hour = int(windows["embed"][0].split(":")[0])
            assert hour in (0, 1, 2, 3, 22, 23)
            # the run starts at most half its length before the window opens
            start = parse_clock(cfg.simulation.start)
            assert (hour * 3600 - start) % 86_400 <= 900, home.name
            for name, svc in cfg.services.items():
                if svc.service_class == "batch":
                    assert windows.get(name) == windows["embed"], (home.name, name)
            windowed += 1
    assert windowed >= 15


def test_evening_game_homes_have_a_gpu_program_for_hours_in_the_evening() -> None:
    for seed in range(20):
        home = generate_home(seed, duration_s=1800, kind="evening-game")
        cfg = home.scenario().config
        start = parse_clock(cfg.simulation.start)
        assert 18 * 3600 <= start <= 21 * 3600 + 45 * 60, home.name
        capacity = int(next(iter(cfg.devices.values())).capacity or 0)
        games = [f for f in cfg.simulation.foreign if f.compute_share > 0]
        assert len(games) == 1, home.name
        (game,) = games
        assert game.allocates == "regardless"
        assert 0.3 * capacity - 2**20 <= int(game.bytes) <= 0.7 * capacity + 2**20
        assert game.duration_s is not None and 3600 <= game.duration_s <= 3 * 3600
        assert 0.3 <= game.compute_share <= 0.9
        assert game.at_s < 0.4 * 1800


def test_an_unknown_kind_of_home_is_named() -> None:
    assert "mixed" in HOME_KINDS
    with pytest.raises(ValueError, match="unknown home kind 'castle'"):
        generate_home(1, kind="castle")


def test_simulate_generates_the_other_kinds_and_names_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "homes"
    args = ["simulate", "--generate", "1", "--seed", "2", "--write-dir", str(out)]
    fast = ["--policies", "accelmux", "--seeds", "1", "--duration-s", "120", "--workers", "1"]
    assert main([*args, "--home-kind", "evening-game", *fast]) == 0
    assert [p.name for p in out.iterdir()] == ["evening-game-0002.yaml"]
    capsys.readouterr()
    assert main([*args, "--home-kind", "castle"]) == 2
    assert "--home-kind must be one of mixed, night-cameras, evening-game" in (
        capsys.readouterr().err
    )
