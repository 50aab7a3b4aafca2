"""Reading what servers say (Prometheus pages, llama-server's /slots, argv options), the
ledger explanations and the switch rate: pure functions, with Hypothesis properties."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from accelmux.backends.server_metrics import argv_option, parse_server_metrics, parse_slots
from accelmux.runtime.activity import ServiceActivity
from accelmux.runtime.explain import evictable, eviction_needed, why_full

LLAMA_PAGE = """\
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1.5
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
"""

VLLM_PAGE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
"""


def test_llama_server_metrics_are_read_by_name() -> None:
    assert parse_server_metrics(LLAMA_PAGE) == {
        "requests_processing": 2.0,
        "requests_waiting": 1.0,
        "busy_slots_per_decode": 1.5,
    }


def test_vllm_metrics_are_read_by_name() -> None:
    assert parse_server_metrics(VLLM_PAGE) == {
        "requests_processing": 3.0,
        "requests_waiting": 0.0,
        "kv_usage_ratio": 0.25,
    }


def test_a_page_that_is_not_prometheus_reads_as_nothing() -> None:
    assert parse_server_metrics("<html>not found</html>") == {}


def test_slots_give_context_in_use() -> None:
    slots = [
        {"id": 0, "n_ctx": 1024, "is_processing": True, "n_prompt_tokens": 30,
         "next_token": {"n_decoded": 12}},
        {"id": 1, "n_ctx": 1024, "is_processing": False},
    ]  # fmt: skip
    assert parse_slots(slots) == {
        "slots": 2,
        "slots_processing": 1,
        "context_per_slot": 1024,
        "context_in_use_tokens": 42,
    }
    assert parse_slots({"error": "slots disabled"}) == {}


@given(st.integers(1, 1 << 20), st.sampled_from(["-b", "--batch-size"]), st.booleans())
def test_argv_option_reads_both_spellings(value: int, name: str, joined: bool) -> None:
    argv = ["llama-server", "-m", "x.gguf"]
    argv += [f"{name}={value}"] if joined else [name, str(value)]
    assert argv_option(argv, "-b", "--batch-size") == value
    assert argv_option(["llama-server"], "-b", "--batch-size") is None


def _device(services: dict[str, dict[str, Any]], available: int) -> dict[str, Any]:
    return {"available": available, "services": services}


SERVICE = st.fixed_dictionaries(
    {
        "state": st.sampled_from(["loaded", "loading", "unloaded"]),
        "pinned": st.booleans(),
        "inflight": st.integers(0, 2),
        "total": st.integers(0, 1 << 34),
    }
)


@given(
    st.dictionaries(st.sampled_from("abcdefgh"), SERVICE, max_size=8),
    st.integers(0, 1 << 35),
    st.integers(0, 1 << 35),
)
def test_eviction_answer_is_consistent(
    services: dict[str, dict[str, Any]], available: int, needed: int
) -> None:
    device = _device(services, available)
    out = eviction_needed(device, needed, exclude="a")
    chosen = [c["service"] for c in out["would_evict"]]
    allowed = {name for name, _ in evictable(device, exclude="a")}
    assert set(chosen) <= allowed and "a" not in chosen
    assert out["freed_bytes"] == sum(c["bytes"] for c in out["would_evict"])
    assert out["shortfall_bytes"] == max(0, needed - available)
    assert out["enough"] == (out["freed_bytes"] >= out["shortfall_bytes"])
    if out["enough"] and chosen:  # no more than needed: without the last, not enough
        assert out["freed_bytes"] - out["would_evict"][-1]["bytes"] < out["shortfall_bytes"]
    if not out["enough"]:  # everything that could go was counted
        assert set(chosen) == allowed


def test_why_full_names_who_holds_the_memory() -> None:
    snap = {
        "devices": [
            {
                "name": "gpu",
                "capacity_bytes": 8 << 30,
                "budget_bytes": 8 << 30,
                "headroom_bytes": 256 << 20,
                "foreign_bytes": 1 << 30,
                "committed_bytes": 7 << 30,
                "available_bytes": 0,
            }
        ],
        "services": [
            {"name": "llm", "device": "gpu", "state": "loaded", "pinned": True,
             "inflight": 1, "ledger": {"weights": 4 << 30, "kv": 1 << 30}},
            {"name": "tts", "device": "gpu", "state": "loaded", "pinned": False,
             "inflight": 0, "ledger": {"weights": 1 << 30, "reserved": 1 << 29}},
        ],
    }  # fmt: skip
    out = why_full(snap)
    first, adds_up, second = out["lines"]
    assert "foreign 1024.0 MiB" in first and "headroom 256.0 MiB" in first
    # every category, adding up to the capacity (the snapshot's own available is 0 here)
    assert adds_up.startswith("gpu: capacity 8192.0 MiB = weights 5120.0 MiB, runtime 0.0 MiB")
    amounts = {b["category"]: b["bytes"] for b in out["devices"]["gpu"]["breakdown"]}
    assert sum(amounts.values()) == 8 << 30 and amounts["reserved"] == 1 << 29
    assert first.index("llm 5120.0 MiB (loaded, pinned, 1 running)") < first.index("tts")
    assert second == "gpu: 1536.0 MiB could be freed now by unloading idle services"
    assert out["devices"]["gpu"]["services"]["tts"]["reserved"] == 1 << 29


@given(st.lists(st.floats(0, 20_000), max_size=50))
def test_switch_rate_counts_the_last_hour_only(offsets: list[float]) -> None:
    activity = ServiceActivity(started_at=0.0)
    for at in sorted(offsets):
        activity.loaded(at, 1.0)
    now = max(offsets, default=0.0)
    recent = sum(1 for at in offsets if at >= now - 3600)
    window = min(3600.0, max(60.0, now))
    assert abs(activity.switches_per_hour(now) - recent * 3600 / window) < 1e-6
    shown = activity.as_dict(now)
    assert shown["measured_loads"] == len(offsets)
    assert shown["cold_start_s_mean"] == (1.0 if offsets else None)
