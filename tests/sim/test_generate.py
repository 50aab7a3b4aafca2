"""Generated homes: deterministic, valid scenarios, every stress class over 100 seeds."""

from __future__ import annotations

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
from accelmux.sim.generate import STRESSES, generate_home, stress_classes, write_homes
from accelmux.sim.scenario import load_scenario, load_scenario_data, trace_problems

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
