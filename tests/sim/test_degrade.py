"""Degrading as policy decisions, in the simulator: a chat model that its GPU cannot hold
while a game runs loads with fewer layers there, or on the CPU, instead of waiting out
its deadline; it moves back when the game ends. Each move is in the decision log with
its reason; the layer-split cost model makes each lesser form slower."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from accelmux.core.degrade import Variant, VariantMode
from accelmux.sim.degrade_cost import DegradeCostConfig
from accelmux.sim.executor import Simulation
from accelmux.sim.metrics import summarize
from accelmux.sim.scenario import load_scenario_data

DEGRADE = {"fallback_device": "cpu", "min_gpu_layers": 8, "max_gpu_layers": 24, "layers": 33}


def _home(
    degrade: dict[str, Any] | None,
    *,
    game_gib: float = 4.0,
    game_at: float = 200.0,
    game_s: float = 400.0,
    chat_gib: float = 4.0,
) -> dict[str, Any]:
    chat: dict[str, Any] = {
        "kind": "chat",
        "class": "interactive",
        "residency": "warm",
        "concurrency": 2,
        "device": "gpu",
        "memory": {
            "weights": f"{chat_gib}GiB",
            "runtime": "300MiB",
            "kv_per_token": "128KiB",
            "kv_floor": "256MiB",
            "kv_ceiling": "1GiB",
            "workspace": "32MiB",
        },
        "queue": {"deadline_s": 60},
        "slo": {"ttft_s": 5.0, "tbt_s": 0.5},
    }
    if degrade is not None:
        chat["degrade"] = degrade
    return {
        "devices": {
            "gpu": {"kind": "virtual", "capacity": "8GiB", "headroom": "256MiB"},
            "cpu": {"kind": "host", "capacity": "32GiB", "budget": "24GiB", "headroom": "1GiB"},
        },
        "services": {
            "asr": {
                "kind": "asr",
                "class": "realtime",
                "residency": "pinned",
                "device": "gpu",
                "memory": {"weights": "500MiB", "runtime": "200MiB", "workspace": "100MiB"},
                "slo": {"latency_s": 1.0},
            },
            "chat": chat,
        },
        "workloads": [
            {"type": "poisson", "service": "asr", "rate_per_h": 360, "units": 4.0},
            {
                "type": "poisson",
                "service": "chat",
                "rate_per_h": 240,
                "prompt_tokens": {"mean": 400, "cv": 0.5},
                "output_tokens": {"mean": 60, "cv": 0.5},
            },
        ],
        "simulation": {
            "duration_s": 900,
            "start": "20:00",
            "seeds": 1,
            "warmup_s": 0,
            "services": {
                "asr": {"share": 0.5, "base_s": 0.05, "per_unit_s": 0.03},
                "chat": {"share": 0.4, "prefill_tps": 2000, "tbt_s": 0.03},
            },
            "foreign": [
                {
                    "name": "game",
                    "at_s": game_at,
                    "bytes": f"{game_gib}GiB",
                    "duration_s": game_s,
                    "compute_share": 0.5,
                }
            ],
        },
    }


def _run(data: dict[str, Any], seed: int = 0) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    scn = load_scenario_data(copy.deepcopy(data), "degrade.yaml", Path("."))
    sim = Simulation(scn, "accelmux", seed, record_decisions=True)
    out = sim.run()
    # an out-of-memory a foreign program's growth since the last sample caused is no
    # decision's (the suite reports those apart, too)
    return summarize(out), sim.decisions, sum(1 for o in out.ooms if not o.foreign_surge)


def _attainment(report: dict[str, Any], cls: str) -> float:
    return float(report["classes"][cls]["slo_attainment"])


def test_chat_degrades_while_a_game_holds_the_gpu_and_moves_back_after() -> None:
    before, _, ooms_before = _run(_home(None))
    after, decisions, ooms_after = _run(_home(DEGRADE))
    loads = [(d["t"], d["service"], d["reason"]) for d in decisions if d["action"] == "load"]
    degraded = [x for x in loads if x[2] == "degraded"]
    assert degraded and all(200 <= t < 600 for t, _, _ in degraded)
    assert all(s.startswith(("chat@gpu:", "chat@cpu")) for _, s, _ in degraded)
    detail = next(d["detail"] for d in decisions if d.get("reason") == "degraded")
    assert "the full model needs" in detail and "MiB free" in detail
    # back to the full form once the game is gone, the lesser form retired
    assert any(s == "chat@gpu" and r == "room_returned" and t >= 600 for t, s, r in loads)
    assert any(d["action"] == "unload" and d["reason"] == "superseded" for d in decisions)
    # interactive gains, realtime keeps what it had, no out-of-memory
    assert _attainment(after, "interactive") >= _attainment(before, "interactive") + 0.15
    assert _attainment(after, "realtime") >= _attainment(before, "realtime")
    assert ooms_after == ooms_before == 0


def test_a_service_too_large_for_its_gpu_runs_on_the_cpu() -> None:
    """Without degrade such a service is refused by the config check
    (tests/config/test_degrade_config.py); with a fallback it runs on the host."""
    report, decisions, ooms = _run(_home({"fallback_device": "cpu"}, chat_gib=9.0))
    interactive = report["classes"]["interactive"]
    assert interactive["rejected"] <= 0.05 * interactive["requests"]
    assert _attainment(report, "interactive") > 0.2  # slow on the CPU, but served
    assert {d["service"] for d in decisions if d["action"] == "load"} >= {"chat@cpu"}
    assert not any(d["action"] == "load" and d["service"] == "chat@gpu" for d in decisions)
    assert ooms == 0


def test_the_layer_split_cost_model_slows_each_lesser_form() -> None:
    cost = DegradeCostConfig()
    full = Variant(rank=0, mode=VariantMode.FULL, n_gpu_layers=-1, gpu_share=1.0, slowdown=1.0)
    half = Variant(rank=1, mode=VariantMode.OFFLOAD, n_gpu_layers=16, gpu_share=0.5, slowdown=4.5)
    cpu = Variant(rank=2, mode=VariantMode.CPU, n_gpu_layers=0, gpu_share=0.0, slowdown=8.0)
    assert cost.stretch(full, is_llm=True, work=3.0, prefill=1.0) == (3.0, 1.0)
    assert cost.stretch(None, is_llm=True, work=3.0, prefill=1.0) == (3.0, 1.0)
    work, prefill = cost.stretch(cpu, is_llm=True, work=3.0, prefill=1.0)
    assert prefill == 25.0 and work == 25.0 + 2.0 * 8.0
    work, prefill = cost.stretch(half, is_llm=True, work=3.0, prefill=1.0)
    assert prefill == 0.5 + 0.5 * 25.0 and work == prefill + 2.0 * (0.5 + 0.5 * 8.0)
    assert cost.stretch(cpu, is_llm=False, work=2.0, prefill=0.0) == (20.0, 0.0)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    game_gib=st.floats(1.0, 7.0),
    game_at=st.floats(50.0, 500.0),
    game_s=st.floats(60.0, 600.0),
    chat_gib=st.floats(1.0, 7.0),
    seed=st.integers(0, 3),
)
def test_degrading_never_costs_realtime_nor_an_oom(
    game_gib: float, game_at: float, game_s: float, chat_gib: float, seed: int
) -> None:
    """For any game and model size: the budget holds (the simulator's Manager is strict),
    no out-of-memory is the policy's, realtime keeps its attainment unless a foreign
    surge struck it, and at the end at most one form of chat holds memory on the GPU."""
    kw = {"game_gib": game_gib, "game_at": game_at, "game_s": game_s, "chat_gib": chat_gib}
    before, _, _ = _run(_home(None, **kw), seed)
    after, decisions, ooms = _run(_home(DEGRADE, **kw), seed)
    assert ooms == 0
    surge = any(d["action"] == "fail" and d["service"] == "asr" for d in decisions)
    if not surge:
        assert _attainment(after, "realtime") >= _attainment(before, "realtime") - 1e-9
    held: dict[str, set[str]] = {}
    for d in decisions:
        if d["action"] == "load":
            held.setdefault(d["service"], set()).add("up")
        elif d["action"] == "unload":
            held.pop(d["service"], None)
    assert len([s for s in held if s.startswith("chat@gpu")]) <= 1


def test_small_gpu_homes_are_on_small_cards_and_degrade_declares_each_llm() -> None:
    from accelmux.sim.generate import generate_home, with_degrade

    for seed in range(6):
        home = generate_home(seed, kind="small-gpu", duration_s=600)
        assert not home.device.shared_memory and home.device.capacity_gib <= 8
        data = with_degrade(home)
        load_scenario_data(copy.deepcopy(data), f"{home.name}.yaml", Path("."))
        assert data["devices"]["cpu"]["kind"] == "host"
        for name, svc in data["services"].items():
            llm = svc["kind"] == "chat" and svc["class"] == "interactive"
            assert ("degrade" in svc) == llm, name
            assert svc["device"] == "gpu"
    # a shared-memory host has nothing to fall back to
    for seed in range(40):
        home = generate_home(seed, kind="evening-game", duration_s=600)
        if home.device.shared_memory:
            assert with_degrade(home) == home.data
            break


def test_degrade_decisions_match_their_golden_digest() -> None:
    """The decisions of services with forms, pinned: the policy digest's scenarios have
    none. A change meant to alter them regenerates the file and says so:
    ``PYTHONPATH=src:bench python bench/bench_degrade.py --golden``."""
    import json
    import sys

    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))
    import bench_degrade

    golden = json.loads(bench_degrade.GOLDEN.read_text(encoding="utf-8"))
    assert bench_degrade.golden_digests() == golden


def test_a_request_waiting_on_the_last_form_while_a_higher_class_waits_there_keeps_waiting() -> (
    None
):
    """The game holds the GPU, so chat (interactive) and the indexer's embeddings (batch)
    both fall back to the CPU. While chat waits there (its CPU form loading), an
    embeddings request waiting on its CPU form, the last it has, stays there: there is no
    lesser form to move it to (this once crashed the policy)."""
    data = _home({"fallback_device": "cpu"}, game_gib=6.0, game_at=5.0, game_s=3600.0)
    # a host with room for one of them at a time: chat's CPU form evicts the indexer's
    data["devices"]["cpu"] = {
        "kind": "host",
        "capacity": "8GiB",
        "budget": "5632MiB",
        "headroom": "512MiB",
    }
    data["services"]["embed"] = {
        "kind": "embeddings",
        "class": "batch",
        "residency": "on-demand",
        "device": "gpu",
        "degrade": {"fallback_device": "cpu"},
        "memory": {"weights": "1GiB", "runtime": "200MiB", "workspace": "64MiB"},
        "queue": {"deadline_s": 600},
        "slo": {"latency_s": 60.0},
    }
    data["workloads"].append(
        {"type": "poisson", "service": "embed", "rate_per_h": 600, "from_s": 20.0, "units": 8}
    )
    data["simulation"]["services"]["embed"] = {"share": 0.3, "base_s": 0.05, "per_unit_s": 0.01}
    report, decisions, ooms = _run(data)
    loads = {d["service"] for d in decisions if d["action"] == "load"}
    assert {"chat@cpu", "embed@cpu"} <= loads
    # the indexer's CPU form made way for chat's, and its requests waited, then met
    # their deadline: refused with the reason, none lost to an exception
    assert any(
        d["action"] == "unload"
        and d["service"] == "embed@cpu"
        and d["reason"] == "evicted_for_memory"
        for d in decisions
    )
    refused = {
        d["reason"] for d in decisions if d["action"] == "reject" and "embed" in d["service"]
    }
    assert "deadline_exceeded" in refused
    assert report["classes"]["interactive"]["slo_met"] > 0
    assert ooms == 0
