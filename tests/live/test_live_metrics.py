"""Per-service live figures over real HTTP with the fake stack: TTFT and TBT percentiles,
context in use and batch size in ``/admin/status`` and ``/metrics``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.live.support import base_config, fake, live, run

from accelmux.runtime.live_latency import LiveLatency, Series, percentile


def _stack() -> dict[str, Any]:
    cfg = base_config()
    cfg["services"]["chat"]["backend"] = fake(stream_chunk_s=0.001)
    return cfg


def test_streams_give_ttft_tbt_context_and_batch_in_status_and_metrics(tmp_path: Path) -> None:
    async def body() -> tuple[dict[str, Any], str]:
        async with live(_stack(), tmp=tmp_path) as lv:
            client = lv.openai()
            for _ in range(3):
                stream = await client.chat.completions.create(
                    model="chat",
                    messages=[{"role": "user", "content": "hello there"}],
                    max_tokens=8,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                chunks = [c async for c in stream]
                assert chunks[-1].usage is not None
            await client.close()
            status, snap = await lv.get("/admin/status")
            assert status == 200
            text_status, text = await lv.get("/metrics")
            assert text_status == 200
            return snap, text

    snap, text = run(body())
    chat = next(s for s in snap["services"] if s["name"] == "chat")
    usage = chat["usage"]
    assert usage["ttft_p50_s"] is not None and usage["ttft_p95_s"] >= usage["ttft_p50_s"] > 0
    assert usage["tbt_p50_s"] is not None and usage["tbt_p95_s"] >= usage["tbt_p50_s"] >= 0
    assert usage["latency_window_s"] == 300.0
    assert usage["context_in_use_tokens"] > 0  # prompt + completion of the last answer
    assert usage["batch_size"] == 0  # nothing runs now
    embed = next(s for s in snap["services"] if s["name"] == "embed")
    assert embed["usage"]["ttft_p50_s"] is None  # no stream, no figure
    assert "accelerator" in chat

    families = {f.name: f for f in text_string_to_metric_families(text)}
    ttft = {
        (s.labels["service"], s.labels["quantile"]): s.value
        for s in families["accelmux_ttft_seconds"].samples
    }
    assert ttft[("chat", "0.5")] == pytest.approx(usage["ttft_p50_s"])
    assert ttft[("chat", "0.95")] == pytest.approx(usage["ttft_p95_s"])
    assert ("chat", "0.5") in {
        (s.labels["service"], s.labels["quantile"])
        for s in families["accelmux_tbt_seconds"].samples
    }
    context = {
        s.labels["service"]: s.value for s in families["accelmux_context_in_use_tokens"].samples
    }
    assert context["chat"] == usage["context_in_use_tokens"]
    batch = {s.labels["service"]: s.value for s in families["accelmux_batch_size"].samples}
    assert batch["chat"] == 0


def test_non_streamed_answer_sets_context_in_use(tmp_path: Path) -> None:
    async def body() -> dict[str, Any]:
        async with live(_stack(), tmp=tmp_path) as lv:
            status, answer, _ = await lv.post(
                "/v1/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert status == 200
            return {"usage": answer["usage"], "status": (await lv.get("/admin/status"))[1]}

    out = run(body())
    chat = next(s for s in out["status"]["services"] if s["name"] == "chat")
    expected = out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
    assert chat["usage"]["context_in_use_tokens"] == expected


def test_percentiles_are_nearest_rank_over_the_window() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0
    now = [0.0]
    lat = LiveLatency(window_s=10.0, clock=lambda: now[0])
    timer = lat.stream("chat", started=0.0)
    for t in (1.0, 1.5, 2.5):
        now[0] = t
        timer.chunk(b'data: {"choices": []}\n\n')
    figures = lat.figures("chat")
    assert figures["ttft_s"] == {"p50": 1.0, "p95": 1.0, "count": 1}
    assert figures["tbt_s"] == {"p50": 0.5, "p95": 1.0, "count": 2}
    now[0] = 12.0  # the first two samples left the window
    assert lat.figures("chat")["tbt_s"] == {"p50": 1.0, "p95": 1.0, "count": 1}
    now[0] = 100.0
    assert lat.figures("chat")["ttft_s"] == {"p50": None, "p95": None, "count": 0}


def test_bad_usage_is_ignored() -> None:
    lat = LiveLatency()
    for raw in (b"not json", b"[]", b'{"usage": 3}', b'{"usage": {"prompt_tokens": "x"}}'):
        lat.usage_json("chat", raw)
    assert lat.figures("chat")["context_in_use_tokens"] is None
    series = Series(window_s=1.0)
    assert series.summary(0.0)["count"] == 0
